//! What the CPU backend's integration tests share.

#![allow(dead_code)] // Each test binary uses a part.

use kvlayout_cpu::{Activations, Decode, DecodeParams};

/// A decode step of layer 0 over the f32 queries `query`.
pub fn decode_step<'a>(
    query: &'a [f32],
    block_table: &'a [i32],
    blocks_per_seq: usize,
    seq_lens: &'a [u32],
    params: DecodeParams,
) -> Decode<'a> {
    Decode {
        layer: 0,
        query: Activations::F32(query),
        block_table,
        blocks_per_seq,
        seq_lens,
        params,
    }
}
