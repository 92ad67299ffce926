//! The ops of the contract on host memory, each a launch (or a few) of the emulated kernels:
//! arguments validated by the contract's checks, the launches and their argument blocks from
//! `kvlayout::kernels::calls`.

use std::ops::Range;

use kvlayout::kernels::{
    decode_calls, decode_plan, move_calls, move_pairs, write_kv_call, CacheAddrs, DecodeAddrs,
    DecodeSite, GpuTarget, KernelCall, WriteAddrs,
};
use kvlayout::ops::{
    check_decode, check_write, convert_moves, copy_moves, gather_moves, scatter_moves, swap_moves,
    Moves, OpError,
};
use kvlayout::KvCacheLayout;
use kvlayout_cpu::{Activations, CacheMut, CacheRef, Decode, HostOps, WriteKv};

use crate::ffi::{EmuLaunch, Kernels, Region, CUDA, HIP};

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

    /// Runs `call` with its cache accesses confined to `regions`; `Err` is the emulator's
    /// report.
    pub(crate) fn run(&self, call: &KernelCall, regions: &[Region]) -> Result<(), String> {
        let launch = EmuLaunch::new(&call.config, self.target.shared_bytes, self.seed, regions)?;
        self.kernels
            .run(&launch, call.args.kernel(), &call.args.block())
    }

    fn run_all(&self, calls: &[KernelCall], regions: &[Region]) -> Result<(), OpError> {
        calls.iter().try_for_each(|c| {
            self.run(c, regions).map_err(|detail| OpError::Kernel {
                kernel: c.args.kernel().name(),
                detail,
            })
        })
    }
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

    fn addrs(&self) -> CacheAddrs<'l> {
        CacheAddrs {
            layout: self.layout,
            bases: self.bases,
        }
    }
}

impl EmuOps {
    /// Every stored field of `m` from `src` to `dst`, one launch per field.
    fn move_fields(&self, src: &Mem<'_>, dst: &Mem<'_>, m: &Moves) -> Result<(), OpError> {
        let pairs = move_pairs(m);
        let regions: Vec<Region> = src.regions.iter().chain(&dst.regions).copied().collect();
        let calls = move_calls(
            &self.target,
            &src.addrs(),
            &dst.addrs(),
            m,
            pairs.as_ptr() as u64,
        )?;
        self.run_all(&calls, &regions)
    }
}

impl HostOps for EmuOps {
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError> {
        let shape = check_write(cache.layout(), w)?;
        let mem = Mem::write(cache);
        let at = WriteAddrs {
            key: address(&w.key),
            value: w.value.as_ref().map_or(0, address),
            slot_mapping: w.slot_mapping.as_ptr() as u64,
        };
        let call = write_kv_call(
            &self.target,
            &mem.addrs(),
            &shape,
            w.slot_mapping.len(),
            w.layer,
            w.key.dtype(),
            &at,
        )?;
        self.run_all(call.as_slice(), &mem.regions)
    }

    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError> {
        let shape = check_decode(cache.layout(), d, out.len())?;
        let Some(launch) = decode_plan(&self.target, &shape, d.seq_lens, &d.params)? else {
            return Ok(());
        };
        let mut partials = vec![0f32; launch.partials_len(&shape)];
        let mem = Mem::read(cache);
        let mut regions = mem.regions.clone();
        regions.push(Region::of(d.block_table));
        let at = DecodeAddrs {
            query: address(&d.query),
            block_table: d.block_table.as_ptr() as u64,
            seq_lens: d.seq_lens.as_ptr() as u64,
            out: out.as_mut_ptr() as u64,
            partials: partials.as_mut_ptr() as u64,
        };
        let site = DecodeSite {
            layer: d.layer,
            blocks_per_seq: d.blocks_per_seq,
            act_dtype: d.query.dtype(),
            params: d.params,
        };
        let calls = decode_calls(&mem.addrs(), &shape, &launch, &site, &at)?;
        self.run_all(&calls, &regions)
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
