//! The table of conformance cases: named layouts x dtypes, each with a deterministic workload
//! for every op of the contract.
//!
//! Layout families (each a spec-string head, its dtypes, its placements):
//!
//! | family | geometry | why |
//! |---|---|---|
//! | `std` | L=2 B=3 N=16 H=4 D=8 | sizes that expose swapped strides; the five named orders, padded pages, base offsets, every FlashAttention / FlashInfer / separate-K/V layout |
//! | `orders` | L=2 B=3 N=5 H=4 D=8 | all 24 physical orders (every axis a different size) |
//! | `b2` | B=2 | `shape[0] == 2` ambiguity |
//! | `h1` | H=1 | single KV head (MQA), and H=1 with a non-canonical head stride; as every layout of one or two KV heads, decode groups of 12 and 20 too |
//! | `hn` | H=N=4 | heads and tokens interchangeable by shape |
//! | `b2h2n2` | B=H=N=2 | all of them at once |
//! | `vllm` | D=32 | legacy vLLM x-split key (x = 4, 8, 16 for 4-, 2-, 1-byte elements) |
//! | `d192` | D=192 Dv=128 | K and V of different widths |
//! | `mla` | rank 512 + rope 64 | the 576-wide MLA latent, V its first 512 |
//! | `scaled` / `scaled-dv` | int8 / fp8 rows with inline f32 scales | scales at their byte offsets |
//! | `scales` | per-tensor k_scale / v_scale | dequantization by the tensor scales |
//! | `long` | B=24 H=1 | sequences long enough for split-context decode |
//! | `tiles`, `tiles-vllm` | B=12 H=4 D=72 Dv=40 | sequences of several decode tiles, GQA groups of 1-8, SIMD tails |
//! | `big` | 8.4 MB caches | block movers only: the large-copy (streaming) paths |
//! | `opaque`, `mamba-*`, `mla-c4` | per-block states, opaque rows, tokens_per_state=4 | block movers only (write/decode refuse) |
//! | derived | TP head slices, kernel-block splits | explicit-stride layouts, printed and re-parsed |
//!
//! Cases whose layouts hold the same content (same [`LayoutCase::group`]) are paired for
//! `convert` and `swap_blocks`.

use kvlayout::{DType, KvCacheLayout};

mod families;
mod workload;

pub use workload::{mover_plan, workload, DecodeCase, MoverPlan, Rng, Workload};

use families::FAMILIES;

/// Which ops a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ops {
    /// Every op (K/V, inline-scale and MLA content).
    All,
    /// Block movers only: caches too large for the scalar reference's decode, there to take
    /// the movers' large-copy paths (the CPU backend streams copies of 8 MiB and more).
    Movers,
    /// Block movers; `write_kv` and `paged_decode` must refuse with `Unsupported` (content
    /// without keys and values: opaque rows, Mamba states, compressed tokens).
    NoKeys,
}

/// One layout of the table.
#[derive(Debug, Clone)]
pub struct LayoutCase {
    /// `family/placement/dtype`.
    pub name: String,
    /// The spec string it was parsed from.
    pub spec: String,
    /// The layout.
    pub layout: KvCacheLayout,
    /// Cases of one group hold the same content and block count (pairs for convert / swap).
    pub group: String,
    /// Which ops apply.
    pub ops: Ops,
    /// Element type of the keys, values and queries handed to the ops.
    pub activations: DType,
}

/// Plain K/V dtypes.
pub const PLAIN: &[&str] = &["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"];
/// Dtypes of inline-scale rows.
pub const QUANT: &[&str] = &["int8", "fp8_e4m3", "fp8_e5m2"];
/// The five named physical orders.
pub const NAMED_ORDERS: &[&str] = &["LBHNC", "LBNHC", "BLHNC", "BLNHC", "BHLNC"];
/// All 24 physical orders.
pub const ALL_ORDERS: &[&str] = &[
    "LBHNC", "LBNHC", "BLHNC", "BLNHC", "BHLNC", "BHNLC", "BNLHC", "BNHLC", "LHBNC", "LHNBC",
    "LNBHC", "LNHBC", "HLBNC", "HLNBC", "HBLNC", "HBNLC", "HNLBC", "HNBLC", "NLBHC", "NLHBC",
    "NBLHC", "NBHLC", "NHLBC", "NHBLC",
];

/// The element type of the activations (keys, values, queries) of the `i`-th case of a family
/// over a cache of `cache`: f16 caches mostly f16, bf16 caches bf16 or f32, the rest f32 or bf16.
pub fn activation_dtype(cache: DType, i: usize) -> DType {
    match (i % 3, cache) {
        (0, DType::F16) | (2, DType::F16) => DType::F16,
        (0, DType::Bf16) => DType::Bf16,
        (1, _) | (0, _) => DType::F32,
        _ => DType::Bf16,
    }
}

/// Cases whose layouts hold the same content and block count share a group.
fn group_of(l: &KvCacheLayout) -> String {
    format!(
        "{:?} {:?} {} {:?}",
        l.content(),
        l.geometry(),
        l.dtype(),
        l.scales()
    )
}

fn make(name: String, spec: String, ops: Ops, i: usize) -> LayoutCase {
    let layout: KvCacheLayout = spec
        .parse()
        .unwrap_or_else(|e| panic!("case {name}: spec {spec:?}: {e}"));
    LayoutCase {
        group: group_of(&layout),
        activations: activation_dtype(layout.dtype(), i),
        name,
        spec,
        layout,
        ops,
    }
}

/// A derived layout (TP slice, kernel-block split), printed as its canonical spec string and
/// parsed back.
fn derived(name: &str, l: kvlayout::Result<KvCacheLayout>, i: usize) -> LayoutCase {
    let l = l.unwrap_or_else(|e| panic!("derived case {name}: {e}"));
    let c = make(name.to_string(), l.to_string(), Ops::All, i);
    assert_eq!(c.layout, l, "{name}: canonical spec string round trip");
    c
}

/// Every case of the table.
/// Every case of the table.
pub fn all_cases() -> Vec<LayoutCase> {
    let mut out = Vec::new();
    for f in FAMILIES {
        for dtype in f.dtypes {
            let e = dtype
                .parse::<DType>()
                .unwrap_or_else(|_| panic!("dtype {dtype}"))
                .size_bytes();
            for (i, (pname, p)) in f.placement_specs(e).into_iter().enumerate() {
                let (head, rest) = f.head.split_once(' ').expect("kind then keys");
                let dt = if *dtype == "u8" {
                    String::new()
                } else {
                    format!(" dtype={dtype}")
                };
                out.push(make(
                    format!("{}/{pname}/{dtype}", f.id),
                    format!("{head} {rest}{dt} {p}"),
                    f.ops,
                    i,
                ));
            }
        }
    }
    out.extend(derived_cases());
    out
}

/// Derived layouts: explicit strides, paired with dense layouts of the same content.
fn derived_cases() -> Vec<LayoutCase> {
    let std = |dtype: &str, order: &str| -> KvCacheLayout {
        format!("kv L=2 B=3 N=16 H=4 D=8 dtype={dtype} order={order}")
            .parse()
            .expect("std layout")
    };
    vec![
        derived(
            "tp/HND-tp2-rank1/bf16",
            std("bf16", "HND").tp_slice(2, 1),
            0,
        ),
        derived(
            "tp/NHD-tp2-rank0/bf16",
            std("bf16", "NHD").tp_slice(2, 0),
            1,
        ),
        make(
            "tp/dense-H2/bf16".into(),
            "kv L=2 B=3 N=16 H=2 D=8 dtype=bf16 order=NHD".into(),
            Ops::All,
            2,
        ),
        derived(
            "tp/H2-tp4-rank3-replicated/f32",
            "kv L=2 B=3 N=16 H=2 D=8 dtype=f32 order=BLNHC"
                .parse::<KvCacheLayout>()
                .expect("layout")
                .tp_slice(4, 3),
            0,
        ),
        derived("split/NHD-ratio2/f16", std("f16", "NHD").split_blocks(2), 0),
        make(
            "split/dense-B6-N8/f16".into(),
            "kv L=2 B=6 N=8 H=4 D=8 dtype=f16 order=HND".into(),
            Ops::All,
            1,
        ),
        derived(
            "split/NHD-ratio4/fp8_e4m3",
            std("fp8_e4m3", "NHD").split_blocks(4),
            2,
        ),
    ]
}

/// `(K width, V width, is MLA)` of K/V or MLA content.
pub fn widths(l: &KvCacheLayout) -> Option<(usize, usize, bool)> {
    let content = l.content();
    let (k, v) = content.kv_widths()?;
    Some((k as usize, v as usize, content.shares_latent()))
}

/// A case outside the table (refusal tests, the outside reference): one spec string.
pub fn case_from_spec(name: &str, spec: &str, activations: DType) -> LayoutCase {
    let mut c = make(name.to_string(), spec.to_string(), Ops::All, 0);
    c.activations = activations;
    c
}
