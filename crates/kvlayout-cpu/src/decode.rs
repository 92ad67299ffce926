//! Fast path of `paged_decode`.
//!
//! A work item is a sequence and a range of KV heads — all of them when the page is token-major
//! (so a page is consumed whole before the next), one when it is head-major — each with the
//! whole GQA group of query heads sharing it, so every K and V row is read once. When there
//! are too few items to keep every thread busy, each item's context is also split into
//! partitions whose partial softmax states are reduced afterwards (flash-decoding).
//!
//! An item runs an online softmax over tiles of up to [`TILE`] tokens (a tile may span blocks:
//! its rows are located token by token through the block table and the field maps). Per tile
//! and KV head: the logits of all rows against all query heads of the group (one kernel call),
//! one vectorized max/exp/sum pass, then the value rows accumulated into the group's
//! accumulators (one kernel call). Rows are addressed only through the layout's field maps.
//! Contiguous rows of every dtype (f32, f16, bf16, fp8, int8) are read in place and widened
//! in registers; other rows (x-split legacy keys, any non-unit element stride) are first
//! copied through the strides into contiguous rows of the same dtype and go through the same
//! kernels. Transposed values (the legacy vLLM value) are read in place on AVX-512 by a kernel
//! of their own ([`Plan::pv_transposed`]), copied elsewhere. The rows a few (tile, head) steps
//! ahead are prefetched while the current ones are computed ([`PREFETCH_AHEAD`]).
//!
//! Per-tensor scales fold into the query (`k_scale`) and the final normalization (`v_scale`);
//! inline scales multiply the logits and the weights per token; the power of two the fp8
//! kernels leave out is folded the same way (see [`simd::fp8_fold`]). Scratch lives in
//! per-thread buffers and a partials buffer kept by the backend, so a decode step allocates
//! nothing once they have grown.

use std::cell::RefCell;
use std::ops::Range;

use kvlayout::ops::OpError;
use kvlayout::{Content, DType, Field, FieldMap};
use rayon::prelude::*;

use crate::args::{check_decode, Decode, DecodeShape};
use crate::backend::CpuBackend;
use crate::cache::CacheRef;
use crate::elem::decode;
use crate::simd::{self, Isa, Order, Role, RowKind, RowSet, SUM_LANES, TILE};

/// How many (tile, head) steps ahead the rows are prefetched (into L1 or L2, see
/// [`simd::PrefetchLevel`]): far enough to hide the memory latency, near enough that the
/// prefetched rows are still there when read (1, 3, 4 and 8 measured slower on Zen, 3 to 8
/// on a Xeon; the whole next tile, an earlier choice, thrashes L2 once a tile of all heads is
/// 512 KiB).
const PREFETCH_AHEAD: usize = 2;

/// Bytes of one L1 way (48 KiB 12-way and 32 KiB 8-way alike): rows this far apart share
/// the same sets.
const L1_WAY: u64 = 4096;

/// Tokens per tile for rows `slot` bytes apart, sized to the cache the kernels prefetch into
/// ([`simd::PrefetchLevel`]). Into L1: at most 8 rows of a (tile, head) step in any L1 set, so
/// the step's rows and the ones prefetched for a later step stay in L1. Head-major pages
/// (bf16: 512-byte rows) keep whole tiles of 64; token-major pages whose token rows are 4 KiB
/// apart get tiles of 8 (measured on Zen: bf16 NHD 0.48 -> 0.74 of read bandwidth). Into L2,
/// whose sets repeat every 64 KiB or more, whole tiles: fewer steps, so less of the per-step
/// work (the softmax step, the accumulators' loads and stores), which on the Xeon measured
/// read token-major caches faster (fp8 NHD 0.35 with 16 tokens, 0.45 with 64).
fn tile_len(slot: u64, level: simd::PrefetchLevel) -> u64 {
    if level == simd::PrefetchLevel::L2 {
        return TILE as u64;
    }
    let mut a = slot % L1_WAY;
    let mut b = L1_WAY;
    while a != 0 {
        (a, b) = (b % a, a);
    }
    // `b` = gcd(slot, L1_WAY): the rows take `L1_WAY / b` distinct set offsets.
    (8 * (L1_WAY / b)).clamp(8, TILE as u64)
}

/// Fewest tokens worth a partition of its own.
const MIN_PARTITION: u64 = 128;

/// How a field's rows are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// Contiguous rows: read in place, widened by the kernels.
    Direct,
    /// Anything else: copied element by element through the strides into contiguous rows
    /// of the same dtype, then read as direct rows are.
    Gathered,
}

fn rows_of(m: &FieldMap) -> Rows {
    if m.strides.dim == m.elem_bytes() && m.strides.dim_split == m.width {
        Rows::Direct
    } else {
        Rows::Gathered
    }
}

/// The kernels' row kind of a field's dtype (raw bytes hold no keys or values).
fn row_kind(dtype: DType) -> Result<RowKind, OpError> {
    Ok(match dtype {
        DType::F32 => RowKind::F32,
        DType::F16 => RowKind::F16,
        DType::Bf16 => RowKind::Bf16,
        DType::Fp8E4m3 => RowKind::Fp8E4m3,
        DType::Fp8E5m2 => RowKind::Fp8E5m2,
        DType::Int8 => RowKind::I8,
        DType::U8 => {
            return Err(OpError::Unsupported {
                op: "paged_decode",
                reason: "raw bytes (dtype u8) hold no keys or values".into(),
            })
        }
    })
}

/// One field the decode reads: its map, buffer, how its rows are read and the kernels' view
/// of them.
#[derive(Clone, Copy)]
struct Src<'a> {
    map: FieldMap,
    buf: &'a [u8],
    rows: Rows,
    /// The kind the kernels see (gathered rows too: they keep their dtype).
    kind: RowKind,
    /// The kernels' element order for this field.
    order: Order,
    /// `width` padded to the order's blocks.
    padded: usize,
    /// fp8 rows read without their power of two, whose square root is this (see
    /// `simd::fp8_fold`).
    fold: Option<f32>,
}

impl<'a> Src<'a> {
    fn new(cache: &CacheRef<'a>, map: FieldMap, isa: Isa, role: Role) -> Result<Self, OpError> {
        let rows = rows_of(&map);
        let kind = row_kind(map.dtype)?;
        let order = Order::of(isa, kind, role);
        Ok(Src {
            map,
            buf: cache.buffers[map.strides.buffer as usize],
            rows,
            kind,
            order,
            padded: order.padded(map.width as usize),
            fold: simd::fp8_fold(isa, kind),
        })
    }

    /// Byte offset of `(layer, block, head 0, slot, d 0)`.
    fn slot_offset(&self, layer: u64, block: u64, slot: u64) -> u64 {
        let s = &self.map.strides;
        s.base_offset + layer * s.layer + block * s.block + slot * s.slot
    }

    /// Bytes of a contiguous row.
    fn row_len(&self) -> usize {
        self.map.width as usize * self.map.elem_bytes() as usize
    }

    /// The f32 stored at `off` (inline scales).
    fn f32_at(&self, off: u64) -> f32 {
        let off = off as usize;
        decode(DType::F32, &self.buf[off..off + 4])
    }

    /// Copies the rows of head `head` of a tile (`offs`: head 0 of each token) through the
    /// strides into `buf`, one contiguous row of the field's dtype after the other, and
    /// returns them.
    fn gather_tile<'r>(&self, offs: &[u64], head: u64, buf: &'r mut [f32]) -> RowSet<'r> {
        let e = self.map.elem_bytes() as usize;
        let row = self.map.width as usize * e;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let rows = &mut bytes[..offs.len() * row];
        match e {
            1 => self.gather_with::<1>(offs, head, rows),
            2 => self.gather_with::<2>(offs, head, rows),
            _ => self.gather_with::<4>(offs, head, rows),
        }
        let rows: &'r [u8] = rows;
        let mut set = RowSet::new(row);
        for i in 0..offs.len() {
            set.push(rows, i * row);
        }
        set
    }

    /// [`Src::gather_tile`] for elements of `E` bytes. Element `d` of a row lies at
    /// `(d / split) * chunk + (d % split) * dim` from its start; the loops walk the chunks
    /// and their elements (no division per element). A chunk whose elements are contiguous
    /// (the x-split legacy key: 16 bytes) is copied whole. When consecutive tokens of the
    /// tile are consecutive in memory (`slot == E`: the transposed legacy value), each
    /// element index is copied across a run of tokens at once, in address order.
    fn gather_with<const E: usize>(&self, offs: &[u64], head: u64, rows: &mut [u8]) {
        let s = &self.map.strides;
        let w = self.map.width as usize;
        let (split, chunk, dim) = (s.dim_split as usize, s.dim_chunk as usize, s.dim as usize);
        let hs = (head * s.head) as usize;
        let elem =
            |buf: &[u8], at: usize| -> [u8; E] { buf[at..at + E].try_into().expect("E bytes") };
        // Runs of the tile's tokens whose rows follow each other `slot` bytes apart.
        let runs = |step: u64, f: &mut dyn FnMut(usize, usize, usize)| {
            let mut i0 = 0;
            while i0 < offs.len() {
                let mut i1 = i0 + 1;
                while i1 < offs.len() && offs[i1] == offs[i1 - 1] + step {
                    i1 += 1;
                }
                f(i0, i1, offs[i0] as usize + hs);
                i0 = i1;
            }
        };
        if s.slot as usize == E && dim != E {
            runs(E as u64, &mut |i0, i1, base| {
                let dst = &mut rows[i0 * w * E..i1 * w * E];
                for c in 0..w.div_ceil(split) {
                    for j in 0..split.min(w - c * split) {
                        let (d, p) = (c * split + j, base + c * chunk + j * dim);
                        let src = &self.buf[p..p + (i1 - i0) * E];
                        // Token t's element d: column d of the run's rows.
                        for (row, x) in dst.chunks_exact_mut(w * E).zip(src.chunks_exact(E)) {
                            row[d * E..(d + 1) * E].copy_from_slice(x);
                        }
                    }
                }
            });
            return;
        }
        let piece = split * E;
        if dim == E && s.slot as usize == piece && w.is_multiple_of(split) {
            // Contiguous pieces of `split` elements whose tokens lie side by side (the
            // x-split legacy key: 16 bytes): copied piece by piece across a run of tokens.
            runs(piece as u64, &mut |i0, i1, base| {
                let dst = &mut rows[i0 * w * E..i1 * w * E];
                for c in 0..w / split {
                    let p = base + c * chunk;
                    let src = &self.buf[p..p + (i1 - i0) * piece];
                    for (row, x) in dst.chunks_exact_mut(w * E).zip(src.chunks_exact(piece)) {
                        copy_piece(&mut row[c * piece..(c + 1) * piece], x);
                    }
                }
            });
            return;
        }
        for (&off, out) in offs.iter().zip(rows.chunks_exact_mut(w * E)) {
            let base = off as usize + hs;
            for (c, out) in out.chunks_mut(piece).enumerate() {
                let p = base + c * chunk;
                if dim == E {
                    copy_piece(out, &self.buf[p..p + out.len()]);
                } else {
                    for (j, o) in out.chunks_exact_mut(E).enumerate() {
                        o.copy_from_slice(&elem(self.buf, p + j * dim));
                    }
                }
            }
        }
    }

    /// Whether the rows are transposed (the legacy vLLM value): each element index holds a
    /// block's tokens side by side (`slot` = one element), so a run of the tile's tokens
    /// consecutive in memory is, per element index, one contiguous run of values.
    fn transposed(&self) -> bool {
        let (s, e) = (&self.map.strides, self.map.elem_bytes());
        self.rows == Rows::Gathered && s.slot == e && s.dim_split == self.map.width && s.dim != e
    }

    /// The contiguous rows of a tile (`offs`: head 0 of each token) for the heads `heads`:
    /// each row checked to span all of them.
    fn direct_rows(&self, offs: &[u64], heads: &Range<usize>, rows: &mut RowSet<'a>) {
        let hs = self.map.strides.head;
        let first = heads.start as u64 * hs;
        for &off in offs {
            rows.push(self.buf, (off + first) as usize);
        }
    }

    /// Bytes from the first head's row of an item to the end of its last head's row.
    fn span(&self, heads: &Range<usize>) -> usize {
        (heads.len() - 1) * self.map.strides.head as usize + self.row_len()
    }
}

/// `dst = src` (equal lengths); the 16-byte pieces of x-split keys without a `memcpy` call.
#[inline]
fn copy_piece(dst: &mut [u8], src: &[u8]) {
    match (
        <&mut [u8; 16]>::try_from(&mut *dst),
        <&[u8; 16]>::try_from(src),
    ) {
        (Ok(d), Ok(s)) => *d = *s,
        _ => dst.copy_from_slice(src),
    }
}

/// Where the tokens of one tile live: per token, the byte offset of head 0 of its slot in
/// each field.
struct Tile {
    n: usize,
    /// One past the tile's last token.
    end: u64,
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
            k: [0; TILE],
            v: [0; TILE],
            ks: [0; TILE],
            vs: [0; TILE],
        }
    }
}

/// Everything an item needs, derived once per call from the layout.
struct Plan<'a> {
    d: &'a Decode<'a>,
    shape: DecodeShape,
    isa: Isa,
    k: Src<'a>,
    v: Src<'a>,
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
    out_scale: f32,
    block_size: u64,
    /// Tokens per tile ([`tile_len`]).
    tile_len: u64,
}

#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    logits: Vec<f32>,
    kscale: Vec<f32>,
    vscale: Vec<f32>,
    /// A tile's gathered key rows, then its value rows: bytes of their dtype, at most four
    /// per element, kept in f32 storage.
    rows: Vec<f32>,
    widen: Vec<f32>,
    /// Transposed values read in place: a tile's contribution to the group's accumulators.
    transposed: Vec<f32>,
    state: Vec<f32>,
    /// Partial softmax sums of the item's heads, `SUM_LANES` per query head.
    lane_sums: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

impl<'a> Plan<'a> {
    /// The plan of a validated decode.
    fn new(
        cache: &CacheRef<'a>,
        d: &'a Decode<'a>,
        shape: DecodeShape,
        isa: Isa,
    ) -> Result<Self, OpError> {
        let layout = cache.layout;
        let k = Src::new(cache, layout.field_map(Field::K)?, isa, Role::Key)?;
        let v = Src::new(cache, layout.field_map(Field::V)?, isa, Role::Value)?;
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
        let tile_len = tile_len(k.map.strides.slot, simd::prefetch_level());
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
    fn record(&self) -> usize {
        self.shape.group * (2 + self.v.padded)
    }

    /// The values of head `h` of a tile (`offs`: head 0 of each token) whose rows are
    /// transposed ([`Src::transposed`]), read in place: `out[j * width + d]` = the sum over
    /// the tile's tokens of `w[j * TILE + i]` times element `d` of token `i`, for the `g`
    /// heads ([`simd::pv_transposed`], on runs of at most 16 tokens consecutive in memory).
    fn pv_transposed(&self, offs: &[u64], h: u64, w: &[f32], g: usize, out: &mut [f32]) {
        let src = &self.v;
        let e = src.map.elem_bytes();
        let hs = h * src.map.strides.head;
        let mut runs = [(0usize, 0usize, 0usize); TILE];
        let mut n = 0usize;
        for (i, &off) in offs.iter().enumerate() {
            let at = (off + hs) as usize;
            // Token `i` extends the last run when it lies right after it in memory.
            if let Some((o, _, len)) = n.checked_sub(1).map(|r| runs[r]) {
                if len < 16 && at == o + len * e as usize {
                    runs[n - 1].2 += 1;
                    continue;
                }
            }
            runs[n] = (at, i, 1);
            n += 1;
        }
        simd::pv_transposed(
            self.isa,
            src.kind,
            self.v_raw,
            src.buf,
            &runs[..n],
            src.map.strides.dim as usize,
            src.map.width as usize,
            w,
            TILE,
            g,
            out,
        );
    }

    /// Online softmax of the KV heads `heads` over tokens `range` of sequence `seq`, tile by
    /// tile, every head of the range on each tile (so a token-major page is consumed whole).
    /// Writes one record (see [`Plan::record`]) per head into `states`; accumulators are in
    /// the value kernels' order.
    fn run(
        &self,
        seq: usize,
        heads: Range<usize>,
        range: Range<u64>,
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
            transposed,
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
        grow(transposed, g * vw);
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
            let end = (start + self.tile_len).min(range.end);
            self.tile(seq, start..end, t);
            start = end;
        }
        let mut c = 0;
        while tiles[c].n > 0 {
            let (cur, next) = (&tiles[c], &tiles[1 - c]);
            let nt = cur.n;
            // Contiguous rows of this tile and the next, each checked for every head of the
            // item; gathered rows are filled per head below.
            let mut kcur = RowSet::new(k_span);
            let mut vcur = RowSet::new(v_span);
            let mut knext = RowSet::new(k_span);
            let mut vnext = RowSet::new(v_span);
            if self.k.rows == Rows::Direct {
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
                let gathered;
                let (krows, hoff) = match self.k.rows {
                    Rows::Direct => (&kcur, (hh - heads.start) * self.k.map.strides.head as usize),
                    Rows::Gathered => {
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
                if adjust {
                    if let Some(src) = &self.k_inline {
                        let hs = h * src.map.strides.head;
                        for (x, &off) in kscale.iter_mut().zip(&cur.ks[..nt]) {
                            *x = src.f32_at(off + hs) * self.l_scale;
                        }
                    } else {
                        kscale[..nt].fill(self.l_scale);
                    }
                    for j in 0..g {
                        let l = &mut logits[j * TILE..j * TILE + nt];
                        for (l, ks) in l.iter_mut().zip(&kscale[..nt]) {
                            *l *= ks;
                            if let Some(c) = cap {
                                *l = c * (*l / c).tanh();
                            }
                        }
                    }
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
                    let out = &mut transposed[..g * vw];
                    self.pv_transposed(&cur.v[..nt], h, logits, g, out);
                    for (o, a) in out.chunks_exact(vw).zip(acc.chunks_exact_mut(vstride)) {
                        self.v.order.add_to(o, a);
                    }
                    continue;
                }
                let gathered;
                let (vrows, hoff) = match self.v.rows {
                    Rows::Direct => (&vcur, (hh - heads.start) * self.v.map.strides.head as usize),
                    Rows::Gathered => {
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
            let end = (start + self.tile_len).min(range.end);
            self.tile(seq, start..end, &mut tiles[c]);
            start = end;
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

/// Final output of a group from its record `[max; g][sum; g][acc; g * s]`: each accumulator
/// row times `f / sum`, back in natural order.
fn finish(state: &[f32], g: usize, vw: usize, s: usize, order: Order, f: f32, out: &mut [f32]) {
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

/// Combines the partial records of `parts` partitions of one KV head: each rescaled to the
/// global maximum, summed, then finished as one record in `tmp` (a record long).
#[allow(clippy::too_many_arguments)]
fn combine<'p>(
    parts: usize,
    g: usize,
    vw: usize,
    s: usize,
    order: Order,
    f: f32,
    rec: impl Fn(usize) -> &'p [f32],
    tmp: &mut [f32],
    o: &mut [f32],
) {
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
                let c = (r[j] - m).exp();
                sum += r[g + j] * c;
                for (x, a) in acc.iter_mut().zip(&r[2 * g + j * s..2 * g + (j + 1) * s]) {
                    *x += a * c;
                }
            }
        }
        tmp[g + j] = sum;
    }
    finish(tmp, g, vw, s, order, f, o);
}

pub(crate) fn paged_decode(
    be: &CpuBackend,
    cache: &CacheRef<'_>,
    d: &Decode<'_>,
    out: &mut [f32],
) -> Result<(), OpError> {
    decode_with(be, cache, d, out, Options::default())
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
/// to the pool and waiting for it costs tens of microseconds on the virtual machines measured
/// (most of the step of one sequence of 128 tokens), more than splitting so little work saves.
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
    let layout = cache.layout;
    let plan = Plan::new(cache, d, shape, opts.isa.unwrap_or_else(simd::detect))?;
    let kv_heads = layout.geometry().num_kv_heads as usize;
    let (g, vw, vs) = (shape.group, shape.v_width, plan.v.padded);
    let rec = plan.record();
    // When a block's page holds all its heads (token- or head-major), one item takes all
    // heads of a sequence, so each page is read whole, in address order, head after head.
    // Heads outside the blocks: one head per item.
    let hpi = if plan.k.map.strides.head < plan.k.map.strides.block {
        kv_heads
    } else {
        1
    };
    let items = shape.seqs * (kv_heads / hpi);
    let range_of = |seq: usize| {
        let len = u64::from(d.seq_lens[seq]);
        d.params.sliding_window.map_or(0, |w| len.saturating_sub(w))..len
    };
    let head_range = |item: usize| {
        let h0 = (item % (kv_heads / hpi)) * hpi;
        h0..h0 + hpi
    };
    let seq_of = |item: usize| item / (kv_heads / hpi);
    // The longest context and the whole step's token x KV-head pairs.
    let (longest, tokens) = (0..shape.seqs)
        .map(|s| range_of(s).end - range_of(s).start)
        .fold((0, 0), |(m, t), n| (m.max(n), t + n));
    let work = tokens * kv_heads as u64;
    let inline = opts.inline.unwrap_or(work < INLINE_WORK);
    let parts = opts.partitions.unwrap_or_else(|| {
        let target = 4 * be.threads();
        if inline || items >= target {
            1
        } else {
            target
                .div_ceil(items.max(1))
                .min(longest.div_ceil(MIN_PARTITION).max(1) as usize)
        }
    });
    let (order, f) = (plan.v.order, plan.out_scale);
    let mut step = || {
        if parts <= 1 {
            each_chunk(inline, out, hpi * g * vw, |item, o| {
                SCRATCH.with(|s| {
                    let s = &mut *s.borrow_mut();
                    let mut state = std::mem::take(&mut s.state);
                    grow(&mut state, hpi * rec);
                    let seq = seq_of(item);
                    plan.run(
                        seq,
                        head_range(item),
                        range_of(seq),
                        &mut state[..hpi * rec],
                        s,
                    );
                    for (st, o) in state[..hpi * rec]
                        .chunks_exact(rec)
                        .zip(o.chunks_exact_mut(g * vw))
                    {
                        finish(st, g, vw, vs, order, f, o);
                    }
                    s.state = state;
                });
            });
        } else {
            let mut partials = be.decode_partials.lock().unwrap_or_else(|e| e.into_inner());
            let n = items * parts * hpi * rec;
            grow(&mut partials, n);
            each_chunk(inline, &mut partials[..n], hpi * rec, |i, st| {
                let (item, part) = (i / parts, i % parts);
                let r = range_of(seq_of(item));
                let per = (r.end - r.start).div_ceil(parts as u64);
                let a = (r.start + part as u64 * per).min(r.end);
                let b = (a + per).min(r.end);
                SCRATCH.with(|s| {
                    plan.run(
                        seq_of(item),
                        head_range(item),
                        a..b,
                        st,
                        &mut s.borrow_mut(),
                    )
                });
            });
            let partials = &partials[..n];
            each_chunk(inline, out, g * vw, |head_item, o| {
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
                    combine(parts, g, vw, vs, order, f, rec_of, &mut s.state[..rec], o);
                });
            });
        }
    };
    if inline {
        step();
    } else {
        be.pool.install(step);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{reference, Activations, DecodeParams, HostCache, WriteKv};
    use half::{bf16, f16};
    use kvlayout::KvCacheLayout;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(747796405).wrapping_add(2891336453);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 500.0 - 2.0
            })
            .collect()
    }

    #[derive(Clone)]
    struct Case {
        spec: String,
        q_heads: u64,
        lens: Vec<u32>,
        window: Option<u64>,
        cap: Option<f32>,
        layer: u64,
        /// Query activations: 0 f32, 1 f16, 2 bf16.
        query: u8,
        /// Also force this many partitions (besides none and one).
        parts: usize,
    }

    fn case(spec: &str, q_heads: u64, lens: &[u32]) -> Case {
        Case {
            spec: spec.into(),
            q_heads,
            lens: lens.to_vec(),
            window: None,
            cap: None,
            layer: 0,
            query: 0,
            parts: 3,
        }
    }

    /// The fast path on every instruction set of this machine, with and without forced
    /// context partitions, against the scalar f64 reference on the same cache. The reference
    /// reads the same stored values, so the only differences are f32 accumulation and, in the
    /// bf16-operand kernels, the bf16 query and weights: see [`tolerance`] (both tighter than
    /// a quantization step).
    fn run_case(c: &Case) {
        let l: KvCacheLayout = c.spec.parse().unwrap();
        let g = *l.geometry();
        let (kw, vw, mla) = match *l.content() {
            Content::Kv {
                head_size,
                head_size_v,
            }
            | Content::KvScaled {
                head_size,
                head_size_v,
            } => (head_size as usize, head_size_v as usize, false),
            Content::Mla {
                kv_lora_rank,
                rope_dim,
            } => (
                (kv_lora_rank + rope_dim) as usize,
                kv_lora_rank as usize,
                true,
            ),
            _ => unreachable!(),
        };
        let heads = g.num_kv_heads as usize;
        let bs = g.block_size as usize;
        let seqs = c.lens.len();
        let per_seq = c
            .lens
            .iter()
            .map(|l| (*l as usize).div_ceil(bs))
            .max()
            .unwrap_or(0)
            .max(1);
        assert!(
            seqs * per_seq <= g.num_blocks as usize,
            "case needs more blocks"
        );
        // Sequence s owns blocks in a scrambled order.
        let nb = seqs * per_seq;
        let table: Vec<i32> = (0..nb).map(|i| (nb - 1 - (i + 3) % nb) as i32).collect();
        let mut cache = HostCache::new(l.clone()).unwrap();
        cache.fill(0x3c); // other layers and unused slots: finite values
        let mut slots = Vec::new();
        for (s, len) in c.lens.iter().enumerate() {
            for t in 0..*len as usize {
                slots.push(i64::from(table[s * per_seq + t / bs]) * bs as i64 + (t % bs) as i64);
            }
        }
        let k = data(slots.len() * heads * kw, 1);
        let v = data(slots.len() * heads * vw, 2);
        let w = WriteKv {
            layer: c.layer,
            key: Activations::F32(&k),
            value: (!mla).then_some(Activations::F32(&v)),
            slot_mapping: &slots,
        };
        reference::write_kv(&mut cache.as_mut(), &w).unwrap();
        let q = data(seqs * c.q_heads as usize * kw, 3);
        let q16: Vec<f16> = q.iter().map(|x| f16::from_f32(*x)).collect();
        let qb16: Vec<bf16> = q.iter().map(|x| bf16::from_f32(*x)).collect();
        let d = Decode {
            layer: c.layer,
            query: match c.query {
                0 => Activations::F32(&q),
                1 => Activations::F16(&q16),
                _ => Activations::Bf16(&qb16),
            },
            block_table: &table,
            blocks_per_seq: per_seq,
            seq_lens: &c.lens,
            params: DecodeParams {
                num_q_heads: c.q_heads,
                scale: 1.0 / (kw as f32).sqrt(),
                sliding_window: c.window,
                soft_cap: c.cap,
            },
        };
        let n = seqs * c.q_heads as usize * vw;
        let mut want = vec![0f32; n];
        reference::paged_decode(&cache.as_ref(), &d, &mut want).unwrap();
        let be = CpuBackend::new(Some(2));
        // Default partitions and thread; one partition and several, on the pool and on the
        // calling thread.
        let runs = [
            (None, None),
            (Some(1), Some(false)),
            (Some(c.parts), Some(false)),
            (Some(1), Some(true)),
            (Some(c.parts), Some(true)),
        ];
        for (isa, (parts, inline)) in simd::available()
            .into_iter()
            .flat_map(|isa| runs.map(|r| (isa, r)))
        {
            let mut got = vec![f32::NAN; n];
            let opts = Options {
                partitions: parts,
                isa: Some(isa),
                inline,
            };
            decode_with(&be, &cache.as_ref(), &d, &mut got, opts).unwrap();
            let tol = tolerance(isa, l.dtype());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= tol * b.abs().max(1.0),
                    "{} {isa:?} parts {parts:?} inline {inline:?}: out[{i}] = {a}, reference {b}",
                    c.spec
                );
            }
        }
    }

    /// Relative to `max(1, |reference|)`. f32 products: `1e-5`. Products with bf16 operands
    /// (the scaled query and the weights rounded to bf16, 2^-9 relative each, so a logit
    /// moves by about 2^-9 x its terms' spread): `1e-2`, half the bf16 tolerance
    /// (these cases stay under 5e-3).
    fn tolerance(isa: Isa, dtype: DType) -> f32 {
        let kind = match dtype {
            DType::Bf16 => RowKind::Bf16,
            DType::Fp8E4m3 => RowKind::Fp8E4m3,
            DType::Fp8E5m2 => RowKind::Fp8E5m2,
            _ => RowKind::F32,
        };
        if isa.bf16_operands(kind) {
            1e-2
        } else {
            1e-5
        }
    }

    const DTYPES: [&str; 5] = ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"];

    #[test]
    fn layouts_and_dtypes_match_reference() {
        let lens = [37, 0, 16, 70];
        for dtype in DTYPES {
            for placement in [
                "order=NHD",
                "order=HND",
                "order=BLNHC page=65536",
                "order=HLBNC", // heads outside the blocks: one head per item
                "order=NHD base=192",
                "legacy=vllm-paged-v1", // x-split keys, transposed values: gathered rows
                "legacy=flash-attn-hnd",
                "legacy=flashinfer-nhd",
                "legacy=separate-nhd",
            ] {
                run_case(&case(
                    &format!("kv L=1 B=24 N=16 H=2 D=32 dtype={dtype} {placement}"),
                    8,
                    &lens,
                ));
            }
        }
    }

    #[test]
    fn inline_and_tensor_scales() {
        let lens = [37, 0, 16, 70];
        for spec in [
            "kv-scaled L=1 B=24 N=16 H=2 D=32 dtype=int8 order=NHD",
            "kv-scaled L=1 B=24 N=16 H=2 D=96 dtype=int8 order=HND",
            "kv-scaled L=1 B=24 N=16 H=2 D=32 dtype=fp8_e4m3 order=HND",
            "kv-scaled L=1 B=24 N=16 H=2 D=80 dtype=fp8_e5m2 order=NHD",
            "kv L=1 B=24 N=16 H=2 D=32 dtype=fp8_e4m3 order=NHD k_scale=0.5 v_scale=2.0",
            "kv L=1 B=24 N=16 H=2 D=48 dtype=fp8_e5m2 order=HND k_scale=4 v_scale=0.25",
            "kv L=1 B=24 N=16 H=2 D=32 dtype=bf16 order=NHD k_scale=0.5 v_scale=3.0",
            "kv L=1 B=24 N=16 H=2 D=32 dtype=int8 order=NHD",
        ] {
            run_case(&case(spec, 4, &lens));
        }
    }

    #[test]
    fn head_sizes_groups_and_mla() {
        for dtype in DTYPES {
            for d in [32, 64, 80, 96, 112, 120, 128, 192, 256] {
                run_case(&case(
                    &format!("kv L=1 B=8 N=16 H=2 D={d} dtype={dtype} order=NHD"),
                    8,
                    &[40, 9],
                ));
            }
            run_case(&case(
                &format!("kv L=1 B=8 N=16 H=2 D=192 Dv=128 dtype={dtype} order=HND"),
                4,
                &[40, 9],
            ));
            for (h, q) in [(1, 8), (4, 4), (2, 6), (2, 16), (3, 6), (1, 1)] {
                // MQA, MHA, group 3, group 8, group 2 x 3 heads, a single head
                run_case(&case(
                    &format!("kv L=1 B=8 N=16 H={h} D=64 dtype={dtype} order=NHD"),
                    q,
                    &[50, 3],
                ));
            }
            run_case(&case(
                &format!("mla L=1 B=8 N=16 rank=512 rope=64 dtype={dtype} order=NHD"),
                16,
                &[33, 20],
            ));
        }
    }

    #[test]
    fn window_soft_cap_and_empty_sequences() {
        for dtype in ["f32", "bf16", "fp8_e4m3"] {
            let mut c = case(
                &format!("kv L=1 B=28 N=16 H=2 D=64 dtype={dtype} order=NHD"),
                4,
                &[100, 7, 64, 0],
            );
            c.window = Some(20);
            run_case(&c);
            c.window = None;
            c.cap = Some(5.0);
            run_case(&c);
            c.window = Some(1);
            run_case(&c);
            c.window = Some(1000);
            c.cap = Some(0.5);
            run_case(&c);
        }
        // Only empty sequences: zeros.
        run_case(&case(
            "kv L=1 B=4 N=16 H=2 D=64 dtype=f32 order=NHD",
            4,
            &[0, 0],
        ));
    }

    /// The legacy vLLM value, read in place on AVX-512: blocks of 32 tokens (runs split at
    /// 16), blocks of 8 (runs cut by the block table), windows that start a tile inside a
    /// block, groups of 1, 3 and 6 (head blocks of 4 with a remainder), widths that are not a
    /// multiple of 32; int8, and fp8 with per-tensor scales (raw fp8 values, the power of two
    /// folded).
    #[test]
    fn transposed_values() {
        for spec in [
            "kv L=1 B=24 N=16 H=2 D=32 dtype=int8 legacy=vllm-paged-v1",
            "kv L=1 B=24 N=16 H=2 D=32 dtype=fp8_e4m3 legacy=vllm-paged-v1 k_scale=0.5 v_scale=2",
            "kv L=1 B=24 N=16 H=2 D=48 dtype=fp8_e5m2 legacy=vllm-paged-v1 k_scale=4 v_scale=0.25",
        ] {
            run_case(&case(spec, 4, &[37, 0, 16, 70]));
        }
        for dtype in DTYPES {
            for (n, d, h, q) in [
                (32, 80, 2, 6),
                (8, 48, 3, 3),
                (16, 112, 1, 1),
                (32, 16, 2, 2),
            ] {
                let mut c = case(
                    &format!("kv L=1 B=40 N={n} H={h} D={d} dtype={dtype} legacy=vllm-paged-v1"),
                    q,
                    &[75, 1, 33],
                );
                run_case(&c);
                c.window = Some(21);
                run_case(&c);
            }
        }
    }

    #[test]
    fn block_sizes_layers_and_query_dtypes() {
        for (n, lens) in [(1, vec![40, 9]), (8, vec![70, 33]), (64, vec![130, 65])] {
            for order in ["NHD", "HND"] {
                let nb = lens.iter().map(|l: &u32| l.div_ceil(n)).max().unwrap_or(1) * 2;
                run_case(&case(
                    &format!("kv L=1 B={nb} N={n} H=2 D=64 dtype=bf16 order={order}"),
                    8,
                    &lens,
                ));
            }
        }
        let mut c = case("kv L=3 B=8 N=16 H=2 D=64 dtype=f16 order=NHD", 4, &[50, 3]);
        c.layer = 2;
        run_case(&c);
        c.query = 1;
        run_case(&c);
        c.query = 2;
        run_case(&c);
    }

    /// One long sequence: split-context on its own (default partitions), and many forced
    /// partitions, some of them empty.
    #[test]
    fn split_context() {
        for dtype in ["f32", "bf16", "fp8_e4m3"] {
            for order in ["NHD", "HND"] {
                let mut c = case(
                    &format!("kv L=1 B=80 N=16 H=2 D=128 dtype={dtype} order={order}"),
                    8,
                    &[1200],
                );
                c.parts = 7;
                run_case(&c);
                c.lens = vec![5];
                c.parts = 9; // more partitions than tokens
                run_case(&c);
            }
        }
        let be = CpuBackend::new(Some(2));
        let l: KvCacheLayout = "kv L=1 B=80 N=16 H=2 D=64 dtype=f32 order=NHD"
            .parse()
            .unwrap();
        let cache = HostCache::new(l).unwrap();
        let table: Vec<i32> = (0..80).collect();
        let q = vec![0f32; 8 * 64];
        let d = Decode {
            layer: 0,
            query: Activations::F32(&q),
            block_table: &table,
            blocks_per_seq: 80,
            seq_lens: &[1200],
            params: DecodeParams {
                num_q_heads: 8,
                scale: 1.0,
                sliding_window: None,
                soft_cap: None,
            },
        };
        let mut out = vec![1f32; 8 * 64];
        be.paged_decode(&cache.as_ref(), &d, &mut out).unwrap();
        assert!(out.iter().all(|x| *x == 0.0), "zero cache: zero output");
    }

    #[test]
    fn kernel_order_round_trips() {
        // Orders are plain index arithmetic: every build's, whether or not this machine runs it.
        for &isa in Isa::ALL {
            for (kind, role) in [RowKind::F32, RowKind::Bf16, RowKind::Fp8E4m3]
                .into_iter()
                .flat_map(|k| [(k, Role::Key), (k, Role::Value)])
            {
                let o = Order::of(isa, kind, role);
                for w in [1, 16, 31, 32, 33, 80, 120, 576] {
                    // Distinct values, exact in bf16.
                    let src: Vec<f32> = (0..w).map(|i| (i % 256) as f32 + 1.0).collect();
                    let mut k = vec![f32::NAN; o.padded(w)];
                    o.arrange(&src, &mut k);
                    if o.is_packed() {
                        // bf16 pairs: element d (exact in bf16) at half `pos(d)`.
                        let halves: Vec<u16> = k[..o.padded(w) / 2]
                            .iter()
                            .flat_map(|x| [x.to_bits() as u16, (x.to_bits() >> 16) as u16])
                            .collect();
                        for (d, x) in src.iter().enumerate() {
                            assert_eq!(half::bf16::from_bits(halves[o.pos(d)]).to_f32(), *x);
                        }
                        assert_eq!(halves.iter().filter(|h| **h == 0).count(), o.padded(w) - w);
                        continue;
                    }
                    let mut back = vec![0f32; w];
                    o.restore(&k, 2.0, &mut back);
                    let twice: Vec<f32> = src.iter().map(|x| x * 2.0).collect();
                    assert_eq!(back, twice, "{isa:?} {kind:?} width {w}");
                    assert_eq!(k.iter().filter(|x| **x == 0.0).count(), o.padded(w) - w);
                }
            }
        }
    }

    #[test]
    fn refuses_bad_tables_before_writing() {
        let l: KvCacheLayout = "kv L=1 B=4 N=16 H=2 D=32 dtype=f32 order=NHD"
            .parse()
            .unwrap();
        let cache = HostCache::new(l).unwrap();
        let q = vec![0f32; 2 * 32];
        let table = [0, 9];
        let d = Decode {
            layer: 0,
            query: Activations::F32(&q),
            block_table: &table,
            blocks_per_seq: 2,
            seq_lens: &[20],
            params: DecodeParams {
                num_q_heads: 2,
                scale: 1.0,
                sliding_window: None,
                soft_cap: None,
            },
        };
        let mut out = vec![7f32; 2 * 32];
        let be = CpuBackend::new(Some(2));
        let e = be.paged_decode(&cache.as_ref(), &d, &mut out).unwrap_err();
        assert!(
            matches!(
                e,
                OpError::BlockOutOfRange {
                    seq: 0,
                    position: 1,
                    block: 9,
                    limit: 4
                }
            ),
            "{e}"
        );
        assert!(out.iter().all(|x| *x == 7.0), "nothing written on error");
        let long = Decode {
            seq_lens: &[33],
            ..d
        };
        assert!(matches!(
            be.paged_decode(&cache.as_ref(), &long, &mut out),
            Err(OpError::SequenceTooLong { .. })
        ));
        let mut short = vec![7f32; 2 * 32 - 1];
        assert!(matches!(
            be.paged_decode(&cache.as_ref(), &d, &mut short),
            Err(OpError::Shape { .. })
        ));
        assert!(short.iter().all(|x| *x == 7.0), "nothing written on error");
    }
}
