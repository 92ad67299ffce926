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
//! | `h1` | H=1 | single KV head (MQA), and H=1 with a non-canonical head stride |
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

use std::ops::Range;

use kvlayout::ops::DecodeParams;
use kvlayout::{AxisOrder, Content, DType, KvCacheLayout, Paged, Placement};

use crate::backend::HostTensor;

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

/// A family of layouts: one content and geometry, several placements and dtypes.
struct Family {
    id: &'static str,
    head: &'static str,
    dtypes: &'static [&'static str],
    placements: &'static [&'static str],
    ops: Ops,
}

const FAMILIES: &[Family] = &[
    Family {
        id: "std",
        head: "kv L=2 B=3 N=16 H=4 D=8",
        dtypes: PLAIN,
        placements: &[
            "order=LBHNC",
            "order=LBNHC",
            "order=BLHNC",
            "order=BLNHC",
            "order=BHLNC",
            "order=NHD page=4160",
            "order=BLNHC page=4160",
            "order=HND base=256",
            "order=LBHNC block_stride=4160",
            "legacy=flash-attn-nhd",
            "legacy=flash-attn-hnd",
            "legacy=flashinfer-nhd",
            "legacy=flashinfer-hnd",
            "legacy=flashinfer-hnd base=64",
            "legacy=separate-nhd",
            "legacy=separate-hnd",
            "{sliced}",
        ],
        ops: Ops::All,
    },
    Family {
        id: "orders",
        head: "kv L=2 B=3 N=5 H=4 D=8",
        dtypes: &["f16", "fp8_e5m2"],
        placements: &["{all-orders}", "order=NHD", "order=HND"],
        ops: Ops::All,
    },
    Family {
        id: "b2",
        head: "kv L=1 B=2 N=16 H=4 D=8",
        dtypes: &["f32", "f16", "fp8_e4m3"],
        placements: &[
            "order=NHD",
            "order=HND",
            "order=BLNHC",
            "legacy=flash-attn-nhd",
            "legacy=flash-attn-hnd",
            "legacy=flashinfer-nhd",
            "legacy=flashinfer-hnd",
        ],
        ops: Ops::All,
    },
    Family {
        id: "h1",
        head: "kv L=2 B=3 N=16 H=1 D=8",
        dtypes: &["f32", "bf16", "fp8_e5m2"],
        placements: &[
            "order=NHD",
            "order=HND",
            "order=BLHNC",
            "legacy=flashinfer-nhd",
            "legacy=separate-hnd",
            "{h1-strided}",
        ],
        ops: Ops::All,
    },
    Family {
        id: "hn",
        head: "kv L=1 B=3 N=4 H=4 D=8",
        dtypes: &["f16", "bf16", "fp8_e4m3"],
        placements: &[
            "order=NHD",
            "order=HND",
            "order=BHLNC",
            "legacy=flash-attn-hnd",
            "legacy=flashinfer-nhd",
        ],
        ops: Ops::All,
    },
    Family {
        id: "b2h2n2",
        head: "kv L=1 B=2 N=2 H=2 D=8",
        dtypes: &["f32", "fp8_e4m3"],
        placements: &[
            "order=NHD",
            "order=HND",
            "legacy=flash-attn-nhd",
            "legacy=flashinfer-nhd",
            "legacy=flashinfer-hnd",
        ],
        ops: Ops::All,
    },
    Family {
        id: "vllm",
        head: "kv L=2 B=3 N=16 H=2 D=32",
        dtypes: PLAIN,
        placements: &[
            "legacy=vllm-paged-v1",
            "legacy=vllm-paged-v1 base=64",
            "order=NHD",
            "order=HND",
            "legacy=separate-hnd",
        ],
        ops: Ops::All,
    },
    Family {
        id: "d192",
        head: "kv L=1 B=3 N=16 H=2 D=192 Dv=128",
        dtypes: &["f16", "bf16", "fp8_e4m3"],
        placements: &[
            "order=NHD",
            "order=HND",
            "order=BLNHC page=20544",
            "legacy=separate-nhd",
        ],
        ops: Ops::All,
    },
    Family {
        id: "mla",
        head: "mla L=1 B=3 N=16 rank=512 rope=64",
        dtypes: PLAIN,
        placements: &[
            "order=NHD",
            "order=HND",
            "order=BLNHC",
            "order=NHD base=512",
            "order=BLNHC page=36928",
        ],
        ops: Ops::All,
    },
    Family {
        id: "scaled",
        head: "kv-scaled L=2 B=3 N=16 H=4 D=8",
        dtypes: QUANT,
        placements: &[
            "order=NHD",
            "order=HND",
            "order=BLHNC",
            "order=BLNHC",
            "order=BHLNC",
            "order=NHD page=4160",
            "order=HND base=256",
        ],
        ops: Ops::All,
    },
    Family {
        id: "scaled-dv",
        head: "kv-scaled L=1 B=3 N=16 H=2 D=16 Dv=8",
        dtypes: &["int8", "fp8_e4m3"],
        placements: &["order=NHD", "order=HND", "order=BLNHC page=2112"],
        ops: Ops::All,
    },
    Family {
        id: "scales",
        head: "kv L=2 B=3 N=16 H=4 D=8 k_scale=0.5 v_scale=2",
        dtypes: &["fp8_e4m3", "fp8_e5m2", "bf16"],
        placements: &["order=NHD", "order=HND", "legacy=flashinfer-nhd"],
        ops: Ops::All,
    },
    Family {
        id: "long",
        head: "kv L=1 B=24 N=16 H=1 D=8",
        dtypes: &["f32", "bf16", "fp8_e4m3"],
        placements: &["order=NHD", "order=HND"],
        ops: Ops::All,
    },
    Family {
        id: "tiles",
        head: "kv L=1 B=12 N=16 H=4 D=72 Dv=40",
        dtypes: &["f32", "bf16", "fp8_e4m3"],
        placements: &["order=NHD", "order=HND", "legacy=separate-nhd"],
        ops: Ops::All,
    },
    Family {
        id: "tiles-vllm",
        head: "kv L=1 B=12 N=16 H=2 D=64",
        dtypes: &["f16"],
        placements: &["legacy=vllm-paged-v1", "order=NHD"],
        ops: Ops::All,
    },
    Family {
        id: "big",
        head: "kv L=1 B=128 N=16 H=8 D=64",
        dtypes: &["f32"],
        placements: &["order=NHD", "order=HND", "order=NHD page=65600"],
        ops: Ops::Movers,
    },
    Family {
        id: "opaque",
        head: "bytes L=2 B=3 N=16 row=656",
        dtypes: &["u8"],
        placements: &["order=NHD", "order=BLNHC", "order=HND page=10560"],
        ops: Ops::NoKeys,
    },
    Family {
        id: "mamba-ssm",
        head: "mamba-ssm L=2 B=3 N=16 H=4 head_dim=8 state=4",
        dtypes: &["f32", "bf16"],
        placements: &["order=LBHNC", "order=BHLNC", "order=BLNHC"],
        ops: Ops::NoKeys,
    },
    Family {
        id: "mamba-conv",
        head: "mamba-conv L=2 B=3 N=16 conv_dim=12 conv_width=3",
        dtypes: &["bf16"],
        placements: &["order=LBHNC", "order=BLHNC"],
        ops: Ops::NoKeys,
    },
    Family {
        id: "mla-c4",
        head: "mla L=1 B=3 N=16 tps=4 rank=32 rope=8",
        dtypes: &["bf16"],
        placements: &["order=NHD", "order=BLNHC"],
        ops: Ops::NoKeys,
    },
];

/// `H = 1` with a head stride of 7 bytes (meaningless for one head, and not aligned), rows
/// spaced wider than they are, padded pages, and a view sliced from a larger buffer.
fn h1_strided(e: u64) -> String {
    let (base, ts) = (96, 24 * e);
    let bs = 16 * ts + 64;
    let ls = 3 * bs + 128;
    let end = base + 2 * ls + 256;
    format!(
        "@K=0:{base}:{ls}:{bs}:7:{ts}:8:0:{e} @V=0:{}:{ls}:{bs}:7:{ts}:8:0:{e} @buf0=0..{end}",
        base + 8 * e
    )
}

/// `std` geometry as explicit strides: head-major page, K and V rows apart, sliced from a
/// larger buffer (base offset 128, 192 bytes of slack after the last page).
fn std_sliced(e: u64) -> String {
    let (base, ts) = (128, 8 * e);
    let hs = 16 * ts;
    let bs = 2 * 4 * hs; // K page then V page
    let ls = 3 * bs;
    let end = base + 2 * ls + 192;
    format!(
        "@K=0:{base}:{ls}:{bs}:{hs}:{ts}:8:0:{e} @V=0:{}:{ls}:{bs}:{hs}:{ts}:8:0:{e} @buf0=0..{end}",
        base + 4 * hs
    )
}

fn activation_dtype(cache: DType, i: usize) -> DType {
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
pub fn all_cases() -> Vec<LayoutCase> {
    let mut out = Vec::new();
    for f in FAMILIES {
        for dtype in f.dtypes {
            let e = dtype
                .parse::<DType>()
                .unwrap_or_else(|_| panic!("dtype {dtype}"))
                .size_bytes();
            let mut placements: Vec<(String, String)> = Vec::new();
            for p in f.placements {
                match *p {
                    "{all-orders}" => placements.extend(
                        ALL_ORDERS
                            .iter()
                            .map(|o| (o.to_string(), format!("order={o}"))),
                    ),
                    "{h1-strided}" => placements.push(("h1-strided".into(), h1_strided(e))),
                    "{sliced}" => placements.push(("sliced".into(), std_sliced(e))),
                    p => placements.push((
                        p.replace("order=", "")
                            .replace("legacy=", "")
                            .replace(' ', "+"),
                        p.to_string(),
                    )),
                }
            }
            for (i, (pname, p)) in placements.into_iter().enumerate() {
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
    // Derived layouts: explicit strides, paired with dense layouts of the same content.
    let std = |dtype: &str, order: &str| -> KvCacheLayout {
        format!("kv L=2 B=3 N=16 H=4 D=8 dtype={dtype} order={order}")
            .parse()
            .expect("std layout")
    };
    out.push(derived(
        "tp/HND-tp2-rank1/bf16",
        std("bf16", "HND").tp_slice(2, 1),
        0,
    ));
    out.push(derived(
        "tp/NHD-tp2-rank0/bf16",
        std("bf16", "NHD").tp_slice(2, 0),
        1,
    ));
    out.push(make(
        "tp/dense-H2/bf16".into(),
        "kv L=2 B=3 N=16 H=2 D=8 dtype=bf16 order=NHD".into(),
        Ops::All,
        2,
    ));
    out.push(derived(
        "tp/H2-tp4-rank3-replicated/f32",
        "kv L=2 B=3 N=16 H=2 D=8 dtype=f32 order=BLNHC"
            .parse::<KvCacheLayout>()
            .expect("layout")
            .tp_slice(4, 3),
        0,
    ));
    out.push(derived(
        "split/NHD-ratio2/f16",
        std("f16", "NHD").split_blocks(2),
        0,
    ));
    out.push(make(
        "split/dense-B6-N8/f16".into(),
        "kv L=2 B=6 N=8 H=4 D=8 dtype=f16 order=HND".into(),
        Ops::All,
        1,
    ));
    out.push(derived(
        "split/NHD-ratio4/fp8_e4m3",
        std("fp8_e4m3", "NHD").split_blocks(4),
        2,
    ));
    out
}

/// `(K width, V width, is MLA)` of K/V or MLA content.
pub fn widths(l: &KvCacheLayout) -> Option<(usize, usize, bool)> {
    match *l.content() {
        Content::Kv {
            head_size,
            head_size_v,
        }
        | Content::KvScaled {
            head_size,
            head_size_v,
        } => Some((head_size as usize, head_size_v as usize, false)),
        Content::Mla {
            kv_lora_rank,
            rope_dim,
        } => Some((
            (kv_lora_rank + rope_dim) as usize,
            kv_lora_rank as usize,
            true,
        )),
        _ => None,
    }
}

/// A small deterministic generator (xorshift64*), seeded per case by name.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded by a string (FNV-1a).
    pub fn new(seed: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in seed.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h | 1)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[-2, 2)`.
    pub fn value(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    }

    /// `n` values in `[-2, 2)`.
    pub fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value()).collect()
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next_u64() >> 56) as u8).collect()
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// One decode step of a workload.
#[derive(Debug, Clone)]
pub struct DecodeCase {
    /// `mha`, `gqa4+window`, ...
    pub name: &'static str,
    /// `[seqs, num_q_heads, qk_width]`.
    pub query: HostTensor,
    /// Parameters.
    pub params: DecodeParams,
}

/// The write and decode inputs of a K/V or MLA case.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Layer written and read (the last one, so layer strides matter).
    pub layer: u64,
    /// `[tokens, heads, k_width]` (MLA: the latent).
    pub key: HostTensor,
    /// `[tokens, heads, v_width]`; `None` for MLA.
    pub value: Option<HostTensor>,
    /// Slot per token, shuffled, with padding tokens (negative slots) between real ones.
    pub slot_mapping: Vec<i64>,
    /// `(sequence, position)` of each token; `None` for padding.
    pub token_pos: Vec<Option<(usize, usize)>>,
    /// `[seqs, blocks_per_seq]`; entries past a sequence's blocks are -1 or huge (never read).
    pub block_table: Vec<i32>,
    /// Row length of the block table.
    pub blocks_per_seq: usize,
    /// Tokens per sequence: a partial last block, full blocks, and an empty sequence.
    pub seq_lens: Vec<u32>,
    /// Decode steps: MHA, GQA/MQA with a window, with a soft-cap, window 1 with both.
    pub decodes: Vec<DecodeCase>,
}

impl Workload {
    /// The host-side `paged_decode` arguments of decode step `dc` (the query on the host).
    pub fn decode_args<'a>(&'a self, dc: &'a DecodeCase) -> kvlayout_cpu::Decode<'a> {
        kvlayout_cpu::Decode {
            layer: self.layer,
            query: dc.query.as_activations(),
            block_table: &self.block_table,
            blocks_per_seq: self.blocks_per_seq,
            seq_lens: &self.seq_lens,
            params: dc.params,
        }
    }
}

/// The deterministic workload of a case (`None` for movers-only content).
pub fn workload(case: &LayoutCase) -> Option<Workload> {
    let l = &case.layout;
    let (kw, vw, mla) = widths(l)?;
    let g = *l.geometry();
    let (nb, bs, heads) = (g.num_blocks as usize, g.block_size as usize, g.num_kv_heads);
    let mut rng = Rng::new(&case.name);
    let mut blocks: Vec<i32> = (0..nb as i32).collect();
    rng.shuffle(&mut blocks);
    let n1 = if nb >= 2 { (nb / 3).max(1) } else { 0 };
    let n0 = nb - n1;
    let per = n0.max(n1);
    let lens = [
        (n0 * bs - bs / 3) as u32,
        (n1 * bs) as u32,
        0, // an empty sequence
    ];
    let mut table = vec![-1i32; 3 * per];
    table[..n0].copy_from_slice(&blocks[..n0]);
    table[per..per + n1].copy_from_slice(&blocks[n0..]);
    if per > n1 {
        table[per + n1] = i32::MAX; // past the sequence's blocks: never read
    }
    let mut positions: Vec<(usize, usize)> = (0..2)
        .flat_map(|s| (0..lens[s] as usize).map(move |t| (s, t)))
        .collect();
    rng.shuffle(&mut positions);
    let mut token_pos = Vec::new();
    for (i, p) in positions.into_iter().enumerate() {
        if i % 5 == 2 {
            token_pos.push(None); // padding token
        }
        token_pos.push(Some(p));
    }
    token_pos.push(None);
    // Padding is any negative slot: mostly vLLM's -1, sometimes -2 or i64::MIN.
    let pads = [-1, -1, -2, i64::MIN];
    let slot_mapping: Vec<i64> = token_pos
        .iter()
        .enumerate()
        .map(|(i, p)| match *p {
            Some((s, t)) => i64::from(table[s * per + t / bs]) * bs as i64 + (t % bs) as i64,
            None => pads[i % pads.len()],
        })
        .collect();
    let tokens = token_pos.len();
    let h = heads as usize;
    let act = case.activations;
    let key = HostTensor::from_f32(act, &rng.values(tokens * h * kw));
    let value = (!mla).then(|| HostTensor::from_f32(act, &rng.values(tokens * h * vw)));
    let scale = 1.0 / (kw as f32).sqrt();
    // (name, query heads per KV head, scale, window, soft-cap)
    let mut step = |name, group: u64, scale, sliding_window, soft_cap| {
        let num_q_heads = group * heads;
        DecodeCase {
            name,
            query: HostTensor::from_f32(act, &rng.values(3 * num_q_heads as usize * kw)),
            params: DecodeParams {
                num_q_heads,
                scale,
                sliding_window,
                soft_cap,
            },
        }
    };
    let decodes = vec![
        step("mha", 1, scale, None, None),
        step("gqa4+window", 4, scale, Some(bs as u64 + 3), None),
        step("gqa2+softcap", 2, 2.0 * scale, None, Some(1.0)),
        step("gqa8+window1+softcap", 8, scale, Some(1), Some(0.5)),
    ];
    Some(Workload {
        layer: g.num_layers - 1,
        key,
        value,
        slot_mapping,
        token_pos,
        block_table: table,
        blocks_per_seq: per,
        seq_lens: lens.to_vec(),
        decodes,
    })
}

/// What the block movers do in a case.
#[derive(Debug, Clone)]
pub struct MoverPlan {
    /// `copy_blocks` pairs (a self-pair included: a no-op).
    pub copy_pairs: Vec<(u64, u64)>,
    /// `swap_blocks` pairs, between two layouts of one group.
    pub swap_pairs: Vec<(u64, u64)>,
    /// Blocks to gather, in staging order.
    pub gather_blocks: Vec<u64>,
    /// Head range gathered.
    pub heads: Range<u64>,
    /// The staging layout: same content, `heads.len()` heads, one block more than gathered.
    pub staging: KvCacheLayout,
}

/// The movers of a case.
pub fn mover_plan(case: &LayoutCase, index: usize) -> MoverPlan {
    let l = &case.layout;
    let g = *l.geometry();
    let last = g.num_blocks - 1;
    let mut copy_pairs = vec![(0, last)];
    if g.num_blocks >= 3 {
        copy_pairs.push((1, 1));
    }
    if g.num_blocks >= 5 {
        copy_pairs.push((2, last - 2));
    }
    let h = g.num_kv_heads;
    let heads = match h {
        1 => 0..1,
        2 | 3 => 1..h,
        _ => 1..3,
    };
    let gather_blocks = vec![last, 0];
    let mut spec = l.spec().clone();
    spec.geometry.num_kv_heads = heads.end - heads.start;
    spec.geometry.num_blocks = gather_blocks.len() as u64 + 1;
    let order = if index.is_multiple_of(2) {
        AxisOrder::LBHNC
    } else {
        AxisOrder::BHLNC
    };
    spec.placement = Placement::Paged(Paged::new(order));
    let staging_spec = spec.to_string();
    let staging: KvCacheLayout = staging_spec
        .parse()
        .unwrap_or_else(|e| panic!("{}: staging {staging_spec}: {e}", case.name));
    MoverPlan {
        copy_pairs,
        swap_pairs: vec![(0, last), (last, 0)],
        gather_blocks,
        heads,
        staging,
    }
}

/// A case outside the table (refusal tests, the outside reference): one spec string.
pub fn case_from_spec(name: &str, spec: &str, activations: DType) -> LayoutCase {
    let mut c = make(name.to_string(), spec.to_string(), Ops::All, 0);
    c.activations = activations;
    c
}
