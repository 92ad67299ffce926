//! The AVX-512 F/BW/VL kernels of the decode: rows of every kind widened to f32 in registers
//! and multiplied with FMAs (bf16 and fp8 too, on machines without AVX-512 BF16). This module
//! holds the loads and widenings and the helpers the bf16-operand kernels share (`hsum16`,
//! `store_logits`, `pv_passes`, `prefetch_line`); the logits (`keys`, x-split rows too), the
//! values (`values`), the values of transposed rows (`transposed`) and the online-softmax step
//! (`softmax`) have modules of their own, and the bf16-operand build (`bf16`) too.

use std::arch::x86_64::*;

use crate::arch::{prefetch_to, PrefetchLevel};
use crate::decode::kernels::rows::codes::{esize, BF16, E4M3, E4M3_RAW, E5M2, F16, F32};
use crate::decode::kernels::rows::SPLIT_PIECE;

pub(super) mod bf16;
mod keys;
mod softmax;
mod transposed;
mod values;

pub(super) use keys::{qk_tile, qk_tile_split};
pub(super) use softmax::{adjust_logits, softmax_tile};
pub(super) use transposed::pv_transposed;
pub(super) use values::pv_tile;

/// Elements per block of the kernel order (see `Order`).
#[inline(always)]
const fn block(k: u8) -> usize {
    match k {
        BF16 | E4M3 | E4M3_RAW | E5M2 => 32,
        _ => 16,
    }
}

#[inline]
pub(super) fn mask(rem: usize) -> __mmask16 {
    if rem >= 16 {
        0xFFFF
    } else {
        ((1u32 << rem) - 1) as __mmask16
    }
}

#[inline]
pub(super) fn mask32(rem: usize) -> __mmask32 {
    if rem >= 32 {
        u32::MAX
    } else {
        (1u32 << rem) - 1
    }
}

/// Block `b` of a row of kind `K` (elements `b * block(K) ..`), its first `n` elements
/// (at most a block) widened to f32 in the kernel order: one vector (16 elements), or two
/// for bf16 (the 16 even elements, then the 16 odd ones) and fp8 (elements 0..16, then
/// 16..32). Lanes past `n` are zero and their bytes are not read.
///
/// fp8 goes through f16 (see [`fp8_halves`]): e4m3 as its value times 2^-8, which the plain
/// kind multiplies back (exact) and the `_RAW` kind leaves to the caller; e5m2 as itself.
/// No f32 subnormal is ever made, so none reaches an FMA.
///
/// `FULL`: the whole block (`n` is the block size), read without masks.
///
/// # Safety
/// AVX-512 F/BW/VL present; the first `n` elements of the block lie inside the row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load<const K: u8, const FULL: bool>(row: *const u8, b: usize, n: usize) -> [__m512; 2] {
    let p = row.wrapping_add(b * block(K) * esize(K));
    // SAFETY: the caller keeps the first `n` elements of the block inside the row; the
    // masks select exactly those (all of the block when `FULL`), and masked-off lanes are
    // not read (masked loads suppress faults).
    let x = unsafe {
        match K {
            F32 if FULL => _mm512_loadu_si512(p as *const __m512i),
            F32 => _mm512_maskz_loadu_epi32(mask(n), p as *const i32),
            F16 if FULL => _mm512_castsi256_si512(_mm256_loadu_si256(p as *const __m256i)),
            F16 => _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask(n), p as *const i16)),
            BF16 if FULL => _mm512_loadu_si512(p as *const __m512i),
            BF16 => _mm512_maskz_loadu_epi16(mask32(n), p as *const i16),
            E4M3 | E4M3_RAW | E5M2 if FULL => {
                _mm512_castsi256_si512(_mm256_loadu_si256(p as *const __m256i))
            }
            E4M3 | E4M3_RAW | E5M2 => {
                _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(mask32(n), p as *const i8))
            }
            _ if FULL => _mm512_castsi128_si512(_mm_loadu_si128(p as *const __m128i)),
            _ => _mm512_castsi128_si512(_mm_maskz_loadu_epi8(mask(n), p as *const i8)),
        }
    };
    widen::<K>(x)
}

/// [`load`] for a row split into pieces of 16 bytes (the legacy vLLM key, `x` = 16 bytes of
/// elements): piece `c` (elements `c * 16 / esize ..`) at `row + c * chunk`. A block is one
/// piece (int8), two (f16, fp8) or four (f32, bf16), put side by side in a register; pieces
/// past the block's first `n` elements are zero and not read (`n` a whole number of pieces).
///
/// # Safety
/// AVX-512 F/BW/VL present; the pieces holding the block's first `n` elements lie inside
/// the row's buffer.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_split<const K: u8, const FULL: bool>(
    row: *const u8,
    b: usize,
    n: usize,
    chunk: usize,
) -> [__m512; 2] {
    const PIECE: usize = SPLIT_PIECE;
    let pieces = block(K) * esize(K) / PIECE;
    let have = if FULL { pieces } else { n * esize(K) / PIECE };
    let first = row.wrapping_add(b * pieces * chunk);
    // SAFETY: pieces `0 .. have` of the block lie inside the buffer (caller's contract); the
    // others are not read.
    let piece = |c: usize| unsafe {
        if c < have {
            _mm_loadu_si128(first.add(c * chunk) as *const __m128i)
        } else {
            _mm_setzero_si128()
        }
    };
    let x = match pieces {
        1 => _mm512_castsi128_si512(piece(0)),
        2 => _mm512_castsi256_si512(_mm256_set_m128i(piece(1), piece(0))),
        _ => _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(piece(1), piece(0))),
            _mm256_set_m128i(piece(3), piece(2)),
        ),
    };
    widen::<K>(x)
}

/// The widening of [`load`]: a block of kind `K` (its bytes at the bottom of `x`, zero past
/// its elements) to f32 in the kernel order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn widen<const K: u8>(x: __m512i) -> [__m512; 2] {
    let z = _mm512_setzero_ps();
    match K {
        F32 => [_mm512_castsi512_ps(x), z],
        F16 => [_mm512_cvtph_ps(_mm512_castsi512_si256(x)), z],
        BF16 => {
            let even = _mm512_slli_epi32::<16>(x);
            let odd = _mm512_and_si512(x, _mm512_set1_epi32(0xFFFF_0000u32 as i32));
            [_mm512_castsi512_ps(even), _mm512_castsi512_ps(odd)]
        }
        E4M3 | E4M3_RAW | E5M2 => {
            let h = fp8_halves::<K>(_mm512_castsi512_si256(x));
            let v = [
                _mm512_cvtph_ps(_mm512_castsi512_si256(h)),
                _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h)),
            ];
            if K == E4M3 {
                let s = _mm512_set1_ps(FP8_E4M3_HALF_SCALE);
                [_mm512_mul_ps(v[0], s), _mm512_mul_ps(v[1], s)]
            } else {
                v
            }
        }
        _ => [
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_castsi512_si128(x))),
            z,
        ],
    }
}

/// Prefetches to `level` the line of `row` holding byte `at`, when `at` starts a line.
#[inline(always)]
pub(super) fn prefetch_line(row: *const u8, at: usize, level: PrefetchLevel) {
    if at.is_multiple_of(64) {
        prefetch_to(row.wrapping_add(at), level);
    }
}

/// Lane `4 * (a % 4) + a / 4` of the result is the horizontal sum of `v[a]` (so the sum
/// of `v[l % 4 * 4 + l / 4]` lands in lane `l`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) fn hsum16(v: [__m512; 16]) -> __m512 {
    // Fold pairs to 256 bits, then quadruples to 128-bit lanes (lane q of x[m] is v[4m+q]).
    let w: [__m512; 8] = std::array::from_fn(|k| {
        let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(v[2 * k], v[2 * k + 1]);
        let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(v[2 * k], v[2 * k + 1]);
        _mm512_add_ps(lo, hi)
    });
    let x: [__m512; 4] = std::array::from_fn(|m| {
        let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(w[2 * m], w[2 * m + 1]);
        let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(w[2 * m], w[2 * m + 1]);
        _mm512_add_ps(lo, hi)
    });
    // Within each 128-bit lane q: [sum x0, sum x1, sum x2, sum x3].
    let t01 = _mm512_add_ps(
        _mm512_unpacklo_ps(x[0], x[1]),
        _mm512_unpackhi_ps(x[0], x[1]),
    );
    let t23 = _mm512_add_ps(
        _mm512_unpacklo_ps(x[2], x[3]),
        _mm512_unpackhi_ps(x[2], x[3]),
    );
    let u = _mm512_castpd_ps(_mm512_unpacklo_pd(
        _mm512_castps_pd(t01),
        _mm512_castps_pd(t23),
    ));
    let h = _mm512_castpd_ps(_mm512_unpackhi_pd(
        _mm512_castps_pd(t01),
        _mm512_castps_pd(t23),
    ));
    _mm512_add_ps(u, h)
}

/// Stores the reduced dot products of rows `i0 .. i0 + R` x heads `j0 .. j0 + H` (lanes
/// `h * R + r`, as `hsum16` leaves them) into `logits[j * ld + i]`, dropping rows past `nt`
/// and heads past `g`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) fn store_logits<const R: usize, const H: usize>(
    sums: __m512,
    logits: &mut [f32],
    ld: usize,
    i0: usize,
    j0: usize,
    nt: usize,
    g: usize,
) {
    let nr = (nt - i0).min(R);
    let m = mask(nr);
    for h in 0..H.min(g - j0) {
        let at = (j0 + h) * ld + i0;
        let dst = logits[at..at + nr].as_mut_ptr();
        // SAFETY: `dst` starts `nr` in-bounds floats; the mask stores exactly those.
        unsafe {
            match R {
                16 => _mm512_mask_storeu_ps(dst, m, sums),
                8 => {
                    let v = if h == 0 {
                        _mm512_castps512_ps256(sums)
                    } else {
                        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sums)))
                    };
                    _mm256_mask_storeu_ps(dst, m as __mmask8, v)
                }
                _ => {
                    let v = match h {
                        0 => _mm512_castps512_ps128(sums),
                        1 => _mm512_extractf32x4_ps::<1>(sums),
                        2 => _mm512_extractf32x4_ps::<2>(sums),
                        _ => _mm512_extractf32x4_ps::<3>(sums),
                    };
                    _mm_mask_storeu_ps(dst, m as __mmask8, v)
                }
            }
        }
    }
}

/// Calls `pass(first head, heads, first vector, vectors)` for each pass of a value tile over
/// `g` accumulator rows of `vecs` vectors each: heads in blocks of 4, 2 or 1 and vectors in
/// chunks of 4, 2 (4 heads) or 8, 4 (fewer), so the accumulators of a pass (at most 16)
/// stay in registers. A chunk may run past `vecs` (the kernels skip those vectors).
pub(super) fn pv_passes(g: usize, vecs: usize, mut pass: impl FnMut(usize, usize, usize, usize)) {
    let mut j0 = 0;
    while j0 < g {
        let h = match (g - j0).min(4) {
            3 => 2,
            h => h,
        };
        let mut c0 = 0;
        while c0 < vecs {
            let c = match (h, vecs - c0) {
                (4, 3..) => 4,
                (4, _) => 2,
                (_, 5..) => 8,
                _ => 4,
            };
            pass(j0, h, c0, c);
            c0 += c;
        }
        j0 += h;
    }
}

/// The scale that turns the f16 [`fp8_halves`] makes of an e4m3 byte back into its value.
const FP8_E4M3_HALF_SCALE: f32 = 256.0;

/// The f16 bits of each fp8 byte of kind `K` (32 bytes to 32 words, in order): for e4m3 the
/// sign and the 7 magnitude bits moved to f16 bits 15 and 13..7, which is the value times
/// 2^-8 for normal and subnormal numbers alike (e4m3's exponent bias is 7, f16's 15); for
/// e5m2 the byte itself as the high byte (e5m2 is the top byte of an f16).
///
/// Why f16 and not f32 bits directly (one shift and one mask fewer): the value times 2^-120
/// that f32 bits would give is an f32 subnormal for every e4m3 subnormal (and an e5m2 one
/// times 2^-112), and an FMA with a subnormal input takes a slow microcode assist on Intel
/// cores, while `vcvtph2ps` widens f16 subnormals at full speed.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn fp8_halves<const K: u8>(bytes: __m256i) -> __m512i {
    if K == E4M3 || K == E4M3_RAW {
        // Sign-extended, the sign also lands on bit 14, which the mask clears.
        let w = _mm512_slli_epi16::<7>(_mm512_cvtepi8_epi16(bytes));
        _mm512_and_si512(w, _mm512_set1_epi16(0xBF80u16 as i16))
    } else {
        _mm512_slli_epi16::<8>(_mm512_cvtepu8_epi16(bytes))
    }
}

#[cfg(test)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn hsum16_lanes(v: [[f32; 16]; 16]) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: each array holds 16 floats.
    unsafe {
        let r = hsum16(std::array::from_fn(|a| _mm512_loadu_ps(v[a].as_ptr())));
        _mm512_storeu_ps(out.as_mut_ptr(), r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsum16_lane_order() {
        if !crate::arch::has_avx512() {
            use std::io::Write;
            // Straight to stderr, past the test harness's capture, so CI logs count it.
            let _ = writeln!(
                std::io::stderr().lock(),
                "skipped: hsum16 lane order: {}",
                crate::arch::Isa::Avx512
                    .runs_here()
                    .err()
                    .unwrap_or_default()
            );
            return;
        }
        let v: [[f32; 16]; 16] =
            std::array::from_fn(|a| std::array::from_fn(|l| (a * 100 + l) as f32));
        // SAFETY: AVX-512 detected.
        let s = unsafe { hsum16_lanes(v) };
        for a in 0..16 {
            let want: f32 = v[a].iter().sum();
            assert_eq!(s[4 * (a % 4) + a / 4], want, "accumulator {a}");
        }
    }
}
