//! Byte regions: what a transfer must move for a block, a head range, or a layer range,
//! merged where contiguous, and the registered span of each buffer.

use std::ops::Range;

use serde::Serialize;

use crate::error::{LayoutError, Result, MAX_OFFSET};
use crate::field_map::FieldMap;
use crate::layout::KvCacheLayout;
use crate::spec::Field;

/// A byte range `[offset, offset + len)` of one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ByteRange {
    /// Buffer index.
    pub buffer: u32,
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Selected sub-ranges of the four outer axes.
#[derive(Debug, Clone)]
struct Selection {
    layers: Range<u64>,
    blocks: Range<u64>,
    heads: Range<u64>,
}

/// Row-level pieces to enumerate: a base, a contiguous run length, and outer axes
/// `(start, count, stride)`.
struct Piece {
    buffer: u32,
    base: u64,
    run: u64,
    axes: Vec<(u64, u64, u64)>,
}

/// Rows of several fields fused into one run: every field of one buffer, with the same outer
/// strides (layer, block, head, slot), each row one contiguous run, the runs abutting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FusedRow {
    /// Offset of the run for `(layer 0, block 0, head 0, slot 0)`.
    pub start: u64,
    /// Bytes of the run.
    pub len: u64,
    /// Per field, in the order given: `(field, offset in the run, bytes)`.
    pub fields: Vec<(Field, u64, u64)>,
}

/// The fused row of `fields`, if their rows fuse (see [`FusedRow`]); `None` for no field.
/// Shared by the region queries and the move planner ([`crate::ops::MovePlan`]).
pub(crate) fn fused_row(fields: &[FieldMap]) -> Option<FusedRow> {
    let outer = |m: &FieldMap| {
        let [l, b, h, n, _, _] = m.axes();
        (m.strides.buffer, l.1, b.1, h.1, n.1)
    };
    if !fields.windows(2).all(|w| outer(&w[0]) == outer(&w[1])) {
        return None;
    }
    let runs = fields
        .iter()
        .map(|m| Some((m.slot_offset(0, 0, 0), m.row_run()?)))
        .collect::<Option<Vec<(u64, u64)>>>()?;
    let mut sorted = runs.clone();
    sorted.sort_unstable();
    let start = sorted.first()?.0;
    if !sorted.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0) {
        return None;
    }
    Some(FusedRow {
        start,
        len: sorted.iter().map(|r| r.1).sum(),
        fields: fields
            .iter()
            .zip(runs)
            .map(|(m, (at, len))| (m.field, at - start, len))
            .collect(),
    })
}

/// Folds into `unit` the dims contiguous on every side: after dropping dims of extent 1 and
/// sorting the rest by stride (the last side's first, then the others'), each leading dim
/// whose strides all equal the unit multiplies the unit by its extent. Returns the unit;
/// `dims` (`(extent, stride on each side)`) keeps the dims left, innermost first.
/// Shared by the region queries (one side) and the move planner (source and destination).
pub(crate) fn fold_contiguous<const N: usize>(
    mut unit: u64,
    dims: &mut Vec<(u64, [u64; N])>,
) -> u64 {
    dims.retain(|d| d.0 != 1);
    dims.sort_by_key(|d| {
        let mut k = d.1;
        k.reverse();
        k
    });
    let folded = dims
        .iter()
        .take_while(|&&(ext, strides)| {
            let fold = strides.iter().all(|&s| s == unit);
            if fold {
                unit *= ext;
            }
            fold
        })
        .count();
    dims.drain(..folded);
    unit
}

/// Splits fields into pieces; fields of one buffer that share outer strides and whose rows
/// abut are fused into one piece per row.
fn pieces(fields: &[FieldMap], sel: &Selection, slots: u64) -> Vec<Piece> {
    let outer = |m: &FieldMap| {
        let [l, b, h, n, _, _] = m.axes();
        vec![
            (sel.layers.start, sel.layers.end - sel.layers.start, l.1),
            (sel.blocks.start, sel.blocks.end - sel.blocks.start, b.1),
            (sel.heads.start, sel.heads.end - sel.heads.start, h.1),
            (0, slots, n.1),
        ]
    };
    if let Some(row) = fused_row(fields) {
        return vec![Piece {
            buffer: fields[0].strides.buffer,
            base: row.start,
            run: row.len,
            axes: outer(&fields[0]),
        }];
    }
    fields
        .iter()
        .map(|m| {
            let mut axes = outer(m);
            let run = match m.row_run() {
                Some(r) => r,
                None => {
                    let [.., (chunks, chunk), (split, dim)] = m.axes();
                    axes.push((0, chunks, chunk));
                    axes.push((0, split, dim));
                    m.elem_bytes()
                }
            };
            Piece {
                buffer: m.strides.buffer,
                base: m.slot_offset(0, 0, 0),
                run,
                axes,
            }
        })
        .collect()
}

/// Most byte ranges a region query may enumerate before merging (24 bytes each: 400 MB).
pub const MAX_REGIONS: u64 = 1 << 24;

/// A piece with its contiguous axes folded into the run: its buffer, where the first run
/// starts, how long each run is, and the `(count, stride)` axes left, innermost stride first.
struct Folded {
    buffer: u32,
    base: u64,
    run: u64,
    axes: Vec<(u64, u64)>,
}

impl Folded {
    /// `None` when an axis of the piece selects nothing.
    fn of(p: &Piece) -> Option<Self> {
        let mut base = p.base;
        let mut axes: Vec<(u64, [u64; 1])> = Vec::new();
        for &(start, count, stride) in &p.axes {
            if count == 0 {
                return None;
            }
            base += start * stride;
            axes.push((count, [stride]));
        }
        let run = fold_contiguous(p.run, &mut axes);
        let axes = axes
            .into_iter()
            .map(|(count, [stride])| (count, stride))
            .collect();
        Some(Folded {
            buffer: p.buffer,
            base,
            run,
            axes,
        })
    }

    /// How many runs there are (`None`: more than `u64` holds).
    fn count(&self) -> Option<u64> {
        self.axes.iter().try_fold(1u64, |n, a| n.checked_mul(a.0))
    }

    /// Appends the runs to `out` (their [`Folded::count`], which the caller has bounded).
    fn runs(&self, out: &mut Vec<ByteRange>) {
        let total: u64 = self.axes.iter().map(|a| a.0).product();
        out.reserve(total as usize);
        let mut idx = vec![0u64; self.axes.len()];
        for _ in 0..total {
            let off = self.base
                + idx
                    .iter()
                    .zip(&self.axes)
                    .map(|(i, a)| i * a.1)
                    .sum::<u64>();
            out.push(ByteRange {
                buffer: self.buffer,
                offset: off,
                len: self.run,
            });
            for (i, a) in idx.iter_mut().zip(&self.axes) {
                *i += 1;
                if *i < a.0 {
                    break;
                }
                *i = 0;
            }
        }
    }
}

/// Sorts and merges touching ranges of the same buffer. A range whose end lies past
/// [`MAX_OFFSET`](crate::MAX_OFFSET) is refused (`Overflow`), so no end is computed wrapped.
///
/// ```
/// use kvlayout::{merge_ranges, ByteRange};
/// let r = |offset, len| ByteRange { buffer: 0, offset, len };
/// assert_eq!(merge_ranges(vec![r(8, 8), r(0, 8), r(32, 4)])?, vec![r(0, 16), r(32, 4)]);
/// assert!(merge_ranges(vec![r(u64::MAX - 1, 4)]).is_err());
/// # Ok::<(), kvlayout::LayoutError>(())
/// ```
pub fn merge_ranges(mut ranges: Vec<ByteRange>) -> Result<Vec<ByteRange>> {
    let end = |r: &ByteRange| {
        r.offset
            .checked_add(r.len)
            .filter(|&e| e <= MAX_OFFSET)
            .ok_or(LayoutError::Overflow {
                what: format!(
                    "end of byte range {} + {} of buffer {}",
                    r.offset, r.len, r.buffer
                ),
                limit: MAX_OFFSET,
            })
    };
    ranges.sort_unstable();
    let mut out: Vec<ByteRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        let r_end = end(&r)?;
        match out.last_mut() {
            // Sorted, so `r.offset >= last.offset`, and both ends were checked.
            Some(last) if last.buffer == r.buffer && last.offset + last.len >= r.offset => {
                last.len = (last.offset + last.len).max(r_end) - last.offset;
            }
            _ => out.push(r),
        }
    }
    Ok(out)
}

fn check_range(axis: &'static str, r: &Range<u64>, limit: u64) -> Result<()> {
    if r.start >= r.end {
        return Err(LayoutError::InvalidQuery(format!(
            "empty {axis} range {}..{}",
            r.start, r.end
        )));
    }
    if r.end > limit {
        return Err(LayoutError::OutOfRange {
            axis,
            value: r.end - 1,
            limit,
        });
    }
    Ok(())
}

impl KvCacheLayout {
    fn regions(&self, sel: Selection) -> Result<Vec<ByteRange>> {
        let g = self.geometry();
        check_range("layer", &sel.layers, g.num_layers)?;
        check_range("block", &sel.blocks, g.num_blocks)?;
        check_range("head", &sel.heads, g.num_kv_heads)?;
        let folded: Vec<Folded> = pieces(self.stored_fields(), &sel, self.num_slots())
            .iter()
            .filter_map(Folded::of)
            .collect();
        // Counted before anything is enumerated: a huge selection is refused, not allocated.
        let count = folded
            .iter()
            .try_fold(0u64, |n, f| f.count().and_then(|c| n.checked_add(c)));
        match count {
            Some(n) if n <= MAX_REGIONS => {}
            _ => {
                return Err(LayoutError::TooManyRegions {
                    count: count.map_or_else(|| "more than 2^64".into(), |n| n.to_string()),
                    limit: MAX_REGIONS,
                })
            }
        }
        let mut out = Vec::new();
        for f in &folded {
            f.runs(&mut out);
        }
        merge_ranges(out)
    }

    /// The bytes of one block over a range of layers and heads (a TP head slice when `heads`
    /// is a rank's range), merged where contiguous.
    ///
    /// ```
    /// let l: kvlayout::KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND".parse()?;
    /// // head-major page: heads 0..2 of block 1 are one contiguous range
    /// let r = l.block_regions(1, 0..1, 0..2)?;
    /// assert_eq!(r.len(), 1);
    /// assert_eq!((r[0].offset, r[0].len), (4 * 16 * 32, 2 * 16 * 32));
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn block_regions(
        &self,
        block: u64,
        layers: Range<u64>,
        heads: Range<u64>,
    ) -> Result<Vec<ByteRange>> {
        self.regions(Selection {
            layers,
            blocks: block..block.saturating_add(1),
            heads,
        })
    }

    /// The bytes of a range of layers, all blocks and heads, merged where contiguous.
    pub fn layer_regions(&self, layers: Range<u64>) -> Result<Vec<ByteRange>> {
        self.regions(Selection {
            layers,
            blocks: 0..self.geometry().num_blocks,
            heads: 0..self.geometry().num_kv_heads,
        })
    }

    /// What to register for transfers: each buffer's whole owned extent, padding included.
    pub fn registered_spans(&self) -> Vec<ByteRange> {
        self.extents()
            .iter()
            .enumerate()
            .map(|(i, x)| ByteRange {
                buffer: i as u32,
                offset: x.start,
                len: x.end - x.start,
            })
            .collect()
    }
}
