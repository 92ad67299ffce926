//! One decode work item: the online softmax of a sequence's KV heads over tiles of tokens,
//! driving the kernels of [`crate::simd`] on rows located through the field maps.

use std::cell::RefCell;
use std::ops::Range;

use kvlayout::ops::OpError;
use kvlayout::{Content, Field};

use super::src::{Rows, Src};
use crate::args::{Decode, DecodeShape};
use crate::cache::CacheRef;
use crate::simd::{self, Isa, Order, Role, RowKind, RowSet, SUM_LANES, TILE};

/// How many (tile, head) steps ahead the rows are prefetched (into L1 or L2, see
/// [`simd::PrefetchLevel`]): far enough to hide the memory latency, near enough that the
/// prefetched rows are still there when read (1, 3, 4 and 8 measured slower on Zen, 3 to 8
/// on a Xeon; the whole next tile, an earlier choice, thrashes L2 once a tile of all heads is
/// 512 KiB).
pub(crate) const PREFETCH_AHEAD: usize = 2;

/// Bytes of one L1 way (48 KiB 12-way and 32 KiB 8-way alike): rows this far apart share
/// the same sets.
const L1_WAY: u64 = 4096;

/// Bytes a tile's token rows may span when the kernels prefetch into L2: 64 pages of 4 KiB.
const L2_TILE_SPAN: u64 = 64 * 4096;

/// Tokens per tile for rows `slot` bytes apart, sized to the cache the kernels prefetch into
/// ([`simd::PrefetchLevel`]). Into L1: at most 8 rows of a (tile, head) step in any L1 set, so
/// the step's rows and the ones prefetched for a later step stay in L1. Head-major pages
/// (bf16: 512-byte rows) keep whole tiles of 64; token-major pages whose token rows are 4 KiB
/// apart get tiles of 8 (measured on Zen: bf16 NHD 0.48 -> 0.74 of read bandwidth). Into L2,
/// whose sets repeat every 64 KiB or more, tiles as long as their rows span at most
/// [`L2_TILE_SPAN`], in multiples of 8 tokens: long tiles mean fewer steps, so less of the
/// per-step work (the softmax step, the accumulators' loads and stores), which on the Xeon
/// measured read token-major caches faster (fp8 NHD 0.35 with 16 tokens, 0.45 with 64; bf16
/// NHD, 4 KiB token rows, 0.70 with 64, 0.67 with 32); but rows over more pages than that
/// read slower, as if the hardware's prefetcher lost track of the pages (f32 NHD, 8 KiB token
/// rows: 0.72 with 64 tokens, 0.77-0.81 with 32 or 16).
pub(super) fn tile_len(slot: u64, level: simd::PrefetchLevel) -> u64 {
    if level == simd::PrefetchLevel::L2 {
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
    block_size: u64,
    /// Tokens per tile ([`tile_len`]).
    tile_len: u64,
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
    /// The plan of a validated decode, its tiles sized for rows prefetched to `level`.
    pub(super) fn new(
        cache: &CacheRef<'a>,
        d: &'a Decode<'a>,
        shape: DecodeShape,
        isa: Isa,
        level: simd::PrefetchLevel,
    ) -> Result<Self, OpError> {
        let layout = cache.layout;
        let mut k = Src::new(cache, layout.field_map(Field::K)?, isa, Role::Key)?;
        if k.rows == Rows::Gathered && k.x_split() && simd::reads_split(isa) {
            k.rows = Rows::Split;
            k.set_order(simd::split_key_order(isa, k.kind));
        }
        let mut v = Src::new(cache, layout.field_map(Field::V)?, isa, Role::Value)?;
        if v.transposed() && simd::reads_transposed(isa) {
            // `pv_transposed` adds into the accumulators in natural order, as f32 rows do.
            v.set_order(Order::of(isa, RowKind::F32, Role::Value));
        }
        let scaled = matches!(layout.content(), Content::KvScaled { .. });
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
        let tile_len = tile_len(k.map.strides.slot, level);
        Ok(Plan {
            tile_len,
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

    /// The values of head `h` of a tile (`offs`: head 0 of each token) whose rows are
    /// transposed ([`Src::transposed`]), read in place: `acc[j * stride + d] +=` the sum over
    /// the tile's tokens of `w[j * TILE + i]` times element `d` of token `i`, for the `g`
    /// heads ([`simd::pv_transposed`], on runs of at most 16 tokens consecutive in memory).
    /// `pf`: the tokens and head of the step read later, whose runs are prefetched meanwhile.
    #[allow(clippy::too_many_arguments)]
    fn pv_transposed(
        &self,
        offs: &[u64],
        h: u64,
        pf: (&[u64], u64),
        w: &[f32],
        g: usize,
        acc: &mut [f32],
        stride: usize,
    ) {
        let src = &self.v;
        let mut runs = [(0usize, 0usize, 0usize); TILE];
        let mut pf_runs = [(0usize, 0usize, 0usize); TILE];
        let n = self.transposed_runs(offs, h, &mut runs);
        let pf_n = self.transposed_runs(pf.0, pf.1, &mut pf_runs);
        simd::pv_transposed(
            self.isa,
            src.kind,
            self.v_raw,
            src.buf,
            &runs[..n],
            &pf_runs[..pf_n],
            src.map.strides.dim as usize,
            src.map.width as usize,
            w,
            TILE,
            g,
            acc,
            stride,
        );
    }

    /// The runs of head `h` of a tile's transposed values (`offs`: head 0 of each token):
    /// `(byte offset, first token, tokens)` for at most 16 tokens consecutive in memory each.
    /// Returns how many.
    fn transposed_runs(&self, offs: &[u64], h: u64, runs: &mut [(usize, usize, usize)]) -> usize {
        let e = self.v.map.elem_bytes() as usize;
        let hs = h * self.v.map.strides.head;
        let mut n = 0usize;
        for (i, &off) in offs.iter().enumerate() {
            let at = (off + hs) as usize;
            // Token `i` extends the last run when it lies right after it in memory.
            if let Some((o, _, len)) = n.checked_sub(1).map(|r| runs[r]) {
                if len < 16 && at == o + len * e {
                    runs[n - 1].2 += 1;
                    continue;
                }
            }
            runs[n] = (at, i, 1);
            n += 1;
        }
        n
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
        let (g, qk, vw) = (self.shape.group, self.shape.qk_width, self.shape.v_width);
        let (qstride, vstride) = (self.k.padded, self.v.padded);
        let sw = self.record();
        let nh = heads.len();
        for state in states[..nh * sw].chunks_exact_mut(sw) {
            state[..g].fill(f32::NEG_INFINITY);
            state[g..].fill(0.0);
        }
        if range.is_empty() {
            return;
        }
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
        let v_in_place = self.v.transposed() && simd::reads_transposed(self.isa);
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
        let cap = self.d.params.soft_cap;
        let adjust = self.k_inline.is_some() || cap.is_some() || self.l_scale != 1.0;
        let (k_span, v_span) = (self.k.span(&heads), self.v.span(&heads));
        // The current tile and the next one (whose rows are prefetched meanwhile).
        let mut tiles: [Tile; 2] = Default::default();
        let mut start = range.start;
        for t in tiles.iter_mut() {
            self.next_tile(seq, &range, &mut start, &mut after, t);
        }
        let mut c = 0;
        while tiles[c].n > 0 && !tiles[c].lookahead {
            let (cur, next) = (&tiles[c], &tiles[1 - c]);
            let nt = cur.n;
            // Contiguous rows of this tile and the next, each checked for every head of the
            // item; gathered rows are filled per head below.
            let mut kcur = RowSet::new(k_span);
            let mut vcur = RowSet::new(v_span);
            let mut knext = RowSet::new(k_span);
            let mut vnext = RowSet::new(v_span);
            if self.k.rows != Rows::Gathered {
                self.k.direct_rows(&cur.k[..nt], &heads, &mut kcur);
                self.k.direct_rows(&next.k[..next.n], &heads, &mut knext);
            }
            if self.v.rows == Rows::Direct {
                self.v.direct_rows(&cur.v[..nt], &heads, &mut vcur);
                self.v.direct_rows(&next.v[..next.n], &heads, &mut vnext);
            }
            for (hh, state) in heads.clone().zip(states[..nh * sw].chunks_exact_mut(sw)) {
                let h = hh as u64;
                // The kernels prefetch the rows read `PREFETCH_AHEAD` (tile, head) steps later:
                // a later head of this tile, or a head of the next one.
                let ahead = hh - heads.start + PREFETCH_AHEAD;
                let (kpf, vpf, pf_head) = if ahead < nh {
                    (&kcur, &vcur, ahead)
                } else {
                    (&knext, &vnext, (ahead - nh).min(nh - 1))
                };
                let q = &q[(hh - heads.start) * g * qstride..(hh - heads.start + 1) * g * qstride];
                let (stats, acc) = state.split_at_mut(2 * g);
                let maxes = &mut stats[..g];
                let item_head = hh - heads.start;
                let sums =
                    &mut lane_sums[item_head * g * SUM_LANES..(item_head + 1) * g * SUM_LANES];
                // Logits of the tile: logits[j * TILE + i].
                let khoff = (hh - heads.start) * self.k.map.strides.head as usize;
                if self.k.rows == Rows::Split {
                    simd::qk_tile_split(
                        self.isa,
                        self.k.kind,
                        self.k.fold.is_some(),
                        &kcur,
                        kpf,
                        khoff,
                        pf_head * self.k.map.strides.head as usize,
                        qk,
                        self.k.map.strides.dim_chunk as usize,
                        q,
                        qstride,
                        g,
                        logits,
                        TILE,
                    );
                } else {
                    let gathered;
                    let (krows, hoff) = match self.k.rows {
                        Rows::Direct => (&kcur, khoff),
                        // (Split keys are read above.)
                        Rows::Gathered | Rows::Split => {
                            gathered = self.k.gather_tile(&cur.k[..nt], h, k_gathered);
                            (&gathered, 0)
                        }
                    };
                    simd::qk_tile(
                        self.isa,
                        self.k.kind,
                        self.k.fold.is_some(),
                        krows,
                        kpf,
                        hoff,
                        pf_head * self.k.map.strides.head as usize,
                        qk,
                        q,
                        qstride,
                        g,
                        logits,
                        TILE,
                        widen,
                    );
                }
                if adjust {
                    if let Some(src) = &self.k_inline {
                        let hs = h * src.map.strides.head;
                        for (x, &off) in kscale.iter_mut().zip(&cur.ks[..nt]) {
                            *x = src.f32_at(off + hs) * self.l_scale;
                        }
                    } else {
                        kscale[..nt].fill(self.l_scale);
                    }
                    simd::adjust_logits(self.isa, nt, g, logits, TILE, &kscale[..nt], cap);
                }
                let vs = if let Some(src) = &self.v_inline {
                    let hs = h * src.map.strides.head;
                    for (x, &off) in vscale.iter_mut().zip(&cur.vs[..nt]) {
                        *x = src.f32_at(off + hs);
                    }
                    Some(&vscale[..nt])
                } else {
                    None
                };
                simd::softmax_tile(
                    self.isa,
                    self.v.order.bf16_operands(),
                    nt,
                    g,
                    logits,
                    TILE,
                    self.w_scale,
                    vs,
                    maxes,
                    sums,
                    acc,
                    vstride,
                );
                // Values: acc[j] += sum_i w[j * TILE + i] * v_i.
                if v_in_place {
                    let pf_tile = if ahead < nh { cur } else { next };
                    let pf = (&pf_tile.v[..pf_tile.n], (heads.start + pf_head) as u64);
                    self.pv_transposed(&cur.v[..nt], h, pf, logits, g, acc, vstride);
                    continue;
                }
                let gathered;
                let (vrows, hoff) = match self.v.rows {
                    Rows::Direct => (&vcur, (hh - heads.start) * self.v.map.strides.head as usize),
                    // (Values are never split.)
                    Rows::Gathered | Rows::Split => {
                        gathered = self.v.gather_tile(&cur.v[..nt], h, v_gathered);
                        (&gathered, 0)
                    }
                };
                simd::pv_tile(
                    self.isa,
                    self.v.kind,
                    self.v_raw,
                    vrows,
                    vpf,
                    hoff,
                    pf_head * self.v.map.strides.head as usize,
                    vw,
                    logits,
                    TILE,
                    g,
                    acc,
                    vstride,
                    widen,
                );
            }
            self.next_tile(seq, &range, &mut start, &mut after, &mut tiles[c]);
            c = 1 - c;
        }
        // Each query head's running sum: the sum of its partial sums.
        for (state, parts) in states[..nh * sw]
            .chunks_exact_mut(sw)
            .zip(lane_sums.chunks_exact(g * SUM_LANES))
        {
            for (sum, lanes) in state[g..2 * g]
                .iter_mut()
                .zip(parts.chunks_exact(SUM_LANES))
            {
                *sum = lanes.iter().sum();
            }
        }
    }
}
