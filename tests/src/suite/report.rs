//! Tallies of checks per backend ([`Report`], each failure with its op and the layouts it
//! was on), and their report in the CI log.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::backend::{AnyBackend, Backends, SuiteBackend};

use super::bytes::Outcome;

/// One failed check.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The op checked (`write_kv`, `convert`, ..., `refusal`), or `panic`, `synchronize`.
    pub op: String,
    /// What failed and why, as the report's line says it.
    pub line: String,
    /// The layouts of the case checked (one; two for a `convert` or `swap_blocks` pair), as
    /// canonical spec strings; empty where the failure is of no one case.
    pub layouts: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line)
    }
}

/// Checks tallied per op; failures with the case name.
#[derive(Default)]
pub struct Report {
    /// Why the backend did not run, where it did not.
    pub skipped: Option<String>,
    /// Checks passed, per op.
    pub passed: BTreeMap<&'static str, usize>,
    /// Checks failed, in the order they ran.
    pub failures: Vec<Failure>,
    /// Worst decode error as a fraction of its tolerance, per cache dtype.
    pub worst_decode: BTreeMap<String, f64>,
    /// The layouts the checks now tallied are on (what a failure records).
    pub layouts: Vec<String>,
}

impl Report {
    /// Tallies one check of `op` on `what`.
    pub fn check(&mut self, op: &'static str, what: &str, r: Outcome<()>) {
        match r {
            Ok(()) => *self.passed.entry(op).or_default() += 1,
            Err(e) => self.fail(op, format!("{op}: {what}: {e}")),
        }
    }

    /// Records a failure of `op`, `line` saying what failed, on the current layouts.
    pub fn fail(&mut self, op: &str, line: String) {
        self.failures.push(Failure {
            op: op.to_string(),
            line,
            layouts: self.layouts.clone(),
        });
    }

    /// Checks passed, over every op.
    pub fn total(&self) -> usize {
        self.passed.values().sum()
    }
}

/// The report of the suite's backend `b`, and the backend; `None` when it cannot run here
/// (recorded as skipped, with its reason).
pub fn report_of<'a, 'b>(
    reports: &'a mut BTreeMap<String, Report>,
    b: &'b SuiteBackend,
) -> Option<(&'a mut Report, &'b AnyBackend)> {
    let rep = reports.entry(b.name.clone()).or_default();
    match &b.backend {
        Ok(be) => Some((rep, be)),
        Err(why) => {
            rep.skipped = Some(why.clone());
            None
        }
    }
}

/// `f()`, or what it panicked with (`what: panicked: ...`).
pub fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|e| {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{what}: panicked: {msg}")
    })
}

/// Reports each of `order`'s reports (passed per op, worst decode error, the first failures);
/// returns the number of failures.
pub fn print_reports(title: &str, reports: &BTreeMap<String, Report>, order: &[&str]) -> usize {
    let mut failures = 0;
    for name in order {
        let Some(r) = reports.get(*name) else {
            continue;
        };
        if let Some(why) = &r.skipped {
            crate::report(&format!("skipped: {name}: {why}"));
            continue;
        }
        let per_op: Vec<String> = r.passed.iter().map(|(op, n)| format!("{op} {n}")).collect();
        crate::report(&format!(
            "{title}: {name}: {} cases passed, {} failed ({})",
            r.total(),
            r.failures.len(),
            per_op.join(", ")
        ));
        if !r.worst_decode.is_empty() {
            let worst: Vec<String> = r
                .worst_decode
                .iter()
                .map(|(d, x)| format!("{d} {x:.1e}"))
                .collect();
            crate::report(&format!(
                "{title}: {name}: paged_decode worst error / tolerance: {}",
                worst.join(", ")
            ));
        }
        for f in r.failures.iter().take(25) {
            println!("  FAIL {name}: {f}");
        }
        if r.failures.len() > 25 {
            println!("  ... and {} more", r.failures.len() - 25);
        }
        failures += r.failures.len();
    }
    failures
}

/// [`print_reports`] of every selected backend, in the suite's order.
pub fn print_backend_reports(
    title: &str,
    reports: &BTreeMap<String, Report>,
    backends: &Backends,
) -> usize {
    let names = backends.names();
    let order: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut failures = print_reports(title, reports, &order);
    match backends.left_out() {
        Ok(None) => {}
        Ok(Some(line)) => crate::report(&format!("{title}: {line}")),
        Err(why) => {
            crate::report(&format!("{title}: failed: {why}"));
            failures += 1;
        }
    }
    if let Some(why) = backends.missing_required_gpu() {
        crate::report(&format!("{title}: failed: {why}"));
        failures += 1;
    }
    failures
}
