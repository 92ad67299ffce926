//! Op arguments and their validation (shared by the reference and the fast paths). Every
//! check runs before anything is written.

use std::ops::Range;

use kvlayout::ops::{self, DecodeParams, OpError};
use kvlayout::{Content, KvCacheLayout};

use crate::tensor::Activations;

/// New tokens' K and V for one layer, scattered by slot (`block * block_size + offset`,
/// negative = padding, skipped).
#[derive(Debug, Clone, Copy)]
pub struct WriteKv<'a> {
    /// Layer slot to write.
    pub layer: u64,
    /// `[tokens, num_kv_heads, head_size]`; for MLA the latent `[tokens, 1, rank + rope]`.
    pub key: Activations<'a>,
    /// `[tokens, num_kv_heads, head_size_v]`; `None` for MLA.
    pub value: Option<Activations<'a>>,
    /// One slot per token.
    pub slot_mapping: &'a [i64],
}

/// One decode step: one query token per sequence.
#[derive(Debug, Clone, Copy)]
pub struct Decode<'a> {
    /// Layer slot to read.
    pub layer: u64,
    /// `[seqs, num_q_heads, qk_width]`.
    pub query: Activations<'a>,
    /// `[seqs, blocks_per_seq]` block ids, row-major.
    pub block_table: &'a [i32],
    /// Row length of the block table.
    pub blocks_per_seq: usize,
    /// Tokens in each sequence (the new token included).
    pub seq_lens: &'a [u32],
    /// Scale, window, soft-cap, query heads.
    pub params: DecodeParams,
}

/// Validated shape of a write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteShape {
    pub heads: usize,
    pub k_width: usize,
    pub v_width: usize,
    pub mla: bool,
}

fn check_layer(layout: &KvCacheLayout, layer: u64) -> Result<(), OpError> {
    let n = layout.geometry().num_layers;
    if layer >= n {
        return Err(kvlayout::LayoutError::OutOfRange {
            axis: "layer",
            value: layer,
            limit: n,
        }
        .into());
    }
    Ok(())
}

fn no_compressed(layout: &KvCacheLayout, op: &'static str) -> Result<(), OpError> {
    let tps = layout.geometry().tokens_per_state;
    if tps != 1 {
        return Err(OpError::Unsupported {
            op,
            reason: format!("tokens_per_state = {tps}: compressed states are produced by the model's compressor, not per token"),
        });
    }
    Ok(())
}

pub(crate) fn check_write(layout: &KvCacheLayout, w: &WriteKv<'_>) -> Result<WriteShape, OpError> {
    check_layer(layout, w.layer)?;
    no_compressed(layout, "write_kv")?;
    let tokens = w.slot_mapping.len();
    let heads = layout.geometry().num_kv_heads as usize;
    let shape = match *layout.content() {
        Content::Kv {
            head_size,
            head_size_v,
        }
        | Content::KvScaled {
            head_size,
            head_size_v,
        } => {
            let (k, v) = (head_size as usize, head_size_v as usize);
            w.key.expect_shape("key", &[tokens, heads, k])?;
            let Some(value) = w.value else {
                return Err(OpError::Shape {
                    what: "value".into(),
                    expected: format!("[{tokens}, {heads}, {v}]"),
                    got: "none".into(),
                });
            };
            value.expect_shape("value", &[tokens, heads, v])?;
            if value.dtype() != w.key.dtype() {
                return Err(OpError::Shape {
                    what: "value dtype".into(),
                    expected: w.key.dtype().to_string(),
                    got: value.dtype().to_string(),
                });
            }
            WriteShape {
                heads,
                k_width: k,
                v_width: v,
                mla: false,
            }
        }
        Content::Mla {
            kv_lora_rank,
            rope_dim,
        } => {
            let k = (kv_lora_rank + rope_dim) as usize;
            w.key.expect_shape("latent", &[tokens, 1, k])?;
            if w.value.is_some() {
                return Err(OpError::Shape {
                    what: "value".into(),
                    expected: "none (MLA stores one latent)".into(),
                    got: "a tensor".into(),
                });
            }
            WriteShape {
                heads: 1,
                k_width: k,
                v_width: 0,
                mla: true,
            }
        }
        _ => {
            return Err(OpError::Unsupported {
                op: "write_kv",
                reason: format!(
                    "content {} holds no keys and values",
                    layout.content().spec_name()
                ),
            })
        }
    };
    ops::check_slot_mapping(layout, w.slot_mapping)?;
    Ok(shape)
}

/// Validated shape of a decode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecodeShape {
    pub seqs: usize,
    pub q_heads: usize,
    pub group: usize,
    pub qk_width: usize,
    pub v_width: usize,
}

pub(crate) fn check_decode(
    layout: &KvCacheLayout,
    d: &Decode<'_>,
    out_len: usize,
) -> Result<DecodeShape, OpError> {
    check_layer(layout, d.layer)?;
    no_compressed(layout, "paged_decode")?;
    let (qk, v) = ops::decode_widths(layout)?;
    let (qk, v) = (qk as usize, v as usize);
    let kv_heads = layout.geometry().num_kv_heads as usize;
    let q_heads = usize::try_from(d.params.num_q_heads).unwrap_or(usize::MAX);
    if q_heads == 0 || !q_heads.is_multiple_of(kv_heads) {
        return Err(OpError::Shape {
            what: "num_q_heads".into(),
            expected: format!("a positive multiple of {kv_heads} KV heads"),
            got: d.params.num_q_heads.to_string(),
        });
    }
    let seqs = d.seq_lens.len();
    d.query.expect_shape("query", &[seqs, q_heads, qk])?;
    if out_len != ops::shape_elements("output", &[seqs, q_heads, v])? {
        return Err(OpError::Shape {
            what: "output".into(),
            expected: format!("[{seqs}, {q_heads}, {v}]"),
            got: format!("{out_len} elements"),
        });
    }
    if let Some(c) = d.params.soft_cap {
        if !(c.is_finite() && c > 0.0) {
            return Err(OpError::Shape {
                what: "soft_cap".into(),
                expected: "finite and positive".into(),
                got: c.to_string(),
            });
        }
    }
    if !d.params.scale.is_finite() {
        return Err(OpError::Shape {
            what: "scale".into(),
            expected: "finite".into(),
            got: d.params.scale.to_string(),
        });
    }
    ops::check_block_table(layout, d.block_table, d.blocks_per_seq, d.seq_lens)?;
    Ok(DecodeShape {
        seqs,
        q_heads,
        group: q_heads / kv_heads,
        qk_width: qk,
        v_width: v,
    })
}

/// Staging geometry check for gather/scatter: same content, `heads.len()` heads, at least
/// `blocks` blocks.
pub(crate) fn check_staging(
    cache: &KvCacheLayout,
    staging: &KvCacheLayout,
    blocks: &[u64],
    heads: &Range<u64>,
) -> Result<(), OpError> {
    ops::check_heads(cache, heads)?;
    let n = heads.end - heads.start;
    if staging.geometry().num_kv_heads != n {
        return Err(OpError::Incompatible(format!(
            "staging has {} heads, the range {}..{} has {n}",
            staging.geometry().num_kv_heads,
            heads.start,
            heads.end
        )));
    }
    let g = cache.geometry();
    if staging.content() != cache.content()
        || staging.dtype() != cache.dtype()
        || staging.scales() != cache.scales()
    {
        return Err(OpError::Incompatible(
            "staging stores different content, dtype or scales".into(),
        ));
    }
    let sg = staging.geometry();
    if (sg.num_layers, sg.block_size, sg.tokens_per_state)
        != (g.num_layers, g.block_size, g.tokens_per_state)
    {
        return Err(OpError::Incompatible(format!(
            "staging geometry {sg:?} vs cache {g:?}"
        )));
    }
    if (sg.num_blocks as usize) < blocks.len() {
        return Err(OpError::Incompatible(format!(
            "staging holds {} blocks, {} requested",
            sg.num_blocks,
            blocks.len()
        )));
    }
    let pairs: Vec<(u64, u64)> = blocks
        .iter()
        .enumerate()
        .map(|(i, &b)| (b, i as u64))
        .collect();
    ops::check_block_pairs(&pairs, cache.geometry().num_blocks, sg.num_blocks, false)?;
    Ok(())
}

/// What a block mover does once its arguments are validated: copy heads `heads` of each
/// `pairs.0` block of the source into heads from `dst_head0` of block `pairs.1` of the
/// destination, all layers, slots and content.
#[derive(Debug, Clone)]
pub(crate) struct Moves {
    pub pairs: Vec<(u64, u64)>,
    pub heads: Range<u64>,
    pub dst_head0: u64,
}

fn all_heads(layout: &KvCacheLayout, pairs: Vec<(u64, u64)>) -> Moves {
    Moves {
        pairs,
        heads: 0..layout.geometry().num_kv_heads,
        dst_head0: 0,
    }
}

/// `copy_blocks` inside one cache (self-pairs dropped: they are no-ops).
pub(crate) fn copy_moves(layout: &KvCacheLayout, pairs: &[(u64, u64)]) -> Result<Moves, OpError> {
    let nb = layout.geometry().num_blocks;
    ops::check_block_pairs(pairs, nb, nb, true)?;
    Ok(all_heads(
        layout,
        pairs.iter().copied().filter(|p| p.0 != p.1).collect(),
    ))
}

/// `swap_blocks` between two pools of the same content.
pub(crate) fn swap_moves(
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
    pairs: &[(u64, u64)],
) -> Result<Moves, OpError> {
    ops::check_same_content(src, dst)?;
    ops::check_block_pairs(
        pairs,
        src.geometry().num_blocks,
        dst.geometry().num_blocks,
        false,
    )?;
    Ok(all_heads(src, pairs.to_vec()))
}

/// `gather_blocks`: cache block `blocks[i]`, heads `heads` -> staging block `i`.
pub(crate) fn gather_moves(
    cache: &KvCacheLayout,
    staging: &KvCacheLayout,
    blocks: &[u64],
    heads: Range<u64>,
) -> Result<Moves, OpError> {
    check_staging(cache, staging, blocks, &heads)?;
    let pairs = blocks
        .iter()
        .enumerate()
        .map(|(i, &b)| (b, i as u64))
        .collect();
    Ok(Moves {
        pairs,
        heads,
        dst_head0: 0,
    })
}

/// `scatter_blocks`: staging block `i` -> cache block `blocks[i]`, heads `heads`.
pub(crate) fn scatter_moves(
    staging: &KvCacheLayout,
    cache: &KvCacheLayout,
    blocks: &[u64],
    heads: Range<u64>,
) -> Result<Moves, OpError> {
    check_staging(cache, staging, blocks, &heads)?;
    let pairs: Vec<(u64, u64)> = blocks
        .iter()
        .enumerate()
        .map(|(i, &b)| (i as u64, b))
        .collect();
    ops::check_block_pairs(
        &pairs,
        staging.geometry().num_blocks,
        cache.geometry().num_blocks,
        false,
    )?;
    Ok(Moves {
        pairs,
        heads: 0..heads.end - heads.start,
        dst_head0: heads.start,
    })
}

/// `convert`: every block to the same block of a cache in another layout.
pub(crate) fn convert_moves(src: &KvCacheLayout, dst: &KvCacheLayout) -> Result<Moves, OpError> {
    ops::check_same_content(src, dst)?;
    let (a, b) = (src.geometry().num_blocks, dst.geometry().num_blocks);
    if a != b {
        return Err(OpError::Incompatible(format!("num_blocks {a} vs {b}")));
    }
    Ok(all_heads(src, (0..a).map(|i| (i, i)).collect()))
}
