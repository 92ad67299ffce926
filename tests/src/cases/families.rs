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

/// The family `id` of layouts `head` (a spec string's kind and geometry), in each of
/// `dtypes` and `placements`, running `ops`.
const fn fam(
    id: &'static str,
    head: &'static str,
    dtypes: &'static [&'static str],
    ops: Ops,
    placements: &'static [&'static str],
) -> Family {
    Family {
        id,
        head,
        dtypes,
        placements,
        ops,
    }
}

#[rustfmt::skip] // a table: one family a row (two where its placements are long)
pub(super) const FAMILIES: &[Family] = &[
    fam("std", "kv L=2 B=3 N=16 H=4 D=8", PLAIN, Ops::All, &["order=LBHNC", "order=LBNHC",
        "order=BLHNC", "order=BLNHC", "order=BHLNC", "order=NHD page=4160", "order=BLNHC page=4160",
        "order=HND base=256", "order=LBHNC block_stride=4160", "tensor=flash-attn-nhd",
        "tensor=flash-attn-hnd", "tensor=flashinfer-nhd", "tensor=flashinfer-hnd",
        "tensor=flashinfer-hnd base=64", "tensor=separate-nhd", "tensor=separate-hnd", "{sliced}"]),
    fam("orders", "kv L=2 B=3 N=5 H=4 D=8", &["f16", "fp8_e5m2"], Ops::All, &["{all-orders}",
        "order=NHD", "order=HND"]),
    fam("b2", "kv L=1 B=2 N=16 H=4 D=8", &["f32", "f16", "fp8_e4m3"], Ops::All, &["order=NHD",
        "order=HND", "order=BLNHC", "tensor=flash-attn-nhd", "tensor=flash-attn-hnd",
        "tensor=flashinfer-nhd", "tensor=flashinfer-hnd"]),
    fam("h1", "kv L=2 B=3 N=16 H=1 D=8", &["f32", "bf16", "fp8_e5m2"], Ops::All, &["order=NHD",
        "order=HND", "order=BLHNC", "tensor=flashinfer-nhd", "tensor=separate-hnd",
        "{h1-strided}"]),
    fam("hn", "kv L=1 B=3 N=4 H=4 D=8", &["f16", "bf16", "fp8_e4m3"], Ops::All, &["order=NHD",
        "order=HND", "order=BHLNC", "tensor=flash-attn-hnd", "tensor=flashinfer-nhd"]),
    fam("b2h2n2", "kv L=1 B=2 N=2 H=2 D=8", &["f32", "fp8_e4m3"], Ops::All, &["order=NHD",
        "order=HND", "tensor=flash-attn-nhd", "tensor=flashinfer-nhd", "tensor=flashinfer-hnd"]),
    fam("vllm", "kv L=2 B=3 N=16 H=2 D=32", PLAIN, Ops::All, &["tensor=vllm-paged-v1",
        "tensor=vllm-paged-v1 base=64", "order=NHD", "order=HND", "tensor=separate-hnd"]),
    fam("d192", "kv L=1 B=3 N=16 H=2 D=192 Dv=128", &["f16", "bf16", "fp8_e4m3"], Ops::All,
        &["order=NHD", "order=HND", "order=BLNHC page=20544", "tensor=separate-nhd"]),
    fam("mla", "mla L=1 B=3 N=16 rank=512 rope=64", PLAIN, Ops::All, &["order=NHD", "order=HND",
        "order=BLNHC", "order=NHD base=512", "order=BLNHC page=36928"]),
    fam("scaled", "kv-scaled L=2 B=3 N=16 H=4 D=8", QUANT, Ops::All, &["order=NHD", "order=HND",
        "order=BLHNC", "order=BLNHC", "order=BHLNC", "order=NHD page=4160", "order=HND base=256"]),
    fam("scaled-dv", "kv-scaled L=1 B=3 N=16 H=2 D=16 Dv=8", &["int8", "fp8_e4m3"], Ops::All,
        &["order=NHD", "order=HND", "order=BLNHC page=2112"]),
    fam("scales", "kv L=2 B=3 N=16 H=4 D=8 k_scale=0.5 v_scale=2", &["fp8_e4m3", "fp8_e5m2",
        "bf16"], Ops::All, &["order=NHD", "order=HND", "tensor=flashinfer-nhd"]),
    fam("long", "kv L=1 B=24 N=16 H=1 D=8", &["f32", "bf16", "fp8_e4m3"], Ops::All, &["order=NHD",
        "order=HND"]),
    fam("tiles", "kv L=1 B=12 N=16 H=4 D=72 Dv=40", &["f32", "bf16", "fp8_e4m3"], Ops::All,
        &["order=NHD", "order=HND", "tensor=separate-nhd"]),
    fam("wide", "kv L=1 B=3 N=16 H=2 D=16", &["bf16", "fp8_e4m3"], Ops::All, &["order=NHD",
        "order=HND", "order=NHD base=8", "order=HND page=2056"]),
    fam("tiles-vllm", "kv L=1 B=12 N=16 H=2 D=64", &["f16"], Ops::All, &["tensor=vllm-paged-v1",
        "order=NHD"]),
    fam("big", "kv L=1 B=128 N=16 H=8 D=64", &["f32"], Ops::Movers, &["order=NHD", "order=HND",
        "order=NHD page=65600"]),
    fam("opaque", "bytes L=2 B=3 N=16 row=656", &["u8"], Ops::NoKeys, &["order=NHD", "order=BLNHC",
        "order=HND page=10560"]),
    fam("mamba-ssm", "mamba-ssm L=2 B=3 N=16 H=4 head_dim=8 state=4", &["f32", "bf16"], Ops::NoKeys,
        &["order=LBHNC", "order=BHLNC", "order=BLNHC"]),
    fam("mamba-conv", "mamba-conv L=2 B=3 N=16 conv_dim=12 conv_width=3", &["bf16"], Ops::NoKeys,
        &["order=LBHNC", "order=BLHNC"]),
    fam("mla-c4", "mla L=1 B=3 N=16 tps=4 rank=32 rope=8", &["bf16"], Ops::NoKeys, &["order=NHD",
        "order=BLNHC"]),
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
                        .replace("tensor=", "")
                        .replace(' ', "+"),
                    p.to_string(),
                )),
            }
        }
        placements
    }
}
