//! # kvlayout-cpu: the CPU backend
//!
//! This crate owns the execution of the backend contract (`kvlayout::ops`) on host memory:
//! `write_kv`, `paged_decode`, `copy_blocks`, `swap_blocks`, `gather_blocks` /
//! `scatter_blocks` and `convert`, for every layout the descriptor can express. It has two
//! executors of [`HostExec`]: [`ScalarReference`], scalar and written for clarity (f64
//! accumulation), and [`CpuBackend`], the fast path (SIMD with runtime detection, rayon
//! threads). Both take every address from the layout's field maps; neither computes a stride
//! from a shape. [`Host`] runs either behind the contract's `Backend` trait.
//!
//! Modules: `arch` (the CPU features used, [`CpuFeatures`], which `KVLAYOUT_CPU_HIDE` can
//! narrow; instruction sets; prefetch), `write`, `decode` (the plan, its rows, and
//! `decode::kernels`: dispatch, row kinds, the scalar, AVX2 and AVX-512 builds), `exec` (the
//! executor trait), `movers`
//! (executing `kvlayout::ops::MovePlan`), `quant` (row encoders), `cache` and `hostbuf`
//! (buffers), [`tolerance`], [`mod@reference`], [`host`], and `bench` (bandwidth bounds, behind
//! the `bench` feature).
//!
//! It does not own layouts or the contract (the `kvlayout` crate does), device memory, or
//! transfers.
//!
//! Unsafe code is allowed only in the modules that need it: the SIMD kernels and the CPU
//! feature probes (`decode::kernels`, `decode::src`, `arch::{features, isa, prefetch}`,
//! `quant`, `bench`), the raw writes of disjoint bytes by worker threads (`write`, `movers`),
//! and the buffers (`hostbuf`, `guard`). Each `unsafe` block and impl states why it holds.

#![warn(missing_docs)]
#![deny(unsafe_code)]

mod arch;
pub mod args;
mod backend;
#[cfg(feature = "bench")]
#[allow(unsafe_code)]
pub mod bench;
pub mod cache;
mod decode;
pub mod elem;
mod exec;
#[cfg(all(test, unix))]
#[allow(unsafe_code)]
mod guard;
pub mod host;
#[allow(unsafe_code)]
pub(crate) mod hostbuf;
#[allow(unsafe_code)]
mod movers;
#[allow(unsafe_code)]
mod quant;
pub mod reference;
pub mod tensor;
pub mod tolerance;
#[allow(unsafe_code)]
mod write;

pub use arch::{CpuFeatures, PrefetchLevel, UnknownFeature, HIDE_VAR as CPU_HIDE_VAR};
pub use args::{Decode, WriteKv};
pub use backend::CpuBackend;
pub use cache::{CacheMut, CacheRef, HostCache};
pub use exec::HostExec;
pub use host::{Host, HostBuffers, Ready};
pub use kvlayout::ops::{DecodeParams, OpError};
pub use reference::ScalarReference;
pub use tensor::Activations;
pub use tolerance::{Magnitude, Tolerance};
