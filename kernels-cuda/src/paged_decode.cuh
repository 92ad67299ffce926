/*
 * paged_decode: one query token per sequence against the paged cache (MHA, GQA, MQA, MLA;
 * sliding window; logits soft-cap; per-tensor and inline scales).
 *
 * Grid (seqs, q_heads, partitions); one block computes one (sequence, query head) over one
 * partition of its attended tokens. Dynamic shared memory: the query row (k.width floats),
 * then one float per token of the partition (the logits, then the weights).
 *   1. the query row into shared memory;
 *   2. logits: each warp takes every warps-th token, its lanes split the key row's elements
 *      and add their products across the warp; scaled, soft-capped;
 *   3. block max, weights 2^((l - max) log2 e), block sum; each weight then carries its
 *      value row's scales;
 *   4. each thread owns output elements d, d + threads, ... and sums weight x value over the
 *      partition's tokens (consecutive threads read consecutive elements of a value row).
 * Single pass: the output is divided by the sum. Partitioned (long contexts, as
 * flash-decoding): (max, sum, unnormalized output) go to `partials` and
 * kvl_paged_decode_reduce rescales and adds them.
 */
#ifndef KVL_PAGED_DECODE_CUH
#define KVL_PAGED_DECODE_CUH

#include "common.cuh"

#define KVL_NEG_INF (-__builtin_inff())

KVL_KERNEL kvl_paged_decode(kvl_field_args k, kvl_field_args v, kvl_field_args k_scale,
                            kvl_field_args v_scale, kvl_decode_params p)
{
    KVL_SHARED(float, scratch, 1024 / KVL_WARP);
    kvl_plant_fields(&k, &v);
    const int64_t seq = kvl_block_x(), qh = kvl_block_y(), part = kvl_block_z();
    const int64_t kvh = qh / p.group;
    const int64_t len = p.seq_lens[seq];
    const int64_t start = (p.window >= 0 && len > p.window) ? len - p.window : 0;
    const int64_t t0 = start + part * p.partition_tokens;
    const int64_t t1 = t0 + p.partition_tokens < len ? t0 + p.partition_tokens : len;
    const int64_t n = t1 > t0 ? t1 - t0 : 0;
    const int64_t row = seq * p.q_heads + qh;
    float *stats = p.partials ? p.partials + (row * p.partitions + part) * (2 + v.width) : 0;
    float *acc_out = stats ? stats + 2 : p.out + row * v.width;
    if (n == 0) { /* the same for every thread of the block */
        for (int64_t d = kvl_thread(); d < v.width; d += kvl_threads())
            acc_out[d] = 0.0f;
        if (stats && kvl_thread() == 0) {
            stats[0] = KVL_NEG_INF;
            stats[1] = 0.0f;
        }
        return;
    }
    float *qs = (float *)kvl_dyn_shared();
    float *w = qs + k.width;
    for (int64_t d = kvl_thread(); d < k.width; d += kvl_threads())
        qs[d] = kvl_act(p.query, p.act_dtype, row * k.width + d);
    kvl_sync();

    const int64_t bs = KVL_BLOCK_SIZE(&k);
    const int32_t *table = p.block_table + seq * p.blocks_per_seq;
    /* Entries t0 / bs .. (t1 - 1) / bs of the table row are read (the emulator checks). */
    KVL_CHECK_ACCESS(table + t0 / bs, sizeof(int32_t));
    KVL_CHECK_ACCESS(table + (t1 - 1) / bs, sizeof(int32_t));
    for (int64_t i = kvl_warp(); i < n; i += kvl_warps()) {
        const int64_t t = t0 + i, block = table[t / bs], slot = kvl_slot_of_token(&k, t % bs);
        float dot = 0.0f;
        for (int64_t d = kvl_lane(); d < k.width; d += KVL_WARP)
            dot += qs[d] * kvl_load_elem(kvl_at_c(p.buffers, &k, p.layer, block, kvh, slot, d),
                                         k.dtype);
        dot = kvl_warp_sum(dot);
        if (kvl_lane() == 0) {
            float s = k.scale;
            if (p.inline_scales)
                s *= kvl_load_elem(kvl_at_c(p.buffers, &k_scale, p.layer, block, kvh, slot, 0),
                                   KVL_DTYPE_F32);
            float x = dot * s * p.scale;
            if (p.soft_capped)
                x = p.soft_cap * kvl_tanh(x / p.soft_cap);
            w[i] = x;
        }
    }
    kvl_sync();

    float m = KVL_NEG_INF;
    for (int64_t i = kvl_thread(); i < n; i += kvl_threads())
        m = kvl_maxf(m, w[i]);
    m = kvl_block_reduce(m, 1, scratch);
    float sum = 0.0f;
    for (int64_t i = kvl_thread(); i < n; i += kvl_threads()) {
        const float e = kvl_exp(w[i] - m);
        sum += e;
        float s = v.scale;
        if (p.inline_scales) {
            const int64_t t = t0 + i, block = table[t / bs], slot = kvl_slot_of_token(&v, t % bs);
            s *= kvl_load_elem(kvl_at_c(p.buffers, &v_scale, p.layer, block, kvh, slot, 0),
                               KVL_DTYPE_F32);
        }
        w[i] = e * s;
    }
    sum = kvl_block_reduce(sum, 0, scratch); /* its barriers also publish the weights */

    for (int64_t d = kvl_thread(); d < v.width; d += kvl_threads()) {
        float acc = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = t0 + i, block = table[t / bs], slot = kvl_slot_of_token(&v, t % bs);
            acc += w[i] * kvl_load_elem(kvl_at_c(p.buffers, &v, p.layer, block, kvh, slot, d),
                                        v.dtype);
        }
        acc_out[d] = stats ? acc : acc / sum;
    }
    if (stats && kvl_thread() == 0) {
        stats[0] = m;
        stats[1] = sum;
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
        if (parts[z * stride + 1] > 0.0f)
            m = kvl_maxf(m, parts[z * stride]);
    for (int z = 0; z < p.partitions; z++)
        if (parts[z * stride + 1] > 0.0f)
            sum += parts[z * stride + 1] * kvl_exp(parts[z * stride] - m);
    for (int64_t d = kvl_thread(); d < v.width; d += kvl_threads()) {
        float acc = 0.0f;
        for (int z = 0; z < p.partitions; z++)
            if (parts[z * stride + 1] > 0.0f)
                acc += parts[z * stride + 2 + d] * kvl_exp(parts[z * stride] - m);
        p.out[row * v.width + d] = sum > 0.0f ? acc / sum : 0.0f;
    }
}

#endif /* KVL_PAGED_DECODE_CUH */
