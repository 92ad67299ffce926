//! The contract's [`Backend`] on host memory: [`Host`] runs the ops of a [`HostExec`] (the
//! CPU backend or the scalar reference) on host allocations shaped as a device backend's are
//! ([`BufferShape`]: any length, any misalignment), with completions that are ready when
//! returned. The conformance suite drives it as it drives a device backend.

use kvlayout::ops::{
    Backend, BlockMove, BufferShape, DecodeArgs, HostTensor, Kernels, OpError, WriteArgs,
};
use kvlayout::{DType, KvCacheLayout};

use crate::backend::CpuBackend;
use crate::cache::{CacheMut, CacheRef};
use crate::exec::HostExec;
use crate::reference::ScalarReference;
use crate::tensor::Activations;
use crate::{Decode, WriteKv};

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
            // Zeroed by the allocator: a large buffer's pages cost memory only when touched.
            lines: bytemuck::zeroed_vec((start + len).div_ceil(64)),
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

/// The cache of a [`Host`] backend (its `Backend::Cache`): a layout and its buffers, as
/// allocated by `alloc_cache` (possibly malformed: the ops check them, as a device backend
/// checks the device pointers it is handed). Bytes enter and leave through `upload_cache` and
/// `download_cache`. A cache for [`CpuBackend`] run directly is a
/// [`HostCache`](crate::HostCache) or the caller's buffers in a [`CacheMut`].
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

/// The contract's `Backend` on host memory, running an executor: the CPU backend
/// ([`Host::cpu`]) or the scalar reference ([`Host::reference`]). The way in for a program
/// that runs the ops (the crate docs show one), and what `kvlayout_backends::open("cpu")`
/// opens.
#[derive(Debug)]
pub struct Host<E> {
    name: String,
    ops: E,
}

impl<E> Host<E> {
    /// `ops` as a backend named `name` in reports.
    pub fn new(name: impl Into<String>, ops: E) -> Self {
        Host {
            name: name.into(),
            ops,
        }
    }

    /// The executor it runs.
    pub fn ops(&self) -> &E {
        &self.ops
    }
}

impl Host<CpuBackend> {
    /// The CPU backend on a pool of `threads` threads (`None`: one per core), named `name` in
    /// reports, running the fastest kernel build of this machine.
    ///
    /// ```
    /// use kvlayout::ops::Backend;
    /// let be = kvlayout_cpu::Host::cpu("cpu", Some(2));
    /// assert_eq!((be.name(), be.kernels().threads), ("cpu", 2));
    /// assert_eq!(be.kernels().build, be.ops().kernel_build());
    /// ```
    pub fn cpu(name: impl Into<String>, threads: Option<usize>) -> Self {
        Host::new(name, CpuBackend::new(threads))
    }
}

impl Host<ScalarReference> {
    /// The scalar reference as a backend.
    pub fn reference() -> Self {
        Host::new("reference", ScalarReference)
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

impl<E: HostExec> Backend for Host<E> {
    type Cache = HostBuffers;
    type Tensor = HostTensor;
    type Completion = Ready;

    fn name(&self) -> &str {
        &self.name
    }

    fn available(&self) -> Result<(), String> {
        Ok(())
    }

    fn kernels(&self) -> Kernels {
        self.ops.kernels()
    }

    fn bf16_products(&self, dtype: DType) -> bool {
        self.ops.bf16_products(dtype)
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

    fn move_blocks(
        &self,
        src: Option<&HostBuffers>,
        dst: &mut HostBuffers,
        op: &BlockMove<'_>,
    ) -> Result<Ready, OpError> {
        let src = src.map(HostBuffers::as_ref).transpose()?;
        self.ops
            .move_blocks(src.as_ref(), &mut dst.as_mut()?, op)
            .map(|()| Ready)
    }

    fn wait(&self, _: Ready) -> Result<(), String> {
        Ok(())
    }

    fn synchronize(&self) -> Result<(), String> {
        Ok(())
    }
}
