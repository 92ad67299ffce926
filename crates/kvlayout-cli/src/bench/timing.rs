//! Timing one op of `kvlayout bench` against the bounds of the same run, and the progress
//! bar. The bounds are `kvlayout_cpu::bench`'s probes: memcpy of the op's bytes (each run of
//! the op right after a pass, `paired`), the streaming read (`ReadBound::pass`) and the paged
//! pattern (`ReadBound::chunked_pass`: pages of the layout's page size, rounded down to a
//! power of two, read in a fixed random order), the last two timed right after the op's runs.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvlayout_cpu::bench::{paired, MemcpyBound, ReadBound};

use super::OpRow;
use crate::CliError;

/// The read bound's buffers and the page the paged pattern reads.
pub(super) struct Bounds {
    read: ReadBound,
    page: usize,
}

impl Bounds {
    /// `mib` MiB per thread of `pool`, and pages of `page_bytes` (rounded down to a power of
    /// two between 4 KiB and 1 MiB).
    pub(super) fn new(
        pool: &rayon::ThreadPool,
        mib: usize,
        page_bytes: u64,
    ) -> Result<Self, CliError> {
        let per_thread = mib
            .checked_mul(1 << 20)
            .ok_or_else(|| CliError::Usage(format!("--bound-mib {mib} overflows")))?;
        let read = ReadBound::new(pool, per_thread)?;
        read.pass(pool); // first touch
        let floor = 1usize << (usize::BITS - 1 - (page_bytes.max(1) as usize).leading_zeros());
        // A power of two of at most 1 MiB divides a buffer of whole MiB.
        let page = floor.clamp(4096, 1 << 20);
        Ok(Bounds { read, page })
    }

    /// Bytes one read pass reads.
    pub(super) fn read_bytes(&self) -> u64 {
        self.read.bytes() as u64
    }

    /// Bytes of one page of the paged pattern.
    pub(super) fn page_bytes(&self) -> usize {
        self.page
    }
}

/// The median of `xs` (sorted here).
fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Times `op` (moving `bytes`) `runs` times, each run right after a memcpy pass of the same
/// bytes, then `runs` passes of the read bound and of the paged pattern; the row of the
/// medians.
pub(super) fn time_op(
    name: &'static str,
    bytes: u64,
    runs: usize,
    bounds: &Bounds,
    pool: &rayon::ThreadPool,
    mut op: impl FnMut() -> Result<(), CliError>,
) -> Result<OpRow, CliError> {
    let threads = pool.current_num_threads().max(1);
    let per_thread = (bytes as usize / threads).max(64);
    let mut memcpy = MemcpyBound::new(pool, per_thread)?;
    memcpy.pass(pool); // first touch
    let mut failed = None;
    let pair = paired(
        runs,
        memcpy.bytes() as f64,
        || memcpy.pass(pool),
        bytes as f64,
        || {
            if failed.is_none() {
                if let Err(e) = op() {
                    failed = Some(e);
                }
            }
        },
    );
    if let Some(e) = failed {
        return Err(e);
    }
    let mut read: Vec<f64> = (0..runs).map(|_| bounds.read.pass(pool)).collect();
    let mut paged: Vec<f64> = (0..runs)
        .map(|_| bounds.read.chunked_pass(pool, bounds.page))
        .collect();
    let read_bytes = bounds.read.bytes() as f64;
    let gb = |b: f64, s: f64| b / s / 1e9;
    let gb_s = gb(bytes as f64, pair.op_median);
    let memcpy_gb_s = pair.bound_median / 1e9;
    let read_gb_s = gb(read_bytes, median(&mut read));
    let paged_gb_s = gb(read_bytes, median(&mut paged));
    Ok(OpRow {
        op: name,
        skipped: None,
        bytes,
        runs,
        time_ms_median: pair.op_median * 1e3,
        time_ms_best: pair.op_best * 1e3,
        gb_s,
        memcpy_gb_s,
        read_gb_s,
        paged_gb_s,
        ratio_memcpy: gb_s / memcpy_gb_s,
        ratio_read: gb_s / read_gb_s,
        ratio_paged: gb_s / paged_gb_s,
    })
}

/// The progress bar on stderr: one step per op, drawn only once the bench has run for a
/// second, and never when stderr is not a terminal or the output is JSON.
pub(super) struct Progress {
    bar: ProgressBar,
}

/// How long the bench runs before its bar shows.
const SHOW_AFTER: Duration = Duration::from_secs(1);

impl Progress {
    pub(super) fn new(ops: usize, enabled: bool) -> Self {
        let bar = ProgressBar::with_draw_target(Some(ops as u64), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template("bench {bar:30} {pos}/{len} {msg}") {
            bar.set_style(style);
        }
        if enabled {
            let shown = bar.clone();
            let started = Instant::now();
            std::thread::spawn(move || {
                std::thread::sleep(SHOW_AFTER.saturating_sub(started.elapsed()));
                if !shown.is_finished() {
                    shown.set_draw_target(ProgressDrawTarget::stderr());
                    shown.enable_steady_tick(Duration::from_millis(200));
                }
            });
        }
        Progress { bar }
    }

    pub(super) fn start(&self, op: &str) {
        self.bar.set_message(op.to_string());
    }

    pub(super) fn done(&self) {
        self.bar.inc(1);
    }

    pub(super) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
