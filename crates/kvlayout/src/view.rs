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

mod contiguous;

/// Whose tensor convention a view follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Display, EnumString, EnumIter, IntoStaticStr)]
#[strum(serialize_all = "kebab-case", ascii_case_insensitive)]
pub enum Convention {
    /// The standardized per-layer `[B, H, N, C]` view of one field.
    Standard,
    /// vLLM paged attention v1: key `[B, H, D/x, N, x]`, value `[B, H, D, N]`.
    VllmPagedV1,
    /// FlashAttention: per field `[B, N, H, D]`; K and V together `(2, B, N, H, D)`. Also
    /// named `flash-attn-nhd` and `flash-attn-hnd`: both layouts are read through the same
    /// `(2, B, N, H, D)` tensor, whatever its stride order.
    #[strum(
        to_string = "flash-attn",
        serialize = "flash-attn-nhd",
        serialize = "flash-attn-hnd"
    )]
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
    "flash-attn-nhd",
    "flash-attn-hnd",
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
    /// What each axis indexes, outermost first: `block`, `head`, `slot` (token position in the
    /// block), `dim`, `kv` (K or V), and vLLM's key `dim / x` and `x`; the convention fixes
    /// the order (FlashAttention's stacked `(2, B, N, H, D)` is kv, block, slot, head, dim).
    pub axes: Vec<&'static str>,
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
    ///
    /// A view built by hand may also hold fewer byte strides than extents (an error) or
    /// strides whose sum passes 64 bits (`Overflow`); a view the layout returned has neither.
    pub fn byte_offset(&self, index: &[u64]) -> Result<u64> {
        if index.len() != self.shape.len() {
            return Err(LayoutError::InvalidQuery(format!(
                "a {}-dim index {index:?} for a view of shape {:?}",
                index.len(),
                self.shape
            )));
        }
        if self.strides_bytes.len() != self.shape.len() {
            return Err(LayoutError::InvalidQuery(format!(
                "a view of shape {:?} with {} byte strides {:?}",
                self.shape,
                self.strides_bytes.len(),
                self.strides_bytes
            )));
        }
        let overflow = || LayoutError::Overflow {
            what: format!("byte offset of index {index:?} in a view"),
            limit: u64::MAX,
        };
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
            offset = i
                .checked_mul(stride)
                .and_then(|x| offset.checked_add(x))
                .ok_or_else(overflow)?;
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

/// One axis of a view: its name, extent and stride in bytes.
type Dim = (&'static str, u64, u64);

fn make(
    c: Convention,
    t: ViewTarget,
    m: &FieldMap,
    offset_bytes: u64,
    dims: Vec<Dim>,
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
    for (_, ext, s) in &dims {
        // A size-1 axis may carry any stride; report it in whole elements anyway.
        strides.push(if *ext > 1 {
            elems(*s, "stride")?
        } else {
            s / e
        });
    }
    Ok(TensorView {
        offset: elems(offset_bytes, "offset")?,
        shape: dims.iter().map(|d| d.1).collect(),
        strides,
        dtype: m.dtype,
        buffer: m.strides.buffer,
        offset_bytes,
        strides_bytes: dims.iter().map(|d| d.2).collect(),
        axes: dims.iter().map(|d| d.0).collect(),
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

/// The `[B, H, D/x, N, x]` dims of vLLM's key (its split, if any, must be the convention's x)
/// or the `[B, H, D, N]` dims of its value, from `m`'s strides; `slot` names the N axis.
fn vllm_paged_v1_dims(
    c: Convention,
    t: ViewTarget,
    field: Field,
    m: &FieldMap,
    slot: &'static str,
) -> Result<Vec<Dim>> {
    let s = m.strides;
    let (b, h, n, w) = (m.num_blocks, m.num_heads, m.num_slots, m.width);
    match field {
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
            Ok(vec![
                ("block", b, s.block),
                ("head", h, s.head),
                ("dim / x", w / x, chunk),
                (slot, n, s.slot),
                ("x", x, s.dim),
            ])
        }
        Field::V => {
            let ds = unsplit(c, t, m)?;
            Ok(vec![
                ("block", b, s.block),
                ("head", h, s.head),
                ("dim", w, ds),
                (slot, n, s.slot),
            ])
        }
        _ => Err(refuse(
            c,
            t,
            "the vllm-paged-v1 convention has only K and V",
        )),
    }
}

/// K and V can be one tensor: one buffer, one width, one dtype.
fn check_kv_alike(c: Convention, k: &FieldMap, v: &FieldMap) -> Result<()> {
    let t = ViewTarget::Kv;
    if k.strides.buffer != v.strides.buffer {
        return Err(refuse(
            c,
            t,
            format!(
                "K and V are separate allocations (buffers {} and {})",
                k.strides.buffer, v.strides.buffer
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
            format!(
                "K and V share one dtype in a stacked tensor; K is {}, V is {}",
                k.dtype, v.dtype
            ),
        ));
    }
    Ok(())
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
        let slot = "slot";
        let dims = match c {
            Convention::Standard | Convention::FlashinferHnd => {
                let ds = unsplit(c, t, &m)?;
                vec![
                    ("block", b, s.block),
                    ("head", h, s.head),
                    (slot, n, s.slot),
                    ("dim", w, ds),
                ]
            }
            Convention::VllmPagedV1 => vllm_paged_v1_dims(c, t, field, &m, slot)?,
            Convention::FlashAttn | Convention::Flashinfer => {
                let ds = unsplit(c, t, &m)?;
                vec![
                    ("block", b, s.block),
                    (slot, n, s.slot),
                    ("head", h, s.head),
                    ("dim", w, ds),
                ]
            }
        };
        make(c, t, &m, base, dims)
    }

    /// K and V stacked along a size-2 axis of stride `V - K` (the bases of this layer). K and V
    /// must agree on the stride of every axis of extent > 1 that the view spans (block, token,
    /// head, content; not the layer); an axis of extent 1 carries K's stride.
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
        check_kv_alike(c, &k, &v)?;
        let (kd, vd) = (unsplit(c, t, &k)?, unsplit(c, t, &v)?);
        let (b, h, n, w) = (k.num_blocks, k.num_heads, k.num_slots, k.width);
        let spanned = [
            ("block", b, ks.block, vs.block),
            ("slot", n, ks.slot, vs.slot),
            ("head", h, ks.head, vs.head),
            ("dim", w, kd, vd),
        ];
        if let Some((axis, ext, a, z)) = spanned.iter().find(|(_, ext, a, z)| *ext > 1 && a != z) {
            return Err(refuse(
                c,
                t,
                format!("K and V have different {axis} strides ({a} vs {z} bytes, {ext} {axis}s)"),
            ));
        }
        // Within the layout's checked span: no overflow.
        let base = ks.base_offset + layer * ks.layer;
        let v_base = vs.base_offset + layer * vs.layer;
        if v_base < base {
            return Err(refuse(
                c,
                t,
                "V lies before K: the K/V axis would need a negative stride",
            ));
        }
        let kv = ("kv", 2, v_base - base);
        let block = ("block", b, ks.block);
        let slot = ("slot", n, ks.slot);
        let head = ("head", h, ks.head);
        let dim = ("dim", w, kd);
        let dims = match c {
            Convention::FlashAttn => vec![kv, block, slot, head, dim],
            Convention::Flashinfer => vec![block, kv, slot, head, dim],
            _ => vec![block, kv, head, slot, dim],
        };
        make(c, t, &k, base, dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Coord;

    /// A view built by hand: fewer strides than extents, or strides past 64 bits, are errors
    /// (they were ignored, or wrapped in release builds).
    #[test]
    fn hand_built_views_are_checked() {
        let v = TensorView {
            offset: 0,
            shape: vec![2, 3],
            strides: vec![3],
            dtype: DType::F16,
            buffer: 0,
            offset_bytes: 0,
            strides_bytes: vec![6],
            axes: vec!["a", "b"],
        };
        assert!(matches!(
            v.byte_offset(&[1, 2]),
            Err(LayoutError::InvalidQuery(_))
        ));
        let v = TensorView {
            strides: vec![u64::MAX / 2, 1],
            strides_bytes: vec![u64::MAX - 1, 2],
            ..v
        };
        assert_eq!(v.byte_offset(&[0, 2]).unwrap(), 4);
        assert!(matches!(
            v.byte_offset(&[1, 1]),
            Err(LayoutError::Overflow { .. })
        ));
    }

    /// Every element of the `kv` view of every layer, against `offset`; returns layer 0's view.
    fn checked_kv_view(l: &KvCacheLayout, c: Convention) -> TensorView {
        let g = *l.geometry();
        let mut first = None;
        for layer in 0..g.num_layers {
            let v = l
                .view(c, ViewTarget::Kv, layer)
                .unwrap_or_else(|e| panic!("{l}: {c} kv layer {layer}: {e}"));
            let k = l.field_map(Field::K).unwrap();
            let total: u64 = v.shape.iter().product();
            assert_eq!(
                total,
                2 * g.num_blocks * k.num_slots * g.num_kv_heads * k.width
            );
            for flat in 0..total {
                let mut idx = vec![0u64; v.shape.len()];
                let mut rest = flat;
                for d in (0..idx.len()).rev() {
                    idx[d] = rest % v.shape[d];
                    rest /= v.shape[d];
                }
                let (kv, block, slot, head, dim) = match c {
                    Convention::FlashAttn => (idx[0], idx[1], idx[2], idx[3], idx[4]),
                    Convention::Flashinfer => (idx[1], idx[0], idx[2], idx[3], idx[4]),
                    Convention::FlashinferHnd => (idx[1], idx[0], idx[3], idx[2], idx[4]),
                    other => panic!("{other} has no kv view"),
                };
                let field = [Field::K, Field::V][kv as usize];
                let coord = Coord::new(field, layer, block, head, slot, dim);
                let want = l.offset(&coord).unwrap();
                let got = (v.buffer, v.byte_offset(&idx).unwrap());
                assert_eq!(got, (want.buffer, want.offset), "{l}: {c} {idx:?}");
            }
            first.get_or_insert(v);
        }
        first.expect("at least one layer")
    }

    /// The conventions that have a `kv` view.
    const KV_CONVENTIONS: [Convention; 3] = [
        Convention::FlashAttn,
        Convention::Flashinfer,
        Convention::FlashinferHnd,
    ];

    /// The layout `spec` names and its `kv` views of layer 0 in [`KV_CONVENTIONS`], each
    /// checked element by element against `offset` in every layer.
    fn kv_views(spec: &str) -> (KvCacheLayout, [TensorView; 3]) {
        let l: KvCacheLayout = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
        let views = KV_CONVENTIONS.map(|c| checked_kv_view(&l, c));
        (l, views)
    }

    /// vLLM's key and value differ only in their token stride; with one token per block the
    /// stacked views exist, the size-1 token axis carrying K's stride (x = 8 elements).
    #[test]
    fn kv_view_ignores_the_strides_of_size_one_axes() {
        let (l, views) = kv_views("kv L=2 B=3 N=1 H=4 D=16 dtype=f16 tensor=vllm-paged-v1");
        let want = [
            ([2, 3, 1, 4, 16], [192, 64, 8, 16, 1]),
            ([3, 2, 1, 4, 16], [64, 192, 8, 16, 1]),
            ([3, 2, 4, 1, 16], [64, 192, 16, 8, 1]),
        ];
        for (v, (shape, strides)) in views.into_iter().zip(want) {
            assert_eq!(
                (v.shape, v.strides, v.offset),
                (shape.to_vec(), strides.to_vec(), 0)
            );
        }
        assert_eq!(
            l.view(Convention::FlashAttn, ViewTarget::Kv, 1)
                .unwrap()
                .offset,
            384
        );
    }

    /// One KV head per rank (TP 8): K and V disagree only on the head stride.
    #[test]
    fn kv_view_of_one_head_with_different_head_strides() {
        let (_, [flash_attn, flashinfer, flashinfer_hnd]) = kv_views(
            "kv L=1 B=3 N=4 H=1 D=8 dtype=f16 @k=0:0:0:64:64:16:8:16:2 \
             @v=0:192:0:64:16:16:8:16:2 @buf0=0..384",
        );
        assert_eq!(flash_attn.shape, [2, 3, 4, 1, 8]);
        assert_eq!(flash_attn.strides, [96, 32, 8, 32, 1]);
        assert_eq!(flashinfer.shape, [3, 2, 4, 1, 8]);
        assert_eq!(flashinfer.strides, [32, 96, 8, 32, 1]);
        assert_eq!(flashinfer_hnd.shape, [3, 2, 1, 4, 8]);
        assert_eq!(flashinfer_hnd.strides, [32, 96, 32, 8, 1]);
    }

    /// A per-layer view does not span the layer axis: K and V may have different layer
    /// strides, and the K/V stride is the distance of this layer's bases.
    #[test]
    fn kv_view_of_a_layer_ignores_the_layer_strides() {
        // K layers 32 B apart from byte 0; V layers 64 B apart from byte 64.
        let (l, _) = kv_views(
            "kv L=2 B=2 N=2 H=1 D=4 dtype=f16 @k=0:0:32:16:64:8:4:8:2 \
             @v=0:64:64:16:64:8:4:8:2 @buf0=0..160",
        );
        let kv_stride = |layer| {
            l.view(Convention::FlashAttn, ViewTarget::Kv, layer)
                .unwrap()
        };
        assert_eq!((kv_stride(0).offset, kv_stride(0).strides[0]), (0, 32));
        assert_eq!((kv_stride(1).offset, kv_stride(1).strides[0]), (16, 48));
    }

    /// K and V that differ on an axis of extent > 1 the view spans have no stacked view.
    #[test]
    fn kv_view_refuses_strides_that_differ_on_a_spanned_axis() {
        let reason = |spec: &str, c: Convention| match spec.parse::<KvCacheLayout>() {
            Ok(l) => match l.view(c, ViewTarget::Kv, 0) {
                Err(LayoutError::ViewRefused { reason, .. }) => reason,
                other => panic!("{spec}: {other:?}"),
            },
            Err(e) => panic!("{spec}: {e}"),
        };
        // K head-major, V token-major in each 256-byte block: tokens 16 vs 32 bytes apart.
        let mixed = "kv L=1 B=3 N=4 H=2 D=8 dtype=f16 @k=0:0:0:256:64:16:8:16:2 \
                     @v=0:128:0:256:16:32:8:16:2 @buf0=0..768";
        for c in KV_CONVENTIONS {
            assert_eq!(
                reason(mixed, c),
                "K and V have different slot strides (16 vs 32 bytes, 4 slots)"
            );
        }
        // The TP-8 case with two heads: the head strides now matter.
        let two_heads = "kv L=1 B=3 N=4 H=2 D=8 dtype=f16 @k=0:0:0:384:64:16:8:16:2 \
                         @v=0:128:0:384:128:16:8:16:2 @buf0=0..1152";
        assert_eq!(
            reason(two_heads, Convention::FlashAttn),
            "K and V have different head strides (64 vs 128 bytes, 2 heads)"
        );
        // vLLM's key with more than one token per block is x-split.
        let vllm = "kv L=2 B=3 N=16 H=4 D=16 dtype=f16 tensor=vllm-paged-v1";
        assert_eq!(
            reason(vllm, Convention::FlashAttn),
            "field k is stored x-split (x = 8): its content index is not one stride"
        );
    }
}
