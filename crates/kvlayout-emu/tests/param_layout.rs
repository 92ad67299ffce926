//! The kernel parameter structs of `kernels-cuda/include/kvl_kernels.h`, as the host compiler
//! lays them out, equal the Rust mirrors in `kvlayout_device::kernels` member for member: what a
//! backend passes is what a kernel reads.

use std::mem::{offset_of, size_of};

use kvlayout_device::kernels::{DecodeKernelParams, MoveParams, WriteParams};
use kvlayout_emu::kernel_param_layout;

#[test]
fn parameter_structs_match_the_header() {
    let write = vec![
        offset_of!(WriteParams, key),
        offset_of!(WriteParams, value),
        offset_of!(WriteParams, slot_mapping),
        offset_of!(WriteParams, buffers),
        offset_of!(WriteParams, layer),
        offset_of!(WriteParams, act_dtype),
        offset_of!(WriteParams, inline_scales),
    ];
    let decode = vec![
        offset_of!(DecodeKernelParams, query),
        offset_of!(DecodeKernelParams, block_table),
        offset_of!(DecodeKernelParams, seq_lens),
        offset_of!(DecodeKernelParams, buffers),
        offset_of!(DecodeKernelParams, out),
        offset_of!(DecodeKernelParams, partials),
        offset_of!(DecodeKernelParams, layer),
        offset_of!(DecodeKernelParams, blocks_per_seq),
        offset_of!(DecodeKernelParams, q_heads),
        offset_of!(DecodeKernelParams, group),
        offset_of!(DecodeKernelParams, window),
        offset_of!(DecodeKernelParams, partition_tokens),
        offset_of!(DecodeKernelParams, partitions),
        offset_of!(DecodeKernelParams, act_dtype),
        offset_of!(DecodeKernelParams, inline_scales),
        offset_of!(DecodeKernelParams, scale),
        offset_of!(DecodeKernelParams, soft_cap),
        offset_of!(DecodeKernelParams, soft_capped),
        offset_of!(DecodeKernelParams, group_tile),
        offset_of!(DecodeKernelParams, reserved),
    ];
    let moves = vec![
        offset_of!(MoveParams, src_buffers),
        offset_of!(MoveParams, dst_buffers),
        offset_of!(MoveParams, pairs),
        offset_of!(MoveParams, n_pairs),
        offset_of!(MoveParams, head0),
        offset_of!(MoveParams, heads),
        offset_of!(MoveParams, dst_head0),
        offset_of!(MoveParams, row_unit_bytes),
        offset_of!(MoveParams, reserved),
    ];
    assert_eq!(kernel_param_layout(0), (size_of::<WriteParams>(), write));
    assert_eq!(
        kernel_param_layout(1),
        (size_of::<DecodeKernelParams>(), decode)
    );
    assert_eq!(kernel_param_layout(2), (size_of::<MoveParams>(), moves));
}
