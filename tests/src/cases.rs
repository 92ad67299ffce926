//! The table of conformance cases: layouts (every physical order family, padded pages, base
//! offsets, every legacy layout, different K/V widths, H = 1, MLA, inline scales) x dtypes,
//! with deterministic data. Each op of the contract runs on each.

use kvlayout::{Content, KvCacheLayout};

/// Blocks, tokens per block, KV heads, head size of the K/V cases.
pub const BLOCKS: u64 = 6;
/// Tokens per block.
pub const BLOCK_SIZE: u64 = 16;

/// Placements of plain K/V content (`{e}` is replaced by the padded page size in bytes).
const KV_PLACEMENTS: &[&str] = &[
    "order=LBHNC",
    "order=LBNHC",
    "order=BLHNC",
    "order=BLNHC",
    "order=BHLNC",
    "order=NHBLC",
    "order=NHD page={page}",
    "order=HND base=256",
    "legacy=vllm-paged-v1",
    "legacy=flash-attn-nhd",
    "legacy=flash-attn-hnd",
    "legacy=flashinfer-nhd",
    "legacy=flashinfer-hnd",
    "legacy=separate-nhd",
    "legacy=separate-hnd",
];

/// Dtypes of plain K/V caches.
pub const KV_DTYPES: &[&str] = &["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"];

/// One layout of the table.
#[derive(Debug, Clone)]
pub struct Case {
    /// Spec string.
    pub spec: String,
    /// The layout.
    pub layout: KvCacheLayout,
}

fn case(spec: String) -> Case {
    let layout = spec.parse().unwrap_or_else(|e| panic!("case {spec}: {e}"));
    Case { spec, layout }
}

/// Every layout of the table for one dtype of plain K/V content, plus the extra shapes.
pub fn kv_cases(dtype: &str) -> Vec<Case> {
    let e = dtype
        .parse::<kvlayout::DType>()
        .expect("dtype name")
        .size_bytes();
    let page = 4 * BLOCK_SIZE * 2 * 16 * e + 64;
    let mut out: Vec<Case> = KV_PLACEMENTS
        .iter()
        .map(|p| {
            case(format!(
                "kv L=2 B={BLOCKS} N={BLOCK_SIZE} H=4 D=16 dtype={dtype} {}",
                p.replace("{page}", &page.to_string())
            ))
        })
        .collect();
    out.push(case(format!(
        "kv L=2 B={BLOCKS} N={BLOCK_SIZE} H=4 D=16 Dv=8 dtype={dtype} order=NHD"
    )));
    out.push(case(format!(
        "kv L=2 B={BLOCKS} N={BLOCK_SIZE} H=1 D=16 dtype={dtype} order=HND"
    )));
    out.push(case(format!(
        "kv L=1 B={BLOCKS} N={BLOCK_SIZE} H=16 D=16 dtype={dtype} order=NHD"
    ))); // H = N
    out
}

/// Cases of other content kinds: MLA and inline-scale rows.
pub fn other_cases() -> Vec<Case> {
    vec![
        case(format!(
            "mla L=2 B={BLOCKS} N={BLOCK_SIZE} rank=16 rope=8 dtype=bf16 order=NHD"
        )),
        case(format!(
            "mla L=1 B={BLOCKS} N={BLOCK_SIZE} rank=32 rope=16 dtype=f32 order=BLNHC"
        )),
        case(format!(
            "kv-scaled L=2 B={BLOCKS} N={BLOCK_SIZE} H=4 D=16 dtype=int8 order=NHD"
        )),
        case(format!(
            "kv-scaled L=2 B={BLOCKS} N={BLOCK_SIZE} H=4 D=16 dtype=fp8_e4m3 order=HND"
        )),
        case(format!(
            "kv-scaled L=1 B={BLOCKS} N={BLOCK_SIZE} H=2 D=16 Dv=8 dtype=int8 order=BLHNC"
        )),
    ]
}

/// `(K width, V width, is MLA)` of a case's content.
pub fn widths(l: &KvCacheLayout) -> (usize, usize, bool) {
    match *l.content() {
        Content::Kv {
            head_size,
            head_size_v,
        }
        | Content::KvScaled {
            head_size,
            head_size_v,
        } => (head_size as usize, head_size_v as usize, false),
        Content::Mla {
            kv_lora_rank,
            rope_dim,
        } => (
            (kv_lora_rank + rope_dim) as usize,
            kv_lora_rank as usize,
            true,
        ),
        _ => (0, 0, false),
    }
}

/// Deterministic values in [-2, 2).
pub fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(747796405).wrapping_add(2891336453) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 4001) as f32 / 1000.0 - 2.0
        })
        .collect()
}
