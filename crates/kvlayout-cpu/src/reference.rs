//! The scalar reference ([`ScalarReference`]): every op written for clarity, reading and
//! writing each element through the layout's checked address function; decode accumulates in
//! f64.
//!
//! The fast paths are tested against this, and this is tested against an outside reference
//! (numpy) in the conformance suite.

use kvlayout::ops::{BlockMove, Moves, OpError};
use kvlayout::{Coord, DType, Field, KvCacheLayout};

use crate::args::{check_decode, check_write, Decode, WriteKv};
use crate::cache::{CacheMut, CacheRef};
use crate::elem::{decode, encode, inline_scale};
use crate::exec::HostExec;
use crate::tolerance::Magnitude;

/// The scalar reference: the oracle, and an executor of its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScalarReference;

/// `(buffer, byte offset)` of a coordinate the op has validated.
fn at(layout: &KvCacheLayout, c: &Coord) -> (usize, usize) {
    let loc = layout.offset(c).expect("coordinate validated by the op");
    (loc.buffer as usize, loc.offset as usize)
}

/// The stored bytes of one element.
fn bytes_at<'a>(cache: &'a CacheRef<'_>, c: &Coord) -> &'a [u8] {
    let m = cache.layout.field_map(c.field).expect("readable field");
    let (buf, off) = at(cache.layout, c);
    &cache.buffers[buf][off..off + m.elem_bytes() as usize]
}

/// The value of an element: stored value x per-tensor scale (K, V) x inline scale (if any).
pub fn value_at(cache: &CacheRef<'_>, c: &Coord) -> f64 {
    let layout = cache.layout;
    let field = c.field;
    let m = layout.field_map(field).expect("readable field");
    let stored = f64::from(decode(m.dtype, bytes_at(cache, c)));
    let s = layout.scales();
    let (tensor, inline) = match field {
        Field::K => (s.k_scale, Field::KScale),
        Field::V => (s.v_scale, Field::VScale),
        _ => (1.0, Field::K),
    };
    let mut v = stored * f64::from(tensor);
    if layout.content().inline_scales() && matches!(field, Field::K | Field::V) {
        let sc = Coord {
            field: inline,
            dim: 0,
            ..*c
        };
        v *= f64::from(decode(DType::F32, bytes_at(cache, &sc)));
    }
    v
}

fn store(cache: &mut CacheMut<'_>, c: &Coord, x: f32) {
    let m = cache.layout.field_map(c.field).expect("stored field");
    let (buf, off) = at(cache.layout, c);
    encode(
        m.dtype,
        x,
        &mut cache.buffers[buf][off..off + m.elem_bytes() as usize],
    );
}

/// Scatters new tokens into the cache (see [`WriteKv`]).
fn write_tokens(cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError> {
    let shape = check_write(cache.layout, w)?;
    let layout = cache.layout;
    let bs = layout.geometry().block_size;
    let dtype = layout.dtype();
    let s = layout.scales();
    let scaled = layout.content().inline_scales();
    for (t, &slot) in w.slot_mapping.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let (b, n) = (slot as u64 / bs, slot as u64 % bs);
        for h in 0..shape.heads {
            let mut parts = vec![(Field::K, Field::KScale, w.key, shape.k_width, s.k_scale)];
            if shape.mla {
                parts[0].0 = Field::Latent;
            } else if let Some(v) = w.value {
                parts.push((Field::V, Field::VScale, v, shape.v_width, s.v_scale));
            }
            for (field, scale_field, src, width, tensor) in parts {
                let row = (t * shape.heads + h) * width;
                let xs: Vec<f32> = (0..width).map(|d| src.get(row + d) / tensor).collect();
                let mut q = 1.0f32;
                if scaled {
                    let amax = xs.iter().fold(0f32, |a, x| a.max(x.abs()));
                    q = inline_scale(dtype, amax);
                    store(
                        cache,
                        &Coord::new(scale_field, w.layer, b, h as u64, n, 0),
                        q,
                    );
                }
                for (d, x) in xs.iter().enumerate() {
                    store(
                        cache,
                        &Coord::new(field, w.layer, b, h as u64, n, d as u64),
                        x / q,
                    );
                }
            }
        }
    }
    Ok(())
}

/// [`HostExec::paged_decode`] of the reference, also returning the [`Magnitude`] of each output row (`[seqs,
/// num_q_heads]`): what a fast path's output is compared within ([`crate::tolerance`]).
pub fn paged_decode_magnitudes(
    cache: &CacheRef<'_>,
    d: &Decode<'_>,
    out: &mut [f32],
) -> Result<Vec<Magnitude>, OpError> {
    let shape = check_decode(cache.layout, d, out.len())?;
    let mut magnitudes = Vec::with_capacity(shape.seqs * shape.q_heads);
    let bs = cache.layout.geometry().block_size;
    let p = d.params;
    for s in 0..shape.seqs {
        let len = u64::from(d.seq_lens[s]);
        let start = p.sliding_window.map_or(0, |w| len.saturating_sub(w));
        let block_of = |t: u64| d.block_table[s * d.blocks_per_seq + (t / bs) as usize] as u64;
        for qh in 0..shape.q_heads {
            let kvh = (qh / shape.group) as u64;
            let q0 = (s * shape.q_heads + qh) * shape.qk_width;
            let mut logits = Vec::new();
            let mut mag = Magnitude::default();
            for t in start..len {
                let (b, n) = (block_of(t), t % bs);
                let (mut dot, mut abs) = (0f64, 0f64);
                for i in 0..shape.qk_width {
                    let qk = f64::from(d.query.get(q0 + i))
                        * value_at(cache, &Coord::new(Field::K, d.layer, b, kvh, n, i as u64));
                    dot += qk;
                    abs += qk.abs();
                }
                mag.logits = mag.logits.max(abs * f64::from(p.scale).abs());
                let mut x = dot * f64::from(p.scale);
                if let Some(c) = p.soft_cap {
                    let c = f64::from(c);
                    x = c * (x / c).tanh();
                }
                logits.push(x);
            }
            let o0 = (s * shape.q_heads + qh) * shape.v_width;
            let out = &mut out[o0..o0 + shape.v_width];
            if logits.is_empty() {
                out.fill(0.0);
                magnitudes.push(mag);
                continue;
            }
            let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
            let total: f64 = w.iter().sum();
            for (i, o) in out.iter_mut().enumerate() {
                let mut acc = 0f64;
                for (t, p) in (start..len).zip(&w) {
                    let c = Coord::new(Field::V, d.layer, block_of(t), kvh, t % bs, i as u64);
                    let v = value_at(cache, &c);
                    mag.values = mag.values.max(v.abs());
                    acc += p * v;
                }
                *o = (acc / total) as f32;
            }
            magnitudes.push(mag);
        }
    }
    Ok(magnitudes)
}

/// Copies every stored element of each move, byte for byte, through both layouts' address
/// functions. The layouts hold the same content (checked by the callers).
fn copy_elements(src: &CacheRef<'_>, dst: &mut CacheMut<'_>, m: &Moves) {
    for f in src.layout.stored_fields() {
        let e = f.elem_bytes() as usize;
        for &(sb, db) in &m.pairs {
            for l in 0..f.num_layers {
                for h in m.heads.clone() {
                    let dh = h - m.heads.start + m.dst_head0;
                    for n in 0..f.num_slots {
                        for d in 0..f.width {
                            let (s_buf, s_off) =
                                at(src.layout, &Coord::new(f.field, l, sb, h, n, d));
                            let (d_buf, d_off) =
                                at(dst.layout, &Coord::new(f.field, l, db, dh, n, d));
                            dst.buffers[d_buf][d_off..d_off + e]
                                .copy_from_slice(&src.buffers[s_buf][s_off..s_off + e]);
                        }
                    }
                }
            }
        }
    }
}

impl HostExec for ScalarReference {
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError> {
        write_tokens(cache, w)
    }

    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError> {
        paged_decode_magnitudes(cache, d, out).map(|_| ())
    }

    /// Every element of every move, through both layouts' address functions; a move within
    /// one cache reads a snapshot of it.
    fn move_blocks(
        &self,
        src: Option<&CacheRef<'_>>,
        dst: &mut CacheMut<'_>,
        op: &BlockMove<'_>,
    ) -> Result<(), OpError> {
        let m = op.plan(src.map(|s| s.layout), dst.layout)?;
        match src {
            Some(src) => copy_elements(src, dst, &m),
            None => {
                let snapshot: Vec<Vec<u8>> = dst.buffers.iter().map(|b| b.to_vec()).collect();
                let src = CacheRef {
                    layout: dst.layout,
                    buffers: snapshot.iter().map(|b| b.as_slice()).collect(),
                };
                copy_elements(&src, dst, &m);
            }
        }
        Ok(())
    }
}
