//! The AVX2 + FMA + F16C kernels of the decode (x86_64 machines without AVX-512): rows of every
//! kind read in place and widened to f32 in registers, eight elements at a time (bf16 by a
//! shift, f16 by `vcvtph2ps`, fp8 through f16 as the AVX-512 kernels do, int8 by `vcvtdq2ps`),
//! then register-blocked loops: the logits of 2 rows x 4 query heads (4 x 2 for groups of 2 or
//! 3, 8 x 1 for one) share 8 accumulators and one transposed reduction; the values of up to 4
//! heads x 16 elements stay in registers across all rows of the tile; the softmax weights eight
//! at a time. The rows of the next step are prefetched line by line as the current ones are
//! read. Rows, query rows and accumulators are in natural order, unpadded: the last partial
//! vector of a row is read through a zeroed copy (rows) or with lane masks (query rows,
//! accumulators). The legacy vLLM layout is read in place too: x-split keys by the logits
//! kernel (`qk_split`), transposed values by a kernel of their own (`transposed`).

use super::RowKind;
use std::arch::x86_64::*;

use super::codes::{BF16, E4M3, E5M2, F16, F32, I8};

mod transposed;

pub(super) use transposed::pv_transposed;

const fn esize(k: u8) -> usize {
    match k {
        F32 => 4,
        F16 | BF16 => 2,
        _ => 1,
    }
}

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
    const PIECE: usize = super::SPLIT_PIECE;
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

/// `logits[j * ld + i] = sum_d q[j * qs + d] * row_i[d]` for the rows (at `hoff`, `width`
/// elements of `kind`; with `raw`, e4m3 without its power of two) and `g` query rows. `pf`:
/// rows (and their offset) read next, each line
/// prefetched as the same line of the matching row is loaded (rows past the tile's at the
/// end).
///
/// # Safety
/// AVX2, FMA and F16C present; every row pointer plus `hoff` valid for `width` elements of
/// `kind`; `q` holds `g` rows of `width` at stride `qs`; `logits.len() >= (g - 1) * ld +
/// rows.len()`. The rows of `pf` are only prefetched.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qk(
    kind: RowKind,
    raw: bool,
    rows: &[*const u8],
    pf: (&[*const u8], usize),
    hoff: usize,
    width: usize,
    q: &[f32],
    qs: usize,
    g: usize,
    logits: &mut [f32],
    ld: usize,
) {
    let a = (rows, pf, hoff, width, q, qs, g, logits, ld);
    // SAFETY: the caller's contract.
    unsafe { by_kind!(kind, raw, qk_k::<false>(a, 0)) }
}

/// [`qk`] on rows split into 16-byte pieces `chunk` bytes apart (the legacy vLLM key, see
/// [`load_split`]), read in place; the first of each four rows prefetches the pieces of the
/// matching row of `pf` (four rows' pieces side by side share a line).
///
/// # Safety
/// As [`qk`], but every row pointer plus `hoff` valid for `(width / x - 1) * chunk + 16`
/// bytes (`x` = 16 bytes of elements, `width` a multiple of it).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qk_split(
    kind: RowKind,
    raw: bool,
    rows: &[*const u8],
    pf: (&[*const u8], usize),
    hoff: usize,
    width: usize,
    chunk: usize,
    q: &[f32],
    qs: usize,
    g: usize,
    logits: &mut [f32],
    ld: usize,
) {
    let a = (rows, pf, hoff, width, q, qs, g, logits, ld);
    // SAFETY: the caller's contract.
    unsafe { by_kind!(kind, raw, qk_k::<true>(a, chunk)) }
}

/// Blocks of `R` rows x `H` heads (`R * H` = 8 accumulators; rows past the tile repeat its
/// last row, heads past the group repeat the last head; their sums are dropped): each row
/// is widened once for the `H` heads.
///
/// # Safety
/// As [`qk`] (`SPLIT`: as [`qk_split`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_k<const K: u8, const SPLIT: bool>(a: QkArgs<'_>, chunk: usize) {
    let g = a.6;
    // SAFETY: the caller's contract.
    unsafe {
        match g {
            1 => qk_rh::<K, 8, 1, SPLIT>(a, chunk),
            2 | 3 => qk_rh::<K, 4, 2, SPLIT>(a, chunk),
            _ => qk_rh::<K, 2, 4, SPLIT>(a, chunk),
        }
    }
}

type QkArgs<'a> = (
    &'a [*const u8],
    (&'a [*const u8], usize),
    usize,
    usize,
    &'a [f32],
    usize,
    usize,
    &'a mut [f32],
    usize,
);

/// [`qk_k`] with `R` rows x `H` heads per block; `SPLIT`: rows in pieces `chunk` bytes apart.
///
/// # Safety
/// As [`qk`] (`SPLIT`: as [`qk_split`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_rh<const K: u8, const R: usize, const H: usize, const SPLIT: bool>(
    a: QkArgs<'_>,
    chunk: usize,
) {
    let (rows, pf, hoff, width, q, qs, g, logits, ld) = a;
    let nt = rows.len();
    let (full, tail) = (width / 8 * 8, width % 8);
    let m = lanes(tail);
    let (pf, pf_hoff) = pf;
    let level = super::prefetch_level();
    let mut i0 = 0;
    // Whole row blocks of whole head blocks of whole vectors: no clamping, no masks.
    if g.is_multiple_of(H) && tail == 0 {
        while i0 + R <= nt {
            let (rp, pfp) = super::row_block::<R>(rows, pf, i0, hoff, pf_hoff);
            for j0 in (0..g).step_by(H) {
                let qp: [*const f32; H] = std::array::from_fn(|h| q[(j0 + h) * qs..].as_ptr());
                let mut acc = [_mm256_setzero_ps(); 8];
                let blocks = (&rp, &pfp, j0 == 0, level, i0);
                // SAFETY: rows hold `width` elements from `hoff`, query rows `width` values,
                // all whole vectors (caller's contract).
                unsafe { qk_vectors::<K, R, H, SPLIT>(&mut acc, qp, blocks, full, chunk) };
                let mut sums = [0f32; 8];
                // SAFETY: `sums` holds 8 floats.
                unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), hsum8(acc)) };
                // Lane `h * R + r`: head `j0 + h`, row `i0 + r`.
                for h in 0..H {
                    let at = (j0 + h) * ld + i0;
                    logits[at..at + R].copy_from_slice(&sums[h * R..h * R + R]);
                }
            }
            i0 += R;
        }
    }
    while i0 < nt {
        let (rp, pfp) = super::row_block::<R>(rows, pf, i0, hoff, pf_hoff);
        let mut j0 = 0;
        while j0 < g {
            let qp: [*const f32; H] =
                std::array::from_fn(|h| q[(j0 + h).min(g - 1) * qs..].as_ptr());
            // SAFETY: rows hold `width` elements from `hoff`, query rows `width` values
            // (caller's contract); the tail is read with a lane mask and a zeroed copy.
            let sums = unsafe {
                let mut acc = [_mm256_setzero_ps(); 8];
                let blocks = (&rp, &pfp, j0 == 0, level, i0);
                qk_vectors::<K, R, H, SPLIT>(&mut acc, qp, blocks, full, chunk);
                let d = full;
                if tail > 0 {
                    let qv: [__m256; H] =
                        std::array::from_fn(|h| _mm256_maskload_ps(qp[h].add(d), m));
                    for (r, &row) in rp.iter().enumerate() {
                        let x = if SPLIT {
                            load_split::<K>(row, d, tail, chunk)
                        } else {
                            load::<K>(row, d, tail)
                        };
                        for (h, qh) in qv.iter().enumerate() {
                            acc[h * R + r] = _mm256_fmadd_ps(*qh, x, acc[h * R + r]);
                        }
                    }
                }
                let mut out = [0f32; 8];
                _mm256_storeu_ps(out.as_mut_ptr(), hsum8(acc));
                out
            };
            // Lane `h * R + r`: head `j0 + h`, row `i0 + r`.
            for h in 0..H.min(g - j0) {
                for r in 0..R.min(nt - i0) {
                    logits[(j0 + h) * ld + i0 + r] = sums[h * R + r];
                }
            }
            j0 += H;
        }
        i0 += R;
    }
    // Rows of `pf` past this tile's.
    for &p in pf.iter().skip(nt) {
        prefetch_row(p.wrapping_add(pf_hoff), width * esize(K), level);
    }
}

/// The whole vectors (elements `0 .. full`, a multiple of 8) of rows `rp` times the query
/// rows `qp` into the accumulators (`acc[h * R + r]`). `blocks`: the rows, the matching rows
/// of `pf` whose lines are prefetched as the rows are read (when on: the first head block),
/// the level, and the first row's index in the tile (split rows prefetch once per four).
///
/// # Safety
/// AVX2, FMA and F16C present; the rows hold `full` elements, the query rows `full` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_vectors<const K: u8, const R: usize, const H: usize, const SPLIT: bool>(
    acc: &mut [__m256; 8],
    qp: [*const f32; H],
    blocks: (
        &[*const u8; R],
        &[*const u8; R],
        bool,
        super::PrefetchLevel,
        usize,
    ),
    full: usize,
    chunk: usize,
) {
    let (rp, pfp, pf_first, level, i0) = blocks;
    let mut d = 0;
    while d < full {
        // SAFETY: the query rows hold `full` values (caller's contract).
        let qv: [__m256; H] = std::array::from_fn(|h| unsafe { _mm256_loadu_ps(qp[h].add(d)) });
        let at = d * esize(K);
        let pf_on = pf_first && (SPLIT || at.is_multiple_of(64));
        for (r, &row) in rp.iter().enumerate() {
            if SPLIT {
                // The pieces that start among these elements, once per four rows.
                if pf_on && (i0 + r) % 4 == 0 {
                    let piece = super::SPLIT_PIECE;
                    for c in at.div_ceil(piece)..(at + 8 * esize(K)).div_ceil(piece) {
                        super::prefetch_to(pfp[r].wrapping_add(c * chunk), level);
                    }
                }
            } else if pf_on {
                super::prefetch_to(pfp[r].wrapping_add(at), level);
            }
            // SAFETY: the rows hold `full` elements (caller's contract).
            let x = unsafe {
                if SPLIT {
                    load_split::<K>(row, d, 8, chunk)
                } else {
                    load::<K>(row, d, 8)
                }
            };
            for (h, qh) in qv.iter().enumerate() {
                acc[h * R + r] = _mm256_fmadd_ps(*qh, x, acc[h * R + r]);
            }
        }
        d += 8;
    }
}

/// Prefetches the lines of the `bytes` bytes from `p` (a hint: never faults).
#[inline]
fn prefetch_row(p: *const u8, bytes: usize, level: super::PrefetchLevel) {
    for at in (0..bytes).step_by(64) {
        super::prefetch_to(p.wrapping_add(at), level);
    }
}

/// `acc[j * s + d] += sum_i w[j * ld + i] * row_i[d]` for the rows (at `hoff`, `width`
/// elements of `kind`; `raw` as in [`qk`]) and the `g` accumulator rows. `pf` as in [`qk`]
/// (prefetched along the first heads' passes).
///
/// # Safety
/// AVX2, FMA and F16C present; every row pointer plus `hoff` valid for `width` elements of
/// `kind`; `acc` holds `g` rows of `width` at stride `s`; `w.len() >= (g - 1) * ld +
/// rows.len()`. The rows of `pf` are only prefetched.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pv(
    kind: RowKind,
    raw: bool,
    rows: &[*const u8],
    pf: (&[*const u8], usize),
    hoff: usize,
    width: usize,
    w: &[f32],
    ld: usize,
    g: usize,
    acc: &mut [f32],
    s: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { by_kind!(kind, raw, pv_k(rows, pf, hoff, width, w, ld, g, acc, s)) }
}

/// Passes of up to 4 heads x 16 elements, held in registers across all the rows.
///
/// # Safety
/// As [`pv`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_k<const K: u8>(
    rows: &[*const u8],
    pf: (&[*const u8], usize),
    hoff: usize,
    width: usize,
    w: &[f32],
    ld: usize,
    g: usize,
    acc: &mut [f32],
    s: usize,
) {
    let nt = rows.len();
    let (pf, pf_hoff) = pf;
    let level = super::prefetch_level();
    let mut j0 = 0;
    while j0 < g {
        let hn = (g - j0).min(4);
        let mut d0 = 0;
        while d0 < width {
            let full = d0 + 16 <= width;
            // The lines of each `pf` row that start within this pass's bytes (a pass of
            // fewer than 64 bytes prefetches only where a line starts, so no line twice),
            // along the first heads' passes.
            let (at, end) = (d0 * esize(K), ((d0 + 16).min(width)) * esize(K));
            let line = at.next_multiple_of(64);
            let pf_bytes = if j0 == 0 { end.saturating_sub(line) } else { 0 };
            let p = Pass {
                rows,
                hoff,
                pf: (pf, pf_hoff + line, pf_bytes, level),
                w: &w[j0 * ld..],
                ld,
                acc: &mut acc[j0 * s..],
                s,
                d0,
                width,
            };
            // SAFETY (each arm): the caller's contract, for heads `j0 .. j0 + hn` and elements
            // `d0 .. min(d0 + 16, width)`.
            unsafe {
                match (hn, full) {
                    (1, true) => pv_pass::<K, 1, true>(p),
                    (2, true) => pv_pass::<K, 2, true>(p),
                    (3, true) => pv_pass::<K, 3, true>(p),
                    (_, true) => pv_pass::<K, 4, true>(p),
                    (1, false) => pv_pass::<K, 1, false>(p),
                    (2, false) => pv_pass::<K, 2, false>(p),
                    (3, false) => pv_pass::<K, 3, false>(p),
                    (_, false) => pv_pass::<K, 4, false>(p),
                }
            }
            d0 += 16;
        }
        j0 += hn;
    }
    for &p in pf.iter().skip(nt) {
        prefetch_row(p.wrapping_add(pf_hoff), width * esize(K), level);
    }
}

/// One pass of [`pv_k`]: the heads' weights and accumulator rows (from the pass's first head,
/// rows `ld` and `s` apart), elements `d0 .. d0 + 16` of the rows, the rows of `pf` whose
/// bytes from the offset given (that many) are prefetched as each row is read, and the level.
struct Pass<'a> {
    rows: &'a [*const u8],
    hoff: usize,
    pf: (&'a [*const u8], usize, usize, super::PrefetchLevel),
    w: &'a [f32],
    ld: usize,
    acc: &'a mut [f32],
    s: usize,
    d0: usize,
    width: usize,
}

/// `H` heads x 16 elements (`FULL`: all 16 inside the row; else the rest of it, masked),
/// held in registers across all the rows. With `H` and `FULL` known at compile time the
/// accumulators stay in registers; with a runtime head count and the partial vectors' copy
/// inside the loop they were kept on the stack, each FMA between a load and a store.
///
/// # Safety
/// As [`pv`], for the pass's heads and elements.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_pass<const K: u8, const H: usize, const FULL: bool>(p: Pass<'_>) {
    let nt = p.rows.len();
    let (pf, pf_off, pf_bytes, level) = p.pf;
    let n = if FULL {
        [8, 8]
    } else {
        [
            (p.width - p.d0).min(8),
            p.width.saturating_sub(p.d0 + 8).min(8),
        ]
    };
    let m = [lanes(n[0]), lanes(n[1])];
    let wr: [&[f32]; H] = std::array::from_fn(|h| &p.w[h * p.ld..][..nt]);
    assert!(p.acc.len() >= (H - 1) * p.s + p.d0 + n[0] + n[1]);
    // SAFETY: accumulator rows `0 .. H` of `p.acc` hold the pass's elements (asserted above)
    // and the rows `width` elements from `hoff` (caller's contract); every access past
    // `width` is masked or goes through a zeroed copy.
    unsafe {
        let ap: [*mut f32; H] = std::array::from_fn(|h| p.acc.as_mut_ptr().add(h * p.s + p.d0));
        let mut a = [[_mm256_setzero_ps(); 2]; H];
        for h in 0..H {
            for c in 0..2 {
                if FULL {
                    a[h][c] = _mm256_loadu_ps(ap[h].add(8 * c));
                } else if n[c] > 0 {
                    a[h][c] = _mm256_maskload_ps(ap[h].add(8 * c), m[c]);
                }
            }
        }
        for (i, &row) in p.rows.iter().enumerate() {
            let row = row.wrapping_add(p.hoff);
            if pf_bytes > 0 {
                if let Some(q) = pf.get(i) {
                    prefetch_row(q.wrapping_add(pf_off), pf_bytes, level);
                }
            }
            let x = if FULL {
                [
                    widen8::<K>(row.add(p.d0 * esize(K))),
                    widen8::<K>(row.add((p.d0 + 8) * esize(K))),
                ]
            } else {
                [
                    load::<K>(row, p.d0, n[0]),
                    if n[1] > 0 {
                        load::<K>(row, p.d0 + 8, n[1])
                    } else {
                        _mm256_setzero_ps()
                    },
                ]
            };
            for h in 0..H {
                // `wr[h]` holds `nt` weights, `i < nt`.
                let wv = _mm256_set1_ps(*wr[h].get_unchecked(i));
                a[h][0] = _mm256_fmadd_ps(wv, x[0], a[h][0]);
                a[h][1] = _mm256_fmadd_ps(wv, x[1], a[h][1]);
            }
        }
        for h in 0..H {
            for c in 0..2 {
                if FULL {
                    _mm256_storeu_ps(ap[h].add(8 * c), a[h][c]);
                } else if n[c] > 0 {
                    _mm256_maskstore_ps(ap[h].add(8 * c), m[c], a[h][c]);
                }
            }
        }
    }
}

/// The weights of one head's logits in place, `l[i] = e^(l[i] - m)` ([`super::weight`]: zero
/// below the floor), then times `wscale` and `vscale[i]`; returns the sum of the weights
/// before those scales.
///
/// # Safety
/// AVX2, FMA and F16C present; `vscale`, when given, as long as `l`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weights(l: &mut [f32], m: f32, wscale: f32, vscale: Option<&[f32]>) -> f32 {
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

/// `e^x` per lane, zero below [`super::WEIGHT_FLOOR`] and for NaN (a degree-6 polynomial
/// after range reduction, as the AVX-512 kernels compute it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp_floor(x: __m256) -> __m256 {
    let floor = _mm256_set1_ps(super::WEIGHT_FLOOR);
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

/// [`super::adjust_logits`] on one row: `l[i] *= ks[i]`, then `c * tanh(l / c)` with a cap
/// (tanh as the AVX-512 build computes it, from the same exponential).
///
/// # Safety
/// AVX2, FMA and F16C present; `ks` as long as `l`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn adjust_logits(l: &mut [f32], ks: &[f32], cap: Option<f32>) {
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
