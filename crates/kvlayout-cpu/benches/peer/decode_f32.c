/* The decode bench's peer: paged decode of an f32 cache as a plain C loop, what an engineer
 * writes by hand, built -O3 -march=native -ffast-math so the
 * compiler vectorizes the dot products. One call is one (sequence, KV head) with its GQA group
 * of query heads: each K row, then each V row, is read once for the whole group.
 * Rows are located through the layout's argument structs and kvl_offset, as every kernel of
 * this project; their elements are contiguous f32 (the bench states layouts where they are). */
#include <math.h>
#include <stdint.h>

#include "kvlayout.h"

/* One call's arguments: what a hand-written loop takes, named. */
typedef struct kvl_peer_step {
    kvl_field_args k, v;
    const unsigned char *cache;
    const int32_t *block_table;
    int64_t len, group, kv_head;
    const float *query; /* [group][k.width] */
    float scale;
    float *out;    /* [group][v.width] */
    float *logits; /* [group][len] scratch */
} kvl_peer_step;

void kvl_peer_decode_f32(const kvl_peer_step *a)
{
    const kvl_field_args k = a->k, v = a->v;
    const unsigned char *cache = a->cache;
    const int32_t *block_table = a->block_table;
    const int64_t len = a->len, group = a->group, kv_head = a->kv_head;
    const float *query = a->query;
    const float scale = a->scale;
    float *out = a->out, *logits = a->logits;
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
