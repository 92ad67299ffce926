//! `kvlayout fill` and `decode --from/--out`: dumps read back by the tests' own reader
//! (`dump_file`), every element checked at the offset the descriptor gives it, a decode step
//! checked against an f64 attention computed here. `convert` is in `dump_convert`.

use kvlayout::{Coord, DType, Field, KvCacheLayout};
use serde_json::Value;

use super::dump_file::{
    check_coords, coords_value, elem, fill, read_st, St, Temp, HND, INT8, NHD, PADDED, SEPARATE,
};
use super::{ok, parse_json, user_error};

#[test]
fn fill_coords_puts_every_element_at_its_offset() {
    // Each spec and its element count: layers x blocks x heads x 16 tokens x row elements.
    for (spec, elements) in [
        (NHD, 2 * 3 * 4 * 16 * (8 + 8)),
        (HND, 2 * 3 * 4 * 16 * (8 + 8)),
        (PADDED, 2 * 3 * 4 * 16 * (8 + 8)),
        (INT8, 2 * 3 * 4 * 16 * (8 + 1 + 8 + 1)),
        (
            "kv-scaled L=1 B=3 N=16 H=4 D=8 dtype=fp8_e4m3 order=HND",
            3 * 4 * 16 * (8 + 1 + 8 + 1),
        ),
        (
            "kv L=1 B=2 N=16 H=1 D=8 dtype=fp8_e5m2 order=NHD",
            2 * 16 * 16,
        ),
        (
            "kv L=1 B=3 N=16 H=4 D=8 dtype=bf16 tensor=vllm-paged-v1",
            3 * 4 * 16 * 16,
        ),
        (
            "kv L=1 B=3 N=16 H=4 D=8 dtype=f32 order=HND",
            3 * 4 * 16 * 16,
        ),
        (
            "mla L=2 B=3 N=16 rank=16 rope=8 dtype=bf16 order=LBNHC",
            2 * 3 * 16 * 24,
        ),
        (SEPARATE, 3 * 4 * 16 * 16),
    ] {
        let out = fill(spec, "coords", "coords");
        let st = read_st(&out.0);
        assert_eq!(
            st.layout(),
            spec.parse::<KvCacheLayout>().unwrap(),
            "{spec}"
        );
        assert_eq!(check_coords(&st, spec), elements, "{spec}");
    }
    // The padded page really has padding, and it reads zero (checked above).
    let st = read_st(&fill(PADDED, "coords", "padded").0);
    assert_eq!(st.bytes("buffer0").len(), 2 * 3 * 4608);
}

#[test]
fn fill_views_in_the_metadata_rebuild_each_field() {
    // The HND view of K and V holds the coords values in (block, head, token, dim) order.
    let st = read_st(&fill(HND, "coords", "views").0);
    let views: Value = serde_json::from_str(&st.meta["views"]).expect("views JSON");
    let views = views.as_array().expect("a list");
    assert_eq!(views.len(), 2 * 2, "K and V of two layers");
    for v in views {
        let field: Field = v["field"].as_str().unwrap().parse().unwrap();
        let layer = v["layer"].as_u64().unwrap();
        assert_eq!(v["convention"], "standard");
        assert_eq!(super::u64s(&v["shape"]), [3, 4, 16, 8]);
        let mut i = layer * 3 * 4 * 16 * 8;
        for_each_index(&[3, 4, 16, 8], &mut |idx| {
            let got = view_elem(&st, v, idx);
            assert_eq!(got, coords_value(field, DType::F16, i), "{v} {idx:?}");
            i += 1;
        });
    }
    // Every view of every field, the x-split key's and MLA's aliases included, reads what
    // `layout.offset` addresses.
    for spec in [
        "kv L=1 B=3 N=16 H=4 D=32 dtype=f16 tensor=vllm-paged-v1",
        "mla L=2 B=3 N=16 rank=16 rope=8 dtype=bf16 order=LBNHC",
        INT8,
        PADDED,
        SEPARATE,
    ] {
        let st = read_st(&fill(spec, "coords", "views").0);
        let layout = st.layout();
        let views: Value = serde_json::from_str(&st.meta["views"]).unwrap();
        let views = views.as_array().unwrap();
        let fields = layout.readable_fields().len() as u64;
        assert_eq!(
            views.len() as u64,
            layout.geometry().num_layers * fields,
            "{spec}"
        );
        for v in views {
            assert!(v.get("refused").is_none(), "{spec}: {v}");
            let field: Field = v["field"].as_str().unwrap().parse().unwrap();
            let layer = v["layer"].as_u64().unwrap();
            let axes: Vec<&str> = v["axes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            let shape = super::u64s(&v["shape"]);
            let x = axes.iter().position(|&a| a == "x").map_or(1, |k| shape[k]);
            let mut seen = 0u64;
            for_each_index(&shape, &mut |idx| {
                let (mut b, mut h, mut t, mut d) = (0, 0, 0, 0);
                for (axis, &i) in axes.iter().zip(idx) {
                    match *axis {
                        "block" => b = i,
                        "head" => h = i,
                        "token" | "slot" => t = i,
                        "dim" | "x" => d += i,
                        "dim / x" => d += i * x,
                        other => panic!("{spec}: axis {other}"),
                    }
                }
                let at = layout
                    .offset(&Coord::new(field, layer, b, h, t, d))
                    .unwrap();
                let dtype = layout.field_map(field).unwrap().dtype;
                let want = elem(
                    dtype,
                    &st.bytes(&format!("buffer{}", at.buffer))[at.offset as usize..],
                );
                assert_eq!(view_elem(&st, v, idx), want, "{spec}: {v} {idx:?}");
                seen += 1;
            });
            let m = layout.field_map(field).unwrap();
            assert_eq!(
                seen,
                m.num_blocks * m.num_heads * m.num_slots * m.width,
                "{spec}: {v}"
            );
        }
    }
}

/// Calls `f` with every multi-index of `shape`, the last axis fastest.
fn for_each_index(shape: &[u64], f: &mut dyn FnMut(&[u64])) {
    let mut idx = vec![0u64; shape.len()];
    if shape.contains(&0) {
        return;
    }
    loop {
        f(&idx);
        let mut k = shape.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// The element of view `v` (an entry of the `views` metadata) at `idx`, as a strided-view
/// consumer reads it: `offset_bytes + sum(idx * strides_bytes)`.
fn view_elem(st: &St, v: &Value, idx: &[u64]) -> f64 {
    let strides = super::u64s(&v["strides_bytes"]);
    let off = v["offset_bytes"].as_u64().unwrap()
        + idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<u64>();
    let dtype: DType = v["dtype"].as_str().unwrap().parse().unwrap();
    elem(
        dtype,
        &st.bytes(&format!("buffer{}", v["buffer"]))[off as usize..],
    )
}

#[test]
fn fill_random_is_seeded_and_json_reports_it() {
    let (a, b, c) = (Temp::new("ra"), Temp::new("rb"), Temp::new("rc"));
    let j = parse_json(&ok(&[
        "fill",
        INT8,
        "--pattern",
        "random",
        "--seed",
        "5",
        "--out",
        a.s(),
        "--json",
    ]));
    assert_eq!(j["version"], 2);
    assert_eq!(j["pattern"], "random seed=5");
    assert_eq!(
        super::u64s(&j["buffer_bytes"]),
        [2 * 3 * 16 * 4 * (8 + 4 + 8 + 4)]
    );
    ok(&[
        "fill",
        INT8,
        "--pattern",
        "random",
        "--seed",
        "5",
        "--out",
        b.s(),
    ]);
    ok(&[
        "fill",
        INT8,
        "--pattern",
        "random",
        "--seed",
        "6",
        "--out",
        c.s(),
    ]);
    let (a, b, c) = (read_st(&a.0), read_st(&b.0), read_st(&c.0));
    assert_eq!(a.bytes("buffer0"), b.bytes("buffer0"));
    assert_ne!(a.bytes("buffer0"), c.bytes("buffer0"));
    // Inline scales in [0.5, 2), int8 values in [-127, 127].
    let l = a.layout();
    for m in l.stored_fields() {
        let at = l.offset(&Coord::new(m.field, 1, 2, 3, 15, 0)).unwrap();
        let x = elem(m.dtype, &a.bytes("buffer0")[at.offset as usize..]);
        match m.field {
            Field::KScale | Field::VScale => assert!((0.5..2.0).contains(&x), "{x}"),
            _ => assert!((-127.0..=127.0).contains(&x), "{x}"),
        }
    }
}

/// The f64 attention of one decode step, read through `layout.offset`: `[seqs, q_heads,
/// v_width]`.
fn reference_decode(st: &St) -> Vec<f64> {
    let layout = st.layout();
    let meta: Value = serde_json::from_str(&st.meta["decode"]).unwrap();
    let get = |k: &str| meta[k].as_u64().unwrap();
    let (layer, seqs, per_seq, q_heads) = (
        get("layer"),
        get("seqs"),
        get("blocks_per_seq"),
        get("q_heads"),
    );
    let (qk, vw) = (get("qk_width"), get("v_width"));
    let (table, lens, query) = (
        st.i32s("block_table"),
        st.i32s("seq_lens"),
        st.f32s("query"),
    );
    let g = layout.geometry();
    let group = q_heads / g.num_kv_heads;
    let buf = st.bytes("buffer0");
    let read = |f: Field, b: u64, h: u64, t: u64, d: u64| {
        let at = layout.offset(&Coord::new(f, layer, b, h, t, d)).unwrap();
        elem(layout.dtype(), &buf[at.offset as usize..])
    };
    let mut out = Vec::new();
    for s in 0..seqs {
        for qh in 0..q_heads {
            let q = &query[((s * q_heads + qh) * qk) as usize..][..qk as usize];
            let kvh = qh / group;
            let rows: Vec<(u64, u64)> = (0..lens[s as usize] as u64)
                .map(|t| {
                    (
                        table[(s * per_seq + t / g.block_size) as usize] as u64,
                        t % g.block_size,
                    )
                })
                .collect();
            let logits: Vec<f64> = rows
                .iter()
                .map(|&(b, t)| {
                    (0..qk)
                        .map(|d| f64::from(q[d as usize]) * read(Field::K, b, kvh, t, d))
                        .sum::<f64>()
                        / (qk as f64).sqrt()
                })
                .collect();
            let max = logits.iter().cloned().fold(f64::MIN, f64::max);
            let w: Vec<f64> = logits.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = w.iter().sum();
            for d in 0..vw {
                let v: f64 = rows
                    .iter()
                    .zip(&w)
                    .map(|(&(b, t), p)| p * read(Field::V, b, kvh, t, d))
                    .sum();
                out.push(v / total);
            }
        }
    }
    out
}

#[test]
fn decode_from_and_out_round_trip_against_the_reference() {
    let spec = "kv L=2 B=7 N=16 H=2 D=8 dtype=f16 order=HND";
    let cache = fill(spec, "random", "dec-cache");
    let (d1, d2) = (Temp::new("dec-1"), Temp::new("dec-2"));
    let step = ["--runs", "1", "--bound-mib", "1"];
    let mut args = vec![
        "decode",
        "--from",
        cache.s(),
        "--seqs",
        "2",
        "--context",
        "40",
        "--layer",
        "1",
    ];
    args.extend(step);
    args.extend(["--out", d1.s()]);
    let text = ok(&args);
    assert!(
        text.contains(&format!("cache    from {}", cache.s()))
            && text.contains("6 blocks of a random block table (seed 1)"),
        "{text}"
    );
    let st1 = read_st(&d1.0);
    assert_eq!(
        st1.bytes("buffer0"),
        read_st(&cache.0).bytes("buffer0"),
        "the cache as read"
    );
    assert_eq!(st1.meta["pattern"], "random seed=1");
    let meta: Value = serde_json::from_str(&st1.meta["decode"]).unwrap();
    assert_eq!(meta["layer"], 1);
    assert_eq!(meta["seqs"], 2);
    assert_eq!(meta["blocks_per_seq"], 3);
    assert_eq!(meta["q_heads"], 8);
    assert_eq!(st1.i32s("seq_lens"), [40, 40]);
    let table = st1.i32s("block_table");
    assert_eq!(table.len(), 6);
    let mut distinct = table.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 6, "{table:?}");
    let want = reference_decode(&st1);
    let got = st1.f32s("output");
    assert_eq!(got.len(), 2 * 8 * 8);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((f64::from(*g) - w).abs() < 1e-4, "output {i}: {g} vs {w}");
    }
    // The step as recorded, run again: the same table, queries and output.
    let j = parse_json(&ok(&[
        "decode",
        "--from",
        d1.s(),
        "--runs",
        "1",
        "--bound-mib",
        "1",
        "--out",
        d2.s(),
        "--json",
    ]));
    assert_eq!(j["cache_from"], d1.s());
    assert_eq!(j["table_from"], d1.s());
    assert_eq!(j["layer"], 1);
    assert_eq!(j["context"], 40);
    let st2 = read_st(&d2.0);
    for name in ["buffer0", "block_table", "seq_lens", "query"] {
        assert_eq!(st1.bytes(name), st2.bytes(name), "{name}");
    }
    for (a, b) in st1.f32s("output").iter().zip(st2.f32s("output")) {
        assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{a} vs {b}");
    }
    // A step without --from records write_kv's cache.
    let d3 = Temp::new("dec-3");
    ok(&[
        "decode",
        spec,
        "--seqs",
        "1",
        "--context",
        "20",
        "--runs",
        "1",
        "--bound-mib",
        "1",
        "--out",
        d3.s(),
    ]);
    let st3 = read_st(&d3.0);
    assert_eq!(st3.meta["pattern"], "write_kv seed=1");
    let want = reference_decode(&st3);
    for (g, w) in st3.f32s("output").iter().zip(&want) {
        assert!((f64::from(*g) - w).abs() < 1e-4, "{g} vs {w}");
    }
    let e = user_error(&["decode", spec, "--from", d1.s()]);
    assert!(e.contains("not both"), "{e}");
}
