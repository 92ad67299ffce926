//! # kvlayout-cpu: the CPU backend
//!
//! **Which API to use.** To run the ops, use [`Host`] through the contract's
//! [`Backend`](kvlayout::ops::Backend) trait: [`Host::cpu`] allocates the cache, takes
//! [`HostTensor`](kvlayout::ops::HostTensor)s and runs the CPU backend, and the same calls run
//! every backend, including one a program picks by name at run time
//! (`kvlayout_backends::open("cpu")`, `"cuda"`, `"hip"`). To run on memory you own, without a
//! copy (your own `Vec<u8>`s, a mapped file, an engine's pages), use the executor under it:
//! [`CpuBackend`] through [`HostExec`], on a [`CacheMut`] / [`CacheRef`] checked over your byte
//! slices, with [`WriteKv`] and [`Decode`] (the contract's `WriteArgs` and `DecodeArgs` over
//! borrowed [`Activations`]); [`CpuBackend`]'s docs show it. `CpuBackend` is an executor, not a
//! `Backend`: `Host::cpu` wraps one into a `Backend`.
//!
//! ```
//! use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor, WriteArgs};
//! use kvlayout::{DType, KvCacheLayout};
//!
//! let layout: KvCacheLayout = "kv L=1 B=3 N=16 H=4 D=8 dtype=f32 order=LBHNC".parse()?;
//! let be = kvlayout_cpu::Host::cpu("cpu", None);
//! let mut cache = be.alloc_cache(&layout, &BufferShape::exact(&layout))?;
//! // Two tokens at slots 32 and 33 (block 2, offsets 0 and 1), `[tokens, heads, D]`:
//! // keys zero, values 100 * token + 10 * head + d.
//! let key = be.upload_tensor(&HostTensor::F32(vec![0.0; 2 * 4 * 8]))?;
//! let v: Vec<f32> = (0..64).map(|i| (100 * (i / 32) + 10 * (i / 8 % 4) + i % 8) as f32).collect();
//! let value = be.upload_tensor(&HostTensor::F32(v))?;
//! let w = WriteArgs { layer: 0, key: &key, value: Some(&value), slot_mapping: &[32, 33] };
//! be.wait(be.write_kv(&mut cache, &w)?)?;
//! // One sequence of those 2 tokens (block table `[2]`), 4 query heads: equal keys weigh
//! // both tokens 1/2, so each output row is the mean of the two value rows.
//! let query = be.upload_tensor(&HostTensor::F32(vec![1.0; 4 * 8]))?;
//! let mut out = be.alloc_tensor(DType::F32, 4 * 8)?;
//! let params = DecodeParams { num_q_heads: 4, scale: 1.0, sliding_window: None, soft_cap: None };
//! let d = DecodeArgs {
//!     layer: 0, query: &query, block_table: &[2], blocks_per_seq: 1, seq_lens: &[2], params,
//! };
//! be.wait(be.paged_decode(&cache, &d, &mut out)?)?;
//! let out = be.download_tensor(&out)?.to_f32();
//! let want: Vec<f32> = (0..32).map(|i| (50 + 10 * (i / 8) + i % 8) as f32).collect();
//! assert_eq!(out, want);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
//! the `bench` feature, which also has the build script compile the decode bench's C peer;
//! without it the crate builds with no C compiler).
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
