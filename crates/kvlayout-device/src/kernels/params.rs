//! The parameter structs of the kernels, member for member `kernels-cuda/include/kvl_kernels.h`
//! (`kvl_write_params`, `kvl_decode_params`, `kvl_move_params`). Each kernel takes the
//! [`KvFieldArgs`](kvlayout::KvFieldArgs) of the fields it touches and one of these, by value.
//! None holds a stride or an extent of the cache: those are in the field arguments.

use kvlayout::LeBytes;

/// `kvl_write_params`: `kvl_write_kv(k, v, k_scale, v_scale, params)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteParams {
    /// `[tokens, heads, k.width]` activations.
    pub key: u64,
    /// `[tokens, heads, v.width]` activations, or 0 (MLA).
    pub value: u64,
    /// `[tokens]` `i64` slots; negative = padding.
    pub slot_mapping: u64,
    /// Cache buffer bases (a field's `buffer` indexes this).
    pub buffers: [u64; 2],
    /// Layer written.
    pub layer: i64,
    /// `KVL_DTYPE_*` of the activations.
    pub act_dtype: i32,
    /// 1 when rows carry inline scales.
    pub inline_scales: i32,
    /// 16 or 8: each lane stores that many bytes of a K row (one run, aligned:
    /// [`super::write_lane_bytes`]); 0: one element per lane.
    pub k_lane_bytes: i32,
    /// The same for V.
    pub v_lane_bytes: i32,
}

/// `kvl_decode_params`: `kvl_paged_decode(k, v, k_scale, v_scale, params)` and
/// `kvl_paged_decode_reduce(v, params)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DecodeKernelParams {
    /// `[seqs, q_heads, k.width]` activations.
    pub query: u64,
    /// `[seqs, blocks_per_seq]` `i32` block ids.
    pub block_table: u64,
    /// `[seqs]` `u32` lengths.
    pub seq_lens: u64,
    /// Cache buffer bases.
    pub buffers: [u64; 2],
    /// `[seqs, q_heads, v.width]` f32 output.
    pub out: u64,
    /// `[seqs, q_heads, partitions, 2 + v.width]` f32 scratch, or 0 for a single pass.
    pub partials: u64,
    /// Layer read.
    pub layer: i64,
    /// Row length of the block table.
    pub blocks_per_seq: i64,
    /// Query heads.
    pub q_heads: i64,
    /// Query heads per KV head.
    pub group: i64,
    /// Sliding window in tokens; negative: none.
    pub window: i64,
    /// Tokens per partition.
    pub partition_tokens: i64,
    /// Partitions per sequence (grid z).
    pub partitions: i32,
    /// `KVL_DTYPE_*` of the query.
    pub act_dtype: i32,
    /// 1 when rows carry inline scales.
    pub inline_scales: i32,
    /// Softmax scale.
    pub scale: f32,
    /// Logits soft-cap `c`: `l = c tanh(l / c)`.
    pub soft_cap: f32,
    /// 1: apply `soft_cap`.
    pub soft_capped: i32,
    /// Query heads per block, 1 to [`super::MAX_GROUP_TILE`].
    pub group_tile: i32,
    /// 16: key rows read as 16-byte vectors; 0: element by element
    /// ([`super::row_vec_bytes`]).
    pub k_vec_bytes: i32,
    /// The same for value rows.
    pub v_vec_bytes: i32,
    /// Lanes per key row on the 16-byte path: a power of two up to the warp width
    /// ([`super::key_token_lanes`]).
    pub k_token_lanes: i32,
    /// 1: value tokens are contiguous for one element (legacy `[blocks, heads, D, N]`), so
    /// lanes run over tokens ([`super::value_token_major`]).
    pub v_token_major: i32,
    /// Zero.
    pub reserved: i32,
}

/// `kvl_move_params`: `kvl_move_blocks(src, dst, params)`, one launch per stored field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MoveParams {
    /// Source cache buffer bases.
    pub src_buffers: [u64; 2],
    /// Destination cache buffer bases.
    pub dst_buffers: [u64; 2],
    /// `[n_pairs][2]` `i64` (source block, destination block).
    pub pairs: u64,
    /// Pairs.
    pub n_pairs: i64,
    /// First source head.
    pub head0: i64,
    /// Heads moved.
    pub heads: i64,
    /// Destination head of `head0`.
    pub dst_head0: i64,
    /// 0: element by element; else the unit rows are copied in ([`super::row_unit_bytes`]).
    pub row_unit_bytes: i32,
    /// Zero.
    pub reserved: i32,
}

impl WriteParams {
    /// Appends the struct's C image to `out`: its members' little-endian bytes in order.
    pub fn write_le(&self, out: &mut Vec<u8>) {
        LeBytes(out)
            .u64s(&[self.key, self.value, self.slot_mapping])
            .u64s(&self.buffers)
            .i64s(&[self.layer])
            .i32s(&[
                self.act_dtype,
                self.inline_scales,
                self.k_lane_bytes,
                self.v_lane_bytes,
            ]);
    }
}

impl DecodeKernelParams {
    /// Appends the struct's C image to `out`: its members' little-endian bytes in order.
    pub fn write_le(&self, out: &mut Vec<u8>) {
        LeBytes(out)
            .u64s(&[self.query, self.block_table, self.seq_lens])
            .u64s(&self.buffers)
            .u64s(&[self.out, self.partials])
            .i64s(&[
                self.layer,
                self.blocks_per_seq,
                self.q_heads,
                self.group,
                self.window,
                self.partition_tokens,
            ])
            .i32s(&[self.partitions, self.act_dtype, self.inline_scales])
            .f32s(&[self.scale, self.soft_cap])
            .i32s(&[
                self.soft_capped,
                self.group_tile,
                self.k_vec_bytes,
                self.v_vec_bytes,
                self.k_token_lanes,
                self.v_token_major,
                self.reserved,
            ]);
    }
}

impl MoveParams {
    /// Appends the struct's C image to `out`: its members' little-endian bytes in order.
    pub fn write_le(&self, out: &mut Vec<u8>) {
        LeBytes(out)
            .u64s(&self.src_buffers)
            .u64s(&self.dst_buffers)
            .u64s(&[self.pairs])
            .i64s(&[self.n_pairs, self.head0, self.heads, self.dst_head0])
            .i32s(&[self.row_unit_bytes, self.reserved]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn sizes_match_the_header_comments() {
        assert_eq!(size_of::<WriteParams>(), 64);
        assert_eq!(size_of::<DecodeKernelParams>(), 152);
        assert_eq!(size_of::<MoveParams>(), 80);
    }

    #[test]
    fn images_are_as_long_as_the_structs() {
        let image = |write: &dyn Fn(&mut Vec<u8>)| {
            let mut out = Vec::new();
            write(&mut out);
            out
        };
        let d = DecodeKernelParams::default();
        assert_eq!(image(&|o| WriteParams::default().write_le(o)).len(), 64);
        assert_eq!(image(&|o| d.write_le(o)).len(), 152);
        assert_eq!(image(&|o| MoveParams::default().write_le(o)).len(), 80);
    }
}
