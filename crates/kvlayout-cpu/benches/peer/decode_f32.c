/* The decode bench's peer: paged decode of an f32 cache as a plain C loop, what an engineer
 * writes by hand (the loop of shared/baselines.md), built -O3 -march=native -ffast-math so the
 * compiler vectorizes the dot products. One call is one (sequence, KV head) with its GQA group
 * of query heads: each K row, then each V row, is read once for the whole group.
 * Rows are located through the layout's argument structs and kvl_offset, as every kernel of
 * this project; their elements are contiguous f32 (the bench states layouts where they are). */
#include <math.h>
#include <stdint.h>

#include "kvlayout.h"

void kvl_peer_decode_f32(kvl_field_args k, kvl_field_args v, const unsigned char *cache,
                         const int32_t *block_table, int64_t len, const float *query,
                         int64_t group, int64_t kv_head, float scale, float *out,
                         float *logits)
{
    const int64_t dk = k.width, dv = v.width, bs = k.block_size;
    /* logits: [group][len]; each K row read once for the whole group. */
    for (int64_t t = 0; t < len; t++) {
        int64_t block = block_table[t / bs];
        const float *row = (const float *)(cache + kvl_offset(&k, 0, block, kv_head, t % bs, 0));
        for (int64_t j = 0; j < group; j++) {
            const float *q = query + j * dk;
            float dot = 0.0f;
            for (int64_t d = 0; d < dk; d++)
                dot += q[d] * row[d];
            logits[j * len + t] = dot * scale;
        }
    }
    for (int64_t j = 0; j < group; j++) {
        float *l = logits + j * len, max = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < len; t++)
            max = l[t] > max ? l[t] : max;
        for (int64_t t = 0; t < len; t++) {
            l[t] = expf(l[t] - max);
            sum += l[t];
        }
        for (int64_t t = 0; t < len; t++)
            l[t] /= sum;
        for (int64_t d = 0; d < dv; d++)
            out[j * dv + d] = 0.0f;
    }
    /* Each V row read once for the whole group. */
    for (int64_t t = 0; t < len; t++) {
        int64_t block = block_table[t / bs];
        const float *row = (const float *)(cache + kvl_offset(&v, 0, block, kv_head, t % bs, 0));
        for (int64_t j = 0; j < group; j++) {
            float p = logits[j * len + t], *o = out + j * dv;
            for (int64_t d = 0; d < dv; d++)
                o[d] += p * row[d];
        }
    }
}
