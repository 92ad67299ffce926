//! The problems handed to the numpy script: dense inputs and metadata written to files, and
//! the Rust outputs (every CPU kernel build, and the reference) to compare with its answers.

use std::path::Path;

use kvlayout::KvCacheLayout;
use kvlayout_conformance::backend::HostTensor;
use kvlayout_conformance::cases::{widths, workload, DecodeCase, LayoutCase, Workload};
use kvlayout_cpu::{
    Activations, CpuBackend, HostCache, HostExec, ScalarReference, Tolerance, WriteKv,
};

use crate::steps::{capped_steps, splits};

fn write_f32(path: &Path, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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
pub(crate) struct Output {
    pub(crate) who: String,
    pub(crate) got: Vec<f32>,
    pub(crate) arith: Option<Tolerance>,
}

/// A problem of the numpy script, and the Rust outputs to compare with its answers.
pub(crate) struct Problem {
    pub(crate) what: String,
    pub(crate) out_file: String,
    /// The original check's tolerance (original layouts, the workload's own steps).
    pub(crate) fixed: Option<f64>,
    /// The soft-cap of a step built here: numpy's largest logit must be twice it.
    pub(crate) cap: Option<f32>,
    /// Whether the CPU decode splits this step's contexts.
    pub(crate) split: bool,
    pub(crate) outputs: Vec<Output>,
}

/// The CPU backends checked: the one `CpuBackend::new` picks, then every other kernel build
/// this machine runs; three threads each.
pub(crate) fn backends() -> Vec<(String, CpuBackend)> {
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
        "inline": l.content().inline_scales(),
    })
}

/// The problems of one layout (the workload's steps, then the capped ones), their inputs
/// written to `dir`; and each problem's metadata for the numpy script.
pub(crate) fn prepare(
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
    let caches = written_caches(case, &w, backends);
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
            outputs: outputs(case, &w, dc, backends, &caches),
        });
    }
    (problems, metas)
}

/// The workload written into a cache by each backend's `write_kv`.
fn written_caches(
    case: &LayoutCase,
    w: &Workload,
    backends: &[(String, CpuBackend)],
) -> Vec<HostCache> {
    backends
        .iter()
        .map(|(who, be)| {
            let mut cache = HostCache::new(case.layout.clone()).expect("cache");
            let write = WriteKv {
                layer: w.layer,
                key: Activations::from(&w.key),
                value: w.value.as_ref().map(Activations::from),
                slot_mapping: &w.slot_mapping,
            };
            be.write_kv(&mut cache.as_mut(), &write)
                .unwrap_or_else(|e| panic!("{}: {who}: write_kv: {e}", case.spec));
            cache
        })
        .collect()
}

/// Decode step `dc` by each backend on its own cache, then by the reference on the first.
fn outputs(
    case: &LayoutCase,
    w: &Workload,
    dc: &DecodeCase,
    backends: &[(String, CpuBackend)],
    caches: &[HostCache],
) -> Vec<Output> {
    let (_, vw, _) = widths(&case.layout).expect("K/V or MLA content");
    let d = w.decode_args(dc);
    let n = w.seq_lens.len() * dc.params.num_q_heads as usize * vw;
    let mut outputs = Vec::new();
    for ((who, be), cache) in backends.iter().zip(caches) {
        let mut got = vec![f32::NAN; n];
        be.paged_decode(&cache.as_ref(), &d, &mut got)
            .unwrap_or_else(|e| panic!("{}: {who}: paged_decode: {e}", case.spec));
        let arith = Some(be.decode_tolerance(case.layout.dtype()));
        outputs.push(Output {
            who: who.clone(),
            got,
            arith,
        });
    }
    let mut oracle = vec![f32::NAN; n];
    ScalarReference
        .paged_decode(&caches[0].as_ref(), &d, &mut oracle)
        .unwrap_or_else(|e| panic!("{}: reference paged_decode: {e}", case.spec));
    outputs.push(Output {
        who: "reference".into(),
        got: oracle,
        arith: None,
    });
    outputs
}
