//! The element orders of the decode kernels: how a query row or an accumulator row is held
//! (padded to whole blocks, permuted within each block, bf16-packed for the bf16-operand
//! kernels), with the block permutations as tables built at compile time.

use super::rows::RowKind;
use crate::arch::Isa;

/// Which rows an [`Order`] is for: query rows (read against key rows) or accumulator rows
/// (filled from value rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Key,
    Value,
}

/// How the elements of a block are permuted (see `Order::each`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Perm {
    Natural,
    /// Blocks of 32: even elements first, then odd (bf16 widened to f32 on AVX-512).
    EvenOdd,
    /// Blocks of 64: element `16 l + 8 z + j` at `32 z + 8 l + j` (fp8 keys widened to bf16:
    /// the words of a byte unpack, 128-bit lane `l`).
    Words,
    /// Blocks of `b`: element `(b / 4) l + 4 m + k` at `16 m + 4 l + k` (accumulators of bf16
    /// and fp8 values read as token pairs: the dwords of an unpack, 128-bit lane `l`).
    Dwords,
}

/// The order in which the kernels of an instruction set hold the elements of a row of one
/// kind: query rows and accumulators are kept in it, zero-padded to whole blocks. Query rows
/// of the bf16-operand kernels are `packed`: bf16 values, two to an f32 slot (position `p` in
/// the low half of slot `p / 2` when even, the high half when odd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Order {
    /// Elements per block (1: no padding).
    block: usize,
    perm: Perm,
    packed: bool,
    /// `table[e]`: the position of element `e` of a block, for `e < block`.
    table: &'static [u8; 64],
}

/// Position of element `e` of a block of `block` elements under `perm`.
const fn block_pos(perm: Perm, block: usize, e: usize) -> usize {
    match perm {
        Perm::Natural => e,
        Perm::EvenOdd => (e >> 1) + 16 * (e & 1),
        Perm::Words => 32 * ((e >> 3) & 1) + 8 * (e >> 4) + (e & 7),
        Perm::Dwords => {
            // (block / 4) l + 4 m + k, block / 4 = 2^(log2 block - 2).
            let sh = block.trailing_zeros() - 2;
            let r = e & ((1 << sh) - 1);
            16 * (r >> 2) + 4 * (e >> sh) + (e & 3)
        }
    }
}

/// [`block_pos`] of every element of a block, computed at compile time.
const fn block_table(perm: Perm, block: usize) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut e = 0;
    while e < block {
        t[e] = block_pos(perm, block, e) as u8;
        e += 1;
    }
    t
}

static NATURAL: [u8; 64] = block_table(Perm::Natural, 64);
static EVEN_ODD_32: [u8; 64] = block_table(Perm::EvenOdd, 32);
static WORDS_64: [u8; 64] = block_table(Perm::Words, 64);
static DWORDS_32: [u8; 64] = block_table(Perm::Dwords, 32);
static DWORDS_64: [u8; 64] = block_table(Perm::Dwords, 64);

impl Order {
    pub(crate) fn of(isa: Isa, kind: RowKind, role: Role) -> Order {
        let (block, perm, packed): (usize, Perm, bool) = if isa.bf16_operands(kind) {
            let block = if kind == RowKind::Bf16 { 32 } else { 64 };
            match (role, kind) {
                (Role::Key, RowKind::Bf16) => (block, Perm::Natural, true),
                (Role::Key, _) => (block, Perm::Words, true),
                (Role::Value, _) => (block, Perm::Dwords, false),
            }
        } else if isa.avx512() {
            match kind {
                RowKind::Bf16 => (32, Perm::EvenOdd, false),
                RowKind::Fp8E4m3 | RowKind::Fp8E5m2 => (32, Perm::Natural, false),
                _ => (16, Perm::Natural, false),
            }
        } else {
            (1, Perm::Natural, false)
        };
        let table = match (perm, block) {
            (Perm::Natural, _) => &NATURAL,
            (Perm::EvenOdd, 32) => &EVEN_ODD_32,
            (Perm::Words, 64) => &WORDS_64,
            (Perm::Dwords, 32) => &DWORDS_32,
            (Perm::Dwords, 64) => &DWORDS_64,
            _ => unreachable!("no kernel order {perm:?} in blocks of {block}"),
        };
        debug_assert!(block.is_power_of_two() && block <= 64);
        Order {
            block,
            perm,
            packed,
            table,
        }
    }

    /// Elements a row of `width` takes in this order.
    pub(crate) fn padded(&self, width: usize) -> usize {
        width.div_ceil(self.block) * self.block
    }

    /// Whether products are taken with bf16 operands (the query, or the weights, rounded to
    /// bf16): the orders of the bf16-operand kernels.
    pub(crate) fn bf16_operands(&self) -> bool {
        matches!(self.perm, Perm::Words | Perm::Dwords) || self.packed
    }

    /// Whether rows in this order are packed bf16 (query rows of the bf16-operand kernels).
    #[cfg(test)]
    pub(crate) fn is_packed(&self) -> bool {
        self.packed
    }

    /// Position of element `d`.
    #[cfg(test)]
    pub(crate) fn pos(&self, d: usize) -> usize {
        let mut p = 0;
        self.each(d + 1, |_, q| p = q);
        p
    }

    /// Calls `f(d, pos(d))` for `d` in `0..n`, in increasing `d`.
    #[inline(always)]
    fn each(&self, n: usize, mut f: impl FnMut(usize, usize)) {
        // Blocks are powers of two (1, 16, 32, 64): masks, no division.
        let m = self.block - 1;
        (0..n).for_each(|d| f(d, (d - (d & m)) + self.table[d & m] as usize));
    }

    /// `dst` (padded; packed rows use its first half) = `src` (natural order, the row's
    /// width) in this order, zeros after.
    pub(crate) fn arrange(&self, src: &[f32], dst: &mut [f32]) {
        assert!(dst.len() >= self.padded(src.len()));
        dst.fill(0.0);
        if self.packed {
            let dst: &mut [u32] = bytemuck::cast_slice_mut(dst);
            self.each(src.len(), |d, p| {
                dst[p / 2] |= u32::from(bf16_bits(src[d])) << (16 * (p % 2));
            });
        } else if self.perm == Perm::Natural {
            dst[..src.len()].copy_from_slice(src);
        } else if self.perm == Perm::EvenOdd {
            // Whole blocks without the table, then the tail through it.
            let whole = src.len() / 32 * 32;
            let blocks = src[..whole].as_chunks::<32>().0;
            for (s, d) in blocks.iter().zip(dst.as_chunks_mut::<32>().0) {
                split_even_odd(s, d);
            }
            let t = self.table;
            for (x, &p) in src[whole..].iter().zip(&t[..32]) {
                dst[whole + p as usize] = *x;
            }
        } else {
            // Block by block through the block's table: no per-element permutation
            // arithmetic, and indices the compiler sees inside the block.
            let (b, t) = (self.block, self.table);
            for (s, d) in src.chunks(b).zip(dst.chunks_exact_mut(b)) {
                for (x, &p) in s.iter().zip(&t[..b]) {
                    d[p as usize] = *x;
                }
            }
        }
    }

    /// `dst[d] = f * src[pos(d)]` for the `dst.len()` elements of a row (not packed).
    pub(crate) fn restore(&self, src: &[f32], f: f32, dst: &mut [f32]) {
        assert!(!self.packed, "packed rows are query rows, never restored");
        assert!(src.len() >= self.padded(dst.len()));
        if self.perm == Perm::Natural {
            for (x, s) in dst.iter_mut().zip(src) {
                *x = s * f;
            }
            return;
        }
        if self.perm == Perm::EvenOdd {
            // Whole blocks without the table (vectorized), then the tail through it.
            let whole = dst.len() / 32 * 32;
            let blocks = dst[..whole].as_chunks_mut::<32>().0;
            for (d, s) in blocks.iter_mut().zip(src.as_chunks::<32>().0) {
                join_even_odd(s, f, d);
            }
            let (t, s) = (self.table, &src[whole..]);
            for (x, &p) in dst[whole..].iter_mut().zip(&t[..32]) {
                *x = s[p as usize] * f;
            }
            return;
        }
        let (b, t) = (self.block, self.table);
        for (d, s) in dst.chunks_mut(b).zip(src.chunks_exact(b)) {
            for (x, &p) in d.iter_mut().zip(&t[..b]) {
                *x = s[p as usize] * f;
            }
        }
    }
}

/// A block of 32 in the even/odd order: element `2i` of `s` to `d[i]`, `2i + 1` to
/// `d[16 + i]` (on x86_64 by SSE2 shuffles, four at a time).
#[inline]
fn split_even_odd(s: &[f32; 32], d: &mut [f32; 32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_shuffle_ps, _mm_storeu_ps};
        for k in 0..4 {
            // SAFETY: SSE2 is part of x86_64; floats `8k .. 8k + 8` of `s`, `4k .. 4k + 4`
            // and `16 + 4k .. 20 + 4k` of `d` lie inside the two blocks of 32.
            unsafe {
                let a = _mm_loadu_ps(s.as_ptr().add(8 * k));
                let b = _mm_loadu_ps(s.as_ptr().add(8 * k + 4));
                _mm_storeu_ps(d.as_mut_ptr().add(4 * k), _mm_shuffle_ps::<0x88>(a, b));
                _mm_storeu_ps(d.as_mut_ptr().add(16 + 4 * k), _mm_shuffle_ps::<0xDD>(a, b));
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..16 {
        d[i] = s[2 * i];
        d[16 + i] = s[2 * i + 1];
    }
}

/// The inverse of [`split_even_odd`], times `f`: `d[2i] = f s[i]`, `d[2i + 1] = f s[16 + i]`.
#[inline]
fn join_even_odd(s: &[f32; 32], f: f32, d: &mut [f32; 32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: for each block, SSE2 is part of x86_64; floats `4k .. 4k + 4` and
        // `16 + 4k .. 20 + 4k` of `s`, `8k .. 8k + 8` of `d` lie inside the blocks of 32.
        unsafe {
            let fv = _mm_set1_ps(f);
            for k in 0..4 {
                let e = _mm_mul_ps(_mm_loadu_ps(s.as_ptr().add(4 * k)), fv);
                let o = _mm_mul_ps(_mm_loadu_ps(s.as_ptr().add(16 + 4 * k)), fv);
                _mm_storeu_ps(d.as_mut_ptr().add(8 * k), _mm_unpacklo_ps(e, o));
                _mm_storeu_ps(d.as_mut_ptr().add(8 * k + 4), _mm_unpackhi_ps(e, o));
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..16 {
        d[2 * i] = s[i] * f;
        d[2 * i + 1] = s[16 + i] * f;
    }
}

/// `x` rounded to the nearest bf16, ties to even (what `half::bf16::from_f32` gives, without
/// its branches for finite values; NaN stays a quiet NaN of the same sign).
#[inline]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each table is a permutation of its block and places every element where the
    /// permutation's doc says, written out here by enumeration rather than by `block_pos`.
    #[test]
    fn block_tables_are_the_documented_permutations() {
        let mut want = Vec::new();
        // EvenOdd, blocks of 32: element 2i at i, 2i + 1 at 16 + i.
        let mut t = [0usize; 32];
        for i in 0..16 {
            t[2 * i] = i;
            t[2 * i + 1] = 16 + i;
        }
        want.push((&EVEN_ODD_32, t.to_vec()));
        // Words, blocks of 64: element 16 l + 8 z + j at 32 z + 8 l + j.
        let mut t = [0usize; 64];
        for l in 0..4 {
            for z in 0..2 {
                for j in 0..8 {
                    t[16 * l + 8 * z + j] = 32 * z + 8 * l + j;
                }
            }
        }
        want.push((&WORDS_64, t.to_vec()));
        // Dwords, blocks of b: element (b / 4) l + 4 m + k at 16 m + 4 l + k.
        for (table, b) in [(&DWORDS_32, 32), (&DWORDS_64, 64)] {
            let mut t = vec![0usize; b];
            for l in 0..4 {
                for m in 0..b / 16 {
                    for k in 0..4 {
                        t[b / 4 * l + 4 * m + k] = 16 * m + 4 * l + k;
                    }
                }
            }
            want.push((table, t));
        }
        want.push((&NATURAL, (0..64).collect()));
        for (table, t) in want {
            let got: Vec<usize> = table[..t.len()].iter().map(|&p| p as usize).collect();
            assert_eq!(got, t);
            let mut sorted = got.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..t.len()).collect::<Vec<_>>(), "a permutation");
        }
    }

    /// The query rounding equals `half`'s round-to-nearest-even: on ties, on values that
    /// round up to infinity, on subnormals, infinities and NaN (which stays NaN).
    #[test]
    fn bf16_rounding_matches_half() {
        let mut bits: Vec<u32> = (0..=0xFFFFu32).map(|h| h << 16).collect();
        for h in (0..=0xFFFFu32).step_by(7) {
            for low in [0x7FFF, 0x8000, 0x8001, 0x0001, 0xFFFF] {
                bits.push(h << 16 | low);
            }
        }
        for b in bits {
            let x = f32::from_bits(b);
            let want = half::bf16::from_f32(x);
            let got = bf16_bits(x);
            if x.is_nan() {
                assert!(half::bf16::from_bits(got).is_nan(), "{b:#x}");
            } else {
                assert_eq!(got, want.to_bits(), "{b:#x}");
            }
        }
    }

    /// Every build's orders, whether or not this machine runs it (they are plain index
    /// arithmetic), place each element where [`Order::pos`] says, pad with zeros and
    /// restore what they arranged.
    #[test]
    fn kernel_order_round_trips() {
        for &isa in Isa::ALL {
            for (kind, role) in [RowKind::F32, RowKind::Bf16, RowKind::Fp8E4m3]
                .into_iter()
                .flat_map(|k| [(k, Role::Key), (k, Role::Value)])
            {
                let o = Order::of(isa, kind, role);
                for w in [1, 16, 31, 32, 33, 80, 120, 576] {
                    round_trip(o, w, isa, kind);
                }
            }
        }
    }

    fn round_trip(o: Order, w: usize, isa: Isa, kind: RowKind) {
        // Distinct values, exact in bf16.
        let src: Vec<f32> = (0..w).map(|i| (i % 256) as f32 + 1.0).collect();
        let mut k = vec![f32::NAN; o.padded(w)];
        o.arrange(&src, &mut k);
        if o.is_packed() {
            // bf16 pairs: element d (exact in bf16) at half `pos(d)`.
            let halves: Vec<u16> = k[..o.padded(w) / 2]
                .iter()
                .flat_map(|x| [x.to_bits() as u16, (x.to_bits() >> 16) as u16])
                .collect();
            for (d, x) in src.iter().enumerate() {
                assert_eq!(half::bf16::from_bits(halves[o.pos(d)]).to_f32(), *x);
            }
            assert_eq!(halves.iter().filter(|h| **h == 0).count(), o.padded(w) - w);
            return;
        }
        // Each element where the order's table puts it (the fast paths bypass it).
        for (d, x) in src.iter().enumerate() {
            assert_eq!(k[o.pos(d)], *x, "{isa:?} {kind:?} width {w} element {d}");
        }
        let mut back = vec![0f32; w];
        o.restore(&k, 2.0, &mut back);
        let twice: Vec<f32> = src.iter().map(|x| x * 2.0).collect();
        assert_eq!(back, twice, "{isa:?} {kind:?} width {w}");
        assert_eq!(k.iter().filter(|x| **x == 0.0).count(), o.padded(w) - w);
    }
}
