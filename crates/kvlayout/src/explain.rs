//! A human (and `--json`) account of a layout: geometry, pages, fields, every convention's
//! view (or why there is none), the registered span, and a picture of one page.

use std::fmt::Write as _;

use serde::Serialize;
use strum::IntoEnumIterator;

use crate::layout::KvCacheLayout;
use crate::lower::page_axis;
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
    /// The buffer (allocation) holding the run.
    pub buffer: u32,
    /// Byte offset from the start of the page's part in that buffer.
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
    /// Runs of the page of layer 0, block 0, by buffer, each buffer's in address order.
    pub page_runs: Vec<PageRun>,
}

const MAX_PICTURED_ELEMENTS: u64 = 1 << 21;

fn padded_page(layout: &KvCacheLayout) -> Option<u64> {
    let Placement::Paged(p) = layout.placement() else {
        return None;
    };
    let (at, outside) = page_axis(p.order, layout.geometry().num_kv_heads);
    let m = layout.stored_fields()[0].strides;
    outside.is_empty().then(|| {
        if p.order.axes()[at] == Axis::L {
            m.layer
        } else {
            m.block
        }
    })
}

/// The runs of layer 0, block 0: each buffer's offsets count from the first byte the page has
/// in that buffer, so fields in separate buffers never appear to share bytes.
fn page_runs(layout: &KvCacheLayout) -> Vec<PageRun> {
    let total: u64 = layout
        .stored_fields()
        .iter()
        .map(|m| m.num_heads * m.num_slots * m.width)
        .sum();
    if total > MAX_PICTURED_ELEMENTS {
        return Vec::new();
    }
    group_runs(page_elements(layout))
        .into_iter()
        .map(Run::into_page_run)
        .collect()
}

/// One element of the pictured page.
struct Element {
    buffer: u32,
    /// From the page's first byte in `buffer`.
    offset: u64,
    bytes: u64,
    field: Field,
    head: u64,
    slot: u64,
    dim: u64,
}

/// Every element of layer 0, block 0, in address order by buffer.
fn page_elements(layout: &KvCacheLayout) -> Vec<Element> {
    let page0 = |buffer: u32| {
        layout
            .stored_fields()
            .iter()
            .filter(|m| m.strides.buffer == buffer)
            .map(|m| m.offset_unchecked(0, 0, 0, 0, 0))
            .min()
            .unwrap_or(0)
    };
    let mut elems = Vec::new();
    for m in layout.stored_fields() {
        let buffer = m.strides.buffer;
        let start = page0(buffer);
        for h in 0..m.num_heads {
            for n in 0..m.num_slots {
                for d in 0..m.width {
                    elems.push(Element {
                        buffer,
                        offset: m.offset_unchecked(0, 0, h, n, d) - start,
                        bytes: m.elem_bytes(),
                        field: m.field,
                        head: h,
                        slot: n,
                        dim: d,
                    });
                }
            }
        }
    }
    elems.sort_unstable_by_key(|e| (e.buffer, e.offset));
    elems
}

/// Adjacent elements of one (field, head), along d (same slot) or along n (same d).
struct Run {
    buffer: u32,
    offset: u64,
    len: u64,
    field: Field,
    head: u64,
    slots: (u64, u64),
    dims: (u64, u64),
}

/// Groups elements in address order into runs.
fn group_runs(elems: Vec<Element>) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for e in elems {
        let (n, d) = (e.slot, e.dim);
        if let Some(r) = runs.last_mut() {
            let adjacent = r.buffer == e.buffer
                && r.offset + r.len == e.offset
                && r.field == e.field
                && r.head == e.head;
            let along_d = adjacent && r.slots == (n, n) && r.dims.1 + 1 == d;
            let along_n = adjacent && r.dims == (d, d) && r.slots.1 + 1 == n;
            if along_d || along_n {
                r.len += e.bytes;
                r.slots.1 = n;
                r.dims.1 = d;
                continue;
            }
        }
        runs.push(Run {
            buffer: e.buffer,
            offset: e.offset,
            len: e.bytes,
            field: e.field,
            head: e.head,
            slots: (n, n),
            dims: (d, d),
        });
    }
    runs
}

impl Run {
    /// The run labelled like `K h0 t3 d0..127`.
    fn into_page_run(self) -> PageRun {
        let span = |(a, b): (u64, u64)| {
            if a == b {
                format!("{a}")
            } else {
                format!("{a}..{b}")
            }
        };
        PageRun {
            buffer: self.buffer,
            offset: self.offset,
            len: self.len,
            label: format!(
                "{} h{} t{} d{}",
                self.field,
                self.head,
                span(self.slots),
                span(self.dims)
            ),
        }
    }
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
        self.write_summary(&mut o);
        self.write_fields(&mut o);
        self.write_views(&mut o);
        self.write_spans(&mut o);
        self.write_pictures(&mut o);
        o
    }

    /// The spec, geometry, content and page lines.
    fn write_summary(&self, o: &mut String) {
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
    }

    /// The table of field strides, in bytes.
    fn write_fields(&self, o: &mut String) {
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
            "slot",
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
    }

    /// Each convention's view of layer 0, or why it is refused.
    fn write_views(&self, o: &mut String) {
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
    }

    /// The registered byte span of each buffer.
    fn write_spans(&self, o: &mut String) {
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
    }

    /// The picture of the page of layer 0, block 0: one per buffer when there are several.
    fn write_pictures(&self, o: &mut String) {
        if self.registered_spans.len() > 1 && !self.page_runs.is_empty() {
            // One picture per buffer: offsets count from the page's first byte in each.
            for span in &self.registered_spans {
                let b = span.buffer;
                let _ = writeln!(
                    o,
                    "\npage of layer 0, block 0, buffer {b} (offsets from its first byte)"
                );
                let runs: Vec<&PageRun> = self.page_runs.iter().filter(|r| r.buffer == b).collect();
                if runs.is_empty() {
                    let _ = writeln!(o, "  (no stored field in this buffer)");
                }
                picture(o, &runs, None);
            }
        } else {
            let _ = writeln!(
                o,
                "\npage of layer 0, block 0 (offsets from its first byte)"
            );
            if self.page_runs.is_empty() {
                let _ = writeln!(o, "  (too large to picture)");
            }
            let runs: Vec<&PageRun> = self.page_runs.iter().collect();
            picture(o, &runs, self.padded_page_bytes);
        }
    }
}

/// Draws the runs of one buffer's part of a page (the first 12 and the last 2 when there are
/// more), then the padding up to `padded_page` bytes when the page has any.
fn picture(o: &mut String, runs: &[&PageRun], padded_page: Option<u64>) {
    let shown = 12usize;
    let n = runs.len();
    for (i, r) in runs.iter().enumerate() {
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
    if let (Some(last), Some(p)) = (runs.last(), padded_page) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K and V in separate buffers are pictured one buffer at a time, each from its own first
    /// byte, so no two runs of one picture share an offset.
    #[test]
    fn separate_buffers_are_pictured_apart() {
        let l: KvCacheLayout = "kv L=1 B=2 N=2 H=2 D=4 dtype=f16 tensor=separate-nhd"
            .parse()
            .unwrap();
        let text = l.explain().to_text();
        let picture = &text[text.find("\npage of layer 0").unwrap()..];
        assert_eq!(
            picture,
            "\npage of layer 0, block 0, buffer 0 (offsets from its first byte)\n\
             \x20       +0 | k h0 t0 d0..3                |      8 B ###\n\
             \x20       +8 | k h1 t0 d0..3                |      8 B ###\n\
             \x20      +16 | k h0 t1 d0..3                |      8 B ###\n\
             \x20      +24 | k h1 t1 d0..3                |      8 B ###\n\
             \n\
             page of layer 0, block 0, buffer 1 (offsets from its first byte)\n\
             \x20       +0 | v h0 t0 d0..3                |      8 B ###\n\
             \x20       +8 | v h1 t0 d0..3                |      8 B ###\n\
             \x20      +16 | v h0 t1 d0..3                |      8 B ###\n\
             \x20      +24 | v h1 t1 d0..3                |      8 B ###\n"
        );
        // Head-major, V narrower than K: each buffer's runs partition its own page.
        let l: KvCacheLayout = "kv L=2 B=2 N=4 H=2 D=8 Dv=4 dtype=f16 tensor=separate-hnd"
            .parse()
            .unwrap();
        let runs = l.explain().page_runs;
        for (buffer, field, width) in [(0u32, Field::K, 8u64), (1, Field::V, 4)] {
            let mine: Vec<&PageRun> = runs.iter().filter(|r| r.buffer == buffer).collect();
            let want = format!("{field} h");
            assert!(mine.iter().all(|r| r.label.starts_with(&want)), "{mine:?}");
            // Head-major [H=2, N=4, D] f16: one run per (head, token), rows back to back.
            let row = width * 2;
            let spans: Vec<(u64, u64)> = mine.iter().map(|r| (r.offset, r.len)).collect();
            assert_eq!(
                spans,
                (0..8).map(|i| (i * row, row)).collect::<Vec<_>>(),
                "buffer {buffer}"
            );
        }
        assert_eq!(runs.len(), 16);
    }

    /// A page with its one head slot outside the block is contiguous: the page stride and its
    /// padding are reported and pictured.
    #[test]
    fn one_head_outside_the_block_pictures_the_padding() {
        let l: KvCacheLayout = "kv L=2 B=3 N=16 H=1 D=8 dtype=f16 order=LHBNC page=544"
            .parse()
            .unwrap();
        let ex = l.explain();
        assert_eq!(
            (ex.dense_page_bytes, ex.padded_page_bytes),
            (512, Some(544))
        );
        let text = ex.to_text();
        assert!(
            text.contains(
                "page      dense 512 B per (layer, block), padded to 544 B (32 B padding)\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("      +512 | padding                      |     32 B\n"),
            "{text}"
        );
        // With four heads outside the block, pages are not contiguous.
        let l: KvCacheLayout = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=LHBNC"
            .parse()
            .unwrap();
        assert_eq!(l.explain().padded_page_bytes, None);
    }
}
