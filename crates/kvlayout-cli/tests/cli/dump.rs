//! `kvlayout fill`, `convert` and `decode --from/--out`: dumps read back by a reader of its
//! own (the safetensors header parsed here, elements decoded here), every element checked at
//! the offset the descriptor gives it; lying, truncated and huge files refused with one line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvlayout::{Coord, DType, Field, KvCacheLayout};
use serde_json::{json, Value};

use super::{expect_user_error, kvlayout, ok, parse_json, stderr, stdout, user_error};

/// A temp file removed when dropped.
pub(super) struct Temp(pub PathBuf);

impl Temp {
    pub(super) fn new(tag: &str) -> Temp {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Temp(std::env::temp_dir().join(format!(
            "kvlayout-dump-{tag}-{}-{nanos}.safetensors",
            std::process::id()
        )))
    }

    pub(super) fn s(&self) -> &str {
        self.0.to_str().expect("temp paths are UTF-8")
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A safetensors file as this test reads it: the metadata and each tensor's dtype, shape and
/// bytes.
struct St {
    meta: BTreeMap<String, String>,
    tensors: BTreeMap<String, (String, Vec<u64>, Vec<u8>)>,
}

fn read_st(path: &Path) -> St {
    let b = std::fs::read(path).expect("dump readable");
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&b[8..8 + n]).expect("header is JSON");
    let data = &b[8 + n..];
    let mut st = St {
        meta: BTreeMap::new(),
        tensors: BTreeMap::new(),
    };
    for (k, v) in header.as_object().expect("header is an object") {
        if k == "__metadata__" {
            for (mk, mv) in v.as_object().unwrap() {
                st.meta.insert(mk.clone(), mv.as_str().unwrap().to_string());
            }
        } else {
            let o = &v["data_offsets"];
            let (s, e) = (
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
            );
            let shape = v["shape"].as_array().unwrap().iter();
            st.tensors.insert(
                k.clone(),
                (
                    v["dtype"].as_str().unwrap().to_string(),
                    shape.map(|x| x.as_u64().unwrap()).collect(),
                    data[s..e].to_vec(),
                ),
            );
        }
    }
    assert_eq!(
        st.tensors.values().map(|t| t.2.len()).sum::<usize>(),
        data.len(),
        "tensors cover the data"
    );
    st
}

impl St {
    fn layout(&self) -> KvCacheLayout {
        KvCacheLayout::from_json(&self.meta["layout"]).expect("metadata layout")
    }

    fn bytes(&self, name: &str) -> &[u8] {
        &self.tensors[name].2
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        let b = self.bytes(name);
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn i32s(&self, name: &str) -> Vec<i32> {
        let b = self.bytes(name);
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// One stored element, decoded here (fp8 by its bit fields).
fn elem(dtype: DType, b: &[u8]) -> f64 {
    let fp8 = |bits: u8, man_bits: u32, bias: i32| {
        let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = i32::from((bits & 0x7f) >> man_bits);
        let man = f64::from(bits & ((1 << man_bits) - 1)) / f64::from(1u32 << man_bits);
        sign * if exp == 0 {
            man * 2f64.powi(1 - bias)
        } else {
            (1.0 + man) * 2f64.powi(exp - bias)
        }
    };
    match dtype {
        DType::F32 => f64::from(f32::from_le_bytes(b[..4].try_into().unwrap())),
        DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::Fp8E4m3 => fp8(b[0], 3, 7),
        DType::Fp8E5m2 => fp8(b[0], 2, 15),
        DType::Int8 => f64::from(b[0] as i8),
        DType::U8 => f64::from(b[0]),
    }
}

/// The coords pattern's value of element `i` (in (layer, block, head, slot, dim) order) of a
/// field, as the README states it.
fn coords_value(field: Field, dtype: DType, i: u64) -> f64 {
    let code = match field {
        Field::K => 0,
        Field::V => 1,
        Field::KScale => 2,
        Field::VScale => 3,
        Field::Latent => 4,
        Field::Bytes => 5,
        Field::Conv => 6,
        Field::Ssm => 7,
    };
    let modulus: u64 = match dtype {
        DType::F32 => 1 << 24,
        DType::F16 => 2048,
        DType::Bf16 | DType::U8 => 256,
        DType::Fp8E4m3 => 16,
        DType::Fp8E5m2 => 8,
        DType::Int8 => 128,
    };
    ((i + code) % modulus) as f64
}

/// Checks every element of a coords dump at the offset `layout.offset` gives it, and that
/// every other byte is zero; returns the number of elements.
fn check_coords(st: &St, spec: &str) -> u64 {
    let layout = st.layout();
    assert_eq!(st.meta["format"], "kvlayout-dump");
    assert_eq!(st.meta["format_version"], "1");
    assert_eq!(st.meta["pattern"], "coords");
    assert_eq!(st.meta["padding"], "zero");
    let bufs: Vec<&[u8]> = (0..layout.num_buffers())
        .map(|i| {
            let (dtype, shape, bytes) = &st.tensors[&format!("buffer{i}")];
            assert_eq!(dtype, "U8", "{spec}");
            assert_eq!(shape, &[layout.extents()[i].end], "{spec}");
            bytes.as_slice()
        })
        .collect();
    let mut covered: Vec<Vec<bool>> = bufs.iter().map(|b| vec![false; b.len()]).collect();
    let mut n = 0u64;
    for m in layout.stored_fields() {
        let size = m.dtype.size_bytes() as usize;
        let mut i = 0u64;
        for l in 0..m.num_layers {
            for b in 0..m.num_blocks {
                for h in 0..m.num_heads {
                    for s in 0..m.num_slots {
                        for d in 0..m.width {
                            let c = Coord::new(m.field, l, b, h, s, d);
                            let at = layout.offset(&c).expect("in the domain");
                            let (buf, off) = (at.buffer as usize, at.offset as usize);
                            let got = elem(m.dtype, &bufs[buf][off..off + size]);
                            let want = coords_value(m.field, m.dtype, i);
                            assert_eq!(got, want, "{spec}: {c:?} (element {i})");
                            for x in &mut covered[buf][off..off + size] {
                                assert!(!*x, "{spec}: {c:?} overlaps");
                                *x = true;
                            }
                            i += 1;
                            n += 1;
                        }
                    }
                }
            }
        }
    }
    for (bi, (buf, cov)) in bufs.iter().zip(&covered).enumerate() {
        for (j, (&byte, &c)) in buf.iter().zip(cov).enumerate() {
            assert!(
                c || byte == 0,
                "{spec}: padding byte {j} of buffer {bi} is {byte}"
            );
        }
    }
    n
}

fn fill(spec: &str, pattern: &str, tag: &str) -> Temp {
    let out = Temp::new(tag);
    ok(&["fill", spec, "--pattern", pattern, "--out", out.s()]);
    out
}

const NHD: &str = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD";
const HND: &str = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND";
/// HND pages padded from 4096 to 4608 bytes.
const PADDED: &str = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND page=4608";
const INT8: &str = "kv-scaled L=2 B=3 N=16 H=4 D=8 dtype=int8 order=NHD";
const INT8_HND: &str = "kv-scaled L=2 B=3 N=16 H=4 D=8 dtype=int8 order=HND";
const HND_1: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND";
const SEPARATE: &str = "kv B=3 N=16 H=4 D=8 dtype=f16 legacy=separate-nhd";

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
            "kv L=1 B=3 N=16 H=4 D=8 dtype=bf16 legacy=vllm-paged-v1",
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
    let out = fill(HND, "coords", "views");
    let st = read_st(&out.0);
    let views: Value = serde_json::from_str(&st.meta["views"]).expect("views JSON");
    let views = views.as_array().expect("a list");
    assert_eq!(views.len(), 2 * 2, "K and V of two layers");
    for v in views {
        let field: Field = v["field"].as_str().unwrap().parse().unwrap();
        let layer = v["layer"].as_u64().unwrap();
        assert_eq!(v["convention"], "standard");
        assert_eq!(v["dtype"], "f16");
        let buf = st.bytes(&format!("buffer{}", v["buffer"]));
        let shape = super::u64s(&v["shape"]);
        let strides = super::u64s(&v["strides_bytes"]);
        assert_eq!(shape, [3, 4, 16, 8]);
        let base = v["offset_bytes"].as_u64().unwrap();
        let mut i = 0u64;
        for b in 0..3 {
            for h in 0..4 {
                for n in 0..16 {
                    for d in 0..8 {
                        let off = (base + b * strides[0] + h * strides[1])
                            + (n * strides[2] + d * strides[3]);
                        let got = elem(DType::F16, &buf[off as usize..off as usize + 2]);
                        let idx = (layer * 3 * 4 * 16 * 8) + i;
                        assert_eq!(got, coords_value(field, DType::F16, idx), "{v}");
                        i += 1;
                    }
                }
            }
        }
    }
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
    assert_eq!(j["version"], 1);
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

#[test]
fn convert_there_and_back_is_identical_on_elements() {
    for (from, to) in [
        (NHD, HND),
        (NHD, PADDED),
        (INT8, INT8_HND),
        (SEPARATE, HND_1),
    ] {
        let a = fill(from, "coords", "conv-a");
        let (b, c) = (Temp::new("conv-b"), Temp::new("conv-c"));
        let text = ok(&["convert", a.s(), "--to", to, "--out", b.s()]);
        assert!(text.starts_with(&format!("wrote {}", b.s())), "{text}");
        // Every element of the converted cache at its offset in the new layout.
        let st_b = read_st(&b.0);
        assert_eq!(st_b.layout(), to.parse::<KvCacheLayout>().unwrap());
        check_coords(&st_b, to);
        let j = parse_json(&ok(&[
            "convert",
            b.s(),
            "--to",
            from,
            "--out",
            c.s(),
            "--json",
        ]));
        assert_eq!(j["pattern"], "coords");
        let (st_a, st_c) = (read_st(&a.0), read_st(&c.0));
        assert_eq!(st_a.tensors, st_c.tensors, "{from} -> {to} -> back");
    }
}

#[test]
fn convert_refuses_other_content_or_geometry() {
    let a = fill(NHD, "coords", "refuse");
    let out = Temp::new("refused");
    for (to, reason) in [
        (
            "kv L=2 B=4 N=16 H=4 D=8 dtype=f16 order=HND",
            "num_blocks 3 vs 4",
        ),
        (
            "kv L=2 B=3 N=16 H=4 D=8 dtype=bf16 order=HND",
            "dtype f16 vs bf16",
        ),
        (
            "kv L=2 B=3 N=32 H=4 D=8 dtype=f16 order=HND",
            "block_size 16 vs 32",
        ),
        (
            "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
            "num_layers 2 vs 1",
        ),
    ] {
        let e = user_error(&["convert", a.s(), "--to", to, "--out", out.s()]);
        assert!(e.contains(reason), "{to}: {e}");
        assert!(!out.0.exists(), "{to}: nothing written");
    }
    let e = user_error(&[
        "convert",
        a.s(),
        "--to",
        HND,
        "--out",
        out.s(),
        "--backend",
        "gpu9",
    ]);
    assert!(e.contains("gpu9"), "{e}");
    let e = user_error(&["fill", NHD, "--pattern", "zeros", "--out", out.s()]);
    assert!(e.contains("coords, random"), "{e}");
    let e = user_error(&[
        "fill",
        "llama-3-8b",
        "--pattern",
        "coords",
        "--out",
        out.s(),
    ]);
    assert!(e.contains("--max-cache-gib"), "{e}");
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
        text.contains(&format!("cache    from {}", cache.s())),
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

/// Rewrites a dump's header (and optionally its data), with the header length recomputed.
fn rewrite(src: &Path, tag: &str, edit: impl FnOnce(&mut Value, &mut Vec<u8>)) -> Temp {
    let b = std::fs::read(src).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let mut data = b[8 + n..].to_vec();
    edit(&mut header, &mut data);
    let h = serde_json::to_vec(&header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    let t = Temp::new(tag);
    std::fs::write(&t.0, out).unwrap();
    t
}

/// Removes tensor `name` and its bytes, moving the tensors after it down.
fn remove_tensor(h: &mut Value, d: &mut Vec<u8>, name: &str) {
    let at = |v: &Value, i: usize| v["data_offsets"][i].as_u64().unwrap() as usize;
    let (o, e) = (at(&h[name], 0), at(&h[name], 1));
    d.drain(o..e);
    h.as_object_mut().unwrap().remove(name);
    for t in h.as_object_mut().unwrap().values_mut() {
        if t.get("data_offsets").is_some() && at(t, 0) >= e {
            t["data_offsets"] = json!([at(t, 0) - (e - o), at(t, 1) - (e - o)]);
        }
    }
}

/// Both readers (`convert` and `decode --from`) refuse `file` with one line containing
/// `reason`, writing nothing.
fn refused(file: &Temp, reason: &str) {
    let out = Temp::new("never");
    for args in [
        vec!["convert", file.s(), "--to", HND, "--out", out.s()],
        vec![
            "decode",
            "--from",
            file.s(),
            "--seqs",
            "1",
            "--context",
            "16",
            "--out",
            out.s(),
        ],
    ] {
        let e = user_error(&args);
        assert!(e.contains(file.s()) && e.contains(reason), "{reason}: {e}");
        assert!(!out.0.exists());
    }
}

#[test]
fn lying_metadata_is_refused_with_the_first_disagreement() {
    let good = fill(NHD, "coords", "lie");
    let sep = fill(SEPARATE, "coords", "lie-sep");
    let meta =
        |k: &'static str, v: Value| move |h: &mut Value, _: &mut Vec<u8>| h["__metadata__"][k] = v;
    let other_layout = "kv L=2 B=4 N=16 H=4 D=8 dtype=f16 order=NHD"
        .parse::<KvCacheLayout>()
        .unwrap()
        .to_json();
    let cases: Vec<(Temp, &str)> = vec![
        (
            rewrite(&good.0, "fmt", meta("format", json!("numpy"))),
            "format \"numpy\"",
        ),
        (
            rewrite(&good.0, "ver", meta("format_version", json!("2"))),
            "format_version \"2\"",
        ),
        (
            rewrite(&good.0, "writer", |h, _| {
                h["__metadata__"].as_object_mut().unwrap().remove("writer");
            }),
            "no \"writer\"",
        ),
        (
            rewrite(&good.0, "nometa", |h, _| {
                h.as_object_mut().unwrap().remove("__metadata__");
            }),
            "no __metadata__",
        ),
        (
            rewrite(&good.0, "badjson", meta("layout", json!("{not json"))),
            "metadata layout",
        ),
        (
            rewrite(
                &good.0,
                "badlayout",
                meta("layout", json!(r#"{"version": 1}"#)),
            ),
            "metadata layout",
        ),
        (
            rewrite(&good.0, "other", meta("layout", json!(other_layout))),
            "tensor buffer0 has shape [12288], expected [16384]",
        ),
        (
            rewrite(&good.0, "dtype", |h, _| {
                h["buffer0"]["dtype"] = json!("F16");
                h["buffer0"]["shape"] = json!([6144]);
            }),
            "tensor buffer0 is F16, expected U8",
        ),
        (
            rewrite(&good.0, "shape2", |h, _| {
                h["buffer0"]["shape"] = json!([2, 6144])
            }),
            "tensor buffer0 has shape [2, 6144]",
        ),
        (
            rewrite(&sep.0, "missing", |h, d| remove_tensor(h, d, "buffer1")),
            "no tensor buffer1",
        ),
        (
            rewrite(&good.0, "extra", |h, d| {
                let end = d.len();
                d.extend([1, 2, 3, 4]);
                h["junk"] = json!({"dtype": "U8", "shape": [4], "data_offsets": [end, end + 4]});
            }),
            "unexpected tensor junk",
        ),
        (
            rewrite(&good.0, "stepkey", meta("decode", json!(r#"{"layer": 0}"#))),
            "metadata decode",
        ),
    ];
    for (file, reason) in &cases {
        refused(file, reason);
    }
}

#[test]
fn lying_step_metadata_is_refused() {
    let spec = "kv L=1 B=4 N=16 H=2 D=8 dtype=f16 order=NHD";
    let d = Temp::new("step");
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
        d.s(),
    ]);
    let step = |f: fn(&mut Value)| {
        move |h: &mut Value, _: &mut Vec<u8>| {
            let mut m: Value =
                serde_json::from_str(h["__metadata__"]["decode"].as_str().unwrap()).unwrap();
            f(&mut m);
            h["__metadata__"]["decode"] = json!(m.to_string());
        }
    };
    let cases = [
        (
            rewrite(&d.0, "qk", step(|m| m["qk_width"] = json!(16))),
            "qk_width 16; the layout's rows give 8",
        ),
        (
            rewrite(&d.0, "unknown", step(|m| m["heads"] = json!(1))),
            "unknown field `heads`",
        ),
        (
            rewrite(&d.0, "seqs", step(|m| m["seqs"] = json!(2))),
            "tensor block_table has shape [1, 2], expected [2, 2]",
        ),
        (
            rewrite(&d.0, "noquery", |h, d| remove_tensor(h, d, "query")),
            "no tensor query",
        ),
        // q_heads 4 where the query holds 8: the table and lengths agree, the query not.
        (
            rewrite(&d.0, "qheads", step(|m| m["q_heads"] = json!(4))),
            "tensor query has shape [1, 8, 8], expected [1, 4, 8]",
        ),
        (
            rewrite(&d.0, "lens", |h, _| h["seq_lens"]["dtype"] = json!("F32")),
            "tensor seq_lens is F32, expected I32",
        ),
    ];
    for (file, reason) in &cases {
        refused(file, reason);
    }
    // Without its output, a step is still an input.
    let no_out = rewrite(&d.0, "noout", |h, d| remove_tensor(h, d, "output"));
    ok(&[
        "decode",
        "--from",
        no_out.s(),
        "--runs",
        "1",
        "--bound-mib",
        "1",
    ]);
}

#[test]
fn truncated_files_are_refused() {
    let good = fill(SEPARATE, "coords", "trunc");
    let bytes = std::fs::read(&good.0).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for cut in [
        0,
        1,
        7,
        8,
        9,
        8 + n / 2,
        8 + n - 1,
        8 + n,
        8 + n + 1,
        bytes.len() / 2 + n / 2,
        bytes.len() - 1,
    ] {
        let t = Temp::new("cut");
        std::fs::write(&t.0, &bytes[..cut]).unwrap();
        refused(&t, "truncated");
    }
    // One byte too many.
    let t = Temp::new("long");
    let mut long = bytes.clone();
    long.push(0);
    std::fs::write(&t.0, long).unwrap();
    refused(&t, "1 bytes after the last tensor");
}

/// `kvlayout` under a 1 GiB address-space limit: a reader that allocated what a file
/// declares would abort instead of refusing.
fn kvlayout_small_memory(args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_kvlayout"))
        .args(args)
        .output()
        .expect("sh runs")
}

#[test]
fn huge_declared_sizes_are_refused_before_allocating() {
    let good = fill(NHD, "coords", "huge");
    let bytes = std::fs::read(&good.0).unwrap();
    let mut cases: Vec<(Temp, String)> = Vec::new();
    for declared in [u64::MAX, 1 << 40, (16 << 20) + 1] {
        let t = Temp::new("hdr");
        let mut b = bytes.clone();
        b[..8].copy_from_slice(&declared.to_le_bytes());
        std::fs::write(&t.0, b).unwrap();
        cases.push((
            t,
            format!("declares a header of {declared} bytes, more than the 16777216"),
        ));
    }
    let huge = 1u64 << 50;
    cases.push((
        rewrite(&good.0, "tensor", |h, _| {
            h["buffer0"]["shape"] = json!([huge]);
            h["buffer0"]["data_offsets"] = json!([0, huge]);
        }),
        format!("truncated: the header's tensors take {huge} bytes"),
    ));
    cases.push((
        rewrite(&good.0, "overflow", |h, _| {
            h["buffer0"]["shape"] = json!([1u64 << 40, 1u64 << 40])
        }),
        "header is no safetensors header".into(),
    ));
    cases.push((
        rewrite(&good.0, "hugelayout", |h, _| {
            let l = "kv L=2 B=1000000000 N=16 H=4 D=8 dtype=f16 order=NHD"
                .parse::<KvCacheLayout>()
                .unwrap();
            h["__metadata__"]["layout"] = json!(l.to_json());
        }),
        "tensor buffer0 has shape [12288], expected [4096000000000]".into(),
    ));
    let out = Temp::new("never");
    for (file, reason) in &cases {
        for args in [
            vec!["convert", file.s(), "--to", HND, "--out", out.s()],
            vec![
                "decode",
                "--from",
                file.s(),
                "--seqs",
                "1",
                "--context",
                "16",
            ],
        ] {
            let e = expect_user_error(&args, kvlayout_small_memory(&args));
            assert!(e.contains(reason.as_str()), "{reason}: {e}");
        }
    }
}

/// xorshift64 for the randomized inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut s = self.0;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        self.0 = s;
        s
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn randomized_bad_dumps_are_refused_or_read_never_a_panic() {
    let secs: f64 = std::env::var("KVLAYOUT_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let seed: u64 = std::env::var("KVLAYOUT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let step = Temp::new("fuzz-step");
    ok(&[
        "decode",
        "kv L=1 B=4 N=16 H=2 D=8 dtype=f16 order=NHD",
        "--seqs",
        "1",
        "--context",
        "20",
        "--runs",
        "1",
        "--bound-mib",
        "1",
        "--out",
        step.s(),
    ]);
    let seeds = [
        fill(SEPARATE, "coords", "fuzz-a"),
        fill(INT8, "random", "fuzz-b"),
        step,
    ];
    let originals: Vec<Vec<u8>> = seeds.iter().map(|t| std::fs::read(&t.0).unwrap()).collect();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let start = std::time::Instant::now();
    let (mut runs, mut refusals) = (0, 0);
    let file = Temp::new("fuzz");
    let out = Temp::new("fuzz-out");
    while runs < 4 || start.elapsed().as_secs_f64() < secs {
        let k = rng.below(originals.len());
        let mut b = originals[k].clone();
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let what = match rng.below(4) {
            0 => {
                let cut = rng.below(b.len());
                b.truncate(cut);
                format!("truncated at {cut}")
            }
            1 => {
                let mut flips = Vec::new();
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(8 + n);
                    let bit = 1u8 << rng.below(8);
                    b[at] ^= bit;
                    flips.push((at, bit));
                }
                format!("header bits flipped {flips:?}")
            }
            2 => {
                let at = 8 + n + rng.below(b.len() - 8 - n);
                b[at] ^= 0xff;
                format!("data byte {at} inverted")
            }
            _ => {
                let v = rng.next() >> rng.below(64);
                b[..8].copy_from_slice(&v.to_le_bytes());
                format!("header length {v}")
            }
        };
        std::fs::write(&file.0, &b).unwrap();
        let args = if runs % 4 == 3 {
            vec![
                "decode",
                "--from",
                file.s(),
                "--seqs",
                "1",
                "--context",
                "16",
                "--runs",
                "1",
                "--bound-mib",
                "1",
            ]
        } else {
            vec![
                "convert",
                file.s(),
                "--to",
                "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
                "--out",
                out.s(),
            ]
        };
        let o = kvlayout(&args);
        let err = stderr(&o);
        let input = format!("seed {seed}, run {runs}: dump {k} with {what}: {args:?}");
        match o.status.code() {
            Some(0) => {}
            Some(2) => {
                assert!(o.stdout.is_empty(), "{input}: stdout {}", stdout(&o));
                assert_eq!(err.lines().count(), 1, "{input}: {err}");
                assert!(err.starts_with("error: "), "{input}: {err}");
                refusals += 1;
            }
            // A decode of a changed cache may disagree with the reference (exit 1, after
            // its report): a finding about the data, not a failure to read it.
            Some(1) if args[0] == "decode" && err.contains("differs from the reference") => {}
            _ => panic!("{input}: {:?}\n{err}", o.status),
        }
        runs += 1;
    }
    assert!(refusals > 0, "{runs} runs, none refused");
}
