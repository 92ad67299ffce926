/*
 * paged_decode: one query token per sequence against the paged cache (MHA, GQA, MQA, MLA;
 * sliding window; logits soft-cap; per-tensor and inline scales).
 *
 * Grid (seqs, kv_heads x group tiles, partitions); one block computes a tile of up to
 * KVL_MAX_GROUP_TILE query heads of one KV head (`group_tile`, chosen by the launch
 * configuration) over one partition of the sequence's attended tokens, so each key and value
 * element is read once for all the tile's heads. Dynamic shared memory: the tile's query rows
 * (group_tile x k.width floats), then group_tile x partition_tokens floats (the logits, then
 * the weights).
 *   1. the query rows into shared memory;
 *   2. logits: each warp takes every warps-th token, its lanes split the key row's elements,
 *      multiply each with every head's query and add the products across the warp; scaled,
 *      soft-capped;
 *   3. per head (a warp each): max, weights 2^((l - max) log2 e) carrying their value row's
 *      scales, sum;
 *   4. each thread owns output elements d, d + threads, ... of every head of the tile and
 *      sums weight x value over the partition's tokens (consecutive threads read consecutive
 *      elements of a value row).
 * Single pass: the output is divided by the sum. Partitioned (long contexts, as
 * flash-decoding): (max, sum, unnormalized output) go to `partials` and
 * kvl_paged_decode_reduce rescales and adds them.
 */
#ifndef KVL_PAGED_DECODE_CUH
#define KVL_PAGED_DECODE_CUH

#include "common.cuh"

#define KVL_NEG_INF (-KVL_INF)

/* Most query heads one decode block serves (registers per thread grow with it). */
#define KVL_MAX_GROUP_TILE 8

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
    const int64_t kw = k.width, tokens = p.partition_tokens;
    float *qs = (float *)kvl_dyn_shared();
    float *w = qs + p.group_tile * kw;
    for (int64_t e = kvl_thread(); e < g * kw; e += kvl_threads())
        qs[e] = kvl_act(p.query, p.act_dtype, row0 * kw + e);
    kvl_sync();

    const int64_t bs = KVL_BLOCK_SIZE(&k);
    const int32_t *table = p.block_table + seq * p.blocks_per_seq;
    /* Entries t0 / bs .. (t1 - 1) / bs of the table row are read (the emulator checks). */
    KVL_CHECK_ACCESS(table + t0 / bs, sizeof(int32_t));
    KVL_CHECK_ACCESS(table + (t1 - 1) / bs, sizeof(int32_t));
    for (int64_t i = kvl_warp(); i < n; i += kvl_warps()) {
        const int64_t t = t0 + i, block = kvl_ld(table + t / bs);
        const int64_t slot = kvl_slot_of_token(&k, t % bs);
        float dot[KVL_MAX_GROUP_TILE];
        for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
            dot[j] = 0.0f;
        for (int64_t d = kvl_lane(); d < kw; d += KVL_WARP) {
            const float x =
                kvl_load_elem(kvl_at_c(p.buffers, &k, p.layer, block, kvh, slot, d), k.dtype);
            for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
                if (j < g)
                    dot[j] += qs[j * kw + d] * x;
        }
        for (int j = 0; j < g; j++)
            dot[j] = kvl_warp_sum(dot[j]);
        if (kvl_lane() == 0) {
            float s = k.scale;
            if (p.inline_scales)
                s *= kvl_load_elem(kvl_at_c(p.buffers, &k_scale, p.layer, block, kvh, slot, 0),
                                   KVL_DTYPE_F32);
            for (int j = 0; j < g; j++) {
                float x = dot[j] * s * p.scale;
                if (p.soft_capped)
                    x = p.soft_cap * kvl_tanh(x / p.soft_cap);
                w[j * tokens + i] = x;
            }
        }
    }
    kvl_sync();

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

    for (int64_t d = kvl_thread(); d < v.width; d += kvl_threads()) {
        float acc[KVL_MAX_GROUP_TILE];
        for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
            acc[j] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = t0 + i, block = kvl_ld(table + t / bs);
            const int64_t slot = kvl_slot_of_token(&v, t % bs);
            const float x =
                kvl_load_elem(kvl_at_c(p.buffers, &v, p.layer, block, kvh, slot, d), v.dtype);
            for (int j = 0; j < KVL_MAX_GROUP_TILE; j++)
                if (j < g)
                    acc[j] += w[j * tokens + i] * x;
        }
        for (int j = 0; j < g; j++) {
            float *r = rows + j * row_step;
            if (p.partials)
                kvl_st(r + (2 + d), acc[j]);
            else
                kvl_st(r + d, acc[j] / head_stats[2 * j + 1]);
        }
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
