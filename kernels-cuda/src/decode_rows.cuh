/*
 * decode_rows.cuh - how paged_decode reads cache rows: a row's base address once per token
 * (one KVL_OFFSET), elements at their in-row offset from it, or 16-byte vectors unpacked to
 * floats when the Rust side chose the wide path (`k_vec_bytes` / `v_vec_bytes` 16: the row is
 * one run of bytes and every row start and the buffer are 16-byte aligned). Does not choose a
 * path: the launch parameters say which.
 */
#ifndef KVL_DECODE_ROWS_CUH
#define KVL_DECODE_ROWS_CUH

#include "common.cuh"

/* Most elements in one 16-byte vector (1-byte elements). */
#define KVL_VEC_ELEMS 16

/* Address of element 0 of row (layer, block, head, slot) of a field. */
KVL_DEVICE const unsigned char *kvl_row_base(const unsigned char *const *buffers,
                                             const kvl_field_args *a, int64_t layer,
                                             int64_t block, int64_t head, int64_t slot)
{
    return buffers[a->buffer] + KVL_OFFSET(a, layer, block, head, slot, 0);
}

/* Bytes from a row's element 0 to its element `dim` (chunk and element strides). */
KVL_DEVICE int64_t kvl_in_row(const kvl_field_args *a, int64_t dim)
{
    return kvl_offset(a, 0, 0, 0, 0, dim) - kvl_offset(a, 0, 0, 0, 0, 0);
}

/*
 * The 16 bytes at `p`, a multiple of 16 (a GPU faults on a misaligned vector load; the
 * emulator ends the launch instead). The caller checks the access (KVL_CACHE_LOAD).
 */
KVL_DEVICE kvl_u128 kvl_row_load16(const unsigned char *p)
{
#if defined(KVL_EMU)
    if (((uint64_t)(uintptr_t)p & 15u) != 0)
        kvl_trap();
#endif
    return *(const kvl_u128 *)p;
}

/* Sixteen zero bytes. */
KVL_DEVICE kvl_u128 kvl_zero16(void)
{
    kvl_u128 z;
    for (int i = 0; i < 4; i++)
        KVL_U128_WORD(z, i) = 0u;
    return z;
}

/* Decodes the 16 / elem_bytes elements of `raw` (little-endian) into x[0..]. */
KVL_DEVICE void kvl_unpack16(kvl_u128 raw, int dtype, float *x)
{
    switch (dtype) {
    case KVL_DTYPE_F32:
        for (int i = 0; i < 4; i++)
            x[i] = kvl_bits_as_f32(KVL_U128_WORD(raw, i));
        break;
    case KVL_DTYPE_F16:
        for (int i = 0; i < 8; i++)
            x[i] = kvl_f16_to_f32((uint16_t)(KVL_U128_WORD(raw, i / 2) >> (16 * (i % 2))));
        break;
    case KVL_DTYPE_BF16:
        for (int i = 0; i < 8; i++)
            x[i] = kvl_bf16_to_f32((uint16_t)(KVL_U128_WORD(raw, i / 2) >> (16 * (i % 2))));
        break;
    default:
        for (int i = 0; i < 16; i++) {
            const unsigned char b = (unsigned char)(KVL_U128_WORD(raw, i / 4) >> (8 * (i % 4)));
            x[i] = kvl_load_elem(&b, dtype);
        }
        break;
    }
}

/* Sum over aligned groups of `lanes` lanes (a power of two up to KVL_WARP); every lane of
 * the warp calls it and gets its group's sum. */
KVL_DEVICE float kvl_lanes_sum(float x, int lanes)
{
    for (int m = lanes / 2; m > 0; m /= 2)
        x += kvl_shfl_xor(x, m);
    return x;
}

#endif /* KVL_DECODE_ROWS_CUH */
