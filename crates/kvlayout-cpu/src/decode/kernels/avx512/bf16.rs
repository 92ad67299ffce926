//! Kernels for bf16 and fp8 rows on AVX-512 with BF16 and VBMI: every product is taken by
//! `vdpbf16ps` (two bf16 products added to an f32 lane), so a row is never widened to f32.
//!
//! - bf16 rows are read as they are. fp8 rows become bf16 exactly (every e4m3 and e5m2 value,
//!   subnormals, infinities and NaN included, is a bf16): two `vpermi2b` table lookups give
//!   the low and high byte of each value from its 7 magnitude bits, the sign is or-ed into
//!   the high byte, and a byte unpack makes the words (the `Words` order of `Order`).
//! - Keys: query rows are packed bf16 in the row's order (natural for bf16, `Words` for fp8);
//!   blocks of `R` rows x `H` heads share 16 accumulators reduced by one `hsum16`, as in the
//!   f32 kernels.
//! - Values: rows are taken two at a time; an unpack interleaves the two tokens' elements
//!   (for fp8 before the table lookup), so each dword holds (token `i`, token `i + 1`) of one
//!   element and one `vdpbf16ps` with the broadcast pair of weights adds both tokens. The
//!   accumulators are in the `Dwords` order. The weights are rounded to bf16 here (the
//!   softmax step has already rounded them when no scale multiplies them).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{hsum16, mask, mask32, prefetch_line, pv_passes, store_logits};
use crate::decode::kernels::args::{KeyArgs, ValueArgs};
use crate::decode::kernels::rows::codes::{esize, BF16, E5M2};
use crate::decode::kernels::rows::{RowKind, TILE};

/// Elements per block: one zmm of bf16 (32) or of fp8 bytes (64).
const fn block(k: u8) -> usize {
    if k == BF16 {
        32
    } else {
        64
    }
}

#[inline]
fn mask64(rem: usize) -> __mmask64 {
    if rem >= 64 {
        u64::MAX
    } else {
        (1u64 << rem) - 1
    }
}

/// The bf16 encoding of the 128 fp8 magnitudes, as low bytes then high bytes.
fn table_bytes(k: u8) -> &'static [[u8; 128]; 2] {
    static TABLES: OnceLock<[[[u8; 128]; 2]; 2]> = OnceLock::new();
    let t = TABLES.get_or_init(|| {
        [kvlayout::DType::Fp8E4m3, kvlayout::DType::Fp8E5m2].map(|dtype| {
            let values = crate::elem::fp8_table(dtype);
            let mut t = [[0u8; 128]; 2];
            for m in 0..128 {
                // Exact: every fp8 value has a bf16 encoding (the top half of its f32 bits).
                let b = (values[m].to_bits() >> 16) as u16;
                t[0][m] = b as u8;
                t[1][m] = (b >> 8) as u8;
            }
            t
        })
    });
    &t[usize::from(k == E5M2)]
}

/// The lookup tables of kind `K` in registers (unused for bf16).
#[derive(Clone, Copy)]
struct Tables {
    lo: [__m512i; 2],
    hi: [__m512i; 2],
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
fn tables<const K: u8>() -> Tables {
    if K == BF16 {
        let z = _mm512_setzero_si512();
        return Tables {
            lo: [z; 2],
            hi: [z; 2],
        };
    }
    let t = table_bytes(K);
    // SAFETY: each half of each 128-byte table is 64 bytes in bounds.
    unsafe {
        let ld = |b: &[u8; 128], h: usize| _mm512_loadu_si512(b.as_ptr().add(64 * h).cast());
        Tables {
            lo: [ld(&t[0], 0), ld(&t[0], 1)],
            hi: [ld(&t[1], 0), ld(&t[1], 1)],
        }
    }
}

/// 64 fp8 bytes to bf16: per 128-bit lane `l`, bytes `0..8` become the words of the first
/// vector and bytes `8..16` those of the second.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
fn fp8_to_bf16(x: __m512i, t: &Tables) -> [__m512i; 2] {
    let lo = _mm512_permutex2var_epi8(t.lo[0], x, t.lo[1]);
    let hi = _mm512_permutex2var_epi8(t.hi[0], x, t.hi[1]);
    // hi | (x & 0x80): the sign.
    let hi = _mm512_ternarylogic_epi32::<0xF8>(hi, x, _mm512_set1_epi8(0x80u8 as i8));
    [_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi)]
}

/// Loads the first `n` elements (at most a block; the rest zero, not read) of block `b` of a
/// row of kind `K`. `FULL`: the whole block, no mask.
///
/// # Safety
/// The first `n` elements of the block lie inside the row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
unsafe fn load_raw<const K: u8, const FULL: bool>(row: *const u8, b: usize, n: usize) -> __m512i {
    let p = row.wrapping_add(b * block(K) * esize(K));
    // SAFETY: the caller keeps the first `n` elements inside the row; the masks select
    // exactly those and masked-off lanes are not read.
    unsafe {
        match (K, FULL) {
            (_, true) => _mm512_loadu_si512(p.cast()),
            (BF16, false) => _mm512_maskz_loadu_epi16(mask32(n), p.cast()),
            _ => _mm512_maskz_loadu_epi8(mask64(n), p.cast()),
        }
    }
}

/// Block `b` of a key row as bf16 vectors (one for bf16, two for fp8) in the key order.
///
/// # Safety
/// As [`load_raw`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
unsafe fn load_key<const K: u8, const FULL: bool>(
    row: *const u8,
    b: usize,
    n: usize,
    t: &Tables,
) -> [__m512i; 2] {
    // SAFETY: the caller's contract.
    let x = unsafe { load_raw::<K, FULL>(row, b, n) };
    if K == BF16 {
        [x, _mm512_setzero_si512()]
    } else {
        fp8_to_bf16(x, t)
    }
}

/// Block `b` of two value rows (`r1` none: zeros) as token pairs: dword `4 l + k` of vector
/// `m` holds (row 0, row 1) of element `(block / 4) l + 4 m + k` (two vectors for bf16, four
/// for fp8).
///
/// # Safety
/// As [`load_raw`], for both rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
unsafe fn load_pairs<const K: u8, const FULL: bool>(
    r0: *const u8,
    r1: Option<*const u8>,
    b: usize,
    n: usize,
    t: &Tables,
) -> [__m512i; 4] {
    // SAFETY: the caller's contract.
    let (x0, x1) = unsafe {
        (
            load_raw::<K, FULL>(r0, b, n),
            match r1 {
                Some(r1) => load_raw::<K, FULL>(r1, b, n),
                None => _mm512_setzero_si512(),
            },
        )
    };
    if K == BF16 {
        let z = _mm512_setzero_si512();
        [
            _mm512_unpacklo_epi16(x0, x1),
            _mm512_unpackhi_epi16(x0, x1),
            z,
            z,
        ]
    } else {
        let [a, b] = fp8_to_bf16(_mm512_unpacklo_epi8(x0, x1), t);
        let [c, d] = fp8_to_bf16(_mm512_unpackhi_epi8(x0, x1), t);
        [a, b, c, d]
    }
}

#[inline(always)]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// See `kernels::qk_tile`: the query rows are packed bf16 in the key order.
///
/// # Safety
/// AVX-512 F/BW/VL, BF16 and VBMI present; every row pointer plus `hoff` valid for `width`
/// elements of `kind`; `q` holds `g` packed rows of the block-padded width at stride `qs`
/// slots; `logits.len() >= (g - 1) * ld + rows.len()`. `pf` is only prefetched.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
pub(in crate::decode::kernels) unsafe fn qk_tile(kind: RowKind, raw: bool, a: KeyArgs<'_>) {
    debug_assert!(
        !raw,
        "fp8 rows become bf16 exactly: no power of two to fold"
    );
    // SAFETY: in each arm, the caller's contract.
    unsafe {
        match a.g {
            1 => by_kind!(bf16 kind, qk_k::<16, 1>(a)),
            2 => by_kind!(bf16 kind, qk_k::<8, 2>(a)),
            _ => by_kind!(bf16 kind, qk_k::<4, 4>(a)),
        }
    }
}

/// Blocks of `R` rows x `H` heads, as the plain AVX-512 `keys::qk_k`.
///
/// # Safety
/// As [`qk_tile`].
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
unsafe fn qk_k<const K: u8, const R: usize, const H: usize>(a: KeyArgs<'_>) {
    let (rows, pf, hoff, pf_hoff) = (a.rows, a.pf, a.hoff, a.pf_hoff);
    let (width, g, level) = (a.width, a.g, a.level);
    let (q, qs, ld, logits) = (a.q.data, a.q.stride, a.logits.stride, a.logits.data);
    let nt = rows.len();
    let bw = block(K);
    let nv = bw / 32;
    let nb = width.div_ceil(bw);
    let t = tables::<K>();
    let mut i0 = 0;
    while i0 < nt {
        let rp: [*const u8; R] =
            std::array::from_fn(|r| rows[(i0 + r).min(nt - 1)].wrapping_add(hoff));
        let npf = pf.len().saturating_sub(i0).min(R);
        let mut j0 = 0;
        while j0 < g {
            let npf = if j0 == 0 { npf } else { 0 };
            // SAFETY: for the whole block, packed query rows `min(j0 + h, g - 1)` hold
            // `nb * bw` bf16 at stride `qs` slots; rows `rp` hold `width` elements and
            // `load_key` reads only the first `width - b * bw` of the last block (caller's
            // contract).
            let sums = unsafe {
                let qp: [*const u16; H] =
                    std::array::from_fn(|h| q.as_ptr().add((j0 + h).min(g - 1) * qs).cast::<u16>());
                let mut acc = [_mm512_setzero_ps(); 16];
                for b in 0..nb {
                    let n = (width - b * bw).min(bw);
                    let qv: [[__m512i; 2]; H] = std::array::from_fn(|h| {
                        std::array::from_fn(|v| {
                            if v < nv {
                                _mm512_loadu_si512(qp[h].add(b * bw + v * 32).cast())
                            } else {
                                _mm512_setzero_si512()
                            }
                        })
                    });
                    for r in 0..R {
                        if r < npf {
                            prefetch_line(
                                pf[i0 + r].wrapping_add(pf_hoff),
                                b * bw * esize(K),
                                level,
                            );
                        }
                        let x = if n == bw {
                            load_key::<K, true>(rp[r], b, n, &t)
                        } else {
                            load_key::<K, false>(rp[r], b, n, &t)
                        };
                        for v in 0..nv {
                            for h in 0..H {
                                let l = h * R + r;
                                let a = l % 4 * 4 + l / 4;
                                acc[a] = _mm512_dpbf16_ps(acc[a], bh(qv[h][v]), bh(x[v]));
                            }
                        }
                    }
                }
                hsum16(acc)
            };
            store_logits::<R, H>(sums, logits, ld, i0, j0, nt, g);
            j0 += H;
        }
        i0 += R;
    }
}

/// See `kernels::pv_tile`: accumulators in the `Dwords` order, weights rounded to bf16.
///
/// # Safety
/// AVX-512 F/BW/VL, BF16 and VBMI present; every row pointer plus `hoff` valid for `width`
/// elements of `kind`; `acc` holds `g` rows of block-padded width at stride `s`;
/// `w.len() >= (g - 1) * ld + rows.len()`, `rows.len() <= TILE`. `pf` is only prefetched.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
pub(in crate::decode::kernels) unsafe fn pv_tile(
    kind: RowKind,
    raw: bool,
    mut args: ValueArgs<'_>,
) {
    debug_assert!(
        !raw,
        "fp8 rows become bf16 exactly: no power of two to fold"
    );
    let (w, width, g, nt) = (args.w, args.width, args.g, args.rows.len());
    let ld = w.stride;
    assert!(nt <= TILE);
    // Vectors of 16 accumulators per row: 2 per block for bf16, 4 for fp8.
    let vecs = if kind == RowKind::Bf16 {
        width.div_ceil(32) * 2
    } else {
        width.div_ceil(64) * 4
    };
    // The weights of the pass's heads as bf16, converted once per head block.
    let mut wb = [[0u16; TILE]; 4];
    let mut wb_heads = usize::MAX;
    pv_passes(g, vecs, |j0, h, c0, c| {
        if wb_heads != j0 {
            bf16_weights(&w.data[j0 * ld..], ld, h, nt, &mut wb);
            wb_heads = j0;
        }
        let a = args.pass(j0 == 0);
        // SAFETY: in each arm, heads j0 .. j0 + h are inside the group; every pass takes whole
        // blocks (`c` and `c0` are multiples of the 2 or 4 vectors of a block: `vecs` is).
        unsafe {
            match (h, c) {
                (4, 4) => by_kind!(bf16 kind, pv_k::<4, 4>(a, j0, c0, &wb)),
                (4, _) => by_kind!(bf16 kind, pv_k::<4, 2>(a, j0, c0, &wb)),
                (2, 8) => by_kind!(bf16 kind, pv_k::<2, 8>(a, j0, c0, &wb)),
                (2, _) => by_kind!(bf16 kind, pv_k::<2, 4>(a, j0, c0, &wb)),
                (_, 8) => by_kind!(bf16 kind, pv_k::<1, 8>(a, j0, c0, &wb)),
                (_, _) => by_kind!(bf16 kind, pv_k::<1, 4>(a, j0, c0, &wb)),
            }
        }
    });
}

/// Rows `0 .. h` of the weights (`w[j * ld + i]`, `nt` each) rounded to bf16 into `wb`, zero
/// past `nt` (an odd last row pairs with 0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
fn bf16_weights(w: &[f32], ld: usize, h: usize, nt: usize, wb: &mut [[u16; TILE]; 4]) {
    for (j, row) in wb.iter_mut().enumerate().take(h) {
        let src = &w[j * ld..j * ld + nt];
        for i in (0..TILE).step_by(16) {
            // SAFETY: the masked lanes stay inside `src` (none past `nt`) and the 16 stored
            // bf16 inside `row` (`i + 16 <= TILE`).
            unsafe {
                let x =
                    _mm512_maskz_loadu_ps(mask(nt.saturating_sub(i)), src.as_ptr().add(i.min(nt)));
                let b = _mm512_cvtneps_pbh(x);
                _mm256_storeu_si256(
                    row[i..].as_mut_ptr().cast(),
                    std::mem::transmute::<__m256bh, __m256i>(b),
                );
            }
        }
    }
}

/// Accumulators of heads `j0 .. j0 + H` x vectors `c0 .. c0 + C` held in registers across
/// all row pairs of the tile, the weights of heads `j0 ..` as bf16 in `wb`.
///
/// # Safety
/// As [`pv_tile`], heads `j0 .. j0 + H` inside the group, `c0` a multiple of the vectors per
/// block.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
unsafe fn pv_k<const K: u8, const H: usize, const C: usize>(
    a: ValueArgs<'_>,
    j0: usize,
    c0: usize,
    wb: &[[u16; TILE]; 4],
) {
    // The weights are in `wb`.
    let (rows, pf, hoff, pf_hoff, width) = (a.rows, a.pf, a.hoff, a.pf_hoff, a.width);
    let (acc, s, level) = (a.acc.data, a.acc.stride, a.level);
    let nt = rows.len();
    let bw = block(K);
    let nv = bw / 16;
    assert!(C.is_multiple_of(nv) && c0.is_multiple_of(nv));
    let b0 = c0 / nv;
    let nblk = C / nv;
    let valid: [usize; C] = std::array::from_fn(|bb| width.saturating_sub((b0 + bb) * bw).min(bw));
    let live: [bool; C] = std::array::from_fn(|c| (c0 + c) * 16 < s && valid[c / nv] > 0);
    let t = tables::<K>();
    let ap = acc.as_mut_ptr();
    // SAFETY: for the whole block, accumulator rows j0 .. j0 + H hold `s` values inside `acc` and
    // only live vectors (inside the padded width) are touched; rows hold `width` elements
    // from `hoff` and the loads read only the valid ones (caller's contract).
    unsafe {
        let mut a = [[_mm512_setzero_ps(); C]; H];
        for h in 0..H {
            for c in 0..C {
                if live[c] {
                    a[h][c] = _mm512_loadu_ps(ap.add((j0 + h) * s + (c0 + c) * 16));
                }
            }
        }
        for i in (0..nt).step_by(2) {
            let r0 = rows[i].wrapping_add(hoff);
            let r1 = (i + 1 < nt).then(|| rows[i + 1].wrapping_add(hoff));
            for p in i..(i + 2).min(pf.len()) {
                for bb in 0..nblk {
                    if valid[bb] > 0 {
                        prefetch_line(
                            pf[p].wrapping_add(pf_hoff),
                            (b0 + bb) * bw * esize(K),
                            level,
                        );
                    }
                }
            }
            let wv: [__m512i; H] = std::array::from_fn(|h| {
                _mm512_set1_epi32(std::ptr::read_unaligned(
                    wb[h].as_ptr().add(i).cast::<i32>(),
                ))
            });
            for bb in 0..nblk {
                let x = if valid[bb] == bw {
                    load_pairs::<K, true>(r0, r1, b0 + bb, bw, &t)
                } else {
                    load_pairs::<K, false>(r0, r1, b0 + bb, valid[bb], &t)
                };
                for v in 0..nv {
                    for h in 0..H {
                        let c = bb * nv + v;
                        a[h][c] = _mm512_dpbf16_ps(a[h][c], bh(x[v]), bh(wv[h]));
                    }
                }
            }
        }
        for h in 0..H {
            for c in 0..C {
                if live[c] {
                    _mm512_storeu_ps(ap.add((j0 + h) * s + (c0 + c) * 16), a[h][c]);
                }
            }
        }
    }
}
