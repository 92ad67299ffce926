//! # kvlayout-emu: the GPU kernels, run on the host
//!
//! This crate owns running the project's GPU kernel sources (`kernels-cuda/src`, shared by
//! `kernels-hip/src`) on the CPU: `build.rs` compiles them with the host emulator
//! (`kernels-cuda/emu/kvl_emu.h`: thread blocks run one after another, their threads as
//! fibers, barriers and warp operations as rendezvous, errors returned), once as the CUDA
//! build with warps of 32 and once as the HIP build with wavefronts of 64. [`EmuDevice`] is
//! the emulator as a `kvlayout_device::Device`: kernels are launched from the argument blocks
//! `kvlayout_device::kernels` builds, which the C side reads as a driver does. So [`emu`]
//! (and [`cuda_emu`], [`hip_emu`]) is the `DeviceBackend` of the CUDA and HIP crates on host
//! memory, and the conformance suite drives it like any other backend. Unsafe code is
//! confined to `ffi` (the C entry points), `mem` (memory the kernels write through raw
//! addresses) and `EmuDevice`'s `Device::launch`, unsafe by the trait's contract.
//!
//! It does not own the kernels' arguments or launch configuration (`kvlayout-device` does),
//! op validation (the `kvlayout` crate's checks), or GPUs.
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
pub mod model;
pub mod traffic;

pub use device::{EmuBuffer, EmuDevice, EmuError};
pub use ffi::{kernel_decode, kernel_encode, kernel_param_layout};
pub use traffic::{LaunchTraffic, TrafficKind, TrafficReport};

use kvlayout_device::DeviceBackend;

/// The kernel sources under the emulator with warps of `warp` threads (32: the CUDA build, 64:
/// the HIP build) as a device backend: the code path of the CUDA and HIP backends, from
/// argument blocks to pinned host caches. Another width is refused.
pub fn emu(warp: u32) -> Result<DeviceBackend<EmuDevice>, EmuError> {
    EmuDevice::new(warp).map(DeviceBackend::new)
}

/// The CUDA kernel build under the emulator (warps of 32), threads resumed in thread order.
pub fn cuda_emu() -> DeviceBackend<EmuDevice> {
    DeviceBackend::new(EmuDevice::new(32).expect("the emulator has a build with warps of 32"))
}

/// The HIP kernel build under the emulator (wavefronts of 64), each block's threads resumed
/// in a fixed pseudo-random order ([`HIP_EMU_SEED`]), so a kernel that depends on the order
/// of its threads differs from `cuda-emu`.
pub fn hip_emu() -> DeviceBackend<EmuDevice> {
    let dev = EmuDevice::new(64).expect("the emulator has a build with warps of 64");
    DeviceBackend::new(dev.with_seed(HIP_EMU_SEED))
}

/// The order [`hip_emu`] resumes each block's threads in.
pub const HIP_EMU_SEED: u64 = 0x5eed;
