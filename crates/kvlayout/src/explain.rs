//! A human (and `--json`) account of a layout: geometry, pages, fields, every convention's
//! view (or why there is none), the registered span, and a picture of one page.

use std::fmt::Write as _;

use serde::Serialize;
use strum::IntoEnumIterator;

use crate::layout::KvCacheLayout;
use crate::regions::ByteRange;
use crate::spec::{Axis, Field, FieldStrides, Placement};
use crate::view::{Convention, TensorView, ViewTarget};

/// One field's address map in readable form.
#[derive(Debug, Clone, Serialize)]
pub struct FieldInfo {
    /// Field name.
    pub field: Field,
    /// Element type.
    pub dtype: crate::DType,
    /// Elements per row.
    pub width: u64,
    /// Strides and base, in bytes.
    pub strides_bytes: FieldStrides,
}

/// A view, or the reason it cannot exist without a copy.
#[derive(Debug, Clone, Serialize)]
pub struct ViewInfo {
    /// Convention name.
    pub convention: String,
    /// Field or `kv`.
    pub target: String,
    /// The view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view: Option<TensorView>,
    /// Why there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// A contiguous run of elements inside the pictured page.
#[derive(Debug, Clone, Serialize)]
pub struct PageRun {
    /// Byte offset from the page start.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// What it holds, e.g. `K h0 t3 d0..127`.
    pub label: String,
}

/// Everything `kvlayout explain` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// Canonical spec string.
    pub spec: String,
    /// The layout's JSON document.
    pub layout: serde_json::Value,
    /// Token/state slots per block.
    pub num_slots: u64,
    /// Data bytes of one (layer, block), all fields.
    pub dense_page_bytes: u64,
    /// Stride between consecutive pages when pages are contiguous (padding included).
    pub padded_page_bytes: Option<u64>,
    /// Per stored field.
    pub fields: Vec<FieldInfo>,
    /// Per convention and readable target.
    pub views: Vec<ViewInfo>,
    /// Per buffer.
    pub registered_spans: Vec<ByteRange>,
    /// Runs of the page of layer 0, block 0, in address order.
    pub page_runs: Vec<PageRun>,
}

const MAX_PICTURED_ELEMENTS: u64 = 1 << 21;

fn padded_page(layout: &KvCacheLayout) -> Option<u64> {
    let Placement::Paged(p) = layout.placement() else {
        return None;
    };
    let axes = p.order.axes();
    let pageish = axes[..2].iter().all(|a| matches!(a, Axis::L | Axis::B));
    let m = layout.stored_fields()[0].strides;
    pageish.then(|| if axes[1] == Axis::L { m.layer } else { m.block })
}

fn page_runs(layout: &KvCacheLayout) -> Vec<PageRun> {
    let mut elems: Vec<(u64, u64, Field, u64, u64, u64)> = Vec::new(); // off, elem, field, h, n, d
    let total: u64 = layout
        .stored_fields()
        .iter()
        .map(|m| m.num_heads * m.num_slots * m.width)
        .sum();
    if total > MAX_PICTURED_ELEMENTS {
        return Vec::new();
    }
    let page0 = layout
        .stored_fields()
        .iter()
        .map(|m| m.offset_unchecked(0, 0, 0, 0, 0))
        .min()
        .unwrap_or(0);
    for m in layout.stored_fields() {
        for h in 0..m.num_heads {
            for n in 0..m.num_slots {
                for d in 0..m.width {
                    let off = m.offset_unchecked(0, 0, h, n, d) - page0;
                    elems.push((off, m.elem_bytes(), m.field, h, n, d));
                }
            }
        }
    }
    elems.sort_unstable_by_key(|e| e.0);
    // Group adjacent elements of one (field, head) along d (same slot) or along n (same d).
    struct Run {
        offset: u64,
        len: u64,
        field: Field,
        head: u64,
        slots: (u64, u64),
        dims: (u64, u64),
    }
    let mut runs: Vec<Run> = Vec::new();
    for (off, e, f, h, n, d) in elems {
        if let Some(r) = runs.last_mut() {
            let adjacent = r.offset + r.len == off && r.field == f && r.head == h;
            let along_d = adjacent && r.slots == (n, n) && r.dims.1 + 1 == d;
            let along_n = adjacent && r.dims == (d, d) && r.slots.1 + 1 == n;
            if along_d || along_n {
                r.len += e;
                r.slots.1 = n;
                r.dims.1 = d;
                continue;
            }
        }
        runs.push(Run {
            offset: off,
            len: e,
            field: f,
            head: h,
            slots: (n, n),
            dims: (d, d),
        });
    }
    let span = |(a, b): (u64, u64)| {
        if a == b {
            format!("{a}")
        } else {
            format!("{a}..{b}")
        }
    };
    runs.into_iter()
        .map(|r| PageRun {
            offset: r.offset,
            len: r.len,
            label: format!(
                "{} h{} t{} d{}",
                r.field,
                r.head,
                span(r.slots),
                span(r.dims)
            ),
        })
        .collect()
}

impl KvCacheLayout {
    /// Everything about this layout in one value (see [`Explanation::to_text`]).
    pub fn explain(&self) -> Explanation {
        let mut views = Vec::new();
        let mut targets: Vec<ViewTarget> = self
            .readable_fields()
            .into_iter()
            .map(ViewTarget::Field)
            .collect();
        targets.push(ViewTarget::Kv);
        for c in Convention::iter() {
            for t in &targets {
                let r = self.view(c, *t, 0);
                views.push(ViewInfo {
                    convention: c.to_string(),
                    target: t.to_string(),
                    refused: r.as_ref().err().map(|e| e.to_string()),
                    view: r.ok(),
                });
            }
        }
        Explanation {
            spec: self.to_string(),
            layout: serde_json::to_value(self).unwrap_or(serde_json::Value::Null),
            num_slots: self.num_slots(),
            dense_page_bytes: self.dense_page_bytes(),
            padded_page_bytes: padded_page(self),
            fields: self
                .stored_fields()
                .iter()
                .map(|m| FieldInfo {
                    field: m.field,
                    dtype: m.dtype,
                    width: m.width,
                    strides_bytes: m.strides,
                })
                .collect(),
            views,
            registered_spans: self.registered_spans(),
            page_runs: page_runs(self),
        }
    }
}

impl Explanation {
    /// Plain-text rendering with an ASCII picture of one page.
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let g = &self.layout["geometry"];
        let _ = writeln!(o, "spec      {}", self.spec);
        let _ = writeln!(
            o,
            "geometry  L={} B={} N={} H={} (slots per block {}, tokens per state {})",
            g["num_layers"],
            g["num_blocks"],
            g["block_size"],
            g["num_kv_heads"],
            self.num_slots,
            g["tokens_per_state"]
        );
        let content = self.spec.split_whitespace().next().unwrap_or("");
        let _ = writeln!(
            o,
            "content   {content} ({})  dtype {}",
            self.fields
                .iter()
                .map(|f| format!("{} {} x {}", f.field, f.width, f.dtype))
                .collect::<Vec<_>>()
                .join(", "),
            self.layout["dtype"].as_str().unwrap_or("?")
        );
        let _ = writeln!(
            o,
            "page      dense {} B per (layer, block){}",
            self.dense_page_bytes,
            match self.padded_page_bytes {
                Some(p) if p != self.dense_page_bytes => format!(
                    ", padded to {p} B ({} B padding)",
                    p - self.dense_page_bytes
                ),
                Some(p) => format!(", page stride {p} B (no padding)"),
                None => ", pages are not contiguous in this placement".into(),
            }
        );
        let _ = writeln!(o, "\nfields (strides in bytes)");
        let _ = writeln!(
            o,
            "  {:<8} {:<9} {:>6} {:>4} {:>12} {:>12} {:>12} {:>10} {:>10} {:>6} {:>10} {:>8}",
            "field",
            "dtype",
            "width",
            "buf",
            "base",
            "layer",
            "block",
            "head",
            "token",
            "x",
            "chunk",
            "dim"
        );
        for f in &self.fields {
            let s = f.strides_bytes;
            let split = s.dim_split != f.width;
            let (x, chunk) = if split {
                (s.dim_split.to_string(), s.dim_chunk.to_string())
            } else {
                ("-".to_string(), "-".to_string())
            };
            let _ = writeln!(
                o,
                "  {:<8} {:<9} {:>6} {:>4} {:>12} {:>12} {:>12} {:>10} {:>10} {:>6} {:>10} {:>8}",
                f.field.to_string(),
                f.dtype.to_string(),
                f.width,
                s.buffer,
                s.base_offset,
                s.layer,
                s.block,
                s.head,
                s.slot,
                x,
                chunk,
                s.dim
            );
        }
        let _ = writeln!(o, "\nviews of layer 0 (offset, shape, strides in elements)");
        for v in &self.views {
            match (&v.view, &v.refused) {
                (Some(t), _) => {
                    let _ = writeln!(
                        o,
                        "  {:<15} {:<8} buf {} offset {:<10} shape {:?} strides {:?}",
                        v.convention, v.target, t.buffer, t.offset, t.shape, t.strides
                    );
                }
                (None, Some(r)) => {
                    let _ = writeln!(o, "  {:<15} {:<8} refused: {}", v.convention, v.target, r);
                }
                _ => {}
            }
        }
        let _ = writeln!(o, "\nregistered span (padding included)");
        for r in &self.registered_spans {
            let _ = writeln!(
                o,
                "  buffer {}: bytes {}..{} ({} B)",
                r.buffer,
                r.offset,
                r.offset + r.len,
                r.len
            );
        }
        let _ = writeln!(
            o,
            "\npage of layer 0, block 0 (offsets from its first byte)"
        );
        if self.page_runs.is_empty() {
            let _ = writeln!(o, "  (too large to picture)");
        }
        let shown = 12usize;
        let n = self.page_runs.len();
        for (i, r) in self.page_runs.iter().enumerate() {
            if i == shown && n > shown + 2 {
                let _ = writeln!(o, "  {:>8} | ... {} more runs ... |", "", n - shown - 2);
            }
            if i >= shown && i < n.saturating_sub(2) {
                continue;
            }
            let bar = "#".repeat(((r.len as f64).log2().max(0.0) as usize).clamp(1, 24));
            let _ = writeln!(
                o,
                "  {:>8} | {:<28} | {:>6} B {}",
                format!("+{}", r.offset),
                r.label,
                r.len,
                bar
            );
        }
        if let (Some(last), Some(p)) = (self.page_runs.last(), self.padded_page_bytes) {
            let end = last.offset + last.len;
            if p > end {
                let _ = writeln!(
                    o,
                    "  {:>8} | {:<28} | {:>6} B",
                    format!("+{end}"),
                    "padding",
                    p - end
                );
            }
        }
        o
    }
}
