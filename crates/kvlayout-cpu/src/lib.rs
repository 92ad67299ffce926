//! # kvlayout-cpu: the CPU backend
//!
//! This crate owns the execution of the backend contract (`kvlayout::ops`) on host memory:
//! `write_kv`, `paged_decode`, `copy_blocks`, `swap_blocks`, `gather_blocks` /
//! `scatter_blocks` and `convert`, for every layout the descriptor can express. It has two
//! implementations: [`mod@reference`], scalar and written for clarity (f64 accumulation), and
//! [`CpuBackend`], the fast path (SIMD with runtime detection, rayon threads). Both address
//! memory only through the layout's field maps; neither computes a stride from a shape.
//!
//! It does not own layouts (the `kvlayout` crate does), device memory, or transfers.

#![warn(missing_docs)]

pub mod args;
mod backend;
pub mod bench;
pub mod cache;
mod copy;
mod decode;
pub mod elem;
#[cfg(all(test, unix))]
mod guard;
pub(crate) mod hostbuf;
mod quant;
pub mod reference;
mod simd;
pub mod tensor;
pub mod tolerance;
mod write;

pub use args::{Decode, WriteKv};
pub use backend::CpuBackend;
pub use cache::{CacheMut, CacheRef, HostCache};
pub use kvlayout::ops::{DecodeParams, OpError};
pub use simd::PrefetchLevel;
pub use tensor::Activations;
pub use tolerance::{Magnitude, Tolerance};
