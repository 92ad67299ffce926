/*
 * write_kv: scatters new tokens' K and V (or the MLA latent) into the cache by slot.
 *
 * Grid (tokens, heads); one block writes one (token, head): its K row, then its V row. A row
 * is divided by the field's per-tensor scale; with inline scales, also by the row's own scale
 * amax / qmax, stored in the k_scale / v_scale field. The same arithmetic, in the same order,
 * as the CPU crate's encoders, so the bytes agree exactly. Rows that are one aligned run are
 * stored 16 bytes per lane (k_lane_bytes / v_lane_bytes), the rest one element per lane.
 */
#ifndef KVL_WRITE_KV_CUH
#define KVL_WRITE_KV_CUH

#include "common.cuh"

/* `x` encoded as `dtype`, in the low bytes (the bytes kvl_store_elem writes, little-endian). */
KVL_DEVICE uint32_t kvl_encode_bits(int dtype, float x)
{
    switch (dtype) {
    case KVL_DTYPE_F32: return kvl_f32_as_bits(x);
    case KVL_DTYPE_F16: return kvl_f32_to_f16(x);
    case KVL_DTYPE_BF16: return kvl_f32_to_bf16(x);
    case KVL_DTYPE_FP8_E4M3: return kvl_f32_to_fp8_e4m3(x);
    case KVL_DTYPE_FP8_E5M2: return kvl_f32_to_fp8_e5m2(x);
    case KVL_DTYPE_INT8: return kvl_f32_to_int8(x);
    case KVL_DTYPE_U8: return kvl_f32_to_u8(x);
    default: return 0;
    }
}

/*
 * Elements first .. first + 16 / elem_bytes of activations `src`, divided by the tensor scale
 * and `q`, encoded as `f`'s dtype and packed into one 16-byte vector in registers. Inlined
 * with a constant `elem_bytes`, so the loop unrolls.
 */
__attribute__((always_inline)) KVL_DEVICE kvl_u128 kvl_encode16(const kvl_field_args *f,
                                                               const kvl_write_params *p,
                                                               const void *src, int64_t first,
                                                               float q, const int elem_bytes)
{
    uint32_t w[4] = {0, 0, 0, 0};
    for (int i = 0; i < 16 / elem_bytes; i++) {
        float x = kvl_act(src, p->act_dtype, first + i) / f->scale;
        const int at = i * elem_bytes;
        w[at / 4] |= kvl_encode_bits(f->dtype, x / q) << (8 * (at % 4));
    }
    kvl_u128 v = {w[0], w[1], w[2], w[3]};
    return v;
}

/*
 * One row of `src` (f32 scaled by 1/tensor scale) into field `f` at (layer, block, head, slot).
 * `lane_bytes` 16 (the row is one run, its start and length multiples of 16: chosen in Rust):
 * each lane encodes the elements of 16 bytes of the row and stores them as one vector; 0: one
 * element per lane. The row's base is computed once; the bytes are the same either way.
 */
__attribute__((always_inline)) KVL_DEVICE void kvl_write_row(const kvl_field_args *f, const kvl_field_args *fscale,
                              const kvl_write_params *p, const void *src, int64_t row,
                              int64_t block, int64_t head, int64_t slot, int lane_bytes,
                              float *scratch)
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
    if (lane_bytes == 16) {
        unsigned char *base = p->buffers[f->buffer] + KVL_OFFSET(f, p->layer, block, head, slot, 0);
        const int eb = f->elem_bytes;
        const int64_t pieces = width * eb / 16, first = row * width;
        for (int64_t c = kvl_thread(); c < pieces; c += kvl_threads()) {
            const int64_t at = first + c * (16 / eb);
            kvl_u128 v = eb == 4   ? kvl_encode16(f, p, src, at, q, 4)
                         : eb == 2 ? kvl_encode16(f, p, src, at, q, 2)
                                   : kvl_encode16(f, p, src, at, q, 1);
            kvl_store16(base + c * 16, v);
        }
        return;
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
    int64_t slot = p.slot_mapping[token];
    if (slot < 0)
        return; /* padding: the whole block leaves together */
    int64_t bs = KVL_BLOCK_SIZE(&k);
    int64_t block = slot / bs;
    int64_t in_block = kvl_slot_of_token(&k, slot % bs);
    int64_t row = token * k.num_heads + head;
    kvl_write_row(&k, &k_scale, &p, p.key, row, block, head, in_block, p.k_lane_bytes,
                  scratch);
    if (p.value)
        kvl_write_row(&v, &v_scale, &p, p.value, row, block, head, in_block, p.v_lane_bytes,
                      scratch);
}

#endif /* KVL_WRITE_KV_CUH */
