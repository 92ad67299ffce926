//! Lowering a [`Placement`] to per-field strides and buffer extents, with the checks that
//! belong to each placement kind. Called once by [`crate::KvCacheLayout::new`].

use crate::dtype::DType;
use crate::error::{add, mul, LayoutError, Result, MAX_OFFSET};
use crate::spec::{
    Axis, AxisOrder, BufferExtent, Content, Field, FieldStrides, LegacyKind, Paged, Placement,
    StridedField,
};

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

pub(crate) fn lower(placement: &Placement, rows: &[RowField], ext: Extents) -> Result<Lowered> {
    match placement {
        Placement::Paged(p) => lower_paged(p, rows, ext),
        Placement::Legacy {
            layout,
            base_offset,
        } => lower_legacy(*layout, *base_offset, rows, ext),
        Placement::Strided { fields, extents } => lower_strided(fields, extents, rows),
    }
}

fn lower_paged(p: &Paged, rows: &[RowField], ext: Extents) -> Result<Lowered> {
    if p.alignment == 0 {
        return Err(LayoutError::ZeroSize { what: "alignment" });
    }
    if !p.alignment.is_power_of_two() {
        return Err(LayoutError::NotPowerOfTwo {
            what: "alignment",
            value: p.alignment,
        });
    }
    let mut row_offsets = Vec::with_capacity(rows.len());
    let mut row_bytes = 0u64;
    for r in rows {
        row_offsets.push(row_bytes);
        let bytes = mul(r.width, r.dtype.size_bytes(), || {
            format!("{} row bytes", r.field)
        })?;
        row_bytes = add(row_bytes, bytes, || "row bytes".into())?;
    }
    let axes = p.order.axes();
    let (page_at, outside) = page_axis(p.order, ext.heads);
    let mut stride = [0u64; 4]; // indexed like `axes`
    let mut running = row_bytes;
    for i in (0..4).rev() {
        let axis = axes[i];
        if i == page_at {
            if outside.is_empty() {
                let dense = running;
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
                page = mul(page.div_ceil(p.alignment), p.alignment, || {
                    "page size rounded up to the alignment".into()
                })?;
                running = page;
            } else if p.page_size_padded.is_some() || p.alignment > 1 {
                let misplaced = outside
                    .iter()
                    .map(|a| format!("{a} (extent {})", ext.of(*a)))
                    .collect::<Vec<_>>()
                    .join(" and ");
                let inside = match &axes[i + 1..] {
                    [] => format!("{axis} innermost"),
                    rest => format!(
                        "only {} inside {axis}",
                        rest.iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ),
                };
                return Err(LayoutError::Invalid(format!(
                    "page padding and alignment need H and N inside both L and B \
                     (orders LB.. and BL..; H may sit outside when it has extent 1); \
                     {} has {misplaced} outside {axis}, {inside}",
                    p.order
                )));
            }
        }
        let explicit = match axis {
            Axis::L => p.layer_stride_bytes,
            Axis::B => p.block_stride_bytes,
            _ => None,
        };
        let s = match explicit {
            Some(s) => {
                if s < running {
                    return Err(LayoutError::StrideTooSmall {
                        what: format!("{} stride", axis_name(axis)),
                        value: s,
                        needed: running,
                    });
                }
                if s % p.alignment != 0 {
                    return Err(LayoutError::Misaligned {
                        what: format!("{} stride", axis_name(axis)),
                        value: s,
                        align: p.alignment,
                    });
                }
                s
            }
            None => running,
        };
        stride[i] = s;
        running = mul(s, ext.of(axis), || {
            format!("{} extent in bytes", axis_name(axis))
        })?;
    }
    if !p.base_offset.is_multiple_of(p.alignment) {
        return Err(LayoutError::Misaligned {
            what: "base_offset".into(),
            value: p.base_offset,
            align: p.alignment,
        });
    }
    let by_axis = |a: Axis| stride[axes.iter().position(|x| *x == a).unwrap_or(0)];
    let end = add(p.base_offset, running, || "registered span".into())?;
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
        Axis::N => "token",
    }
}

fn lower_legacy(kind: LegacyKind, base: u64, rows: &[RowField], ext: Extents) -> Result<Lowered> {
    let [k, v] = rows else {
        return Err(LayoutError::Invalid(format!(
            "legacy layout {kind} stores plain K and V; this content has fields {}",
            rows.iter()
                .map(|r| r.field.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    if (k.field, v.field) != (Field::K, Field::V) {
        return Err(LayoutError::Invalid(format!(
            "legacy layout {kind} stores plain K and V"
        )));
    }
    add(base, 0, || "base_offset".into())?;
    let e = k.dtype.size_bytes();
    let separate = matches!(kind, LegacyKind::SeparateNhd | LegacyKind::SeparateHnd);
    if !separate && k.width != v.width {
        return Err(LayoutError::Invalid(format!(
            "{kind} keeps K and V in one tensor with one head size; head_size {} != head_size_v {}",
            k.width, v.width
        )));
    }
    let d = k.width;
    let Extents {
        layers,
        blocks,
        heads,
        slots,
    } = ext;
    // Bytes of one [N, H, D] page of one of K or V, and of one layer of it.
    let page = mul(
        mul(mul(slots, heads, || "page".into())?, d, || "page".into())?,
        e,
        || "page bytes".into(),
    )?;
    let half = mul(page, blocks, || "per-layer K bytes".into())?;
    let plain = |width: u64, nhd: bool, buffer: u32, base_offset: u64, block: u64, layer: u64| {
        let (head, slot) = if nhd {
            (width * e, heads * width * e)
        } else {
            (slots * width * e, width * e)
        };
        FieldStrides {
            buffer,
            base_offset,
            layer,
            block,
            head,
            slot,
            dim_split: width,
            dim_chunk: width * e,
            dim: e,
        }
    };
    let total = |per_layer: u64| -> Result<BufferExtent> {
        let span = mul(per_layer, layers, || "registered span".into())?;
        Ok(BufferExtent {
            start: base,
            end: add(base, span, || "registered span".into())?,
        })
    };
    let two_halves = mul(half, 2, || "per-layer K+V bytes".into())?;
    let (ks, vs, extents) = match kind {
        LegacyKind::VllmPagedV1 => {
            let x = k.dtype.vllm_x();
            if d % x != 0 {
                return Err(LayoutError::XNotDividing {
                    head_size: d,
                    x,
                    elem_bytes: e,
                });
            }
            let key = FieldStrides {
                buffer: 0,
                base_offset: base,
                layer: two_halves,
                block: page,
                head: d * slots * e,
                slot: x * e,
                dim_split: x,
                dim_chunk: slots * x * e,
                dim: e,
            };
            let value = FieldStrides {
                buffer: 0,
                base_offset: base + half,
                layer: two_halves,
                block: page,
                head: d * slots * e,
                slot: e,
                dim_split: d,
                dim_chunk: d * slots * e,
                dim: slots * e,
            };
            (key, value, vec![total(two_halves)?])
        }
        LegacyKind::FlashAttnNhd | LegacyKind::FlashAttnHnd => {
            let nhd = kind == LegacyKind::FlashAttnNhd;
            (
                plain(d, nhd, 0, base, page, two_halves),
                plain(d, nhd, 0, base + half, page, two_halves),
                vec![total(two_halves)?],
            )
        }
        LegacyKind::FlashinferNhd | LegacyKind::FlashinferHnd => {
            let nhd = kind == LegacyKind::FlashinferNhd;
            (
                plain(d, nhd, 0, base, 2 * page, two_halves),
                plain(d, nhd, 0, base + page, 2 * page, two_halves),
                vec![total(two_halves)?],
            )
        }
        LegacyKind::SeparateNhd | LegacyKind::SeparateHnd => {
            let nhd = kind == LegacyKind::SeparateNhd;
            let vpage = mul(slots * heads, v.width * e, || "V page bytes".into())?;
            let vhalf = mul(vpage, blocks, || "per-layer V bytes".into())?;
            (
                plain(d, nhd, 0, base, page, half),
                plain(v.width, nhd, 1, base, vpage, vhalf),
                vec![total(half)?, total(vhalf)?],
            )
        }
    };
    Ok((vec![(*k, ks), (*v, vs)], extents))
}

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

    /// With one head slot the head axis may sit outside L or B: every element sits where the
    /// page arithmetic puts it, no element touches a page's padding, and the registered span is
    /// the whole padded extent.
    #[test]
    fn one_head_axis_outside_the_page_takes_padded_pages() {
        // N=16, D=8 f16: row [K 8][V 8] = 32 B, dense page 16 * 32 = 512 B.
        let (layers, blocks, slots, width, dense) = (2u64, 3u64, 16u64, 8u64, 512u64);
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
                        "kv L={layers} B={blocks} N={slots} H=1 D={width} dtype=f16 \
                         order={order} {extra} base={base}"
                    );
                    let l: KvCacheLayout = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
                    let end = base + layers * blocks * page;
                    assert_eq!(l.extents().len(), 1, "{spec}");
                    assert_eq!(
                        (l.extents()[0].start, l.extents()[0].end),
                        (base, end),
                        "{spec}"
                    );
                    for (field, row_off) in [(Field::K, 0u64), (Field::V, 16)] {
                        for (a, b, n, d) in (0..layers).flat_map(|a| {
                            (0..blocks).flat_map(move |b| {
                                (0..slots).flat_map(move |n| (0..width).map(move |d| (a, b, n, d)))
                            })
                        }) {
                            let page_start = if layer_outer {
                                base + a * blocks * page + b * page
                            } else {
                                base + b * layers * page + a * page
                            };
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
                            assert!(at.offset + 2 <= page_start + dense, "{spec}: {c:?}");
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
}
