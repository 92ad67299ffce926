//! Fast path of `paged_decode`.
//!
//! A work item is a sequence and a range of KV heads — all of them when the page is token-major
//! (so the page is read in address order), one when it is head-major — each with the whole
//! GQA group of query heads sharing it, so every K and V row is read once. When there are too
//! few items to keep every thread busy, each item's context is also split into partitions
//! whose partial softmax states are reduced afterwards (flash-decoding). An item runs an online
//! softmax over tiles of tokens that never cross a block: the tile's logits in one kernel call
//! (4 rows x 4 query heads per block of registers, one transposed reduction), one vectorized
//! exp pass, then the tile's value rows with the accumulators held in registers. Rows are
//! addressed through the layout's field maps only; contiguous rows (f32, f16, bf16, fp8, int8)
//! are widened in registers, other rows (x-split or transposed legacy rows) are first decoded
//! into an f32 row. The next tile's rows are prefetched into L2.
//!
//! Scratch lives in per-thread buffers and a partials buffer kept by the backend, so a decode
//! step allocates nothing once they have grown.

use std::cell::RefCell;

use kvlayout::ops::OpError;
use kvlayout::{Content, DType, Field, FieldMap};
use rayon::prelude::*;

use crate::args::{check_decode, Decode, DecodeShape};
use crate::backend::CpuBackend;
use crate::cache::CacheRef;
use crate::elem::decode;
use crate::simd::{self, Isa, RowKind};

/// Tokens per online-softmax tile.
const TILE: usize = 32;
/// Fewest tokens worth a partition of its own.
const MIN_PARTITION: u64 = 128;

/// How a field's rows are read.
#[derive(Debug, Clone, Copy)]
enum Rows {
    /// Contiguous rows of a dtype the kernels widen in registers.
    Direct(RowKind),
    /// Anything else: decoded element by element into an f32 row.
    Decoded(DType),
}

fn rows_of(m: &FieldMap) -> Rows {
    let contiguous = m.strides.dim == m.elem_bytes() && m.strides.dim_split == m.width;
    match (contiguous, m.dtype) {
        (true, DType::F32) => Rows::Direct(RowKind::F32),
        (true, DType::F16) => Rows::Direct(RowKind::F16),
        (true, DType::Bf16) => Rows::Direct(RowKind::Bf16),
        (true, DType::Fp8E4m3) => Rows::Direct(RowKind::Fp8E4m3),
        (true, DType::Fp8E5m2) => Rows::Direct(RowKind::Fp8E5m2),
        (true, DType::Int8) => Rows::Direct(RowKind::I8),
        (_, dtype) => Rows::Decoded(dtype),
    }
}

/// A field whose rows can go through the tile kernels: contiguous rows, and the slot stride.
fn tile_rows(m: &FieldMap, rows: Rows) -> Option<(RowKind, usize)> {
    match rows {
        Rows::Direct(kind) => Some((kind, m.strides.slot as usize)),
        Rows::Decoded(_) => None,
    }
}

/// Everything an item needs, derived once per call from the layout.
struct Plan<'a> {
    cache: &'a CacheRef<'a>,
    d: &'a Decode<'a>,
    shape: DecodeShape,
    isa: Isa,
    k: FieldMap,
    v: FieldMap,
    k_rows: Rows,
    v_rows: Rows,
    k_inline: Option<FieldMap>,
    v_inline: Option<FieldMap>,
    /// `scale * k_scale`, folded into the query.
    q_scale: f32,
    v_scale: f32,
    block_size: u64,
}

#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    logits: Vec<f32>,
    weights: Vec<f32>,
    dots: Vec<f32>,
    row: Vec<f32>,
    tmp: Vec<f32>,
    state: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

impl Plan<'_> {
    /// Prefetches the K and V rows of the tile starting at token `t` (contiguous rows only):
    /// rows of random blocks are far apart, and the hardware prefetchers do not follow them.
    fn prefetch_next(&self, seq: usize, t: u64, end: u64, h: u64) {
        if t >= end {
            return;
        }
        let (bi, n0) = (t / self.block_size, t % self.block_size);
        let n1 = (n0 + TILE as u64).min(self.block_size).min(n0 + end - t);
        let b = self.d.block_table[seq * self.d.blocks_per_seq + bi as usize] as u64;
        for (m, rows) in [(&self.k, self.k_rows), (&self.v, self.v_rows)] {
            if let Rows::Direct(kind) = rows {
                let buf = self.cache.buffers[m.strides.buffer as usize];
                let len = m.width as usize * simd::elem(kind);
                let base = self.base(m, b, h);
                for n in n0..n1 {
                    let off = (base + n * m.strides.slot) as usize;
                    simd::prefetch(&buf[off..off + len]);
                }
            }
        }
    }

    /// The bytes of `nt` rows from byte offset `first` at the field's slot stride.
    fn tile_bytes(&self, m: &FieldMap, kind: RowKind, first: u64, nt: usize) -> &[u8] {
        let buf = self.cache.buffers[m.strides.buffer as usize];
        let first = first as usize;
        let len = (nt - 1) * m.strides.slot as usize + m.width as usize * simd::elem(kind);
        &buf[first..first + len]
    }

    /// Byte offset of `(layer, block, head, slot 0, d 0)` of a field.
    fn base(&self, m: &FieldMap, b: u64, h: u64) -> u64 {
        let s = m.strides;
        s.base_offset + self.d.layer * s.layer + b * s.block + h * s.head
    }

    /// The row at byte offset `off` (element 0), as stored bytes or decoded into `row`.
    fn row<'s>(
        &'s self,
        m: &FieldMap,
        rows: Rows,
        off: u64,
        row: &'s mut [f32],
    ) -> (RowKind, &'s [u8]) {
        let buf = self.cache.buffers[m.strides.buffer as usize];
        let w = m.width as usize;
        let off = off as usize;
        match rows {
            Rows::Direct(kind) => (kind, &buf[off..off + w * simd::elem(kind)]),
            Rows::Decoded(dtype) => {
                let e = dtype.size_bytes() as usize;
                let s = m.strides;
                for (i, o) in row[..w].iter_mut().enumerate() {
                    let i = i as u64;
                    let at = off
                        + ((i / s.dim_split) * s.dim_chunk + (i % s.dim_split) * s.dim) as usize;
                    *o = decode(dtype, &buf[at..at + e]);
                }
                (RowKind::F32, bytemuck::cast_slice(&row[..w]))
            }
        }
    }

    fn scale_at(&self, m: &Option<FieldMap>, base: u64, n: u64) -> f32 {
        match m {
            None => 1.0,
            Some(m) => {
                let off = (base + n * m.strides.slot) as usize;
                decode(
                    DType::F32,
                    &self.cache.buffers[m.strides.buffer as usize][off..off + 4],
                )
            }
        }
    }

    /// Online softmax of the groups of KV heads `heads` over tokens `range` of sequence `seq`,
    /// tile by tile, every head of the range on each tile (so a token-major page is read in
    /// address order). Writes per head `[max; group][sum; group][acc; group * v_width]` into
    /// consecutive records of `states`.
    fn run(
        &self,
        seq: usize,
        heads: std::ops::Range<usize>,
        range: std::ops::Range<u64>,
        states: &mut [f32],
        s: &mut Scratch,
    ) {
        let (g, qk, vw) = (self.shape.group, self.shape.qk_width, self.shape.v_width);
        let sw = g * (2 + vw);
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
            weights,
            dots,
            row,
            tmp,
            ..
        } = s;
        grow(q, nh * g * qk);
        grow(logits, g * TILE);
        grow(weights, g * TILE);
        grow(dots, g);
        grow(row, qk.max(vw));
        grow(tmp, qk.max(vw));
        let q0 = (seq * self.shape.q_heads + heads.start * g) * qk;
        self.d.query.read_into(q0, &mut q[..nh * g * qk]);
        for x in &mut q[..nh * g * qk] {
            *x *= self.q_scale;
        }
        let cap = self.d.params.soft_cap;
        let tiles = simd::has_tile_kernels(self.isa);
        let mut t0 = range.start;
        while t0 < range.end {
            // A tile never crosses a block: one block-table lookup, one base per field.
            let (bi, n0) = (t0 / self.block_size, t0 % self.block_size);
            let t1 = (t0 + TILE as u64)
                .min(range.end)
                .min((bi + 1) * self.block_size);
            let nt = (t1 - t0) as usize;
            let b = self.d.block_table[seq * self.d.blocks_per_seq + bi as usize] as u64;
            for (hh, state) in heads.clone().zip(states[..nh * sw].chunks_exact_mut(sw)) {
                let h = hh as u64;
                let q = &q[(hh - heads.start) * g * qk..(hh - heads.start + 1) * g * qk];
                let (stats, acc) = state.split_at_mut(2 * g);
                let (maxes, sums) = stats.split_at_mut(g);
                let (kb, vb) = (self.base(&self.k, b, h), self.base(&self.v, b, h));
                let ksb = self.k_inline.as_ref().map_or(0, |m| self.base(m, b, h));
                let vsb = self.v_inline.as_ref().map_or(0, |m| self.base(m, b, h));
                self.prefetch_next(seq, t1, range.end, h);
                // Logits of the tile: logits[j * TILE + i].
                if let (Some((kind, stride)), true) = (tile_rows(&self.k, self.k_rows), tiles) {
                    let tile = self.tile_bytes(&self.k, kind, kb + n0 * stride as u64, nt);
                    simd::dots_tile(
                        self.isa,
                        kind,
                        tile,
                        stride,
                        nt,
                        qk,
                        &q[..g * qk],
                        g,
                        logits,
                        TILE,
                    );
                } else {
                    for i in 0..nt {
                        let n = n0 + i as u64;
                        let (kind, bytes) =
                            self.row(&self.k, self.k_rows, kb + n * self.k.strides.slot, row);
                        simd::dots(self.isa, kind, bytes, qk, &q[..g * qk], &mut dots[..g], tmp);
                        for (j, x) in dots[..g].iter().enumerate() {
                            logits[j * TILE + i] = *x;
                        }
                    }
                }
                if self.k_inline.is_some() || cap.is_some() {
                    for i in 0..nt {
                        let ks = self.scale_at(&self.k_inline, ksb, n0 + i as u64);
                        for j in 0..g {
                            let mut l = logits[j * TILE + i] * ks;
                            if let Some(c) = cap {
                                l = c * (l / c).tanh();
                            }
                            logits[j * TILE + i] = l;
                        }
                    }
                }
                // Rescale the running state to the tile's new maxima; logits become weights.
                for j in 0..g {
                    let tile = &mut logits[j * TILE..j * TILE + nt];
                    let tile_max = tile.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let new_max = maxes[j].max(tile_max);
                    if new_max > maxes[j] {
                        let c = (maxes[j] - new_max).exp();
                        sums[j] *= c;
                        for a in &mut acc[j * vw..(j + 1) * vw] {
                            *a *= c;
                        }
                        maxes[j] = new_max;
                    }
                    for l in tile.iter_mut() {
                        *l -= new_max;
                    }
                    simd::exp_inplace(self.isa, tile);
                    sums[j] += tile.iter().sum::<f32>();
                }
                // Values: weights[j * TILE + i] = p * v_scale * inline scale of token i.
                for i in 0..nt {
                    let vs = self.v_scale * self.scale_at(&self.v_inline, vsb, n0 + i as u64);
                    for j in 0..g {
                        weights[j * TILE + i] = logits[j * TILE + i] * vs;
                    }
                }
                if let (Some((kind, stride)), true) = (tile_rows(&self.v, self.v_rows), tiles) {
                    let tile = self.tile_bytes(&self.v, kind, vb + n0 * stride as u64, nt);
                    simd::axpys_tile(
                        self.isa,
                        kind,
                        tile,
                        stride,
                        nt,
                        vw,
                        weights,
                        g,
                        TILE,
                        &mut acc[..g * vw],
                    );
                } else {
                    for i in 0..nt {
                        let n = n0 + i as u64;
                        for j in 0..g {
                            dots[j] = weights[j * TILE + i];
                        }
                        let (kind, bytes) =
                            self.row(&self.v, self.v_rows, vb + n * self.v.strides.slot, row);
                        simd::axpys(
                            self.isa,
                            kind,
                            bytes,
                            vw,
                            &dots[..g],
                            &mut acc[..g * vw],
                            tmp,
                        );
                    }
                }
            }
            t0 = t1;
        }
    }
}

/// Final output of a group from its state `[max; g][sum; g][acc; g * vw]`.
fn finish(state: &[f32], g: usize, vw: usize, out: &mut [f32]) {
    for j in 0..g {
        let sum = state[g + j];
        let acc = &state[2 * g + j * vw..2 * g + (j + 1) * vw];
        let o = &mut out[j * vw..(j + 1) * vw];
        if sum > 0.0 {
            for (x, a) in o.iter_mut().zip(acc) {
                *x = a / sum;
            }
        } else {
            o.fill(0.0);
        }
    }
}

/// Combines the partial states of `parts` partitions of one KV head: each rescaled to the
/// global maximum, then normalized.
fn combine<'p>(parts: usize, g: usize, vw: usize, rec: impl Fn(usize) -> &'p [f32], o: &mut [f32]) {
    o.fill(0.0);
    for j in 0..g {
        let m = (0..parts)
            .map(|p| rec(p)[j])
            .fold(f32::NEG_INFINITY, f32::max);
        let o = &mut o[j * vw..(j + 1) * vw];
        let mut sum = 0.0;
        for p in 0..parts {
            let r = rec(p);
            if r[g + j] > 0.0 {
                let c = (r[j] - m).exp();
                sum += r[g + j] * c;
                for (x, a) in o.iter_mut().zip(&r[2 * g + j * vw..2 * g + (j + 1) * vw]) {
                    *x += a * c;
                }
            }
        }
        if sum > 0.0 {
            for x in o.iter_mut() {
                *x /= sum;
            }
        }
    }
}

pub(crate) fn paged_decode(
    be: &CpuBackend,
    cache: &CacheRef<'_>,
    d: &Decode<'_>,
    out: &mut [f32],
) -> Result<(), OpError> {
    decode_with(be, cache, d, out, None)
}

/// `partitions`: force that many context partitions per (sequence, KV head) (tests).
pub(crate) fn decode_with(
    be: &CpuBackend,
    cache: &CacheRef<'_>,
    d: &Decode<'_>,
    out: &mut [f32],
    partitions: Option<usize>,
) -> Result<(), OpError> {
    let shape = check_decode(cache.layout, d, out.len())?;
    let layout = cache.layout;
    let (k, v) = (layout.field_map(Field::K)?, layout.field_map(Field::V)?);
    let scaled = matches!(layout.content(), Content::KvScaled { .. });
    let sc = layout.scales();
    let plan = Plan {
        cache,
        d,
        shape,
        isa: simd::detect(),
        k,
        v,
        k_rows: rows_of(&k),
        v_rows: rows_of(&v),
        k_inline: if scaled {
            Some(layout.field_map(Field::KScale)?)
        } else {
            None
        },
        v_inline: if scaled {
            Some(layout.field_map(Field::VScale)?)
        } else {
            None
        },
        q_scale: d.params.scale * sc.k_scale,
        v_scale: sc.v_scale,
        block_size: layout.geometry().block_size,
    };
    let kv_heads = layout.geometry().num_kv_heads as usize;
    let (g, vw) = (shape.group, shape.v_width);
    // Per head: [max; g][sum; g][acc; g * vw].
    let rec = g * (2 + vw);
    // Token-major pages keep the heads of a token together: one item takes all heads of a
    // sequence so the page is read in address order. Head-major pages: one head per item.
    let hpi = if k.strides.head < k.strides.slot {
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
    let longest = (0..shape.seqs)
        .map(|s| range_of(s).end - range_of(s).start)
        .max()
        .unwrap_or(0);
    let parts = partitions.unwrap_or_else(|| {
        let target = 4 * be.threads();
        if items >= target {
            1
        } else {
            target
                .div_ceil(items.max(1))
                .min(longest.div_ceil(MIN_PARTITION).max(1) as usize)
        }
    });
    be.pool.install(|| {
        if parts <= 1 {
            out.par_chunks_mut(hpi * g * vw)
                .enumerate()
                .for_each(|(item, o)| {
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
                            finish(st, g, vw, o);
                        }
                        s.state = state;
                    });
                });
        } else {
            let mut partials = be.decode_partials.lock().unwrap_or_else(|e| e.into_inner());
            let n = items * parts * hpi * rec;
            grow(&mut partials, n);
            partials[..n]
                .par_chunks_mut(hpi * rec)
                .enumerate()
                .for_each(|(i, st)| {
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
            out.par_chunks_mut(g * vw)
                .enumerate()
                .for_each(|(head_item, o)| {
                    // Output chunk `head_item` is KV head `head_item % kv_heads` of its sequence:
                    // item `head_item / hpi`, head `head_item % hpi` within the item.
                    let (item, hh) = (head_item / hpi, head_item % hpi);
                    let rec_of = |p: usize| {
                        let at = ((item * parts + p) * hpi + hh) * rec;
                        &partials[at..at + rec]
                    };
                    combine(parts, g, vw, rec_of, o);
                });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{reference, Activations, DecodeParams, HostCache, WriteKv};
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

    struct Case {
        spec: String,
        q_heads: u64,
        lens: Vec<u32>,
        window: Option<u64>,
        cap: Option<f32>,
    }

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
        let mut slots = Vec::new();
        for (s, len) in c.lens.iter().enumerate() {
            for t in 0..*len as usize {
                slots.push(i64::from(table[s * per_seq + t / bs]) * bs as i64 + (t % bs) as i64);
            }
        }
        let k = data(slots.len() * heads * kw, 1);
        let v = data(slots.len() * heads * vw, 2);
        let w = WriteKv {
            layer: 0,
            key: Activations::F32(&k),
            value: (!mla).then_some(Activations::F32(&v)),
            slot_mapping: &slots,
        };
        reference::write_kv(&mut cache.as_mut(), &w).unwrap();
        let q = data(seqs * c.q_heads as usize * kw, 3);
        let d = Decode {
            layer: 0,
            query: Activations::F32(&q),
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
        for parts in [None, Some(1), Some(3)] {
            let mut got = vec![f32::NAN; n];
            decode_with(&be, &cache.as_ref(), &d, &mut got, parts).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "{} parts {parts:?}: out[{i}] = {a}, reference {b}",
                    c.spec
                );
            }
        }
    }

    fn case(spec: &str, q_heads: u64, lens: &[u32]) -> Case {
        Case {
            spec: spec.into(),
            q_heads,
            lens: lens.to_vec(),
            window: None,
            cap: None,
        }
    }

    #[test]
    fn layouts_and_dtypes_match_reference() {
        let lens = [37, 0, 16, 70];
        for dtype in ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"] {
            for placement in [
                "order=NHD",
                "order=HND",
                "order=BLNHC page=65536",
                "legacy=vllm-paged-v1",
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
        run_case(&case(
            "kv-scaled L=1 B=24 N=16 H=2 D=32 dtype=int8 order=NHD",
            4,
            &lens,
        ));
        run_case(&case(
            "kv-scaled L=1 B=24 N=16 H=2 D=32 dtype=fp8_e4m3 order=HND",
            4,
            &lens,
        ));
        run_case(&case(
            "kv L=1 B=24 N=16 H=2 D=32 dtype=fp8_e4m3 order=NHD k_scale=0.5 v_scale=2.0",
            2,
            &lens,
        ));
    }

    #[test]
    fn head_sizes_gqa_mqa_mha_and_mla() {
        for d in [32, 64, 80, 96, 112, 120, 128, 192, 256] {
            run_case(&case(
                &format!("kv L=1 B=8 N=16 H=2 D={d} dtype=bf16 order=NHD"),
                4,
                &[40, 9],
            ));
        }
        run_case(&case(
            "kv L=1 B=8 N=16 H=2 D=192 Dv=128 dtype=f16 order=HND",
            2,
            &[40, 9],
        ));
        run_case(&case(
            "kv L=1 B=8 N=16 H=1 D=64 dtype=f32 order=NHD",
            8,
            &[50, 3],
        )); // MQA
        run_case(&case(
            "kv L=1 B=8 N=16 H=4 D=64 dtype=f32 order=NHD",
            4,
            &[50, 3],
        )); // MHA
        run_case(&case(
            "mla L=1 B=8 N=16 rank=512 rope=64 dtype=bf16 order=NHD",
            16,
            &[33, 20],
        )); // MLA
    }

    #[test]
    fn window_and_soft_cap() {
        let mut c = case(
            "kv L=1 B=24 N=16 H=2 D=64 dtype=f32 order=NHD",
            4,
            &[100, 7, 64],
        );
        c.window = Some(20);
        run_case(&c);
        c.window = None;
        c.cap = Some(5.0);
        run_case(&c);
        c.window = Some(1);
        run_case(&c);
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
    }
}
