//! The contract's [`Backend`] on host memory: [`Host`] runs the ops of the CPU backend or of
//! the scalar reference ([`HostOps`]) on host allocations shaped as a device backend's are
//! ([`BufferShape`]: any length, any misalignment), with completions that are ready when
//! returned. The conformance suite drives it as it drives a device backend.

use std::ops::Range;

use kvlayout::ops::{Backend, BufferShape, DecodeArgs, HostTensor, OpError, WriteArgs};
use kvlayout::{DType, KvCacheLayout};

use crate::backend::CpuBackend;
use crate::cache::{CacheMut, CacheRef};
use crate::reference;
use crate::tensor::Activations;
use crate::{Decode, WriteKv};

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
        let start = (shape.misalign % 64) as usize;
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

impl<O> Host<O> {
    /// `ops` as a backend named `name` in reports.
    pub fn new(name: &'static str, ops: O) -> Self {
        Host { name, ops }
    }

    /// The ops it runs.
    pub fn ops(&self) -> &O {
        &self.ops
    }
}

impl Host<CpuBackend> {
    /// The CPU backend on a pool of `threads` threads (`None`: one per core).
    pub fn cpu(name: &'static str, threads: Option<usize>) -> Self {
        Host {
            name,
            ops: CpuBackend::new(threads),
        }
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
            DType::F16 | DType::Bf16 => HostTensor::zeros(dtype, len).map_err(|e| e.to_string()),
            other => Err(format!("no {other} activation tensors")),
        }
    }

    fn download_tensor(&self, t: &HostTensor) -> Result<HostTensor, String> {
        Ok(t.clone())
    }

    fn write_kv(
        &self,
        cache: &mut HostBuffers,
        w: &WriteArgs<'_, &HostTensor>,
    ) -> Result<Ready, OpError> {
        let args = WriteKv {
            layer: w.layer,
            key: Activations::from(w.key),
            value: w.value.map(Activations::from),
            slot_mapping: w.slot_mapping,
        };
        self.ops
            .write_kv(&mut cache.as_mut()?, &args)
            .map(|()| Ready)
    }

    fn paged_decode(
        &self,
        cache: &HostBuffers,
        d: &DecodeArgs<'_, &HostTensor>,
        out: &mut HostTensor,
    ) -> Result<Ready, OpError> {
        let args = Decode {
            layer: d.layer,
            query: Activations::from(d.query),
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
