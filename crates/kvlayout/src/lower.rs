//! Lowering a [`Placement`] to per-field strides and buffer extents, with the checks that
//! belong to each placement kind. Called once by [`crate::KvCacheLayout::new`].

use crate::dtype::DType;
use crate::error::{add, mul, LayoutError, Result, MAX_OFFSET};
use crate::spec::{
    Axis, AxisOrder, BufferExtent, Content, Field, FieldStrides, Paged, Placement, StridedField,
};

mod engine_tensor;

use engine_tensor::lower_engine_tensor;

/// A stored field before placement: name, element type, width in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowField {
    pub field: Field,
    pub dtype: DType,
    pub width: u64,
}

/// The stored fields of a content kind, in row order.
pub(crate) fn row_fields(content: &Content, dtype: DType) -> Vec<RowField> {
    let f = |field, dtype, width| RowField {
        field,
        dtype,
        width,
    };
    match *content {
        Content::Kv {
            head_size,
            head_size_v,
        } => vec![
            f(Field::K, dtype, head_size),
            f(Field::V, dtype, head_size_v),
        ],
        Content::KvScaled {
            head_size,
            head_size_v,
        } => vec![
            f(Field::K, dtype, head_size),
            f(Field::KScale, DType::F32, 1),
            f(Field::V, dtype, head_size_v),
            f(Field::VScale, DType::F32, 1),
        ],
        Content::Mla {
            kv_lora_rank,
            rope_dim,
        } => vec![f(Field::Latent, dtype, kv_lora_rank + rope_dim)],
        Content::Opaque { row_bytes } => vec![f(Field::Bytes, DType::U8, row_bytes)],
        Content::MambaConv {
            conv_dim,
            conv_width,
        } => vec![f(Field::Conv, dtype, conv_dim * conv_width)],
        Content::MambaSsm {
            head_dim,
            state_size,
        } => vec![f(Field::Ssm, dtype, head_dim * state_size)],
    }
}

/// Extents of `[L, B, H, N]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extents {
    pub layers: u64,
    pub blocks: u64,
    pub heads: u64,
    pub slots: u64,
}

impl Extents {
    fn of(&self, axis: Axis) -> u64 {
        match axis {
            Axis::L => self.layers,
            Axis::B => self.blocks,
            Axis::H => self.heads,
            Axis::N => self.slots,
        }
    }
}

/// Per-field strides (in row order) and per-buffer extents.
pub(crate) type Lowered = (Vec<(RowField, FieldStrides)>, Vec<BufferExtent>);

/// The strides and extents of any placement.
pub(crate) fn lower(placement: &Placement, rows: &[RowField], ext: Extents) -> Result<Lowered> {
    match placement {
        Placement::Paged(p) => lower_paged(p, rows, ext),
        Placement::EngineTensor {
            layout,
            base_offset,
        } => lower_engine_tensor(*layout, *base_offset, rows, ext),
        Placement::Strided { fields, extents } => lower_strided(fields, extents, rows),
    }
}

/// The strides and extent of a paged placement: rows inside pages inside the order's axes.
fn lower_paged(p: &Paged, rows: &[RowField], ext: Extents) -> Result<Lowered> {
    check_page_alignment(p.alignment)?;
    let (row_offsets, row_bytes) = row_layout(rows)?;
    let (stride, span) = axis_strides(p, row_bytes, ext)?;
    if !p.base_offset.is_multiple_of(p.alignment) {
        return Err(LayoutError::Misaligned {
            what: "base_offset".into(),
            value: p.base_offset,
            align: p.alignment,
        });
    }
    let axes = p.order.axes();
    let by_axis = |a: Axis| stride[axes.iter().position(|x| *x == a).unwrap_or(0)];
    let end = add(p.base_offset, span, || "registered span".into())?;
    let fields = rows
        .iter()
        .zip(row_offsets)
        .map(|(r, off)| {
            let e = r.dtype.size_bytes();
            (
                *r,
                FieldStrides {
                    buffer: 0,
                    base_offset: p.base_offset + off,
                    layer: by_axis(Axis::L),
                    block: by_axis(Axis::B),
                    head: by_axis(Axis::H),
                    slot: by_axis(Axis::N),
                    dim_split: r.width,
                    dim_chunk: r.width * e,
                    dim: e,
                },
            )
        })
        .collect();
    Ok((
        fields,
        vec![BufferExtent {
            start: p.base_offset,
            end,
        }],
    ))
}

/// A paged alignment is a nonzero power of two.
fn check_page_alignment(alignment: u64) -> Result<()> {
    if alignment == 0 {
        return Err(LayoutError::ZeroSize { what: "alignment" });
    }
    if !alignment.is_power_of_two() {
        return Err(LayoutError::NotPowerOfTwo {
            what: "alignment",
            value: alignment,
        });
    }
    Ok(())
}

/// Each field's byte offset in the row, and the row's bytes.
fn row_layout(rows: &[RowField]) -> Result<(Vec<u64>, u64)> {
    let mut row_offsets = Vec::with_capacity(rows.len());
    let mut row_bytes = 0u64;
    for r in rows {
        row_offsets.push(row_bytes);
        let bytes = mul(r.width, r.dtype.size_bytes(), || {
            format!("{} row bytes", r.field)
        })?;
        row_bytes = add(row_bytes, bytes, || "row bytes".into())?;
    }
    Ok((row_offsets, row_bytes))
}

/// The byte stride of each axis (indexed like `p.order.axes()`), built from the row outwards
/// with the page padded and aligned at the page axis, and the bytes all four axes span.
fn axis_strides(p: &Paged, row_bytes: u64, ext: Extents) -> Result<([u64; 4], u64)> {
    let axes = p.order.axes();
    let (page_at, outside) = page_axis(p.order, ext.heads);
    let mut stride = [0u64; 4]; // indexed like `axes`
    let mut running = row_bytes;
    for i in (0..4).rev() {
        let axis = axes[i];
        if i == page_at {
            if outside.is_empty() {
                running = padded_page_bytes(p, running)?;
            } else if p.page_size_padded.is_some() || p.alignment > 1 {
                return Err(padding_refused(p, i, &outside, ext));
            }
        }
        let s = axis_stride(p, axis, running)?;
        stride[i] = s;
        running = mul(s, ext.of(axis), || {
            format!("{} extent in bytes", axis_name(axis))
        })?;
    }
    Ok((stride, running))
}

/// The page stride: the `dense` page, or the padded page when given (never smaller), rounded
/// up to the alignment.
fn padded_page_bytes(p: &Paged, dense: u64) -> Result<u64> {
    let mut page = dense;
    if let Some(padded) = p.page_size_padded {
        if padded < dense {
            return Err(LayoutError::StrideTooSmall {
                what: "page_size_padded".into(),
                value: padded,
                needed: dense,
            });
        }
        page = padded;
    }
    mul(page.div_ceil(p.alignment), p.alignment, || {
        "page size rounded up to the alignment".into()
    })
}

/// Why pages with axes `outside` the page axis (at `page_at` of the order) cannot be padded
/// or aligned: the order, the axes outside with their extents, and what sits inside.
fn padding_refused(p: &Paged, page_at: usize, outside: &[Axis], ext: Extents) -> LayoutError {
    let axes = p.order.axes();
    let axis = axes[page_at];
    let misplaced = outside
        .iter()
        .map(|a| format!("{a} (extent {})", ext.of(*a)))
        .collect::<Vec<_>>()
        .join(" and ");
    let inside = match &axes[page_at + 1..] {
        [] => format!("{axis} innermost"),
        rest => format!(
            "only {} inside {axis}",
            rest.iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    };
    LayoutError::Invalid(format!(
        "page padding and alignment need H and N inside both L and B \
         (orders LB.. and BL..; H may sit outside when it has extent 1); \
         {} has {misplaced} outside {axis}, {inside}",
        p.order
    ))
}

/// The stride of `axis`: its explicit layer or block stride (at least the `inner` bytes it
/// steps over, and aligned), or else `inner`.
fn axis_stride(p: &Paged, axis: Axis, inner: u64) -> Result<u64> {
    let explicit = match axis {
        Axis::L => p.layer_stride_bytes,
        Axis::B => p.block_stride_bytes,
        _ => None,
    };
    let Some(s) = explicit else {
        return Ok(inner);
    };
    if s < inner {
        return Err(LayoutError::StrideTooSmall {
            what: format!("{} stride", axis_name(axis)),
            value: s,
            needed: inner,
        });
    }
    if s % p.alignment != 0 {
        return Err(LayoutError::Misaligned {
            what: format!("{} stride", axis_name(axis)),
            value: s,
            align: p.alignment,
        });
    }
    Ok(s)
}

/// Where the page sits in a paged order: the index in `order.axes()` of the inner of L and B
/// (the page axis), and the axes a page holds that sit outside it, outermost first: N, and H
/// unless `heads` is 1. With one head slot every head index is 0, so the head stride adds
/// nothing to any offset and the head axis may sit anywhere (vLLM accepts a one-head axis
/// outside the block for padded pages).
pub(crate) fn page_axis(order: AxisOrder, heads: u64) -> (usize, Vec<Axis>) {
    let axes = order.axes();
    let at = axes
        .iter()
        .rposition(|a| matches!(a, Axis::L | Axis::B))
        .unwrap_or(0);
    let outside = axes[..at]
        .iter()
        .copied()
        .filter(|&a| a == Axis::N || (a == Axis::H && heads > 1))
        .collect();
    (at, outside)
}

fn axis_name(a: Axis) -> &'static str {
    match a {
        Axis::L => "layer",
        Axis::B => "block",
        Axis::H => "head",
        Axis::N => "slot",
    }
}

/// The strides and extents of a strided placement, as given, checked against the content.
fn lower_strided(
    fields: &[StridedField],
    extents: &[BufferExtent],
    rows: &[RowField],
) -> Result<Lowered> {
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut found = fields.iter().filter(|f| f.field == r.field);
        let Some(sf) = found.next() else {
            return Err(LayoutError::Invalid(format!(
                "strided placement lacks field {}",
                r.field
            )));
        };
        if found.next().is_some() {
            return Err(LayoutError::Invalid(format!(
                "strided placement lists field {} twice",
                r.field
            )));
        }
        let s = sf.strides;
        if s.dim_split == 0 || r.width % s.dim_split != 0 {
            return Err(LayoutError::Invalid(format!(
                "field {}: dim_split {} does not divide its width {}",
                r.field, s.dim_split, r.width
            )));
        }
        if s.buffer as usize >= extents.len() {
            return Err(LayoutError::OutOfRange {
                axis: "buffer",
                value: u64::from(s.buffer),
                limit: extents.len() as u64,
            });
        }
        out.push((*r, s));
    }
    if let Some(extra) = fields
        .iter()
        .find(|f| !rows.iter().any(|r| r.field == f.field))
    {
        return Err(LayoutError::Invalid(format!(
            "strided placement names field {} which this content does not store",
            extra.field
        )));
    }
    for (i, x) in extents.iter().enumerate() {
        if x.end > MAX_OFFSET {
            return Err(LayoutError::Overflow {
                what: format!("buffer {i} extent"),
                limit: MAX_OFFSET,
            });
        }
        if x.start > x.end {
            return Err(LayoutError::Invalid(format!(
                "buffer {i} extent starts at {} after its end {}",
                x.start, x.end
            )));
        }
    }
    Ok((out, extents.to_vec()))
}

#[cfg(test)]
mod tests {
    use crate::{Coord, Field, KvCacheLayout, LayoutError};

    /// A refused padded page names the axes a page holds that sit outside the page axis, with
    /// their extents, and what does sit inside it.
    #[test]
    fn padding_refusal_names_the_axis_outside_the_page() {
        for (order, heads, says) in [
            (
                "LHBNC",
                4,
                "LHBNC has H (extent 4) outside B, only N inside B",
            ),
            (
                "HLBNC",
                2,
                "HLBNC has H (extent 2) outside B, only N inside B",
            ),
            (
                "BHLNC",
                4,
                "BHLNC has H (extent 4) outside L, only N inside L",
            ),
            (
                "LNBHC",
                4,
                "LNBHC has N (extent 16) outside B, only H inside B",
            ),
            (
                "LNBHC",
                1,
                "LNBHC has N (extent 16) outside B, only H inside B",
            ),
            (
                "LHNBC",
                4,
                "LHNBC has H (extent 4) and N (extent 16) outside B, B innermost",
            ),
            ("LHNBC", 1, "LHNBC has N (extent 16) outside B, B innermost"),
        ] {
            for padding in ["page=4160", "align=64"] {
                let spec =
                    format!("kv L=2 B=3 N=16 H={heads} D=8 dtype=f16 order={order} {padding}");
                match spec.parse::<KvCacheLayout>() {
                    Err(LayoutError::Invalid(m)) => {
                        assert!(m.ends_with(says), "{spec}: {m}");
                        assert!(m.contains("H may sit outside when it has extent 1"), "{m}");
                    }
                    other => panic!("{spec}: {other:?}"),
                }
            }
        }
    }

    // N=16, D=8 f16: row [K 8][V 8] = 32 B, dense page 16 * 32 = 512 B.
    const LAYERS: u64 = 2;
    const BLOCKS: u64 = 3;
    const SLOTS: u64 = 16;
    const WIDTH: u64 = 8;
    const DENSE: u64 = 512;

    /// With one head slot the head axis may sit outside L or B: every element sits where the
    /// page arithmetic puts it, no element touches a page's padding, and the registered span is
    /// the whole padded extent.
    #[test]
    fn one_head_axis_outside_the_page_takes_padded_pages() {
        for (order, layer_outer) in [
            ("LHBNC", true),
            ("HLBNC", true),
            ("BHLNC", false),
            ("HBLNC", false),
        ] {
            for (extra, page) in [
                ("page=544", 544u64),
                ("page=520 align=64", 576),
                ("align=256", 512),
            ] {
                for base in [0u64, 1024] {
                    let spec = format!(
                        "kv L={LAYERS} B={BLOCKS} N={SLOTS} H=1 D={WIDTH} dtype=f16 \
                         order={order} {extra} base={base}"
                    );
                    let l: KvCacheLayout = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
                    let end = base + LAYERS * BLOCKS * page;
                    assert_eq!(l.extents().len(), 1, "{spec}");
                    assert_eq!(
                        (l.extents()[0].start, l.extents()[0].end),
                        (base, end),
                        "{spec}"
                    );
                    let page_start = |a: u64, b: u64| {
                        if layer_outer {
                            base + a * BLOCKS * page + b * page
                        } else {
                            base + b * LAYERS * page + a * page
                        }
                    };
                    assert_one_head_offsets(&l, &spec, page_start, end);
                }
            }
        }
        // A padded page still holds the dense page.
        assert!(matches!(
            "kv L=2 B=3 N=16 H=1 D=8 dtype=f16 order=LHBNC page=500".parse::<KvCacheLayout>(),
            Err(LayoutError::StrideTooSmall {
                value: 500,
                needed: 512,
                ..
            })
        ));
    }

    /// Every K and V element of the one head of `l` sits at `page_start(layer, block)` plus its
    /// row and element offsets, in the page's dense part and before `end`; head 1 is refused.
    fn assert_one_head_offsets(
        l: &KvCacheLayout,
        spec: &str,
        page_start: impl Fn(u64, u64) -> u64,
        end: u64,
    ) {
        for (field, row_off) in [(Field::K, 0u64), (Field::V, 16)] {
            for (a, b, n, d) in (0..LAYERS).flat_map(|a| {
                (0..BLOCKS).flat_map(move |b| {
                    (0..SLOTS).flat_map(move |n| (0..WIDTH).map(move |d| (a, b, n, d)))
                })
            }) {
                let page_start = page_start(a, b);
                let want = page_start + n * 32 + row_off + 2 * d;
                let c = Coord {
                    layer: a,
                    block: b,
                    head: 0,
                    slot: n,
                    field,
                    dim: d,
                };
                let at = l.offset(&c).unwrap();
                assert_eq!((at.buffer, at.offset), (0, want), "{spec}: {c:?}");
                // Inside the page's dense part: the padding holds no element.
                assert!(at.offset + 2 <= page_start + DENSE, "{spec}: {c:?}");
                assert!(at.offset + 2 <= end, "{spec}: {c:?}");
            }
            // Head 1 does not exist.
            let c = Coord {
                layer: 0,
                block: 0,
                head: 1,
                slot: 0,
                field,
                dim: 0,
            };
            assert!(matches!(
                l.offset(&c),
                Err(LayoutError::OutOfRange {
                    axis: "head",
                    value: 1,
                    limit: 1
                })
            ));
        }
    }
}
