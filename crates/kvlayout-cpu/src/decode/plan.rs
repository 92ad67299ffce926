//! One decode work item: the online softmax of a sequence's KV heads over tiles of tokens,
//! driving the kernels of [`super::kernels`] on rows located through the field maps.

use std::cell::RefCell;
use std::ops::Range;

use kvlayout::ops::OpError;
use kvlayout::Field;

use super::kernels::{self, Order, Role, RowKind, RowSet, SUM_LANES, TILE};
use super::src::{Rows, Src};
use crate::arch::{Isa, PrefetchLevel};
use crate::args::{Decode, DecodeShape};
use crate::cache::CacheRef;

/// How many (tile, head) steps ahead the rows are prefetched (into L1 or L2, see
/// [`PrefetchLevel`]): far enough to hide the memory latency, near enough that the
/// prefetched rows are still cached when read.
pub(crate) const PREFETCH_AHEAD: usize = 2;

mod step;
use step::{ahead, Step, Work};

/// Bytes of one L1 way (48 KiB 12-way and 32 KiB 8-way alike): rows this far apart share
/// the same sets.
const L1_WAY: u64 = 4096;

/// Bytes a tile's token rows may span when the kernels prefetch into L2: 64 pages of 4 KiB.
const L2_TILE_SPAN: u64 = 64 * 4096;

/// Tokens per tile for rows `slot` bytes apart, sized to the cache the kernels prefetch into
/// ([`PrefetchLevel`]). Into L1: at most 8 rows of a (tile, head) step in any L1 set, so the
/// step's rows and the ones prefetched for a later step stay in L1 (head-major pages keep
/// whole tiles of 64; token-major pages whose token rows are 4 KiB apart get tiles of 8).
/// Into L2, whose sets repeat every 64 KiB or more, tiles as long as their rows span at most
/// [`L2_TILE_SPAN`], in multiples of 8 tokens: longer tiles mean fewer steps and so less
/// per-step work (the softmax step, the accumulators' loads and stores), but rows spread over
/// more pages than that defeat the hardware prefetcher.
pub(super) fn tile_len(slot: u64, level: PrefetchLevel) -> u64 {
    if level == PrefetchLevel::L2 {
        let fit = L2_TILE_SPAN / slot.max(1) / 8 * 8;
        return fit.clamp(8, TILE as u64);
    }
    let mut a = slot % L1_WAY;
    let mut b = L1_WAY;
    while a != 0 {
        (a, b) = (b % a, a);
    }
    // `b` = gcd(slot, L1_WAY): the rows take `L1_WAY / b` distinct set offsets.
    (8 * (L1_WAY / b)).clamp(8, TILE as u64)
}

/// Where the tokens of one tile live: per token, the byte offset of head 0 of its slot in
/// each field.
struct Tile {
    n: usize,
    /// One past the tile's last token.
    end: u64,
    /// A tile of the item the thread likely runs next: its rows are prefetched, not read.
    lookahead: bool,
    k: [u64; TILE],
    v: [u64; TILE],
    ks: [u64; TILE],
    vs: [u64; TILE],
}

impl Default for Tile {
    fn default() -> Self {
        Tile {
            n: 0,
            end: 0,
            lookahead: false,
            k: [0; TILE],
            v: [0; TILE],
            ks: [0; TILE],
            vs: [0; TILE],
        }
    }
}

/// Everything an item needs, derived once per call from the layout.
pub(super) struct Plan<'a> {
    d: &'a Decode<'a>,
    shape: DecodeShape,
    isa: Isa,
    pub(super) k: Src<'a>,
    pub(super) v: Src<'a>,
    k_inline: Option<Src<'a>>,
    v_inline: Option<Src<'a>>,
    /// `scale * k_scale` (and the keys' fp8 fold), folded into the query.
    q_scale: f32,
    /// Multiplies the logits: the keys' fp8 fold (or 1).
    l_scale: f32,
    /// Whether value rows are read without their fp8 power of two (no inline value scales).
    v_raw: bool,
    /// Multiplies the weights: the values' fp8 fold when `v_raw` (or 1).
    w_scale: f32,
    /// Multiplies the normalized output: `v_scale` (and the values' fp8 fold).
    pub(super) out_scale: f32,
    /// Whether the logits are adjusted (inline key scales, a soft-cap or the keys' fold).
    adjust: bool,
    /// Whether transposed value rows are read in place ([`kernels::pv_transposed`]).
    v_in_place: bool,
    block_size: u64,
    /// Tokens per tile ([`tile_len`]).
    tile_len: u64,
    /// Where the kernels prefetch the rows of later steps.
    level: PrefetchLevel,
}

#[derive(Default)]
pub(super) struct Scratch {
    q: Vec<f32>,
    logits: Vec<f32>,
    kscale: Vec<f32>,
    vscale: Vec<f32>,
    /// A tile's gathered key rows, then its value rows: bytes of their dtype, at most four
    /// per element, kept in f32 storage.
    rows: Vec<f32>,
    widen: Vec<f32>,
    pub(super) state: Vec<f32>,
    /// Partial softmax sums of the item's heads, `SUM_LANES` per query head.
    lane_sums: Vec<f32>,
}

thread_local! {
    pub(super) static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

pub(super) fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

impl<'a> Plan<'a> {
    /// The plan of a validated decode; the kernels prefetch to `level`, and the tiles are
    /// sized for it.
    pub(super) fn new(
        cache: &CacheRef<'a>,
        d: &'a Decode<'a>,
        shape: DecodeShape,
        isa: Isa,
        level: PrefetchLevel,
    ) -> Result<Self, OpError> {
        let layout = cache.layout;
        let mut k = Src::new(cache, layout.field_map(Field::K)?, isa, Role::Key)?;
        if k.rows == Rows::Gathered && k.x_split() && kernels::reads_split(isa) {
            k.rows = Rows::Split;
            k.set_order(kernels::split_key_order(isa, k.kind));
        }
        let mut v = Src::new(cache, layout.field_map(Field::V)?, isa, Role::Value)?;
        let v_in_place = v.transposed() && kernels::reads_transposed(isa);
        if v_in_place {
            // `pv_transposed` adds into the accumulators in natural order, as f32 rows do.
            v.set_order(Order::of(isa, RowKind::F32, Role::Value));
        }
        let scaled = layout.content().inline_scales();
        let inline = |f: Field| -> Result<Option<Src<'a>>, OpError> {
            Ok(if scaled {
                Some(Src::new(cache, layout.field_map(f)?, isa, Role::Value)?)
            } else {
                None
            })
        };
        let (k_inline, v_inline) = (inline(Field::KScale)?, inline(Field::VScale)?);
        let sc = layout.scales();
        let kf = k.fold.unwrap_or(1.0);
        // Folding the values' power of two into the weights keeps them in range only without
        // inline scales (weights in (0, 1]).
        let v_raw = v.fold.is_some() && v_inline.is_none();
        let vf = if v_raw { v.fold.unwrap_or(1.0) } else { 1.0 };
        Ok(Plan {
            tile_len: tile_len(k.map.slot_stride(), level),
            adjust: k_inline.is_some() || d.params.soft_cap.is_some() || kf != 1.0,
            v_in_place,
            level,
            d,
            shape,
            isa,
            k,
            v,
            k_inline,
            v_inline,
            q_scale: d.params.scale * sc.k_scale * kf,
            l_scale: kf,
            v_raw,
            w_scale: vf,
            out_scale: sc.v_scale * vf,
            block_size: layout.geometry().block_size,
        })
    }

    /// The tile after `*start` of sequence `seq`'s tokens `range` (advancing `*start`); past
    /// the range, the first tile of `after` (a sequence and its tokens, taken once), marked
    /// [`Tile::lookahead`]; then an empty tile.
    fn next_tile(
        &self,
        seq: usize,
        range: &Range<u64>,
        start: &mut u64,
        after: &mut Option<(usize, Range<u64>)>,
        t: &mut Tile,
    ) {
        if *start < range.end || after.is_none() {
            let end = (*start + self.tile_len).min(range.end);
            self.tile(seq, *start..end, t);
            t.lookahead = false;
            *start = end;
        } else if let Some((next, r)) = after.take() {
            self.tile(next, r.start..(r.start + self.tile_len).min(r.end), t);
            t.lookahead = true;
        }
    }

    /// Offsets of tokens `tokens` (at most `TILE`, inside the sequence's validated blocks).
    fn tile(&self, seq: usize, tokens: Range<u64>, t: &mut Tile) {
        t.n = (tokens.end - tokens.start) as usize;
        t.end = tokens.end;
        let layer = self.d.layer;
        let bps = self.d.blocks_per_seq;
        let row = &self.d.block_table[seq * bps..(seq + 1) * bps];
        for (i, tok) in tokens.enumerate() {
            let b = row[(tok / self.block_size) as usize] as u64;
            let n = tok % self.block_size;
            t.k[i] = self.k.slot_offset(layer, b, n);
            t.v[i] = self.v.slot_offset(layer, b, n);
            if let Some(s) = &self.k_inline {
                t.ks[i] = s.slot_offset(layer, b, n);
            }
            if let Some(s) = &self.v_inline {
                t.vs[i] = s.slot_offset(layer, b, n);
            }
        }
    }

    /// Per-head record of the softmax state: `[max; g][sum; g][acc; g * padded v width]`.
    pub(super) fn record(&self) -> usize {
        self.shape.group * (2 + self.v.padded)
    }

    /// Online softmax of the KV heads `heads` over tokens `range` of sequence `seq`, tile by
    /// tile, every head of the range on each tile (so a token-major page is consumed whole).
    /// Writes one record (see [`Plan::record`]) per head into `states`; accumulators are in
    /// the value kernels' order. `after`: the sequence and tokens of the item this thread
    /// likely runs next (same heads), whose first tile's rows the last steps prefetch, as
    /// every step prefetches the rows of the step two later (a wrong guess costs hints only).
    pub(super) fn run(
        &self,
        seq: usize,
        heads: Range<usize>,
        range: Range<u64>,
        mut after: Option<(usize, Range<u64>)>,
        states: &mut [f32],
        s: &mut Scratch,
    ) {
        let g = self.shape.group;
        let (sw, nh) = (self.record(), heads.len());
        for state in states[..nh * sw].chunks_exact_mut(sw) {
            state[..g].fill(f32::NEG_INFINITY);
            state[g..].fill(0.0);
        }
        if range.is_empty() {
            return;
        }
        let mut w = self.work(seq, &heads, s);
        let spans = (self.k.span(&heads), self.v.span(&heads));
        // The current tile and the next one (whose rows are prefetched meanwhile).
        let mut tiles: [Tile; 2] = Default::default();
        let mut start = range.start;
        for t in tiles.iter_mut() {
            self.next_tile(seq, &range, &mut start, &mut after, t);
        }
        let mut c = 0;
        while tiles[c].n > 0 && !tiles[c].lookahead {
            let pair = [&tiles[c], &tiles[1 - c]];
            let (k, v) = (RowSet::new(spans.0), RowSet::new(spans.1));
            let mut rows = [[k, v], [RowSet::new(spans.0), RowSet::new(spans.1)]];
            self.direct_rows(pair[0], &heads, &mut rows[0]);
            self.direct_rows(pair[1], &heads, &mut rows[1]);
            for (hh, state) in heads.clone().zip(states[..nh * sw].chunks_exact_mut(sw)) {
                let item_head = hh - heads.start;
                let (p, pf_head) = ahead(item_head, nh);
                let st = Step {
                    tile: pair[0],
                    k: &rows[0][0],
                    v: &rows[0][1],
                    h: hh as u64,
                    item_head,
                    pf_tile: pair[p],
                    pf_k: &rows[p][0],
                    pf_v: &rows[p][1],
                    pf_head,
                    pf_h: (heads.start + pf_head) as u64,
                };
                self.step(&st, &mut w, state);
            }
            self.next_tile(seq, &range, &mut start, &mut after, &mut tiles[c]);
            c = 1 - c;
        }
        // Each query head's running sum: the sum of its partial sums.
        for (state, parts) in states[..nh * sw]
            .chunks_exact_mut(sw)
            .zip(w.lane_sums.chunks_exact(g * SUM_LANES))
        {
            for (sum, lanes) in state[g..2 * g]
                .iter_mut()
                .zip(parts.chunks_exact(SUM_LANES))
            {
                *sum = lanes.iter().sum();
            }
        }
    }

    /// The scratch of an item of sequence `seq`'s KV heads `heads`, grown as needed, with
    /// the item's query rows scaled and in the key kernels' order.
    fn work<'s>(&self, seq: usize, heads: &Range<usize>, s: &'s mut Scratch) -> Work<'s> {
        let (g, qk, vw) = (self.shape.group, self.shape.qk_width, self.shape.v_width);
        let (qstride, nh) = (self.k.padded, heads.len());
        let Scratch {
            q,
            logits,
            kscale,
            vscale,
            rows,
            widen,
            lane_sums,
            ..
        } = s;
        grow(lane_sums, nh * g * SUM_LANES);
        let lane_sums = &mut lane_sums[..nh * g * SUM_LANES];
        lane_sums.fill(0.0);
        grow(q, nh * g * qstride);
        grow(logits, g * TILE);
        grow(kscale, TILE);
        grow(vscale, TILE);
        grow(rows, 2 * TILE * qk.max(vw));
        grow(widen, qk.max(vw));
        // Query rows of the item, scaled, in the key kernels' order.
        let q0 = (seq * self.shape.q_heads + heads.start * g) * qk;
        for (r, dst) in q[..nh * g * qstride].chunks_exact_mut(qstride).enumerate() {
            let src = &mut widen[..qk];
            self.d.query.read_into(q0 + r * qk, src);
            for x in src.iter_mut() {
                *x *= self.q_scale;
            }
            self.k.order.arrange(src, dst);
        }
        let (k_gathered, v_gathered) = rows.split_at_mut(TILE * qk.max(vw));
        Work {
            q,
            logits,
            kscale,
            vscale,
            k_gathered,
            v_gathered,
            widen,
            lane_sums,
        }
    }

    /// Adds the rows of `tile` read in place to `rows` (keys, then values; none where they
    /// are gathered), each checked to span every head of `heads`.
    fn direct_rows(&self, tile: &Tile, heads: &Range<usize>, rows: &mut [RowSet<'a>; 2]) {
        if self.k.rows != Rows::Gathered {
            self.k.direct_rows(&tile.k[..tile.n], heads, &mut rows[0]);
        }
        if self.v.rows == Rows::Direct {
            self.v.direct_rows(&tile.v[..tile.n], heads, &mut rows[1]);
        }
    }
}
