//! The ops of the contract on host memory, each a launch (or a few) of the emulated kernels:
//! arguments validated by the contract's checks, field arguments and launch configuration
//! from the descriptor.

use std::ops::Range;

use kvlayout::kernels::{
    move_launch, paged_decode_launch, row_unit_bytes, write_kv_launch, DecodeKernelParams,
    GpuTarget, LaunchConfig, MoveParams, WriteParams,
};
use kvlayout::ops::{
    check_decode, check_write, convert_moves, copy_moves, gather_moves, scatter_moves, swap_moves,
    Moves, OpError,
};
use kvlayout::{Content, Field, KvCacheLayout, KvFieldArgs};
use kvlayout_cpu::{Activations, CacheMut, CacheRef, Decode, HostOps, WriteKv};

use crate::ffi::{Call, EmuLaunch, Kernels, Region, CUDA, HIP};

/// The emulated kernels of one build (CUDA or HIP sources), as host ops.
#[derive(Debug, Clone, Copy)]
pub struct EmuOps {
    kernels: Kernels,
    target: GpuTarget,
    seed: u64,
}

impl EmuOps {
    /// The CUDA build: warps of 32, CUDA's shared-memory limit.
    pub fn cuda() -> Self {
        EmuOps {
            kernels: CUDA,
            target: GpuTarget::CUDA,
            seed: 0,
        }
    }

    /// The HIP build: wavefronts of 64 (CDNA), its LDS limit.
    pub fn hip() -> Self {
        EmuOps {
            kernels: HIP,
            target: GpuTarget::CDNA,
            seed: 0,
        }
    }

    /// Deliberately broken CUDA build `n` of `kernels-cuda/src/kvl_plant.cuh`, for tests.
    ///
    /// # Panics
    /// When `n` is not 1 to 6.
    #[cfg(feature = "planted-bugs")]
    pub fn planted(n: usize) -> Self {
        EmuOps {
            kernels: crate::ffi::planted::PLANTS[n - 1],
            ..EmuOps::cuda()
        }
    }

    /// The same kernels with the fibers of each block resumed in the order `seed` picks (0:
    /// thread order).
    pub fn with_seed(self, seed: u64) -> Self {
        EmuOps { seed, ..self }
    }

    /// The target the launches are configured for.
    pub fn target(&self) -> &GpuTarget {
        &self.target
    }

    /// The warp width the kernels were compiled with.
    pub fn warp_size(&self) -> u32 {
        self.kernels.warp_size()
    }

    fn run(&self, cfg: &LaunchConfig, regions: &[Region], call: Call<'_>) -> Result<(), OpError> {
        let kernel = call.kernel();
        let fail = |detail| OpError::Kernel { kernel, detail };
        let launch =
            EmuLaunch::new(cfg, self.target.shared_bytes, self.seed, regions).map_err(fail)?;
        self.kernels.run(&launch, call).map_err(fail)
    }
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
    let inline = matches!(layout.content(), Content::KvScaled { .. });
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

fn address(a: &Activations<'_>) -> u64 {
    match a {
        Activations::F32(x) => x.as_ptr() as u64,
        Activations::F16(x) => x.as_ptr() as u64,
        Activations::Bf16(x) => x.as_ptr() as u64,
    }
}

/// A cache's memory as a kernel sees it: the regions it may touch and the buffers' bases.
#[derive(Debug, Clone)]
struct Mem<'l> {
    layout: &'l KvCacheLayout,
    regions: Vec<Region>,
    bases: [u64; 2],
}

impl<'l> Mem<'l> {
    fn new(layout: &'l KvCacheLayout, regions: Vec<Region>) -> Self {
        let mut bases = [0u64; 2];
        for (b, r) in bases.iter_mut().zip(&regions) {
            *b = r.base;
        }
        Mem {
            layout,
            regions,
            bases,
        }
    }

    /// A cache to read.
    fn read(cache: &CacheRef<'l>) -> Self {
        Mem::new(
            cache.layout(),
            cache.buffers().iter().map(|b| Region::of(b)).collect(),
        )
    }

    /// A cache to write (its addresses taken from the mutable buffers).
    fn write(cache: &mut CacheMut<'l>) -> Self {
        let layout = cache.layout();
        let regions = cache
            .buffers_mut()
            .iter_mut()
            .map(|b| Region::of_mut(b))
            .collect();
        Mem::new(layout, regions)
    }
}

impl EmuOps {
    /// Every stored field of `m` from `src` to `dst`, one launch per field.
    fn move_fields(&self, src: &Mem<'_>, dst: &Mem<'_>, m: &Moves) -> Result<(), OpError> {
        let pairs: Vec<i64> = m
            .pairs
            .iter()
            .flat_map(|&(s, d)| [s as i64, d as i64])
            .collect();
        let heads = m.heads.end - m.heads.start;
        let regions: Vec<Region> = src.regions.iter().chain(&dst.regions).copied().collect();
        for f in src.layout.stored_fields() {
            let g = dst.layout.field_map(f.field).map_err(OpError::from)?;
            let Some(cfg) = move_launch(&self.target, f, heads, m.pairs.len())? else {
                continue;
            };
            let (sa, da) = (args(src.layout, f.field)?, args(dst.layout, f.field)?);
            let p = MoveParams {
                src_buffers: src.bases,
                dst_buffers: dst.bases,
                pairs: pairs.as_ptr() as u64,
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
            self.run(&cfg, &regions, Call::Move(&sa, &da, &p))?;
        }
        Ok(())
    }
}

impl HostOps for EmuOps {
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError> {
        let layout = cache.layout();
        let shape = check_write(layout, w)?;
        let Some(cfg) = write_kv_launch(&self.target, &shape, w.slot_mapping.len())? else {
            return Ok(());
        };
        let (fields, inline) = kv_args(layout)?;
        let mem = Mem::write(cache);
        let p = WriteParams {
            key: address(&w.key),
            value: w.value.as_ref().map_or(0, address),
            slot_mapping: w.slot_mapping.as_ptr() as u64,
            buffers: mem.bases,
            layer: w.layer as i64,
            act_dtype: w.key.dtype().abi_code(),
            inline_scales: i32::from(inline),
        };
        self.run(&cfg, &mem.regions, Call::Write(&fields, &p))
    }

    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError> {
        let layout = cache.layout();
        let shape = check_decode(layout, d, out.len())?;
        let window = d.params.sliding_window.unwrap_or(u64::MAX);
        let max_attended = d
            .seq_lens
            .iter()
            .map(|&n| u64::from(n).min(window))
            .max()
            .unwrap_or(0);
        let Some(launch) = paged_decode_launch(&self.target, &shape, max_attended)? else {
            return Ok(());
        };
        let (fields, inline) = kv_args(layout)?;
        let mut partials = vec![0f32; launch.partials_len(&shape)];
        let mem = Mem::read(cache);
        let mut regions = mem.regions.clone();
        regions.push(Region::of(d.block_table));
        let p = DecodeKernelParams {
            query: address(&d.query),
            block_table: d.block_table.as_ptr() as u64,
            seq_lens: d.seq_lens.as_ptr() as u64,
            buffers: mem.bases,
            out: out.as_mut_ptr() as u64,
            partials: if partials.is_empty() {
                0
            } else {
                partials.as_mut_ptr() as u64
            },
            layer: d.layer as i64,
            blocks_per_seq: d.blocks_per_seq as i64,
            q_heads: shape.q_heads as i64,
            group: shape.group as i64,
            window: d
                .params
                .sliding_window
                .map_or(-1, |w| i64::try_from(w).unwrap_or(i64::MAX)),
            partition_tokens: launch.partition_tokens as i64,
            partitions: launch.partitions as i32,
            act_dtype: d.query.dtype().abi_code(),
            inline_scales: i32::from(inline),
            scale: d.params.scale,
            soft_cap: d.params.soft_cap.unwrap_or(0.0),
            soft_capped: i32::from(d.params.soft_cap.is_some()),
            group_tile: launch.group_tile as i32,
            reserved: 0,
        };
        self.run(&launch.main, &regions, Call::Decode(&fields, &p))?;
        if let Some(reduce) = launch.reduce {
            self.run(&reduce, &regions, Call::Reduce(&fields[1], &p))?;
        }
        Ok(())
    }

    fn copy_blocks(&self, cache: &mut CacheMut<'_>, pairs: &[(u64, u64)]) -> Result<(), OpError> {
        let m = copy_moves(cache.layout(), pairs)?;
        // Sources and destinations are distinct blocks (checked): the kernel reads and writes
        // the same buffers at disjoint bytes.
        let mem = Mem::write(cache);
        self.move_fields(&mem, &mem, &m)
    }

    fn swap_blocks(
        &self,
        src: &CacheRef<'_>,
        dst: &mut CacheMut<'_>,
        pairs: &[(u64, u64)],
    ) -> Result<(), OpError> {
        let m = swap_moves(src.layout(), dst.layout(), pairs)?;
        self.move_fields(&Mem::read(src), &Mem::write(dst), &m)
    }

    fn gather_blocks(
        &self,
        cache: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        let m = gather_moves(cache.layout(), staging.layout(), blocks, heads)?;
        self.move_fields(&Mem::read(cache), &Mem::write(staging), &m)
    }

    fn scatter_blocks(
        &self,
        staging: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        let m = scatter_moves(staging.layout(), cache.layout(), blocks, heads)?;
        self.move_fields(&Mem::read(staging), &Mem::write(cache), &m)
    }

    fn convert(&self, src: &CacheRef<'_>, dst: &mut CacheMut<'_>) -> Result<(), OpError> {
        let m = convert_moves(src.layout(), dst.layout())?;
        self.move_fields(&Mem::read(src), &Mem::write(dst), &m)
    }
}
