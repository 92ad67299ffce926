//! The backend interface of the conformance suite, shaped for device backends: caches live in
//! backend memory (uploaded and downloaded explicitly), ops are enqueued and return a
//! completion to wait on, outputs live in backend buffers.
//!
//! The CPU backend and the scalar reference implement it today. CUDA, HIP and the host
//! emulator of the GPU kernels are listed so that the suite reports them as skipped, by name,
//! until their crates exist.

use std::ops::Range;

use kvlayout::ops::OpError;
use kvlayout::KvCacheLayout;
use kvlayout_cpu::{reference, CpuBackend, Decode, HostCache, WriteKv};

/// A handle to an enqueued op (a stream event on a device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion(pub u64);

/// What every backend offers the suite.
pub trait Backend {
    /// A cache in backend memory.
    type Cache;
    /// An output buffer in backend memory.
    type Output;

    /// Name in reports.
    fn name(&self) -> &'static str;
    /// Uploads a cache (one byte vector per layout buffer).
    fn upload(&self, layout: &KvCacheLayout, buffers: &[Vec<u8>]) -> Result<Self::Cache, String>;
    /// Downloads a cache's buffers.
    fn download(&self, cache: &Self::Cache) -> Vec<Vec<u8>>;
    /// Allocates an f32 output of `len` elements.
    fn alloc_output(&self, len: usize) -> Self::Output;
    /// Downloads an output.
    fn download_output(&self, out: &Self::Output) -> Vec<f32>;
    /// Enqueues `write_kv`.
    fn write_kv(&self, cache: &mut Self::Cache, w: &WriteKv<'_>) -> Result<Completion, OpError>;
    /// Enqueues `paged_decode`.
    fn paged_decode(
        &self,
        cache: &Self::Cache,
        d: &Decode<'_>,
        out: &mut Self::Output,
    ) -> Result<Completion, OpError>;
    /// Enqueues `copy_blocks`.
    fn copy_blocks(
        &self,
        cache: &mut Self::Cache,
        pairs: &[(u64, u64)],
    ) -> Result<Completion, OpError>;
    /// Enqueues `swap_blocks`.
    fn swap_blocks(
        &self,
        src: &Self::Cache,
        dst: &mut Self::Cache,
        pairs: &[(u64, u64)],
    ) -> Result<Completion, OpError>;
    /// Enqueues `gather_blocks`.
    fn gather_blocks(
        &self,
        cache: &Self::Cache,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut Self::Cache,
    ) -> Result<Completion, OpError>;
    /// Enqueues `scatter_blocks`.
    fn scatter_blocks(
        &self,
        staging: &Self::Cache,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut Self::Cache,
    ) -> Result<Completion, OpError>;
    /// Enqueues `convert`.
    fn convert(&self, src: &Self::Cache, dst: &mut Self::Cache) -> Result<Completion, OpError>;
    /// Waits for an op.
    fn wait(&self, c: Completion) -> Result<(), String>;
}

fn host_cache(layout: &KvCacheLayout, buffers: &[Vec<u8>]) -> Result<HostCache, String> {
    let mut c = HostCache::new(layout.clone()).map_err(|e| e.to_string())?;
    for (i, b) in buffers.iter().enumerate() {
        c.bytes_mut(i).copy_from_slice(b);
    }
    Ok(c)
}

macro_rules! host_backend {
    ($ty:ty, $name:literal, |$be:ident| $write:expr, $decode:expr, $copy:expr, $swap:expr, $gather:expr, $scatter:expr, $convert:expr) => {
        impl Backend for $ty {
            type Cache = HostCache;
            type Output = Vec<f32>;
            fn name(&self) -> &'static str {
                $name
            }
            fn upload(
                &self,
                layout: &KvCacheLayout,
                buffers: &[Vec<u8>],
            ) -> Result<HostCache, String> {
                host_cache(layout, buffers)
            }
            fn download(&self, cache: &HostCache) -> Vec<Vec<u8>> {
                (0..cache.layout().num_buffers())
                    .map(|i| cache.bytes(i).to_vec())
                    .collect()
            }
            fn alloc_output(&self, len: usize) -> Vec<f32> {
                vec![f32::NAN; len]
            }
            fn download_output(&self, out: &Vec<f32>) -> Vec<f32> {
                out.clone()
            }
            fn write_kv(
                &self,
                cache: &mut HostCache,
                w: &WriteKv<'_>,
            ) -> Result<Completion, OpError> {
                let $be = self;
                ($write)(&mut cache.as_mut(), w).map(|()| Completion(0))
            }
            fn paged_decode(
                &self,
                cache: &HostCache,
                d: &Decode<'_>,
                out: &mut Vec<f32>,
            ) -> Result<Completion, OpError> {
                let $be = self;
                ($decode)(&cache.as_ref(), d, out.as_mut_slice()).map(|()| Completion(0))
            }
            fn copy_blocks(
                &self,
                cache: &mut HostCache,
                pairs: &[(u64, u64)],
            ) -> Result<Completion, OpError> {
                let $be = self;
                ($copy)(&mut cache.as_mut(), pairs).map(|()| Completion(0))
            }
            fn swap_blocks(
                &self,
                src: &HostCache,
                dst: &mut HostCache,
                pairs: &[(u64, u64)],
            ) -> Result<Completion, OpError> {
                let $be = self;
                ($swap)(&src.as_ref(), &mut dst.as_mut(), pairs).map(|()| Completion(0))
            }
            fn gather_blocks(
                &self,
                cache: &HostCache,
                blocks: &[u64],
                heads: Range<u64>,
                staging: &mut HostCache,
            ) -> Result<Completion, OpError> {
                let $be = self;
                ($gather)(&cache.as_ref(), blocks, heads, &mut staging.as_mut())
                    .map(|()| Completion(0))
            }
            fn scatter_blocks(
                &self,
                staging: &HostCache,
                blocks: &[u64],
                heads: Range<u64>,
                cache: &mut HostCache,
            ) -> Result<Completion, OpError> {
                let $be = self;
                ($scatter)(&staging.as_ref(), blocks, heads, &mut cache.as_mut())
                    .map(|()| Completion(0))
            }
            fn convert(&self, src: &HostCache, dst: &mut HostCache) -> Result<Completion, OpError> {
                let $be = self;
                ($convert)(&src.as_ref(), &mut dst.as_mut()).map(|()| Completion(0))
            }
            fn wait(&self, _: Completion) -> Result<(), String> {
                Ok(())
            }
        }
    };
}

/// The scalar reference, as a backend (it is also the oracle).
#[derive(Debug, Default)]
pub struct Reference;

host_backend!(
    Reference,
    "reference",
    |_be| reference::write_kv,
    reference::paged_decode,
    reference::copy_blocks,
    reference::swap_blocks,
    reference::gather_blocks,
    reference::scatter_blocks,
    reference::convert
);

/// The CPU backend's fast paths.
#[derive(Debug)]
pub struct Cpu(pub CpuBackend);

host_backend!(
    Cpu,
    "cpu",
    |be| |c: &mut kvlayout_cpu::CacheMut<'_>, w: &WriteKv<'_>| be.0.write_kv(c, w),
    |c: &kvlayout_cpu::CacheRef<'_>, d: &Decode<'_>, o: &mut [f32]| be.0.paged_decode(c, d, o),
    |c: &mut kvlayout_cpu::CacheMut<'_>, p: &[(u64, u64)]| be.0.copy_blocks(c, p),
    |s: &kvlayout_cpu::CacheRef<'_>, d: &mut kvlayout_cpu::CacheMut<'_>, p: &[(u64, u64)]| be
        .0
        .swap_blocks(s, d, p),
    |c: &kvlayout_cpu::CacheRef<'_>,
     b: &[u64],
     h: Range<u64>,
     s: &mut kvlayout_cpu::CacheMut<'_>| be.0.gather_blocks(c, b, h, s),
    |s: &kvlayout_cpu::CacheRef<'_>,
     b: &[u64],
     h: Range<u64>,
     c: &mut kvlayout_cpu::CacheMut<'_>| be.0.scatter_blocks(s, b, h, c),
    |s: &kvlayout_cpu::CacheRef<'_>, d: &mut kvlayout_cpu::CacheMut<'_>| be.0.convert(s, d)
);

/// Backends the suite knows of that are not present in this build, with the reason.
pub fn absent_backends() -> Vec<(&'static str, &'static str)> {
    vec![
        ("host-emulator", "not built: the GPU kernel sources and their host emulation arrive with the CUDA/HIP issues"),
        ("cuda", "not built: no CUDA backend in this workspace yet (skipped: no CUDA device on this machine either)"),
        ("hip", "not built: no HIP backend in this workspace yet"),
    ]
}
