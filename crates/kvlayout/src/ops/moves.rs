//! The block movers (`copy_blocks`, `swap_blocks`, `gather_blocks`, `scatter_blocks`,
//! `convert`) as one vocabulary: a [`BlockMove`] names what is asked, [`BlockMove::plan`]
//! validates it into [`Moves`], and [`MovePlan`] is the two-sided plan every backend executes
//! them by: copies of the largest units contiguous on both sides.
//!
//! ```
//! use kvlayout::ops::{BlockMove, MovePlan};
//! use kvlayout::KvCacheLayout;
//! let nhd: KvCacheLayout = "kv B=4 N=16 H=8 D=128 dtype=f16 order=NHD".parse()?;
//! let hnd: KvCacheLayout = "kv B=4 N=16 H=8 D=128 dtype=f16 order=HND".parse()?;
//! let m = BlockMove::Convert.plan(Some(&nhd), &hnd)?;
//! let plan = m.plan(&nhd, &hnd).expect("both layouts are affine in the plan's terms");
//! // Both layouts store a head's K and V rows of a token as one 512-byte run: one piece of
//! // such units, over slots and heads (the only layer folds away).
//! assert_eq!(plan.pieces.len(), 1);
//! assert_eq!(plan.pieces[0].unit, 512);
//! assert_eq!(plan.pieces[0].dims.len(), 2);
//! assert_eq!(plan.bytes_per_pair(), 16 * 8 * 512);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ops::Range;

use super::check::{check_block_pairs, check_heads, check_same_content};
use super::error::OpError;
use crate::field_map::FieldMap;
use crate::layout::KvCacheLayout;
use crate::regions::{fold_contiguous, fused_row};

/// A block mover as a caller asks for it, before validation: the one vocabulary of moves
/// every backend executes ([`BlockMove::plan`] validates it against the layouts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockMove<'a> {
    /// `copy_blocks`: `(source, destination)` block pairs within one cache, all layers.
    Copy(&'a [(u64, u64)]),
    /// `swap_blocks`: `(source, destination)` block pairs from one cache to another of the
    /// same content (the layouts may differ).
    Swap(&'a [(u64, u64)]),
    /// `gather_blocks`: cache block `blocks[i]`, heads `heads` -> staging block `i`.
    Gather {
        /// Cache blocks, in staging order.
        blocks: &'a [u64],
        /// Cache heads; the staging cache has this many.
        heads: Range<u64>,
    },
    /// `scatter_blocks`, the inverse of `Gather`: staging block `i` -> cache block
    /// `blocks[i]`, heads `heads`.
    Scatter {
        /// Cache blocks, in staging order.
        blocks: &'a [u64],
        /// Cache heads written.
        heads: Range<u64>,
    },
    /// `convert`: every block to the same block of a cache in another layout.
    Convert,
}

impl BlockMove<'_> {
    /// The op's name in reports (`copy_blocks`, ..., `convert`).
    pub fn name(&self) -> &'static str {
        match self {
            BlockMove::Copy(_) => "copy_blocks",
            BlockMove::Swap(_) => "swap_blocks",
            BlockMove::Gather { .. } => "gather_blocks",
            BlockMove::Scatter { .. } => "scatter_blocks",
            BlockMove::Convert => "convert",
        }
    }

    /// Validates the move from `src` to `dst` and gives what to execute. `src` is `None` for a
    /// move within `dst` (`Copy`, which takes no other cache) and the source cache's layout
    /// for every other move (for `Gather` the cache, for `Scatter` the staging cache). Any
    /// other pairing is refused, as is every argument the layouts do not admit (block ids past
    /// either cache, a destination named twice, heads outside the cache, a staging cache of
    /// the wrong shape, different content).
    ///
    /// ```
    /// use kvlayout::ops::BlockMove;
    /// let l: kvlayout::KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND".parse()?;
    /// let m = BlockMove::Copy(&[(0, 2), (1, 1)]).plan(None, &l)?;
    /// assert_eq!(m.pairs, [(0, 2)]); // the self-pair is a no-op
    /// assert!(BlockMove::Copy(&[(0, 3)]).plan(None, &l).is_err()); // block 3 of 3
    /// assert!(BlockMove::Convert.plan(None, &l).is_err()); // convert needs a source
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn plan(&self, src: Option<&KvCacheLayout>, dst: &KvCacheLayout) -> Result<Moves, OpError> {
        match (self, src) {
            (BlockMove::Copy(pairs), None) => copy_moves(dst, pairs),
            (BlockMove::Copy(_), Some(_)) => Err(OpError::Incompatible(
                "copy_blocks moves blocks within one cache: it takes no source cache".into(),
            )),
            (BlockMove::Swap(pairs), Some(src)) => swap_moves(src, dst, pairs),
            (BlockMove::Gather { blocks, heads }, Some(cache)) => {
                gather_moves(cache, dst, blocks, heads.clone())
            }
            (BlockMove::Scatter { blocks, heads }, Some(staging)) => {
                scatter_moves(staging, dst, blocks, heads.clone())
            }
            (BlockMove::Convert, Some(src)) => convert_moves(src, dst),
            (_, None) => Err(OpError::Incompatible(format!(
                "{} moves blocks between two caches: it needs a source cache",
                self.name()
            ))),
        }
    }
}

/// What a block mover does once its arguments are validated: copy heads `heads` of each
/// `pairs.0` block of the source into heads from `dst_head0` of block `pairs.1` of the
/// destination, all layers, slots and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moves {
    /// `(source block, destination block)`; destinations are distinct and never a source of
    /// the same cache.
    pub pairs: Vec<(u64, u64)>,
    /// Source heads.
    pub heads: Range<u64>,
    /// Destination head of `heads.start`.
    pub dst_head0: u64,
}

impl Moves {
    /// The plan of these moves from `src` to `dst`, the layouts they were validated for
    /// ([`MovePlan::new`]).
    pub fn plan(&self, src: &KvCacheLayout, dst: &KvCacheLayout) -> Option<MovePlan> {
        MovePlan::new(src, dst, &self.heads, self.dst_head0)
    }
}

fn all_heads(layout: &KvCacheLayout, pairs: Vec<(u64, u64)>) -> Moves {
    Moves {
        pairs,
        heads: 0..layout.geometry().num_kv_heads,
        dst_head0: 0,
    }
}

/// Staging geometry check for gather/scatter: a valid head range of the cache, `heads.len()`
/// staging heads, the same content, dtype and scales, layers, block size and tokens per
/// state, at least `blocks.len()` staging blocks, and valid, distinct cache blocks.
pub fn check_staging(
    cache: &KvCacheLayout,
    staging: &KvCacheLayout,
    blocks: &[u64],
    heads: &Range<u64>,
) -> Result<(), OpError> {
    check_heads(cache, heads)?;
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
    check_block_pairs(&pairs, g.num_blocks, sg.num_blocks, false)?;
    Ok(())
}

/// `copy_blocks` inside one cache (self-pairs dropped: they are no-ops).
fn copy_moves(layout: &KvCacheLayout, pairs: &[(u64, u64)]) -> Result<Moves, OpError> {
    let nb = layout.geometry().num_blocks;
    check_block_pairs(pairs, nb, nb, true)?;
    Ok(all_heads(
        layout,
        pairs.iter().copied().filter(|p| p.0 != p.1).collect(),
    ))
}

/// `swap_blocks` between two pools of the same content.
fn swap_moves(
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
    pairs: &[(u64, u64)],
) -> Result<Moves, OpError> {
    check_same_content(src, dst)?;
    check_block_pairs(
        pairs,
        src.geometry().num_blocks,
        dst.geometry().num_blocks,
        false,
    )?;
    Ok(all_heads(src, pairs.to_vec()))
}

/// `gather_blocks`: cache block `blocks[i]`, heads `heads` -> staging block `i`.
fn gather_moves(
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
fn scatter_moves(
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
    check_block_pairs(
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
fn convert_moves(src: &KvCacheLayout, dst: &KvCacheLayout) -> Result<Moves, OpError> {
    check_same_content(src, dst)?;
    let (a, b) = (src.geometry().num_blocks, dst.geometry().num_blocks);
    if a != b {
        return Err(OpError::Incompatible(format!("num_blocks {a} vs {b}")));
    }
    Ok(all_heads(src, (0..a).map(|i| (i, i)).collect()))
}

/// Most dims of a [`MovePiece`]: the element split and its chunks, then slot, head, layer.
pub const MAX_MOVE_DIMS: usize = 5;

/// One dimension of a [`MovePiece`]: `extent` points, `src_stride` bytes apart in the source
/// and `dst_stride` bytes apart in the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MoveDim {
    /// Points along the dimension.
    pub extent: u64,
    /// Bytes between points in the source.
    pub src_stride: u64,
    /// Bytes between points in the destination.
    pub dst_stride: u64,
}

/// One group of fields to move for each block pair `(sb, db)`: `unit` bytes, contiguous on
/// both sides, at every point `i` of `dims`, from
/// `src_base + sb * src_block + sum(i_k * src_stride_k)` of source buffer `src_buffer` to
/// `dst_base + db * dst_block + sum(i_k * dst_stride_k)` of destination buffer `dst_buffer`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MovePiece {
    /// Source buffer index.
    pub src_buffer: u32,
    /// Destination buffer index.
    pub dst_buffer: u32,
    /// Source offset of block 0's first unit.
    pub src_base: u64,
    /// Destination offset of block 0's first unit.
    pub dst_base: u64,
    /// Source bytes between blocks.
    pub src_block: u64,
    /// Destination bytes between blocks.
    pub dst_block: u64,
    /// Bytes of one unit.
    pub unit: u64,
    /// The dims left after merging those contiguous on both sides into the unit, innermost
    /// (smallest destination stride) first; at most [`MAX_MOVE_DIMS`], none of extent 1.
    pub dims: Vec<MoveDim>,
}

impl MovePiece {
    /// Units per block pair (the product of the extents).
    pub fn units(&self) -> u64 {
        self.dims.iter().map(|d| d.extent).product()
    }

    /// `(source offset, destination offset)` of the unit at point `idx` of `dims` (one index
    /// per dim) for block pair `(sb, db)`.
    pub fn offsets(&self, (sb, db): (u64, u64), idx: &[u64]) -> (u64, u64) {
        let mut at = (
            self.src_base + sb * self.src_block,
            self.dst_base + db * self.dst_block,
        );
        for (i, d) in idx.iter().zip(&self.dims) {
            at.0 += i * d.src_stride;
            at.1 += i * d.dst_stride;
        }
        at
    }
}

/// How to move heads `heads` of a block of one layout to heads from `dst_head0` of a block of
/// another layout of the same content (all layers, slots and content): a list of
/// [`MovePiece`]s, one per field, or one for all fields when both layouts fuse their rows
/// into one run in the same arrangement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MovePlan {
    /// The pieces; together they cover every moved element's bytes exactly once on each side.
    pub pieces: Vec<MovePiece>,
}

impl MovePlan {
    /// The plan for moves the caller has validated (`heads` within the source's heads, the
    /// shifted range within the destination's, the same content on both sides: see
    /// [`Moves`] and its constructors). `None` when a field's content map is not affine in
    /// one split of its index on both sides (two different splits into chunks, as the legacy
    /// key with two element sizes); a mover then copies element by element. Also `None`
    /// (never a panic) for heads outside either layout, which validated moves never name.
    pub fn new(
        src: &KvCacheLayout,
        dst: &KvCacheLayout,
        heads: &Range<u64>,
        dst_head0: u64,
    ) -> Option<Self> {
        let n = heads.end.checked_sub(heads.start)?;
        let dst_end = dst_head0.checked_add(n)?;
        if heads.end > src.geometry().num_kv_heads || dst_end > dst.geometry().num_kv_heads {
            return None;
        }
        let at = Start {
            src_head: heads.start,
            dst_head: dst_head0,
            heads: n,
        };
        let (sf, df) = (src.stored_fields(), dst.stored_fields());
        let pieces = match (fused_row(sf), fused_row(df)) {
            (Some(a), Some(b)) if a.len == b.len && a.fields == b.fields => {
                vec![at.piece(&sf[0], &df[0], (a.start, b.start), a.len, Vec::new())]
            }
            _ => sf
                .iter()
                .map(|a| {
                    let b = df.iter().find(|b| b.field == a.field)?;
                    field_piece(a, b, &at)
                })
                .collect::<Option<Vec<_>>>()?,
        };
        Some(MovePlan { pieces })
    }

    /// Bytes moved per block pair.
    pub fn bytes_per_pair(&self) -> u64 {
        self.pieces.iter().map(|p| p.unit * p.units()).sum()
    }
}

/// Where the moved heads start on each side, and how many there are.
struct Start {
    src_head: u64,
    dst_head: u64,
    heads: u64,
}

impl Start {
    /// The piece moving `unit` bytes from row start `row.0` of `a` (the source) to row start
    /// `row.1` of `b`, at every point of `inner` dims and of the outer slot, head and layer
    /// dims, folded where contiguous on both sides.
    fn piece(
        &self,
        a: &FieldMap,
        b: &FieldMap,
        row: (u64, u64),
        unit: u64,
        inner: Vec<(u64, [u64; 2])>,
    ) -> MovePiece {
        let ([al, ab, ah, an, ..], [bl, bb, bh, bn, ..]) = (a.axes(), b.axes());
        let mut dims = inner;
        dims.push((a.num_slots, [an.1, bn.1]));
        dims.push((self.heads, [ah.1, bh.1]));
        dims.push((a.num_layers, [al.1, bl.1]));
        let unit = fold_contiguous(unit, &mut dims);
        debug_assert!(dims.len() <= MAX_MOVE_DIMS);
        MovePiece {
            src_buffer: a.strides.buffer,
            dst_buffer: b.strides.buffer,
            src_base: row.0 + a.head_offset(self.src_head),
            dst_base: row.1 + b.head_offset(self.dst_head),
            src_block: ab.1,
            dst_block: bb.1,
            unit,
            dims: dims
                .into_iter()
                .map(|(extent, [src_stride, dst_stride])| MoveDim {
                    extent,
                    src_stride,
                    dst_stride,
                })
                .collect(),
        }
    }
}

/// The piece of one field: whole rows when both are contiguous, else element by element with
/// `d = c * x + i`, `x` the finer split, when each side is affine in `(c, i)`.
fn field_piece(a: &FieldMap, b: &FieldMap, at: &Start) -> Option<MovePiece> {
    let row = (a.slot_offset(0, 0, 0), b.slot_offset(0, 0, 0));
    if let (Some(unit), Some(_)) = (a.row_run(), b.row_run()) {
        return Some(at.piece(a, b, row, unit, Vec::new()));
    }
    let x = a.axes()[5].0.min(b.axes()[5].0);
    let ((ca, ea), (cb, eb)) = (a.split_strides(x)?, b.split_strides(x)?);
    let inner = vec![(x, [ea, eb]), (a.width / x, [ca, cb])];
    Some(at.piece(a, b, row, a.elem_bytes(), inner))
}
