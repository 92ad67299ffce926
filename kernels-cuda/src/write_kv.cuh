/*
 * write_kv: scatters new tokens' K and V (or the MLA latent) into the cache by slot.
 *
 * Grid (tokens, heads); one block writes one (token, head): its K row, then its V row. A row
 * is divided by the field's per-tensor scale; with inline scales, also by the row's own scale
 * amax / qmax, stored in the k_scale / v_scale field. The same arithmetic, in the same order,
 * as the CPU crate's encoders, so the bytes agree exactly. Rows that are one aligned run are
 * stored 16 (or 8) bytes per lane (k_lane_bytes / v_lane_bytes), the rest one element per lane.
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
 * Elements first .. first + lane_bytes / elem_bytes of activations `src`, divided by the
 * tensor scale and `q`, encoded as `f`'s dtype and packed little-endian into `w` (lane_bytes /
 * 4 words, in registers). Inlined with constant sizes, so the loop unrolls.
 */
__attribute__((always_inline)) KVL_DEVICE void kvl_encode_lane(const kvl_field_args *f,
                                                              const kvl_write_params *p,
                                                              const void *src, int64_t first,
                                                              float q, const int elem_bytes,
                                                              const int lane_bytes, uint32_t *w)
{
    for (int i = 0; i < lane_bytes / 4; i++)
        w[i] = 0;
    for (int i = 0; i < lane_bytes / elem_bytes; i++) {
        float x = kvl_act(src, p->act_dtype, first + i) / f->scale;
        const int at = i * elem_bytes;
        w[at / 4] |= kvl_encode_bits(f->dtype, x / q) << (8 * (at % 4));
    }
}

/* Piece `c` of a row at `base`, `lane_bytes` (16 or 8) of encoded elements, as one store. */
__attribute__((always_inline)) KVL_DEVICE void kvl_store_lane(unsigned char *base, int64_t c,
                                                             const kvl_field_args *f,
                                                             const kvl_write_params *p,
                                                             const void *src, int64_t first,
                                                             float q, const int lane_bytes)
{
    uint32_t w[4];
    const int eb = f->elem_bytes;
    if (eb == 4)
        kvl_encode_lane(f, p, src, first, q, 4, lane_bytes, w);
    else if (eb == 2)
        kvl_encode_lane(f, p, src, first, q, 2, lane_bytes, w);
    else
        kvl_encode_lane(f, p, src, first, q, 1, lane_bytes, w);
    unsigned char *at = base + c * lane_bytes;
    if (lane_bytes == 16) {
        kvl_store16(at, kvl_u128_of(w[0], w[1], w[2], w[3]));
    } else {
        KVL_CACHE_STORE(at, 8);
        KVL_CHECK_ALIGNED(at, 8);
        *(uint64_t *)at = (uint64_t)w[1] << (8 * sizeof(uint32_t)) | w[0];
    }
}

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
    if (lane_bytes > 0) {
        unsigned char *base = p->buffers[f->buffer] + KVL_OFFSET(f, p->layer, block, head, slot, 0);
        const int64_t per_lane = lane_bytes / f->elem_bytes;
        const int64_t pieces = width / per_lane, first = row * width;
        for (int64_t c = kvl_thread(); c < pieces; c += kvl_threads()) {
            if (lane_bytes == 16)
                kvl_store_lane(base, c, f, p, src, first + c * per_lane, q, 16);
            else
                kvl_store_lane(base, c, f, p, src, first + c * per_lane, q, 8);
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
    int64_t slot = kvl_ld(p.slot_mapping + token);
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
