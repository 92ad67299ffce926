//! The decode's choices that depend on the layout or the device: how `kvl_paged_decode`
//! reads its key and value rows (16-byte vectors or elements per row, lanes per key row,
//! lanes over tokens for the legacy value layout), from the descriptor, the buffers' device
//! addresses and the target; and how many tokens a partition holds so that the grid fills
//! the device. The kernel branches on what this module chooses and reads no shape to
//! decide. Does not build the launch ([`super::paged_decode_launch`] does, with these in
//! hand).

use kvlayout::ops::OpError;
use kvlayout::{Field, FieldMap, KvCacheLayout};

use super::launch::{row_start_bits, GpuTarget, PARTITION_TOKENS};

/// Bytes of the wide loads: one 16-byte vector per lane.
pub const VEC_BYTES: u32 = 16;
/// Partitions are whole multiples of this many tokens when a sequence is split to fill the
/// device, and a sequence is split only when it has at least two of them.
pub const PARTITION_GRANULE: u64 = 64;
/// Decode blocks per multiprocessor the partitioning aims for: by the bandwidth model in
/// `kvlayout-emu`, enough bytes in flight to cover an H100's HBM latency, while the partials
/// the reduce reads (growing with the partitions) stay small: 8 per SM lowers the op's
/// expected fraction for a Llama-3-8B layer at 8 x 1024 on an H100 from 0.48 to 0.32.
pub const DECODE_BLOCKS_PER_SM: u64 = 4;

/// The decode's row paths, carried in `kvl_decode_params`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecodeRows {
    /// 16: key rows as 16-byte vectors; 0: element by element.
    pub k_vec_bytes: u32,
    /// 16: value rows as 16-byte vectors; 0: element by element (or by token).
    pub v_vec_bytes: u32,
    /// Lanes per key row on the 16-byte path (a power of two up to the warp width); the
    /// warp width on the element path.
    pub k_token_lanes: u32,
    /// Lanes over tokens for values whose tokens are contiguous for one element.
    pub v_token_major: bool,
}

/// 16 when rows of `field` in a buffer at device address `buffer_base` can be read as
/// 16-byte vectors: the row is one run of bytes ([`FieldMap::row_run`]) whose length, every
/// row start (strides of the axes that vary, the base offset) and the buffer's address are
/// multiples of 16; else 0 (element by element).
pub fn row_vec_bytes(field: &FieldMap, buffer_base: u64) -> u32 {
    let Some(run) = field.row_run() else {
        return 0;
    };
    let bits = run | row_start_bits(field) | buffer_base;
    if bits.is_multiple_of(u64::from(VEC_BYTES)) {
        VEC_BYTES
    } else {
        0
    }
}

/// Lanes that read one key row of `field` on the 16-byte path: its vectors rounded up to a
/// power of two, at most the warp width (a warp then reads `warp / lanes` rows at once).
pub fn key_token_lanes(field: &FieldMap, warp: u32) -> u32 {
    let vectors = (field.row_bytes() / u64::from(VEC_BYTES)).max(1);
    vectors.next_power_of_two().min(u64::from(warp)) as u32
}

/// Whether value tokens lie next to each other for one element (the slot axis has the
/// element's size as its stride and the row does not: the legacy `[blocks, heads, D, N]`
/// value), so the decode reads them with lanes over tokens.
pub fn value_token_major(field: &FieldMap) -> bool {
    let s = &field.strides;
    field.num_slots > 1 && field.width > 1 && s.slot == field.elem_bytes() && s.dim != s.slot
}

/// The row paths of a decode of `layout`, whose buffers lie at device addresses `bases`, on
/// `target`.
pub fn decode_rows(
    layout: &KvCacheLayout,
    bases: [u64; 2],
    target: &GpuTarget,
) -> Result<DecodeRows, OpError> {
    let map = |f: Field| layout.field_map(f).map_err(OpError::from);
    let (k, v) = (map(Field::K)?, map(Field::V)?);
    let base = |m: &FieldMap| bases.get(m.strides.buffer as usize).copied().unwrap_or(1);
    let k_vec_bytes = row_vec_bytes(&k, base(&k));
    let v_token_major = value_token_major(&v);
    Ok(DecodeRows {
        k_vec_bytes,
        v_vec_bytes: if v_token_major {
            0
        } else {
            row_vec_bytes(&v, base(&v))
        },
        k_token_lanes: if k_vec_bytes > 0 {
            key_token_lanes(&k, target.warp)
        } else {
            target.warp
        },
        v_token_major,
    })
}

/// Tokens per partition of sequences attending to at most `max_attended` tokens when
/// `blocks` decode blocks serve each partition index (sequences x KV heads x group tiles):
/// the longest attended length when one pass already gives the target
/// [`DECODE_BLOCKS_PER_SM`] blocks per multiprocessor or the sequences are shorter than two
/// [`PARTITION_GRANULE`]s; else whole granules, as many partitions as fill the target, at
/// most [`PARTITION_TOKENS`] tokens each.
pub fn decode_partition_tokens(target: &GpuTarget, blocks: u64, max_attended: u64) -> u64 {
    let want = (DECODE_BLOCKS_PER_SM * u64::from(target.sm_count)).div_ceil(blocks.max(1));
    let tokens = if want <= 1 || max_attended < 2 * PARTITION_GRANULE {
        max_attended
    } else {
        max_attended
            .div_ceil(want)
            .next_multiple_of(PARTITION_GRANULE)
    };
    tokens.clamp(1, PARTITION_TOKENS)
}
