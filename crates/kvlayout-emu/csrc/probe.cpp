/*
 * Host probes of the kernel headers, for the crate's tests: the kernels' element conversions
 * (kernels-cuda/include/kvl_dtype.h), to compare bit for bit with the CPU crate's encoders,
 * and the layout of the kernel parameter structs (kvl_kernels.h), to compare with the Rust
 * mirrors in kvlayout::kernels.
 */
#include <stddef.h>

#include "kvlayout.h"
#include "kvl_dtype.h"
#include "kvl_kernels.h"

extern "C" void kvl_emu_encode(int dtype, float x, unsigned char *out)
{
    kvl_store_elem(out, dtype, x);
}

extern "C" float kvl_emu_decode(int dtype, const unsigned char *bytes)
{
    return kvl_load_elem(bytes, dtype);
}

#define KVL_OFFSETS(type, ...)                                                                 \
    {                                                                                          \
        static const long long o[] = {__VA_ARGS__, -1};                                       \
        if (member < 0)                                                                        \
            return (long long)sizeof(type);                                                    \
        return o[member];                                                                      \
    }

/* Struct `which` (0 write, 1 decode, 2 move): its size for member -1, else the offset of its
 * member-th member in declaration order (-1 past the last). */
extern "C" long long kvl_emu_param_layout(int which, int member)
{
    switch (which) {
    case 0:
        KVL_OFFSETS(kvl_write_params, offsetof(kvl_write_params, key),
                    offsetof(kvl_write_params, value), offsetof(kvl_write_params, slot_mapping),
                    offsetof(kvl_write_params, buffers), offsetof(kvl_write_params, layer),
                    offsetof(kvl_write_params, act_dtype),
                    offsetof(kvl_write_params, inline_scales),
                    offsetof(kvl_write_params, k_lane_bytes),
                    offsetof(kvl_write_params, v_lane_bytes))
    case 1:
        KVL_OFFSETS(kvl_decode_params, offsetof(kvl_decode_params, query),
                    offsetof(kvl_decode_params, block_table),
                    offsetof(kvl_decode_params, seq_lens), offsetof(kvl_decode_params, buffers),
                    offsetof(kvl_decode_params, out), offsetof(kvl_decode_params, partials),
                    offsetof(kvl_decode_params, layer),
                    offsetof(kvl_decode_params, blocks_per_seq),
                    offsetof(kvl_decode_params, q_heads), offsetof(kvl_decode_params, group),
                    offsetof(kvl_decode_params, window),
                    offsetof(kvl_decode_params, partition_tokens),
                    offsetof(kvl_decode_params, partitions),
                    offsetof(kvl_decode_params, act_dtype),
                    offsetof(kvl_decode_params, inline_scales),
                    offsetof(kvl_decode_params, scale), offsetof(kvl_decode_params, soft_cap),
                    offsetof(kvl_decode_params, soft_capped),
                    offsetof(kvl_decode_params, group_tile),
                    offsetof(kvl_decode_params, k_vec_bytes),
                    offsetof(kvl_decode_params, v_vec_bytes),
                    offsetof(kvl_decode_params, k_token_lanes),
                    offsetof(kvl_decode_params, v_token_major),
                    offsetof(kvl_decode_params, reserved))
    default:
        KVL_OFFSETS(kvl_move_params, offsetof(kvl_move_params, src_buffers),
                    offsetof(kvl_move_params, dst_buffers), offsetof(kvl_move_params, pairs),
                    offsetof(kvl_move_params, n_pairs), offsetof(kvl_move_params, head0),
                    offsetof(kvl_move_params, heads), offsetof(kvl_move_params, dst_head0),
                    offsetof(kvl_move_params, row_unit_bytes),
                    offsetof(kvl_move_params, reserved))
    }
}
