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
//!   x8 with window 1 and a soft-cap; an empty sequence in each), and on layouts of one or two
//!   KV heads groups of 12 and 20 (above the GPU kernels' group tile of 8, not a multiple of
//!   it), on the backend's own cache:
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

use kvlayout_conformance::backend::{Backends, Host, ScalarReference};
use kvlayout_conformance::cases::{all_cases, Ops};
use kvlayout_device::kernels::{decode_rows, GpuTarget};
// The suite's checks live in the library (`kvlayout check` runs them too); the modules of
// this test reach them as `crate::bytes`, `crate::run`, ... .
use kvlayout_conformance::suite::{
    bytes, check_block_regions, oracles, prepared_groups, report, run, GroupRunner,
};

#[path = "conformance/planted.rs"]
mod planted;
#[path = "conformance/refusals.rs"]
mod refusals;

use report::{print_backend_reports, print_reports, report_of, Report};
use run::Prepared;

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
        "tensor=vllm-paged-v1",
        "tensor=flash-attn-nhd",
        "tensor=flash-attn-hnd",
        "tensor=flashinfer-nhd",
        "tensor=flashinfer-hnd",
        "tensor=separate-nhd",
        "tensor=separate-hnd",
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
    // Every decode path the kernel branches on (buffers at 16-byte-aligned addresses):
    // (k_vec_bytes, v_vec_bytes, v_token_major), and rows of whole vectors that must still go
    // element by element because a base offset or a padded page is off the 16-byte grid.
    let mut paths = BTreeSet::new();
    let mut unaligned_whole_rows = 0;
    for c in cases.iter().filter(|c| c.ops == Ops::All) {
        let rows = decode_rows(&c.layout, [0, 0], &GpuTarget::CUDA).unwrap();
        paths.insert((rows.k_vec_bytes, rows.v_vec_bytes, rows.v_token_major));
        let k = c.layout.field_map(kvlayout::Field::K).unwrap();
        if rows.k_vec_bytes == 0 && k.row_run().is_some_and(|r| r % 16 == 0) {
            unaligned_whole_rows += 1;
        }
    }
    for want in [(16, 16, false), (16, 0, false), (0, 0, false), (0, 0, true)] {
        assert!(
            paths.contains(&want),
            "no case decodes by {want:?}: {paths:?}"
        );
    }
    assert!(unaligned_whole_rows >= 2, "{unaligned_whole_rows}");
    let groups: BTreeSet<&str> = cases.iter().map(|c| c.group.as_str()).collect();
    assert!(
        groups.len() < cases.len(),
        "some layouts share content (convert pairs)"
    );
}
