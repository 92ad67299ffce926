//! Lowering a [`Placement`] to per-field strides and buffer extents, with the checks that
//! belong to each placement kind. Called once by [`crate::KvCacheLayout::new`].

use crate::dtype::DType;
use crate::error::{add, mul, LayoutError, Result, MAX_OFFSET};
use crate::spec::{
    Axis, BufferExtent, Content, Field, FieldStrides, LegacyKind, Paged, Placement, StridedField,
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
    let mut stride = [0u64; 4]; // indexed like `axes`
    let mut running = row_bytes;
    let mut page_done = false;
    for i in (0..4).rev() {
        let axis = axes[i];
        if matches!(axis, Axis::L | Axis::B) && !page_done {
            page_done = true;
            let padded_ok = i == 1; // H and N are the two innermost axes
            if padded_ok {
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
                // What sits inside `axis`: another axis, or (innermost) only the content.
                let inside = match axes.get(i + 1) {
                    Some(&a) => format!("{a} inside {axis}"),
                    None => format!("{axis} innermost"),
                };
                return Err(LayoutError::Invalid(format!(
                    "page padding and alignment need H and N inside both L and B \
                     (orders LB.. and BL..); {} has {inside}",
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
