//! The interface every backend offers (CPU, CUDA, HIP, the host emulator), shaped for device
//! backends; the conformance suite drives each through it unchanged.
//!
//! - **Device memory.** A cache is an associated type ([`Backend::Cache`]): a layout plus one
//!   allocation per layout buffer, in backend memory. Host bytes enter and leave only through
//!   [`Backend::upload_cache`] / [`Backend::download_cache`]. Allocation takes each buffer's
//!   length and misalignment ([`BufferShape`]), so a caller can hand a backend a buffer shorter
//!   than the registered span or misaligned for its elements and see every op refuse it.
//! - **Activations in device memory.** Keys, values, queries and the decode output are
//!   [`Backend::Tensor`]s, uploaded from and downloaded to a [`HostTensor`].
//! - **Index metadata on the host.** Slot mappings, block tables, sequence lengths and block
//!   pairs are host slices: every backend validates them ([`super::check`]) before it enqueues
//!   anything, on the host copy the scheduler has anyway.
//! - **Asynchronous completion.** Every op is enqueued on the backend's stream and returns a
//!   [`Backend::Completion`] to [`Backend::wait`] on; [`Backend::synchronize`] waits for all.
//!   A refused op returns its typed [`OpError`] at enqueue time, having enqueued nothing.
//!   Downloads are ordered after the work enqueued before them.

use std::ops::Range;

use half::{bf16, f16};

use super::args::{DecodeArgs, TensorDesc, WriteArgs};
use super::error::OpError;
use super::moves::BlockMove;
use crate::dtype::DType;
use crate::layout::KvCacheLayout;

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
    /// `values` rounded to `dtype`; activations are f32, f16 or bf16, any other dtype is
    /// refused.
    pub fn from_f32(dtype: DType, values: &[f32]) -> Result<Self, OpError> {
        Ok(match dtype {
            DType::F16 => HostTensor::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::Bf16 => HostTensor::Bf16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::F32 => HostTensor::F32(values.to_vec()),
            other => {
                return Err(OpError::Shape {
                    what: "activation dtype".into(),
                    expected: "f32, f16 or bf16".into(),
                    got: other.to_string(),
                })
            }
        })
    }

    /// `len` zeros of `dtype` (f32, f16 or bf16).
    pub fn zeros(dtype: DType, len: usize) -> Result<Self, OpError> {
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
}

impl TensorDesc for HostTensor {
    fn dtype(&self) -> DType {
        HostTensor::dtype(self)
    }

    fn len(&self) -> usize {
        HostTensor::len(self)
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

/// What runs a backend's ops, for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernels {
    /// The kernel build (`avx2`, `scalar`, `reference`, `cuda`, ...).
    pub build: String,
    /// Why that build runs.
    pub why: String,
    /// Threads of a host backend's pool (0 for a device).
    pub threads: usize,
}

/// What every backend offers. Ops return at enqueue time: `Err` (nothing enqueued, nothing
/// written) or a completion to wait on. Memory operations report a failure of the backend
/// (no memory, no device) as text. A backend implements `write_kv`, `paged_decode` and
/// `move_blocks`; the five block movers are provided on top of `move_blocks`.
pub trait Backend {
    /// A cache in backend memory: a layout and one allocation per layout buffer.
    type Cache;
    /// A dense activation tensor in backend memory.
    type Tensor;
    /// Enqueued work (an event on the backend's stream).
    type Completion;

    /// Name in reports.
    fn name(&self) -> &str;
    /// `Ok` when the backend can run here; otherwise why not (callers report it skipped).
    fn available(&self) -> Result<(), String>;
    /// What runs the ops; by default the backend's name, for no stated reason.
    fn kernels(&self) -> Kernels {
        Kernels {
            build: self.name().to_string(),
            why: String::new(),
            threads: 0,
        }
    }
    /// Whether `paged_decode` on a cache of `dtype` multiplies bf16 operands, which rounds
    /// more than f32 products (`kvlayout_cpu::Tolerance::BF16_PRODUCTS`); by default not.
    fn bf16_products(&self, dtype: DType) -> bool {
        let _ = dtype;
        false
    }

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
        w: &WriteArgs<'_, &Self::Tensor>,
    ) -> Result<Self::Completion, OpError>;
    /// Enqueues `paged_decode` into `out` (f32, `[seqs, num_q_heads, v_width]`).
    fn paged_decode(
        &self,
        cache: &Self::Cache,
        d: &DecodeArgs<'_, &Self::Tensor>,
        out: &mut Self::Tensor,
    ) -> Result<Self::Completion, OpError>;
    /// Enqueues the block move `op` from `src` to `dst` ([`BlockMove::plan`] validates it:
    /// `src` is `None` for `copy_blocks`, within `dst`, and the source cache otherwise).
    fn move_blocks(
        &self,
        src: Option<&Self::Cache>,
        dst: &mut Self::Cache,
        op: &BlockMove<'_>,
    ) -> Result<Self::Completion, OpError>;

    /// Enqueues `copy_blocks` (all layers, `src -> dst` pairs within one cache).
    fn copy_blocks(
        &self,
        cache: &mut Self::Cache,
        pairs: &[(u64, u64)],
    ) -> Result<Self::Completion, OpError> {
        self.move_blocks(None, cache, &BlockMove::Copy(pairs))
    }
    /// Enqueues `swap_blocks` between two caches of the same content (layouts may differ).
    fn swap_blocks(
        &self,
        src: &Self::Cache,
        dst: &mut Self::Cache,
        pairs: &[(u64, u64)],
    ) -> Result<Self::Completion, OpError> {
        self.move_blocks(Some(src), dst, &BlockMove::Swap(pairs))
    }
    /// Enqueues `gather_blocks`: cache block `blocks[i]`, heads `heads` -> staging block `i`.
    fn gather_blocks(
        &self,
        cache: &Self::Cache,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut Self::Cache,
    ) -> Result<Self::Completion, OpError> {
        self.move_blocks(Some(cache), staging, &BlockMove::Gather { blocks, heads })
    }
    /// Enqueues `scatter_blocks`, the inverse of `gather_blocks`.
    fn scatter_blocks(
        &self,
        staging: &Self::Cache,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut Self::Cache,
    ) -> Result<Self::Completion, OpError> {
        self.move_blocks(Some(staging), cache, &BlockMove::Scatter { blocks, heads })
    }
    /// Enqueues `convert` (whole cache, layout A -> layout B).
    fn convert(
        &self,
        src: &Self::Cache,
        dst: &mut Self::Cache,
    ) -> Result<Self::Completion, OpError> {
        self.move_blocks(Some(src), dst, &BlockMove::Convert)
    }

    /// Waits for one op; `Err` is an asynchronous failure of the device.
    fn wait(&self, c: Self::Completion) -> Result<(), String>;
    /// Waits for everything enqueued.
    fn synchronize(&self) -> Result<(), String>;
}
