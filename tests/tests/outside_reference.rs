//! An outside reference nobody here wrote: numpy (float64) computes paged-decode attention
//! from the dense inputs the suite generated (before they were written into any cache), and
//! the CPU backend's `paged_decode` — after its own `write_kv` into caches of several layouts
//! — must agree; so must the scalar reference (the suite's oracle).
//!
//! The inputs are the conformance workloads (`cases::workload`): shuffled tokens with padding
//! slots, scrambled block tables, a partial last block, an empty sequence, and four decode
//! steps (MHA; GQA/MQA with a window; a soft-cap; window 1 with a soft-cap). Tolerance:
//! `tol * max(|numpy|, 1)` with tol = 1e-5 for f32 caches, 2e-2 for f16 / bf16 caches.
//!
//! Skipped, visibly, when python3 with numpy is absent — unless `KVLAYOUT_REQUIRE_NUMPY=1`
//! (set by `scripts/test.sh`, after `scripts/setup.sh` installed numpy), which makes it fail.

use std::path::{Path, PathBuf};
use std::process::Command;

use kvlayout::DType;
use kvlayout_conformance::backend::HostTensor;
use kvlayout_conformance::cases::{case_from_spec, widths, workload, LayoutCase, Workload};
use kvlayout_cpu::{reference, CpuBackend, HostCache, WriteKv};

fn numpy_available() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn write_f32(path: &Path, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `(spec, activation dtype, tolerance)` of each layout checked.
const LAYOUTS: &[(&str, DType, f64)] = &[
    (
        "kv L=2 B=6 N=16 H=2 D=64 dtype=f32 order=NHD",
        DType::F32,
        1e-5,
    ),
    (
        "kv L=1 B=6 N=16 H=2 D=64 dtype=f32 order=HND base=256",
        DType::F32,
        1e-5,
    ),
    (
        "kv L=2 B=5 N=16 H=2 D=128 Dv=64 dtype=f32 order=BLNHC page=33024",
        DType::F32,
        1e-5,
    ),
    (
        "kv L=1 B=6 N=16 H=2 D=32 dtype=f32 legacy=vllm-paged-v1",
        DType::F32,
        1e-5,
    ),
    (
        "kv L=1 B=4 N=16 H=1 D=64 dtype=f32 legacy=flashinfer-hnd",
        DType::F32,
        1e-5,
    ),
    (
        "kv L=1 B=4 N=8 H=4 D=16 dtype=f32 legacy=separate-nhd",
        DType::F32,
        1e-5,
    ),
    (
        "mla L=1 B=3 N=16 rank=512 rope=64 dtype=f32 order=NHD",
        DType::F32,
        1e-5,
    ),
    (
        "kv L=1 B=40 N=16 H=1 D=32 dtype=f32 order=HND",
        DType::F32,
        1e-5,
    ),
    (
        "kv L=1 B=6 N=16 H=2 D=64 dtype=bf16 order=NHD",
        DType::Bf16,
        2e-2,
    ),
    (
        "kv L=1 B=6 N=16 H=2 D=64 dtype=f16 legacy=flash-attn-hnd",
        DType::F16,
        2e-2,
    ),
    (
        "kv L=1 B=6 N=16 H=4 D=32 dtype=bf16 legacy=vllm-paged-v1",
        DType::F32,
        2e-2,
    ),
];

/// Dense `[seqs, max_len, heads, width]` of a tensor `[tokens, heads, width]`, by position.
fn dense(w: &Workload, t: &HostTensor, heads: usize, width: usize, max_len: usize) -> Vec<f32> {
    let x = t.to_f32();
    let seqs = w.seq_lens.len();
    let mut out = vec![0f32; seqs * max_len * heads * width];
    for (token, pos) in w.token_pos.iter().enumerate() {
        if let Some((s, p)) = *pos {
            let row = heads * width;
            out[(s * max_len + p) * row..(s * max_len + p + 1) * row]
                .copy_from_slice(&x[token * row..(token + 1) * row]);
        }
    }
    out
}

/// A problem of the numpy script, and the Rust outputs to compare with its answer.
struct Problem {
    what: String,
    out_file: String,
    tolerance: f64,
    cpu: Vec<f32>,
    reference: Vec<f32>,
}

fn prepare(
    case: &LayoutCase,
    tolerance: f64,
    dir: &Path,
    j: usize,
) -> (Vec<Problem>, Vec<serde_json::Value>) {
    let l = &case.layout;
    let w = workload(case).expect("K/V or MLA content");
    let (kw, vw, mla) = widths(l).expect("K/V or MLA content");
    let heads = l.geometry().num_kv_heads as usize;
    let max_len = *w.seq_lens.iter().max().expect("sequences") as usize;
    let (k_file, v_file) = (format!("L{j}_k.f32"), format!("L{j}_v.f32"));
    write_f32(&dir.join(&k_file), &dense(&w, &w.key, heads, kw, max_len));
    if let Some(v) = &w.value {
        write_f32(&dir.join(&v_file), &dense(&w, v, heads, vw, max_len));
    }
    let be = CpuBackend::new(Some(3));
    let mut cache = HostCache::new(l.clone()).expect("cache");
    let write = WriteKv {
        layer: w.layer,
        key: w.key.as_activations(),
        value: w.value.as_ref().map(HostTensor::as_activations),
        slot_mapping: &w.slot_mapping,
    };
    be.write_kv(&mut cache.as_mut(), &write)
        .unwrap_or_else(|e| panic!("{}: write_kv: {e}", case.spec));
    let mut problems = Vec::new();
    let mut metas = Vec::new();
    for (i, dc) in w.decodes.iter().enumerate() {
        let q_heads = dc.params.num_q_heads as usize;
        let (q_file, out_file) = (format!("L{j}_P{i}_q.f32"), format!("L{j}_P{i}_out.f32"));
        write_f32(&dir.join(&q_file), &dc.query.to_f32());
        let d = w.decode_args(dc);
        let n = w.seq_lens.len() * q_heads * vw;
        let mut cpu = vec![f32::NAN; n];
        be.paged_decode(&cache.as_ref(), &d, &mut cpu)
            .unwrap_or_else(|e| panic!("{}: paged_decode: {e}", case.spec));
        let mut oracle = vec![f32::NAN; n];
        reference::paged_decode(&cache.as_ref(), &d, &mut oracle)
            .unwrap_or_else(|e| panic!("{}: reference paged_decode: {e}", case.spec));
        metas.push(serde_json::json!({
            "seqs": w.seq_lens.len(), "q_heads": q_heads, "kv_heads": heads,
            "head": kw, "head_v": vw, "max_len": max_len, "lens": w.seq_lens,
            "scale": dc.params.scale, "window": dc.params.sliding_window,
            "soft_cap": dc.params.soft_cap, "mla": mla,
            "q": q_file, "k": k_file, "v": v_file, "out": out_file,
        }));
        problems.push(Problem {
            what: format!("{} {} {:?}", case.spec, dc.name, dc.params),
            out_file,
            tolerance,
            cpu,
            reference: oracle,
        });
    }
    (problems, metas)
}

fn compare(who: &str, p: &Problem, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{who}: {}: {} outputs, numpy {}",
            p.what,
            got.len(),
            want.len()
        ));
    }
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        let (a, b) = (f64::from(a), f64::from(b));
        let agrees = (a - b).abs() <= p.tolerance * b.abs().max(1.0); // false for NaN
        if !agrees {
            return Err(format!("{who}: {}: out[{i}] = {a}, numpy {b}", p.what));
        }
    }
    Ok(())
}

#[test]
fn paged_decode_agrees_with_numpy() {
    if !numpy_available() {
        let msg = "skipped: outside reference: numpy not installed (run scripts/setup.sh)";
        kvlayout_conformance::report(msg);
        assert!(
            std::env::var("KVLAYOUT_REQUIRE_NUMPY").as_deref() != Ok("1"),
            "{msg}, but KVLAYOUT_REQUIRE_NUMPY=1"
        );
        return;
    }
    let root = std::env::temp_dir().join(format!("kvlayout-sdpa-{}", std::process::id()));
    let (in_dir, out_dir) = (root.join("in"), root.join("out"));
    std::fs::create_dir_all(&in_dir).expect("temp dir");
    let mut problems = Vec::new();
    let mut metas = Vec::new();
    for (j, &(spec, act, tol)) in LAYOUTS.iter().enumerate() {
        let case = case_from_spec(&format!("outside-{j}"), spec, act);
        let (p, m) = prepare(&case, tol, &in_dir, j);
        problems.extend(p);
        metas.extend(m);
    }
    std::fs::write(
        in_dir.join("problems.json"),
        serde_json::Value::Array(metas).to_string(),
    )
    .expect("problems.json");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/sdpa_reference.py");
    let run = Command::new("python3")
        .arg(&script)
        .arg(&in_dir)
        .arg(&out_dir)
        .output()
        .expect("python3 runs");
    assert!(
        run.status.success(),
        "numpy reference failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mut failures = Vec::new();
    let mut agreed = 0;
    for p in &problems {
        let want = read_f32(&out_dir.join(&p.out_file));
        let before = failures.len();
        for (who, got) in [("cpu", &p.cpu), ("reference", &p.reference)] {
            if let Err(e) = compare(who, p, got, &want) {
                failures.push(e);
            }
        }
        agreed += usize::from(failures.len() == before);
    }
    std::fs::remove_dir_all(&root).ok();
    for f in &failures {
        println!("  FAIL {f}");
    }
    kvlayout_conformance::report(&format!(
        "outside reference: numpy agrees with cpu and reference on {} of {} decode steps ({} layouts)",
        agreed,
        problems.len(),
        LAYOUTS.len()
    ));
    assert!(
        failures.is_empty(),
        "{} disagreements with numpy",
        failures.len()
    );
}
