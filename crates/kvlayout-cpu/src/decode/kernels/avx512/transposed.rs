//! The AVX-512 kernel of transposed values (the legacy vLLM value: a block's tokens side by
//! side for each element index), read in place with one token per lane.

use std::arch::x86_64::*;

use super::{fp8_halves, hsum16, mask, FP8_E4M3_HALF_SCALE};
use crate::arch::{prefetch_bytes, PrefetchLevel};
use crate::decode::kernels::args::{Run, TransposedArgs};
use crate::decode::kernels::rows::codes::{BF16, E4M3, E4M3_RAW, E5M2, F16, F32, I8};
use crate::decode::kernels::rows::RowKind;

/// Transposed value rows (see `TransposedArgs`): run `(off, i0, n)` (`n <= 16`) holds, for
/// each element index `d`, tokens `i0 .. i0 + n` side by side at `buf + off + d * dim`. One
/// token per lane, in order: fp8 bytes are zero-extended and their sign and magnitude bits
/// moved as in `load` (with `raw`, without the power of two), int8 sign-extended.
/// `out[j * ow + d] += sum over the runs and their tokens t of w[j * ld + i0 + t] * v(d, t)`
/// for the `g` heads and the `width` elements, in natural order. Per block of 4 heads x 4
/// elements, the 16 accumulators hold one lane per token of a run across all the runs, and
/// are reduced once.
///
/// # Safety
/// AVX-512 F/BW/VL present; each run's bytes `off .. off + (width - 1) * dim + n * elem`
/// inside `buf`; `w.len() >= (g - 1) * ld + i0 + n` for each run;
/// `out.len() >= (g - 1) * ow + width`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::decode::kernels) unsafe fn pv_transposed(
    kind: RowKind,
    raw: bool,
    a: TransposedArgs<'_>,
) {
    // SAFETY: in each arm, the caller's contract.
    unsafe { by_kind!(kind, raw, pv_transposed_k(a)) }
}

/// [`pv_transposed`] for rows of kind `K`.
///
/// # Safety
/// As [`pv_transposed`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pv_transposed_k<const K: u8>(a: TransposedArgs<'_>) {
    let (buf, runs, pf, dim, width) = (a.buf.as_ptr(), a.runs, a.pf, a.dim, a.width);
    let (w, ld, g, out, ow, level) = (a.w.data, a.w.stride, a.g, a.out.data, a.out.stride, a.level);
    let mut j0 = 0;
    while j0 < g {
        let hn = (g - j0).min(4);
        let mut d0 = 0;
        while d0 < width {
            let dn = (width - d0).min(4);
            // The later step's runs, prefetched along the first head block.
            let pf = if j0 == 0 { pf } else { &[] };
            let b = Block {
                buf,
                runs,
                pf,
                level,
                dim,
                w,
                ld,
                j0,
                d0,
            };
            // SAFETY: the caller's contract, for heads `j0 ..` and elements `d0 ..`.
            let sums = unsafe {
                if hn == 4 && dn == 4 {
                    transposed_block::<K, true>(&b, 4, 4)
                } else {
                    transposed_block::<K, false>(&b, hn, dn)
                }
            };
            add_sums(sums, out, ow, d0, j0, dn, hn);
            d0 += 4;
        }
        j0 += 4;
    }
}

/// A block of [`pv_transposed_k`]: the buffer, the runs, those prefetched along them and the
/// level, the element rows' stride, the weights (rows `ld` apart), the block's first head and
/// first element.
#[derive(Clone, Copy)]
struct Block<'a> {
    buf: *const u8,
    runs: &'a [Run],
    pf: &'a [Run],
    level: PrefetchLevel,
    dim: usize,
    w: &'a [f32],
    ld: usize,
    j0: usize,
    d0: usize,
}

/// The sums of [`pv_transposed`] for heads `j0 .. j0 + hn` and elements `d0 .. d0 + dn`
/// of block `b` (at most 4 each; 4 and 4 when `FULL`), as `hsum16` leaves them (lane
/// `h * 4 + dd`). The same elements of each run of `b.pf` are prefetched (to `b.level`) with
/// the run of `b.runs` at its index.
///
/// # Safety
/// As [`pv_transposed`], for those heads and elements.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn transposed_block<const K: u8, const FULL: bool>(
    b: &Block<'_>,
    hn: usize,
    dn: usize,
) -> __m512 {
    let Block {
        buf,
        runs,
        pf,
        level,
        dim,
        w,
        ld,
        j0,
        d0,
    } = *b;
    let z = _mm512_setzero_ps();
    let (hn, dn) = if FULL { (4, 4) } else { (hn, dn) };
    let mut acc = [z; 16];
    for (ri, &Run { off, i0, n }) in runs.iter().enumerate() {
        if let Some(&Run { off: pf_off, .. }) = pf.get(ri) {
            // The lines of elements `d0 .. d0 + dn` of the later run.
            let (first, end) = (pf_off + d0 * dim, pf_off + (d0 + dn) * dim);
            prefetch_bytes(buf, first, end, level);
        }
        let m = mask(n);
        // SAFETY: weights `(j0 + h) * ld + i0 .. + n` are inside `w`, and elements `d0 + dd`
        // (below `width`) of the run inside the buffer (caller's contract); masked-off lanes
        // are not read.
        unsafe {
            let wv: [__m512; 4] = std::array::from_fn(|h| {
                if h < hn {
                    _mm512_maskz_loadu_ps(m, w.as_ptr().add((j0 + h) * ld + i0))
                } else {
                    z
                }
            });
            for dd in 0..dn {
                let x = transposed_lanes::<K>(buf.add(off + (d0 + dd) * dim), m);
                for (h, wh) in wv.iter().enumerate() {
                    // Lane `h * 4 + dd` of the reduction (see `hsum16`).
                    let l = h * 4 + dd;
                    let a = l % 4 * 4 + l / 4;
                    acc[a] = _mm512_fmadd_ps(*wh, x, acc[a]);
                }
            }
        }
    }
    hsum16(acc)
}

/// The lanes of `m` (at most 16 consecutive elements of kind `K` at `p`) widened to f32,
/// zeros elsewhere.
///
/// # Safety
/// AVX-512 F/BW/VL present; the elements `m` selects lie inside the buffer `p` points into
/// (masked-off lanes are not read).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn transposed_lanes<const K: u8>(p: *const u8, m: __mmask16) -> __m512 {
    // SAFETY: the caller's contract; masked loads suppress faults on masked-off lanes.
    unsafe {
        match K {
            F32 => _mm512_maskz_loadu_ps(m, p as *const f32),
            F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16)),
            BF16 => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_maskz_loadu_epi16(m, p as *const i16),
            ))),
            I8 => _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(
                m,
                p as *const i8,
            ))),
            _ => fp8_lanes(K, _mm_maskz_loadu_epi8(m, p as *const i8)),
        }
    }
}

/// `out[(j0 + h) * ow + d0 + dd] += ` lane `h * 4 + dd` of `sums` (as `hsum16` leaves a block
/// of 4 heads x 4 elements), for `h < hn` and `dd < dn`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn add_sums(sums: __m512, out: &mut [f32], ow: usize, d0: usize, j0: usize, dn: usize, hn: usize) {
    let m = mask(dn) as __mmask8;
    for h in 0..hn {
        let at = (j0 + h) * ow + d0;
        let dst = out[at..at + dn].as_mut_ptr();
        let v = match h {
            0 => _mm512_castps512_ps128(sums),
            1 => _mm512_extractf32x4_ps::<1>(sums),
            2 => _mm512_extractf32x4_ps::<2>(sums),
            _ => _mm512_extractf32x4_ps::<3>(sums),
        };
        // SAFETY: `dst` starts `dn` in-bounds floats; the masks read and write exactly those.
        unsafe { _mm_mask_storeu_ps(dst, m, _mm_add_ps(_mm_maskz_loadu_ps(m, dst), v)) }
    }
}

/// 16 fp8 bytes of kind `k`, one per lane in order, as f32: the value, or for `E4M3_RAW`
/// the value times 2^-8 (see [`fp8_halves`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn fp8_lanes(k: u8, bytes: __m128i) -> __m512 {
    let b = _mm256_zextsi128_si256(bytes);
    let h = if k == E4M3 || k == E4M3_RAW {
        fp8_halves::<E4M3>(b)
    } else {
        fp8_halves::<E5M2>(b)
    };
    let v = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    if k == E4M3 {
        _mm512_mul_ps(v, _mm512_set1_ps(FP8_E4M3_HALF_SCALE))
    } else {
        v
    }
}
