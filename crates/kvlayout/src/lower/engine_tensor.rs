//! Lowering another engine's layout (`tensor=`): vLLM paged v1, FlashAttention, FlashInfer,
//! and K and V in separate allocations, each as per-field strides and buffer extents.

use super::{Extents, Lowered, RowField};
use crate::error::{add, mul, LayoutError, Result};
use crate::spec::{BufferExtent, EngineTensor, Field, FieldStrides};

/// The strides and extents of the engine tensor layout `kind` from `base`.
pub(super) fn lower_engine_tensor(
    kind: EngineTensor,
    base: u64,
    rows: &[RowField],
    ext: Extents,
) -> Result<Lowered> {
    let (k, v) = plain_kv_rows(kind, rows)?;
    add(base, 0, || "base_offset".into())?;
    let e = k.dtype.size_bytes();
    let separate = matches!(kind, EngineTensor::SeparateNhd | EngineTensor::SeparateHnd);
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
    let (page, half) = page_bytes(ext, d, e)?;
    let plain = |nhd: bool| PlainPage {
        elem_bytes: e,
        heads,
        slots,
        nhd,
    };
    let total = |per_layer: u64| tensor_extent(base, per_layer, layers);
    let two_halves = mul(half, 2, || "per-layer K+V bytes".into())?;
    let (ks, vs, extents) = match kind {
        EngineTensor::VllmPagedV1 => {
            let (key, value) = vllm_paged_v1_strides(k, base, slots, page, half, two_halves)?;
            (key, value, vec![total(two_halves)?])
        }
        EngineTensor::FlashAttnNhd | EngineTensor::FlashAttnHnd => {
            let p = plain(kind == EngineTensor::FlashAttnNhd);
            (
                p.strides(d, 0, base, page, two_halves),
                p.strides(d, 0, base + half, page, two_halves),
                vec![total(two_halves)?],
            )
        }
        EngineTensor::FlashinferNhd | EngineTensor::FlashinferHnd => {
            let p = plain(kind == EngineTensor::FlashinferNhd);
            (
                p.strides(d, 0, base, 2 * page, two_halves),
                p.strides(d, 0, base + page, 2 * page, two_halves),
                vec![total(two_halves)?],
            )
        }
        EngineTensor::SeparateNhd | EngineTensor::SeparateHnd => {
            let p = plain(kind == EngineTensor::SeparateNhd);
            let vpage = mul(slots * heads, v.width * e, || "V page bytes".into())?;
            let vhalf = mul(vpage, blocks, || "per-layer V bytes".into())?;
            (
                p.strides(d, 0, base, page, half),
                p.strides(v.width, 1, base, vpage, vhalf),
                vec![total(half)?, total(vhalf)?],
            )
        }
    };
    Ok((vec![(*k, ks), (*v, vs)], extents))
}

/// Bytes of one `[N, H, D]` page of one of K or V (`d` elements of `e` bytes per head), and of
/// one layer of it.
fn page_bytes(ext: Extents, d: u64, e: u64) -> Result<(u64, u64)> {
    let page = mul(
        mul(mul(ext.slots, ext.heads, || "page".into())?, d, || {
            "page".into()
        })?,
        e,
        || "page bytes".into(),
    )?;
    let half = mul(page, ext.blocks, || "per-layer K bytes".into())?;
    Ok((page, half))
}

/// The K and V rows of an engine tensor layout, which stores plain K and V and nothing else.
fn plain_kv_rows(kind: EngineTensor, rows: &[RowField]) -> Result<(&RowField, &RowField)> {
    let [k, v] = rows else {
        return Err(LayoutError::Invalid(format!(
            "tensor={kind} stores plain K and V; this content has fields {}",
            rows.iter()
                .map(|r| r.field.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    if (k.field, v.field) != (Field::K, Field::V) {
        return Err(LayoutError::Invalid(format!(
            "tensor={kind} stores plain K and V"
        )));
    }
    Ok((k, v))
}

/// The byte range of `layers` layers of `per_layer` bytes each from `base`.
fn tensor_extent(base: u64, per_layer: u64, layers: u64) -> Result<BufferExtent> {
    let span = mul(per_layer, layers, || "registered span".into())?;
    Ok(BufferExtent {
        start: base,
        end: add(base, span, || "registered span".into())?,
    })
}

/// The page shape of a plain engine tensor field: `[N, H, D]` (`nhd`) or `[H, N, D]`.
#[derive(Clone, Copy)]
struct PlainPage {
    elem_bytes: u64,
    heads: u64,
    slots: u64,
    nhd: bool,
}

impl PlainPage {
    /// The strides of a field `width` elements wide in this page shape, at `base_offset` of
    /// `buffer`, its pages `block` bytes apart and its layers `layer` bytes apart.
    fn strides(
        self,
        width: u64,
        buffer: u32,
        base_offset: u64,
        block: u64,
        layer: u64,
    ) -> FieldStrides {
        let e = self.elem_bytes;
        let (head, slot) = if self.nhd {
            (width * e, self.heads * width * e)
        } else {
            (self.slots * width * e, width * e)
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
    }
}

/// vLLM paged v1: key `[B, H, D/x, N, x]` and value `[B, H, D, N]`, K's half of each layer
/// (`half` bytes, `two_halves` with V's) before V's, pages `page` bytes apart.
fn vllm_paged_v1_strides(
    k: &RowField,
    base: u64,
    slots: u64,
    page: u64,
    half: u64,
    two_halves: u64,
) -> Result<(FieldStrides, FieldStrides)> {
    let (d, e) = (k.width, k.dtype.size_bytes());
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
    Ok((key, value))
}
