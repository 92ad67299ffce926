//! The AVX-512 online-softmax step (weights, running maxima, partial sums, rescaled
//! accumulators) and the logits' adjustment (key scales, soft-cap), with the exponential and
//! tanh they share.

use std::arch::x86_64::*;

use super::mask;
use crate::decode::kernels::args::SoftmaxStep;
use crate::decode::kernels::rows::{weight, SUM_LANES, WEIGHT_FLOOR};

/// The softmax step of `kernels::softmax_tile`. Once the running maximum of a head has
/// settled, a step needs no horizontal reduction: one comparison shows that no logit exceeds
/// it (only then is the tile's maximum reduced and the state rescaled), and the weights are
/// summed lane by lane into the head's partial sums.
///
/// # Safety
/// AVX-512 F/BW/VL present; the lengths of `kernels::softmax_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::decode::kernels) unsafe fn softmax_tile(step: SoftmaxStep<'_>) {
    let (round, nt, g, wscale, vscale) = (step.round, step.nt, step.g, step.wscale, step.vscale);
    let (logits, ld, maxes, sums) = (step.logits.data, step.logits.stride, step.maxes, step.sums);
    let (acc, s) = (step.acc.data, step.acc.stride);
    let nv = nt.div_ceil(16);
    let scale = wscale != 1.0 || vscale.is_some();
    for j in 0..g {
        let l = &mut logits[j * ld..j * ld + nt];
        let sp = sums[j * SUM_LANES..(j + 1) * SUM_LANES].as_mut_ptr();
        // SAFETY: for the whole block, the masked lanes stay inside `l` (and `vscale`, `nt`
        // long); the partial sums of head `j` are `SUM_LANES` = 16 floats.
        unsafe {
            let mut sum = _mm512_loadu_ps(sp);
            let old = _mm512_set1_ps(maxes[j]);
            let mut above = 0;
            for v in 0..nv {
                let x = _mm512_maskz_loadu_ps(mask(nt - v * 16), l[v * 16..].as_ptr());
                above |= _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(mask(nt - v * 16), x, old);
            }
            if above != 0 {
                let mut m = old;
                for v in 0..nv {
                    let x = _mm512_mask_loadu_ps(m, mask(nt - v * 16), l[v * 16..].as_ptr());
                    m = _mm512_max_ps(m, x);
                }
                let m = _mm512_reduce_max_ps(m);
                let c = weight(maxes[j] - m);
                sum = _mm512_mul_ps(sum, _mm512_set1_ps(c));
                for x in &mut acc[j * s..(j + 1) * s] {
                    *x *= c;
                }
                maxes[j] = m;
            }
            let m = _mm512_set1_ps(maxes[j]);
            for v in 0..nv {
                let k = mask(nt - v * 16);
                let p = l[v * 16..].as_mut_ptr();
                let mut r = weights(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p), m));
                if round {
                    r = round_bf16(r);
                }
                sum = _mm512_mask_add_ps(sum, k, sum, r);
                if scale {
                    r = _mm512_mul_ps(r, _mm512_set1_ps(wscale));
                    if let Some(vs) = vscale {
                        r = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(k, vs[v * 16..].as_ptr()));
                    }
                }
                _mm512_mask_storeu_ps(p, k, r);
            }
            _mm512_storeu_ps(sp, sum);
        }
    }
}

/// `x` rounded to the nearest bf16 (ties to even), as f32; `x` finite.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn round_bf16(x: __m512) -> __m512 {
    let b = _mm512_castps_si512(x);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb);
    _mm512_castsi512_ps(_mm512_and_si512(
        r,
        _mm512_set1_epi32(0xFFFF_0000u32 as i32),
    ))
}

/// `kernels::adjust_logits` on one row: `l[i] *= ks[i]`, then `c * tanh(l / c)` with a cap.
///
/// # Safety
/// AVX-512 F/BW/VL present; `ks` as long as `l`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::decode::kernels) unsafe fn adjust_logits(
    l: &mut [f32],
    ks: &[f32],
    cap: Option<f32>,
) {
    let n = l.len();
    let mut i = 0;
    while i < n {
        let k = mask(n - i);
        // SAFETY: lanes `i .. min(i + 16, n)` of `l` and `ks` (as long) are in bounds; the
        // mask selects exactly those.
        unsafe {
            let p = l.as_mut_ptr().add(i);
            let x = _mm512_mul_ps(
                _mm512_maskz_loadu_ps(k, p),
                _mm512_maskz_loadu_ps(k, ks.as_ptr().add(i)),
            );
            let x = match cap {
                Some(c) => {
                    _mm512_mul_ps(_mm512_set1_ps(c), tanh(_mm512_div_ps(x, _mm512_set1_ps(c))))
                }
                None => x,
            };
            _mm512_mask_storeu_ps(p, k, x);
        }
        i += 16;
    }
}

/// `tanh(x)` per lane: `(1 - e) / (1 + e)` with `e = e^-2|x|` and the sign of `x` (|x| past 9
/// gives 1, as in f32), within 1.2e-7 absolute.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn tanh(x: __m512) -> __m512 {
    let a = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(9.0));
    let e = exp_approx(_mm512_mul_ps(a, _mm512_set1_ps(-2.0)));
    let one = _mm512_set1_ps(1.0);
    let t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    let sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN));
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign))
}

/// `e^x` per lane as softmax weights: zero below [`WEIGHT_FLOOR`], and for NaN.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn weights(x: __m512) -> __m512 {
    let floor = _mm512_set1_ps(WEIGHT_FLOOR);
    let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, floor);
    _mm512_maskz_mov_ps(keep, exp_approx(_mm512_max_ps(x, floor)))
}

/// `e^x` per lane for `x` in [-87, 88] (a degree-6 polynomial after range reduction).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn exp_approx(x: __m512) -> __m512 {
    let t = _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(std::f32::consts::LN_2));
    // e^f for |f| <= ln2 / 2, Taylor to degree 6.
    let mut y = _mm512_set1_ps(1.0 / 720.0);
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0 / 120.0));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0 / 24.0));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0 / 6.0));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.5));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0));
    _mm512_scalef_ps(y, n)
}
