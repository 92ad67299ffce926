//! The AVX2 kernel of transposed values (the legacy vLLM value: a block's tokens side by side
//! for each element index), read in place with one token per lane, as the AVX-512 one does
//! at half the width.

use std::arch::x86_64::*;

use super::{hsum8, lanes, load, BF16, F16, F32};
use crate::simd::{self, RowKind};

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
/// inside the buffer `buf` points to; `w.len() >= (g - 1) * ld + i0 + n` for each run;
/// `out.len() >= (g - 1) * ow + width`. `pf` is only prefetched.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::simd) unsafe fn pv_transposed(
    kind: RowKind,
    raw: bool,
    buf: *const u8,
    runs: &[(usize, usize, usize)],
    pf: &[(usize, usize, usize)],
    dim: usize,
    width: usize,
    w: &[f32],
    ld: usize,
    g: usize,
    out: &mut [f32],
    ow: usize,
) {
    let a = (buf, runs, pf, dim, width, w, ld, g, out, ow);
    // SAFETY: the caller's contract.
    unsafe { by_kind!(kind, raw, pv_transposed_k(a)) }
}

type Args<'a> = (
    *const u8,
    &'a [(usize, usize, usize)],
    &'a [(usize, usize, usize)],
    usize,
    usize,
    &'a [f32],
    usize,
    usize,
    &'a mut [f32],
    usize,
);

/// [`pv_transposed`] for rows of kind `K`.
///
/// # Safety
/// As [`pv_transposed`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_transposed_k<const K: u8>(a: Args<'_>) {
    let (buf, runs, pf, dim, width, w, ld, g, out, ow) = a;
    let level = simd::prefetch_level();
    let esize = match K {
        F32 => 4,
        F16 | BF16 => 2,
        _ => 1,
    };
    let mut j0 = 0;
    while j0 < g {
        let hn = (g - j0).min(2);
        let mut d0 = 0;
        while d0 < width {
            let dn = (width - d0).min(4);
            let mut acc = [_mm256_setzero_ps(); 8];
            for (ri, &(off, i0, n)) in runs.iter().enumerate() {
                if let Some(&(pf_off, _, _)) = pf.get(ri).filter(|_| j0 == 0) {
                    // The lines of elements `d0 .. d0 + dn` of the later run.
                    let (first, end) = (pf_off + d0 * dim, pf_off + (d0 + dn) * dim);
                    let mut at = first & !63;
                    while at < end {
                        simd::prefetch_to(buf.wrapping_add(at), level);
                        at += 64;
                    }
                }
                let (n0, n1) = (n.min(8), n.saturating_sub(8));
                // SAFETY: weights `(j0 + h) * ld + i0 .. + n` are inside `w`, and elements
                // `d0 + dd` (below `width`) of the run's `n` tokens inside the buffer
                // (caller's contract); lanes past `n` are masked (weights) or read through a
                // zeroed copy (elements), so they add zero.
                unsafe {
                    let wv: [[__m256; 2]; 2] = std::array::from_fn(|h| {
                        let p = w.as_ptr().add((j0 + h.min(hn - 1)) * ld + i0);
                        [
                            _mm256_maskload_ps(p, lanes(n0)),
                            if n1 > 0 {
                                _mm256_maskload_ps(p.add(8), lanes(n1))
                            } else {
                                _mm256_setzero_ps()
                            },
                        ]
                    });
                    for dd in 0..dn {
                        let p = buf.add(off + (d0 + dd) * dim);
                        let x0 = load::<K>(p, 0, n0);
                        let x1 = if n1 > 0 {
                            load::<K>(p.add(8 * esize), 0, n1)
                        } else {
                            _mm256_setzero_ps()
                        };
                        for (h, wh) in wv.iter().enumerate() {
                            let k = h * 4 + dd;
                            acc[k] = _mm256_fmadd_ps(wh[0], x0, acc[k]);
                            acc[k] = _mm256_fmadd_ps(wh[1], x1, acc[k]);
                        }
                    }
                }
            }
            let mut sums = [0f32; 8];
            // SAFETY: `sums` holds 8 floats.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), hsum8(acc)) };
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
