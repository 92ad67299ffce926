//! The differences `kvlayout diff` lists: the two specs field by field (their JSON documents
//! walked key by key), each stored field's strides as the descriptor reports them
//! ([`kvlayout::FieldMap`]), and the buffers' registered spans.
//!
//! It compares what the descriptors state and report; it derives no stride. Whether the
//! layouts address every element alike is [`KvCacheLayout::same_addressing`]'s answer, not
//! this module's: a stride of an axis of extent 1 may differ and change nothing, which the
//! `matters` flag says.

use kvlayout::{FieldMap, KvCacheLayout};
use serde::Serialize;
use serde_json::Value;

/// One spec field that differs: its JSON path and both values (`null` where absent).
#[derive(Debug, Serialize)]
pub(crate) struct SpecDifference {
    pub path: String,
    pub a: Value,
    pub b: Value,
}

/// Every leaf of the two specs' JSON documents that differs, in A's key order.
pub(crate) fn spec_differences(a: &KvCacheLayout, b: &KvCacheLayout) -> Vec<SpecDifference> {
    let doc = |l: &KvCacheLayout| serde_json::to_value(l.spec()).unwrap_or(Value::Null);
    let mut out = Vec::new();
    walk("", &doc(a), &doc(b), &mut out);
    out
}

fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<SpecDifference>) {
    let child = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
            for k in keys {
                let (va, vb) = (x.get(k), y.get(k));
                walk(
                    &child(k),
                    va.unwrap_or(&Value::Null),
                    vb.unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                let (va, vb) = (x.get(i), y.get(i));
                walk(
                    &format!("{path}[{i}]"),
                    va.unwrap_or(&Value::Null),
                    vb.unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if a != b => out.push(SpecDifference {
            path: path.to_string(),
            a: a.clone(),
            b: b.clone(),
        }),
        _ => {}
    }
}

/// One stride (or start) of one stored field that differs; `None` where the layout does not
/// store the field.
#[derive(Debug, Serialize)]
pub(crate) struct StrideDifference {
    pub field: String,
    /// `buffer`, `base_offset`, `layer`, `block`, `head`, `token`, `dim_split`, `dim_chunk`,
    /// `dim` (bytes, but `buffer` and `dim_split`), or `stored` (the field itself).
    pub stride: &'static str,
    pub a: Option<u64>,
    pub b: Option<u64>,
    /// Whether it can move an element: false for the stride of an axis of extent 1 on both.
    pub matters: bool,
}

/// The named numbers of a field's map, and whether each can move an element.
fn numbers(m: &FieldMap) -> Vec<(&'static str, u64, bool)> {
    let s = &m.strides;
    let mut out = vec![
        ("buffer", u64::from(s.buffer), true),
        ("base_offset", s.base_offset, true),
    ];
    let names = ["layer", "block", "head", "slot", "dim_chunk", "dim"];
    for (name, (extent, stride)) in names.into_iter().zip(m.axes()) {
        out.push((name, stride, extent > 1));
    }
    out.push(("dim_split", s.dim_split, m.is_dim_split()));
    out
}

/// Every stored field's numbers that differ between A and B.
pub(crate) fn stride_differences(a: &KvCacheLayout, b: &KvCacheLayout) -> Vec<StrideDifference> {
    let mut fields: Vec<kvlayout::Field> = a.stored_fields().iter().map(|m| m.field).collect();
    for m in b.stored_fields() {
        if !fields.contains(&m.field) {
            fields.push(m.field);
        }
    }
    let mut out = Vec::new();
    for field in fields {
        let find = |l: &KvCacheLayout| l.stored_fields().iter().find(|m| m.field == field).copied();
        match (find(a), find(b)) {
            (Some(x), Some(y)) => {
                for ((name, va, ma), (_, vb, mb)) in numbers(&x).into_iter().zip(numbers(&y)) {
                    if va != vb {
                        out.push(StrideDifference {
                            field: field.to_string(),
                            stride: name,
                            a: Some(va),
                            b: Some(vb),
                            matters: ma || mb,
                        });
                    }
                }
            }
            (x, y) => out.push(StrideDifference {
                field: field.to_string(),
                stride: "stored",
                a: x.map(|_| 1),
                b: y.map(|_| 1),
                matters: true,
            }),
        }
    }
    out
}

/// One buffer whose registered span differs: `[start, end)` in bytes, `None` where absent.
#[derive(Debug, Serialize)]
pub(crate) struct ExtentDifference {
    pub buffer: usize,
    pub a: Option<[u64; 2]>,
    pub b: Option<[u64; 2]>,
}

/// Buffers whose registered spans differ.
pub(crate) fn extent_differences(a: &KvCacheLayout, b: &KvCacheLayout) -> Vec<ExtentDifference> {
    let span = |l: &KvCacheLayout, i: usize| l.extents().get(i).map(|x| [x.start, x.end]);
    (0..a.num_buffers().max(b.num_buffers()))
        .filter_map(|buffer| {
            let (x, y) = (span(a, buffer), span(b, buffer));
            (x != y).then_some(ExtentDifference { buffer, a: x, b: y })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> KvCacheLayout {
        s.parse().unwrap()
    }

    #[test]
    fn identical_layouts_have_no_difference() {
        let a = l("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD");
        assert!(spec_differences(&a, &a).is_empty());
        assert!(stride_differences(&a, &a).is_empty());
        assert!(extent_differences(&a, &a).is_empty());
    }

    #[test]
    fn a_missing_key_reads_as_null() {
        let a = l("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD");
        let b = l("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=4096");
        let d = spec_differences(&a, &b);
        let page = d
            .iter()
            .find(|d| d.path == "placement.page_size_padded")
            .expect("the padded page size differs");
        assert_eq!((&page.a, &page.b), (&Value::Null, &Value::from(4096)));
    }
}
