//! One (tile, head) step of an item: the kernels' calls and their named arguments, with
//! rows located through the field maps.

use super::{Plan, Tile, PREFETCH_AHEAD};
use crate::decode::kernels::{
    self, RowSet, Run, SoftmaxStep, Strided, StridedMut, TileRows, TransposedArgs, SUM_LANES, TILE,
};
use crate::decode::src::Rows;

/// The scratch of one item, borrowed from [`Scratch`](super::Scratch): the item's query rows (in the key
/// kernels' order), a tile's logits (then weights) and scales, gathered rows, the scalar
/// build's widened row, and the heads' partial softmax sums.
pub(super) struct Work<'s> {
    pub(super) q: &'s [f32],
    pub(super) logits: &'s mut [f32],
    pub(super) kscale: &'s mut [f32],
    pub(super) vscale: &'s mut [f32],
    pub(super) k_gathered: &'s mut [f32],
    pub(super) v_gathered: &'s mut [f32],
    pub(super) widen: &'s mut [f32],
    pub(super) lane_sums: &'s mut [f32],
}

/// One (tile, head) step of an item: the tile, its rows read in place (`k`, `v`; checked for
/// every head of the item), the KV head and its index in the item; and what the kernels
/// prefetch meanwhile, the step `PREFETCH_AHEAD` later (its tile, rows, head's index in the
/// item and head).
pub(super) struct Step<'s, 'a> {
    pub(super) tile: &'s Tile,
    pub(super) k: &'s RowSet<'a>,
    pub(super) v: &'s RowSet<'a>,
    pub(super) h: u64,
    pub(super) item_head: usize,
    pub(super) pf_tile: &'s Tile,
    pub(super) pf_k: &'s RowSet<'a>,
    pub(super) pf_v: &'s RowSet<'a>,
    pub(super) pf_head: usize,
    pub(super) pf_h: u64,
}

/// Which of the two tiles (0: this one, 1: the next) and which head of the item the kernels
/// prefetch during head `item_head` of an item of `nh` heads: the step `PREFETCH_AHEAD` later,
/// a later head of this tile or a head of the next one.
pub(super) fn ahead(item_head: usize, nh: usize) -> (usize, usize) {
    let ahead = item_head + PREFETCH_AHEAD;
    if ahead < nh {
        (0, ahead)
    } else {
        (1, (ahead - nh).min(nh - 1))
    }
}

impl<'a> Plan<'a> {
    /// One (tile, head) step into the head's record `state`: the logits of the tile's keys
    /// against the head's query rows (`logits[j * TILE + i]`), their adjustment, the
    /// softmax step, then the values (`acc[j] += sum_i w[j * TILE + i] * v_i`).
    pub(super) fn step(&self, st: &Step<'_, 'a>, w: &mut Work<'_>, state: &mut [f32]) {
        let g = self.shape.group;
        let qs = g * self.k.padded;
        let q: &[f32] = w.q;
        self.keys(st, &q[st.item_head * qs..(st.item_head + 1) * qs], w);
        if self.adjust {
            self.adjust_logits(st, w);
        }
        let (stats, acc) = state.split_at_mut(2 * g);
        let sums = st.item_head * g * SUM_LANES..(st.item_head + 1) * g * SUM_LANES;
        let step = SoftmaxStep {
            round: self.v.order.bf16_operands(),
            nt: st.tile.n,
            g,
            logits: StridedMut {
                data: &mut *w.logits,
                stride: TILE,
            },
            wscale: self.w_scale,
            vscale: self.value_scales(st, w.vscale),
            maxes: &mut stats[..g],
            sums: &mut w.lane_sums[sums],
            acc: StridedMut {
                data: &mut *acc,
                stride: self.v.padded,
            },
        };
        kernels::softmax_tile(self.isa, step);
        self.values(st, w, acc);
    }

    /// The logits of a step's keys against its head's query rows `q` (split keys read in
    /// place, gathered ones copied first), prefetching the keys of the step ahead.
    fn keys(&self, st: &Step<'_, 'a>, q: &[f32], w: &mut Work<'_>) {
        let nt = st.tile.n;
        let gathered;
        let (rows, hoff) = match self.k.rows {
            Rows::Direct | Rows::Split => (st.k, self.k.map.head_offset(st.item_head as u64)),
            Rows::Gathered => {
                gathered = self.k.gather_tile(&st.tile.k[..nt], st.h, w.k_gathered);
                (&gathered, 0)
            }
        };
        let t = TileRows {
            kind: self.k.kind,
            raw: self.k.fold.is_some(),
            rows,
            hoff: hoff as usize,
            next: st.pf_k,
            next_hoff: self.k.map.head_offset(st.pf_head as u64) as usize,
            width: self.shape.qk_width,
            level: self.level,
        };
        let q = Strided {
            data: q,
            stride: self.k.padded,
        };
        let logits = StridedMut {
            data: &mut *w.logits,
            stride: TILE,
        };
        let g = self.shape.group;
        if self.k.rows == Rows::Split {
            let chunk = self.k.map.strides.dim_chunk as usize;
            kernels::qk_tile_split(self.isa, &t, chunk, q, g, logits);
        } else {
            kernels::qk_tile(self.isa, &t, q, g, logits, w.widen);
        }
    }

    /// The logits of a step times its tokens' key scales (inline, or the keys' fold), then
    /// soft-capped.
    fn adjust_logits(&self, st: &Step<'_, 'a>, w: &mut Work<'_>) {
        let nt = st.tile.n;
        if let Some(src) = &self.k_inline {
            let hs = src.map.head_offset(st.h);
            for (x, &off) in w.kscale.iter_mut().zip(&st.tile.ks[..nt]) {
                *x = src.f32_at(off + hs) * self.l_scale;
            }
        } else {
            w.kscale[..nt].fill(self.l_scale);
        }
        let logits = StridedMut {
            data: &mut *w.logits,
            stride: TILE,
        };
        let (g, cap) = (self.shape.group, self.d.params.soft_cap);
        kernels::adjust_logits(self.isa, nt, g, logits, &w.kscale[..nt], cap);
    }

    /// The inline value scales of a step's tokens, read into `out` (none without them).
    fn value_scales<'v>(&self, st: &Step<'_, 'a>, out: &'v mut [f32]) -> Option<&'v [f32]> {
        let src = self.v_inline.as_ref()?;
        let nt = st.tile.n;
        let hs = src.map.head_offset(st.h);
        for (x, &off) in out.iter_mut().zip(&st.tile.vs[..nt]) {
            *x = src.f32_at(off + hs);
        }
        Some(&out[..nt])
    }

    /// The values of a step added to the head's accumulators `acc` times the weights (in
    /// the logits' place), prefetching the values of the step ahead.
    fn values(&self, st: &Step<'_, 'a>, w: &mut Work<'_>, acc: &mut [f32]) {
        let nt = st.tile.n;
        let weights = Strided {
            data: &*w.logits,
            stride: TILE,
        };
        let acc = StridedMut {
            data: acc,
            stride: self.v.padded,
        };
        if self.v_in_place {
            let pf = &st.pf_tile.v[..st.pf_tile.n];
            return self.pv_transposed(&st.tile.v[..nt], st.h, (pf, st.pf_h), weights, acc);
        }
        let gathered;
        let (rows, hoff) = match self.v.rows {
            Rows::Direct => (st.v, self.v.map.head_offset(st.item_head as u64)),
            // (Values are never split.)
            Rows::Gathered | Rows::Split => {
                gathered = self.v.gather_tile(&st.tile.v[..nt], st.h, w.v_gathered);
                (&gathered, 0)
            }
        };
        let t = TileRows {
            kind: self.v.kind,
            raw: self.v_raw,
            rows,
            hoff: hoff as usize,
            next: st.pf_v,
            next_hoff: self.v.map.head_offset(st.pf_head as u64) as usize,
            width: self.shape.v_width,
            level: self.level,
        };
        kernels::pv_tile(self.isa, &t, weights, self.shape.group, acc, w.widen);
    }

    /// The values of head `h` of a tile (`offs`: head 0 of each token) whose rows are
    /// transposed ([`Src::transposed`](crate::decode::src::Src::transposed)), read in place: `acc[j * stride + d] +=` the sum over
    /// the tile's tokens of `w[j * TILE + i]` times element `d` of token `i`, for the `g`
    /// heads ([`kernels::pv_transposed`], on runs of at most 16 tokens consecutive in memory).
    /// `pf`: the tokens and head of the step read later, whose runs are prefetched meanwhile.
    fn pv_transposed(
        &self,
        offs: &[u64],
        h: u64,
        pf: (&[u64], u64),
        w: Strided<'_>,
        acc: StridedMut<'_>,
    ) {
        let src = &self.v;
        let mut runs = [Run::default(); TILE];
        let mut pf_runs = [Run::default(); TILE];
        let n = self.transposed_runs(offs, h, &mut runs);
        let pf_n = self.transposed_runs(pf.0, pf.1, &mut pf_runs);
        let a = TransposedArgs {
            buf: src.buf,
            runs: &runs[..n],
            pf: &pf_runs[..pf_n],
            dim: src.map.strides.dim as usize,
            width: src.map.width as usize,
            w,
            g: self.shape.group,
            out: acc,
            level: self.level,
        };
        kernels::pv_transposed(self.isa, src.kind, self.v_raw, a);
    }

    /// The runs of head `h` of a tile's transposed values (`offs`: head 0 of each token), at
    /// most 16 tokens consecutive in memory each. Returns how many.
    fn transposed_runs(&self, offs: &[u64], h: u64, runs: &mut [Run]) -> usize {
        let e = self.v.map.elem_bytes() as usize;
        let hs = self.v.map.head_offset(h);
        let mut n = 0usize;
        for (i, &off) in offs.iter().enumerate() {
            let at = (off + hs) as usize;
            // Token `i` extends the last run when it lies right after it in memory.
            if let Some(last) = n.checked_sub(1).map(|r| runs[r]) {
                if last.n < 16 && at == last.off + last.n * e {
                    runs[n - 1].n += 1;
                    continue;
                }
            }
            runs[n] = Run {
                off: at,
                i0: i,
                n: 1,
            };
            n += 1;
        }
        n
    }
}
