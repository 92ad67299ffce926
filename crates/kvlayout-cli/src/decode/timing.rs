//! Timing the decode step: each run paired with a pass of the read bound, after the paged
//! bound is measured.

use kvlayout_cpu::bench::{paired, Paired, ReadBound};

use crate::CliError;

/// The pool the read bound runs on: `threads` threads (every core when `None`).
pub(super) fn bound_pool(threads: Option<usize>) -> Result<rayon::ThreadPool, CliError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .map_err(|e| CliError::Failed(format!("the read bound's threads: {e}")))
}

/// Timed runs of the step and their bounds.
pub(super) struct Timed {
    pub(super) pair: Paired,
    pub(super) paged_bound: f64,
}

/// Times `runs` steps of `kv_bytes`, each paired with a pass of the sequential read bound,
/// after measuring the paged bound.
pub(super) fn time_steps(
    pool: &rayon::ThreadPool,
    bound_per_thread: usize,
    runs: usize,
    kv_bytes: u64,
    mut step: impl FnMut() -> Result<(), CliError>,
) -> Result<Timed, CliError> {
    let bound = ReadBound::new(pool, bound_per_thread)?;
    bound.pass(pool); // first touch
    let paged_bound = bound.paged_fraction(pool, 3);
    let mut failed = None;
    let pair = paired(
        runs,
        bound.bytes() as f64,
        || bound.pass(pool),
        kv_bytes as f64,
        || {
            if let Err(e) = step() {
                failed = Some(e);
            }
        },
    );
    match failed {
        Some(e) => Err(e),
        None => Ok(Timed { pair, paged_bound }),
    }
}
