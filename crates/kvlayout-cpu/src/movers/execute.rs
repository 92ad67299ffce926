//! Executes a move plan (`kvlayout::ops::MovePlan`): each piece's units are copied with memcpy
//! or streamed stores, in parallel over block pairs (and the outermost dim when pairs are
//! few), with the next item's source prefetched where that pays.

use kvlayout::ops::{MoveDim, MovePiece, MovePlan, MAX_MOVE_DIMS};
use rayon::prelude::*;

use super::stream::{copy_unit, store_fence, stream_kind, Stream, STREAM_THRESHOLD};
use super::{Buffers, DstPtr};
use crate::arch::{self, PrefetchLevel};
use crate::backend::CpuBackend;

/// Most lines of the next item's source prefetched during an item (256 KiB, within L2).
const PREFETCH_SPAN_LINES: u64 = 4096;

/// Runs a plan over block pairs (see the soundness note of `super::run`).
pub(super) fn execute(be: &CpuBackend, plan: &MovePlan, pairs: &[(u64, u64)], bufs: &Buffers) {
    for p in &plan.pieces {
        let walk = Walk::new(be, p, pairs);
        let src = bufs.src[p.src_buffer as usize];
        let dst = bufs.dst[p.dst_buffer as usize];
        be.pool.install(|| {
            (0..walk.items)
                .into_par_iter()
                .for_each(|item| walk.item(p, pairs, item, src, dst));
        });
    }
}

/// How the units of one piece are walked: items (block pair x point of `outer`) in parallel,
/// each a loop over the points of `inner`.
struct Walk {
    /// The dim split across items (extent 1 when items are block pairs alone).
    outer: MoveDim,
    /// The dims walked inside an item, innermost first.
    inner: Vec<MoveDim>,
    /// Units per item.
    total: u64,
    /// Items: block pairs x `outer.extent`.
    items: u64,
    /// Lines of the next item's source prefetched during an item (0: none).
    span_lines: u64,
    /// Of those, prefetched per unit copied.
    per_unit: u64,
    /// How destinations are written.
    nt: Stream,
}

impl Walk {
    fn new(be: &CpuBackend, p: &MovePiece, pairs: &[(u64, u64)]) -> Self {
        // Stream (non-temporal stores) when the destination is far larger than the caches.
        let moved = pairs.len() as u64 * p.units() * p.unit;
        let stream = moved >= STREAM_THRESHOLD && p.unit.is_multiple_of(64);
        // Iterate in source order (sequential reads; the streamed writes need no locality),
        // except a streamed permutation on a backend arranged for L2 prefetches: there it goes
        // in destination order, one write-combining stream instead of one per destination row,
        // while each item's source range is prefetched during the item before it.
        let dst_order = stream && !p.dims.is_empty() && be.prefetch == PrefetchLevel::L2;
        let mut dims = p.dims.clone();
        if dst_order {
            dims.sort_by_key(|d| (d.dst_stride, d.src_stride));
        } else {
            dims.sort_by_key(|d| (d.src_stride, d.dst_stride));
        }
        // Parallel over (pair, outermost dim). Split the work by block pair when there are
        // enough pairs, else also by the outermost dim.
        let by_pair = pairs.len() >= 8 * be.threads();
        let whole = MoveDim {
            extent: 1,
            src_stride: 0,
            dst_stride: 0,
        };
        let (outer, inner) = match dims.split_last() {
            Some((&last, rest)) if !by_pair => (last, rest.to_vec()),
            _ => (whole, dims),
        };
        assert!(inner.len() <= MAX_MOVE_DIMS, "the plan's dims are bounded");
        let total: u64 = inner.iter().map(|d| d.extent).product();
        // Lines of an item's source range, prefetched `per_unit` at a time: only when the range
        // is at least half data (a head-range gather reads less of each row) and fits L2.
        let span = inner
            .iter()
            .map(|d| (d.extent - 1) * d.src_stride)
            .sum::<u64>()
            + p.unit;
        let span_lines = if dst_order && span <= 2 * total * p.unit {
            span.div_ceil(64).min(PREFETCH_SPAN_LINES)
        } else {
            0
        };
        Walk {
            outer,
            items: pairs.len() as u64 * outer.extent,
            inner,
            total,
            span_lines,
            per_unit: span_lines.div_ceil(total),
            nt: if stream {
                stream_kind(be.isa)
            } else {
                Stream::No
            },
        }
    }

    /// Source offset of an item's first unit.
    #[inline]
    fn item_src(&self, p: &MovePiece, pairs: &[(u64, u64)], item: u64) -> u64 {
        let (sb, _) = pairs[(item / self.outer.extent) as usize];
        p.src_base + sb * p.src_block + (item % self.outer.extent) * self.outer.src_stride
    }

    /// Copies the units of one item.
    #[inline]
    fn item(
        &self,
        p: &MovePiece,
        pairs: &[(u64, u64)],
        item: u64,
        (sp, sl): (usize, usize),
        (dp, dl): (DstPtr, usize),
    ) {
        let (_, db) = pairs[(item / self.outer.extent) as usize];
        let s0 = self.item_src(p, pairs, item);
        let d0 = p.dst_base + db * p.dst_block + (item % self.outer.extent) * self.outer.dst_stride;
        let mut pf = self.prefetch_next(p, pairs, item, (sp, sl));
        let unit = p.unit as usize;
        // At most `MAX_MOVE_DIMS` dimensions (checked in `Walk::new`): no allocation per item.
        let mut idx = [0u64; MAX_MOVE_DIMS];
        let idx = &mut idx[..self.inner.len()];
        for _ in 0..self.total {
            pf.advance(self.per_unit);
            let (mut so, mut dof) = (s0, d0);
            for (i, d) in idx.iter().zip(&self.inner) {
                so += i * d.src_stride;
                dof += i * d.dst_stride;
            }
            let (so, dof) = (so as usize, dof as usize);
            assert!(
                so + unit <= sl && dof + unit <= dl,
                "plan stays inside the buffers"
            );
            // SAFETY: in bounds (asserted), disjoint from other workers' writes and from the
            // source (see `super::run`).
            unsafe { copy_unit((sp as *const u8).add(so), dp.get().add(dof), unit, self.nt) };
            for (i, d) in idx.iter_mut().zip(&self.inner) {
                *i += 1;
                if *i < d.extent {
                    break;
                }
                *i = 0;
            }
        }
        if self.nt != Stream::No {
            store_fence();
        }
    }

    /// The prefetch of the next item's source lines (none past the buffer).
    #[inline]
    fn prefetch_next(
        &self,
        p: &MovePiece,
        pairs: &[(u64, u64)],
        item: u64,
        (sp, sl): (usize, usize),
    ) -> Prefetch {
        let (first, lines) = if item + 1 < self.items && self.span_lines > 0 {
            let first = self.item_src(p, pairs, item + 1) / 64;
            let left = (sl as u64 / 64).saturating_sub(first);
            (first, self.span_lines.min(left))
        } else {
            (0, 0)
        };
        Prefetch {
            base: (sp as *const u8).wrapping_add((first * 64) as usize),
            lines,
            line: 0,
        }
    }
}

/// Source lines to prefetch during an item, a few per unit copied, into L2: only a backend
/// arranged for L2 walks destination-ordered items ahead of their reads.
struct Prefetch {
    base: *const u8,
    lines: u64,
    line: u64,
}

impl Prefetch {
    /// Prefetches the next `n` lines (those left).
    #[inline]
    fn advance(&mut self, n: u64) {
        for _ in 0..n {
            if self.line < self.lines {
                arch::prefetch_to(
                    self.base.wrapping_add((self.line * 64) as usize),
                    PrefetchLevel::L2,
                );
            }
            self.line += 1;
        }
    }
}
