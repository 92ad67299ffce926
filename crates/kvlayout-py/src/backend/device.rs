//! A backend with memory of its own on the caller's host arrays: the arrays are copied in,
//! the op runs, and what it wrote is copied back, only when it succeeded.

use std::sync::Mutex;

use kvlayout::ops::{AnyBackend, AnyCache, Backend as _, BufferShape, HostTensor, OpError};
use kvlayout::KvCacheLayout;
use kvlayout_cpu::Activations;
use pyo3::prelude::*;

use crate::errors::{raise, BackendFailure};

/// Why a call on a backend with its own memory failed.
pub(crate) enum Fail {
    Op(OpError),
    Memory(String),
}

impl From<OpError> for Fail {
    fn from(e: OpError) -> Self {
        Fail::Op(e)
    }
}

pub(crate) fn raise_fail(f: Fail) -> PyErr {
    match f {
        Fail::Op(e) => raise(e),
        Fail::Memory(m) => raise(BackendFailure(m)),
    }
}

pub(crate) fn host_tensor(a: &Activations<'_>) -> HostTensor {
    match a {
        Activations::F32(x) => HostTensor::F32(x.to_vec()),
        Activations::F16(x) => HostTensor::F16(x.to_vec()),
        Activations::Bf16(x) => HostTensor::Bf16(x.to_vec()),
    }
}

/// A device cache holding a copy of `bufs` (checked against the layout as a host cache is).
pub(crate) fn upload(
    be: &AnyBackend,
    layout: &KvCacheLayout,
    bufs: &[&[u8]],
) -> Result<AnyCache, Fail> {
    let lens: Vec<(u64, u64)> = bufs
        .iter()
        .map(|b| (b.len() as u64, b.as_ptr() as u64))
        .collect();
    kvlayout::ops::check_buffers(layout, &lens)?;
    let shapes = BufferShape::exact(layout);
    let mut cache = be.alloc_cache(layout, &shapes).map_err(Fail::Memory)?;
    let copies: Vec<Vec<u8>> = bufs
        .iter()
        .zip(&shapes)
        .map(|(b, s)| b[..s.len as usize].to_vec())
        .collect();
    be.upload_cache(&mut cache, &copies).map_err(Fail::Memory)?;
    Ok(cache)
}

/// Copies a device cache back into the caller's buffers.
pub(crate) fn download(
    be: &AnyBackend,
    cache: &AnyCache,
    bufs: &mut [&mut [u8]],
) -> Result<(), Fail> {
    let bytes = be.download_cache(cache).map_err(Fail::Memory)?;
    for (dst, src) in bufs.iter_mut().zip(&bytes) {
        dst[..src.len()].copy_from_slice(src);
    }
    Ok(())
}

pub(crate) fn lock(be: &Mutex<AnyBackend>) -> std::sync::MutexGuard<'_, AnyBackend> {
    // A panic while holding the lock leaves no state behind that a later call depends on.
    be.lock().unwrap_or_else(|p| p.into_inner())
}
