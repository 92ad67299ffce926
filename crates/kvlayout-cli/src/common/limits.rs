//! The bounds of the numeric flags several commands share: `--threads`, `--runs` and the GiB
//! caps (`--max-gib`, `--max-cache-gib`). One check each, so a value past its bound is the same
//! one `error:` line (naming the flag, the value and the bound) in every command, before
//! anything is allocated or started. It does not own any command's other checks.

use crate::CliError;

/// The most threads `--threads` may ask for: more only oversubscribes the cores, and thread
/// creation itself would take minutes.
pub(crate) const MAX_THREADS: usize = 1024;

/// The most timed runs `--runs` may ask for.
pub(crate) const MAX_RUNS: usize = 10_000;

/// `--threads N` as the backends' pool option: `None` (every core) for 0 or a flag not given,
/// `Some(n)` for 1 to [`MAX_THREADS`]; above it, refused.
pub(crate) fn threads(n: Option<usize>) -> Result<Option<usize>, CliError> {
    match n {
        None | Some(0) => Ok(None),
        Some(n) if n > MAX_THREADS => Err(CliError::Usage(format!(
            "--threads {n} is more than {MAX_THREADS} (0 means every core)"
        ))),
        Some(n) => Ok(Some(n)),
    }
}

/// `--runs N`: 1 to [`MAX_RUNS`], else refused.
pub(crate) fn runs(n: usize) -> Result<usize, CliError> {
    if (1..=MAX_RUNS).contains(&n) {
        Ok(n)
    } else {
        Err(CliError::Usage(format!(
            "--runs {n} is not between 1 and {MAX_RUNS}"
        )))
    }
}

/// A GiB cap given as `flag` (`--max-gib`, `--max-cache-gib`): a finite positive number, else
/// refused (NaN, infinities, 0 and negatives).
pub(crate) fn gib(flag: &str, value: f64) -> Result<f64, CliError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(CliError::Usage(format!(
            "{flag} {value} must be a positive number"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_zero_is_every_core_and_the_bound_is_inclusive() {
        assert_eq!(threads(None).ok(), Some(None));
        assert_eq!(threads(Some(0)).ok(), Some(None));
        assert_eq!(threads(Some(3)).ok(), Some(Some(3)));
        assert_eq!(threads(Some(MAX_THREADS)).ok(), Some(Some(MAX_THREADS)));
        let e = threads(Some(MAX_THREADS + 1)).expect_err("refused");
        assert!(e.to_string().contains("1024"), "{e}");
    }

    #[test]
    fn runs_are_between_one_and_the_bound() {
        assert!(runs(0).is_err());
        assert_eq!(runs(1).ok(), Some(1));
        assert_eq!(runs(MAX_RUNS).ok(), Some(MAX_RUNS));
        assert!(runs(MAX_RUNS + 1).is_err());
    }

    #[test]
    fn gib_caps_are_finite_and_positive() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -1.0] {
            let e = gib("--max-gib", bad).expect_err("refused");
            assert!(e.to_string().contains("--max-gib"), "{e}");
        }
        assert_eq!(gib("--max-gib", 0.5).ok(), Some(0.5));
    }
}
