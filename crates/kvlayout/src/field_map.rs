//! The address map of one field: an affine function from `(l, b, h, n, d)` to a byte offset.

use serde::Serialize;

use crate::dtype::DType;
use crate::spec::{Field, FieldStrides};

/// The validated address map of one field.
///
/// `offset(l, b, h, n, d) = base + l*layer + b*block + h*head + n*slot
///                          + (d / dim_split)*dim_chunk + (d % dim_split)*dim`
///
/// All arithmetic fits in 63 bits for every coordinate in the domain (checked at construction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct FieldMap {
    /// The field.
    pub field: Field,
    /// Element type.
    pub dtype: DType,
    /// Layer slots.
    pub num_layers: u64,
    /// Blocks.
    pub num_blocks: u64,
    /// Head slots.
    pub num_heads: u64,
    /// Token/state slots per block.
    pub num_slots: u64,
    /// Elements per row of this field.
    pub width: u64,
    /// Strides in bytes.
    pub strides: FieldStrides,
}

impl FieldMap {
    /// Element size in bytes.
    pub fn elem_bytes(&self) -> u64 {
        self.dtype.size_bytes()
    }

    /// The byte offset of an element. The caller guarantees the coordinate is in the domain
    /// (see [`crate::KvCacheLayout::offset`] for the checked form).
    #[inline]
    pub fn offset_unchecked(&self, l: u64, b: u64, h: u64, n: u64, d: u64) -> u64 {
        let s = &self.strides;
        s.base_offset
            + l * s.layer
            + b * s.block
            + h * s.head
            + n * s.slot
            + (d / s.dim_split) * s.dim_chunk
            + (d % s.dim_split) * s.dim
    }

    /// The six affine axes `(extent, stride_bytes)`: layer, block, head, slot, dim chunk, dim.
    /// (A map built by hand with `dim_split` 0 reads as one chunk.)
    pub fn axes(&self) -> [(u64, u64); 6] {
        let s = &self.strides;
        [
            (self.num_layers, s.layer),
            (self.num_blocks, s.block),
            (self.num_heads, s.head),
            (self.num_slots, s.slot),
            (
                self.width.checked_div(s.dim_split).unwrap_or(1),
                s.dim_chunk,
            ),
            (s.dim_split, s.dim),
        ]
    }

    /// Byte offset of `(layer, block, head 0, slot, element 0)`: where a token's rows start.
    /// The caller guarantees the coordinate is in the domain.
    #[inline]
    pub fn slot_offset(&self, layer: u64, block: u64, slot: u64) -> u64 {
        self.offset_unchecked(layer, block, 0, slot, 0)
    }

    /// Bytes from head 0 to head `head` of the same token (`head * head stride`).
    #[inline]
    pub fn head_offset(&self, head: u64) -> u64 {
        head * self.strides.head
    }

    /// Bytes from one token to the next of the same block (the slot stride).
    #[inline]
    pub fn slot_stride(&self) -> u64 {
        self.strides.slot
    }

    /// Bytes of one row (`width` elements) when stored contiguously.
    pub fn row_bytes(&self) -> u64 {
        self.width * self.elem_bytes()
    }

    /// The bytes of a row when the row is one contiguous run (whether or not its content
    /// index is split into chunks that abut), else `None`.
    pub fn row_run(&self) -> Option<u64> {
        let (s, e) = (&self.strides, self.elem_bytes());
        let chunks = self.width.checked_div(s.dim_split).unwrap_or(1);
        (s.dim == e && (chunks <= 1 || s.dim_chunk == s.dim_split * e)).then_some(self.row_bytes())
    }

    /// Whether a row is one contiguous run ([`FieldMap::row_run`]).
    pub fn row_contiguous(&self) -> bool {
        self.row_run().is_some()
    }

    /// Whether rows are stored in whole pieces of `piece_bytes` bytes of consecutive
    /// elements, each row a whole number of pieces, pieces `dim_chunk` bytes apart (the legacy
    /// vLLM key with `x = piece_bytes / element size`).
    pub fn x_split(&self, piece_bytes: u64) -> bool {
        let (s, e) = (&self.strides, self.elem_bytes());
        s.dim == e
            && s.dim_split.checked_mul(e) == Some(piece_bytes)
            && self.width.is_multiple_of(s.dim_split)
            && s.dim_chunk >= piece_bytes
    }

    /// `(chunk_stride, element_stride)` in bytes when element `d = c * x + i` lies at
    /// `c * chunk_stride + i * element_stride` from the row's start: the stored split itself,
    /// or any `x` dividing an unsplit row; `None` otherwise.
    pub fn split_strides(&self, x: u64) -> Option<(u64, u64)> {
        let s = &self.strides;
        if s.dim_split == x {
            Some((s.dim_chunk, s.dim))
        } else if s.dim_split == self.width && x != 0 && self.width.is_multiple_of(x) {
            Some((x * s.dim, s.dim))
        } else {
            None
        }
    }

    /// Whether the content index is split into chunks (the legacy vLLM key).
    pub fn is_dim_split(&self) -> bool {
        self.strides.dim_split != self.width
    }

    /// Byte offset one past the last byte the field touches: exact for every map a layout
    /// answers (validated to fit in 63 bits); for a map built by hand, saturating at
    /// `u64::MAX`, an axis of extent 0 counted as one of extent 1.
    pub fn data_end(&self) -> u64 {
        Self::reach(&self.axes()[..4])
            .saturating_add(self.strides.base_offset)
            .saturating_add(self.row_span())
    }

    /// Bytes from a row's first element to one past its farthest (its whole length when the
    /// row is contiguous; chunk and element strides included when it is not). Saturating for
    /// a map built by hand.
    pub fn row_span(&self) -> u64 {
        Self::reach(&self.axes()[4..]).saturating_add(self.elem_bytes())
    }

    /// Bytes from the first point of `axes` to the last (saturating).
    fn reach(axes: &[(u64, u64)]) -> u64 {
        axes.iter()
            .map(|&(ext, stride)| ext.saturating_sub(1).saturating_mul(stride))
            .fold(0, u64::saturating_add)
    }

    /// Number of elements in the field's domain (saturating at `u64::MAX` for a map built by
    /// hand).
    pub fn num_elements(&self) -> u64 {
        [
            self.num_layers,
            self.num_blocks,
            self.num_heads,
            self.num_slots,
            self.width,
        ]
        .iter()
        .fold(1u64, |n, &x| n.saturating_mul(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Maps built by hand with a zero split, zero extents or strides past 64 bits answer
    /// without a panic (saturating), where division by zero and underflow used to abort.
    #[test]
    fn hand_built_maps_do_not_panic() {
        let m = FieldMap {
            field: Field::K,
            dtype: DType::F16,
            num_layers: 0,
            num_blocks: u64::MAX,
            num_heads: 3,
            num_slots: 0,
            width: 8,
            strides: FieldStrides {
                buffer: 0,
                base_offset: 16,
                layer: 1,
                block: u64::MAX,
                head: 2,
                slot: 4,
                dim_split: 0,
                dim_chunk: 8,
                dim: 2,
            },
        };
        assert_eq!(m.axes()[4], (1, 8), "a zero split reads as one chunk");
        assert_eq!(m.data_end(), u64::MAX);
        assert_eq!(m.num_elements(), 0);
        let m = FieldMap {
            num_blocks: 2,
            strides: FieldStrides {
                block: 64,
                ..m.strides
            },
            ..m
        };
        // Base 16, block 64, head 2 x 2, no chunk, 0 x dim, one element of 2 bytes.
        assert_eq!(m.data_end(), 16 + 64 + 4 + 2);
    }

    /// The address helpers backends call agree with `offset_unchecked` on the legacy vLLM key
    /// (x = 8 f16 elements, 16-byte pieces), a plain token-major row and a split whose chunks
    /// abut.
    #[test]
    fn helpers_answer_what_the_offset_function_does() {
        let layout: crate::KvCacheLayout =
            "kv L=2 B=3 N=16 H=4 D=64 dtype=f16 tensor=vllm-paged-v1"
                .parse()
                .unwrap();
        let k = layout.field_map(Field::K).unwrap();
        assert!(k.is_dim_split() && k.x_split(16) && !k.x_split(8));
        assert_eq!(
            k.row_run(),
            None,
            "pieces of a legacy key row lie N * 16 bytes apart"
        );
        assert_eq!(k.split_strides(8), Some((k.strides.dim_chunk, 2)));
        assert_eq!(k.split_strides(4), None, "another split is not affine");
        // The last piece starts 7 chunks in and holds 8 elements of 2 bytes.
        assert_eq!(k.row_span(), 7 * k.strides.dim_chunk + 16);
        for (l, b, h, n) in [(0, 0, 0, 0), (1, 2, 3, 15), (1, 1, 2, 7)] {
            let at = k.offset_unchecked(l, b, h, n, 0);
            assert_eq!(k.slot_offset(l, b, n) + k.head_offset(h), at);
            assert_eq!(
                k.slot_offset(l, b, n + 1) - k.slot_offset(l, b, n),
                k.slot_stride()
            );
        }
        let nhd: crate::KvCacheLayout = "kv L=1 B=3 N=16 H=4 D=16 dtype=bf16 order=NHD"
            .parse()
            .unwrap();
        let v = nhd.field_map(Field::V).unwrap();
        assert_eq!(v.row_run(), Some(32));
        assert_eq!(v.row_span(), 32);
        assert!(v.row_contiguous() && !v.is_dim_split() && !v.x_split(16));
        assert_eq!(
            v.split_strides(4),
            Some((8, 2)),
            "an unsplit row splits any way"
        );
        let abut = FieldMap {
            strides: FieldStrides {
                dim_split: 4,
                dim_chunk: 8,
                ..v.strides
            },
            ..v
        };
        assert_eq!(abut.row_run(), Some(32), "chunks that abut are one run");
        assert!(!abut.x_split(16), "8-byte pieces are not the legacy key's");
    }
}
