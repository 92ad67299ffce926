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

use kvlayout::ops::DecodeParams;
use kvlayout::{Content, DType, Field, KvCacheLayout};
use kvlayout_conformance::backend::HostTensor;
use kvlayout_conformance::cases::{
    case_from_spec, widths, workload, DecodeCase, LayoutCase, Rng, Workload,
};
use kvlayout_cpu::{reference, CpuBackend, HostCache, Magnitude, Tolerance, WriteKv};

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

/// `(spec, activation dtype, tolerance)` of the layouts whose four workload steps keep a
/// fixed tolerance against numpy's dense answer.
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

/// `(spec, activation dtype)` of the layouts held to derived bounds only: per-tensor scales
/// (K and V apart), fp8 and int8 rows, inline scales, a small MLA with scales, more legacy
/// layouts, and (the last [`SPLIT_LAYOUTS`]) sequences long enough for split-context.
///
/// MLA takes equal scales: its latent is written with `k_scale` and V (part of the latent)
/// is read with `v_scale`, so different scales would make V differ from the dense latent.
const MORE_LAYOUTS: &[(&str, DType)] = &[
    (
        "kv L=1 B=6 N=16 H=2 D=64 dtype=f32 order=HND k_scale=0.5 v_scale=2",
        DType::F32,
    ),
    (
        "kv L=2 B=6 N=16 H=2 D=64 dtype=bf16 order=NHD k_scale=3 v_scale=0.25",
        DType::Bf16,
    ),
    (
        "kv L=1 B=5 N=16 H=2 D=64 dtype=f16 legacy=flashinfer-nhd k_scale=3 v_scale=0.25",
        DType::F16,
    ),
    (
        "kv L=1 B=6 N=16 H=4 D=32 dtype=fp8_e4m3 legacy=flash-attn-nhd k_scale=0.5 v_scale=2",
        DType::F16,
    ),
    (
        "kv L=1 B=6 N=16 H=2 D=32 dtype=fp8_e5m2 legacy=vllm-paged-v1 k_scale=3 v_scale=0.25",
        DType::F32,
    ),
    (
        "kv L=1 B=6 N=16 H=2 D=64 dtype=bf16 legacy=separate-hnd",
        DType::F32,
    ),
    (
        "kv-scaled L=1 B=6 N=16 H=2 D=64 dtype=int8 order=NHD",
        DType::F32,
    ),
    (
        "kv-scaled L=2 B=6 N=16 H=2 D=32 dtype=fp8_e4m3 order=HND k_scale=0.5 v_scale=2",
        DType::Bf16,
    ),
    (
        "kv-scaled L=1 B=5 N=16 H=2 D=16 Dv=8 dtype=fp8_e5m2 order=BLNHC",
        DType::F32,
    ),
    (
        "mla L=1 B=4 N=16 rank=128 rope=32 dtype=fp8_e4m3 order=HND k_scale=0.5 v_scale=0.5",
        DType::Bf16,
    ),
    ("kv L=1 B=72 N=16 H=2 D=64 dtype=f32 order=NHD", DType::F32),
    (
        "kv-scaled L=1 B=72 N=16 H=2 D=64 dtype=int8 order=HND k_scale=3 v_scale=0.25",
        DType::Bf16,
    ),
];

/// How many of the last [`MORE_LAYOUTS`] must split their context in some step.
const SPLIT_LAYOUTS: usize = 2;

/// A decode step built here, after the workload's four.
struct CappedStep {
    name: &'static str,
    /// Query heads per KV head.
    group: u64,
    /// The scale times `sqrt(qk width)`.
    scale: f32,
    /// Window, in blocks and tokens.
    window: Option<(u64, u64)>,
    cap: f32,
}

/// The steps built here. Queries and keys are uniform in [-2, 2), so `q . k / sqrt(width)`
/// has a standard deviation of 4/3: the scales put the logits' spread near 8 (cap 5) and 40
/// (cap 30), where `c * tanh(x / c)` is far from both `x` and `tanh(x / c)`.
const CAPPED_STEPS: &[CappedStep] = &[
    CappedStep {
        name: "gqa2+cap5+window",
        group: 2,
        scale: 6.0,
        window: Some((2, 3)),
        cap: 5.0,
    },
    CappedStep {
        name: "gqa4+cap30",
        group: 4,
        scale: 30.0,
        window: None,
        cap: 30.0,
    },
];

/// The capped steps of [`CAPPED_STEPS`] for a case.
fn capped_steps(case: &LayoutCase, w: &Workload) -> Vec<DecodeCase> {
    let l = &case.layout;
    let (kw, _, _) = widths(l).expect("K/V or MLA content");
    let heads = l.geometry().num_kv_heads;
    let bs = l.geometry().block_size;
    let mut rng = Rng::new(&format!("{}/capped", case.name));
    CAPPED_STEPS
        .iter()
        .map(|c| {
            let num_q_heads = c.group * heads;
            let n = w.seq_lens.len() * num_q_heads as usize * kw;
            DecodeCase {
                name: c.name,
                query: HostTensor::from_f32(case.activations, &rng.values(n)),
                params: DecodeParams {
                    num_q_heads,
                    scale: c.scale / (kw as f32).sqrt(),
                    sliding_window: c.window.map(|(blocks, tokens)| blocks * bs + tokens),
                    soft_cap: Some(c.cap),
                },
            }
        })
        .collect()
}

/// Whether the CPU backend's decode of this step splits contexts into partitions, by the
/// rule of `crates/kvlayout-cpu/src/decode/mod.rs`: the step runs on the pool (at least 2048
/// token x KV-head pairs), has fewer work items (a sequence and its KV heads when the page
/// is token-major, one KV head otherwise) than 4 x threads, and a context longer than one
/// partition of 128 tokens.
fn splits(be: &CpuBackend, l: &KvCacheLayout, w: &Workload, p: &DecodeParams) -> bool {
    let heads = l.geometry().num_kv_heads as usize;
    let k = l.field_map(Field::K).expect("K");
    let per_item = if k.strides.head < k.strides.block {
        heads
    } else {
        1
    };
    let items = w.seq_lens.len() * (heads / per_item);
    let ctx = |len: &u32| {
        p.sliding_window
            .map_or(u64::from(*len), |win| u64::from(*len).min(win))
    };
    let longest = w.seq_lens.iter().map(ctx).max().unwrap_or(0);
    let tokens: u64 = w.seq_lens.iter().map(ctx).sum();
    tokens * heads as u64 >= 2048 && items < 4 * be.threads() && longest > 128
}

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

/// One output of a problem: who computed it, and the arithmetic bound it is held to beyond
/// numpy's (`None`: the f64 reference).
struct Output {
    who: String,
    got: Vec<f32>,
    arith: Option<Tolerance>,
}

/// A problem of the numpy script, and the Rust outputs to compare with its answers.
struct Problem {
    what: String,
    out_file: String,
    /// The original check's tolerance (original layouts, the workload's own steps).
    fixed: Option<f64>,
    /// The soft-cap of a step built here: numpy's largest logit must be twice it.
    cap: Option<f32>,
    /// Whether the CPU decode splits this step's contexts.
    split: bool,
    outputs: Vec<Output>,
}

/// The CPU backends checked: the one `CpuBackend::new` picks, then every other kernel build
/// this machine runs; three threads each.
fn backends() -> Vec<(String, CpuBackend)> {
    let auto = CpuBackend::new(Some(3));
    let first = auto.kernel_build();
    let mut out = vec![(format!("cpu({first})"), auto)];
    for build in CpuBackend::kernel_builds() {
        if build != first {
            let be = CpuBackend::with_kernels(Some(3), build)
                .unwrap_or_else(|e| panic!("kernel build {build}: {e}"));
            out.push((format!("cpu({build})"), be));
        }
    }
    out
}

/// The dtype and scales of a cache, as the numpy script takes them.
fn cache_meta(l: &KvCacheLayout) -> serde_json::Value {
    serde_json::json!({
        "dtype": l.dtype().to_string(),
        "k_scale": l.scales().k_scale,
        "v_scale": l.scales().v_scale,
        "inline": matches!(l.content(), Content::KvScaled { .. }),
    })
}

fn prepare(
    case: &LayoutCase,
    fixed: Option<f64>,
    backends: &[(String, CpuBackend)],
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
    let caches: Vec<HostCache> = backends
        .iter()
        .map(|(who, be)| {
            let mut cache = HostCache::new(l.clone()).expect("cache");
            let write = WriteKv {
                layer: w.layer,
                key: w.key.as_activations(),
                value: w.value.as_ref().map(HostTensor::as_activations),
                slot_mapping: &w.slot_mapping,
            };
            be.write_kv(&mut cache.as_mut(), &write)
                .unwrap_or_else(|e| panic!("{}: {who}: write_kv: {e}", case.spec));
            cache
        })
        .collect();
    let originals = w.decodes.len();
    let steps: Vec<DecodeCase> = w
        .decodes
        .iter()
        .cloned()
        .chain(capped_steps(case, &w))
        .collect();
    let mut problems = Vec::new();
    let mut metas = Vec::new();
    for (i, dc) in steps.iter().enumerate() {
        let q_heads = dc.params.num_q_heads as usize;
        let (q_file, out_file) = (format!("L{j}_P{i}_q.f32"), format!("L{j}_P{i}_out.f32"));
        write_f32(&dir.join(&q_file), &dc.query.to_f32());
        let d = w.decode_args(dc);
        let n = w.seq_lens.len() * q_heads * vw;
        let mut outputs = Vec::new();
        for ((who, be), cache) in backends.iter().zip(&caches) {
            let mut got = vec![f32::NAN; n];
            be.paged_decode(&cache.as_ref(), &d, &mut got)
                .unwrap_or_else(|e| panic!("{}: {who}: paged_decode: {e}", case.spec));
            let arith = Some(be.decode_tolerance(l.dtype()));
            outputs.push(Output {
                who: who.clone(),
                got,
                arith,
            });
        }
        let mut oracle = vec![f32::NAN; n];
        reference::paged_decode(&caches[0].as_ref(), &d, &mut oracle)
            .unwrap_or_else(|e| panic!("{}: reference paged_decode: {e}", case.spec));
        outputs.push(Output {
            who: "reference".into(),
            got: oracle,
            arith: None,
        });
        metas.push(serde_json::json!({
            "seqs": w.seq_lens.len(), "q_heads": q_heads, "kv_heads": heads,
            "head": kw, "head_v": vw, "max_len": max_len, "lens": w.seq_lens,
            "scale": dc.params.scale, "window": dc.params.sliding_window,
            "soft_cap": dc.params.soft_cap, "mla": mla, "cache": cache_meta(l),
            "q": q_file, "k": k_file, "v": v_file, "out": out_file,
        }));
        problems.push(Problem {
            what: format!("{} {} {:?}", case.spec, dc.name, dc.params),
            out_file,
            fixed: fixed.filter(|_| i < originals),
            cap: (i >= originals).then_some(dc.params.soft_cap).flatten(),
            split: splits(&backends[0].1, l, &w, &dc.params),
            outputs,
        });
    }
    (problems, metas)
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
    let backends = backends();
    let layouts: Vec<(&str, DType, Option<f64>)> = LAYOUTS
        .iter()
        .map(|&(spec, act, tol)| (spec, act, Some(tol)))
        .chain(MORE_LAYOUTS.iter().map(|&(spec, act)| (spec, act, None)))
        .collect();
    let mut problems = Vec::new();
    let mut metas = Vec::new();
    let mut split_layouts = 0;
    for (j, &(spec, act, fixed)) in layouts.iter().enumerate() {
        let case = case_from_spec(&format!("outside-{j}"), spec, act);
        let (p, m) = prepare(&case, fixed, &backends, &in_dir, j);
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
    let stats: HashMap<String, f64> =
        serde_json::from_slice(&read_bytes(&out_dir.join("stats.json"))).expect("stats.json");
    let mut failures = Vec::new();
    let mut agreed = 0;
    let mut worst = [0f64; 2];
    let mut least_cap_ratio = f64::INFINITY;
    for p in &problems {
        let a = answers(&out_dir, p);
        let before = failures.len();
        if let Some(cap) = p.cap {
            let largest = stats.get(&p.out_file).copied().unwrap_or(0.0);
            least_cap_ratio = least_cap_ratio.min(largest / f64::from(cap));
            if largest < 2.0 * f64::from(cap) {
                failures.push(format!(
                    "{}: the largest logit is {largest}, under twice the cap {cap}",
                    p.what
                ));
            }
        }
        for o in &p.outputs {
            match compare(p, o, &a) {
                Ok(w) => worst = [worst[0].max(w[0]), worst[1].max(w[1])],
                Err(e) => failures.push(e),
            }
        }
        agreed += usize::from(failures.len() == before);
    }
    std::fs::remove_dir_all(&root).ok();
    for f in &failures {
        println!("  FAIL {f}");
    }
    let whos: Vec<&str> = backends.iter().map(|(w, _)| w.as_str()).collect();
    kvlayout_conformance::report(&format!(
        "outside reference: numpy agrees with {} and reference on {} of {} decode steps \
         ({} layouts; {} steps split-context, in {} layouts; capped steps' largest logit \
         >= {:.1} x cap; worst share of a bound: {:.2} dense, {:.2} cached values)",
        whos.join(", "),
        agreed,
        problems.len(),
        layouts.len(),
        problems.iter().filter(|p| p.split).count(),
        split_layouts,
        least_cap_ratio,
        worst[0],
        worst[1]
    ));
    assert!(
        failures.is_empty(),
        "{} disagreements with numpy",
        failures.len()
    );
}
