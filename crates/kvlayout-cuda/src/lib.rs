//! # kvlayout-cuda: the backend contract on NVIDIA GPUs
//!
//! This crate owns running the project's kernels (`kernels-cuda/src`) on an NVIDIA GPU
//! through the CUDA driver API (cudarc, loaded at run time): [`CudaDevice`] implements
//! [`kvlayout_device::Device`] — allocations in device or pinned host memory, copies, kernel
//! launches with the argument block of [`kvlayout_device::kernels::KernelArgs::block`], events — and
//! [`cuda`] wraps it in the contract's [`DeviceBackend`]. It also owns the kernel images:
//! PTX compiled by clang-19 at build time and embedded, and the NVRTC fallback.
//!
//! It does not own validation, launch configurations, argument blocks, the staging of index
//! metadata or the choice between kernels and copies: [`DeviceBackend`] and
//! `kvlayout_device::kernels` do, for every GPU runtime alike. It needs no CUDA toolkit to build:
//! without a driver every entry point returns [`CudaError::NoDriver`].
//!
//! ## Which kernels a device loads
//!
//! At [`CudaDevice::open`], by compute capability ([`choose_kernels`]):
//!
//! - 9.0 and up: the embedded `sm_90` PTX; 8.0 and up: the embedded `sm_80` PTX;
//! - below 8.0, or when the crate was built without clang-19 (nothing embedded): NVRTC
//!   compiles [`nvrtc_source`] for `compute_<major><minor>` ([`compile_nvrtc`]).
//!
//! `KVLAYOUT_CUDA_KERNELS=nvrtc` forces NVRTC; `KVLAYOUT_CUDA_KERNELS=embedded` forbids it
//! ([`KernelPolicy`]). [`DeviceInfo::kernels`] says which was loaded (the embedded target and
//! its SHA-256, or the NVRTC architecture).
//!
//! The driver must know the PTX's ISA version: clang-19 writes ISA 7.8, which drivers from
//! CUDA 11.8 load; NVRTC 12.9 writes ISA 8.8, which needs a CUDA 12.9 driver. A driver that
//! refuses the PTX fails the open with [`CudaError::ModuleLoad`], naming the source, the ISA
//! version and the JIT log.
//!
//! ## Memory
//!
//! Device buffers come from `cuMemAllocAsync` on the device's stream and go back in stream
//! order (or `cuMemAlloc`, freed after a stream synchronization, where the device has no
//! memory pools). Pinned host buffers come from `cuMemHostAlloc` and are addressed by the
//! kernels at their host address (unified addressing, which [`CudaDevice::open`] requires).
//! `upload` expects pageable source memory, which the driver stages before returning.
//! A [`CudaDevice`] is `Send + Sync`: each call binds its context to the calling thread.
//!
//! ## Modules
//!
//! - `device`: [`CudaDevice`], opening a device and the `Device` contract on it.
//! - `driver`: the CUDA driver calls (every `unsafe` block of the crate but NVRTC's):
//!   context, stream, module and launches; [`CudaBuffer`]; [`CudaEvent`].
//! - `nvrtc`: the NVRTC calls.
//! - [`kernels`]: the embedded PTX, the NVRTC source and the choice between them.
//! - `error`: [`CudaError`].
//!
//! ```
//! use kvlayout::ops::{Backend, BufferShape};
//! match kvlayout_cuda::cuda(0) {
//!     Ok(be) => {
//!         let layout: kvlayout::KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND".parse()?;
//!         let mut cache = be.alloc_cache(&layout, &BufferShape::exact(&layout))?;
//!         let bytes: Vec<Vec<u8>> = layout.extents().iter().map(|x| vec![7; x.end as usize]).collect();
//!         be.upload_cache(&mut cache, &bytes)?;
//!         be.wait(be.copy_blocks(&mut cache, &[(0, 2)])?)?;
//!         assert_eq!(be.download_cache(&cache)?, bytes);
//!         println!("ran on {:?}", be.device().info());
//!     }
//!     Err(e) => println!("skipped: cuda: {e}"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]
#![deny(unsafe_code)]

mod device;
#[allow(unsafe_code)]
mod driver;
mod error;
pub mod kernels;
#[allow(unsafe_code)]
mod nvrtc;

pub use device::{CudaDevice, DeviceInfo};
pub use driver::{CudaBuffer, CudaEvent};
pub use error::CudaError;
pub use kernels::{
    choose_kernels, compile_nvrtc, embedded_ptx, nvrtc_source, EmbeddedPtx, KernelPolicy,
    KernelSource,
};

use kvlayout_device::DeviceBackend;

/// The backend of device `ordinal` ([`CudaDevice::open`]).
pub fn cuda(ordinal: usize) -> Result<DeviceBackend<CudaDevice>, CudaError> {
    CudaDevice::open(ordinal).map(DeviceBackend::new)
}

/// `Ok` when device 0 opens (its kernels loaded), else why not: the reason a suite prints
/// when it skips the CUDA backend.
pub fn availability() -> Result<(), String> {
    CudaDevice::open(0).map(|_| ()).map_err(|e| e.to_string())
}
