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
    pub fn axes(&self) -> [(u64, u64); 6] {
        let s = &self.strides;
        [
            (self.num_layers, s.layer),
            (self.num_blocks, s.block),
            (self.num_heads, s.head),
            (self.num_slots, s.slot),
            (self.width / s.dim_split, s.dim_chunk),
            (s.dim_split, s.dim),
        ]
    }

    /// Whether the content index is split into chunks (the legacy vLLM key).
    pub fn is_dim_split(&self) -> bool {
        self.strides.dim_split != self.width
    }

    /// Byte offset one past the last byte the field touches.
    pub fn data_end(&self) -> u64 {
        self.strides.base_offset
            + self
                .axes()
                .iter()
                .map(|(ext, stride)| (ext - 1) * stride)
                .sum::<u64>()
            + self.elem_bytes()
    }

    /// Number of elements in the field's domain.
    pub fn num_elements(&self) -> u64 {
        self.num_layers * self.num_blocks * self.num_heads * self.num_slots * self.width
    }
}
