//! One step of the demo as it is reported: what it did (one line), the bytes it handled, its
//! time, and, for a step that moves data, its bandwidth against the multi-threaded memcpy
//! bound of `kvlayout bench` (`kvlayout_cpu::bench::MemcpyBound`, every thread of a pool of
//! this machine's cores copying its share) measured right after it in the same run.
//!
//! It owns the memcpy bound and the step's line and JSON record; it does not run any step.

use kvlayout_cpu::bench::MemcpyBound;
use serde::Serialize;

use crate::CliError;

/// Timed passes of the memcpy bound; the best is kept.
const MEMCPY_RUNS: usize = 3;

/// Most bytes one pass of the memcpy bound copies (its two buffers take twice this): a
/// bandwidth, measured on the step's bytes or this many, whichever is fewer.
pub(crate) const MAX_BOUND_BYTES: u64 = 256 << 20;

/// The memcpy bound: a pool of one thread per core, as `kvlayout bench` uses.
pub(crate) struct Bound {
    pool: rayon::ThreadPool,
}

impl Bound {
    pub(crate) fn new() -> Result<Bound, CliError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .build()
            .map_err(|e| CliError::Failed(format!("memcpy bound: thread pool: {e}")))?;
        Ok(Bound { pool })
    }

    /// Threads of the pool.
    pub(crate) fn threads(&self) -> usize {
        self.pool.current_num_threads().max(1)
    }

    /// GB/s of the fastest of [`MEMCPY_RUNS`] passes over `bytes` (at most
    /// [`MAX_BOUND_BYTES`]) split over the pool's threads, the buffers touched first.
    pub(crate) fn gb_s(&self, bytes: u64) -> Result<f64, CliError> {
        let n = bytes.clamp(64, MAX_BOUND_BYTES) as usize;
        let per_thread = (n / self.threads()).max(64);
        let mut memcpy = MemcpyBound::new(&self.pool, per_thread)?;
        memcpy.pass(&self.pool); // first touch
        let best = (0..MEMCPY_RUNS)
            .map(|_| memcpy.pass(&self.pool))
            .fold(f64::INFINITY, f64::min)
            .max(1e-9);
        Ok(memcpy.bytes() as f64 / best / 1e9)
    }
}

/// A reported step.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Step {
    /// `write_kv`, `handshake`, `check`, `plan`, `transfer`, `receive`, `decode`, `verify`.
    pub step: &'static str,
    /// The line printed for it (without the step's name).
    pub line: String,
    /// Bytes the step handled (see each step's line for which).
    pub bytes: u64,
    /// Descriptors (byte runs) on each side, for the steps that have them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub descriptors: Option<u64>,
    /// Wall time of the step, in milliseconds.
    pub ms: f64,
    /// `bytes` over the time, in GB/s (10^9 bytes per second); `None` (null) for a step that
    /// moves no data (handshake, check, plan, verify).
    pub gb_s: Option<f64>,
    /// The memcpy bound measured right after the step, in GB/s; `None` where `gb_s` is.
    pub memcpy_gb_s: Option<f64>,
    /// `gb_s / memcpy_gb_s`; `None` where `gb_s` is.
    pub of_memcpy: Option<f64>,
    /// What else the step found, by name.
    pub detail: serde_json::Value,
}

impl Step {
    /// A step that moved `bytes` in `seconds`, with the memcpy bound measured now.
    pub(crate) fn moved(
        step: &'static str,
        line: String,
        bytes: u64,
        seconds: f64,
        detail: serde_json::Value,
        bound: &Bound,
    ) -> Result<Step, CliError> {
        let mut s = Step::still(step, line, bytes, seconds, detail);
        let gb_s = bytes as f64 / seconds.max(1e-9) / 1e9;
        let memcpy_gb_s = bound.gb_s(bytes)?;
        s.gb_s = Some(gb_s);
        s.memcpy_gb_s = Some(memcpy_gb_s);
        s.of_memcpy = Some(gb_s / memcpy_gb_s);
        Ok(s)
    }

    /// A step that handled `bytes` in `seconds` but moved no data: no bandwidth.
    pub(crate) fn still(
        step: &'static str,
        line: String,
        bytes: u64,
        seconds: f64,
        detail: serde_json::Value,
    ) -> Step {
        Step {
            step,
            line,
            bytes,
            descriptors: None,
            ms: seconds.max(1e-9) * 1e3,
            gb_s: None,
            memcpy_gb_s: None,
            of_memcpy: None,
            detail,
        }
    }

    pub(crate) fn with_descriptors(mut self, n: u64) -> Step {
        self.descriptors = Some(n);
        self
    }

    /// `name  line; B bytes in T ms = G GB/s, R x memcpy (M GB/s)`, or `-` for the
    /// bandwidth of a step that moves no data.
    pub(crate) fn to_text(&self, threads: usize) -> String {
        let rate = match (self.gb_s, self.of_memcpy, self.memcpy_gb_s) {
            (Some(g), Some(r), Some(m)) => {
                format!("{g:.2} GB/s, {r:.2} x memcpy ({m:.2} GB/s, {threads} threads)")
            }
            _ => "- GB/s, - x memcpy (no data moved)".to_string(),
        };
        format!(
            "{:<9} {}; {} in {:.3} ms = {rate}\n",
            self.step,
            self.line,
            size(self.bytes),
            self.ms,
        )
    }
}

/// Bytes as `12.50 MiB (13107200 B)`, or `840 B`.
pub(crate) fn size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB ({bytes} B)", bytes as f64 / KIB),
        _ => format!("{:.2} MiB ({bytes} B)", bytes as f64 / KIB / KIB),
    }
}
