//! [`CpuBackend`]: its kernel build, prefetch arrangement and rayon pool. Its ops are
//! [`HostExec`](crate::HostExec)'s (`exec`), each run by its own module (`write`, `decode`,
//! `movers`); [`CpuBackend::new`] and the builds it chooses from are `decode::calibrate`'s.

use kvlayout::ops::OpError;

use crate::arch::{Isa, PrefetchLevel};
use crate::tolerance::Tolerance;

/// A rayon pool of `threads` threads (all cores when `None`; rayon's default pool if that
/// size cannot be had).
pub(crate) fn pool(threads: Option<usize>) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .unwrap_or_else(|_| {
            rayon::ThreadPoolBuilder::new()
                .build()
                .expect("default rayon pool")
        })
}

/// The CPU backend's executor: SIMD kernels (runtime-detected) on a rayon pool. It runs the
/// ops of [`HostExec`](crate::HostExec) on caches over memory the caller owns
/// ([`CacheMut`](crate::CacheMut), [`CacheRef`](crate::CacheRef)), without a copy. It does
/// not implement the contract's `Backend` trait: [`Host::cpu`](crate::Host::cpu) wraps one
/// into a `Backend`, which allocates its own caches (the crate docs say which to use when).
///
/// A bf16 cache in the caller's `Vec<u8>`s, one per buffer of the layout, each as long as its
/// extent. [`CacheMut::new`](crate::CacheMut::new) checks each buffer's length and its
/// alignment for the elements (2 bytes here), and refuses a buffer that falls short with a
/// typed error.
///
/// ```
/// use kvlayout::{Coord, Field, KvCacheLayout};
/// use kvlayout_cpu::reference::{paged_decode_magnitudes, value_at};
/// use kvlayout_cpu::tolerance::decode_error;
/// use kvlayout_cpu::{Activations, CacheMut, CacheRef, CpuBackend, Decode, DecodeParams};
/// use kvlayout_cpu::{HostExec, WriteKv};
///
/// let layout: KvCacheLayout = "kv L=1 B=3 N=16 H=4 D=8 dtype=bf16 order=LBHNC".parse()?;
/// let mut bufs: Vec<Vec<u8>> =
///     layout.extents().iter().map(|x| vec![0u8; x.end as usize]).collect();
/// let be = CpuBackend::new(None);
/// // 4 tokens, `[tokens, heads, D]`: sequence 0's 3 tokens in block 1 (slots 16, 17, 18),
/// // sequence 1's one token in block 2 (slot 32). Small integers: exact in bf16.
/// let key: Vec<f32> = (0..4 * 4 * 8).map(|i| (i % 7) as f32 - 3.0).collect();
/// let value: Vec<f32> = (0..4 * 4 * 8).map(|i| (i % 11) as f32).collect();
/// let mut cache = CacheMut::new(&layout, bufs.iter_mut().map(|b| &mut b[..]).collect())?;
/// let w = WriteKv {
///     layer: 0,
///     key: Activations::F32(&key),
///     value: Some(Activations::F32(&value)),
///     slot_mapping: &[16, 17, 18, 32],
/// };
/// be.write_kv(&mut cache, &w)?;
///
/// // The values now lie in the caller's buffers, where the layout puts them.
/// let cache = CacheRef::new(&layout, bufs.iter().map(|b| &b[..]).collect())?;
/// let v = value_at(&cache, &Coord::new(Field::V, 0, 2, 1, 0, 3)); // block 2, head 1, d 3
/// assert_eq!(v, f64::from(value[(3 * 4 + 1) * 8 + 3]));
///
/// // One decode step of both sequences, 4 query heads: `out` is `[seqs, heads, D]`.
/// let query: Vec<f32> = (0..2 * 4 * 8).map(|i| (i % 5) as f32 / 8.0).collect();
/// let params = DecodeParams {
///     num_q_heads: 4,
///     scale: 1.0 / 8f32.sqrt(),
///     sliding_window: None,
///     soft_cap: None,
/// };
/// let d = Decode {
///     layer: 0,
///     query: Activations::F32(&query),
///     block_table: &[1, 2],
///     blocks_per_seq: 1,
///     seq_lens: &[3, 1],
///     params,
/// };
/// let mut out = vec![0f32; 2 * 4 * 8];
/// be.paged_decode(&cache, &d, &mut out)?;
/// // Sequence 1 attends to its one token: its output rows are that token's value rows.
/// assert_eq!(out[32..], value[96..]);
/// // Both sequences lie within this build's tolerance of the scalar reference (f64).
/// let mut want = vec![0f32; out.len()];
/// let magnitudes = paged_decode_magnitudes(&cache, &d, &mut want)?;
/// let e = decode_error(&out, &want, &magnitudes, be.decode_tolerance(layout.dtype()));
/// assert!(e.passed(), "{e:?}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CpuBackend {
    pub(crate) pool: rayon::ThreadPool,
    /// Partial softmax states of split-context decode, kept across calls (no allocation per
    /// step once grown).
    pub(crate) decode_partials: std::sync::Mutex<Vec<f32>>,
    /// The kernel build this backend runs: the fastest this machine has, unless chosen.
    pub(crate) isa: Isa,
    /// Why it runs that build.
    pub(crate) why: String,
    /// The cache level rows are prefetched to, which sets the decode's tile length and the
    /// movers' order: this machine's unless chosen.
    pub(crate) prefetch: PrefetchLevel,
}

impl CpuBackend {
    /// A backend of one thread running `isa` (the start-up calibration times builds on it).
    pub(crate) fn single_thread(isa: Isa) -> Result<Self, rayon::ThreadPoolBuildError> {
        Ok(CpuBackend {
            pool: rayon::ThreadPoolBuilder::new().num_threads(1).build()?,
            decode_partials: std::sync::Mutex::new(Vec::new()),
            isa,
            why: "chosen by the caller".into(),
            prefetch: crate::arch::prefetch_level(),
        })
    }

    /// A backend that runs the kernel build named `kernels` (one of [`CpuBackend::kernel_builds`]):
    /// to compare builds, or to test one a machine would not pick. A build this machine cannot
    /// run, or an unknown name, is refused (`Unsupported`, with the reason).
    ///
    /// ```
    /// use kvlayout_cpu::CpuBackend;
    /// let be = CpuBackend::with_kernels(Some(1), "scalar")?;
    /// assert_eq!(be.kernel_build(), "scalar");
    /// assert!(CpuBackend::with_kernels(None, "sse9").is_err());
    /// # Ok::<(), kvlayout_cpu::OpError>(())
    /// ```
    pub fn with_kernels(threads: Option<usize>, kernels: &str) -> Result<Self, OpError> {
        let refuse = |reason: String| OpError::Unsupported {
            op: "kernels",
            reason,
        };
        let isa = Isa::named(kernels).map_err(refuse)?;
        isa.runs_here()
            .map_err(|why| refuse(format!("kernel build {kernels}: {why}")))?;
        Ok(CpuBackend {
            pool: pool(threads),
            decode_partials: std::sync::Mutex::new(Vec::new()),
            isa,
            why: "chosen by the caller".into(),
            prefetch: crate::arch::prefetch_level(),
        })
    }

    /// This backend with its decode tiles and large moves arranged for rows prefetched to
    /// `level` (by default the level of this machine's vendor: L2 on Intel, L1 elsewhere), so
    /// either arrangement can be tested or measured on any machine; the kernels' prefetch
    /// instructions follow it too.
    ///
    /// ```
    /// use kvlayout_cpu::{CpuBackend, PrefetchLevel};
    /// let be = CpuBackend::with_kernels(Some(1), "scalar")?.with_prefetch_level(PrefetchLevel::L2);
    /// assert_eq!(be.prefetch_level(), PrefetchLevel::L2);
    /// # Ok::<(), kvlayout_cpu::OpError>(())
    /// ```
    pub fn with_prefetch_level(mut self, level: PrefetchLevel) -> Self {
        self.prefetch = level;
        self
    }

    /// The level this backend arranges its decode tiles and large moves for.
    pub fn prefetch_level(&self) -> PrefetchLevel {
        self.prefetch
    }

    /// The kernel build this backend runs.
    pub fn kernel_build(&self) -> &'static str {
        self.isa.name()
    }

    /// Why this backend runs its kernel build: chosen by the caller, named by
    /// `KVLAYOUT_KERNELS`, the first build the CPU runs, or timed against the other AVX-512
    /// build at start-up (with the figures).
    pub fn kernel_choice(&self) -> &str {
        &self.why
    }

    /// How far this backend's `paged_decode` of a cache of `dtype` may lie from the scalar
    /// reference ([`crate::tolerance`]): bf16 products where its build multiplies bf16
    /// operands (`avx512-bf16` on bf16 and fp8 rows), f32 products otherwise. Within the
    /// contract's [`Tolerance::contract`] for every build.
    pub fn decode_tolerance(&self, dtype: kvlayout::DType) -> Tolerance {
        self.isa.decode_tolerance(dtype)
    }

    /// Threads in the pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The builds of the SIMD kernels this machine cannot run, each with the features it
    /// lacks: what neither the tests nor the benchmarks exercise here (suites report them as
    /// skipped).
    pub fn kernels_not_run() -> Vec<(&'static str, String)> {
        crate::arch::Isa::ALL
            .iter()
            .filter_map(|i| i.runs_here().err().map(|why| (i.name(), why)))
            .collect()
    }

    /// The pool (benchmarks measure their bounds on it).
    pub fn pool(&self) -> &rayon::ThreadPool {
        &self.pool
    }
}
