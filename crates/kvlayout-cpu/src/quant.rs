//! Row encoders of `write_kv` for the one-byte dtypes (fp8 e4m3 and e5m2, int8): each element
//! divided by the per-tensor scale, then by the row's inline scale, then encoded exactly as
//! [`crate::elem::encode`] does (which the reference uses), 16 at a time on AVX-512, 8 on
//! AVX2.
//!
//! fp8 as in `cuda_fp8.hpp` (the `float8` crate): round to nearest even, finite values and
//! infinities past the largest finite one saturate to it, NaN keeps its sign (e4m3: `0x7F`;
//! e5m2: `0x7E` or `0x7F`, the top mantissa bit of the NaN's f32 low). int8: half away from
//! zero, saturated at +-127, NaN to 0.

use kvlayout::DType;

use crate::arch::Isa;
use crate::elem::encode;

/// `out[i]` = the encoding of `xs[i] / tensor / q` in `dtype` (one byte per element for fp8
/// and int8; any other dtype goes element by element through [`encode`]), with the build
/// `isa` (one this machine runs).
pub(crate) fn encode_row(isa: Isa, dtype: DType, xs: &[f32], tensor: f32, q: f32, out: &mut [u8]) {
    let e = dtype.size_bytes() as usize;
    assert_eq!(out.len(), xs.len() * e, "one encoded element per value");
    assert!(
        isa.runs(),
        "{} build on a machine that does not run it",
        isa.name()
    );
    #[cfg(target_arch = "x86_64")]
    if e == 1 && dtype != DType::U8 {
        if isa.avx512() {
            // SAFETY: AVX-512 F/BW/VL present (asserted above); `out` is as long as `xs`.
            return unsafe { avx512::encode_row(dtype, xs, tensor, q, out) };
        }
        if isa == Isa::Avx2 {
            // SAFETY: AVX2 present (asserted above); `out` is as long as `xs`.
            return unsafe { avx2::encode_row(dtype, xs, tensor, q, out) };
        }
    }
    for (v, o) in xs.iter().zip(out.chunks_exact_mut(e)) {
        encode(dtype, v / tensor / q, o);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use kvlayout::DType;
    use std::arch::x86_64::*;

    /// [`super::encode_row`] for fp8 and int8, 8 elements at a time.
    ///
    /// # Safety
    /// AVX2 present; `out.len() == xs.len()`; `dtype` fp8 or int8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn encode_row(dtype: DType, xs: &[f32], tensor: f32, q: f32, out: &mut [u8]) {
        let (t, qv) = (_mm256_set1_ps(tensor), _mm256_set1_ps(q));
        // Byte 0 of each dword of a 128-bit lane into that lane's first four bytes.
        let low_bytes = _mm256_setr_epi8(
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
            -1, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        let mut i = 0;
        while i < xs.len() {
            let n = (xs.len() - i).min(8);
            let x = if n == 8 {
                // SAFETY: `xs[i .. i + 8]` is in bounds.
                unsafe { _mm256_loadu_ps(xs.as_ptr().add(i)) }
            } else {
                let mut lanes = [0f32; 8];
                lanes[..n].copy_from_slice(&xs[i..i + n]);
                // SAFETY: `lanes` holds 8 floats.
                unsafe { _mm256_loadu_ps(lanes.as_ptr()) }
            };
            let x = _mm256_div_ps(_mm256_div_ps(x, t), qv);
            let code = match dtype {
                DType::Fp8E4m3 => fp8::<3, 7>(x),
                DType::Fp8E5m2 => fp8::<2, 15>(x),
                _ => int8(x),
            };
            let b = _mm256_shuffle_epi8(code, low_bytes);
            let packed =
                _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
            let bytes = (_mm_cvtsi128_si64(packed) as u64).to_le_bytes();
            out[i..i + n].copy_from_slice(&bytes[..n]);
            i += 8;
        }
    }

    /// As the AVX-512 `fp8`, 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fp8<const M: u32, const B: i32>(x: __m256) -> __m256i {
        let bits = _mm256_castps_si256(x);
        let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), _mm256_set1_epi32(0x80));
        let abs_bits = _mm256_and_si256(bits, _mm256_set1_epi32(i32::MAX));
        let a = _mm256_castsi256_ps(abs_bits);
        let shift = _mm_cvtsi32_si128((23 - M) as i32);
        let half = _mm256_set1_epi32((1i32 << (22 - M)) - 1);
        let odd = _mm256_and_si256(_mm256_srl_epi32(abs_bits, shift), _mm256_set1_epi32(1));
        let rounded = _mm256_add_epi32(_mm256_add_epi32(abs_bits, half), odd);
        let normal = _mm256_sub_epi32(
            _mm256_srl_epi32(rounded, shift),
            _mm256_set1_epi32((127 - B) << M),
        );
        let max_code = if M == 3 { 0x7E } else { 0x7B };
        let normal = _mm256_min_epi32(normal, _mm256_set1_epi32(max_code));
        let min_normal = f32::from_bits(((128 - B) as u32) << 23);
        let scale = f32::from_bits(((127 + B - 1 + M as i32) as u32) << 23);
        let sub = _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(a, _mm256_set1_ps(scale))));
        let small = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(min_normal)));
        let code = _mm256_blendv_epi8(normal, sub, small);
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        let nan_code = if M == 3 {
            _mm256_set1_epi32(0x7F)
        } else {
            _mm256_or_si256(
                _mm256_set1_epi32(0x7E),
                _mm256_and_si256(_mm256_srli_epi32::<21>(abs_bits), _mm256_set1_epi32(3)),
            )
        };
        _mm256_or_si256(_mm256_blendv_epi8(code, nan_code, nan), sign)
    }

    /// As the AVX-512 `int8`, 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn int8(x: __m256) -> __m256i {
        let sign = _mm256_set1_ps(-0.0);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
        let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(x, t));
        let away = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        let one = _mm256_or_ps(_mm256_set1_ps(1.0), _mm256_and_ps(sign, x));
        let r = _mm256_add_ps(t, _mm256_and_ps(one, away));
        let r = _mm256_max_ps(
            _mm256_min_ps(r, _mm256_set1_ps(127.0)),
            _mm256_set1_ps(-127.0),
        );
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        _mm256_cvtps_epi32(_mm256_andnot_ps(nan, r))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use kvlayout::DType;
    use std::arch::x86_64::*;

    /// [`super::encode_row`] for fp8 and int8.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL present; `out.len() == xs.len()`; `dtype` fp8 or int8.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn encode_row(dtype: DType, xs: &[f32], tensor: f32, q: f32, out: &mut [u8]) {
        let (t, qv) = (_mm512_set1_ps(tensor), _mm512_set1_ps(q));
        let mut i = 0;
        while i < xs.len() {
            let n = (xs.len() - i).min(16);
            let k = ((1u32 << n) - 1) as __mmask16;
            // SAFETY: lanes `i .. i + n` of `xs` and `out` are in bounds (equal lengths); the
            // mask selects exactly those.
            unsafe {
                let x = _mm512_maskz_loadu_ps(k, xs.as_ptr().add(i));
                let x = _mm512_div_ps(_mm512_div_ps(x, t), qv);
                let code = match dtype {
                    DType::Fp8E4m3 => fp8::<3, 7>(x),
                    DType::Fp8E5m2 => fp8::<2, 15>(x),
                    _ => int8(x),
                };
                _mm512_mask_cvtepi32_storeu_epi8(out.as_mut_ptr().add(i).cast(), k, code);
            }
            i += 16;
        }
    }

    /// The fp8 code (in the low byte of each lane) of `x` with `M` mantissa bits and exponent
    /// bias `B`: round to nearest even, saturate at the largest finite value, NaN as the
    /// `float8` crate encodes it.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn fp8<const M: u32, const B: i32>(x: __m512) -> __m512i {
        let bits = _mm512_castps_si512(x);
        let sign = _mm512_and_si512(_mm512_srli_epi32::<24>(bits), _mm512_set1_epi32(0x80));
        let abs_bits = _mm512_and_si512(bits, _mm512_set1_epi32(i32::MAX));
        let a = _mm512_castsi512_ps(abs_bits);
        // Normal: the f32 exponent and top mantissa bits, rounded to nearest even at bit
        // 23 - M, then rebiased; past the largest finite code (0x7E / 0x7B), saturated.
        let shift = 23 - M;
        let half = _mm512_set1_epi32((1i32 << (shift - 1)) - 1);
        let odd = _mm512_and_si512(
            _mm512_srlv_epi32(abs_bits, _mm512_set1_epi32(shift as i32)),
            _mm512_set1_epi32(1),
        );
        let rounded = _mm512_add_epi32(_mm512_add_epi32(abs_bits, half), odd);
        let normal = _mm512_sub_epi32(
            _mm512_srlv_epi32(rounded, _mm512_set1_epi32(shift as i32)),
            _mm512_set1_epi32((127 - B) << M),
        );
        let max_code = if M == 3 { 0x7E } else { 0x7B };
        let normal = _mm512_min_epi32(normal, _mm512_set1_epi32(max_code));
        // Below the smallest normal (2^(1 - B)): multiples of 2^(1 - B - M), rounded to
        // nearest even by the FPU (exact scaling by a power of two first).
        let min_normal = f32::from_bits(((128 - B) as u32) << 23);
        let scale = f32::from_bits(((127 + B - 1 + M as i32) as u32) << 23);
        let sub = _mm512_cvtps_epi32(_mm512_roundscale_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm512_mul_ps(a, _mm512_set1_ps(scale))));
        let small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, _mm512_set1_ps(min_normal));
        let code = _mm512_mask_mov_epi32(normal, small, sub);
        // NaN: e4m3 0x7F; e5m2 0x7E | the top two mantissa bits.
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        let nan_code = if M == 3 {
            _mm512_set1_epi32(0x7F)
        } else {
            _mm512_or_si512(
                _mm512_set1_epi32(0x7E),
                _mm512_and_si512(_mm512_srli_epi32::<21>(abs_bits), _mm512_set1_epi32(3)),
            )
        };
        _mm512_or_si512(_mm512_mask_mov_epi32(code, nan, nan_code), sign)
    }

    /// int8 codes: half away from zero, saturated at +-127, NaN to 0.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn int8(x: __m512) -> __m512i {
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
        // `x - t` is exact; a fraction of one half or more moves away from zero.
        let frac = _mm512_abs_ps(_mm512_sub_ps(x, t));
        let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
        let one = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(_mm512_set1_ps(1.0)),
            _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN)),
        ));
        let r = _mm512_mask_add_ps(t, away, t, one);
        let r = _mm512_max_ps(
            _mm512_min_ps(r, _mm512_set1_ps(127.0)),
            _mm512_set1_ps(-127.0),
        );
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_maskz_cvtps_epi32(!nan, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value class against the element encoder, bit for bit: a dense sweep of f32 bit
    /// patterns over and around each dtype's range (every 61st pattern from 2^-30 up to 2^20,
    /// both signs), the fp8 grid's exact midpoints (ties) and their neighbours, zeros,
    /// infinities, NaNs, f32 subnormals; with scales that are and are not powers of two.
    #[test]
    fn rows_match_the_element_encoder() {
        let mut xs: Vec<f32> = Vec::new();
        let (lo, hi) = ((127 - 30u32) << 23, (127 + 20u32) << 23);
        for b in (lo..hi).step_by(61) {
            xs.push(f32::from_bits(b));
            xs.push(-f32::from_bits(b));
        }
        for dtype in [DType::Fp8E4m3, DType::Fp8E5m2] {
            for code in 0u8..=255 {
                let mut b = [code];
                let v = crate::elem::decode(dtype, &b);
                b[0] = code.wrapping_add(1);
                let next = crate::elem::decode(dtype, &b);
                if v.is_finite() && next.is_finite() {
                    let mid = (v + next) / 2.0;
                    for m in [
                        mid,
                        f32::from_bits(mid.to_bits() + 1),
                        f32::from_bits(mid.to_bits() - 1),
                    ] {
                        xs.extend([m, -m]);
                    }
                }
            }
        }
        for v in -300..=300 {
            xs.push(v as f32 * 0.5);
            xs.push(v as f32 * 0.5 + 1e-3);
        }
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7FA0_0000),
            f32::from_bits(0xFFC0_0001),
            f32::MIN_POSITIVE / 4.0,
            -f32::MIN_POSITIVE,
            f32::MAX,
            0.49999997,
            -0.49999997,
            126.5,
            -127.5,
            8388609.0,
        ]);
        for dtype in [DType::Fp8E4m3, DType::Fp8E5m2, DType::Int8] {
            for (tensor, q) in [
                (1.0f32, 1.0f32),
                (0.5, 1.0),
                (1.0, 0.37),
                (3.0, 1.0 / 448.0),
            ] {
                for isa in crate::arch::available() {
                    let mut got = vec![0u8; xs.len()];
                    encode_row(isa, dtype, &xs, tensor, q, &mut got);
                    for (i, (&x, &g)) in xs.iter().zip(&got).enumerate() {
                        let mut want = [0u8];
                        encode(dtype, x / tensor / q, &mut want);
                        assert_eq!(
                            g,
                            want[0],
                            "{isa:?} {dtype} x {x:e} (bits {:#x}) / {tensor} / {q}, element {i}",
                            x.to_bits()
                        );
                    }
                }
            }
        }
    }
}
