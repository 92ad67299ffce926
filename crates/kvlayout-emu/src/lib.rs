//! # kvlayout-emu: the GPU kernels, run on the host
//!
//! This crate owns running the project's GPU kernel sources (`kernels-cuda/src`, shared by
//! `kernels-hip/src`) on the CPU: `build.rs` compiles them with the host emulator
//! (`kernels-cuda/emu/kvl_emu.h`: thread blocks run one after another, their threads as
//! fibers, barriers and warp operations as rendezvous, errors returned), once as the CUDA
//! build with warps of 32 and once as the HIP build with wavefronts of 64. Kernels are
//! launched from the argument blocks of `kvlayout::kernels::calls`, which the C side reads as
//! a driver does. [`EmuOps`] runs every op of the backend contract through them on host
//! memory ([`hip_emu`]); [`EmuDevice`] is the emulator as a `kvlayout::ops::Device`, so
//! [`cuda_emu`] is the `DeviceBackend` the CUDA and HIP crates use, on host memory. The
//! conformance suite drives both like any other backend. Unsafe code is confined to `ffi`
//! (the C entry points) and `mem` (memory the kernels write through raw addresses).
//!
//! It does not own the kernels' arguments or launch configuration (the `kvlayout` crate
//! does), host memory or op validation (the `kvlayout-cpu` crate's `Host` and the contract's
//! checks), or GPUs.
//!
//! ```
//! use kvlayout::ops::{Backend, BufferShape};
//! let be = kvlayout_emu::hip_emu();
//! let layout: kvlayout::KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND".parse()?;
//! let mut cache = be.alloc_cache(&layout, &BufferShape::exact(&layout))?;
//! let bytes: Vec<Vec<u8>> = layout.extents().iter().map(|x| vec![7; x.end as usize]).collect();
//! be.upload_cache(&mut cache, &bytes)?;
//! be.wait(be.copy_blocks(&mut cache, &[(0, 2)])?)?; // the kernels, wavefronts of 64
//! assert_eq!(be.download_cache(&cache)?, bytes);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]
#![deny(unsafe_code)]

mod device;
#[allow(unsafe_code)]
mod ffi;
#[allow(unsafe_code)]
mod mem;
mod ops;

pub use device::{EmuBuffer, EmuDevice, EmuError};
pub use ffi::{kernel_decode, kernel_encode, kernel_param_layout};
pub use ops::EmuOps;

use kvlayout::ops::DeviceBackend;
use kvlayout_cpu::Host;

/// The CUDA kernel sources under the emulator (warps of 32) as a device backend: the code
/// path of the CUDA and HIP backends, from argument blocks to pinned host caches.
pub fn cuda_emu() -> DeviceBackend<EmuDevice> {
    DeviceBackend::new(EmuDevice::new("cuda-emu", EmuOps::cuda()))
}

/// The HIP kernel sources under the emulator (wavefronts of 64) as a backend.
pub fn hip_emu() -> Host<EmuOps> {
    Host::new("hip-emu", EmuOps::hip())
}
