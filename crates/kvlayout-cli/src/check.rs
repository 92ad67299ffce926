//! `kvlayout check`: the conformance suite on backends chosen by name, as a matrix of case
//! families x backends.
//!
//! Every check is `kvlayout_conformance::suite`'s, the functions the integration test runs:
//! each case's ops and each same-content pair's `convert` and `swap_blocks` on the backend,
//! compared with the scalar reference. This module owns the choice of backends and cases,
//! the tally per family and backend, and the report: a backend that cannot open here is a
//! named skip, and the first failure is printed with its op, its message and its layout as a
//! spec string. It does not own any check or case.

use std::collections::BTreeSet;
use std::time::Instant;

use kvlayout::ops::AnyBackend;
use kvlayout_conformance::backend::{Host, ScalarReference};
use kvlayout_conformance::cases::all_cases;
use kvlayout_conformance::suite::report::Report;
use kvlayout_conformance::suite::{family_of, oracles, prepared_groups_where, GroupRunner};
use serde::Serialize;

use crate::CliError;

/// What `kvlayout check` was asked for (its options, besides `--json`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CheckArgs {
    /// Backends, comma-separated: cpu, cpu:BUILD, cpu:BUILD:prefetch-L1|L2, reference,
    /// cuda-emu, hip-emu, cuda or cuda:N, hip or hip:N, or `all` (every backend of this
    /// build). One that cannot run here is reported skipped, with why.
    #[arg(long, value_name = "NAME[,NAME...]", default_value = "cpu")]
    pub backend: String,
    /// Case families to run, comma-separated (std, orders, b2, h1, hn, b2h2n2, vllm, d192,
    /// mla, scaled, scaled-dv, scales, long, tiles, tiles-vllm, big, opaque, mamba-ssm,
    /// mamba-conv, mla-c4, tp, split; default: all of them).
    #[arg(long, value_name = "F[,F...]")]
    pub family: Option<String>,
    /// Only the cases whose name (`family/placement/dtype`) contains TEXT.
    #[arg(long, value_name = "TEXT")]
    pub cases: Option<String>,
    /// Threads of the CPU backends, at most 1024 (3 by default, as the suite: uneven
    /// partitions; 0: every core).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub threads: usize,
}

/// One backend of the run: opened, or skipped with why.
struct Opened {
    name: String,
    backend: Result<AnyBackend, String>,
}

/// The backends `--backend` names; an unknown name is a user error.
fn open_backends(a: &CheckArgs) -> Result<Vec<Opened>, CliError> {
    let mut names: Vec<String> = Vec::new();
    for n in a.backend.split(',').map(str::trim) {
        match n {
            "" => {
                return Err(CliError::Usage(format!(
                    "--backend {:?} has an empty name (names: {}, all)",
                    a.backend,
                    kvlayout_backends::NAME_FORMS
                )))
            }
            "all" => names.extend(kvlayout_backends::names()),
            n => names.push(n.to_string()),
        }
    }
    let threads = crate::common::limits::threads(Some(a.threads))?;
    let mut out = Vec::new();
    for name in names {
        if out.iter().any(|o: &Opened| o.name == name) {
            continue;
        }
        let backend = match kvlayout_conformance::suite::planted_backend(&name) {
            Some(be) => Ok(be),
            None => crate::common::backend::open_or_unavailable(&name, threads)?,
        };
        out.push(Opened { name, backend });
    }
    Ok(out)
}

/// One cell of the matrix: a family's checks on a backend.
#[derive(Debug, Serialize)]
struct Cell {
    backend: String,
    passed: usize,
    failed: usize,
    /// Why the backend did not run here, where it did not (the counts are then 0).
    skipped: Option<String>,
}

/// One row of the matrix: a family of cases.
#[derive(Debug, Serialize)]
struct Row {
    family: String,
    cases: usize,
    cells: Vec<Cell>,
}

/// The first failure of the run (rows in table order, backends in `--backend` order).
#[derive(Debug, Serialize)]
struct FirstFailure {
    backend: String,
    family: String,
    op: String,
    message: String,
    /// The case's layout as a spec string (two for a `convert` or `swap_blocks` pair: source,
    /// then destination).
    layouts: Vec<String>,
}

/// What `kvlayout check` found.
#[derive(Debug, Serialize)]
struct CheckReport {
    backends: Vec<String>,
    cases: usize,
    passed: usize,
    failed: usize,
    rows: Vec<Row>,
    first_failure: Option<FirstFailure>,
    seconds: f64,
}

/// The families `--family` names (every family when `None`); an unknown one is a user error.
fn families(a: &CheckArgs) -> Result<Option<BTreeSet<String>>, CliError> {
    let Some(list) = &a.family else {
        return Ok(None);
    };
    let cases = all_cases();
    let known: Vec<&str> = cases.iter().fold(Vec::new(), |mut v, c| {
        let f = family_of(c);
        if !v.contains(&f) {
            v.push(f);
        }
        v
    });
    let mut out = BTreeSet::new();
    for f in list.split(',').map(str::trim) {
        if !known.contains(&f) {
            return Err(CliError::Usage(format!(
                "--family {f:?} is no case family (families: {})",
                known.join(", ")
            )));
        }
        out.insert(f.to_string());
    }
    Ok(Some(out))
}

/// The row of `family` in `rows`, appended (every backend's cell empty, or skipped with why)
/// where there is none yet.
fn row_index(rows: &mut Vec<Row>, family: &str, backends: &[Opened]) -> usize {
    if let Some(at) = rows.iter().position(|r| r.family == family) {
        return at;
    }
    rows.push(Row {
        family: family.to_string(),
        cases: 0,
        cells: backends
            .iter()
            .map(|b| Cell {
                backend: b.name.clone(),
                passed: 0,
                failed: 0,
                skipped: b.backend.as_ref().err().cloned(),
            })
            .collect(),
    });
    rows.len() - 1
}

/// Runs the checks and builds the matrix.
fn check(a: &CheckArgs) -> Result<CheckReport, CliError> {
    let start = Instant::now();
    let backends = open_backends(a)?;
    let families = families(a)?;
    if backends.iter().all(|b| b.backend.is_err()) {
        let why: Vec<String> = backends
            .iter()
            .filter_map(|b| Some(format!("{}: {}", b.name, b.backend.as_ref().err()?)))
            .collect();
        return Err(CliError::Usage(format!(
            "nothing was checked: every backend was skipped ({})",
            why.join("; ")
        )));
    }
    let keep = |c: &kvlayout_conformance::cases::LayoutCase| {
        families.as_ref().is_none_or(|f| f.contains(family_of(c)))
            && a.cases.as_ref().is_none_or(|t| c.name.contains(t.as_str()))
    };
    let groups = prepared_groups_where(keep);
    if groups.is_empty() {
        return Err(CliError::Usage(format!(
            "no case matches --family {} --cases {}",
            a.family.as_deref().unwrap_or("(all)"),
            a.cases.as_deref().unwrap_or("(all)")
        )));
    }
    let oracle = Host::<ScalarReference>::reference();
    // One row per family, in table order.
    let mut rows: Vec<Row> = Vec::new();
    for c in all_cases().iter().filter(|c| keep(c)) {
        row_index(&mut rows, family_of(c), &backends);
    }
    let mut first_failure = None;
    for prepared in &groups {
        // A group holds one content, and its cases may be of several families (a TP slice
        // and the dense layouts of its content): each case's checks, and those of the pairs
        // from it, count in its own family's row.
        let row_of: Vec<usize> = prepared
            .iter()
            .map(|p| row_index(&mut rows, family_of(&p.case), &backends))
            .collect();
        for &at in &row_of {
            rows[at].cases += 1;
        }
        let (case_oracle, pair_oracle) = oracles(&oracle, prepared);
        let runner = GroupRunner {
            cases: prepared,
            oracle: &case_oracle,
            pair_oracle: &pair_oracle,
        };
        for (column, b) in backends.iter().enumerate() {
            let Ok(be) = &b.backend else { continue };
            let mut reps: Vec<Report> = prepared.iter().map(|_| Report::default()).collect();
            runner.run_per_case(be, &mut reps);
            for (rep, &at) in reps.iter().zip(&row_of) {
                let cell = &mut rows[at].cells[column];
                cell.passed += rep.total();
                cell.failed += rep.failures.len();
                if let (None, Some(f)) = (&first_failure, rep.failures.first()) {
                    first_failure = Some(FirstFailure {
                        backend: b.name.clone(),
                        family: rows[at].family.clone(),
                        op: f.op.clone(),
                        message: f.line.clone(),
                        layouts: f.layouts.clone(),
                    });
                }
            }
        }
    }
    let sum = |f: fn(&Cell) -> usize| rows.iter().flat_map(|r| &r.cells).map(f).sum();
    Ok(CheckReport {
        backends: backends.iter().map(|b| b.name.clone()).collect(),
        cases: groups.iter().map(Vec::len).sum(),
        passed: sum(|c| c.passed),
        failed: sum(|c| c.failed),
        first_failure,
        rows,
        seconds: start.elapsed().as_secs_f64(),
    })
}

impl CheckReport {
    fn to_text(&self) -> String {
        let width = |s: &str| s.len().max(14);
        let mut out = format!("{:<12} {:>5}", "family", "cases");
        for b in &self.backends {
            out += &format!("  {:<w$}", b, w = width(b));
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        for r in &self.rows {
            out += &format!("{:<12} {:>5}", r.family, r.cases);
            for c in &r.cells {
                let text = match (&c.skipped, c.failed) {
                    (Some(_), _) => "skipped".to_string(),
                    (None, 0) => format!("{} passed", c.passed),
                    (None, n) => format!("{} passed, {n} FAILED", c.passed),
                };
                out += &format!("  {:<w$}", text, w = width(&c.backend));
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
        }
        if let Some(r) = self.rows.first() {
            for c in &r.cells {
                if let Some(why) = &c.skipped {
                    out += &format!("skipped: {}: {why}\n", c.backend);
                }
            }
        }
        out += &format!(
            "{} cases, {} checks passed, {} failed, {:.1} s\n",
            self.cases, self.passed, self.failed, self.seconds
        );
        if let Some(f) = &self.first_failure {
            out += &format!(
                "first failure: {} on {} (family {}): {}\n",
                f.op, f.backend, f.family, f.message
            );
            for (i, l) in f.layouts.iter().enumerate() {
                let label = match (i, f.layouts.len()) {
                    (0, 1) => "layout",
                    (0, _) => "from",
                    _ => "to",
                };
                out += &format!("  {label:<6} {l}\n");
            }
        }
        out
    }
}

/// Why a run checked nothing although a backend ran: no check of its cases ran (the
/// backends that were skipped, with why).
fn nothing_checked(report: &CheckReport) -> String {
    let skips: Vec<String> = report
        .rows
        .first()
        .map(|r| {
            r.cells
                .iter()
                .filter_map(|c| Some(format!("{}: {}", c.backend, c.skipped.as_ref()?)))
                .collect()
        })
        .unwrap_or_default();
    let also = if skips.is_empty() {
        String::new()
    } else {
        format!(" (skipped: {})", skips.join("; "))
    };
    format!(
        "nothing was checked: {} cases on {} ran no check{also}",
        report.cases,
        report.backends.join(",")
    )
}

/// `kvlayout check`: the matrix as text or JSON; a failed check is an error (exit status 1)
/// after the matrix is printed, and a run that checked nothing (every backend skipped) is a
/// user error (exit status 2) with the skip reasons.
pub(crate) fn run(a: &CheckArgs, as_json: bool) -> Result<String, CliError> {
    let report = check(a)?;
    if report.passed + report.failed == 0 {
        return Err(CliError::Usage(nothing_checked(&report)));
    }
    let text = if as_json {
        crate::json(&report)?
    } else {
        report.to_text()
    };
    if report.failed == 0 {
        return Ok(text);
    }
    // The matrix goes to stdout all the same: it is what shows the failures.
    let _ = crate::emit(&text);
    let f = report.first_failure.as_ref();
    Err(CliError::Check(format!(
        "{} of {} checks failed; the first: {} on {}",
        report.failed,
        report.passed + report.failed,
        f.map_or("?", |f| f.op.as_str()),
        f.map_or("?", |f| f.backend.as_str()),
    )))
}
