/*
 * write_kv: scatters new tokens' K and V (or the MLA latent) into the cache by slot.
 *
 * Grid (tokens, heads); one block writes one (token, head): its K row, then its V row. A row
 * is divided by the field's per-tensor scale; with inline scales, also by the row's own scale
 * amax / qmax, stored in the k_scale / v_scale field. The same arithmetic, in the same order,
 * as the CPU crate's encoders, so the bytes agree exactly.
 */
#ifndef KVL_WRITE_KV_CUH
#define KVL_WRITE_KV_CUH

#include "common.cuh"

/* One row of `src` (f32 scaled by 1/tensor scale) into field `f` at (layer, block, head, slot). */
KVL_DEVICE void kvl_write_row(const kvl_field_args *f, const kvl_field_args *fscale,
                              const kvl_write_params *p, const void *src, int64_t row,
                              int64_t block, int64_t head, int64_t slot, float *scratch)
{
    int64_t width = f->width;
    float q = 1.0f;
    if (p->inline_scales) {
        float amax = 0.0f;
        for (int64_t d = kvl_thread(); d < width; d += kvl_threads()) {
            float x = kvl_act(src, p->act_dtype, row * width + d) / f->scale;
            amax = kvl_maxf(amax, x < 0.0f ? -x : x);
        }
        q = kvl_inline_scale(f->dtype, kvl_block_reduce(amax, 1, scratch));
        if (kvl_thread() == 0)
            kvl_store_elem(kvl_at(p->buffers, fscale, p->layer, block, head, slot, 0),
                           KVL_DTYPE_F32, q);
    }
    for (int64_t d = kvl_thread(); d < width; d += kvl_threads()) {
        float x = kvl_act(src, p->act_dtype, row * width + d) / f->scale;
        kvl_store_elem(kvl_at(p->buffers, f, p->layer, block, head, slot, d), f->dtype, x / q);
    }
}

KVL_KERNEL kvl_write_kv(kvl_field_args k, kvl_field_args v, kvl_field_args k_scale,
                        kvl_field_args v_scale, kvl_write_params p)
{
    KVL_SHARED(float, scratch, 1024 / KVL_WARP);
    kvl_plant_fields(&k, &v);
    int64_t token = kvl_block_x();
    int64_t head = kvl_block_y();
    int64_t slot = kvl_ld(p.slot_mapping + token);
    if (slot < 0)
        return; /* padding: the whole block leaves together */
    int64_t bs = KVL_BLOCK_SIZE(&k);
    int64_t block = slot / bs;
    int64_t in_block = kvl_slot_of_token(&k, slot % bs);
    int64_t row = token * k.num_heads + head;
    kvl_write_row(&k, &k_scale, &p, p.key, row, block, head, in_block, scratch);
    if (p.value)
        kvl_write_row(&v, &v_scale, &p, p.value, row, block, head, in_block, scratch);
}

#endif /* KVL_WRITE_KV_CUH */
