//! Strided tensor views of a field in each consumer's convention.
//!
//! A view is `(offset, shape, strides)` in elements (and bytes) relative to a buffer's start,
//! exactly what `torch.as_strided` takes. A view that would need a copy is refused with the
//! reason; nothing is ever silently re-laid out.

use serde::Serialize;
use strum::{Display, EnumIter, EnumString, IntoStaticStr};

use crate::dtype::DType;
use crate::error::{LayoutError, Result};
use crate::field_map::FieldMap;
use crate::layout::KvCacheLayout;
use crate::spec::Field;

/// Whose tensor convention a view follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Display, EnumString, EnumIter, IntoStaticStr)]
#[strum(serialize_all = "kebab-case", ascii_case_insensitive)]
pub enum Convention {
    /// The standardized per-layer `[B, H, N, C]` view of one field.
    Standard,
    /// vLLM paged attention v1: key `[B, H, D/x, N, x]`, value `[B, H, D, N]`.
    VllmPagedV1,
    /// FlashAttention: per field `[B, N, H, D]`; K and V together `(2, B, N, H, D)`.
    FlashAttn,
    /// FlashInfer with `kv_layout="NHD"`: per field `[B, N, H, D]`; together `(B, 2, N, H, D)`.
    #[strum(to_string = "flashinfer", serialize = "flashinfer-nhd")]
    Flashinfer,
    /// FlashInfer with `kv_layout="HND"`: per field `[B, H, N, D]`; together `(B, 2, H, N, D)`.
    FlashinferHnd,
}

/// What a view selects: one field, or K and V stacked along a size-2 axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViewTarget {
    /// One readable field.
    Field(Field),
    /// K and V together (flash-attn and flashinfer only).
    Kv,
}

/// Names accepted by [`Convention::from_name`].
pub const CONVENTION_NAMES: &[&str] = &[
    "standard",
    "vllm-paged-v1",
    "flash-attn",
    "flashinfer",
    "flashinfer-nhd",
    "flashinfer-hnd",
];

impl Convention {
    /// Parses a convention name, with an error that lists the known ones.
    pub fn from_name(s: &str) -> Result<Self> {
        s.parse().map_err(|_| LayoutError::UnknownName {
            what: "convention",
            name: s.to_string(),
            known: CONVENTION_NAMES.join(", "),
        })
    }
}

impl std::str::FromStr for ViewTarget {
    type Err = LayoutError;
    fn from_str(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("kv") {
            return Ok(ViewTarget::Kv);
        }
        s.parse::<Field>()
            .map(ViewTarget::Field)
            .map_err(|_| LayoutError::UnknownName {
                what: "field",
                name: s.to_string(),
                known: "k, v, k_scale, v_scale, latent, bytes, conv, ssm, kv".into(),
            })
    }
}

impl std::fmt::Display for ViewTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ViewTarget::Field(x) => write!(f, "{x}"),
            ViewTarget::Kv => write!(f, "kv"),
        }
    }
}

/// A strided view, relative to the start of `buffer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorView {
    /// Offset of element 0 in elements.
    pub offset: u64,
    /// Extents.
    pub shape: Vec<u64>,
    /// Strides in elements.
    pub strides: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Buffer index.
    pub buffer: u32,
    /// Offset of element 0 in bytes.
    pub offset_bytes: u64,
    /// Strides in bytes.
    pub strides_bytes: Vec<u64>,
}

impl TensorView {
    /// Byte offset of a multi-index, each index checked against its extent: a wrong number of
    /// indices or one past its axis is an error naming it.
    ///
    /// ```
    /// use kvlayout::{Convention, Field, KvCacheLayout, ViewTarget};
    /// let l: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=NHD".parse()?;
    /// let v = l.view(Convention::Standard, ViewTarget::Field(Field::V), 0)?; // [B, H, N, D]
    /// assert_eq!(v.byte_offset(&[1, 2, 3, 4])?, (16 * 4 * 16 + 3 * 4 * 16 + 2 * 16 + 8 + 4) * 2);
    /// assert!(v.byte_offset(&[1, 4, 3, 4]).is_err()); // head 4 of 4
    /// assert!(v.byte_offset(&[1, 2, 3]).is_err());
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn byte_offset(&self, index: &[u64]) -> Result<u64> {
        if index.len() != self.shape.len() {
            return Err(LayoutError::InvalidQuery(format!(
                "a {}-dim index {index:?} for a view of shape {:?}",
                index.len(),
                self.shape
            )));
        }
        let mut offset = self.offset_bytes;
        for (d, ((&i, &n), &stride)) in index
            .iter()
            .zip(&self.shape)
            .zip(&self.strides_bytes)
            .enumerate()
        {
            if i >= n {
                return Err(LayoutError::InvalidQuery(format!(
                    "index[{d}] = {i} is past the view's shape {:?}",
                    self.shape
                )));
            }
            // Every element of the view lies inside the layout's checked span: no overflow.
            offset += i * stride;
        }
        Ok(offset)
    }
}

fn refuse(c: Convention, t: ViewTarget, reason: impl Into<String>) -> LayoutError {
    LayoutError::ViewRefused {
        convention: c.to_string(),
        field: t.to_string(),
        reason: reason.into(),
    }
}

fn make(
    c: Convention,
    t: ViewTarget,
    m: &FieldMap,
    offset_bytes: u64,
    dims: Vec<(u64, u64)>,
) -> Result<TensorView> {
    let e = m.elem_bytes();
    let elems = |b: u64, what: &str| {
        if b.is_multiple_of(e) {
            Ok(b / e)
        } else {
            Err(refuse(
                c,
                t,
                format!("{what} {b} B is not a whole number of {e}-byte elements"),
            ))
        }
    };
    let mut strides = Vec::with_capacity(dims.len());
    for (ext, s) in &dims {
        // A size-1 axis may carry any stride; report it in whole elements anyway.
        strides.push(if *ext > 1 {
            elems(*s, "stride")?
        } else {
            s / e
        });
    }
    Ok(TensorView {
        offset: elems(offset_bytes, "offset")?,
        shape: dims.iter().map(|d| d.0).collect(),
        strides,
        dtype: m.dtype,
        buffer: m.strides.buffer,
        offset_bytes,
        strides_bytes: dims.iter().map(|d| d.1).collect(),
    })
}

fn unsplit(c: Convention, t: ViewTarget, m: &FieldMap) -> Result<u64> {
    if m.is_dim_split() {
        Err(refuse(
            c,
            t,
            format!(
                "field {} is stored x-split (x = {}): its content index is not one stride",
                m.field, m.strides.dim_split
            ),
        ))
    } else {
        Ok(m.strides.dim)
    }
}

impl KvCacheLayout {
    /// The view of one field (or of K and V together) of layer slot `layer`.
    ///
    /// ```
    /// use kvlayout::{Convention, Field, ViewTarget};
    /// let l: kvlayout::KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND".parse()?;
    /// let v = l.view(Convention::Standard, ViewTarget::Field(Field::K), 0)?;
    /// assert_eq!(v.shape, [3, 4, 16, 8]);
    /// assert_eq!(v.strides, [4 * 16 * 16, 16 * 16, 16, 1]); // row = K 8 + V 8 elements
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn view(&self, c: Convention, t: ViewTarget, layer: u64) -> Result<TensorView> {
        let g = self.geometry();
        if layer >= g.num_layers {
            return Err(LayoutError::OutOfRange {
                axis: "layer",
                value: layer,
                limit: g.num_layers,
            });
        }
        let field = match t {
            ViewTarget::Field(f) => f,
            ViewTarget::Kv => return self.kv_view(c, layer),
        };
        let m = self.field_map(field)?;
        let s = m.strides;
        let base = s.base_offset + layer * s.layer;
        let (b, h, n, w) = (m.num_blocks, m.num_heads, m.num_slots, m.width);
        match c {
            Convention::Standard => {
                let ds = unsplit(c, t, &m)?;
                make(
                    c,
                    t,
                    &m,
                    base,
                    vec![(b, s.block), (h, s.head), (n, s.slot), (w, ds)],
                )
            }
            Convention::VllmPagedV1 => match field {
                Field::K => {
                    let x = m.dtype.vllm_x();
                    if w % x != 0 {
                        return Err(refuse(
                            c,
                            t,
                            format!("head size {w} is not a multiple of x = {x}"),
                        ));
                    }
                    let chunk = if m.is_dim_split() {
                        if s.dim_split != x {
                            return Err(refuse(
                                c,
                                t,
                                format!(
                                    "stored with x = {}, the convention needs x = {x}",
                                    s.dim_split
                                ),
                            ));
                        }
                        s.dim_chunk
                    } else {
                        x * s.dim
                    };
                    make(
                        c,
                        t,
                        &m,
                        base,
                        vec![
                            (b, s.block),
                            (h, s.head),
                            (w / x, chunk),
                            (n, s.slot),
                            (x, s.dim),
                        ],
                    )
                }
                Field::V => {
                    let ds = unsplit(c, t, &m)?;
                    make(
                        c,
                        t,
                        &m,
                        base,
                        vec![(b, s.block), (h, s.head), (w, ds), (n, s.slot)],
                    )
                }
                _ => Err(refuse(
                    c,
                    t,
                    "the vllm-paged-v1 convention has only K and V",
                )),
            },
            Convention::FlashAttn | Convention::Flashinfer => {
                let ds = unsplit(c, t, &m)?;
                make(
                    c,
                    t,
                    &m,
                    base,
                    vec![(b, s.block), (n, s.slot), (h, s.head), (w, ds)],
                )
            }
            Convention::FlashinferHnd => {
                let ds = unsplit(c, t, &m)?;
                make(
                    c,
                    t,
                    &m,
                    base,
                    vec![(b, s.block), (h, s.head), (n, s.slot), (w, ds)],
                )
            }
        }
    }

    fn kv_view(&self, c: Convention, layer: u64) -> Result<TensorView> {
        let t = ViewTarget::Kv;
        if matches!(c, Convention::Standard | Convention::VllmPagedV1) {
            return Err(refuse(
                c,
                t,
                "this convention has no stacked K/V tensor; ask for k or v",
            ));
        }
        let (k, v) = (self.field_map(Field::K)?, self.field_map(Field::V)?);
        let (ks, vs) = (k.strides, v.strides);
        let same_strides = (
            ks.layer,
            ks.block,
            ks.head,
            ks.slot,
            ks.dim_split,
            ks.dim_chunk,
            ks.dim,
        ) == (
            vs.layer,
            vs.block,
            vs.head,
            vs.slot,
            vs.dim_split,
            vs.dim_chunk,
            vs.dim,
        );
        if ks.buffer != vs.buffer {
            return Err(refuse(
                c,
                t,
                format!(
                    "K and V are separate allocations (buffers {} and {})",
                    ks.buffer, vs.buffer
                ),
            ));
        }
        if k.width != v.width {
            return Err(refuse(
                c,
                t,
                format!("K and V widths differ ({} vs {})", k.width, v.width),
            ));
        }
        if k.dtype != v.dtype {
            return Err(refuse(
                c,
                t,
                format!("K and V dtypes differ ({} vs {})", k.dtype, v.dtype),
            ));
        }
        if !same_strides {
            return Err(refuse(c, t, "K and V have different strides"));
        }
        if vs.base_offset < ks.base_offset {
            return Err(refuse(
                c,
                t,
                "V lies before K: the K/V axis would need a negative stride",
            ));
        }
        let ds = unsplit(c, t, &k)?;
        let kv = vs.base_offset - ks.base_offset;
        let base = ks.base_offset + layer * ks.layer;
        let (b, h, n, w) = (k.num_blocks, k.num_heads, k.num_slots, k.width);
        let dims = match c {
            Convention::FlashAttn => {
                vec![(2, kv), (b, ks.block), (n, ks.slot), (h, ks.head), (w, ds)]
            }
            Convention::Flashinfer => {
                vec![(b, ks.block), (2, kv), (n, ks.slot), (h, ks.head), (w, ds)]
            }
            _ => vec![(b, ks.block), (2, kv), (h, ks.head), (n, ks.slot), (w, ds)],
        };
        make(c, t, &k, base, dims)
    }
}
