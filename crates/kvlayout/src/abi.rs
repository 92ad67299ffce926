//! The kernel ABI: one `#[repr(C)]` argument struct per field, mirrored by
//! `kernels-cuda/include/kvlayout.h` (`kvl_field_args`, `kvl_offset`).
//!
//! Kernels take this struct by value and address memory only through `kvl_offset`; they never
//! take positional stride integers or read a tensor shape.

use crate::error::{LayoutError, Result};
use crate::layout::KvCacheLayout;
use crate::spec::Field;

/// Kernel arguments of one field. All strides and offsets are 64-bit bytes.
///
/// Layout (144 bytes, 8-byte aligned, no implicit padding) is asserted against the C header by
/// the conformance suite.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvFieldArgs {
    /// Byte offset of element (0,0,0,0,0) from the buffer start.
    pub base_offset_bytes: i64,
    /// Bytes between layer slots.
    pub layer_stride_bytes: i64,
    /// Bytes between blocks.
    pub block_stride_bytes: i64,
    /// Bytes between head slots.
    pub head_stride_bytes: i64,
    /// Bytes between token/state slots.
    pub slot_stride_bytes: i64,
    /// Bytes between chunks `d / dim_split`.
    pub dim_chunk_stride_bytes: i64,
    /// Bytes between elements `d % dim_split`.
    pub dim_stride_bytes: i64,
    /// Layer slots.
    pub num_layers: i64,
    /// Blocks.
    pub num_blocks: i64,
    /// Head slots.
    pub num_heads: i64,
    /// Token/state slots per block.
    pub num_slots: i64,
    /// Elements per row of the field.
    pub width: i64,
    /// Split of the content index (`width` when not split).
    pub dim_split: i64,
    /// Tokens per block (scheduler view; slot mappings are in tokens).
    pub block_size: i64,
    /// Tokens per state slot (0 means one state per block, as Mamba).
    pub tokens_per_state: i64,
    /// Buffer index (0, or 1 for V when K and V are separate allocations).
    pub buffer: i32,
    /// `DType::abi_code`.
    pub dtype: i32,
    /// Element size in bytes.
    pub elem_bytes: i32,
    /// `field_code`.
    pub field: i32,
    /// Per-tensor scale (k_scale for K, v_scale for V, 1 otherwise).
    pub scale: f32,
    /// Zero; keeps the size a multiple of 8 without implicit padding.
    pub reserved: i32,
}

impl KvFieldArgs {
    /// Appends the struct's C image (144 bytes) to `out`: its members' little-endian bytes in
    /// order.
    pub fn write_le(&self, out: &mut Vec<u8>) {
        LeBytes(out)
            .i64s(&[
                self.base_offset_bytes,
                self.layer_stride_bytes,
                self.block_stride_bytes,
                self.head_stride_bytes,
                self.slot_stride_bytes,
                self.dim_chunk_stride_bytes,
                self.dim_stride_bytes,
                self.num_layers,
                self.num_blocks,
                self.num_heads,
                self.num_slots,
                self.width,
                self.dim_split,
                self.block_size,
                self.tokens_per_state,
            ])
            .i32s(&[self.buffer, self.dtype, self.elem_bytes, self.field])
            .f32s(&[self.scale])
            .i32s(&[self.reserved]);
    }
}

/// Appends little-endian bytes of a `#[repr(C)]` struct's members, in declaration order: the
/// C image of a struct without implicit padding ([`KvFieldArgs`] and the kernels' parameter
/// structs).
#[derive(Debug)]
pub struct LeBytes<'a>(pub &'a mut Vec<u8>);

impl LeBytes<'_> {
    /// Appends each `u64`.
    pub fn u64s(self, xs: &[u64]) -> Self {
        xs.iter().for_each(|x| self.0.extend(x.to_le_bytes()));
        self
    }
    /// Appends each `i64`.
    pub fn i64s(self, xs: &[i64]) -> Self {
        xs.iter().for_each(|x| self.0.extend(x.to_le_bytes()));
        self
    }
    /// Appends each `i32`.
    pub fn i32s(self, xs: &[i32]) -> Self {
        xs.iter().for_each(|x| self.0.extend(x.to_le_bytes()));
        self
    }
    /// Appends each `f32`.
    pub fn f32s(self, xs: &[f32]) -> Self {
        xs.iter().for_each(|x| self.0.extend(x.to_le_bytes()));
        self
    }
}

/// Stable numeric code of a field in the ABI (`KVL_FIELD_*`).
pub const fn field_code(f: Field) -> i32 {
    match f {
        Field::K => 0,
        Field::V => 1,
        Field::KScale => 2,
        Field::VScale => 3,
        Field::Latent => 4,
        Field::Bytes => 5,
        Field::Conv => 6,
        Field::Ssm => 7,
    }
}

impl KvFieldArgs {
    /// The one offset function, the same sum as `kvl_offset` in the C header, checked: a
    /// coordinate outside the domain (`kvl_in_domain`), a `dim_split` below 1, or a sum past
    /// `i64` (possible only for arguments built by hand, not by
    /// [`KvCacheLayout::kernel_args`]) is an error, never a panic or a wrapped offset.
    ///
    /// ```
    /// let l = kvlayout::preset("llama-3-8b")?;
    /// let k = l.kernel_args(kvlayout::Field::K)?;
    /// assert_eq!(k.offset(0, 0, 1, 0, 0)?, 512); // token-major rows of K|V, 2 x 128 bf16
    /// assert!(k.offset(0, 0, 8, 0, 0).is_err()); // 8 KV heads: head 8 is past the end
    /// assert!(kvlayout::KvFieldArgs { dim_split: 0, ..k }.offset(0, 0, 0, 0, 0).is_err());
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn offset(&self, layer: i64, block: i64, head: i64, slot: i64, dim: i64) -> Result<i64> {
        for (axis, value, limit) in [
            ("layer", layer, self.num_layers),
            ("block", block, self.num_blocks),
            ("head", head, self.num_heads),
            ("slot", slot, self.num_slots),
            ("dim", dim, self.width),
        ] {
            if value < 0 || value >= limit {
                return Err(LayoutError::InvalidQuery(format!(
                    "{axis} {value} is outside the kernel arguments' domain 0..{limit}"
                )));
            }
        }
        if self.dim_split < 1 {
            return Err(LayoutError::Invalid(format!(
                "kernel arguments with dim_split {} (at least 1)",
                self.dim_split
            )));
        }
        let overflow = || LayoutError::Overflow {
            what: "kernel argument offset".into(),
            limit: i64::MAX as u64,
        };
        [
            (layer, self.layer_stride_bytes),
            (block, self.block_stride_bytes),
            (head, self.head_stride_bytes),
            (slot, self.slot_stride_bytes),
            (dim / self.dim_split, self.dim_chunk_stride_bytes),
            (dim % self.dim_split, self.dim_stride_bytes),
        ]
        .iter()
        .try_fold(self.base_offset_bytes, |sum, &(i, stride)| {
            i.checked_mul(stride).and_then(|x| sum.checked_add(x))
        })
        .ok_or_else(overflow)
    }
}

fn i64_of(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| LayoutError::Overflow {
        what: "kernel argument".into(),
        limit: i64::MAX as u64,
    })
}

impl KvCacheLayout {
    /// Kernel arguments of a readable field.
    ///
    /// ```
    /// let l = kvlayout::preset("llama-3-8b")?;
    /// let k = l.kernel_args(kvlayout::Field::K)?;
    /// assert_eq!(k.slot_stride_bytes, 8 * 512); // token-major: 8 heads x rows of K|V, 2 x 128 bf16
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn kernel_args(&self, field: Field) -> Result<KvFieldArgs> {
        let m = self.field_map(field)?;
        let s = m.strides;
        let g = self.geometry();
        let scale = match field {
            Field::K | Field::Latent => self.scales().k_scale,
            Field::V => self.scales().v_scale,
            _ => 1.0,
        };
        // The stride of an axis of extent 1 addresses nothing, and may be any value (as a
        // framework's size-1 dimension may): one past i64 is given as 0.
        let [layer, block, head, slot, chunk, dim] = m.axes().map(|(ext, stride)| {
            if ext <= 1 && stride > i64::MAX as u64 {
                0
            } else {
                stride
            }
        });
        Ok(KvFieldArgs {
            base_offset_bytes: i64_of(s.base_offset)?,
            layer_stride_bytes: i64_of(layer)?,
            block_stride_bytes: i64_of(block)?,
            head_stride_bytes: i64_of(head)?,
            slot_stride_bytes: i64_of(slot)?,
            dim_chunk_stride_bytes: i64_of(chunk)?,
            dim_stride_bytes: i64_of(dim)?,
            num_layers: i64_of(m.num_layers)?,
            num_blocks: i64_of(m.num_blocks)?,
            num_heads: i64_of(m.num_heads)?,
            num_slots: i64_of(m.num_slots)?,
            width: i64_of(m.width)?,
            dim_split: i64_of(s.dim_split)?,
            block_size: i64_of(g.block_size)?,
            tokens_per_state: if self.content().is_per_block_state() {
                0
            } else {
                i64_of(g.tokens_per_state)?
            },
            buffer: i32::try_from(s.buffer).map_err(|_| LayoutError::Overflow {
                what: "buffer index".into(),
                limit: i32::MAX as u64,
            })?,
            dtype: m.dtype.abi_code(),
            elem_bytes: i32::from(m.elem_bytes() as u8),
            field: field_code(field),
            scale,
            reserved: 0,
        })
    }
}
