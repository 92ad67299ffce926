/*
 * paged_decode: one query token per sequence against the paged cache (MHA, GQA, MQA, MLA;
 * sliding window; logits soft-cap; per-tensor and inline scales).
 *
 * Grid (seqs, kv_heads x group tiles, partitions); one block computes a tile of up to
 * KVL_MAX_GROUP_TILE query heads of one KV head (`group_tile`, chosen by the launch
 * configuration) over one partition of the sequence's attended tokens, so each key and value
 * element is read once for all the tile's heads. Dynamic shared memory: the tile's query rows
 * (group_tile x max(k.width, v.width) floats, reused for the output sums of the V phase),
 * then group_tile x partition_tokens floats (the logits, then the weights), then, when
 * `v_token_major`, one row offset (int64) per token of the partition.
 *   1. the query rows into shared memory;
 *   2. logits: each row's base address once per token; with `k_vec_bytes` 16 a group of
 *      `k_token_lanes` lanes takes a token, each lane 16-byte vectors of its key row, so a
 *      warp reads KVL_WARP / k_token_lanes rows at once; otherwise a warp takes a token and its
 *      lanes the row's elements; products with every head's query added across the lanes;
 *      scaled, soft-capped;
 *   3. per head (a warp each): max, weights 2^((l - max) log2 e) carrying their value row's
 *      scales, sum;
 *   4. values, one of three ways (the launch parameters say which):
 *      - rows: threads over (unit of the row, token lane): a unit is a 16-byte vector
 *        (`v_vec_bytes` 16) or one element; the block's threads / units token lanes each sum
 *        every lanes-th token, then add their sums in lane order through shared memory;
 *      - tokens (`v_token_major`, the legacy [blocks, heads, D, N] value whose tokens are
 *        contiguous for one element): each token's row offset once into shared memory; a warp
 *        takes an element, its lanes consecutive tokens, and adds across the warp.
 * Single pass: the output is divided by the sum. Partitioned (long contexts, as
 * flash-decoding): (max, sum, unnormalized output) go to `partials` and
 * kvl_paged_decode_reduce rescales and adds them.
 */
#ifndef KVL_PAGED_DECODE_CUH
#define KVL_PAGED_DECODE_CUH

#include "common.cuh"
#include "decode_rows.cuh"

#define KVL_NEG_INF (-KVL_INF)

/* Most query heads one decode block serves (registers per thread grow with it). */
#define KVL_MAX_GROUP_TILE 8

/* Tokens a lane (group) loads before it uses any of them: their loads are in flight together. */
#define KVL_DECODE_UNROLL 4

KVL_KERNEL kvl_paged_decode(kvl_field_args k, kvl_field_args v, kvl_field_args k_scale,
                            kvl_field_args v_scale, kvl_decode_params p)
{
    KVL_SHARED(float, head_stats, 2 * KVL_MAX_GROUP_TILE); /* per head: max, sum */
    kvl_plant_fields(&k, &v);
    const int64_t seq = kvl_block_x(), part = kvl_block_z();
    const int64_t tiles = (p.group + p.group_tile - 1) / p.group_tile;
    const int64_t kvh = kvl_block_y() / tiles;
    const int64_t qh0 = kvh * p.group + (kvl_block_y() % tiles) * p.group_tile;
    const int64_t left = (kvh + 1) * p.group - qh0;
    const int g = (int)(left < p.group_tile ? left : p.group_tile); /* heads of this tile */
    const int64_t len = kvl_ld(p.seq_lens + seq);
    const int64_t start = (p.window >= 0 && len > p.window) ? len - p.window : 0;
    const int64_t t0 = start + part * p.partition_tokens;
    const int64_t t1 = t0 + p.partition_tokens < len ? t0 + p.partition_tokens : len;
    const int64_t n = t1 > t0 ? t1 - t0 : 0;
    const int64_t row0 = seq * p.q_heads + qh0; /* output row of the tile's first head */
    const int64_t stride = p.partials ? 2 + v.width : v.width;
    float *rows = p.partials ? p.partials + (row0 * p.partitions + part) * stride
                             : p.out + row0 * v.width;
    const int64_t row_step = p.partials ? p.partitions * stride : v.width;
    if (n == 0) { /* the same for every thread of the block */
        for (int j = 0; j < g; j++) {
            float *r = rows + j * row_step;
            for (int64_t d = kvl_thread(); d < stride; d += kvl_threads())
                kvl_st(r + d, p.partials && d == 0 ? KVL_NEG_INF : 0.0f);
        }
        return;
    }
    const int64_t kw = k.width, vw = v.width, tokens = p.partition_tokens;
    const int64_t qrow = kw > vw ? kw : vw; /* floats per head of the first region */
    float *qs = (float *)kvl_dyn_shared();
    float *w = qs + p.group_tile * qrow;
    for (int64_t e = kvl_thread(); e < g * kw; e += kvl_threads())
        qs[(e / kw) * qrow + e % kw] = kvl_act(p.query, p.act_dtype, row0 * kw + e);
    kvl_sync();

    const int64_t bs = KVL_BLOCK_SIZE(&k);
    const int32_t *table = p.block_table + seq * p.blocks_per_seq;
    /* Entries t0 / bs .. (t1 - 1) / bs of the table row are read (the emulator checks). */
    KVL_CHECK_ACCESS(table + t0 / bs, sizeof(int32_t));
    KVL_CHECK_ACCESS(table + (t1 - 1) / bs, sizeof(int32_t));

    /* 2. Logits: groups of `lanes` lanes per token (a whole warp on the element path), each
     *    group KVL_DECODE_UNROLL tokens at once so that their loads are in flight together. */
    const int lanes = p.k_vec_bytes ? p.k_token_lanes : KVL_WARP;
    const int64_t per_warp = KVL_WARP / lanes, sub = kvl_lane() / lanes, li = kvl_lane() % lanes;
    const int64_t kvecs = p.k_vec_bytes ? kw * k.elem_bytes / 16 : 0, kper = 16 / k.elem_bytes;
    const int64_t step = kvl_warps() * per_warp * KVL_DECODE_UNROLL;
    for (int64_t i0 = kvl_warp() * per_warp * KVL_DECODE_UNROLL; i0 < n; i0 += step) {
        float dot[KVL_DECODE_UNROLL][KVL_MAX_GROUP_TILE];
        const unsigned char *row[KVL_DECODE_UNROLL];
        for (int u = 0; u < KVL_DECODE_UNROLL; u++) {
            const int64_t i = i0 + u * per_warp + sub, t = t0 + i;
            for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
                dot[u][j] = 0.0f;
            row[u] = i < n ? kvl_row_base(p.buffers, &k, p.layer, kvl_ld(table + t / bs), kvh,
                                          kvl_slot_of_token(&k, t % bs))
                           : 0;
        }
        if (p.k_vec_bytes) {
            for (int64_t c = li; c < kvecs; c += lanes) {
                kvl_u128 raw[KVL_DECODE_UNROLL];
                for (int u = 0; u < KVL_DECODE_UNROLL; u++) {
                    raw[u] = kvl_zero16();
                    if (row[u]) {
                        const unsigned char *at = row[u] + c * 16;
                        KVL_CACHE_LOAD(at, 16);
                        raw[u] = kvl_row_load16(at);
                    }
                }
                for (int u = 0; u < KVL_DECODE_UNROLL; u++) {
                    if (!row[u])
                        continue;
                    float x[KVL_VEC_ELEMS];
                    kvl_unpack16(raw[u], k.dtype, x);
                    for (int e = 0; e < KVL_VEC_ELEMS; e++)
                        if (e < kper)
                            for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
                                if (j < g)
                                    dot[u][j] += qs[j * qrow + c * kper + e] * x[e];
                }
            }
        } else {
            for (int64_t d = li; d < kw; d += lanes) {
                float x[KVL_DECODE_UNROLL];
                for (int u = 0; u < KVL_DECODE_UNROLL; u++) {
                    x[u] = 0.0f;
                    if (row[u]) {
                        const unsigned char *at = row[u] + kvl_in_row(&k, d);
                        KVL_CACHE_LOAD(at, k.elem_bytes);
                        x[u] = kvl_load_elem(at, k.dtype);
                    }
                }
                for (int u = 0; u < KVL_DECODE_UNROLL; u++)
                    for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
                        if (j < g)
                            dot[u][j] += qs[j * qrow + d] * x[u];
            }
        }
        for (int u = 0; u < KVL_DECODE_UNROLL; u++) {
            for (int j = 0; j < g; j++)
                dot[u][j] = kvl_lanes_sum(dot[u][j], lanes);
            const int64_t i = i0 + u * per_warp + sub, t = t0 + i;
            if (i < n && li == 0) {
                float s = k.scale;
                if (p.inline_scales) {
                    const int64_t block = kvl_ld(table + t / bs);
                    const int64_t slot = kvl_slot_of_token(&k, t % bs);
                    s *= kvl_load_elem(kvl_at_c(p.buffers, &k_scale, p.layer, block, kvh, slot, 0),
                                       KVL_DTYPE_F32);
                }
                for (int j = 0; j < g; j++) {
                    float x = dot[u][j] * s * p.scale;
                    if (p.soft_capped)
                        x = p.soft_cap * kvl_tanh(x / p.soft_cap);
                    w[j * tokens + i] = x;
                }
            }
        }
    }
    kvl_sync();

    /* 3. Softmax weights per head. */
    for (int j = (int)kvl_warp(); j < g; j += (int)kvl_warps()) {
        float *wj = w + j * tokens;
        float m = KVL_NEG_INF;
        for (int64_t i = kvl_lane(); i < n; i += KVL_WARP)
            m = kvl_maxf(m, wj[i]);
        m = kvl_warp_max(m);
        float sum = 0.0f;
        for (int64_t i = kvl_lane(); i < n; i += KVL_WARP) {
            const float e = kvl_exp(wj[i] - m);
            sum += e;
            float s = v.scale;
            if (p.inline_scales) {
                const int64_t t = t0 + i, block = kvl_ld(table + t / bs);
                const int64_t slot = kvl_slot_of_token(&v, t % bs);
                s *= kvl_load_elem(kvl_at_c(p.buffers, &v_scale, p.layer, block, kvh, slot, 0),
                                   KVL_DTYPE_F32);
            }
            wj[i] = e * s;
        }
        sum = kvl_warp_sum(sum);
        if (kvl_lane() == 0) {
            head_stats[2 * j] = m;
            head_stats[2 * j + 1] = sum;
        }
    }
    kvl_sync();

    /* 4. Values: the output sums of the tile's heads go to `sums` (the query rows' space). */
    float *sums = qs;
    if (p.v_token_major) {
        int64_t *bases = (int64_t *)(qs + ((p.group_tile * (qrow + tokens) + 1) / 2) * 2);
        for (int64_t i = kvl_thread(); i < n; i += kvl_threads()) {
            const int64_t t = t0 + i;
            bases[i] = kvl_row_base(p.buffers, &v, p.layer, kvl_ld(table + t / bs), kvh,
                                    kvl_slot_of_token(&v, t % bs)) -
                       p.buffers[v.buffer];
        }
        kvl_sync();
        for (int64_t d = kvl_warp(); d < vw; d += kvl_warps()) {
            float acc[KVL_MAX_GROUP_TILE];
            for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
                acc[j] = 0.0f;
            const int64_t at = kvl_in_row(&v, d);
            for (int64_t i = kvl_lane(); i < n; i += KVL_WARP) {
                const unsigned char *e = p.buffers[v.buffer] + bases[i] + at;
                KVL_CACHE_LOAD(e, v.elem_bytes);
                const float x = kvl_load_elem(e, v.dtype);
                for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
                    if (j < g)
                        acc[j] += w[j * tokens + i] * x;
            }
            for (int j = 0; j < g; j++) {
                acc[j] = kvl_warp_sum(acc[j]);
                if (kvl_lane() == 0)
                    sums[j * qrow + d] = acc[j];
            }
        }
    } else {
        /* Units of the row (16-byte vectors or elements), token lanes over the rest. */
        const int64_t vper = p.v_vec_bytes ? 16 / v.elem_bytes : 1;
        const int64_t units = vw / vper, threads = kvl_threads();
        const int64_t token_lanes = units < threads ? threads / units : 1;
        const int64_t r = kvl_thread() / units;
        for (int64_t c0 = 0; c0 < units; c0 += threads) {
            const int64_t c = c0 + kvl_thread() % (units < threads ? units : threads);
            const int active = r < token_lanes && c < units;
            float acc[KVL_MAX_GROUP_TILE][KVL_VEC_ELEMS];
            for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
                for (int e = 0; e < KVL_VEC_ELEMS; e++)
                    acc[j][e] = 0.0f;
            for (int64_t i0 = r; active && i0 < n; i0 += token_lanes * KVL_DECODE_UNROLL) {
                /* KVL_DECODE_UNROLL tokens' loads in flight, then their sums in token order. */
                kvl_u128 raw[KVL_DECODE_UNROLL];
                float one[KVL_DECODE_UNROLL];
                for (int u = 0; u < KVL_DECODE_UNROLL; u++) {
                    const int64_t i = i0 + u * token_lanes, t = t0 + i;
                    raw[u] = kvl_zero16();
                    one[u] = 0.0f;
                    if (i >= n)
                        break;
                    const unsigned char *row =
                        kvl_row_base(p.buffers, &v, p.layer, kvl_ld(table + t / bs), kvh,
                                     kvl_slot_of_token(&v, t % bs));
                    const unsigned char *at =
                        row + (p.v_vec_bytes ? c * 16 : kvl_in_row(&v, c));
                    KVL_CACHE_LOAD(at, p.v_vec_bytes ? 16 : v.elem_bytes);
                    if (p.v_vec_bytes)
                        raw[u] = kvl_row_load16(at);
                    else
                        one[u] = kvl_load_elem(at, v.dtype);
                }
                for (int u = 0; u < KVL_DECODE_UNROLL; u++) {
                    const int64_t i = i0 + u * token_lanes;
                    if (i >= n)
                        break;
                    float x[KVL_VEC_ELEMS];
                    if (p.v_vec_bytes)
                        kvl_unpack16(raw[u], v.dtype, x);
                    else
                        x[0] = one[u];
                    for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
                        if (j < g)
                            for (int e = 0; e < KVL_VEC_ELEMS; e++)
                                if (e < vper)
                                    acc[j][e] += w[j * tokens + i] * x[e];
                }
            }
            /* Token lanes add their sums in lane order (the same result in any thread order). */
            for (int64_t q = 0; q < token_lanes; q++) {
                if (active && r == q)
                    for (int j = 0; j < g; j++)
                        for (int e = 0; e < KVL_VEC_ELEMS; e++)
                            if (e < vper) {
                                float *s = sums + j * qrow + c * vper + e;
                                *s = q == 0 ? acc[j][e] : *s + acc[j][e];
                            }
                if (token_lanes > 1)
                    kvl_sync();
            }
        }
    }
    kvl_sync();
    for (int64_t e = kvl_thread(); e < g * vw; e += kvl_threads()) {
        const int64_t j = e / vw, d = e % vw;
        float *r = rows + j * row_step;
        if (p.partials)
            kvl_st(r + (2 + d), sums[j * qrow + d]);
        else
            kvl_st(r + d, sums[j * qrow + d] / head_stats[2 * j + 1]);
    }
    if (p.partials && kvl_thread() < (unsigned)g) {
        float *r = rows + kvl_thread() * row_step;
        kvl_st(r, head_stats[2 * kvl_thread()]);
        kvl_st(r + 1, head_stats[2 * kvl_thread() + 1]);
    }
}

/* Grid (seqs, q_heads): the partitions of one row, rescaled to the largest max, added. */
KVL_KERNEL kvl_paged_decode_reduce(kvl_field_args v, kvl_decode_params p)
{
    const int64_t row = kvl_block_x() * p.q_heads + kvl_block_y();
    const int64_t stride = 2 + v.width;
    const float *parts = p.partials + row * p.partitions * stride;
    float m = KVL_NEG_INF, sum = 0.0f;
    for (int z = 0; z < p.partitions; z++)
        if (kvl_ld(parts + z * stride + 1) > 0.0f)
            m = kvl_maxf(m, kvl_ld(parts + z * stride));
    for (int z = 0; z < p.partitions; z++)
        if (kvl_ld(parts + z * stride + 1) > 0.0f)
            sum += kvl_ld(parts + z * stride + 1) * kvl_exp(kvl_ld(parts + z * stride) - m);
    for (int64_t d = kvl_thread(); d < v.width; d += kvl_threads()) {
        float acc = 0.0f;
        for (int z = 0; z < p.partitions; z++)
            if (kvl_ld(parts + z * stride + 1) > 0.0f)
                acc += kvl_ld(parts + z * stride + 2 + d) * kvl_exp(kvl_ld(parts + z * stride) - m);
        kvl_st(p.out + row * v.width + d, sum > 0.0f ? acc / sum : 0.0f);
    }
}

#endif /* KVL_PAGED_DECODE_CUH */
