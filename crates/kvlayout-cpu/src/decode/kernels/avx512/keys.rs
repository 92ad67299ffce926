//! The AVX-512 logits kernels: blocks of rows x heads sharing 16 accumulators, on rows read
//! whole or in the 16-byte pieces of the legacy vLLM key.

use std::arch::x86_64::*;

use super::{block, hsum16, load, load_split, store_logits};
use crate::arch::{prefetch_bytes, prefetch_to, PrefetchLevel};
use crate::decode::kernels::args::KeyArgs;
use crate::decode::kernels::rows::codes::esize;
use crate::decode::kernels::rows::{row_block, RowKind, SPLIT_PIECE};

/// # Safety
/// AVX-512 F/BW/VL present; every row pointer plus `hoff` valid for `width` elements of
/// `kind`; `q` holds `g` rows of `block`-padded width at stride `qs`;
/// `logits.len() >= (g - 1) * ld + rows.len()`. `pf` is only prefetched.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::decode::kernels) unsafe fn qk_tile(kind: RowKind, raw: bool, a: KeyArgs<'_>) {
    // SAFETY: in each arm, the caller's contract.
    unsafe {
        match a.g {
            1 => by_kind!(kind, raw, qk_k::<16, 1, false>(a)),
            2 => by_kind!(kind, raw, qk_k::<8, 2, false>(a)),
            _ => by_kind!(kind, raw, qk_k::<4, 4, false>(a)),
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::decode::kernels) unsafe fn qk_tile_split(kind: RowKind, raw: bool, a: KeyArgs<'_>) {
    // SAFETY: in each arm, the caller's contract.
    unsafe {
        match a.g {
            1 => by_kind!(kind, raw, qk_k::<16, 1, true>(a)),
            2 => by_kind!(kind, raw, qk_k::<8, 2, true>(a)),
            _ => by_kind!(kind, raw, qk_k::<4, 4, true>(a)),
        }
    }
}

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
unsafe fn qk_k<const K: u8, const R: usize, const H: usize, const SPLIT: bool>(a: KeyArgs<'_>) {
    let (rows, pf, hoff, pf_hoff) = (a.rows, a.pf, a.hoff, a.pf_hoff);
    let (width, chunk, g, level) = (a.width, a.chunk, a.g, a.level);
    let (q, qs, ld, logits) = (a.q.data, a.q.stride, a.logits.stride, a.logits.data);
    let nt = rows.len();
    let bw = block(K);
    let (full, tail) = (width / bw, width % bw);
    let row_bytes = width * esize(K);
    let mut i0 = 0;
    // Whole row blocks of whole head blocks of whole element blocks: no clamping, no masks.
    if g.is_multiple_of(H) && tail == 0 {
        while i0 + R <= nt {
            let (rp, pfp) = row_block::<R>(rows, pf, i0, hoff, pf_hoff);
            for j0 in (0..g).step_by(H) {
                // SAFETY: query rows `j0 .. j0 + H` (inside the group, at stride `qs`) hold
                // `width` values; rows `rp` hold `width` elements, `full` whole blocks
                // (caller's contract).
                let sums = unsafe {
                    let qp: [*const f32; H] =
                        std::array::from_fn(|h| q.as_ptr().add((j0 + h) * qs));
                    let mut acc = [_mm512_setzero_ps(); 16];
                    let pf = BlockPrefetch {
                        rows: &pfp,
                        on: j0 == 0,
                        level,
                    };
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
        let (rp, pfp) = row_block::<R>(rows, pf, i0, hoff, pf_hoff);
        let mut j0 = 0;
        while j0 < g {
            let pf_on = j0 == 0;
            // SAFETY: for the whole block, query rows `min(j0 + h, g - 1)` (at stride `qs`) hold
            // `width` values padded to whole blocks; rows `rp` hold `width` elements: `full`
            // whole blocks and `tail` elements of the next (caller's contract).
            let sums = unsafe {
                let qp: [*const f32; H] =
                    std::array::from_fn(|h| q.as_ptr().add((j0 + h).min(g - 1) * qs));
                let mut acc = [_mm512_setzero_ps(); 16];
                let pf = BlockPrefetch {
                    rows: &pfp,
                    on: pf_on,
                    level,
                };
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
        prefetch_bytes(p.wrapping_add(pf_hoff), 0, row_bytes, level);
    }
}

/// The rows of `pf` matching a row block of [`qk_k`], whose line at each block's offset is
/// prefetched to `level` as the matching row is loaded (when `on`: the first head block).
#[derive(Clone, Copy)]
struct BlockPrefetch<'a, const R: usize> {
    rows: &'a [*const u8; R],
    on: bool,
    level: PrefetchLevel,
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
    pf: BlockPrefetch<'_, R>,
    b: usize,
    n: usize,
    chunk: usize,
) {
    let (bw, nv) = (block(K), block(K) / 16);
    let BlockPrefetch {
        rows: pfp,
        on: pf_on,
        level,
    } = pf;
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
                    let pieces = bw * esize(K) / SPLIT_PIECE;
                    for c in 0..pieces {
                        let p = pfp[r].wrapping_add((b * pieces + c) * chunk);
                        prefetch_to(p, level);
                    }
                }
            } else if pf_on {
                prefetch_to(pfp[r].wrapping_add(at), level);
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
