//! The AVX2 kernel of transposed values (the legacy vLLM value: a block's tokens side by side
//! for each element index), read in place with one token per lane, as the AVX-512 one does
//! at half the width.

use std::arch::x86_64::*;

use super::{hsum8, lanes, load, widen8};
use crate::arch::{prefetch_bytes, PrefetchLevel};
use crate::decode::kernels::args::{Run, TransposedArgs};
use crate::decode::kernels::rows::codes::esize;
use crate::decode::kernels::rows::RowKind;

/// `out[j * ow + d] +=` the sum over the runs `(off, i0, n)` (`n <= 16` tokens side by side
/// at `buf + off + d * dim` for each element index `d`) of `w[j * ld + i0 + t]` times
/// element `d` of token `t`, for the `g` heads and the `width` elements (`raw`: e4m3 without
/// its power of two). Per block of 2 heads x 4 elements, 8 accumulators hold one lane per
/// token (tokens `t` and `t + 8` of a run share a lane) across all the runs and are reduced
/// once. The same elements of each run of `pf` (the step read later) are prefetched along
/// the run of `runs` at its index.
///
/// # Safety
/// AVX2, FMA and F16C present; each run's bytes `off .. off + (width - 1) * dim + n * elem`
/// inside `buf`; `w.len() >= (g - 1) * ld + i0 + n` for each run;
/// `out.len() >= (g - 1) * ow + width`. `pf` is only prefetched.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::decode::kernels) unsafe fn pv_transposed(
    kind: RowKind,
    raw: bool,
    a: TransposedArgs<'_>,
) {
    // SAFETY: the caller's contract.
    unsafe { by_kind!(kind, raw, pv_transposed_k(a)) }
}

/// [`pv_transposed`] for rows of kind `K`.
///
/// # Safety
/// As [`pv_transposed`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_transposed_k<const K: u8>(a: TransposedArgs<'_>) {
    let (buf, runs, pf, dim, width) = (a.buf.as_ptr(), a.runs, a.pf, a.dim, a.width);
    let (w, ld, g, out, ow, level) = (a.w.data, a.w.stride, a.g, a.out.data, a.out.stride, a.level);
    let mut j0 = 0;
    while j0 < g {
        let hn = (g - j0).min(2);
        let mut d0 = 0;
        while d0 < width {
            let dn = (width - d0).min(4);
            // The later step's runs, prefetched along the first heads.
            let pf = if j0 == 0 { pf } else { &[] };
            let b = Block {
                buf,
                runs,
                pf,
                level,
                dim,
                w: &w[j0 * ld..],
                ld,
                d0,
            };
            // SAFETY: the caller's contract, for heads `j0 .. j0 + hn` and elements `d0 ..
            // d0 + dn`.
            let sums = unsafe {
                if hn == 2 && dn == 4 {
                    block::<K, true>(&b, 2, 4)
                } else {
                    block::<K, false>(&b, hn, dn)
                }
            };
            // Lane `h * 4 + dd`: head `j0 + h`, element `d0 + dd`.
            for h in 0..hn {
                let row = &mut out[(j0 + h) * ow + d0..][..dn];
                for (o, s) in row.iter_mut().zip(&sums[h * 4..]) {
                    *o += s;
                }
            }
            d0 += 4;
        }
        j0 += 2;
    }
}

/// A block of [`pv_transposed_k`]: the runs, those prefetched along them and the level, the
/// element rows' stride, the weights from the block's first head (rows `ld` apart), the
/// block's first element.
struct Block<'a> {
    buf: *const u8,
    runs: &'a [Run],
    pf: &'a [Run],
    level: PrefetchLevel,
    dim: usize,
    w: &'a [f32],
    ld: usize,
    d0: usize,
}

/// The sums of `hn` heads x `dn` elements (at most 2 x 4; exactly that when `FULL`) over the
/// runs, lane `h * 4 + dd` as `hsum8` leaves them. Runs of 16 tokens (two whole vectors)
/// come first, in a loop without the partial vectors' copy, so the accumulators stay in
/// registers; shorter runs follow.
///
/// # Safety
/// As [`pv_transposed`], for the block's heads and elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const K: u8, const FULL: bool>(b: &Block<'_>, hn: usize, dn: usize) -> [f32; 8] {
    let (hn, dn) = if FULL { (2, 4) } else { (hn, dn) };
    let esize = esize(K);
    let mut acc = [_mm256_setzero_ps(); 8];
    for full_runs in [true, false] {
        for (ri, &Run { off, i0, n }) in b.runs.iter().enumerate() {
            if (n == 16) != full_runs {
                continue;
            }
            if let Some(&Run { off: pf_off, .. }) = b.pf.get(ri) {
                // The lines of elements `d0 .. d0 + dn` of the later run.
                let (first, end) = (pf_off + b.d0 * b.dim, pf_off + (b.d0 + dn) * b.dim);
                prefetch_bytes(b.buf, first, end, b.level);
            }
            // Tokens 0..8 of the run, then 8..16: two weights and one element vector live
            // at a time besides the 8 accumulators (16 registers in all).
            for half in 0..2 {
                let nh = if full_runs {
                    8
                } else {
                    n.saturating_sub(8 * half).min(8)
                };
                if nh == 0 {
                    continue;
                }
                // SAFETY: weights `(j0 + h) * ld + i0 .. + n` are inside `w`, and elements
                // `d0 + dd` (below `width`) of the run's `n` tokens inside the buffer
                // (caller's contract); lanes past `n` are masked (weights) or read through
                // a zeroed copy (elements), so they add zero.
                unsafe {
                    let wv: [__m256; 2] = std::array::from_fn(|h| {
                        let p = b.w.as_ptr().add(h.min(hn - 1) * b.ld + i0 + 8 * half);
                        if full_runs {
                            _mm256_loadu_ps(p)
                        } else {
                            _mm256_maskload_ps(p, lanes(nh))
                        }
                    });
                    for dd in 0..dn {
                        let p = b.buf.add(off + (b.d0 + dd) * b.dim + 8 * half * esize);
                        let x = if full_runs {
                            widen8::<K>(p)
                        } else {
                            load::<K>(p, 0, nh)
                        };
                        for (h, wh) in wv.iter().enumerate() {
                            acc[h * 4 + dd] = _mm256_fmadd_ps(*wh, x, acc[h * 4 + dd]);
                        }
                    }
                }
            }
        }
    }
    let mut sums = [0f32; 8];
    // SAFETY: `sums` holds 8 floats.
    unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), hsum8(acc)) };
    sums
}
