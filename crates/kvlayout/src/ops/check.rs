//! Backend-agnostic validation of op arguments against a layout. Every check runs before
//! anything is written, and names the index, the value and the limit it broke.

use std::ops::Range;

use super::args::{DecodeArgs, DecodeShape, TensorDesc, WriteArgs, WriteShape};
use super::error::OpError;
use crate::error::LayoutError;
use crate::layout::KvCacheLayout;

/// Widths the decode reads: `(qk_width, v_width)`: K|V head sizes, or the MLA latent and its
/// first `kv_lora_rank` elements ([`crate::Content::kv_widths`]).
///
/// ```
/// use kvlayout::ops::{decode_widths, OpError};
/// let kv: kvlayout::KvCacheLayout = "kv B=3 N=16 H=4 D=192 Dv=128 dtype=f16 order=HND".parse()?;
/// assert_eq!(decode_widths(&kv)?, (192, 128));
/// let mla: kvlayout::KvCacheLayout = "mla L=1 B=3 N=16 rank=512 rope=64 dtype=bf16 order=LBNHC".parse()?;
/// assert_eq!(decode_widths(&mla)?, (576, 512));
/// let ssm: kvlayout::KvCacheLayout = "mamba2-2.7b".parse()?;
/// assert!(matches!(decode_widths(&ssm), Err(OpError::Unsupported { op: "paged_decode", .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn decode_widths(layout: &KvCacheLayout) -> Result<(u64, u64), OpError> {
    kv_widths(layout, "paged_decode")
}

/// The content's K and V widths, or `Unsupported` for `op` on content without them.
fn kv_widths(layout: &KvCacheLayout, op: &'static str) -> Result<(u64, u64), OpError> {
    let content = layout.content();
    content.kv_widths().ok_or_else(|| OpError::Unsupported {
        op,
        reason: format!("content {} holds no keys and values", content.spec_name()),
    })
}

/// Checks a slot mapping: every non-negative slot is `< num_blocks * block_size`, and no
/// slot is named twice (negative entries are padding and may repeat).
pub fn check_slot_mapping(layout: &KvCacheLayout, slots: &[i64]) -> Result<(), OpError> {
    let g = layout.geometry();
    let limit = g.num_blocks.saturating_mul(g.block_size);
    for (token, &slot) in slots.iter().enumerate() {
        if slot >= 0 && slot as u64 >= limit {
            return Err(OpError::SlotOutOfRange { token, slot, limit });
        }
    }
    let mut seen: Vec<(i64, usize)> = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| **s >= 0)
        .map(|(t, s)| (*s, t))
        .collect();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(OpError::DuplicateSlot {
            token: w[1].1,
            slot: w[1].0,
            first: w[0].1,
        });
    }
    Ok(())
}

/// The number of elements of a tensor of `shape`, or a `Shape` error naming `what` when the
/// product does not fit in `usize` (so no check compares against a wrapped count).
///
/// ```
/// use kvlayout::ops::shape_elements;
/// assert_eq!(shape_elements("query", &[3, 4, 8]).unwrap(), 96);
/// assert!(shape_elements("query", &[3, 1 << 61, 8]).is_err());
/// ```
pub fn shape_elements(what: &str, shape: &[usize]) -> Result<usize, OpError> {
    shape
        .iter()
        .try_fold(1usize, |n, &x| n.checked_mul(x))
        .ok_or_else(|| OpError::Shape {
            what: what.into(),
            expected: format!("{shape:?}: at most {} elements", usize::MAX),
            got: "a shape whose element count overflows".into(),
        })
}

/// Checks a block table `[num_seqs, blocks_per_seq]` (row-major) against sequence lengths:
/// each sequence fits its row, and every entry it uses names a block of the cache.
pub fn check_block_table(
    layout: &KvCacheLayout,
    table: &[i32],
    blocks_per_seq: usize,
    seq_lens: &[u32],
) -> Result<(), OpError> {
    let g = layout.geometry();
    if table.len() != shape_elements("block_table", &[seq_lens.len(), blocks_per_seq])? {
        return Err(OpError::Shape {
            what: "block_table".into(),
            expected: format!("{} x {blocks_per_seq} entries", seq_lens.len()),
            got: format!("{} entries", table.len()),
        });
    }
    for (seq, &len) in seq_lens.iter().enumerate() {
        let capacity = (blocks_per_seq as u64).saturating_mul(g.block_size);
        if u64::from(len) > capacity {
            return Err(OpError::SequenceTooLong {
                seq,
                len: len.into(),
                blocks: blocks_per_seq,
                capacity,
            });
        }
        let used = u64::from(len).div_ceil(g.block_size) as usize;
        for position in 0..used {
            let block = table[seq * blocks_per_seq + position];
            if block < 0 || block as u64 >= g.num_blocks {
                return Err(OpError::BlockOutOfRange {
                    seq,
                    position,
                    block: block.into(),
                    limit: g.num_blocks,
                });
            }
        }
    }
    Ok(())
}

/// Checks `src -> dst` block pairs between caches of `src_blocks` and `dst_blocks` blocks.
/// Destinations must be distinct, and when both sides are one cache no destination may also
/// be a source (so the result does not depend on the order of the copies).
pub fn check_block_pairs(
    pairs: &[(u64, u64)],
    src_blocks: u64,
    dst_blocks: u64,
    same_cache: bool,
) -> Result<(), OpError> {
    let mut dsts: Vec<u64> = pairs.iter().map(|p| p.1).collect();
    dsts.sort_unstable();
    for (index, &(src, dst)) in pairs.iter().enumerate() {
        let bad = |reason: String| OpError::BadPair {
            index,
            src,
            dst,
            reason,
        };
        if src >= src_blocks {
            return Err(bad(format!(
                "source block out of range (limit {src_blocks})"
            )));
        }
        if dst >= dst_blocks {
            return Err(bad(format!(
                "destination block out of range (limit {dst_blocks})"
            )));
        }
        if dsts.binary_search(&src).is_ok() && same_cache && src != dst {
            return Err(bad("source block is also a destination".into()));
        }
        if dsts.partition_point(|&d| d < dst) + 1 < dsts.partition_point(|&d| d <= dst) {
            return Err(bad("destination block appears twice".into()));
        }
    }
    Ok(())
}

/// Checks that two layouts hold the same logical content (so blocks can move between them):
/// same content, dtype, scales, layers, block size, tokens per state and heads (blocks may
/// differ in number).
pub fn check_same_content(a: &KvCacheLayout, b: &KvCacheLayout) -> Result<(), OpError> {
    check_same_model(a, b)?;
    let (ga, gb) = (a.geometry(), b.geometry());
    for (what, x, y) in [
        ("block_size", ga.block_size, gb.block_size),
        ("num_kv_heads", ga.num_kv_heads, gb.num_kv_heads),
    ] {
        if x != y {
            return Err(OpError::Incompatible(format!("{what} {x} vs {y}")));
        }
    }
    Ok(())
}

/// Whether two caches hold the same model's KV, whatever their block size, head slice and
/// placement: content, dtype, per-tensor scales, layers and tokens per state. The KV
/// connector pairs two such caches across TP and block sizes.
pub fn check_same_model(a: &KvCacheLayout, b: &KvCacheLayout) -> Result<(), OpError> {
    let (ga, gb) = (a.geometry(), b.geometry());
    let differ =
        |what: &str, x: String, y: String| Err(OpError::Incompatible(format!("{what} {x} vs {y}")));
    if a.content() != b.content() {
        return differ(
            "content",
            format!("{:?}", a.content()),
            format!("{:?}", b.content()),
        );
    }
    if a.dtype() != b.dtype() {
        return differ("dtype", a.dtype().to_string(), b.dtype().to_string());
    }
    if a.scales() != b.scales() {
        return differ(
            "per-tensor scales",
            format!("{:?}", a.scales()),
            format!("{:?}", b.scales()),
        );
    }
    for (what, x, y) in [
        ("num_layers", ga.num_layers, gb.num_layers),
        ("tokens_per_state", ga.tokens_per_state, gb.tokens_per_state),
    ] {
        if x != y {
            return differ(what, x.to_string(), y.to_string());
        }
    }
    Ok(())
}

/// Checks a head range of a layout.
pub fn check_heads(layout: &KvCacheLayout, heads: &Range<u64>) -> Result<(), OpError> {
    let h = layout.geometry().num_kv_heads;
    if heads.start >= heads.end || heads.end > h {
        return Err(OpError::Shape {
            what: "head range".into(),
            expected: format!("a non-empty range within 0..{h}"),
            got: format!("{}..{}", heads.start, heads.end),
        });
    }
    Ok(())
}

/// Checks that a tensor holds the elements of `shape` (named `what` in the error).
pub fn check_tensor_len(what: &str, t: &impl TensorDesc, shape: &[usize]) -> Result<(), OpError> {
    let n = shape_elements(what, shape)?;
    if t.len() != n {
        return Err(OpError::Shape {
            what: what.into(),
            expected: format!("{shape:?} = {n} elements"),
            got: format!("{} elements", t.len()),
        });
    }
    Ok(())
}

/// Checks a layer index.
pub fn check_layer(layout: &KvCacheLayout, layer: u64) -> Result<(), OpError> {
    let n = layout.geometry().num_layers;
    if layer >= n {
        return Err(LayoutError::OutOfRange {
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

/// Checks a `write_kv` call: the layer, the content (keys and values, one token per state),
/// the key and value tensors' shapes and dtypes, and the slot mapping.
pub fn check_write<T: TensorDesc>(
    layout: &KvCacheLayout,
    w: &WriteArgs<'_, T>,
) -> Result<WriteShape, OpError> {
    check_layer(layout, w.layer)?;
    no_compressed(layout, "write_kv")?;
    let tokens = w.slot_mapping.len();
    let heads = layout.geometry().num_kv_heads as usize;
    let (k, v) = kv_widths(layout, "write_kv")?;
    let (k, v) = (k as usize, v as usize);
    let shape = if layout.content().shares_latent() {
        check_tensor_len("latent", &w.key, &[tokens, 1, k])?;
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
    } else {
        check_tensor_len("key", &w.key, &[tokens, heads, k])?;
        let Some(value) = &w.value else {
            return Err(OpError::Shape {
                what: "value".into(),
                expected: format!("[{tokens}, {heads}, {v}]"),
                got: "none".into(),
            });
        };
        check_tensor_len("value", value, &[tokens, heads, v])?;
        if value.dtype() != w.key.dtype() {
            return Err(OpError::Shape {
                what: "key and value dtypes".into(),
                expected: "one dtype: K and V share one".into(),
                got: format!("key {}, value {}", w.key.dtype(), value.dtype()),
            });
        }
        WriteShape {
            heads,
            k_width: k,
            v_width: v,
            mla: false,
        }
    };
    check_slot_mapping(layout, w.slot_mapping)?;
    Ok(shape)
}

/// Checks a `paged_decode` call into an output of `out_len` elements: the layer, the content,
/// the query heads, the query and output shapes, the scale and soft-cap, and the block table.
pub fn check_decode<T: TensorDesc>(
    layout: &KvCacheLayout,
    d: &DecodeArgs<'_, T>,
    out_len: usize,
) -> Result<DecodeShape, OpError> {
    check_layer(layout, d.layer)?;
    no_compressed(layout, "paged_decode")?;
    let (qk, v) = decode_widths(layout)?;
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
    check_tensor_len("query", &d.query, &[seqs, q_heads, qk])?;
    if out_len != shape_elements("output", &[seqs, q_heads, v])? {
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
    check_block_table(layout, d.block_table, d.blocks_per_seq, d.seq_lens)?;
    Ok(DecodeShape {
        seqs,
        q_heads,
        group: q_heads / kv_heads,
        qk_width: qk,
        v_width: v,
    })
}

/// Largest element alignment a field of a buffer needs.
pub fn buffer_align(layout: &KvCacheLayout, buffer: usize) -> u64 {
    layout
        .stored_fields()
        .iter()
        .filter(|m| m.strides.buffer as usize == buffer)
        .map(|m| m.elem_bytes())
        .max()
        .unwrap_or(1)
}

/// A cache's buffers, as `(length, address)` pairs, against its layout: one per buffer of the
/// layout, each covering its extent and aligned for its elements. Every backend checks the
/// memory an op is handed with it.
pub fn check_buffers(layout: &KvCacheLayout, lens_addrs: &[(u64, u64)]) -> Result<(), OpError> {
    if lens_addrs.len() != layout.num_buffers() {
        return Err(OpError::Shape {
            what: "cache buffers".into(),
            expected: format!("{} buffers", layout.num_buffers()),
            got: format!("{}", lens_addrs.len()),
        });
    }
    for (i, (&(len, addr), extent)) in lens_addrs.iter().zip(layout.extents()).enumerate() {
        if len < extent.end {
            return Err(OpError::BufferTooShort {
                buffer: i,
                len,
                needed: extent.end,
            });
        }
        let align = buffer_align(layout, i);
        if addr % align != 0 {
            return Err(OpError::Misaligned {
                buffer: i,
                address: addr,
                align,
            });
        }
    }
    Ok(())
}
