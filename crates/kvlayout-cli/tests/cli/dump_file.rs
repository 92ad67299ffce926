//! The dump tests' own reader: a safetensors file parsed here (header, metadata, tensors),
//! elements decoded here, the coords pattern's values as the README states them, and files
//! rewritten to lie. Offsets come from the descriptor (`layout.offset`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kvlayout::{Coord, DType, Field, KvCacheLayout};
use serde_json::{json, Value};

use super::ok;

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
pub(super) struct St {
    pub meta: BTreeMap<String, String>,
    pub tensors: BTreeMap<String, (String, Vec<u64>, Vec<u8>)>,
}

pub(super) fn read_st(path: &Path) -> St {
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
    pub(super) fn layout(&self) -> KvCacheLayout {
        KvCacheLayout::from_json(&self.meta["layout"]).expect("metadata layout")
    }

    pub(super) fn bytes(&self, name: &str) -> &[u8] {
        &self.tensors[name].2
    }

    pub(super) fn f32s(&self, name: &str) -> Vec<f32> {
        let b = self.bytes(name);
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    pub(super) fn i32s(&self, name: &str) -> Vec<i32> {
        let b = self.bytes(name);
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// One stored element, decoded here (fp8 by its bit fields).
pub(super) fn elem(dtype: DType, b: &[u8]) -> f64 {
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
pub(super) fn coords_value(field: Field, dtype: DType, i: u64) -> f64 {
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
pub(super) fn check_coords(st: &St, spec: &str) -> u64 {
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

pub(super) fn fill(spec: &str, pattern: &str, tag: &str) -> Temp {
    let out = Temp::new(tag);
    ok(&["fill", spec, "--pattern", pattern, "--out", out.s()]);
    out
}

pub(super) const NHD: &str = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD";
pub(super) const HND: &str = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND";
/// HND pages padded from 4096 to 4608 bytes.
pub(super) const PADDED: &str = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND page=4608";
pub(super) const INT8: &str = "kv-scaled L=2 B=3 N=16 H=4 D=8 dtype=int8 order=NHD";
pub(super) const INT8_HND: &str = "kv-scaled L=2 B=3 N=16 H=4 D=8 dtype=int8 order=HND";
pub(super) const HND_1: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND";
pub(super) const SEPARATE: &str = "kv B=3 N=16 H=4 D=8 dtype=f16 tensor=separate-nhd";

/// Rewrites a dump's header (and optionally its data), with the header length recomputed.
pub(super) fn rewrite(src: &Path, tag: &str, edit: impl FnOnce(&mut Value, &mut Vec<u8>)) -> Temp {
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
pub(super) fn remove_tensor(h: &mut Value, d: &mut Vec<u8>, name: &str) {
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
