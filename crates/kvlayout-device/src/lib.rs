//! # kvlayout-device: the backend contract on any GPU runtime
//!
//! This crate owns what every executor of the project's GPU kernels shares: the kernels'
//! parameter structs (mirrored by `kernels-cuda/include/kvl_kernels.h`), the launch
//! configuration of each op chosen from the descriptor and the op's validated shape, the
//! launches with their argument blocks ([`kernels`]); the [`Device`] trait, what a runtime
//! offers (allocations, copies, launches, events); and [`DeviceBackend`], the
//! `kvlayout::ops::Backend` every `Device` gets from it. The CUDA and HIP backends and the host
//! emulator implement only `Device`.
//!
//! It does not own layouts, op arguments or their checks (the `kvlayout` crate does), a
//! runtime's calls (`kvlayout-cuda`, `kvlayout-hip`, `kvlayout-emu`), or host-memory
//! execution (`kvlayout-cpu`). No I/O: addresses are device addresses as `u64`. Its one unsafe
//! call is [`Device::launch`], in `DeviceBackend`'s launch of checked calls.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod device;
pub mod kernels;

pub use backend::{DeviceBackend, DeviceCache, DeviceCompletion, DeviceTensor, MAX_COPY_RUNS};
pub use device::{Device, Place};
