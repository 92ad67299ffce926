/* ABI probe: exports what the C compiler sees of kvlayout.h, for tests/tests/abi.rs. */
#include <stddef.h>
#include <stdint.h>

#include "kvlayout.h"

size_t kvl_probe_sizeof(void) { return sizeof(kvl_field_args); }

size_t kvl_probe_alignof(void) { return _Alignof(kvl_field_args); }

/* Offset of member `i` in declaration order, -1 past the last member. */
int64_t kvl_probe_offsetof(int32_t i)
{
    static const size_t offsets[] = {
        offsetof(kvl_field_args, base_offset_bytes),
        offsetof(kvl_field_args, layer_stride_bytes),
        offsetof(kvl_field_args, block_stride_bytes),
        offsetof(kvl_field_args, head_stride_bytes),
        offsetof(kvl_field_args, slot_stride_bytes),
        offsetof(kvl_field_args, dim_chunk_stride_bytes),
        offsetof(kvl_field_args, dim_stride_bytes),
        offsetof(kvl_field_args, num_layers),
        offsetof(kvl_field_args, num_blocks),
        offsetof(kvl_field_args, num_heads),
        offsetof(kvl_field_args, num_slots),
        offsetof(kvl_field_args, width),
        offsetof(kvl_field_args, dim_split),
        offsetof(kvl_field_args, block_size),
        offsetof(kvl_field_args, tokens_per_state),
        offsetof(kvl_field_args, buffer),
        offsetof(kvl_field_args, dtype),
        offsetof(kvl_field_args, elem_bytes),
        offsetof(kvl_field_args, field),
        offsetof(kvl_field_args, scale),
        offsetof(kvl_field_args, reserved),
    };
    if (i < 0 || (size_t)i >= sizeof(offsets) / sizeof(offsets[0])) {
        return -1;
    }
    return (int64_t)offsets[i];
}

/* Size of member `i` in declaration order, -1 past the last member. */
int64_t kvl_probe_sizeof_member(int32_t i)
{
    if (i < 0 || i > 20) {
        return -1;
    }
    return i < 15 ? (int64_t)sizeof(int64_t) : (int64_t)sizeof(int32_t);
}

/* KVL_DTYPE_<code>, in code order; -1 past the last. */
int32_t kvl_probe_dtype_code(int32_t i)
{
    static const int32_t codes[] = {
        KVL_DTYPE_F32,      KVL_DTYPE_F16,  KVL_DTYPE_BF16, KVL_DTYPE_FP8_E4M3,
        KVL_DTYPE_FP8_E5M2, KVL_DTYPE_INT8, KVL_DTYPE_U8,
    };
    if (i < 0 || (size_t)i >= sizeof(codes) / sizeof(codes[0])) {
        return -1;
    }
    return codes[i];
}

/* KVL_FIELD_<code>, in code order; -1 past the last. */
int32_t kvl_probe_field_code(int32_t i)
{
    static const int32_t codes[] = {
        KVL_FIELD_K,     KVL_FIELD_V,     KVL_FIELD_K_SCALE, KVL_FIELD_V_SCALE,
        KVL_FIELD_LATENT, KVL_FIELD_BYTES, KVL_FIELD_CONV,    KVL_FIELD_SSM,
    };
    if (i < 0 || (size_t)i >= sizeof(codes) / sizeof(codes[0])) {
        return -1;
    }
    return codes[i];
}

int64_t kvl_probe_offset(const kvl_field_args *a, int64_t layer, int64_t block, int64_t head,
                         int64_t slot, int64_t dim)
{
    return kvl_offset(a, layer, block, head, slot, dim);
}

int32_t kvl_probe_in_domain(const kvl_field_args *a, int64_t layer, int64_t block, int64_t head,
                            int64_t slot, int64_t dim)
{
    return kvl_in_domain(a, layer, block, head, slot, dim);
}

int64_t kvl_probe_slot_of_token(const kvl_field_args *a, int64_t token_in_block)
{
    return kvl_slot_of_token(a, token_in_block);
}
