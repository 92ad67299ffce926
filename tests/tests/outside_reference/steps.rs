//! The layouts and the decode steps the outside reference runs beyond the workload's.

use kvlayout::ops::DecodeParams;
use kvlayout::{DType, Field, KvCacheLayout};
use kvlayout_conformance::backend::HostTensor;
use kvlayout_conformance::cases::{widths, DecodeCase, LayoutCase, Rng, Workload};
use kvlayout_cpu::CpuBackend;

/// `(spec, activation dtype, tolerance)` of the layouts whose four workload steps keep a
/// fixed tolerance against numpy's dense answer.
pub(crate) const LAYOUTS: &[(&str, DType, f64)] = &[
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
        "kv L=1 B=6 N=16 H=2 D=32 dtype=f32 tensor=vllm-paged-v1",
        DType::F32,
        1e-5,
    ),
    (
        "kv L=1 B=4 N=16 H=1 D=64 dtype=f32 tensor=flashinfer-hnd",
        DType::F32,
        1e-5,
    ),
    (
        "kv L=1 B=4 N=8 H=4 D=16 dtype=f32 tensor=separate-nhd",
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
        "kv L=1 B=6 N=16 H=2 D=64 dtype=f16 tensor=flash-attn-hnd",
        DType::F16,
        2e-2,
    ),
    (
        "kv L=1 B=6 N=16 H=4 D=32 dtype=bf16 tensor=vllm-paged-v1",
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
pub(crate) const MORE_LAYOUTS: &[(&str, DType)] = &[
    (
        "kv L=1 B=6 N=16 H=2 D=64 dtype=f32 order=HND k_scale=0.5 v_scale=2",
        DType::F32,
    ),
    (
        "kv L=2 B=6 N=16 H=2 D=64 dtype=bf16 order=NHD k_scale=3 v_scale=0.25",
        DType::Bf16,
    ),
    (
        "kv L=1 B=5 N=16 H=2 D=64 dtype=f16 tensor=flashinfer-nhd k_scale=3 v_scale=0.25",
        DType::F16,
    ),
    (
        "kv L=1 B=6 N=16 H=4 D=32 dtype=fp8_e4m3 tensor=flash-attn-nhd k_scale=0.5 v_scale=2",
        DType::F16,
    ),
    (
        "kv L=1 B=6 N=16 H=2 D=32 dtype=fp8_e5m2 tensor=vllm-paged-v1 k_scale=3 v_scale=0.25",
        DType::F32,
    ),
    (
        "kv L=1 B=6 N=16 H=2 D=64 dtype=bf16 tensor=separate-hnd",
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
pub(crate) const SPLIT_LAYOUTS: usize = 2;

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
pub(crate) fn capped_steps(case: &LayoutCase, w: &Workload) -> Vec<DecodeCase> {
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
                query: HostTensor::from_f32(case.activations, &rng.values(n))
                    .expect("cases hold activation dtypes"),
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
pub(crate) fn splits(be: &CpuBackend, l: &KvCacheLayout, w: &Workload, p: &DecodeParams) -> bool {
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
