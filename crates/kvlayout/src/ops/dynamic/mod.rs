//! A backend chosen at run time: [`AnyBackend`] holds any [`Backend`] behind one type, so a
//! caller can pick a backend by name (`kvlayout_backends::open`) and hold it without knowing
//! its type. Its caches, tensors and completions ([`AnyCache`], [`AnyTensor`],
//! [`AnyCompletion`]) hold those of the backend inside. One whose type is not the backend's
//! is refused (memory operations with the reason as text, ops with
//! [`OpError::Incompatible`]), having done nothing; values of one type are interchangeable
//! (two host-memory backends share caches, as their executors may).

use std::any::Any;
use std::fmt;

use super::args::{DecodeArgs, TensorDesc, WriteArgs};
use super::backend::{Backend, BufferShape, HostTensor, Kernels};
use super::error::OpError;
use super::moves::BlockMove;
use crate::dtype::DType;
use crate::layout::KvCacheLayout;

/// A cache of an [`AnyBackend`]: the cache of the backend inside.
pub struct AnyCache(Box<dyn Any + Send>);

/// A dense activation tensor of an [`AnyBackend`]: its element type and count, and the tensor
/// of the backend inside.
pub struct AnyTensor {
    dtype: DType,
    len: usize,
    inner: Box<dyn Any + Send>,
}

/// Enqueued work of an [`AnyBackend`].
pub struct AnyCompletion(Box<dyn Any + Send>);

impl fmt::Debug for AnyCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AnyCache")
    }
}

impl fmt::Debug for AnyTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AnyTensor({} x {})", self.len, self.dtype)
    }
}

impl fmt::Debug for AnyCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AnyCompletion")
    }
}

impl TensorDesc for AnyTensor {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// The backend's own value inside `b`, or why not (it was made by a backend of another type).
fn inner<'a, T: 'static>(b: &'a dyn Any, what: &str, backend: &str) -> Result<&'a T, String> {
    b.downcast_ref()
        .ok_or_else(|| format!("{backend}: the {what} was made by another backend"))
}

fn inner_mut<'a, T: 'static>(
    b: &'a mut dyn Any,
    what: &str,
    backend: &str,
) -> Result<&'a mut T, String> {
    b.downcast_mut()
        .ok_or_else(|| format!("{backend}: the {what} was made by another backend"))
}

/// [`Backend`] with its associated types erased, so that any backend fits one box.
trait Erased {
    fn available(&self) -> Result<(), String>;
    fn kernels(&self) -> Kernels;
    fn bf16_products(&self, dtype: DType) -> bool;
    fn alloc_cache(&self, l: &KvCacheLayout, s: &[BufferShape]) -> Result<AnyCache, String>;
    fn upload_cache(&self, c: &mut AnyCache, bytes: &[Vec<u8>]) -> Result<(), String>;
    fn download_cache(&self, c: &AnyCache) -> Result<Vec<Vec<u8>>, String>;
    fn upload_tensor(&self, t: &HostTensor) -> Result<AnyTensor, String>;
    fn alloc_tensor(&self, dtype: DType, len: usize) -> Result<AnyTensor, String>;
    fn download_tensor(&self, t: &AnyTensor) -> Result<HostTensor, String>;
    fn write_kv(
        &self,
        c: &mut AnyCache,
        w: &WriteArgs<'_, &AnyTensor>,
    ) -> Result<AnyCompletion, OpError>;
    fn paged_decode(
        &self,
        c: &AnyCache,
        d: &DecodeArgs<'_, &AnyTensor>,
        out: &mut AnyTensor,
    ) -> Result<AnyCompletion, OpError>;
    fn move_blocks(
        &self,
        src: Option<&AnyCache>,
        dst: &mut AnyCache,
        op: &BlockMove<'_>,
    ) -> Result<AnyCompletion, OpError>;
    fn wait(&self, c: AnyCompletion) -> Result<(), String>;
    fn synchronize(&self) -> Result<(), String>;
}

impl<B> Erased for B
where
    B: Backend,
    B::Cache: Send + 'static,
    B::Tensor: Send + 'static,
    B::Completion: Send + 'static,
{
    fn available(&self) -> Result<(), String> {
        Backend::available(self)
    }

    fn kernels(&self) -> Kernels {
        Backend::kernels(self)
    }

    fn bf16_products(&self, dtype: DType) -> bool {
        Backend::bf16_products(self, dtype)
    }

    fn alloc_cache(&self, l: &KvCacheLayout, s: &[BufferShape]) -> Result<AnyCache, String> {
        let c = Backend::alloc_cache(self, l, s)?;
        Ok(AnyCache(Box::new(c)))
    }

    fn upload_cache(&self, c: &mut AnyCache, bytes: &[Vec<u8>]) -> Result<(), String> {
        let c = inner_mut::<B::Cache>(c.0.as_mut(), "cache", Backend::name(self))?;
        Backend::upload_cache(self, c, bytes)
    }

    fn download_cache(&self, c: &AnyCache) -> Result<Vec<Vec<u8>>, String> {
        let c = inner::<B::Cache>(c.0.as_ref(), "cache", Backend::name(self))?;
        Backend::download_cache(self, c)
    }

    fn upload_tensor(&self, t: &HostTensor) -> Result<AnyTensor, String> {
        let inner = Backend::upload_tensor(self, t)?;
        Ok(AnyTensor {
            dtype: t.dtype(),
            len: t.len(),
            inner: Box::new(inner),
        })
    }

    fn alloc_tensor(&self, dtype: DType, len: usize) -> Result<AnyTensor, String> {
        let inner = Backend::alloc_tensor(self, dtype, len)?;
        Ok(AnyTensor {
            dtype,
            len,
            inner: Box::new(inner),
        })
    }

    fn download_tensor(&self, t: &AnyTensor) -> Result<HostTensor, String> {
        let t = inner::<B::Tensor>(t.inner.as_ref(), "tensor", Backend::name(self))?;
        Backend::download_tensor(self, t)
    }

    fn write_kv(
        &self,
        c: &mut AnyCache,
        w: &WriteArgs<'_, &AnyTensor>,
    ) -> Result<AnyCompletion, OpError> {
        let name = Backend::name(self);
        let c = inner_mut::<B::Cache>(c.0.as_mut(), "cache", name).map_err(refused)?;
        let key = inner::<B::Tensor>(w.key.inner.as_ref(), "key", name).map_err(refused)?;
        let value = match w.value {
            Some(v) => Some(inner::<B::Tensor>(v.inner.as_ref(), "value", name).map_err(refused)?),
            None => None,
        };
        let args = WriteArgs {
            layer: w.layer,
            key,
            value,
            slot_mapping: w.slot_mapping,
        };
        let done = Backend::write_kv(self, c, &args)?;
        Ok(AnyCompletion(Box::new(done)))
    }

    fn paged_decode(
        &self,
        c: &AnyCache,
        d: &DecodeArgs<'_, &AnyTensor>,
        out: &mut AnyTensor,
    ) -> Result<AnyCompletion, OpError> {
        let name = Backend::name(self);
        let c = inner::<B::Cache>(c.0.as_ref(), "cache", name).map_err(refused)?;
        let query = inner::<B::Tensor>(d.query.inner.as_ref(), "query", name).map_err(refused)?;
        let out = inner_mut::<B::Tensor>(out.inner.as_mut(), "output", name).map_err(refused)?;
        let args = DecodeArgs {
            layer: d.layer,
            query,
            block_table: d.block_table,
            blocks_per_seq: d.blocks_per_seq,
            seq_lens: d.seq_lens,
            params: d.params,
        };
        let done = Backend::paged_decode(self, c, &args, out)?;
        Ok(AnyCompletion(Box::new(done)))
    }

    fn move_blocks(
        &self,
        src: Option<&AnyCache>,
        dst: &mut AnyCache,
        op: &BlockMove<'_>,
    ) -> Result<AnyCompletion, OpError> {
        let name = Backend::name(self);
        let src = match src {
            Some(s) => {
                Some(inner::<B::Cache>(s.0.as_ref(), "source cache", name).map_err(refused)?)
            }
            None => None,
        };
        let dst =
            inner_mut::<B::Cache>(dst.0.as_mut(), "destination cache", name).map_err(refused)?;
        let done = Backend::move_blocks(self, src, dst, op)?;
        Ok(AnyCompletion(Box::new(done)))
    }

    fn wait(&self, c: AnyCompletion) -> Result<(), String> {
        let c = c.0.downcast::<B::Completion>().map_err(|_| {
            format!(
                "{}: the completion was made by another backend",
                Backend::name(self)
            )
        })?;
        Backend::wait(self, *c)
    }

    fn synchronize(&self) -> Result<(), String> {
        Backend::synchronize(self)
    }
}

fn refused(why: String) -> OpError {
    OpError::Incompatible(why)
}

/// Any backend, held as one type: the [`Backend`] a caller gets when the backend is chosen at
/// run time. Every call but [`Backend::name`] goes to the backend inside. It and its caches,
/// tensors and completions are `Send`: a caller may run it on another thread (the Python
/// package runs ops without the GIL).
pub struct AnyBackend {
    name: String,
    inner: Box<dyn Erased + Send>,
}

impl fmt::Debug for AnyBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AnyBackend({})", self.name)
    }
}

impl AnyBackend {
    /// `backend`, held as one type, under its own name.
    pub fn new<B>(backend: B) -> Self
    where
        B: Backend + Send + 'static,
        B::Cache: Send + 'static,
        B::Tensor: Send + 'static,
        B::Completion: Send + 'static,
    {
        let name = backend.name().to_string();
        AnyBackend {
            name,
            inner: Box::new(backend),
        }
    }

    /// The same backend named `name` in reports (the name it was opened by, as `cuda:1`).
    pub fn named(self, name: impl Into<String>) -> Self {
        AnyBackend {
            name: name.into(),
            ..self
        }
    }
}

impl Backend for AnyBackend {
    type Cache = AnyCache;
    type Tensor = AnyTensor;
    type Completion = AnyCompletion;

    fn name(&self) -> &str {
        &self.name
    }

    fn available(&self) -> Result<(), String> {
        self.inner.available()
    }

    fn kernels(&self) -> Kernels {
        self.inner.kernels()
    }

    fn bf16_products(&self, dtype: DType) -> bool {
        self.inner.bf16_products(dtype)
    }

    fn alloc_cache(&self, l: &KvCacheLayout, s: &[BufferShape]) -> Result<AnyCache, String> {
        self.inner.alloc_cache(l, s)
    }

    fn upload_cache(&self, c: &mut AnyCache, bytes: &[Vec<u8>]) -> Result<(), String> {
        self.inner.upload_cache(c, bytes)
    }

    fn download_cache(&self, c: &AnyCache) -> Result<Vec<Vec<u8>>, String> {
        self.inner.download_cache(c)
    }

    fn upload_tensor(&self, t: &HostTensor) -> Result<AnyTensor, String> {
        self.inner.upload_tensor(t)
    }

    fn alloc_tensor(&self, dtype: DType, len: usize) -> Result<AnyTensor, String> {
        self.inner.alloc_tensor(dtype, len)
    }

    fn download_tensor(&self, t: &AnyTensor) -> Result<HostTensor, String> {
        self.inner.download_tensor(t)
    }

    fn write_kv(
        &self,
        c: &mut AnyCache,
        w: &WriteArgs<'_, &AnyTensor>,
    ) -> Result<AnyCompletion, OpError> {
        self.inner.write_kv(c, w)
    }

    fn paged_decode(
        &self,
        c: &AnyCache,
        d: &DecodeArgs<'_, &AnyTensor>,
        out: &mut AnyTensor,
    ) -> Result<AnyCompletion, OpError> {
        self.inner.paged_decode(c, d, out)
    }

    fn move_blocks(
        &self,
        src: Option<&AnyCache>,
        dst: &mut AnyCache,
        op: &BlockMove<'_>,
    ) -> Result<AnyCompletion, OpError> {
        self.inner.move_blocks(src, dst, op)
    }

    fn wait(&self, c: AnyCompletion) -> Result<(), String> {
        self.inner.wait(c)
    }

    fn synchronize(&self) -> Result<(), String> {
        self.inner.synchronize()
    }
}

#[cfg(test)]
mod tests;
