//! # kvlayout-backends: a backend chosen by name at run time
//!
//! **The way in for a program that runs the ops.** [`open`] a backend by name (`cpu` unless
//! the program is told otherwise) and drive it through the contract's
//! [`Backend`](kvlayout::ops::Backend) trait: allocate a cache of a layout, upload
//! [`HostTensor`](kvlayout::ops::HostTensor)s, `write_kv`, `paged_decode`, wait, download.
//! The same calls run the CPU backend, the scalar reference, the emulators, CUDA and HIP. To
//! run a CPU backend on memory the program owns, without a copy, [`open_executor`] gives the
//! host executor itself ([`Executor::Host`]), which runs on a [`kvlayout_cpu::CacheMut`] over
//! the program's buffers (`kvlayout_cpu::CpuBackend`'s docs show that path). The example
//! `examples/cpu_decode.rs` runs a decode either way in and checks it against the scalar
//! reference (`cargo run -p kvlayout-backends --example cpu_decode -- [backend]`).
//!
//! ```
//! use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor, WriteArgs};
//! use kvlayout::{DType, KvCacheLayout};
//!
//! let be = kvlayout_backends::open("cpu")?;
//! let layout: KvCacheLayout = "kv L=2 B=3 N=16 H=4 D=8 dtype=bf16 order=LBHNC".parse()?;
//! let mut cache = be.alloc_cache(&layout, &BufferShape::exact(&layout))?;
//! // One token into layer 1 at slot 37 (block 2, offset 5), `[tokens, heads, D]`.
//! let v: Vec<f32> = (0..4 * 8).map(|i| i as f32).collect();
//! let key = be.upload_tensor(&HostTensor::from_f32(DType::Bf16, &[0.5; 32])?)?;
//! let value = be.upload_tensor(&HostTensor::from_f32(DType::Bf16, &v)?)?;
//! let w = WriteArgs { layer: 1, key: &key, value: Some(&value), slot_mapping: &[37] };
//! be.wait(be.write_kv(&mut cache, &w)?)?;
//! // The bytes of layer 1, block 2, head 3, token 5, d 0: where the layout puts V.
//! let at = layout.offset(&kvlayout::Coord::new(kvlayout::Field::V, 1, 2, 3, 5, 0))?;
//! let bytes = &be.download_cache(&cache)?[at.buffer as usize][at.offset as usize..][..2];
//! assert_eq!(u16::from_le_bytes([bytes[0], bytes[1]]), 0x41C0); // bf16 24.0 = 3 * 8 + 0
//! // A sequence of 6 tokens in block 2: its last token (index 5) is the one written, the others
//! // are zero keys and values.
//! let query = be.upload_tensor(&HostTensor::F32(vec![1.0; 4 * 8]))?;
//! let mut out = be.alloc_tensor(DType::F32, 4 * 8)?;
//! let params = DecodeParams { num_q_heads: 4, scale: 0.25, sliding_window: Some(1), soft_cap: None };
//! let d = DecodeArgs {
//!     layer: 1, query: &query, block_table: &[2], blocks_per_seq: 1, seq_lens: &[6], params,
//! };
//! be.wait(be.paged_decode(&cache, &d, &mut out)?)?;
//! // A window of 1 token attends only to the last: the output is its value rows.
//! assert_eq!(be.download_tensor(&out)?.to_f32(), v);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! This crate owns the names of the backends and opening one by name: [`open`] gives an
//! [`AnyBackend`] (the contract's `Backend`, whatever backend is inside), or why that
//! backend cannot run here. [`names`] lists every backend this build has, in report order, as
//! the conformance suite and `kvlayout decode --backend` take them.
//!
//! | name | backend |
//! |---|---|
//! | `cpu` | the CPU backend, the kernel build it picks for this machine |
//! | `cpu:<build>` | the CPU backend running `avx512-bf16`, `avx512`, `avx2` or `scalar` |
//! | `cpu:<build>:prefetch-L1`, `cpu:<build>:prefetch-L2` | that build, tiles and moves arranged for rows prefetched to L1 or L2 |
//! | `reference` | the scalar reference (f64 accumulation) |
//! | `cuda-emu` | the CUDA kernels under the host emulator (warps of 32), behind the device backend |
//! | `hip-emu` | the HIP kernels under the host emulator (wavefronts of 64), threads in a seeded order |
//! | `cuda`, `cuda:<n>` | the CUDA backend on device `n` (0) |
//! | `hip`, `hip:<n>` | the HIP backend on device `n` (0) |
//!
//! [`open_executor`] gives the same backends by where their memory lives: an executor on
//! host memory ([`Executor::Host`], the `cpu` and `reference` names) runs on buffers the
//! caller owns without a copy; the others ([`Executor::Device`]) allocate their own.
//!
//! It does not own any backend (each crate does), the contract (`kvlayout::ops`), or the
//! type-erased handle ([`AnyBackend`], in `kvlayout::ops`).
//!
//! ```
//! use kvlayout::ops::Backend;
//! let be = kvlayout_backends::open("reference")?;
//! assert_eq!(be.name(), "reference");
//! let err = kvlayout_backends::open("cpu:sse9").unwrap_err();
//! assert!(err.to_string().starts_with("cpu:sse9: "));
//! # Ok::<(), kvlayout_backends::OpenError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use kvlayout::ops::AnyBackend;
use kvlayout_cpu::{CpuBackend, Host, HostExec, PrefetchLevel, ScalarReference};
use thiserror::Error;

pub use kvlayout::ops::{AnyCache, AnyCompletion, AnyTensor};

/// The forms of a backend name, for messages.
pub const NAME_FORMS: &str = "cpu, cpu:<build>, cpu:<build>:prefetch-L1|prefetch-L2, reference, \
                              cuda-emu, hip-emu, cuda[:<n>], hip[:<n>]";

/// Why a backend was not opened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OpenError {
    /// A name that is no backend.
    #[error("{name:?} is not a backend name (names: {NAME_FORMS})")]
    Unknown {
        /// The name given.
        name: String,
    },
    /// A backend that cannot run here: no device, no driver, a kernel build the CPU lacks.
    #[error("{name}: {reason}")]
    Unavailable {
        /// The name given.
        name: String,
        /// Why not.
        reason: String,
    },
}

/// How to open a backend beyond its name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Threads of the CPU backend's pool (`None`: one per core); other backends ignore it.
    pub threads: Option<usize>,
}

/// The backend `name` (see the crate docs for the names), with default [`Options`]: the
/// way in for a program that runs the ops (the crate docs show one).
///
/// ```
/// use kvlayout::ops::Backend;
/// // The backend a program was told to use (an argument, say), the CPU backend by default.
/// let told: Option<&str> = None;
/// let be = kvlayout_backends::open(told.unwrap_or("cpu"))?;
/// assert_eq!(be.name(), "cpu");
/// assert_eq!(kvlayout_backends::open("reference")?.kernels().build, "reference");
/// # Ok::<(), kvlayout_backends::OpenError>(())
/// ```
pub fn open(name: &str) -> Result<AnyBackend, OpenError> {
    open_with(name, &Options::default())
}

/// The backend `name` with `options`.
pub fn open_with(name: &str, options: &Options) -> Result<AnyBackend, OpenError> {
    Ok(match open_executor(name, options)? {
        Executor::Host { name, exec } => AnyBackend::new(Host::new(name, exec)),
        Executor::Device(be) => be,
    })
}

/// A host executor that any thread may run.
pub type HostExecutor = Box<dyn HostExec + Send + Sync>;

/// A backend by where its memory lives.
pub enum Executor {
    /// An executor on host memory (`cpu...`, `reference`): it runs on buffers the caller
    /// owns ([`kvlayout_cpu::CacheMut`]), without a copy.
    Host {
        /// The name it was opened by.
        name: String,
        /// The executor.
        exec: HostExecutor,
    },
    /// A backend with memory of its own (the emulators, CUDA, HIP): caches and tensors are
    /// allocated by it and copied in and out.
    Device(AnyBackend),
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Executor::Host { name, .. } => write!(f, "Executor::Host({name})"),
            Executor::Device(be) => write!(f, "Executor::Device({be:?})"),
        }
    }
}

/// The backend `name` with `options`, as an [`Executor`]: host executors are given as such,
/// so a caller can run them on its own memory.
///
/// ```
/// use kvlayout_backends::{open_executor, Executor, Options};
/// use kvlayout_cpu::{Activations, CacheMut, WriteKv};
///
/// let layout: kvlayout::KvCacheLayout = "kv L=1 B=2 N=16 H=1 D=8 dtype=f32 order=LBNHC".parse()?;
/// // The program's own memory, one buffer per buffer of the layout.
/// let mut bufs: Vec<Vec<u8>> =
///     layout.extents().iter().map(|x| vec![0u8; x.end as usize]).collect();
/// let Executor::Host { exec, .. } = open_executor("cpu", &Options { threads: Some(1) })? else {
///     unreachable!("cpu runs on host memory")
/// };
/// let k: Vec<f32> = (0..8).map(|d| d as f32).collect();
/// let w = WriteKv {
///     layer: 0,
///     key: Activations::F32(&k),
///     value: Some(Activations::F32(&k)),
///     slot_mapping: &[16], // block 1, token 0
/// };
/// exec.write_kv(&mut CacheMut::new(&layout, bufs.iter_mut().map(|b| &mut b[..]).collect())?, &w)?;
/// let at = layout.offset(&kvlayout::Coord::new(kvlayout::Field::K, 0, 1, 0, 0, 7))?;
/// let bytes = &bufs[at.buffer as usize][at.offset as usize..][..4];
/// assert_eq!(f32::from_le_bytes(bytes.try_into()?), 7.0);
/// // A device backend has memory of its own.
/// assert!(matches!(open_executor("cuda-emu", &Options::default())?, Executor::Device(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open_executor(name: &str, options: &Options) -> Result<Executor, OpenError> {
    let unknown = || OpenError::Unknown {
        name: name.to_string(),
    };
    let unavailable = |reason: String| OpenError::Unavailable {
        name: name.to_string(),
        reason,
    };
    let host = |exec: HostExecutor| Executor::Host {
        name: name.to_string(),
        exec,
    };
    let mut parts = name.split(':');
    let kind = parts.next().unwrap_or_default();
    let rest: Vec<&str> = parts.collect();
    let be = match (kind, rest.as_slice()) {
        ("cpu", []) => host(Box::new(CpuBackend::new(options.threads))),
        ("cpu", [build, more @ ..]) => {
            // The name is read whole before a build is tried: a malformed name is unknown on
            // every machine.
            let level = match more {
                [] => None,
                [arrangement] => Some(prefetch_level(arrangement).ok_or_else(unknown)?),
                _ => return Err(unknown()),
            };
            let be = CpuBackend::with_kernels(options.threads, build).map_err(|e| match e {
                kvlayout::ops::OpError::Unsupported { reason, .. } => unavailable(reason),
                other => unavailable(other.to_string()),
            })?;
            let be = match level {
                Some(level) => be.with_prefetch_level(level),
                None => be,
            };
            host(Box::new(be))
        }
        ("reference", []) => host(Box::new(ScalarReference)),
        ("cuda-emu", []) => Executor::Device(AnyBackend::new(kvlayout_emu::cuda_emu()).named(name)),
        ("hip-emu", []) => Executor::Device(AnyBackend::new(kvlayout_emu::hip_emu()).named(name)),
        ("cuda", _) => {
            let ordinal = ordinal(&rest).ok_or_else(unknown)?;
            let be = kvlayout_cuda::cuda(ordinal).map_err(|e| unavailable(e.to_string()))?;
            Executor::Device(AnyBackend::new(be).named(format!("cuda:{ordinal}")))
        }
        ("hip", _) => {
            let ordinal = ordinal(&rest).ok_or_else(unknown)?;
            let be = kvlayout_hip::hip(ordinal).map_err(|e| unavailable(e.to_string()))?;
            Executor::Device(AnyBackend::new(be).named(format!("hip:{ordinal}")))
        }
        _ => return Err(unknown()),
    };
    Ok(be)
}

/// The device ordinal of `cuda` / `cuda:<n>` (0 when absent).
fn ordinal(rest: &[&str]) -> Option<usize> {
    match rest {
        [] => Some(0),
        [n] => n.parse().ok(),
        _ => None,
    }
}

/// `prefetch-L1` or `prefetch-L2` (either case).
fn prefetch_level(arrangement: &str) -> Option<PrefetchLevel> {
    match arrangement.to_ascii_lowercase().as_str() {
        "prefetch-l1" => Some(PrefetchLevel::L1),
        "prefetch-l2" => Some(PrefetchLevel::L2),
        _ => None,
    }
}

/// Every backend of this build, in report order: `cpu`; the CPU backend on each other kernel
/// build this machine runs (`cpu:<build>`), and on the build it picks with its tiles and moves
/// arranged for the other prefetch level than this machine's; `reference`; `cuda-emu`,
/// `hip-emu`; `cuda:0`, `hip:0`. Some may not open here ([`open`] says why).
pub fn names() -> Vec<String> {
    let builds = CpuBackend::kernel_builds();
    let mut names = vec!["cpu".to_string()];
    names.extend(builds.iter().skip(1).map(|b| format!("cpu:{b}")));
    let other = PrefetchLevel::of_this_machine().other();
    names.push(format!("cpu:{}:prefetch-{other:?}", builds[0]));
    for n in ["reference", "cuda-emu", "hip-emu", "cuda:0", "hip:0"] {
        names.push(n.to_string());
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlayout::ops::Backend;

    /// Every listed name opens here or says why not; the ones that need no device always open,
    /// under the name given.
    #[test]
    fn every_name_opens_or_says_why() {
        for name in names() {
            match open_with(&name, &Options { threads: Some(1) }) {
                Ok(be) => assert_eq!(be.name(), name),
                Err(OpenError::Unavailable { name: n, reason }) => {
                    assert!(
                        n.starts_with("cuda") || n.starts_with("hip"),
                        "{n}: {reason}"
                    );
                    println!("skipped: {n}: {reason}");
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
        // `cuda` is device 0, reported as `cuda:0` where it opens.
        match open("cuda") {
            Ok(be) => assert_eq!(be.name(), "cuda:0"),
            Err(e) => {
                assert!(matches!(e, OpenError::Unavailable { ref name, .. } if name == "cuda"))
            }
        }
    }

    /// Malformed names are unknown; a build the CPU cannot run is unavailable, with why.
    #[test]
    fn bad_names_are_refused_by_kind() {
        // The name is read before a build is tried, so a malformed name with a build this
        // machine lacks is unknown too.
        for name in [
            "",
            "gpu",
            "cpu:scalar:prefetch-L3",
            "cpu:avx512-bf16:prefetch-L3",
            "cpu:scalar:prefetch-L1:x",
            "cuda:x",
            "cuda:0:1",
            "reference:1",
            "hip-emu:2",
        ] {
            assert_eq!(
                open(name).unwrap_err(),
                OpenError::Unknown { name: name.into() },
                "{name:?}"
            );
        }
        match open("cpu:sse9").unwrap_err() {
            OpenError::Unavailable { name, reason } => {
                assert_eq!(name, "cpu:sse9");
                assert!(reason.contains("sse9"), "{reason}");
                assert!(
                    !reason.contains("does not apply"),
                    "the reason alone: {reason}"
                );
            }
            other => panic!("{other}"),
        }
    }
}
