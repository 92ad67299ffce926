//! An outside reference nobody here wrote: numpy (float64) computes paged-decode attention
//! from the dense inputs the suite generated (before they were written into any cache). The
//! CPU backend's `paged_decode`, after its own `write_kv`, must agree, with every kernel
//! build this machine runs; so must the scalar reference (the suite's oracle), decoding the
//! first build's cache.
//!
//! Inputs: the conformance workloads (`cases::workload`): shuffled tokens with padding
//! slots, scrambled block tables, a partial last block, an empty sequence, and four decode
//! steps (MHA; GQA/MQA with a window; a soft-cap of 1; window 1 with a soft-cap). Two more
//! steps are built here, with logits large enough that the cap bites (the largest uncapped
//! logit must reach twice the cap): GQA-2 with a soft-cap of 5 and a window of 2 blocks + 3
//! tokens, and GQA-4 with a soft-cap of 30 over the whole context.
//!
//! Layouts: f32, f16, bf16, fp8 (e4m3, e5m2) and int8 caches; per-tensor scales other than 1,
//! different for K and V; inline per-row scales (`kv-scaled`, int8 and fp8); MLA (rank 512,
//! and rank 128 in fp8 with scales); named orders, padded pages and base offsets; the legacy
//! layouts vllm-paged-v1, flash-attn-nhd/hnd, flashinfer-nhd/hnd and separate-nhd/hnd. Two
//! layouts hold sequences of 763 and 384 tokens, long enough that the CPU decode splits
//! their contexts into partitions (asserted, by the backend's rule).
//!
//! Each output is compared with two numpy answers:
//!
//! - Dense: attention of the dense inputs. The original layouts' four workload steps keep a
//!   fixed tolerance, `tol * max(|numpy|, 1)` with tol = 1e-5 for f32 caches and 2e-2 for
//!   f16 / bf16 caches. Every other problem is held to a bound numpy derives from the dense
//!   values: each cached element lies within half a quantization step of its dense value,
//!   and `attend` in `sdpa_reference.py` carries that through the logits and the convex
//!   combination of values. Added to it: the backend's arithmetic bound (below) and
//!   `1e-5 * max(|numpy|, 1)`.
//! - Cached values: attention of the values the cache holds, quantized in numpy as the
//!   documented write does (divide by the per-tensor scale, then by the inline row scale
//!   `amax / max`; round to nearest even, int8 half away from zero; saturate; read back
//!   times the scales). The reference, which reads stored values exactly and sums in f64,
//!   must agree within `1e-5 * max(|numpy|, 1)`. A CPU build must agree within its own
//!   arithmetic bound (`CpuBackend::decode_tolerance`: f32 or bf16 products, scaled by the
//!   row's value and logit magnitudes, which numpy measures) plus the same `1e-5` term.
//!
//! Skipped, visibly, when python3 with numpy is absent — unless `KVLAYOUT_REQUIRE_NUMPY=1`
//! (set by `scripts/test.sh`, after `scripts/setup.sh` installed numpy), which makes it fail.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kvlayout::DType;
use kvlayout_conformance::cases::case_from_spec;
use kvlayout_cpu::{CpuBackend, Magnitude};

#[path = "outside_reference/problems.rs"]
mod problems;
#[path = "outside_reference/steps.rs"]
mod steps;

use problems::{backends, prepare, Output, Problem};
use steps::{LAYOUTS, MORE_LAYOUTS, SPLIT_LAYOUTS};

fn numpy_available() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn read_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_f32(path: &Path) -> Vec<f32> {
    read_bytes(path)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn read_f64(path: &Path) -> Vec<f64> {
    read_bytes(path)
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect()
}

/// numpy's answers to one problem.
struct Answers {
    dense: Vec<f32>,
    bound: Vec<f64>,
    mirror: Vec<f32>,
    mags: Vec<Magnitude>,
}

fn answers(out_dir: &Path, p: &Problem) -> Answers {
    let at = |suffix: &str| out_dir.join(format!("{}{suffix}", p.out_file));
    let mags = read_f64(&at(".mags"))
        .chunks_exact(2)
        .map(|m| Magnitude {
            values: m[0],
            logits: m[1],
        })
        .collect();
    Answers {
        dense: read_f32(&at("")),
        bound: read_f64(&at(".bound")),
        mirror: read_f32(&at(".mirror")),
        mags,
    }
}

/// The checks of one output: the largest share of its bound any element takes, against
/// numpy's dense answer and against its answer over the cached values; `Err` names the
/// first element outside its bound.
fn compare(p: &Problem, o: &Output, a: &Answers) -> Result<[f64; 2], String> {
    let n = a.dense.len();
    if o.got.len() != n || a.mirror.len() != n || a.bound.len() != n || a.mags.is_empty() {
        return Err(format!(
            "{}: {}: {} outputs, numpy {n} (bound {}, mirror {}, rows {})",
            o.who,
            p.what,
            o.got.len(),
            a.bound.len(),
            a.mirror.len(),
            a.mags.len()
        ));
    }
    let row = n / a.mags.len();
    let mut worst = [0f64; 2];
    for (i, &got) in o.got.iter().enumerate() {
        let got = f64::from(got);
        let arith = o.arith.map_or(0.0, |t| t.bound(&a.mags[i / row.max(1)]));
        let (dense, mirror) = (f64::from(a.dense[i]), f64::from(a.mirror[i]));
        let dense_bound = match p.fixed {
            Some(tol) => tol * dense.abs().max(1.0),
            None => a.bound[i] + arith + 1e-5 * dense.abs().max(1.0),
        };
        let mirror_bound = arith + 1e-5 * mirror.abs().max(1.0);
        // Both comparisons are false for NaN.
        let (dense_ok, mirror_ok) = (
            (got - dense).abs() <= dense_bound,
            (got - mirror).abs() <= mirror_bound,
        );
        if !dense_ok {
            return Err(format!(
                "{}: {}: out[{i}] = {got}, numpy (dense) {dense}, allowed {dense_bound:e}",
                o.who, p.what
            ));
        }
        if !mirror_ok {
            return Err(format!(
                "{}: {}: out[{i}] = {got}, numpy (cached values) {mirror}, allowed {mirror_bound:e}",
                o.who, p.what
            ));
        }
        worst[0] = worst[0].max((got - dense).abs() / dense_bound);
        worst[1] = worst[1].max((got - mirror).abs() / mirror_bound);
    }
    Ok(worst)
}

/// What the comparisons of every problem came to.
#[derive(Default)]
struct Tally {
    failures: Vec<String>,
    /// Problems whose every output agreed.
    agreed: usize,
    /// The largest share of its bound any element took: dense, cached values.
    worst: [f64; 2],
    /// The least ratio of a capped step's largest logit to its cap.
    least_cap_ratio: f64,
}

/// Skips, visibly, where numpy is absent (fails instead under `KVLAYOUT_REQUIRE_NUMPY=1`);
/// whether it is there.
fn numpy_here() -> bool {
    if numpy_available() {
        return true;
    }
    let msg = "skipped: outside reference: numpy not installed (run scripts/setup.sh)";
    kvlayout_conformance::report(msg);
    assert!(
        std::env::var("KVLAYOUT_REQUIRE_NUMPY").as_deref() != Ok("1"),
        "{msg}, but KVLAYOUT_REQUIRE_NUMPY=1"
    );
    false
}

/// Every layout's problems, their inputs and `problems.json` written to `in_dir`; and how
/// many of the last [`SPLIT_LAYOUTS`] layouts split a context (each must).
fn write_problems(
    layouts: &[(&str, DType, Option<f64>)],
    backends: &[(String, CpuBackend)],
    in_dir: &Path,
) -> (Vec<Problem>, usize) {
    let mut problems = Vec::new();
    let mut metas = Vec::new();
    let mut split_layouts = 0;
    for (j, &(spec, act, fixed)) in layouts.iter().enumerate() {
        let case = case_from_spec(&format!("outside-{j}"), spec, act);
        let (p, m) = prepare(&case, fixed, backends, in_dir, j);
        if j + SPLIT_LAYOUTS >= layouts.len() {
            assert!(
                p.iter().any(|p| p.split),
                "{spec}: no step splits its context on the CPU backend"
            );
            split_layouts += 1;
        }
        problems.extend(p);
        metas.extend(m);
    }
    std::fs::write(
        in_dir.join("problems.json"),
        serde_json::Value::Array(metas).to_string(),
    )
    .expect("problems.json");
    (problems, split_layouts)
}

/// Runs `sdpa_reference.py` on `in_dir`; returns its stats (each problem's largest logit).
fn run_numpy(in_dir: &Path, out_dir: &Path) -> HashMap<String, f64> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/sdpa_reference.py");
    let run = Command::new("python3")
        .arg(&script)
        .arg(in_dir)
        .arg(out_dir)
        .output()
        .expect("python3 runs");
    assert!(
        run.status.success(),
        "numpy reference failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_slice(&read_bytes(&out_dir.join("stats.json"))).expect("stats.json")
}

/// Every output of every problem against numpy's answers; a capped step's largest logit
/// against twice its cap.
fn check_answers(out_dir: &Path, problems: &[Problem], stats: &HashMap<String, f64>) -> Tally {
    let mut t = Tally {
        least_cap_ratio: f64::INFINITY,
        ..Tally::default()
    };
    for p in problems {
        let a = answers(out_dir, p);
        let before = t.failures.len();
        if let Some(cap) = p.cap {
            let largest = stats.get(&p.out_file).copied().unwrap_or(0.0);
            t.least_cap_ratio = t.least_cap_ratio.min(largest / f64::from(cap));
            if largest < 2.0 * f64::from(cap) {
                t.failures.push(format!(
                    "{}: the largest logit is {largest}, under twice the cap {cap}",
                    p.what
                ));
            }
        }
        for o in &p.outputs {
            match compare(p, o, &a) {
                Ok(w) => t.worst = [t.worst[0].max(w[0]), t.worst[1].max(w[1])],
                Err(e) => t.failures.push(e),
            }
        }
        t.agreed += usize::from(t.failures.len() == before);
    }
    t
}

#[test]
fn paged_decode_agrees_with_numpy() {
    if !numpy_here() {
        return;
    }
    let root = std::env::temp_dir().join(format!("kvlayout-sdpa-{}", std::process::id()));
    let (in_dir, out_dir) = (root.join("in"), root.join("out"));
    std::fs::create_dir_all(&in_dir).expect("temp dir");
    let backends = backends();
    let layouts: Vec<(&str, DType, Option<f64>)> = LAYOUTS
        .iter()
        .map(|&(spec, act, tol)| (spec, act, Some(tol)))
        .chain(MORE_LAYOUTS.iter().map(|&(spec, act)| (spec, act, None)))
        .collect();
    let (problems, split_layouts) = write_problems(&layouts, &backends, &in_dir);
    let stats = run_numpy(&in_dir, &out_dir);
    let t = check_answers(&out_dir, &problems, &stats);
    std::fs::remove_dir_all(&root).ok();
    for f in &t.failures {
        println!("  FAIL {f}");
    }
    let whos: Vec<&str> = backends.iter().map(|(w, _)| w.as_str()).collect();
    kvlayout_conformance::report(&format!(
        "outside reference: numpy agrees with {} and reference on {} of {} decode steps \
         ({} layouts; {} steps split-context, in {} layouts; capped steps' largest logit \
         >= {:.1} x cap; worst share of a bound: {:.2} dense, {:.2} cached values)",
        whos.join(", "),
        t.agreed,
        problems.len(),
        layouts.len(),
        problems.iter().filter(|p| p.split).count(),
        split_layouts,
        t.least_cap_ratio,
        t.worst[0],
        t.worst[1]
    ));
    assert!(
        t.failures.is_empty(),
        "{} disagreements with numpy",
        t.failures.len()
    );
}
