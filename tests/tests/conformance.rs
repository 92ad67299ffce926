//! The cross-backend conformance suite: every case of `kvlayout_conformance::cases` and every
//! op of the contract, on every backend present, against the scalar reference (run through
//! the same `Backend` trait). Backends that are not built are reported as skipped, by name.
//!
//! What is checked, per case and backend:
//! * `write_kv` (shuffled tokens, padding slots -1) into a sentinel-filled cache (0xA5): every
//!   written element within one quantization step of the reference's (`DType::epsilon`
//!   relative to the row's magnitude), every byte outside the written elements still the
//!   sentinel; a write of padding slots only leaves every byte the sentinel.
//! * `paged_decode`, four steps (MHA; GQA/MQA x4 with a sliding window; x2 with a soft-cap;
//!   x8 with window 1 and a soft-cap; an empty sequence in each), on the backend's own cache:
//!   within `tol * max(|ref|, 1)`, tol = 1e-5 (f32), 2e-2 (f16, bf16), `epsilon()` (fp8, int8).
//! * `copy_blocks`, `gather_blocks` (head range, into a staging layout), `scatter_blocks` back
//!   (identity) and into a sentinel cache, on caches of random bytes: byte for byte equal to
//!   the reference, and every byte outside the destination elements unchanged.
//! * For every ordered pair (A, B) of layouts of one content: `convert` A -> B (byte-equal to
//!   the reference, B's non-element bytes still the sentinel), B -> A (the identity on A's
//!   elements), `swap_blocks` A -> B (byte-equal, sentinel outside the destination blocks).
//! * Movers-only content (opaque rows, Mamba states, tokens_per_state 4): `write_kv` and
//!   `paged_decode` refused with `Unsupported`.
//! * The suite can fail: each deliberately broken GPU kernel build (`kvl_plant.cuh`) runs
//!   through the groups until a check fails, and the case that caught it is reported
//!   (`planted_kernel_bugs_are_caught`).
//!
//! Element byte sets are computed from the field strides (`base + l*Ls + b*Bs + h*Hs + n*Ns +
//! (d/x)*Xs + (d%x)*Ds`) and cross-checked against `layout.block_regions`.
//!
//! The refusals (`refusals_on_every_backend`): out-of-range slot, duplicate slot, block id
//! out of range or negative, sequence longer than its blocks, shape / dtype / geometry
//! mismatches, bad block pairs, incompatible caches, a buffer shorter than the registered
//! span (even when it covers every element), a misaligned buffer: each a typed `OpError`, and
//! every cache byte unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use kvlayout_conformance::backend::{Backend, Backends, Host, ScalarReference};
use kvlayout_conformance::cases::{all_cases, LayoutCase};

#[path = "conformance/bytes.rs"]
mod bytes;
#[path = "conformance/compare.rs"]
mod compare;
#[path = "conformance/planted.rs"]
mod planted;
#[path = "conformance/refusals.rs"]
mod refusals;
#[path = "conformance/report.rs"]
mod report;
#[path = "conformance/run.rs"]
mod run;

use bytes::{blocks_mask, regions_mask};
use compare::{compare_case, compare_pair};
use report::{guarded, print_backend_reports, print_reports, report_of, Report};
use run::{case_outcome, pair_outcome, prepare, CaseOutcome, PairOutcome, Prepared};

/// Runs one group of cases (one content) on a backend.
struct GroupRunner<'a> {
    cases: &'a [Prepared],
    oracle: &'a [CaseOutcome],
    pair_oracle: &'a [Vec<PairOutcome>],
}

impl GroupRunner<'_> {
    /// Every case and ordered pair of the group on `be`, tallied in `rep`.
    fn run<B: Backend>(&self, be: &B, rep: &mut Report) {
        for (p, want) in self.cases.iter().zip(self.oracle) {
            match guarded(&p.case.name, || case_outcome(be, p)) {
                Ok(got) => compare_case(rep, p, &got, want),
                Err(e) => rep.failures.push(e),
            }
        }
        for (i, a) in self.cases.iter().enumerate() {
            for (j, b) in self.cases.iter().enumerate() {
                let what = format!("{} -> {}", a.case.name, b.case.name);
                match guarded(&what, || pair_outcome(be, a, b)) {
                    Ok(got) => compare_pair(rep, a, b, &got, &self.pair_oracle[i][j]),
                    Err(e) => rep.failures.push(e),
                }
            }
        }
        if let Err(e) = be.synchronize() {
            rep.failures.push(format!("synchronize: {e}"));
        }
    }
}

/// The cases grouped by content, in table order.
fn groups(cases: Vec<LayoutCase>) -> Vec<Vec<LayoutCase>> {
    let mut groups: Vec<(String, Vec<LayoutCase>)> = Vec::new();
    for c in cases {
        match groups.iter_mut().find(|g| g.0 == c.group) {
            Some(g) => g.1.push(c),
            None => groups.push((c.group.clone(), vec![c])),
        }
    }
    groups.into_iter().map(|g| g.1).collect()
}

/// The element byte sets the suite uses agree with the layout's own block regions.
fn check_block_regions(layout_checks: &mut Report, p: &Prepared) {
    let l = &p.case.layout;
    let h = l.geometry().num_kv_heads;
    let blocks: Vec<u64> = (0..l.geometry().num_blocks).collect();
    for (blocks, heads) in [
        (vec![blocks[blocks.len() - 1]], 0..h),
        (p.plan.gather_blocks.clone(), p.plan.heads.clone()),
        (blocks, 0..h),
    ] {
        layout_checks.check(
            "block_regions",
            &format!("{} blocks {blocks:?} heads {heads:?}", p.case.name),
            regions_mask(l, &blocks, heads.clone()).and_then(|m| {
                (m == blocks_mask(l, &blocks, heads.clone()))
                    .then_some(())
                    .ok_or_else(|| "block_regions differ from the element bytes".into())
            }),
        );
    }
}

/// The reference's outcomes on a group: each case, and each ordered pair.
fn oracles(
    oracle: &Host<ScalarReference>,
    prepared: &[Prepared],
) -> (Vec<CaseOutcome>, Vec<Vec<PairOutcome>>) {
    let cases = prepared.iter().map(|p| case_outcome(oracle, p)).collect();
    let pairs = prepared
        .iter()
        .map(|a| {
            prepared
                .iter()
                .map(|b| pair_outcome(oracle, a, b))
                .collect()
        })
        .collect();
    (cases, pairs)
}

/// Runs one group on the reference, then on every backend against it.
fn run_group(
    backends: &Backends,
    oracle: &Host<ScalarReference>,
    prepared: &[Prepared],
    reports: &mut BTreeMap<String, Report>,
) {
    let (case_oracle, pair_oracle) = oracles(oracle, prepared);
    let runner = GroupRunner {
        cases: prepared,
        oracle: &case_oracle,
        pair_oracle: &pair_oracle,
    };
    for b in backends.selected() {
        if let Some((rep, be)) = report_of(reports, b) {
            runner.run(be, rep);
        }
    }
}

/// The table's groups, each with its cases prepared (numbered in table order).
fn prepared_groups() -> Vec<Vec<Prepared>> {
    let mut index = 0;
    groups(all_cases())
        .into_iter()
        .map(|group| {
            group
                .into_iter()
                .map(|c| {
                    index += 1;
                    prepare(c, index)
                })
                .collect()
        })
        .collect()
}

/// Which CPU kernels ran, and which builds this machine cannot run: skipped where the CPU
/// lacks a feature, only noted where `KVLAYOUT_CPU_HIDE` hides one (the test command's pass
/// without it runs them).
fn report_cpu_kernels() {
    kvlayout_conformance::report(&format!(
        "conformance: cpu ran the {} kernels; every other build this machine runs ran as \
         cpu:<build> ({})",
        kvlayout_cpu::CpuBackend::kernels(),
        kvlayout_cpu::CpuFeatures::get().describe()
    ));
    for (build, why) in kvlayout_cpu::CpuBackend::kernels_not_run() {
        if why.starts_with(kvlayout_cpu::CPU_HIDE_VAR) {
            kvlayout_conformance::report(&format!("conformance: cpu kernels {build}: {why}"));
        } else {
            kvlayout_conformance::report(&format!("skipped: cpu kernels {build}: {why}"));
        }
    }
}

#[test]
fn every_case_on_every_backend() {
    let start = Instant::now();
    let backends = Backends::default();
    let oracle = Host::<ScalarReference>::reference();
    let mut n_cases = 0;
    let mut reports: BTreeMap<String, Report> = BTreeMap::new();
    let mut layout_checks = Report::default();
    for prepared in prepared_groups() {
        n_cases += prepared.len();
        for p in &prepared {
            check_block_regions(&mut layout_checks, p);
        }
        run_group(&backends, &oracle, &prepared, &mut reports);
    }
    let mut failures = 0;
    let mut lr = BTreeMap::new();
    lr.insert("layout".to_string(), layout_checks);
    failures += print_reports("conformance", &lr, &["layout"]);
    failures += print_backend_reports("conformance", &reports, &backends);
    report_cpu_kernels();
    kvlayout_conformance::report(&format!(
        "conformance: {n_cases} layout cases, {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    assert_eq!(failures, 0, "conformance failures (listed above)");
}

#[test]
fn the_table_covers_what_the_suite_promises() {
    let cases = all_cases();
    let names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    let specs: Vec<&str> = cases.iter().map(|c| c.spec.as_str()).collect();
    for order in kvlayout_conformance::cases::ALL_ORDERS {
        assert!(
            specs.iter().any(|s| s.contains(&format!("order={order}"))),
            "{order}"
        );
    }
    for needle in [
        "order=NHD",
        "order=HND",
        "page=",
        "base=",
        "legacy=vllm-paged-v1",
        "legacy=flash-attn-nhd",
        "legacy=flash-attn-hnd",
        "legacy=flashinfer-nhd",
        "legacy=flashinfer-hnd",
        "legacy=separate-nhd",
        "legacy=separate-hnd",
        "D=192 Dv=128",
        "rank=512 rope=64",
        "kv-scaled",
        "B=3 N=16 H=4 D=8",
        "B=2",
        "H=1",
        "N=4 H=4",
        "k_scale=",
    ] {
        assert!(
            specs.iter().any(|s| s.contains(needle)),
            "no case with {needle}"
        );
    }
    for dtype in ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"] {
        assert!(
            names.iter().any(|n| n.ends_with(&format!("/{dtype}"))),
            "{dtype}"
        );
    }
    let groups: BTreeSet<&str> = cases.iter().map(|c| c.group.as_str()).collect();
    assert!(
        groups.len() < cases.len(),
        "some layouts share content (convert pairs)"
    );
}
