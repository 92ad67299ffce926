//! # kvlayout-hip: the kvlayout backend contract on AMD GPUs
//!
//! This crate owns the HIP side of the contract: [`HipDevice`], the
//! [`Device`](kvlayout_device::Device) of one AMD GPU through the HIP runtime (`libamdhip64`,
//! via `hip-sys`) — allocations in device and pinned host memory, copies, events, and launches
//! of the project's kernels from code objects compiled at build time by `scripts/kernels.sh`
//! (clang-19, `kernels-hip/src/kvlayout.hip`) and embedded with their SHA-256
//! ([`code_objects`]: gfx90a and gfx942 wave64, gfx1100 wave32). [`hip`] is the
//! [`Backend`](kvlayout::ops::Backend) of a device.
//!
//! It does not validate ops, choose launches, build argument blocks or plan block moves:
//! [`DeviceBackend`](kvlayout_device::DeviceBackend) does that once for every device, from the
//! descriptor. It does not compile kernels at run time, and it does not read
//! `hipDeviceProp_t` (whose layout differs between ROCm versions): the device's ISA is found
//! by which code object the runtime loads. All `unsafe` is in one private module, each block
//! with its justification; every runtime failure is a typed [`HipError`] naming the call and
//! the runtime's error.
//!
//! ```
//! use kvlayout::ops::Backend;
//!
//! match kvlayout_hip::hip(0) {
//!     Ok(backend) => {
//!         let loaded = backend.device().code_object();
//!         println!("hip: {} (wave{})", loaded.arch, loaded.wavefront_size);
//!         let layout: kvlayout::KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND".parse()?;
//!         let shapes = kvlayout::ops::BufferShape::exact(&layout);
//!         let cache = backend.alloc_cache(&layout, &shapes)?;
//!         assert_eq!(cache.buffers().len(), layout.num_buffers());
//!     }
//!     Err(e) => println!("skipped: hip: {e}"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Runtimes
//!
//! The code objects are code object v5, which needs a ROCm runtime that loads it (ROCm 5.5
//! or later; gfx942 needs ROCm 5.7 or later). Debian bookworm's `libamdhip64` (ROCm 5.2) links
//! and serves the no-device path only. A GPU fault in a kernel is reported by the runtime at
//! the next wait ([`HipError::Call`] of `hipEventSynchronize` or `hipStreamSynchronize`) where
//! the runtime does not abort the process itself, as ROCm's does on a memory access fault.

#![warn(missing_docs)]
#![deny(unsafe_code)]

mod code_objects;
mod device;
mod error;
#[allow(unsafe_code)]
mod ffi;

pub use code_objects::{code_objects, why_not_embedded, CodeObject};
pub use device::{hip, HipBuffer, HipDevice, HipEvent};
pub use error::{CodeObjectRefusal, HipCallError, HipError};
