//! The AVX2 + FMA + F16C kernels of the decode (x86_64 machines without AVX-512): rows of every
//! kind read in place and widened to f32 in registers, eight elements at a time (bf16 by a
//! shift, f16 by `vcvtph2ps`, fp8 through f16 as the AVX-512 kernels do, int8 by `vcvtdq2ps`),
//! then register-blocked loops: the logits of 2 rows x 4 query heads (4 x 2 for groups of 2 or
//! 3, 8 x 1 for one) share 8 accumulators and one transposed reduction (`keys`); the values of
//! up to 4 heads x 16 elements stay in registers across all rows of the tile (`values`); the
//! softmax weights eight at a time (here). The rows of the next step are prefetched line by
//! line as the current ones are read. Rows, query rows and accumulators are in natural order,
//! unpadded: the last partial vector of a row is read through a zeroed copy (rows) or with
//! lane masks (query rows, accumulators). The legacy vLLM layout is read in place too: x-split
//! keys by the logits kernel (`keys::qk_split`), transposed values by a kernel of their own
//! (`transposed`).

use std::arch::x86_64::*;

use crate::arch::{prefetch_to, PrefetchLevel};
use crate::decode::kernels::rows::codes::{esize, BF16, E4M3, E5M2, F16, F32, I8};
use crate::decode::kernels::rows::{SPLIT_PIECE, WEIGHT_FLOOR};

mod keys;
mod transposed;
mod values;

pub(super) use keys::{qk, qk_split};
pub(super) use transposed::pv_transposed;
pub(super) use values::pv;

/// Lane mask selecting the first `n` (at most 8) of 8 floats, for `vmaskmovps`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lanes(n: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), idx)
}

/// Elements `d .. d + 8` of a row of kind `K` widened to f32 (exactly); of the last partial
/// vector (`n < 8` valid elements) the bytes past the row are not read: they are copied into
/// a zeroed buffer first.
///
/// # Safety
/// AVX2, FMA and F16C present; elements `d .. d + n` lie inside the row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load<const K: u8>(row: *const u8, d: usize, n: usize) -> __m256 {
    let e = esize(K);
    if n >= 8 {
        // SAFETY: the 8 elements lie inside the row (caller's contract).
        return unsafe { widen8::<K>(row.wrapping_add(d * e)) };
    }
    let mut buf = [0u8; 32];
    // SAFETY: the first `n` elements lie inside the row (caller's contract); `buf` holds 8
    // elements of any kind.
    unsafe {
        std::ptr::copy_nonoverlapping(row.add(d * e), buf.as_mut_ptr(), n * e);
        widen8::<K>(buf.as_ptr())
    }
}

/// [`load`] for a row split into 16-byte pieces `chunk` bytes apart (the legacy vLLM key:
/// element `d` at `(d / x) * chunk + (d % x) * esize`, `x` = 16 bytes of elements): `d` a
/// multiple of 8, the `n` valid elements whole pieces. Eight elements of 2 bytes or less lie
/// in one piece; eight f32 in two, put side by side.
///
/// # Safety
/// AVX2, FMA and F16C present; the pieces holding elements `d .. d + n` lie inside the row's
/// buffer.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_split<const K: u8>(row: *const u8, d: usize, n: usize, chunk: usize) -> __m256 {
    const PIECE: usize = SPLIT_PIECE;
    let x = PIECE / esize(K);
    // SAFETY: the pieces of elements `d .. d + n` lie inside the buffer (caller's contract);
    // no other byte is read.
    unsafe {
        if x >= 8 {
            return load::<K>(row.wrapping_add((d / x) * chunk + (d % x) * esize(K)), 0, n);
        }
        let piece = |c: usize| _mm_loadu_si128(row.add(c * chunk).cast());
        let hi = if n > x {
            piece(d / x + 1)
        } else {
            _mm_setzero_si128()
        };
        _mm256_castsi256_ps(_mm256_set_m128i(hi, piece(d / x)))
    }
}

/// The 8 elements of kind `K` at `p`, widened to f32.
///
/// # Safety
/// AVX2, FMA and F16C present; `p` valid for 8 elements of kind `K`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen8<const K: u8>(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        match K {
            F32 => _mm256_loadu_ps(p.cast()),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            BF16 => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p.cast()),
            ))),
            I8 => _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))),
            _ => fp8_lanes::<K>(_mm_loadl_epi64(p.cast())),
        }
    }
}

/// 8 fp8 bytes (the low half of `b`) of kind `K` as f32, through f16 (as the AVX-512 kernels
/// do): e4m3 moved to f16 bits as its value times 2^-8 (subnormals too), multiplied back
/// unless `E4M3_RAW`; e5m2 the high byte of its own f16. `vcvtph2ps` takes f16 subnormals at
/// full speed; no f32 subnormal reaches an FMA.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fp8_lanes<const K: u8>(b: __m128i) -> __m256 {
    if K == E5M2 {
        return _mm256_cvtph_ps(_mm_slli_epi16::<8>(_mm_cvtepu8_epi16(b)));
    }
    let w = _mm_slli_epi16::<7>(_mm_cvtepi8_epi16(b));
    let v = _mm256_cvtph_ps(_mm_and_si128(w, _mm_set1_epi16(0xBF80u16 as i16)));
    if K == E4M3 {
        _mm256_mul_ps(v, _mm256_set1_ps(256.0))
    } else {
        v
    }
}

/// Lane `k` of the result is the horizontal sum of `v[k]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum8(v: [__m256; 8]) -> __m256 {
    // Per 128-bit half: [v0 pair sums, v1 pair sums] and so on.
    let p: [__m256; 4] = std::array::from_fn(|k| _mm256_hadd_ps(v[2 * k], v[2 * k + 1]));
    // Per half: the half-sums of v0..v3 (q0) and v4..v7 (q1).
    let q0 = _mm256_hadd_ps(p[0], p[1]);
    let q1 = _mm256_hadd_ps(p[2], p[3]);
    let lo = _mm256_permute2f128_ps::<0x20>(q0, q1);
    let hi = _mm256_permute2f128_ps::<0x31>(q0, q1);
    _mm256_add_ps(lo, hi)
}

/// Prefetches the lines of the `bytes` bytes from `p` (a hint: never faults).
#[inline]
fn prefetch_row(p: *const u8, bytes: usize, level: PrefetchLevel) {
    for at in (0..bytes).step_by(64) {
        prefetch_to(p.wrapping_add(at), level);
    }
}

/// The weights of one head's logits in place, `l[i] = e^(l[i] - m)` (`rows::weight`: zero
/// below the floor), then times `wscale` and `vscale[i]`; returns the sum of the weights
/// before those scales.
///
/// # Safety
/// AVX2, FMA and F16C present; `vscale`, when given, as long as `l`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::decode::kernels) unsafe fn weights(
    l: &mut [f32],
    m: f32,
    wscale: f32,
    vscale: Option<&[f32]>,
) -> f32 {
    let n = l.len();
    let (mv, ws) = (_mm256_set1_ps(m), _mm256_set1_ps(wscale));
    let mut sum = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        let k = lanes(n - i);
        // SAFETY: lanes `i .. min(i + 8, n)` of `l` (and `vscale`) are in bounds; the mask
        // selects exactly those.
        unsafe {
            let p = l.as_mut_ptr().add(i);
            let r = exp_floor(_mm256_sub_ps(_mm256_maskload_ps(p, k), mv));
            let r = _mm256_and_ps(r, _mm256_castsi256_ps(k));
            sum = _mm256_add_ps(sum, r);
            let mut r = _mm256_mul_ps(r, ws);
            if let Some(vs) = vscale {
                r = _mm256_mul_ps(r, _mm256_maskload_ps(vs.as_ptr().add(i), k));
            }
            _mm256_maskstore_ps(p, k, r);
        }
        i += 8;
    }
    let mut out = [0f32; 8];
    // SAFETY: `out` holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
    out.iter().sum()
}

/// `e^x` per lane, zero below [`WEIGHT_FLOOR`] and for NaN (a degree-6 polynomial
/// after range reduction, as the AVX-512 kernels compute it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp_floor(x: __m256) -> __m256 {
    let floor = _mm256_set1_ps(WEIGHT_FLOOR);
    let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, floor);
    let x = _mm256_max_ps(x, floor);
    let t = _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let f = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(std::f32::consts::LN_2));
    let mut y = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(c));
    }
    // 2^n for n in [-93, 88]: the exponent field built directly.
    let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    _mm256_and_ps(_mm256_mul_ps(y, pow2), keep)
}

/// `kernels::adjust_logits` on one row: `l[i] *= ks[i]`, then `c * tanh(l / c)` with a cap
/// (tanh as the AVX-512 build computes it, from the same exponential).
///
/// # Safety
/// AVX2, FMA and F16C present; `ks` as long as `l`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::decode::kernels) unsafe fn adjust_logits(
    l: &mut [f32],
    ks: &[f32],
    cap: Option<f32>,
) {
    let n = l.len();
    let mut i = 0;
    while i < n {
        let k = lanes(n - i);
        // SAFETY: lanes `i .. min(i + 8, n)` of `l` and `ks` (as long) are in bounds; the
        // mask selects exactly those.
        unsafe {
            let p = l.as_mut_ptr().add(i);
            let x = _mm256_mul_ps(
                _mm256_maskload_ps(p, k),
                _mm256_maskload_ps(ks.as_ptr().add(i), k),
            );
            let x = match cap {
                Some(c) => {
                    let c = _mm256_set1_ps(c);
                    _mm256_mul_ps(c, tanh(_mm256_div_ps(x, c)))
                }
                None => x,
            };
            _mm256_maskstore_ps(p, k, x);
        }
        i += 8;
    }
}

/// `tanh(x)` per lane: `(1 - e) / (1 + e)` with `e = e^-2|x|` and the sign of `x` (|x| past 9
/// gives 1, as in f32), within 1.2e-7 absolute.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tanh(x: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let a = _mm256_min_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(9.0));
    let e = exp_floor(_mm256_mul_ps(a, _mm256_set1_ps(-2.0)));
    let one = _mm256_set1_ps(1.0);
    let t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    _mm256_or_ps(t, _mm256_and_ps(sign, x))
}
