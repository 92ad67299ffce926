//! The kernel launches of each op, built from the descriptor and the op's validated shape:
//! which kernel, its launch configuration and its arguments, as every executor of the kernels
//! (the CUDA and HIP backends, the host emulator) runs them. An executor supplies only where
//! things are (device addresses); nothing here reads memory.
//!
//! [`KernelArgs::block`] is the argument block a driver takes in one buffer
//! (`CU_LAUNCH_PARAM_BUFFER_POINTER`, `HIP_LAUNCH_PARAM_BUFFER_POINTER`): each argument's
//! little-endian bytes at its offset ([`arg_slots`]), as the kernel's signature lays them out.

use kvlayout::ops::{DecodeParams, DecodeShape, Moves, OpError, WriteShape};
use kvlayout::DType;
use kvlayout::Field;
use kvlayout::KvCacheLayout;
use kvlayout::KvFieldArgs;

use super::decode_paths::decode_rows;
use super::launch::{
    move_launch, paged_decode_launch, row_lanes, row_unit_bytes, write_kv_launch, write_lane_bytes,
    DecodeLaunch, GpuTarget, LaunchConfig,
};
use super::params::{DecodeKernelParams, MoveParams, WriteParams};

/// The kernels of `kernels-cuda/src`, by entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `kvl_write_kv(k, v, k_scale, v_scale, kvl_write_params)`.
    WriteKv,
    /// `kvl_paged_decode(k, v, k_scale, v_scale, kvl_decode_params)`.
    PagedDecode,
    /// `kvl_paged_decode_reduce(v, kvl_decode_params)`.
    PagedDecodeReduce,
    /// `kvl_move_blocks(src, dst, kvl_move_params)`.
    MoveBlocks,
}

/// Size in bytes of `kvl_field_args`.
pub const FIELD_ARGS_BYTES: usize = 144;
/// Alignment of every kernel argument (each struct holds 64-bit members).
pub const ARG_ALIGN: usize = 8;

impl Kernel {
    /// Every kernel, in the order the sources define them.
    pub const ALL: [Kernel; 4] = [
        Kernel::WriteKv,
        Kernel::PagedDecode,
        Kernel::PagedDecodeReduce,
        Kernel::MoveBlocks,
    ];

    /// The entry point's symbol.
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::WriteKv => "kvl_write_kv",
            Kernel::PagedDecode => "kvl_paged_decode",
            Kernel::PagedDecodeReduce => "kvl_paged_decode_reduce",
            Kernel::MoveBlocks => "kvl_move_blocks",
        }
    }

    /// Size in bytes of each parameter, in order.
    pub const fn arg_sizes(self) -> &'static [usize] {
        const F: usize = FIELD_ARGS_BYTES;
        match self {
            Kernel::WriteKv => &[F, F, F, F, size_of::<WriteParams>()],
            Kernel::PagedDecode => &[F, F, F, F, size_of::<DecodeKernelParams>()],
            Kernel::PagedDecodeReduce => &[F, size_of::<DecodeKernelParams>()],
            Kernel::MoveBlocks => &[F, F, size_of::<MoveParams>()],
        }
    }
}

/// `(offset, size)` of each parameter of `kernel` in its argument block: in order, each at
/// the next multiple of [`ARG_ALIGN`].
pub fn arg_slots(kernel: Kernel) -> Vec<(usize, usize)> {
    let mut at = 0usize;
    kernel
        .arg_sizes()
        .iter()
        .map(|&size| {
            let slot = (at.next_multiple_of(ARG_ALIGN), size);
            at = slot.0 + size;
            slot
        })
        .collect()
}

/// The arguments of one kernel call, by value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArgs {
    /// `kvl_write_kv`: K, V, k_scale, v_scale.
    Write {
        /// K, V, k_scale, v_scale.
        fields: [KvFieldArgs; 4],
        /// The rest.
        params: WriteParams,
    },
    /// `kvl_paged_decode`.
    Decode {
        /// K, V, k_scale, v_scale.
        fields: [KvFieldArgs; 4],
        /// The rest.
        params: DecodeKernelParams,
    },
    /// `kvl_paged_decode_reduce`.
    Reduce {
        /// V.
        v: KvFieldArgs,
        /// The decode's parameters.
        params: DecodeKernelParams,
    },
    /// `kvl_move_blocks`: one field of the source and of the destination.
    Move {
        /// The field in the source.
        src: KvFieldArgs,
        /// The field in the destination.
        dst: KvFieldArgs,
        /// The rest.
        params: MoveParams,
    },
}

impl KernelArgs {
    /// The kernel these arguments are for.
    pub fn kernel(&self) -> Kernel {
        match self {
            KernelArgs::Write { .. } => Kernel::WriteKv,
            KernelArgs::Decode { .. } => Kernel::PagedDecode,
            KernelArgs::Reduce { .. } => Kernel::PagedDecodeReduce,
            KernelArgs::Move { .. } => Kernel::MoveBlocks,
        }
    }

    /// The argument block: each parameter's little-endian bytes at its slot
    /// ([`arg_slots`]), zeros between.
    pub fn block(&self) -> Vec<u8> {
        let slots = arg_slots(self.kernel());
        let mut block = Vec::with_capacity(slots.last().map_or(0, |&(at, len)| at + len));
        let mut next = 0;
        let mut put = |write: &dyn Fn(&mut Vec<u8>)| {
            block.resize(slots[next].0, 0);
            write(&mut block);
            next += 1;
        };
        match self {
            KernelArgs::Write { fields, params } => {
                fields.iter().for_each(|f| put(&|o| f.write_le(o)));
                put(&|o| params.write_le(o));
            }
            KernelArgs::Decode { fields, params } => {
                fields.iter().for_each(|f| put(&|o| f.write_le(o)));
                put(&|o| params.write_le(o));
            }
            KernelArgs::Reduce { v, params } => {
                put(&|o| v.write_le(o));
                put(&|o| params.write_le(o));
            }
            KernelArgs::Move { src, dst, params } => {
                put(&|o| src.write_le(o));
                put(&|o| dst.write_le(o));
                put(&|o| params.write_le(o));
            }
        }
        block
    }
}

/// One launch: the configuration and the arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelCall {
    /// Grid, block and dynamic shared memory.
    pub config: LaunchConfig,
    /// The arguments.
    pub args: KernelArgs,
}

/// Where a cache is for the kernels: its layout and the device address of each buffer (0 for
/// a buffer the layout does not have).
#[derive(Debug, Clone, Copy)]
pub struct CacheAddrs<'l> {
    /// The cache's layout.
    pub layout: &'l KvCacheLayout,
    /// Buffer bases.
    pub bases: [u64; 2],
}

/// Kernel arguments of a field the validated layout has.
fn args(layout: &KvCacheLayout, field: Field) -> Result<KvFieldArgs, OpError> {
    layout.kernel_args(field).map_err(OpError::from)
}

/// Arguments of a field a kernel does not touch.
fn unused() -> KvFieldArgs {
    KvFieldArgs {
        base_offset_bytes: 0,
        layer_stride_bytes: 0,
        block_stride_bytes: 0,
        head_stride_bytes: 0,
        slot_stride_bytes: 0,
        dim_chunk_stride_bytes: 0,
        dim_stride_bytes: 0,
        num_layers: 0,
        num_blocks: 0,
        num_heads: 0,
        num_slots: 0,
        width: 0,
        dim_split: 1,
        block_size: 0,
        tokens_per_state: 0,
        buffer: 0,
        dtype: 0,
        elem_bytes: 0,
        field: 0,
        scale: 1.0,
        reserved: 0,
    }
}

/// K, V, k_scale, v_scale of a layout, and whether rows carry inline scales (the scales'
/// arguments are unused without). For MLA the descriptor's K is the whole latent and V its
/// first `kv_lora_rank` elements, so writes (of the latent, as K, with no value) and decodes
/// take the same arguments.
fn kv_args(layout: &KvCacheLayout) -> Result<([KvFieldArgs; 4], bool), OpError> {
    let inline = layout.content().inline_scales();
    let (ks, vs) = if inline {
        (args(layout, Field::KScale)?, args(layout, Field::VScale)?)
    } else {
        (unused(), unused())
    };
    Ok((
        [args(layout, Field::K)?, args(layout, Field::V)?, ks, vs],
        inline,
    ))
}

/// Device addresses of a write's activations and slot mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteAddrs {
    /// `[tokens, heads, k_width]` activations.
    pub key: u64,
    /// `[tokens, heads, v_width]` activations, or 0 (MLA).
    pub value: u64,
    /// `[tokens]` `i64` slots.
    pub slot_mapping: u64,
}

/// The launch of a validated `write_kv` of `tokens` tokens of activations of `act_dtype` into
/// layer `layer` of `cache`; `None` when there is no token.
pub fn write_kv_call(
    target: &GpuTarget,
    cache: &CacheAddrs<'_>,
    shape: &WriteShape,
    tokens: usize,
    layer: u64,
    act_dtype: DType,
    at: &WriteAddrs,
) -> Result<Option<KernelCall>, OpError> {
    let (fields, inline) = kv_args(cache.layout)?;
    // Each row's lanes store 16 bytes where the row is one aligned run, one element elsewhere.
    let lane_bytes = |field: Field| -> Result<u32, OpError> {
        let map = cache.layout.field_map(field).map_err(OpError::from)?;
        Ok(write_lane_bytes(
            &map,
            cache.bases[map.strides.buffer as usize],
        ))
    };
    let k_lane_bytes = lane_bytes(Field::K)?;
    let v_lane_bytes = if at.value == 0 {
        0
    } else {
        lane_bytes(Field::V)?
    };
    let lanes = |f: &KvFieldArgs, lane: u32| row_lanes(f.width as u64, f.elem_bytes as u64, lane);
    let row_lanes = lanes(&fields[0], k_lane_bytes).max(if at.value == 0 {
        0
    } else {
        lanes(&fields[1], v_lane_bytes)
    });
    let Some(config) = write_kv_launch(target, shape, tokens, row_lanes)? else {
        return Ok(None);
    };
    let params = WriteParams {
        key: at.key,
        value: at.value,
        slot_mapping: at.slot_mapping,
        buffers: cache.bases,
        layer: layer as i64,
        act_dtype: act_dtype.abi_code(),
        inline_scales: i32::from(inline),
        k_lane_bytes: k_lane_bytes as i32,
        v_lane_bytes: v_lane_bytes as i32,
    };
    Ok(Some(KernelCall {
        config,
        args: KernelArgs::Write { fields, params },
    }))
}

/// The longest attended length of sequences of `seq_lens` tokens under `params`' window.
pub fn max_attended(seq_lens: &[u32], params: &DecodeParams) -> u64 {
    let window = params.sliding_window.unwrap_or(u64::MAX);
    seq_lens
        .iter()
        .map(|&n| u64::from(n).min(window))
        .max()
        .unwrap_or(0)
}

/// The launches of a validated `paged_decode` of `cache` (see [`paged_decode_launch`], with
/// the row paths of [`decode_rows`]); `None` when there is no sequence.
/// [`DecodeLaunch::partials_len`] says how much f32 scratch [`decode_calls`] needs.
pub fn decode_plan(
    target: &GpuTarget,
    cache: &CacheAddrs<'_>,
    shape: &DecodeShape,
    seq_lens: &[u32],
    params: &DecodeParams,
) -> Result<Option<DecodeLaunch>, OpError> {
    let rows = decode_rows(cache.layout, cache.bases, target)?;
    paged_decode_launch(target, shape, max_attended(seq_lens, params), &rows)
}

/// Device addresses of a decode's inputs, output and scratch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeAddrs {
    /// `[seqs, q_heads, qk_width]` activations.
    pub query: u64,
    /// `[seqs, blocks_per_seq]` `i32` block ids.
    pub block_table: u64,
    /// `[seqs]` `u32` lengths.
    pub seq_lens: u64,
    /// `[seqs, q_heads, v_width]` f32 output.
    pub out: u64,
    /// `partials_len` f32 of scratch, or 0 when the plan has a single pass.
    pub partials: u64,
}

/// What a decode reads besides the cache and its addresses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeSite {
    /// Layer read.
    pub layer: u64,
    /// Row length of the block table.
    pub blocks_per_seq: usize,
    /// Element type of the query.
    pub act_dtype: DType,
    /// Scale, window, soft-cap.
    pub params: DecodeParams,
}

/// The launches of a validated `paged_decode` planned by [`decode_plan`]: the main kernel,
/// then the reduction when there are partitions.
pub fn decode_calls(
    cache: &CacheAddrs<'_>,
    shape: &DecodeShape,
    launch: &DecodeLaunch,
    site: &DecodeSite,
    at: &DecodeAddrs,
) -> Result<Vec<KernelCall>, OpError> {
    let (fields, inline) = kv_args(cache.layout)?;
    let p = &site.params;
    let params = DecodeKernelParams {
        query: at.query,
        block_table: at.block_table,
        seq_lens: at.seq_lens,
        buffers: cache.bases,
        out: at.out,
        partials: if launch.reduce.is_some() {
            at.partials
        } else {
            0
        },
        layer: site.layer as i64,
        blocks_per_seq: site.blocks_per_seq as i64,
        q_heads: shape.q_heads as i64,
        group: shape.group as i64,
        window: p
            .sliding_window
            .map_or(-1, |w| i64::try_from(w).unwrap_or(i64::MAX)),
        partition_tokens: launch.partition_tokens as i64,
        partitions: launch.partitions as i32,
        act_dtype: site.act_dtype.abi_code(),
        inline_scales: i32::from(inline),
        scale: p.scale,
        soft_cap: p.soft_cap.unwrap_or(0.0),
        soft_capped: i32::from(p.soft_cap.is_some()),
        group_tile: launch.group_tile as i32,
        k_vec_bytes: launch.rows.k_vec_bytes as i32,
        v_vec_bytes: launch.rows.v_vec_bytes as i32,
        k_token_lanes: launch.rows.k_token_lanes as i32,
        v_token_major: i32::from(launch.rows.v_token_major),
        reserved: 0,
    };
    let mut calls = vec![KernelCall {
        config: launch.main,
        args: KernelArgs::Decode { fields, params },
    }];
    if let Some(config) = launch.reduce {
        calls.push(KernelCall {
            config,
            args: KernelArgs::Reduce {
                v: fields[1],
                params,
            },
        });
    }
    Ok(calls)
}

/// The pairs array of `m` as the mover reads it: `[n][2]` `i64` (source, destination).
pub fn move_pairs(m: &Moves) -> Vec<i64> {
    m.pairs
        .iter()
        .flat_map(|&(s, d)| [s as i64, d as i64])
        .collect()
}

/// The launches of validated moves `m` from `src` to `dst`, one per stored field, reading the
/// [`move_pairs`] array at device address `pairs`.
pub fn move_calls(
    target: &GpuTarget,
    src: &CacheAddrs<'_>,
    dst: &CacheAddrs<'_>,
    m: &Moves,
    pairs: u64,
) -> Result<Vec<KernelCall>, OpError> {
    let heads = m.heads.end - m.heads.start;
    let mut calls = Vec::new();
    for f in src.layout.stored_fields() {
        let g = dst.layout.field_map(f.field).map_err(OpError::from)?;
        let Some(config) = move_launch(target, f, heads, m.pairs.len())? else {
            continue;
        };
        let params = MoveParams {
            src_buffers: src.bases,
            dst_buffers: dst.bases,
            pairs,
            n_pairs: m.pairs.len() as i64,
            head0: m.heads.start as i64,
            heads: heads as i64,
            dst_head0: m.dst_head0 as i64,
            row_unit_bytes: row_unit_bytes(
                f,
                &g,
                src.bases[f.strides.buffer as usize],
                dst.bases[g.strides.buffer as usize],
            ) as i32,
            reserved: 0,
        };
        calls.push(KernelCall {
            config,
            args: KernelArgs::Move {
                src: args(src.layout, f.field)?,
                dst: args(dst.layout, f.field)?,
                params,
            },
        });
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_and_in_order() {
        assert_eq!(
            arg_slots(Kernel::WriteKv),
            vec![(0, 144), (144, 144), (288, 144), (432, 144), (576, 64)]
        );
        assert_eq!(
            arg_slots(Kernel::PagedDecodeReduce),
            vec![(0, 144), (144, 152)]
        );
        assert_eq!(
            arg_slots(Kernel::MoveBlocks),
            vec![(0, 144), (144, 144), (288, 80)]
        );
    }

    #[test]
    fn blocks_carry_each_member_at_its_offset() {
        let layout: KvCacheLayout = "kv B=4 N=16 H=4 D=8 dtype=f16 order=HND".parse().unwrap();
        let m = kvlayout::ops::BlockMove::Copy(&[(0, 2), (1, 3)])
            .plan(None, &layout)
            .unwrap();
        let cache = CacheAddrs {
            layout: &layout,
            bases: [0x1000, 0],
        };
        let calls = move_calls(&GpuTarget::CUDA, &cache, &cache, &m, 0xabc0).unwrap();
        assert_eq!(calls.len(), layout.stored_fields().len());
        let block = calls[0].args.block();
        assert_eq!(block.len(), 288 + 80);
        let k = layout.kernel_args(layout.stored_fields()[0].field).unwrap();
        let i64_at = |o: usize| i64::from_le_bytes(block[o..o + 8].try_into().unwrap());
        assert_eq!(i64_at(16), k.block_stride_bytes);
        assert_eq!(i64_at(144 + 24), k.head_stride_bytes);
        // kvl_move_params: src_buffers[0] at 0, pairs at 32, n_pairs at 40.
        assert_eq!(i64_at(288), 0x1000);
        assert_eq!(i64_at(288 + 32), 0xabc0);
        assert_eq!(i64_at(288 + 40), 2);
    }
}
