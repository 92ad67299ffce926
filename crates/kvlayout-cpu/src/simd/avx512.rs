//! The AVX-512 F/BW/VL kernels of the decode: rows of every kind widened to f32 in registers
//! and multiplied with FMAs (bf16 and fp8 too, on machines without AVX-512 BF16), x-split
//! key rows read in place (`qk_tile_split`), and the helpers the bf16-operand kernels share
//! (`hsum16`, `store_logits`, `pv_passes`, `prefetch_line`, the argument tuples). The values
//! of transposed rows (`transposed`) and the online-softmax step (`softmax`) have modules of
//! their own; every AVX-512 build uses them.

use super::RowKind;
use std::arch::x86_64::*;

use super::codes::{BF16, E4M3, E4M3_RAW, E5M2, F16, F32, I8};

mod softmax;
mod transposed;

pub(super) use softmax::{adjust_logits, softmax_tile};
pub(super) use transposed::pv_transposed;

/// Bytes per element.
const fn esize(k: u8) -> usize {
    match k {
        F32 => 4,
        F16 | BF16 => 2,
        _ => 1,
    }
}

/// Elements per block of the kernel order (see `super::Order`).
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
    const PIECE: usize = super::SPLIT_PIECE;
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

/// Prefetches the line of `row` holding byte `at`, when `at` starts a line.
#[inline(always)]
pub(super) fn prefetch_line(row: *const u8, at: usize) {
    if at.is_multiple_of(64) {
        super::prefetch(row.wrapping_add(at));
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

/// # Safety
/// AVX-512 F/BW/VL present; every row pointer plus `hoff` valid for `width` elements of
/// `kind`; `q` holds `g` rows of `block`-padded width at stride `qs`;
/// `logits.len() >= (g - 1) * ld + rows.len()`. `pf` is only prefetched.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn qk_tile(
    kind: RowKind,
    raw: bool,
    rows: &[*const u8],
    pf: &[*const u8],
    hoff: usize,
    pf_hoff: usize,
    width: usize,
    q: &[f32],
    qs: usize,
    g: usize,
    logits: &mut [f32],
    ld: usize,
) {
    let a = (rows, pf, hoff, pf_hoff, width, q, qs, g, logits, ld);
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match g {
            1 => by_kind!(kind, raw, qk_k::<16, 1, false>(a, 0)),
            2 => by_kind!(kind, raw, qk_k::<8, 2, false>(a, 0)),
            _ => by_kind!(kind, raw, qk_k::<4, 4, false>(a, 0)),
        }
    }
}

/// [`qk_tile`] on rows split into 16-byte pieces `chunk` bytes apart (the legacy vLLM key:
/// element `d` of a row at `(d / x) * chunk + (d % x) * esize`, `x` = 16 bytes of elements),
/// read in place; the rows of `pf` (at `pf_hoff`, split alike) are prefetched a line of
/// four rows' pieces at a time.
///
/// # Safety
/// AVX-512 F/BW/VL present; `width` a multiple of `x`; every row pointer plus `hoff` valid
/// for `(width / x - 1) * chunk + 16` bytes; `q` holds `g` rows of `block`-padded width at
/// stride `qs`; `logits.len() >= (g - 1) * ld + rows.len()`. `pf` is only prefetched.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn qk_tile_split(
    kind: RowKind,
    raw: bool,
    rows: &[*const u8],
    pf: &[*const u8],
    hoff: usize,
    pf_hoff: usize,
    width: usize,
    chunk: usize,
    q: &[f32],
    qs: usize,
    g: usize,
    logits: &mut [f32],
    ld: usize,
) {
    let a = (rows, pf, hoff, pf_hoff, width, q, qs, g, logits, ld);
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match g {
            1 => by_kind!(kind, raw, qk_k::<16, 1, true>(a, chunk)),
            2 => by_kind!(kind, raw, qk_k::<8, 2, true>(a, chunk)),
            _ => by_kind!(kind, raw, qk_k::<4, 4, true>(a, chunk)),
        }
    }
}

pub(super) type QkArgs<'a> = (
    &'a [*const u8],
    &'a [*const u8],
    usize,
    usize,
    usize,
    &'a [f32],
    usize,
    usize,
    &'a mut [f32],
    usize,
);

/// Blocks of `R` rows x `H` query heads (`R * H = 16` accumulators): per block of the
/// row, the `H` query vectors are loaded once and each row is widened once for the `H`
/// heads; one transposed reduction gives the 16 dot products. Rows past the tile repeat
/// the last row and heads past the group repeat the last head; their results are
/// dropped. Along the first head block, each row's load prefetches the same line of the
/// matching row of `pf`: one prefetch per line, spaced between the loads, no branch (a
/// burst of prefetches before each row block read head-major caches from memory slower).
/// `SPLIT`: rows in 16-byte pieces `chunk` bytes apart (see [`load_split`]); the first of
/// each four rows prefetches the lines of its block's pieces in the matching row of `pf`
/// (four rows' pieces side by side share a line).
///
/// # Safety
/// As [`qk_tile`] (`SPLIT`: as [`qk_tile_split`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn qk_k<const K: u8, const R: usize, const H: usize, const SPLIT: bool>(
    a: QkArgs<'_>,
    chunk: usize,
) {
    let (rows, pf, hoff, pf_hoff, width, q, qs, g, logits, ld) = a;
    let nt = rows.len();
    let bw = block(K);
    let (full, tail) = (width / bw, width % bw);
    let level = super::prefetch_level();
    let row_bytes = width * esize(K);
    let mut i0 = 0;
    // Whole row blocks of whole head blocks of whole element blocks: no clamping, no masks.
    if g.is_multiple_of(H) && tail == 0 {
        while i0 + R <= nt {
            let (rp, pfp) = super::row_block::<R>(rows, pf, i0, hoff, pf_hoff);
            for j0 in (0..g).step_by(H) {
                // SAFETY: query rows `j0 .. j0 + H` (inside the group, at stride `qs`) hold
                // `width` values; rows `rp` hold `width` elements, `full` whole blocks
                // (caller's contract).
                let sums = unsafe {
                    let qp: [*const f32; H] =
                        std::array::from_fn(|h| q.as_ptr().add((j0 + h) * qs));
                    let mut acc = [_mm512_setzero_ps(); 16];
                    let pf = (&pfp, j0 == 0, level);
                    for b in 0..full {
                        qk_block::<K, R, H, true, SPLIT>(&mut acc, &qp, &rp, pf, b, bw, chunk);
                    }
                    hsum16(acc)
                };
                store_whole_logits::<R, H>(sums, logits, ld, i0, j0);
            }
            i0 += R;
        }
    }
    while i0 < nt {
        // The rows of `pf` matching this block's are prefetched line by line with the loads
        // of the first head block.
        let (rp, pfp) = super::row_block::<R>(rows, pf, i0, hoff, pf_hoff);
        let mut j0 = 0;
        while j0 < g {
            let pf_on = j0 == 0;
            // SAFETY (whole block): query rows `min(j0 + h, g - 1)` (at stride `qs`) hold
            // `width` values padded to whole blocks; rows `rp` hold `width` elements: `full`
            // whole blocks and `tail` elements of the next (caller's contract).
            let sums = unsafe {
                let qp: [*const f32; H] =
                    std::array::from_fn(|h| q.as_ptr().add((j0 + h).min(g - 1) * qs));
                let mut acc = [_mm512_setzero_ps(); 16];
                let pf = (&pfp, pf_on, level);
                for b in 0..full {
                    qk_block::<K, R, H, true, SPLIT>(&mut acc, &qp, &rp, pf, b, bw, chunk);
                }
                if tail > 0 {
                    qk_block::<K, R, H, false, SPLIT>(&mut acc, &qp, &rp, pf, full, tail, chunk);
                }
                hsum16(acc)
            };
            store_logits::<R, H>(sums, logits, ld, i0, j0, nt, g);
            j0 += H;
        }
        i0 += R;
    }
    // Rows of the next tile past this one's length.
    for &p in pf.iter().skip(nt) {
        super::prefetch_bytes(p.wrapping_add(pf_hoff), 0, row_bytes, level);
    }
}

/// Block `b` (its first `n` elements; all of it when `FULL`) of rows `rp` times the query
/// rows `qp`, into the accumulators (`acc[l % 4 * 4 + l / 4]` for head `h`, row `r`,
/// `l = h * R + r`, so that `hsum16` puts head `h`'s rows in lanes `h * R .. h * R + R`).
/// `pf`: rows whose line at the block's offset is prefetched as each row is loaded (when
/// on), and the level. `SPLIT`: rows in pieces `chunk` bytes apart ([`load_split`]).
///
/// # Safety
/// AVX-512 F/BW/VL present; the query rows hold the whole block; the rows hold its first
/// `n` elements. The rows of `pf` are only prefetched.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn qk_block<
    const K: u8,
    const R: usize,
    const H: usize,
    const FULL: bool,
    const SPLIT: bool,
>(
    acc: &mut [__m512; 16],
    qp: &[*const f32; H],
    rp: &[*const u8; R],
    pf: (&[*const u8; R], bool, super::PrefetchLevel),
    b: usize,
    n: usize,
    chunk: usize,
) {
    let (bw, nv) = (block(K), block(K) / 16);
    let (pfp, pf_on, level) = pf;
    // One prefetch per line: every block of 64 bytes or more, every other block of 32.
    let at = b * bw * esize(K);
    let pf_on = pf_on && (SPLIT || at.is_multiple_of(64));
    // SAFETY: the caller's contract.
    unsafe {
        let qv: [[__m512; 2]; H] = std::array::from_fn(|h| {
            std::array::from_fn(|v| {
                if v < nv {
                    _mm512_loadu_ps(qp[h].add(b * bw + v * 16))
                } else {
                    _mm512_setzero_ps()
                }
            })
        });
        for (r, &row) in rp.iter().enumerate() {
            if SPLIT {
                // Four rows' pieces share a line (16 bytes each, side by side).
                if pf_on && r % 4 == 0 {
                    let pieces = bw * esize(K) / super::SPLIT_PIECE;
                    for c in 0..pieces {
                        let p = pfp[r].wrapping_add((b * pieces + c) * chunk);
                        super::prefetch_to(p, level);
                    }
                }
            } else if pf_on {
                super::prefetch_to(pfp[r].wrapping_add(at), level);
            }
            let x = if SPLIT {
                load_split::<K, FULL>(row, b, n, chunk)
            } else {
                load::<K, FULL>(row, b, n)
            };
            for (v, &x) in x.iter().enumerate().take(nv) {
                for (h, qh) in qv.iter().enumerate() {
                    let l = h * R + r;
                    let a = l % 4 * 4 + l / 4;
                    acc[a] = _mm512_fmadd_ps(qh[v], x, acc[a]);
                }
            }
        }
    }
}

/// [`store_logits`] of whole rows and heads (`i0 + R <= nt`, `j0 + H <= g`): unmasked.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn store_whole_logits<const R: usize, const H: usize>(
    sums: __m512,
    logits: &mut [f32],
    ld: usize,
    i0: usize,
    j0: usize,
) {
    // The blockings `hsum16` reduces (the stores below write `R` floats for these alone).
    const { assert!(R * H == 16 && (R == 4 || R == 8 || R == 16)) };
    for h in 0..H {
        let at = (j0 + h) * ld + i0;
        let dst = logits[at..at + R].as_mut_ptr();
        // SAFETY: `dst` starts `R` in-bounds floats, and each store writes `R` floats.
        unsafe {
            match R {
                16 => _mm512_storeu_ps(dst, sums),
                8 => _mm256_storeu_ps(
                    dst,
                    if h == 0 {
                        _mm512_castps512_ps256(sums)
                    } else {
                        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sums)))
                    },
                ),
                _ => _mm_storeu_ps(
                    dst,
                    match h {
                        0 => _mm512_castps512_ps128(sums),
                        1 => _mm512_extractf32x4_ps::<1>(sums),
                        2 => _mm512_extractf32x4_ps::<2>(sums),
                        _ => _mm512_extractf32x4_ps::<3>(sums),
                    },
                ),
            }
        }
    }
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

/// # Safety
/// AVX-512 F/BW/VL present; every row pointer plus `hoff` valid for `width` elements of
/// `kind`; `acc` holds `g` rows of `block`-padded width at stride `s`;
/// `w.len() >= (g - 1) * ld + rows.len()`. `pf` is only prefetched.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn pv_tile(
    kind: RowKind,
    raw: bool,
    rows: &[*const u8],
    pf: &[*const u8],
    hoff: usize,
    pf_hoff: usize,
    width: usize,
    w: &[f32],
    ld: usize,
    g: usize,
    acc: &mut [f32],
    s: usize,
) {
    // Vectors of 16 accumulators per row: the block-padded width.
    let vecs = if kind == RowKind::Bf16 {
        width.div_ceil(32) * 2
    } else {
        width.div_ceil(16)
    };
    pv_passes(g, vecs, |j0, h, c0, c| {
        // The next tile's rows are prefetched along the first head block only.
        let pf = if j0 == 0 { pf } else { &[] };
        let a = (rows, pf, hoff, pf_hoff, width, w, ld, j0, c0, &mut *acc, s);
        // SAFETY (each arm): heads j0 .. j0 + h are inside the group; vectors from c0
        // are masked to `width` (caller's contract for the rest).
        unsafe {
            match (h, c) {
                (4, 4) => by_kind!(kind, raw, pv_k::<4, 4>(a)),
                (4, _) => by_kind!(kind, raw, pv_k::<4, 2>(a)),
                (2, 8) => by_kind!(kind, raw, pv_k::<2, 8>(a)),
                (2, _) => by_kind!(kind, raw, pv_k::<2, 4>(a)),
                (_, 8) => by_kind!(kind, raw, pv_k::<1, 8>(a)),
                (_, _) => by_kind!(kind, raw, pv_k::<1, 4>(a)),
            }
        }
    });
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

pub(super) type PvArgs<'a> = (
    &'a [*const u8],
    &'a [*const u8],
    usize,
    usize,
    usize,
    &'a [f32],
    usize,
    usize,
    usize,
    &'a mut [f32],
    usize,
);

/// Accumulators of heads `j0 .. j0 + H` x vectors `c0 .. c0 + C` (16 lanes each, in the
/// kernel order) held in registers across all rows of the tile; each block of a row is
/// widened once for the `H` heads, each weight broadcast once per row. The same blocks of
/// the rows of `pf` are prefetched as the rows are read.
///
/// # Safety
/// As [`pv_tile`], heads `j0 .. j0 + H` inside the group, `c0` a multiple of the
/// vectors per block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pv_k<const K: u8, const H: usize, const C: usize>(a: PvArgs<'_>) {
    let (rows, pf, hoff, pf_hoff, width, w, ld, j0, c0, acc, s) = a;
    let bw = block(K);
    let nv = bw / 16;
    // Blocks of this pass: `C / nv` from block `c0 / nv`, each with its valid elements.
    let b0 = c0 / nv;
    let valid: [usize; C] = std::array::from_fn(|bb| width.saturating_sub((b0 + bb) * bw).min(bw));
    let nblk = C / nv;
    // Accumulator rows are padded to whole blocks: vectors past the row's padded width
    // (when the pass overruns it) are neither loaded nor stored.
    let live: [bool; C] = std::array::from_fn(|c| (c0 + c) * 16 < s && valid[c / nv] > 0);
    let ap = acc.as_mut_ptr();
    // The bytes of this pass's blocks in a row: what is prefetched of each row of `pf`.
    let level = super::prefetch_level();
    let pf_from = (b0 * bw * esize(K)).min(width * esize(K));
    let pf_bytes = ((b0 + nblk) * bw * esize(K)).min(width * esize(K)) - pf_from;
    // SAFETY (whole block): accumulator rows j0 .. j0 + H hold `s` values inside `acc`
    // and only live vectors (inside the padded width) are touched; rows hold `width`
    // elements from `hoff` and `load` reads only the valid ones (caller's contract).
    unsafe {
        let mut a = [[_mm512_setzero_ps(); C]; H];
        for (h, ah) in a.iter_mut().enumerate() {
            for (c, x) in ah.iter_mut().enumerate() {
                if live[c] {
                    *x = _mm512_loadu_ps(ap.add((j0 + h) * s + (c0 + c) * 16));
                }
            }
        }
        // Weight rows of the pass's heads: `rows.len()` floats each (caller's contract).
        assert!((j0 + H - 1) * ld + rows.len() <= w.len());
        let wp: [*const f32; H] = std::array::from_fn(|h| w.as_ptr().add((j0 + h) * ld));
        let pf = (pf, pf_hoff + pf_from, pf_bytes, level);
        if valid[..nblk].iter().all(|&n| n == bw) {
            pv_rows::<K, H, C, true>(&mut a, rows, hoff, pf, wp, b0, &valid);
        } else {
            pv_rows::<K, H, C, false>(&mut a, rows, hoff, pf, wp, b0, &valid);
        }
        for (h, ah) in a.iter().enumerate() {
            for (c, x) in ah.iter().enumerate() {
                if live[c] {
                    _mm512_storeu_ps(ap.add((j0 + h) * s + (c0 + c) * 16), *x);
                }
            }
        }
    }
}

/// The rows of a value tile into the pass's accumulators `a` (see [`pv_k`]): each block of
/// a row widened once for the `H` heads, each weight broadcast once per row; `pf`: the rows
/// to prefetch, the offset and length in each of this pass's bytes, the level. `FULL`: every
/// block of the pass is whole.
///
/// # Safety
/// As [`pv_k`]; `wp[h]` valid for `rows.len()` floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pv_rows<const K: u8, const H: usize, const C: usize, const FULL: bool>(
    a: &mut [[__m512; C]; H],
    rows: &[*const u8],
    hoff: usize,
    pf: (&[*const u8], usize, usize, super::PrefetchLevel),
    wp: [*const f32; H],
    b0: usize,
    valid: &[usize; C],
) {
    let (bw, nv) = (block(K), block(K) / 16);
    let (pf, pf_off, pf_bytes, level) = pf;
    // SAFETY: the caller's contract.
    unsafe {
        for (i, &row) in rows.iter().enumerate() {
            let row = row.wrapping_add(hoff);
            // The same blocks of the next row of `pf`, a line with each load (a row without
            // one prefetches its own, cached, line).
            let pp = pf.get(i).map_or(row.wrapping_add(b0 * bw * esize(K)), |p| {
                p.wrapping_add(pf_off)
            });
            let wv: [__m512; H] = std::array::from_fn(|h| _mm512_set1_ps(*wp[h].add(i)));
            for bb in 0..C / nv {
                let at = bb * bw * esize(K);
                if at < pf_bytes && (b0 * bw * esize(K) + at).is_multiple_of(64) {
                    super::prefetch_to(pp.wrapping_add(at), level);
                }
                let x = if FULL || valid[bb] == bw {
                    load::<K, true>(row, b0 + bb, bw)
                } else {
                    load::<K, false>(row, b0 + bb, valid[bb])
                };
                for v in 0..nv {
                    for (h, ah) in a.iter_mut().enumerate() {
                        let c = bb * nv + v;
                        ah[c] = _mm512_fmadd_ps(wv[h], x[v], ah[c]);
                    }
                }
            }
        }
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
/// times 2^-112), and an FMA with a subnormal input takes a microcode assist on Intel cores
/// (measured 5.5 against 0.17 ns per FMA): a cache of small values (vLLM's default
/// k_scale = 1) read 8x slower. `vcvtph2ps` widens f16 subnormals at full speed.
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
pub(super) fn hsum16_lanes(v: [[f32; 16]; 16]) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: each array holds 16 floats.
    unsafe {
        let r = hsum16(std::array::from_fn(|a| _mm512_loadu_ps(v[a].as_ptr())));
        _mm512_storeu_ps(out.as_mut_ptr(), r);
    }
    out
}
