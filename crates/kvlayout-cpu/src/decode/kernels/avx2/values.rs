//! The AVX2 value kernel: passes of up to 4 heads x 16 elements whose accumulators stay in
//! registers across all rows of a tile.

use std::arch::x86_64::*;

use super::{lanes, load, prefetch_row, widen8};
use crate::arch::PrefetchLevel;
use crate::decode::kernels::args::ValueArgs;
use crate::decode::kernels::rows::codes::esize;
use crate::decode::kernels::rows::RowKind;

/// `acc[j * s + d] += sum_i w[j * ld + i] * row_i[d]` for the rows (at `hoff`, `width`
/// elements of `kind`; `raw` as in `keys::qk`) and the `g` accumulator rows. `pf` as in
/// `keys::qk` (prefetched along the first heads' passes).
///
/// # Safety
/// AVX2, FMA and F16C present; every row pointer plus `hoff` valid for `width` elements of
/// `kind`; `acc` holds `g` rows of `width` at stride `s`; `w.len() >= (g - 1) * ld +
/// rows.len()`. The rows of `pf` are only prefetched.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::decode::kernels) unsafe fn pv(kind: RowKind, raw: bool, a: ValueArgs<'_>) {
    // SAFETY: the caller's contract.
    unsafe { by_kind!(kind, raw, pv_k(a)) }
}

/// Passes of up to 4 heads x 16 elements, held in registers across all the rows.
///
/// # Safety
/// As [`pv`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_k<const K: u8>(a: ValueArgs<'_>) {
    let (rows, pf, hoff, pf_hoff, width) = (a.rows, a.pf, a.hoff, a.pf_hoff, a.width);
    let (w, ld, g, acc, s, level) = (a.w.data, a.w.stride, a.g, a.acc.data, a.acc.stride, a.level);
    let nt = rows.len();
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
                pf,
                pf_off: pf_hoff + line,
                pf_bytes,
                level,
                w: &w[j0 * ld..],
                ld,
                acc: &mut acc[j0 * s..],
                s,
                d0,
                width,
            };
            // SAFETY: in each arm, the caller's contract, for heads `j0 .. j0 + hn` and elements
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
/// `pf_bytes` bytes from `pf_off` are prefetched to `level` as each row is read.
struct Pass<'a> {
    rows: &'a [*const u8],
    hoff: usize,
    pf: &'a [*const u8],
    pf_off: usize,
    pf_bytes: usize,
    level: PrefetchLevel,
    w: &'a [f32],
    ld: usize,
    acc: &'a mut [f32],
    s: usize,
    d0: usize,
    width: usize,
}

/// `H` heads x 16 elements (`FULL`: all 16 inside the row; else the rest of it, masked),
/// held in registers across all the rows: `H` and `FULL` are known at compile time so that
/// the accumulators stay in registers rather than on the stack.
///
/// # Safety
/// As [`pv`], for the pass's heads and elements.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_pass<const K: u8, const H: usize, const FULL: bool>(p: Pass<'_>) {
    let nt = p.rows.len();
    let (pf, pf_off, pf_bytes, level) = (p.pf, p.pf_off, p.pf_bytes, p.level);
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
