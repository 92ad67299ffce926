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

/// The CPU backend: SIMD kernels (runtime-detected) on a rayon pool.
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
