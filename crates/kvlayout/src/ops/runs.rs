//! Block moves as plain byte copies: the units of a [`MovePlan`] for every block pair, merged
//! into maximal runs contiguous on both sides. A backend copies between memories its kernels
//! should not address (device and pinned host memory, two devices) with one copy per run,
//! not one per block.
//!
//! ```
//! use kvlayout::ops::{copy_runs, BlockMove};
//! use kvlayout::KvCacheLayout;
//! let gpu: KvCacheLayout = "kv B=8 N=16 H=4 D=8 dtype=f16 order=HND".parse()?;
//! let cpu: KvCacheLayout = "kv B=4 N=16 H=4 D=8 dtype=f16 order=HND".parse()?;
//! // Blocks 2, 3, 4 of the GPU pool to blocks 0, 1, 2 of the host pool: a block is one run
//! // (K|V rows, head-major), and the three blocks are one run on both sides.
//! let m = BlockMove::Swap(&[(2, 0), (3, 1), (4, 2)]).plan(Some(&gpu), &cpu)?;
//! let runs = copy_runs(&gpu, &cpu, &m, 1 << 20).expect("plain rows on both sides");
//! assert_eq!(runs.len(), 1);
//! assert_eq!(runs[0].len, 3 * 4 * 16 * (8 + 8) * 2);
//! assert_eq!(runs[0].src_offset, 2 * 4 * 16 * (8 + 8) * 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::layout::KvCacheLayout;

use super::moves::{MoveDim, MovePiece, MovePlan, Moves};

/// `len` bytes from `src_offset` of source buffer `src_buffer` to `dst_offset` of destination
/// buffer `dst_buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyRun {
    /// Byte offset in the source buffer.
    pub src_offset: u64,
    /// Byte offset in the destination buffer.
    pub dst_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Source buffer index.
    pub src_buffer: u32,
    /// Destination buffer index.
    pub dst_buffer: u32,
}

impl CopyRun {
    /// Whether `next` continues this run on both sides.
    pub(crate) fn continued_by(&self, next: &CopyRun) -> bool {
        self.src_buffer == next.src_buffer
            && self.dst_buffer == next.dst_buffer
            && self.src_offset + self.len == next.src_offset
            && self.dst_offset + self.len == next.dst_offset
    }
}

/// Every unit of `piece` for every pair, appended to `out`; `false` (stopping) once `out`
/// would hold more than `max` runs.
fn push_units(piece: &MovePiece, pairs: &[(u64, u64)], max: usize, out: &mut Vec<CopyRun>) -> bool {
    let units = piece.units();
    for &pair in pairs {
        let mut idx = vec![0u64; piece.dims.len()];
        for _ in 0..units {
            if out.len() >= max {
                return false;
            }
            let (src_offset, dst_offset) = piece.offsets(pair, &idx);
            out.push(CopyRun {
                src_buffer: piece.src_buffer,
                src_offset,
                dst_buffer: piece.dst_buffer,
                dst_offset,
                len: piece.unit,
            });
            for (i, d) in idx.iter_mut().zip(&piece.dims) {
                *i += 1;
                if *i < d.extent {
                    break;
                }
                *i = 0;
            }
        }
    }
    true
}

/// Appends `u` to `runs`, merged into the last run when it continues it on both sides.
fn push_merged(runs: &mut Vec<CopyRun>, u: CopyRun) {
    match runs.last_mut() {
        Some(last) if last.continued_by(&u) => last.len += u.len,
        _ => runs.push(u),
    }
}

/// The units of every piece in source order, merged as they come, when that order can be
/// generated directly: pairs sorted by source block, each piece's dims with source strides
/// above its block stride outside the pairs and the rest inside, each group outermost
/// (largest stride) first, appended to `runs`. `false` when a unit comes out of order (or past
/// `max` units), with `runs` partly appended to (its last run may have grown); the caller
/// then truncates and sorts.
pub(crate) fn runs_in_source_order(
    plan: &MovePlan,
    pairs: &[(u64, u64)],
    max: usize,
    runs: &mut Vec<CopyRun>,
) -> bool {
    let mut sorted = pairs.to_vec();
    sorted.sort_unstable();
    let units: u64 = plan.pieces.iter().map(|p| p.units()).sum::<u64>() * pairs.len() as u64;
    if units > max as u64 {
        return false;
    }
    runs.reserve(units as usize);
    // The run being extended, held apart from `runs` (it starts as `runs`' last, which the
    // first unit may continue; a run of 0 bytes stands for none), and the source end of the
    // last unit, for the order check (`(0, 0)`: none yet; a unit never ends at 0).
    let mut cur = runs.pop().unwrap_or(CopyRun {
        src_offset: 0,
        dst_offset: 0,
        len: 0,
        src_buffer: 0,
        dst_buffer: 0,
    });
    let mut last: (u32, u64) = (0, 0);
    let flush = |runs: &mut Vec<CopyRun>, cur: CopyRun| {
        if cur.len > 0 {
            runs.push(cur);
        }
    };
    for piece in &plan.pieces {
        let mut dims: Vec<MoveDim> = piece.dims.clone();
        dims.sort_by_key(|d| std::cmp::Reverse(d.src_stride));
        let split = dims.partition_point(|d| d.src_stride > piece.src_block && piece.src_block > 0);
        let (outer, inner) = dims.split_at(split);
        let total = |ds: &[MoveDim]| ds.iter().map(|d| d.extent).product::<u64>();
        let (n_outer, n_inner) = (total(outer), total(inner));
        // Offsets of the mixed-radix index `i` of `ds` (the last dim fastest).
        let at = |ds: &[MoveDim], mut i: u64| {
            let (mut s, mut d) = (0u64, 0u64);
            for dim in ds.iter().rev() {
                let k = i % dim.extent;
                i /= dim.extent;
                s += k * dim.src_stride;
                d += k * dim.dst_stride;
            }
            (s, d)
        };
        let inner_at: Vec<(u64, u64)> = (0..n_inner).map(|i| at(inner, i)).collect();
        let (buf_s, buf_d, unit) = (piece.src_buffer, piece.dst_buffer, piece.unit);
        if unit == 0 {
            continue;
        }
        for o in 0..n_outer {
            let (os, od) = at(outer, o);
            for &(sb, db) in &sorted {
                let base_s = piece.src_base + sb * piece.src_block + os;
                let base_d = piece.dst_base + db * piece.dst_block + od;
                for &(is, id) in &inner_at {
                    let (src_offset, dst_offset) = (base_s + is, base_d + id);
                    if (buf_s, src_offset) < last {
                        flush(runs, cur);
                        return false;
                    }
                    last = (buf_s, src_offset + unit);
                    if cur.len > 0
                        && cur.src_buffer == buf_s
                        && cur.dst_buffer == buf_d
                        && cur.src_offset + cur.len == src_offset
                        && cur.dst_offset + cur.len == dst_offset
                    {
                        cur.len += unit;
                    } else {
                        flush(runs, cur);
                        cur = CopyRun {
                            src_buffer: buf_s,
                            src_offset,
                            dst_buffer: buf_d,
                            dst_offset,
                            len: unit,
                        };
                    }
                }
            }
        }
    }
    flush(runs, cur);
    true
}

/// The byte copies executing validated moves `m` from `src` to `dst` (the layouts `m` was
/// validated for): every unit of their [`MovePlan`] for every pair, sorted
/// by source position and merged where one continues the previous on both sides.
///
/// Post-conditions: the runs cover exactly the bytes of every moved element on each side, no
/// two destination runs overlap, and no run can be merged with the next. `None` when the plan
/// has no byte-run form (an element-wise legacy split) or more than `max_units` units before
/// merging; the caller then moves with a kernel.
pub fn copy_runs(
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
    m: &Moves,
    max_units: usize,
) -> Option<Vec<CopyRun>> {
    let mut runs = Vec::new();
    copy_runs_into(src, dst, m, max_units, &mut runs).then_some(runs)
}

/// [`copy_runs`] appended to `out`, whose memory is reused (a plan made again and again
/// writes into memory already mapped): `false`, with `out` as it was, where `copy_runs` is
/// `None`. The first run appended merges into `out`'s last where it continues it.
pub fn copy_runs_into(
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
    m: &Moves,
    max_units: usize,
    out: &mut Vec<CopyRun>,
) -> bool {
    let Some(plan) = m.plan(src, dst) else {
        return false;
    };
    let (len, last) = (out.len(), out.last().copied());
    if runs_in_source_order(&plan, &m.pairs, max_units, out) {
        return true;
    }
    // Back to `out` as it was: its last run may have been taken and grown.
    out.truncate(len.saturating_sub(1));
    out.extend(last);
    let mut units = Vec::new();
    for piece in &plan.pieces {
        if !push_units(piece, &m.pairs, max_units, &mut units) {
            return false;
        }
    }
    for r in merge_runs(units) {
        push_merged(out, r);
    }
    true
}

/// The bytes `runs` copy: the sum of their lengths.
///
/// ```
/// use kvlayout::ops::{run_bytes, CopyRun};
/// let run = |len| CopyRun { src_offset: 0, dst_offset: 0, len, src_buffer: 0, dst_buffer: 0 };
/// assert_eq!(run_bytes(&[run(4096), run(512)]), 4608);
/// ```
pub fn run_bytes<'a>(runs: impl IntoIterator<Item = &'a CopyRun>) -> u64 {
    runs.into_iter().map(|r| r.len).sum()
}

/// `runs` sorted by source position (when they are not already), each merged into the
/// previous one it continues on both sides.
pub fn merge_runs(mut runs: Vec<CopyRun>) -> Vec<CopyRun> {
    if !runs.is_sorted_by_key(|r| (r.src_buffer, r.src_offset)) {
        runs.sort_unstable_by_key(|r| (r.src_buffer, r.src_offset));
    }
    let mut out: Vec<CopyRun> = Vec::with_capacity(runs.len());
    for r in runs {
        push_merged(&mut out, r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::BlockMove;

    #[test]
    fn whole_blocks_of_one_layout_merge_across_pairs() {
        // B=3 H=4 N=16 D=8, one layer, K|V rows: a block is one run of 4*16*16*2 bytes.
        let a: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=NHD".parse().unwrap();
        let m = BlockMove::Swap(&[(0, 1), (1, 2), (2, 0)])
            .plan(Some(&a), &a)
            .unwrap();
        let runs = copy_runs(&a, &a, &m, 1 << 16).unwrap();
        let block = 4 * 16 * 16 * 2;
        assert_eq!(run_bytes(&runs), 3 * block);
        // (0,1) and (1,2) continue each other on both sides; (2,0) does not.
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].len, 2 * block);
        assert_eq!((runs[0].src_offset, runs[0].dst_offset), (0, block));
    }

    #[test]
    fn rows_move_one_by_one_between_orders() {
        let nhd: KvCacheLayout = "kv B=2 N=16 H=4 D=8 dtype=f16 order=NHD".parse().unwrap();
        let hnd: KvCacheLayout = "kv B=2 N=16 H=4 D=8 dtype=f16 order=HND".parse().unwrap();
        let m = BlockMove::Convert.plan(Some(&nhd), &hnd).unwrap();
        let runs = copy_runs(&nhd, &hnd, &m, 1 << 16).unwrap();
        assert_eq!(run_bytes(&runs), 2 * 2 * 16 * 4 * 8 * 2);
        // One K|V row of 32 bytes each, except that the last row of block 0 and the first of
        // block 1 continue each other on both sides.
        assert_eq!(runs.len(), 2 * 16 * 4 - 1);
        assert!(runs.iter().all(|r| r.len == 32 || r.len == 64));
        assert!(copy_runs(&nhd, &hnd, &m, 10).is_none());
    }
}
