//! The kernel parameter structs of `kernels-cuda/include/kvl_kernels.h`, as the host compiler
//! lays them out, equal the Rust mirrors in `kvlayout_device::kernels` member for member: what a
//! backend passes is what a kernel reads.

use std::mem::{offset_of, size_of};

use kvlayout_device::kernels::{DecodeKernelParams, MoveParams, WriteParams};
use kvlayout_emu::kernel_param_layout;

/// The offsets of the named members of a struct, in the order named.
macro_rules! offsets {
    ($ty:ty: $($member:ident),* $(,)?) => {
        vec![$(offset_of!($ty, $member)),*]
    };
}

#[test]
fn parameter_structs_match_the_header() {
    let write = offsets!(WriteParams: key, value, slot_mapping, buffers, layer, act_dtype,
        inline_scales, k_lane_bytes, v_lane_bytes);
    let decode = offsets!(DecodeKernelParams: query, block_table, seq_lens, buffers, out,
        partials, layer, blocks_per_seq, q_heads, group, window, partition_tokens, partitions,
        act_dtype, inline_scales, scale, soft_cap, soft_capped, group_tile, k_vec_bytes, v_vec_bytes, k_token_lanes, v_token_major,
        reserved);
    let moves = offsets!(MoveParams: src_buffers, dst_buffers, pairs, n_pairs, head0, heads,
        dst_head0, row_unit_bytes, reserved);
    assert_eq!(kernel_param_layout(0), (size_of::<WriteParams>(), write));
    assert_eq!(
        kernel_param_layout(1),
        (size_of::<DecodeKernelParams>(), decode)
    );
    assert_eq!(kernel_param_layout(2), (size_of::<MoveParams>(), moves));
}
