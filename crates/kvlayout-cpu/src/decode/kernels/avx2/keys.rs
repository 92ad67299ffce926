//! The AVX2 logits kernels: blocks of rows x heads sharing 8 accumulators and one transposed
//! reduction, on rows read whole or in the 16-byte pieces of the legacy vLLM key.

use std::arch::x86_64::*;

use super::{hsum8, lanes, load, load_split, prefetch_row};
use crate::arch::{prefetch_to, PrefetchLevel};
use crate::decode::kernels::args::KeyArgs;
use crate::decode::kernels::rows::codes::esize;
use crate::decode::kernels::rows::{row_block, RowKind, SPLIT_PIECE};

/// `logits[j * ld + i] = sum_d q[j * qs + d] * row_i[d]` for the rows (at `hoff`, `width`
/// elements of `kind`; with `raw`, e4m3 without its power of two) and `g` query rows. `pf`:
/// rows (at `pf_hoff`) read next, each line prefetched as the same line of the matching row
/// is loaded (rows past the tile's at the end).
///
/// # Safety
/// AVX2, FMA and F16C present; every row pointer plus `hoff` valid for `width` elements of
/// `kind`; `q` holds `g` rows of `width` at stride `qs`; `logits.len() >= (g - 1) * ld +
/// rows.len()`. The rows of `pf` are only prefetched.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::decode::kernels) unsafe fn qk(kind: RowKind, raw: bool, a: KeyArgs<'_>) {
    // SAFETY: the caller's contract.
    unsafe { by_kind!(kind, raw, qk_k::<false>(a)) }
}

/// [`qk`] on rows split into 16-byte pieces `chunk` bytes apart (the legacy vLLM key, see
/// `load_split`), read in place; the first of each four rows prefetches the pieces of the
/// matching row of `pf` (four rows' pieces side by side share a line).
///
/// # Safety
/// As [`qk`], but every row pointer plus `hoff` valid for `(width / x - 1) * chunk + 16`
/// bytes (`x` = 16 bytes of elements, `width` a multiple of it).
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::decode::kernels) unsafe fn qk_split(kind: RowKind, raw: bool, a: KeyArgs<'_>) {
    // SAFETY: the caller's contract.
    unsafe { by_kind!(kind, raw, qk_k::<true>(a)) }
}

/// Blocks of `R` rows x `H` heads (`R * H` = 8 accumulators; rows past the tile repeat its
/// last row, heads past the group repeat the last head; their sums are dropped): each row
/// is widened once for the `H` heads.
///
/// # Safety
/// As [`qk`] (`SPLIT`: as [`qk_split`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_k<const K: u8, const SPLIT: bool>(a: KeyArgs<'_>) {
    // SAFETY: the caller's contract.
    unsafe {
        match a.g {
            1 => qk_rh::<K, 8, 1, SPLIT>(a),
            2 | 3 => qk_rh::<K, 4, 2, SPLIT>(a),
            _ => qk_rh::<K, 2, 4, SPLIT>(a),
        }
    }
}

/// [`qk_k`] with `R` rows x `H` heads per block; `SPLIT`: rows in pieces `chunk` bytes apart.
/// Whole row blocks of whole head blocks of whole vectors first (no clamping, no masks), then
/// the rest, then the rows of `pf` past the tile's.
///
/// # Safety
/// As [`qk`] (`SPLIT`: as [`qk_split`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_rh<const K: u8, const R: usize, const H: usize, const SPLIT: bool>(a: KeyArgs<'_>) {
    // The fields as plain locals, read once: the loops keep them in registers.
    let t = Tile {
        rows: a.rows,
        pf: a.pf,
        hoff: a.hoff,
        pf_hoff: a.pf_hoff,
        width: a.width,
        chunk: a.chunk,
        q: a.q.data,
        qs: a.q.stride,
        g: a.g,
        ld: a.logits.stride,
        level: a.level,
    };
    let logits = a.logits.data;
    let (nt, width) = (t.rows.len(), t.width);
    let mut i0 = 0;
    if t.g.is_multiple_of(H) && width.is_multiple_of(8) {
        // SAFETY: the caller's contract.
        i0 = unsafe { qk_whole::<K, R, H, SPLIT>(t, logits) };
    }
    // SAFETY: the caller's contract.
    unsafe { qk_rest::<K, R, H, SPLIT>(t, logits, i0) };
    // Rows of `pf` past this tile's.
    for &p in t.pf.iter().skip(nt) {
        prefetch_row(p.wrapping_add(t.pf_hoff), width * esize(K), t.level);
    }
}

/// The fields of [`KeyArgs`] but the logits' rows, as plain values.
#[derive(Clone, Copy)]
struct Tile<'a> {
    rows: &'a [*const u8],
    pf: &'a [*const u8],
    hoff: usize,
    pf_hoff: usize,
    width: usize,
    chunk: usize,
    q: &'a [f32],
    qs: usize,
    g: usize,
    ld: usize,
    level: PrefetchLevel,
}

/// The whole row blocks of [`qk_rh`] when the group is whole head blocks and the rows whole
/// vectors; returns the first row left.
///
/// # Safety
/// As [`qk_rh`], with `g` a multiple of `H` and `width` of 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_whole<const K: u8, const R: usize, const H: usize, const SPLIT: bool>(
    t: Tile<'_>,
    logits: &mut [f32],
) -> usize {
    let Tile {
        rows,
        pf,
        hoff,
        pf_hoff,
        width,
        chunk,
        q,
        qs,
        g,
        ld,
        level,
    } = t;
    let full = width / 8 * 8;
    let nt = rows.len();
    let mut i0 = 0;
    while i0 + R <= nt {
        let (rp, pfp) = row_block::<R>(rows, pf, i0, hoff, pf_hoff);
        let mut first = i0;
        for j0 in (0..g).step_by(H) {
            let qp: [*const f32; H] = std::array::from_fn(|h| q[(j0 + h) * qs..].as_ptr());
            let mut acc = [_mm256_setzero_ps(); 8];
            let blocks = RowBlock {
                rows: &rp,
                pf: &pfp,
                pf_on: j0 == 0,
                level,
                i0,
            };
            // SAFETY: rows hold `width` elements from `hoff`, query rows `width` values,
            // all whole vectors (caller's contract).
            unsafe { qk_vectors::<K, R, H, SPLIT>(&mut acc, qp, blocks, full, chunk) };
            let mut sums = [0f32; 8];
            // SAFETY: `sums` holds 8 floats.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), hsum8(acc)) };
            // Lane `h * R + r`: head `j0 + h`, row `i0 + r`; `first` walks the head blocks'
            // first logits so that no head index stays live across the loop above.
            for h in 0..H {
                let at = first + h * ld;
                logits[at..at + R].copy_from_slice(&sums[h * R..h * R + R]);
            }
            first += H * ld;
        }
        i0 += R;
    }
    i0
}

/// The row blocks of [`qk_rh`] from row `i0` on: rows past the tile repeat its last row, heads
/// past the group its last head (their sums dropped), the last partial vector read with a
/// lane mask (query rows) and a zeroed copy (rows).
///
/// # Safety
/// As [`qk_rh`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_rest<const K: u8, const R: usize, const H: usize, const SPLIT: bool>(
    t: Tile<'_>,
    logits: &mut [f32],
    mut i0: usize,
) {
    let Tile {
        rows,
        pf,
        hoff,
        pf_hoff,
        width,
        chunk,
        q,
        qs,
        g,
        ld,
        level,
    } = t;
    let nt = rows.len();
    let (full, tail) = (width / 8 * 8, width % 8);
    let m = lanes(tail);
    while i0 < nt {
        let (rp, pfp) = row_block::<R>(rows, pf, i0, hoff, pf_hoff);
        let mut j0 = 0;
        while j0 < g {
            let qp: [*const f32; H] =
                std::array::from_fn(|h| q[(j0 + h).min(g - 1) * qs..].as_ptr());
            // SAFETY: rows hold `width` elements from `hoff`, query rows `width` values
            // (caller's contract); the tail is read with a lane mask and a zeroed copy.
            let sums = unsafe {
                let mut acc = [_mm256_setzero_ps(); 8];
                let blocks = RowBlock {
                    rows: &rp,
                    pf: &pfp,
                    pf_on: j0 == 0,
                    level,
                    i0,
                };
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
}

/// A block of `R` rows of [`qk_vectors`]: the rows, the matching rows of `pf` whose lines are
/// prefetched to `level` as the rows are read (when `pf_on`: the first head block), and the
/// first row's index in the tile (split rows prefetch once per four).
#[derive(Clone, Copy)]
struct RowBlock<'a, const R: usize> {
    rows: &'a [*const u8; R],
    pf: &'a [*const u8; R],
    pf_on: bool,
    level: PrefetchLevel,
    i0: usize,
}

/// The whole vectors (elements `0 .. full`, a multiple of 8) of the rows of `blocks` times
/// the query rows `qp` into the accumulators (`acc[h * R + r]`).
///
/// # Safety
/// AVX2, FMA and F16C present; the rows hold `full` elements, the query rows `full` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_vectors<const K: u8, const R: usize, const H: usize, const SPLIT: bool>(
    acc: &mut [__m256; 8],
    qp: [*const f32; H],
    blocks: RowBlock<'_, R>,
    full: usize,
    chunk: usize,
) {
    let RowBlock {
        rows: rp,
        pf: pfp,
        pf_on: pf_first,
        level,
        i0,
    } = blocks;
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
                    let piece = SPLIT_PIECE;
                    for c in at.div_ceil(piece)..(at + 8 * esize(K)).div_ceil(piece) {
                        prefetch_to(pfp[r].wrapping_add(c * chunk), level);
                    }
                }
            } else if pf_on {
                prefetch_to(pfp[r].wrapping_add(at), level);
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
