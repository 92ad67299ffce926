//! The portable build: each row widened into a scratch row, then plain loops. It also holds
//! the head-by-head softmax step the AVX2 build shares (with its own weights).

use super::args::{SoftmaxStep, Strided, StridedMut, TileRows};
use super::rows::{weight, widen, SUM_LANES};

/// `out[j] = sum_d q[j * qs + d] * k[d]` for the `out.len()` query rows.
#[inline(always)]
fn dots_portable(k: &[f32], q: &[f32], qs: usize, out: &mut [f32]) {
    let w = k.len();
    for (j, o) in out.iter_mut().enumerate() {
        let qr = &q[j * qs..j * qs + w];
        let mut acc = [0f32; 16];
        let mut chunks_q = qr.chunks_exact(16);
        let mut chunks_k = k.chunks_exact(16);
        for (a, b) in (&mut chunks_q).zip(&mut chunks_k) {
            for i in 0..16 {
                acc[i] += a[i] * b[i];
            }
        }
        let tail: f32 = chunks_q
            .remainder()
            .iter()
            .zip(chunks_k.remainder())
            .map(|(a, b)| a * b)
            .sum();
        *o = acc.iter().sum::<f32>() + tail;
    }
}

/// `acc[j * s + d] += p[j] * v[d]` for the `p.len()` accumulator rows.
#[inline(always)]
fn axpys_portable(v: &[f32], p: &[f32], acc: &mut [f32], s: usize) {
    let w = v.len();
    for (j, pj) in p.iter().enumerate() {
        for (a, x) in acc[j * s..j * s + w].iter_mut().zip(v) {
            *a += pj * x;
        }
    }
}

/// The logits of a tile (see [`qk_tile`](super::qk_tile)): each row widened into `scratch`
/// (`width` f32), then dotted with the `g` query rows, 16 at a time.
// Inlined into the dispatch (see `qk_tile`): called apart, it would keep the step's
// arguments in memory for every build.
#[inline]
pub(super) fn qk(
    t: &TileRows<'_, '_>,
    q: Strided<'_>,
    g: usize,
    logits: StridedMut<'_>,
    scratch: &mut [f32],
) {
    let (kind, rows, hoff, width) = (t.kind, t.rows, t.hoff, t.width);
    let (q, qs, ld, logits) = (q.data, q.stride, logits.stride, logits.data);
    let need = width * kind.elem();
    let mut out = [0f32; 16];
    for i in 0..rows.len() {
        widen(kind, rows.row(i, hoff, need), &mut scratch[..width]);
        let mut j0 = 0;
        while j0 < g {
            let n = (g - j0).min(16);
            let (k, q) = (&scratch[..width], &q[j0 * qs..]);
            dots_portable(k, q, qs, &mut out[..n]);
            for (j, o) in out[..n].iter().enumerate() {
                logits[(j0 + j) * ld + i] = *o;
            }
            j0 += n;
        }
    }
}

/// The values of a tile (see [`pv_tile`](super::pv_tile)): each row widened into `scratch`
/// (`width` f32), then added to the `g` accumulator rows times their weights, 16 at a time.
// Inlined as `qk` is.
#[inline]
pub(super) fn pv(
    t: &TileRows<'_, '_>,
    w: Strided<'_>,
    g: usize,
    acc: StridedMut<'_>,
    scratch: &mut [f32],
) {
    let (kind, rows, hoff, width) = (t.kind, t.rows, t.hoff, t.width);
    let (w, ld, s, acc) = (w.data, w.stride, acc.stride, acc.data);
    let need = width * kind.elem();
    let mut p = [0f32; 16];
    for i in 0..rows.len() {
        widen(kind, rows.row(i, hoff, need), &mut scratch[..width]);
        let mut j0 = 0;
        while j0 < g {
            let n = (g - j0).min(16);
            for (j, x) in p[..n].iter_mut().enumerate() {
                *x = w[(j0 + j) * ld + i];
            }
            let acc = &mut acc[j0 * s..];
            axpys_portable(&scratch[..width], &p[..n], acc, s);
            j0 += n;
        }
    }
}

/// One row of [`adjust_logits`](super::adjust_logits): `l[i] *= ks[i]`, then `c * tanh(l /
/// c)` with a cap.
pub(super) fn adjust_row(l: &mut [f32], ks: &[f32], cap: Option<f32>) {
    for (l, ks) in l.iter_mut().zip(ks) {
        *l *= ks;
        if let Some(c) = cap {
            *l = c * (*l / c).tanh();
        }
    }
}

/// The softmax step (see [`softmax_tile`](super::softmax_tile)) head by head: each head's
/// maximum raised to the tile's (its first partial sum and accumulator row rescaled), then
/// `weights(logits, maximum, sum)` turns the head's logits into weights in place and adds
/// them to its sum.
pub(super) fn softmax_heads(s: SoftmaxStep<'_>, weights: impl Fn(&mut [f32], f32, &mut f32)) {
    let SoftmaxStep {
        nt,
        g,
        logits,
        maxes,
        sums,
        acc,
        ..
    } = s;
    let (ld, logits, sa, acc) = (logits.stride, logits.data, acc.stride, acc.data);
    for j in 0..g {
        let l = &mut logits[j * ld..j * ld + nt];
        let tile_max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = maxes[j].max(tile_max);
        let sum = &mut sums[j * SUM_LANES];
        if m > maxes[j] {
            let c = weight(maxes[j] - m);
            *sum *= c;
            for x in &mut acc[j * sa..(j + 1) * sa] {
                *x *= c;
            }
            maxes[j] = m;
        }
        weights(l, m, sum);
    }
}

/// The portable weights of one head: `l[i] = e^(l[i] - m)` ([`weight`]), rounded to bf16
/// with `round`, added to `sum`, then times `wscale` and `vscale[i]`.
pub(super) fn head_weights(
    l: &mut [f32],
    m: f32,
    sum: &mut f32,
    round: bool,
    wscale: f32,
    vscale: Option<&[f32]>,
) {
    for (i, x) in l.iter_mut().enumerate() {
        *x = weight(*x - m);
        if round {
            *x = half::bf16::from_f32(*x).to_f32();
        }
        *sum += *x;
        *x *= wscale * vscale.map_or(1.0, |v| v[i]);
    }
}
