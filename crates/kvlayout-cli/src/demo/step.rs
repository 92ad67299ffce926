//! One step of the demo as it is reported: what it did (one line), the bytes it handled, its
//! time, and its bandwidth against a memcpy of the same bytes measured right after it in the
//! same run.
//!
//! It owns the memcpy bound and the step's line and JSON record; it does not run any step.

use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;

/// Timed copies of the memcpy bound; the best is kept.
const MEMCPY_RUNS: usize = 3;

/// Seconds of the fastest of [`MEMCPY_RUNS`] copies of `bytes` bytes between two buffers
/// of this process (both touched first, so that no page fault is timed).
pub(crate) fn memcpy_seconds(bytes: u64) -> f64 {
    let n = usize::try_from(bytes).unwrap_or(usize::MAX).max(1);
    let src = vec![0x5au8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let mut best = f64::INFINITY;
    for _ in 0..MEMCPY_RUNS {
        let t = Instant::now();
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    best.max(1e-9)
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
    /// `bytes` over the time, in GB/s (10^9 bytes per second).
    pub gb_s: f64,
    /// A memcpy of `bytes` in this process, measured right after the step, in GB/s.
    pub memcpy_gb_s: f64,
    /// `gb_s / memcpy_gb_s`.
    pub of_memcpy: f64,
    /// What else the step found, by name.
    pub detail: serde_json::Value,
}

impl Step {
    /// A step that handled `bytes` in `seconds`, with its memcpy bound measured now.
    pub(crate) fn new(
        step: &'static str,
        line: String,
        bytes: u64,
        seconds: f64,
        detail: serde_json::Value,
    ) -> Step {
        let seconds = seconds.max(1e-9);
        let gb_s = bytes as f64 / seconds / 1e9;
        let memcpy_gb_s = bytes as f64 / memcpy_seconds(bytes) / 1e9;
        Step {
            step,
            line,
            bytes,
            descriptors: None,
            ms: seconds * 1e3,
            gb_s,
            memcpy_gb_s,
            of_memcpy: gb_s / memcpy_gb_s,
            detail,
        }
    }

    pub(crate) fn with_descriptors(mut self, n: u64) -> Step {
        self.descriptors = Some(n);
        self
    }

    /// `name  line; B bytes in T ms = G GB/s, R x memcpy (M GB/s)`.
    pub(crate) fn to_text(&self) -> String {
        format!(
            "{:<9} {}; {} in {:.3} ms = {:.2} GB/s, {:.2} x memcpy of the same bytes ({:.2} GB/s)\n",
            self.step,
            self.line,
            size(self.bytes),
            self.ms,
            self.gb_s,
            self.of_memcpy,
            self.memcpy_gb_s
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
