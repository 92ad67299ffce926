//! The families of the table: one content and geometry each, several placements and dtypes.

use super::{Ops, ALL_ORDERS, PLAIN, QUANT};

/// A family of layouts: one content and geometry, several placements and dtypes.
pub(super) struct Family {
    pub(super) id: &'static str,
    pub(super) head: &'static str,
    pub(super) dtypes: &'static [&'static str],
    pub(super) placements: &'static [&'static str],
    pub(super) ops: Ops,
}

pub(super) const FAMILIES: &[Family] = &[
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

impl Family {
    /// `(name, spec keys)` of each placement, for elements of `e` bytes.
    pub(super) fn placement_specs(&self, e: u64) -> Vec<(String, String)> {
        let mut placements: Vec<(String, String)> = Vec::new();
        for p in self.placements {
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
        placements
    }
}
