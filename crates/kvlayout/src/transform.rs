//! Transformations of a layout, each a view of the same memory with stated post-conditions
//! (checked as properties in the tests), and one new layout:
//!
//! * [`KvCacheLayout::tp_slice`]: `s.offset(l,b,h,n,f,d) == a.offset(l,b,heads.start+h,n,f,d)`,
//!   `s.num_kv_heads == heads.len()`, same extents (registered span) as the parent: a view of
//!   another rank's (or the whole) cache.
//! * [`KvCacheLayout::tp_rank_layout`]: not a view; the dense cache a TP rank allocates for
//!   its own heads, same spec with `heads.len()` heads.
//! * [`KvCacheLayout::split_blocks`]: `s.offset(l, b*r+j, h, n, f, d) ==
//!   a.offset(l, b, h, j*N/r + n, f, d)`, `s.num_blocks == r * a.num_blocks`.
//! * [`KvCacheLayout::layer_range`]: `s.offset(l, ..) == a.offset(start + l, ..)`.
//! * [`KvCacheLayout::same_addressing`] changes nothing and either agrees or names the first
//!   difference.

use std::ops::Range;

use crate::error::{LayoutError, Result};
use crate::layout::KvCacheLayout;
use crate::spec::{FieldStrides, LayoutSpec, Placement, StridedField};

mod tp_rank;

impl KvCacheLayout {
    /// Rebuilds this layout as explicit strides with a new geometry and per-field strides.
    fn restride(
        &self,
        geometry: crate::Geometry,
        f: impl Fn(FieldStrides) -> FieldStrides,
    ) -> Result<KvCacheLayout> {
        let fields = self
            .stored_fields()
            .iter()
            .map(|m| StridedField {
                field: m.field,
                strides: f(m.strides),
            })
            .collect();
        KvCacheLayout::new(LayoutSpec {
            geometry,
            placement: Placement::Strided {
                fields,
                extents: self.extents().to_vec(),
            },
            ..self.spec().clone()
        })
    }

    /// Head slots held by `tp_rank` of `tp_size`: a contiguous range of `H / tp_size` heads,
    /// or, when `tp_size > H`, the one replicated head `tp_rank / (tp_size / H)`.
    pub fn tp_heads(&self, tp_size: u64, tp_rank: u64) -> Result<Range<u64>> {
        let refuse = |reason: String| LayoutError::TransformRefused {
            transform: "tp_slice",
            reason,
        };
        let heads = tp_head_range(self.geometry().num_kv_heads, tp_size, tp_rank)?;
        if self.content().tp_shards_channels() && tp_size > 1 {
            return Err(refuse(
                "Mamba conv state is sharded along its channels, not head slots".into(),
            ));
        }
        Ok(heads)
    }

    /// The part of this layout that TP rank `tp_rank` of `tp_size` holds, as a view of the
    /// same memory (heads replicated when `tp_size > num_kv_heads`): the rank's heads inside
    /// the parent's allocation, strides and extents unchanged. The cache a rank allocates for
    /// itself is [`Self::tp_rank_layout`].
    ///
    /// ```
    /// let l: kvlayout::KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=LBNHC".parse()?;
    /// let r1 = l.tp_slice(2, 1)?;
    /// assert_eq!(r1.geometry().num_kv_heads, 2);
    /// // rank 1's head 0 is the parent's head 2
    /// let k = kvlayout::Field::K;
    /// let c = |h| kvlayout::Coord { layer: 0, block: 1, head: h, slot: 3, field: k, dim: 4 };
    /// assert_eq!(r1.offset(&c(0))?, l.offset(&c(2))?);
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn tp_slice(&self, tp_size: u64, tp_rank: u64) -> Result<KvCacheLayout> {
        let heads = self.tp_heads(tp_size, tp_rank)?;
        let geometry = crate::Geometry {
            num_kv_heads: heads.end - heads.start,
            ..*self.geometry()
        };
        self.restride(geometry, |s| FieldStrides {
            base_offset: s.base_offset + heads.start * s.head,
            ..s
        })
    }

    /// Views each allocator block as `ratio` kernel blocks of `block_size / ratio` tokens.
    /// Refused unless every field's block stride equals `slots * token stride` (the dense,
    /// token-outermost page): otherwise kernel blocks would not be evenly strided.
    pub fn split_blocks(&self, ratio: u64) -> Result<KvCacheLayout> {
        let refuse = |reason: String| LayoutError::TransformRefused {
            transform: "split_blocks",
            reason,
        };
        if ratio == 0 {
            return Err(LayoutError::ZeroSize { what: "ratio" });
        }
        if ratio == 1 {
            return Ok(self.clone());
        }
        let g = *self.geometry();
        let slots = self.num_slots();
        if self.content().is_per_block_state() {
            return Err(refuse("a per-block state cannot be split".into()));
        }
        if !slots.is_multiple_of(ratio) {
            return Err(refuse(format!(
                "{slots} token slots per block do not split by {ratio}"
            )));
        }
        for m in self.stored_fields() {
            let s = m.strides;
            if s.block != slots * s.slot {
                return Err(refuse(format!(
                    "field {}: block stride {} B is not the dense page {} x {} B \
                     (padding, head-major page, or blocks outside layers)",
                    m.field, s.block, slots, s.slot
                )));
            }
        }
        let num_blocks = g
            .num_blocks
            .checked_mul(ratio)
            .ok_or_else(|| LayoutError::Overflow {
                what: "num_blocks * ratio".into(),
                limit: crate::MAX_OFFSET,
            })?;
        let geometry = crate::Geometry {
            num_blocks,
            block_size: g.block_size / ratio,
            ..g
        };
        self.restride(geometry, |s| FieldStrides {
            block: s.block / ratio,
            ..s
        })
    }

    /// Layer slots `layers` of this layout, as a view of the same memory.
    pub fn layer_range(&self, layers: Range<u64>) -> Result<KvCacheLayout> {
        let n = self.geometry().num_layers;
        if layers.start >= layers.end || layers.end > n {
            return Err(LayoutError::TransformRefused {
                transform: "layer_range",
                reason: format!(
                    "{}..{} is not a non-empty range within 0..{n}",
                    layers.start, layers.end
                ),
            });
        }
        let geometry = crate::Geometry {
            num_layers: layers.end - layers.start,
            ..*self.geometry()
        };
        self.restride(geometry, |s| FieldStrides {
            base_offset: s.base_offset + layers.start * s.layer,
            ..s
        })
    }

    /// Token slots `tokens` of every block, as a view of the same memory with blocks of
    /// `tokens.len()` tokens: how a block of one pool is paired with a smaller block of
    /// another when its pages do not split into strided blocks ([`Self::split_blocks`]).
    ///
    /// ```
    /// let l: kvlayout::KvCacheLayout = "kv B=3 N=32 H=4 D=8 dtype=f16 order=HND".parse()?;
    /// assert!(l.split_blocks(2).is_err()); // head-major pages
    /// let upper = l.slot_range(16..32)?;
    /// let c = |slot| kvlayout::Coord { layer: 0, block: 2, head: 3, slot, field: kvlayout::Field::V, dim: 5 };
    /// assert_eq!(upper.offset(&c(1))?, l.offset(&c(17))?);
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn slot_range(&self, tokens: Range<u64>) -> Result<KvCacheLayout> {
        let g = *self.geometry();
        let refuse = |reason: String| LayoutError::TransformRefused {
            transform: "slot_range",
            reason,
        };
        if g.tokens_per_state != 1 || self.content().is_per_block_state() {
            return Err(refuse(format!(
                "slots are not tokens (tokens_per_state {}, content {})",
                g.tokens_per_state,
                self.content().spec_name()
            )));
        }
        if tokens.start >= tokens.end || tokens.end > g.block_size {
            return Err(refuse(format!(
                "{}..{} is not a non-empty range within 0..{}",
                tokens.start, tokens.end, g.block_size
            )));
        }
        let geometry = crate::Geometry {
            block_size: tokens.end - tokens.start,
            ..g
        };
        self.restride(geometry, |s| FieldStrides {
            base_offset: s.base_offset + tokens.start * s.slot,
            ..s
        })
    }

    /// Whether two layouts put every element at the same place (and store the same values:
    /// same dtypes and per-tensor scales). Strides of size-1 axes are ignored.
    pub fn same_addressing(&self, other: &KvCacheLayout) -> Result<()> {
        let differ = |s: String| Err(LayoutError::Mismatch(s));
        let (a, b) = (self.geometry(), other.geometry());
        if a != b {
            let axes = [
                ("num_layers", a.num_layers, b.num_layers),
                ("num_blocks", a.num_blocks, b.num_blocks),
                ("block_size", a.block_size, b.block_size),
                ("num_kv_heads", a.num_kv_heads, b.num_kv_heads),
                ("tokens_per_state", a.tokens_per_state, b.tokens_per_state),
            ];
            let differing: Vec<String> = axes
                .iter()
                .filter(|(_, x, y)| x != y)
                .map(|(name, x, y)| format!("{name} {x} vs {y}"))
                .collect();
            return differ(format!("geometry: {}", differing.join(", ")));
        }
        if self.content() != other.content() || self.dtype() != other.dtype() {
            return differ(format!(
                "content {:?} {} vs {:?} {}",
                self.content(),
                self.dtype(),
                other.content(),
                other.dtype()
            ));
        }
        if self.scales() != other.scales() {
            return differ(format!(
                "scales {:?} vs {:?}",
                self.scales(),
                other.scales()
            ));
        }
        for (a, b) in self.stored_fields().iter().zip(other.stored_fields()) {
            let (sa, sb) = (a.strides, b.strides);
            if (sa.buffer, sa.base_offset) != (sb.buffer, sb.base_offset) {
                return differ(format!(
                    "field {}: starts at buffer {} byte {} vs buffer {} byte {}",
                    a.field, sa.buffer, sa.base_offset, sb.buffer, sb.base_offset
                ));
            }
            let names = ["layer", "block", "head", "slot", "dim chunk", "dim"];
            for ((name, (ext, x)), (_, y)) in names.iter().zip(a.axes()).zip(b.axes()) {
                if ext > 1 && x != y {
                    return differ(format!("field {}: {name} stride {x} vs {y}", a.field));
                }
            }
            if a.is_dim_split() != b.is_dim_split()
                || (a.is_dim_split() && sa.dim_split != sb.dim_split)
            {
                return differ(format!(
                    "field {}: content split x = {} vs {}",
                    a.field, sa.dim_split, sb.dim_split
                ));
            }
        }
        Ok(())
    }
}

/// Head slots TP rank `tp_rank` of `tp_size` holds out of `total_heads`: a contiguous range of
/// `total_heads / tp_size` heads, or, when `tp_size > total_heads`, the one replicated head
/// `tp_rank / (tp_size / total_heads)`. [`KvCacheLayout::tp_heads`] for a layout; the KV
/// connector for a peer it knows by its head count.
pub fn tp_head_range(total_heads: u64, tp_size: u64, tp_rank: u64) -> Result<Range<u64>> {
    let refuse = |reason: String| LayoutError::TransformRefused {
        transform: "tp_slice",
        reason,
    };
    if total_heads == 0 {
        return Err(LayoutError::ZeroSize {
            what: "num_kv_heads",
        });
    }
    if tp_size == 0 {
        return Err(LayoutError::ZeroSize { what: "tp_size" });
    }
    if tp_rank >= tp_size {
        return Err(LayoutError::OutOfRange {
            axis: "tp_rank",
            value: tp_rank,
            limit: tp_size,
        });
    }
    let h = total_heads;
    if tp_size <= h {
        if !h.is_multiple_of(tp_size) {
            return Err(refuse(format!(
                "{h} head slots do not split over tp_size {tp_size}"
            )));
        }
        let per = h / tp_size;
        Ok(tp_rank * per..(tp_rank + 1) * per)
    } else {
        if !tp_size.is_multiple_of(h) {
            return Err(refuse(format!(
                "tp_size {tp_size} exceeds {h} head slots and is not a multiple of it"
            )));
        }
        let head = tp_rank / (tp_size / h);
        Ok(head..head + 1)
    }
}

#[cfg(test)]
mod tests {
    use crate::KvCacheLayout;

    #[test]
    fn same_addressing_names_each_geometry_axis_that_differs() {
        let a: KvCacheLayout = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD"
            .parse()
            .unwrap();
        let b: KvCacheLayout = "kv L=1 B=2 N=32 H=4 D=8 dtype=f16 order=NHD"
            .parse()
            .unwrap();
        let e = a.same_addressing(&b).unwrap_err().to_string();
        assert!(
            e.contains("geometry: num_blocks 3 vs 2, block_size 16 vs 32"),
            "{e}"
        );
        assert!(a.same_addressing(&a).is_ok());
    }
}
