//! The AVX-512 value kernels: the accumulators of a pass of up to 4 heads held in registers
//! across all rows of a tile, each row widened once for all the pass's heads.

use std::arch::x86_64::*;

use super::{block, load, pv_passes};
use crate::arch::{prefetch_to, PrefetchLevel};
use crate::decode::kernels::args::ValueArgs;
use crate::decode::kernels::rows::codes::esize;
use crate::decode::kernels::rows::RowKind;

/// # Safety
/// AVX-512 F/BW/VL present; every row pointer plus `hoff` valid for `width` elements of
/// `kind`; `acc` holds `g` rows of `block`-padded width at stride `s`;
/// `w.len() >= (g - 1) * ld + rows.len()`. `pf` is only prefetched.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::decode::kernels) unsafe fn pv_tile(
    kind: RowKind,
    raw: bool,
    mut args: ValueArgs<'_>,
) {
    let (width, g) = (args.width, args.g);
    // Vectors of 16 accumulators per row: the block-padded width.
    let vecs = if kind == RowKind::Bf16 {
        width.div_ceil(32) * 2
    } else {
        width.div_ceil(16)
    };
    pv_passes(g, vecs, |j0, h, c0, c| {
        let a = args.pass(j0 == 0);
        // SAFETY: in each arm, heads j0 .. j0 + h are inside the group; vectors from c0
        // are masked to `width` (caller's contract for the rest).
        unsafe {
            match (h, c) {
                (4, 4) => by_kind!(kind, raw, pv_k::<4, 4>(a, j0, c0)),
                (4, _) => by_kind!(kind, raw, pv_k::<4, 2>(a, j0, c0)),
                (2, 8) => by_kind!(kind, raw, pv_k::<2, 8>(a, j0, c0)),
                (2, _) => by_kind!(kind, raw, pv_k::<2, 4>(a, j0, c0)),
                (_, 8) => by_kind!(kind, raw, pv_k::<1, 8>(a, j0, c0)),
                (_, _) => by_kind!(kind, raw, pv_k::<1, 4>(a, j0, c0)),
            }
        }
    });
}

/// Accumulators of heads `j0 .. j0 + H` x vectors `c0 .. c0 + C` (16 lanes each, in the
/// kernel order) held in registers across all rows of the tile; each block of a row is
/// widened once for the `H` heads, each weight broadcast once per row. The same blocks of
/// the rows of `pf` are prefetched as the rows are read.
///
/// # Safety
/// As [`pv_tile`], heads `j0 .. j0 + H` inside the group, `c0` a multiple of the
/// vectors per block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pv_k<const K: u8, const H: usize, const C: usize>(
    a: ValueArgs<'_>,
    j0: usize,
    c0: usize,
) {
    let (rows, pf, hoff, pf_hoff, width) = (a.rows, a.pf, a.hoff, a.pf_hoff, a.width);
    let (w, ld, acc, s, level) = (a.w.data, a.w.stride, a.acc.data, a.acc.stride, a.level);
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
    let pf_from = (b0 * bw * esize(K)).min(width * esize(K));
    let pf_bytes = ((b0 + nblk) * bw * esize(K)).min(width * esize(K)) - pf_from;
    // SAFETY: for the whole block, accumulator rows j0 .. j0 + H hold `s` values inside `acc`
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
        let pf = RowPrefetch {
            rows: pf,
            off: pf_hoff + pf_from,
            bytes: pf_bytes,
            level,
        };
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

/// The rows of `pf` whose bytes `off .. off + bytes` (the blocks of a pass of [`pv_k`]) are
/// prefetched to `level` as the matching rows are read.
#[derive(Clone, Copy)]
struct RowPrefetch<'a> {
    rows: &'a [*const u8],
    off: usize,
    bytes: usize,
    level: PrefetchLevel,
}

/// The rows of a value tile into the pass's accumulators `a` (see [`pv_k`]): each block of
/// a row widened once for the `H` heads, each weight broadcast once per row; `pf`: what to
/// prefetch meanwhile. `FULL`: every block of the pass is whole.
///
/// # Safety
/// As [`pv_k`]; `wp[h]` valid for `rows.len()` floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pv_rows<const K: u8, const H: usize, const C: usize, const FULL: bool>(
    a: &mut [[__m512; C]; H],
    rows: &[*const u8],
    hoff: usize,
    pf: RowPrefetch<'_>,
    wp: [*const f32; H],
    b0: usize,
    valid: &[usize; C],
) {
    let (bw, nv) = (block(K), block(K) / 16);
    let RowPrefetch {
        rows: pf,
        off: pf_off,
        bytes: pf_bytes,
        level,
    } = pf;
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
                    prefetch_to(pp.wrapping_add(at), level);
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
