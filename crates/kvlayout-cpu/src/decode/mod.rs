//! Fast path of `paged_decode`.
//!
//! A work item is a sequence and a range of KV heads — all of them when the page is token-major
//! (so a page is consumed whole before the next), one when it is head-major — each with the
//! whole GQA group of query heads sharing it, so every K and V row is read once. When there
//! are too few items to keep every thread busy, each item's context is also split into
//! partitions whose partial softmax states are reduced afterwards (flash-decoding).
//!
//! An item runs an online softmax over tiles of up to [`TILE`](kernels::TILE) tokens (a tile may
//! span blocks: its rows are located token by token through the block table and the field
//! maps). Per tile and KV head: the logits of all rows against all query heads of the group
//! (one kernel call), one vectorized max/exp/sum pass, then the value rows accumulated into the
//! group's accumulators (one kernel call). Rows are addressed only through the layout's field
//! maps. Contiguous rows of every dtype (f32, f16, bf16, fp8, int8) are read in place and
//! widened in registers; other rows (any non-unit element stride) are first copied through the
//! strides into contiguous rows of the same dtype and go through the same kernels. On AVX-512
//! and AVX2 the legacy vLLM layout is read in place: x-split keys by the logits kernels
//! assembling each block from its 16-byte pieces ([`kernels::qk_tile_split`]), transposed values
//! by kernels of their own ([`kernels::pv_transposed`]); the scalar build copies them. The rows
//! a few (tile, head) steps ahead are prefetched while the current ones are computed
//! ([`plan::PREFETCH_AHEAD`]).
//!
//! Per-tensor scales fold into the query (`k_scale`) and the final normalization (`v_scale`);
//! inline scales multiply the logits and the weights per token; the power of two the fp8
//! kernels leave out is folded the same way (see [`kernels::fp8_fold`]). Scratch lives in
//! per-thread buffers and a partials buffer kept by the backend, so a decode step allocates
//! nothing once they have grown.

use std::ops::Range;

use kvlayout::ops::OpError;
use rayon::prelude::*;

use crate::arch::Isa;
use crate::args::{check_decode, Decode};
use crate::backend::CpuBackend;
use crate::cache::CacheRef;
use kernels::Order;

#[allow(unsafe_code)]
pub(crate) mod kernels;
mod plan;
#[cfg(feature = "bench")]
pub(crate) use plan::PREFETCH_AHEAD;
pub(crate) mod calibrate;
#[allow(unsafe_code)]
mod src;
#[cfg(test)]
mod tests;

use plan::{grow, Plan, SCRATCH};

/// Fewest tokens worth a partition of its own.
const MIN_PARTITION: u64 = 128;

/// How the records of a group of `g` query heads become output rows of `vw` values:
/// accumulator rows `s` apart in the value kernels' `order`, times `f` over their sum.
#[derive(Clone, Copy)]
struct Finish {
    g: usize,
    vw: usize,
    s: usize,
    order: Order,
    f: f32,
}

impl Finish {
    /// Final output of a group from its record `[max; g][sum; g][acc; g * s]`: each
    /// accumulator row times `f / sum`, back in natural order.
    fn finish(&self, state: &[f32], out: &mut [f32]) {
        let Finish { g, vw, s, order, f } = *self;
        for j in 0..g {
            let sum = state[g + j];
            let acc = &state[2 * g + j * s..2 * g + (j + 1) * s];
            let o = &mut out[j * vw..(j + 1) * vw];
            if sum > 0.0 {
                order.restore(acc, f / sum, o);
            } else {
                o.fill(0.0);
            }
        }
    }

    /// Combines the partial records of `parts` partitions of one KV head: each rescaled to
    /// the global maximum, summed, then finished as one record in `tmp` (a record long).
    fn combine<'p>(
        &self,
        parts: usize,
        rec: impl Fn(usize) -> &'p [f32],
        tmp: &mut [f32],
        o: &mut [f32],
    ) {
        let (g, s) = (self.g, self.s);
        tmp.fill(0.0);
        for j in 0..g {
            let m = (0..parts)
                .map(|p| rec(p)[j])
                .fold(f32::NEG_INFINITY, f32::max);
            let acc = &mut tmp[2 * g + j * s..2 * g + (j + 1) * s];
            let mut sum = 0.0;
            for p in 0..parts {
                let r = rec(p);
                if r[g + j] > 0.0 {
                    let c = kernels::weight(r[j] - m);
                    sum += r[g + j] * c;
                    for (x, a) in acc.iter_mut().zip(&r[2 * g + j * s..2 * g + (j + 1) * s]) {
                        *x += a * c;
                    }
                }
            }
            tmp[g + j] = sum;
        }
        self.finish(tmp, o);
    }
}

/// Overrides for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Options {
    /// Force this many context partitions per item (split-context).
    pub partitions: Option<usize>,
    /// Force an instruction set (one this machine has).
    pub isa: Option<Isa>,
    /// Force the step onto the calling thread (`true`) or the pool (`false`); by default a
    /// step smaller than [`INLINE_WORK`] runs on the calling thread.
    pub inline: Option<bool>,
}

/// Token x KV-head pairs below which a decode step runs on the calling thread: handing a step
/// to the pool and waiting for it costs more than splitting so little work saves.
const INLINE_WORK: u64 = 2048;

/// `f(index, chunk)` for each `size`-long chunk of `v`: one after the other on this thread when
/// `inline`, else in parallel (on the pool the caller runs in).
fn each_chunk<T: Send>(
    inline: bool,
    v: &mut [T],
    size: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if inline {
        v.chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
    } else {
        v.par_chunks_mut(size)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

pub(crate) fn decode_with(
    be: &CpuBackend,
    cache: &CacheRef<'_>,
    d: &Decode<'_>,
    out: &mut [f32],
    opts: Options,
) -> Result<(), OpError> {
    let shape = check_decode(cache.layout, d, out.len())?;
    if shape.seqs == 0 {
        // Nothing to attend to. (With one sequence or more, the query's length bounds the
        // query heads, and so every count below.)
        return Ok(());
    }
    let plan = Plan::new(cache, d, shape, opts.isa.unwrap_or(be.isa), be.prefetch)?;
    let kv_heads = cache.layout.geometry().num_kv_heads as usize;
    // When a block's page holds all its heads (token- or head-major), one item takes all
    // heads of a sequence, so each page is read whole, in address order, head after head.
    // Heads outside the blocks: one head per item.
    let hpi = if plan.k.map.strides.head < plan.k.map.strides.block {
        kv_heads
    } else {
        1
    };
    let fin = Finish {
        g: shape.group,
        vw: shape.v_width,
        s: plan.v.padded,
        order: plan.v.order,
        f: plan.out_scale,
    };
    let mut items = Items {
        plan: &plan,
        d,
        seqs: shape.seqs,
        kv_heads,
        hpi,
        inline: false,
        rec: plan.record(),
        fin,
    };
    // The longest context and the whole step's token x KV-head pairs.
    let (longest, tokens) = (0..shape.seqs)
        .map(|s| items.range_of(s).end - items.range_of(s).start)
        .fold((0, 0), |(m, t), n| (m.max(n), t + n));
    let work = tokens * kv_heads as u64;
    items.inline = opts.inline.unwrap_or(work < INLINE_WORK);
    let count = items.count();
    let parts = opts.partitions.unwrap_or_else(|| {
        let target = 4 * be.threads();
        if items.inline || count >= target {
            1
        } else {
            target
                .div_ceil(count.max(1))
                .min(longest.div_ceil(MIN_PARTITION).max(1) as usize)
        }
    });
    let items = &items;
    let mut step = || {
        if parts <= 1 {
            items.run_whole(out);
        } else {
            let mut partials = be.decode_partials.lock().unwrap_or_else(|e| e.into_inner());
            items.run_split(parts, &mut partials, out);
        }
    };
    if items.inline {
        step();
    } else {
        be.pool.install(step);
    }
    Ok(())
}

/// The work items of one decode step: `hpi` KV heads of one sequence each (all of them, or
/// one), run on the calling thread when `inline`, each item's heads writing records of `rec`
/// floats that `fin` turns into output rows.
struct Items<'p, 'a> {
    plan: &'p Plan<'a>,
    d: &'p Decode<'a>,
    seqs: usize,
    kv_heads: usize,
    hpi: usize,
    inline: bool,
    rec: usize,
    fin: Finish,
}

impl Items<'_, '_> {
    fn count(&self) -> usize {
        self.seqs * (self.kv_heads / self.hpi)
    }

    /// The tokens sequence `seq` attends to (its sliding window).
    fn range_of(&self, seq: usize) -> Range<u64> {
        let len = u64::from(self.d.seq_lens[seq]);
        self.d
            .params
            .sliding_window
            .map_or(0, |w| len.saturating_sub(w))..len
    }

    /// The KV heads of item `item`.
    fn heads(&self, item: usize) -> Range<usize> {
        let h0 = (item % (self.kv_heads / self.hpi)) * self.hpi;
        h0..h0 + self.hpi
    }

    fn seq_of(&self, item: usize) -> usize {
        item / (self.kv_heads / self.hpi)
    }

    /// Every item in one piece: its records finished straight into its output rows.
    fn run_whole(&self, out: &mut [f32]) {
        let (hpi, rec, g, vw) = (self.hpi, self.rec, self.fin.g, self.fin.vw);
        each_chunk(self.inline, out, hpi * g * vw, |item, o| {
            SCRATCH.with(|s| {
                let s = &mut *s.borrow_mut();
                let mut state = std::mem::take(&mut s.state);
                grow(&mut state, hpi * rec);
                let seq = self.seq_of(item);
                // Items of whole sequences: the next one is likely this thread's next.
                let after = (hpi == self.kv_heads && seq + 1 < self.seqs)
                    .then(|| (seq + 1, self.range_of(seq + 1)));
                let states = &mut state[..hpi * rec];
                self.plan
                    .run(seq, self.heads(item), self.range_of(seq), after, states, s);
                for (st, o) in state[..hpi * rec]
                    .chunks_exact(rec)
                    .zip(o.chunks_exact_mut(g * vw))
                {
                    self.fin.finish(st, o);
                }
                s.state = state;
            });
        });
    }

    /// Every item's context split into `parts` partitions (flash-decoding), their records
    /// kept in `partials`, then combined into the output rows head by head.
    fn run_split(&self, parts: usize, partials: &mut Vec<f32>, out: &mut [f32]) {
        let (hpi, rec, g, vw) = (self.hpi, self.rec, self.fin.g, self.fin.vw);
        let n = self.count() * parts * hpi * rec;
        grow(partials, n);
        each_chunk(self.inline, &mut partials[..n], hpi * rec, |i, st| {
            let (item, part) = (i / parts, i % parts);
            let r = self.range_of(self.seq_of(item));
            let per = (r.end - r.start).div_ceil(parts as u64);
            let a = (r.start + part as u64 * per).min(r.end);
            let b = (a + per).min(r.end);
            let (seq, heads) = (self.seq_of(item), self.heads(item));
            SCRATCH.with(|s| {
                self.plan
                    .run(seq, heads, a..b, None, st, &mut s.borrow_mut())
            });
        });
        let partials = &partials[..n];
        each_chunk(self.inline, out, g * vw, |head_item, o| {
            // Output chunk `head_item` is KV head `head_item % kv_heads` of its sequence:
            // item `head_item / hpi`, head `head_item % hpi` within the item.
            let (item, hh) = (head_item / hpi, head_item % hpi);
            let rec_of = |p: usize| {
                let at = ((item * parts + p) * hpi + hh) * rec;
                &partials[at..at + rec]
            };
            SCRATCH.with(|s| {
                let s = &mut *s.borrow_mut();
                grow(&mut s.state, rec);
                self.fin.combine(parts, rec_of, &mut s.state[..rec], o);
            });
        });
    }
}
