//! The backend interface the conformance suite drives, shaped for device backends.
//!
//! What a device backend needs, and what this trait therefore models:
//!
//! * **Device memory.** A cache is an associated type ([`Backend::Cache`]): a layout plus one
//!   allocation per layout buffer, in backend memory. The suite only ever sees bytes through
//!   [`Backend::upload_cache`] / [`Backend::download_cache`]. Allocation takes the length
//!   and misalignment of each buffer ([`BufferShape`]), so the suite can hand a backend a
//!   buffer shorter than the registered span or not aligned for its elements and check that
//!   every op refuses it (as a device backend must refuse a framework tensor that is too
//!   small).
//! * **Activations in device memory.** Keys, values, queries and the decode output are
//!   [`Backend::Tensor`]s, uploaded from / downloaded to a [`HostTensor`].
//! * **Index metadata on the host.** Slot mappings, block tables, sequence lengths and block
//!   pairs are host slices: the contract (`kvlayout::ops`) has every backend validate them
//!   before anything is written, which a device backend does on the host copy the scheduler
//!   has anyway, before it copies them to the device itself.
//! * **Asynchronous completion.** Every op is enqueued on the backend's stream and returns a
//!   [`Backend::Completion`] (an event) to [`Backend::wait`] on; [`Backend::synchronize`]
//!   waits for everything enqueued. A refused op returns its typed [`OpError`] at enqueue
//!   time, having enqueued nothing. Downloads are ordered after the work enqueued before them
//!   (as a blocking copy on the same stream is).
//!
//! Implementations here: the CPU backend ([`Host`] over [`CpuBackend`]) and the scalar
//! reference itself ([`Host`] over [`ScalarReference`]), both on host memory with trivially
//! ready completions. `cuda`, `hip` and `host-emulator` are listed as [`NotBuilt`]: their
//! [`Backend::available`] says why, and the suite prints `skipped: <name>: <reason>`.

use std::ops::Range;

use half::{bf16, f16};
use kvlayout::ops::{DecodeParams, OpError};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_cpu::{
    reference, Activations, CacheMut, CacheRef, CpuBackend, Decode, PrefetchLevel, WriteKv,
};

/// A dense row-major activation tensor on the host (the source or result of a transfer).
#[derive(Debug, Clone, PartialEq)]
pub enum HostTensor {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    Bf16(Vec<bf16>),
}

impl HostTensor {
    /// `values` rounded to `dtype` (f32, f16 or bf16).
    pub fn from_f32(dtype: DType, values: &[f32]) -> Self {
        match dtype {
            DType::F16 => HostTensor::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::Bf16 => HostTensor::Bf16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::F32 => HostTensor::F32(values.to_vec()),
            other => panic!("activations are f32, f16 or bf16, not {other}"),
        }
    }

    /// `len` zeros of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Self {
        HostTensor::from_f32(dtype, &vec![0.0; len])
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostTensor::F32(_) => DType::F32,
            HostTensor::F16(_) => DType::F16,
            HostTensor::Bf16(_) => DType::Bf16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostTensor::F32(x) => x.len(),
            HostTensor::F16(x) => x.len(),
            HostTensor::Bf16(x) => x.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element as f32 (exact: f16 and bf16 widen without rounding).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            HostTensor::F32(x) => x.clone(),
            HostTensor::F16(x) => x.iter().map(|v| v.to_f32()).collect(),
            HostTensor::Bf16(x) => x.iter().map(|v| v.to_f32()).collect(),
        }
    }

    /// The tensor as the CPU crate's activations.
    pub fn as_activations(&self) -> Activations<'_> {
        match self {
            HostTensor::F32(x) => Activations::F32(x),
            HostTensor::F16(x) => Activations::F16(x),
            HostTensor::Bf16(x) => Activations::Bf16(x),
        }
    }
}

/// How to allocate one buffer of a cache: its length in bytes and how many bytes its start
/// is past an aligned address. [`BufferShape::exact`] is what a well-formed cache gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferShape {
    /// Bytes.
    pub len: u64,
    /// Start address modulo the allocator's alignment (0 = aligned).
    pub misalign: u64,
}

impl BufferShape {
    /// Each buffer exactly as long as its registered span's end, aligned.
    pub fn exact(layout: &KvCacheLayout) -> Vec<BufferShape> {
        layout
            .extents()
            .iter()
            .map(|x| BufferShape {
                len: x.end,
                misalign: 0,
            })
            .collect()
    }
}

/// `write_kv` arguments with activations in backend memory.
#[derive(Debug)]
pub struct WriteArgs<'a, T> {
    /// Layer slot to write.
    pub layer: u64,
    /// `[tokens, heads, head_size]` (MLA: `[tokens, 1, rank + rope]`).
    pub key: &'a T,
    /// `[tokens, heads, head_size_v]`; `None` for MLA.
    pub value: Option<&'a T>,
    /// One slot per token; negative = padding, skipped.
    pub slot_mapping: &'a [i64],
}

/// `paged_decode` arguments with the query in backend memory.
#[derive(Debug)]
pub struct DecodeArgs<'a, T> {
    /// Layer slot to read.
    pub layer: u64,
    /// `[seqs, num_q_heads, qk_width]`.
    pub query: &'a T,
    /// `[seqs, blocks_per_seq]` block ids, row-major.
    pub block_table: &'a [i32],
    /// Row length of the block table.
    pub blocks_per_seq: usize,
    /// Tokens per sequence.
    pub seq_lens: &'a [u32],
    /// Scale, window, soft-cap, query heads.
    pub params: DecodeParams,
}

/// What every backend offers the suite. Ops return at enqueue time: `Err` (nothing enqueued,
/// nothing written) or a completion to wait on.
pub trait Backend {
    /// A cache in backend memory: a layout and one allocation per layout buffer.
    type Cache;
    /// A dense activation tensor in backend memory.
    type Tensor;
    /// Enqueued work (an event on the backend's stream).
    type Completion;

    /// Name in reports.
    fn name(&self) -> &str;
    /// `Ok` when the backend can run here; otherwise why not (the suite reports it skipped).
    fn available(&self) -> Result<(), String>;

    /// Allocates a cache of `layout` with one buffer per shape (contents unspecified).
    fn alloc_cache(
        &self,
        layout: &KvCacheLayout,
        shapes: &[BufferShape],
    ) -> Result<Self::Cache, String>;
    /// Copies host bytes into the cache's buffers (one vector per buffer, of its length).
    fn upload_cache(&self, cache: &mut Self::Cache, bytes: &[Vec<u8>]) -> Result<(), String>;
    /// Copies the cache's buffers to the host, after the work enqueued before.
    fn download_cache(&self, cache: &Self::Cache) -> Result<Vec<Vec<u8>>, String>;
    /// Copies a host tensor to backend memory.
    fn upload_tensor(&self, t: &HostTensor) -> Result<Self::Tensor, String>;
    /// Allocates a tensor of `len` elements of `dtype` (contents unspecified).
    fn alloc_tensor(&self, dtype: DType, len: usize) -> Result<Self::Tensor, String>;
    /// Copies a tensor to the host, after the work enqueued before.
    fn download_tensor(&self, t: &Self::Tensor) -> Result<HostTensor, String>;

    /// Enqueues `write_kv`.
    fn write_kv(
        &self,
        cache: &mut Self::Cache,
        w: &WriteArgs<'_, Self::Tensor>,
    ) -> Result<Self::Completion, OpError>;
    /// Enqueues `paged_decode` into `out` (f32, `[seqs, num_q_heads, v_width]`).
    fn paged_decode(
        &self,
        cache: &Self::Cache,
        d: &DecodeArgs<'_, Self::Tensor>,
        out: &mut Self::Tensor,
    ) -> Result<Self::Completion, OpError>;
    /// Enqueues `copy_blocks` (all layers, `src -> dst` pairs within one cache).
    fn copy_blocks(
        &self,
        cache: &mut Self::Cache,
        pairs: &[(u64, u64)],
    ) -> Result<Self::Completion, OpError>;
    /// Enqueues `swap_blocks` between two caches of the same content (layouts may differ).
    fn swap_blocks(
        &self,
        src: &Self::Cache,
        dst: &mut Self::Cache,
        pairs: &[(u64, u64)],
    ) -> Result<Self::Completion, OpError>;
    /// Enqueues `gather_blocks`: cache block `blocks[i]`, heads `heads` -> staging block `i`.
    fn gather_blocks(
        &self,
        cache: &Self::Cache,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut Self::Cache,
    ) -> Result<Self::Completion, OpError>;
    /// Enqueues `scatter_blocks`, the inverse of `gather_blocks`.
    fn scatter_blocks(
        &self,
        staging: &Self::Cache,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut Self::Cache,
    ) -> Result<Self::Completion, OpError>;
    /// Enqueues `convert` (whole cache, layout A -> layout B).
    fn convert(
        &self,
        src: &Self::Cache,
        dst: &mut Self::Cache,
    ) -> Result<Self::Completion, OpError>;

    /// Waits for one op; `Err` is an asynchronous failure of the device.
    fn wait(&self, c: Self::Completion) -> Result<(), String>;
    /// Waits for everything enqueued.
    fn synchronize(&self) -> Result<(), String>;
}

/// The ops of a backend on host memory, in the CPU crate's argument types.
pub trait HostOps {
    /// `write_kv`.
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError>;
    /// `paged_decode`.
    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError>;
    /// `copy_blocks`.
    fn copy_blocks(&self, cache: &mut CacheMut<'_>, pairs: &[(u64, u64)]) -> Result<(), OpError>;
    /// `swap_blocks`.
    fn swap_blocks(
        &self,
        src: &CacheRef<'_>,
        dst: &mut CacheMut<'_>,
        pairs: &[(u64, u64)],
    ) -> Result<(), OpError>;
    /// `gather_blocks`.
    fn gather_blocks(
        &self,
        cache: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut CacheMut<'_>,
    ) -> Result<(), OpError>;
    /// `scatter_blocks`.
    fn scatter_blocks(
        &self,
        staging: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut CacheMut<'_>,
    ) -> Result<(), OpError>;
    /// `convert`.
    fn convert(&self, src: &CacheRef<'_>, dst: &mut CacheMut<'_>) -> Result<(), OpError>;
}

impl HostOps for CpuBackend {
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError> {
        CpuBackend::write_kv(self, cache, w)
    }
    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError> {
        CpuBackend::paged_decode(self, cache, d, out)
    }
    fn copy_blocks(&self, cache: &mut CacheMut<'_>, pairs: &[(u64, u64)]) -> Result<(), OpError> {
        CpuBackend::copy_blocks(self, cache, pairs)
    }
    fn swap_blocks(
        &self,
        src: &CacheRef<'_>,
        dst: &mut CacheMut<'_>,
        pairs: &[(u64, u64)],
    ) -> Result<(), OpError> {
        CpuBackend::swap_blocks(self, src, dst, pairs)
    }
    fn gather_blocks(
        &self,
        cache: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        CpuBackend::gather_blocks(self, cache, blocks, heads, staging)
    }
    fn scatter_blocks(
        &self,
        staging: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        CpuBackend::scatter_blocks(self, staging, blocks, heads, cache)
    }
    fn convert(&self, src: &CacheRef<'_>, dst: &mut CacheMut<'_>) -> Result<(), OpError> {
        CpuBackend::convert(self, src, dst)
    }
}

/// The scalar reference (`kvlayout_cpu::reference`): the oracle, and a backend of its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScalarReference;

impl HostOps for ScalarReference {
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError> {
        reference::write_kv(cache, w)
    }
    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError> {
        reference::paged_decode(cache, d, out)
    }
    fn copy_blocks(&self, cache: &mut CacheMut<'_>, pairs: &[(u64, u64)]) -> Result<(), OpError> {
        reference::copy_blocks(cache, pairs)
    }
    fn swap_blocks(
        &self,
        src: &CacheRef<'_>,
        dst: &mut CacheMut<'_>,
        pairs: &[(u64, u64)],
    ) -> Result<(), OpError> {
        reference::swap_blocks(src, dst, pairs)
    }
    fn gather_blocks(
        &self,
        cache: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        reference::gather_blocks(cache, blocks, heads, staging)
    }
    fn scatter_blocks(
        &self,
        staging: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        reference::scatter_blocks(staging, blocks, heads, cache)
    }
    fn convert(&self, src: &CacheRef<'_>, dst: &mut CacheMut<'_>) -> Result<(), OpError> {
        reference::convert(src, dst)
    }
}

/// 64 bytes, 64-byte aligned (a cache line, as device allocations are at least this aligned).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Line([u8; 64]);

/// One host allocation: 64-byte aligned storage, viewed from `start` for `len` bytes (a
/// non-zero `start` makes a misaligned buffer).
#[derive(Debug, Clone)]
pub struct HostMem {
    lines: Vec<Line>,
    start: usize,
    len: usize,
}

impl HostMem {
    fn new(shape: BufferShape) -> Result<Self, String> {
        let len = usize::try_from(shape.len).map_err(|_| "buffer too large".to_string())?;
        let start = usize::try_from(shape.misalign % 64).expect("< 64");
        Ok(HostMem {
            lines: vec![Line([0; 64]); (start + len).div_ceil(64)],
            start,
            len,
        })
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.lines)[self.start..self.start + self.len]
    }

    /// The bytes, mutable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[self.start..self.start + self.len]
    }
}

/// A cache in host memory: a layout and its buffers, as allocated (possibly malformed: the
/// ops check them, as a device backend checks the device pointers it is handed).
#[derive(Debug, Clone)]
pub struct HostBuffers {
    layout: KvCacheLayout,
    mems: Vec<HostMem>,
}

impl HostBuffers {
    /// The layout.
    pub fn layout(&self) -> &KvCacheLayout {
        &self.layout
    }

    fn as_ref(&self) -> Result<CacheRef<'_>, OpError> {
        CacheRef::new(&self.layout, self.mems.iter().map(HostMem::bytes).collect())
    }

    fn as_mut(&mut self) -> Result<CacheMut<'_>, OpError> {
        CacheMut::new(
            &self.layout,
            self.mems.iter_mut().map(HostMem::bytes_mut).collect(),
        )
    }
}

/// A completion that is ready when returned (host ops run synchronously).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready;

/// A backend on host memory: the CPU backend or the scalar reference.
#[derive(Debug)]
pub struct Host<O> {
    name: &'static str,
    ops: O,
}

impl Host<CpuBackend> {
    /// The CPU backend on a pool of `threads` threads (`None`: one per core).
    pub fn cpu(name: &'static str, threads: Option<usize>) -> Self {
        Host {
            name,
            ops: CpuBackend::new(threads),
        }
    }

    /// The CPU backend forced to every other kernel build this machine runs than the one it
    /// picks (`cpu/avx2`, `cpu/scalar`, ...), so that each build meets every case; and the
    /// build it picks with its tiles and moves arranged for the other prefetch level than
    /// this machine's (`cpu/avx512/prefetch-L2`, ...), so both arrangements run on any machine.
    pub fn cpu_builds(threads: Option<usize>) -> Vec<Self> {
        // A handful of names, built once per suite.
        let name = |n: String| -> &'static str { Box::leak(n.into_boxed_str()) };
        let builds = CpuBackend::kernel_builds();
        let mut hosts: Vec<Self> = builds
            .iter()
            .skip(1)
            .map(|build| Host {
                name: name(format!("cpu/{build}")),
                ops: CpuBackend::with_kernels(threads, build).expect("a build this machine runs"),
            })
            .collect();
        let first =
            CpuBackend::with_kernels(threads, builds[0]).expect("a build this machine runs");
        let other = match first.prefetch_level() {
            PrefetchLevel::L1 => PrefetchLevel::L2,
            PrefetchLevel::L2 => PrefetchLevel::L1,
        };
        hosts.push(Host {
            name: name(format!("cpu/{}/prefetch-{other:?}", builds[0])),
            ops: first.with_prefetch_level(other),
        });
        hosts
    }
}

impl Host<ScalarReference> {
    /// The scalar reference as a backend.
    pub fn reference() -> Self {
        Host {
            name: "reference",
            ops: ScalarReference,
        }
    }
}

fn f32_out(t: &mut HostTensor) -> Result<&mut [f32], OpError> {
    match t {
        HostTensor::F32(x) => Ok(x),
        other => Err(OpError::Shape {
            what: "output dtype".into(),
            expected: "f32".into(),
            got: other.dtype().to_string(),
        }),
    }
}

impl<O: HostOps> Backend for Host<O> {
    type Cache = HostBuffers;
    type Tensor = HostTensor;
    type Completion = Ready;

    fn name(&self) -> &str {
        self.name
    }

    fn available(&self) -> Result<(), String> {
        Ok(())
    }

    fn alloc_cache(
        &self,
        layout: &KvCacheLayout,
        shapes: &[BufferShape],
    ) -> Result<HostBuffers, String> {
        Ok(HostBuffers {
            layout: layout.clone(),
            mems: shapes
                .iter()
                .map(|s| HostMem::new(*s))
                .collect::<Result<_, _>>()?,
        })
    }

    fn upload_cache(&self, cache: &mut HostBuffers, bytes: &[Vec<u8>]) -> Result<(), String> {
        if bytes.len() != cache.mems.len() {
            return Err(format!(
                "{} byte vectors for {} buffers",
                bytes.len(),
                cache.mems.len()
            ));
        }
        for (i, (m, b)) in cache.mems.iter_mut().zip(bytes).enumerate() {
            if b.len() != m.len {
                return Err(format!(
                    "buffer {i}: {} bytes uploaded into {}",
                    b.len(),
                    m.len
                ));
            }
            m.bytes_mut().copy_from_slice(b);
        }
        Ok(())
    }

    fn download_cache(&self, cache: &HostBuffers) -> Result<Vec<Vec<u8>>, String> {
        Ok(cache.mems.iter().map(|m| m.bytes().to_vec()).collect())
    }

    fn upload_tensor(&self, t: &HostTensor) -> Result<HostTensor, String> {
        Ok(t.clone())
    }

    fn alloc_tensor(&self, dtype: DType, len: usize) -> Result<HostTensor, String> {
        match dtype {
            DType::F32 => Ok(HostTensor::F32(vec![f32::NAN; len])),
            DType::F16 | DType::Bf16 => Ok(HostTensor::zeros(dtype, len)),
            other => Err(format!("no {other} activation tensors")),
        }
    }

    fn download_tensor(&self, t: &HostTensor) -> Result<HostTensor, String> {
        Ok(t.clone())
    }

    fn write_kv(
        &self,
        cache: &mut HostBuffers,
        w: &WriteArgs<'_, HostTensor>,
    ) -> Result<Ready, OpError> {
        let args = WriteKv {
            layer: w.layer,
            key: w.key.as_activations(),
            value: w.value.map(HostTensor::as_activations),
            slot_mapping: w.slot_mapping,
        };
        self.ops
            .write_kv(&mut cache.as_mut()?, &args)
            .map(|()| Ready)
    }

    fn paged_decode(
        &self,
        cache: &HostBuffers,
        d: &DecodeArgs<'_, HostTensor>,
        out: &mut HostTensor,
    ) -> Result<Ready, OpError> {
        let args = Decode {
            layer: d.layer,
            query: d.query.as_activations(),
            block_table: d.block_table,
            blocks_per_seq: d.blocks_per_seq,
            seq_lens: d.seq_lens,
            params: d.params,
        };
        self.ops
            .paged_decode(&cache.as_ref()?, &args, f32_out(out)?)
            .map(|()| Ready)
    }

    fn copy_blocks(&self, cache: &mut HostBuffers, pairs: &[(u64, u64)]) -> Result<Ready, OpError> {
        self.ops
            .copy_blocks(&mut cache.as_mut()?, pairs)
            .map(|()| Ready)
    }

    fn swap_blocks(
        &self,
        src: &HostBuffers,
        dst: &mut HostBuffers,
        pairs: &[(u64, u64)],
    ) -> Result<Ready, OpError> {
        self.ops
            .swap_blocks(&src.as_ref()?, &mut dst.as_mut()?, pairs)
            .map(|()| Ready)
    }

    fn gather_blocks(
        &self,
        cache: &HostBuffers,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut HostBuffers,
    ) -> Result<Ready, OpError> {
        self.ops
            .gather_blocks(&cache.as_ref()?, blocks, heads, &mut staging.as_mut()?)
            .map(|()| Ready)
    }

    fn scatter_blocks(
        &self,
        staging: &HostBuffers,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut HostBuffers,
    ) -> Result<Ready, OpError> {
        self.ops
            .scatter_blocks(&staging.as_ref()?, blocks, heads, &mut cache.as_mut()?)
            .map(|()| Ready)
    }

    fn convert(&self, src: &HostBuffers, dst: &mut HostBuffers) -> Result<Ready, OpError> {
        self.ops
            .convert(&src.as_ref()?, &mut dst.as_mut()?)
            .map(|()| Ready)
    }

    fn wait(&self, _: Ready) -> Result<(), String> {
        Ok(())
    }

    fn synchronize(&self) -> Result<(), String> {
        Ok(())
    }
}

/// No value: the memory and completions of a backend that is not built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Never {}

/// A backend the suite knows of that this workspace does not build yet: reported as
/// skipped, by name, with the reason.
#[derive(Debug, Clone, Copy)]
pub struct NotBuilt {
    name: &'static str,
    reason: &'static str,
}

impl NotBuilt {
    /// The CUDA backend (cudarc, `kernels-cuda/`).
    pub fn cuda() -> Self {
        NotBuilt {
            name: "cuda",
            reason: "not built: no CUDA backend in this workspace yet",
        }
    }

    /// The HIP backend (hip-sys, `kernels-hip/`).
    pub fn hip() -> Self {
        NotBuilt {
            name: "hip",
            reason: "not built: no HIP backend in this workspace yet",
        }
    }

    /// The GPU kernel sources compiled for the host under the emulation header.
    pub fn host_emulator() -> Self {
        NotBuilt {
            name: "host-emulator",
            reason:
                "not built: no GPU kernel sources or host emulation header in this workspace yet",
        }
    }
}

impl Backend for NotBuilt {
    type Cache = Never;
    type Tensor = Never;
    type Completion = Never;

    fn name(&self) -> &str {
        self.name
    }
    fn available(&self) -> Result<(), String> {
        Err(self.reason.to_string())
    }
    fn alloc_cache(&self, _: &KvCacheLayout, _: &[BufferShape]) -> Result<Never, String> {
        Err(self.reason.to_string())
    }
    fn upload_cache(&self, cache: &mut Never, _: &[Vec<u8>]) -> Result<(), String> {
        match *cache {}
    }
    fn download_cache(&self, cache: &Never) -> Result<Vec<Vec<u8>>, String> {
        match *cache {}
    }
    fn upload_tensor(&self, _: &HostTensor) -> Result<Never, String> {
        Err(self.reason.to_string())
    }
    fn alloc_tensor(&self, _: DType, _: usize) -> Result<Never, String> {
        Err(self.reason.to_string())
    }
    fn download_tensor(&self, t: &Never) -> Result<HostTensor, String> {
        match *t {}
    }
    fn write_kv(&self, cache: &mut Never, _: &WriteArgs<'_, Never>) -> Result<Never, OpError> {
        match *cache {}
    }
    fn paged_decode(
        &self,
        cache: &Never,
        _: &DecodeArgs<'_, Never>,
        _: &mut Never,
    ) -> Result<Never, OpError> {
        match *cache {}
    }
    fn copy_blocks(&self, cache: &mut Never, _: &[(u64, u64)]) -> Result<Never, OpError> {
        match *cache {}
    }
    fn swap_blocks(&self, src: &Never, _: &mut Never, _: &[(u64, u64)]) -> Result<Never, OpError> {
        match *src {}
    }
    fn gather_blocks(
        &self,
        cache: &Never,
        _: &[u64],
        _: Range<u64>,
        _: &mut Never,
    ) -> Result<Never, OpError> {
        match *cache {}
    }
    fn scatter_blocks(
        &self,
        staging: &Never,
        _: &[u64],
        _: Range<u64>,
        _: &mut Never,
    ) -> Result<Never, OpError> {
        match *staging {}
    }
    fn convert(&self, src: &Never, _: &mut Never) -> Result<Never, OpError> {
        match *src {}
    }
    fn wait(&self, c: Never) -> Result<(), String> {
        match c {}
    }
    fn synchronize(&self) -> Result<(), String> {
        Err(self.reason.to_string())
    }
}

/// Something to run on each backend (the trait has associated types, so backends are
/// visited rather than collected).
pub trait BackendVisitor {
    /// Called once per backend, available or not.
    fn visit<B: Backend>(&mut self, backend: &B);
}

/// Every backend the suite knows of, built once.
#[derive(Debug)]
pub struct Backends {
    /// The CPU backend (its rayon pool has 3 threads, so partitioned work is uneven).
    pub cpu: Host<CpuBackend>,
    /// The CPU backend with each other kernel build this machine runs.
    pub cpu_builds: Vec<Host<CpuBackend>>,
    /// The scalar reference as a backend.
    pub reference: Host<ScalarReference>,
    /// Listed, not built.
    pub absent: Vec<NotBuilt>,
}

impl Default for Backends {
    fn default() -> Self {
        Backends {
            cpu: Host::cpu("cpu", Some(3)),
            cpu_builds: Host::cpu_builds(Some(3)),
            reference: Host::reference(),
            absent: vec![NotBuilt::cuda(), NotBuilt::hip(), NotBuilt::host_emulator()],
        }
    }
}

impl Backends {
    /// Visits every backend, in report order: cpu, its other kernel builds, reference, cuda,
    /// hip, host-emulator.
    pub fn for_each(&self, v: &mut impl BackendVisitor) {
        v.visit(&self.cpu);
        for b in &self.cpu_builds {
            v.visit(b);
        }
        v.visit(&self.reference);
        for b in &self.absent {
            v.visit(b);
        }
    }
}
