//! Kernels of the decode, on rows stored as f32, f16, bf16, fp8 (e4m3, e5m2) or int8 bytes
//! (contiguous rows read in place), or on rows already gathered into f32.
//!
//! Per tile of up to [`TILE`] rows of one KV head: [`qk_tile`] computes the logits of every
//! row against the whole GQA group of query rows, [`softmax_tile`] is the online-softmax step,
//! [`pv_tile`] accumulates the value rows into the group's accumulators. Three builds of the
//! same contract, chosen once per call at run time:
//!
//! - AVX-512 F/BW/VL: rows are widened in registers, once per row for all heads of the group.
//!   `qk` works on blocks of rows x heads sharing 16 accumulators (one transposed reduction per
//!   block); `pv` holds the accumulators of up to 4 heads x 64 elements in registers across
//!   all rows of the tile. f16 widens by `vcvtph2ps`; bf16 by a shift (even elements) and a
//!   mask (odd elements) of one 512-bit load, so query rows and accumulators are kept in an
//!   even/odd order within blocks of 32 ([`Order`]); fp8 (same order) sign-extends 32 bytes
//!   to words and moves each element's bits into an f32 whose value is the fp8 value times
//!   2^-120 (e4m3) or 2^-112 (e5m2), exactly, subnormals included, and that power of two is
//!   either multiplied back or folded by the caller into the query, the logits and the
//!   weights ([`fp8_fold`]); int8 by `vcvtdq2ps`.
//! - AVX2 + FMA: each row is widened into a scratch row, then portable loops compiled with
//!   those features.
//! - scalar: the same portable loops.
//!
//! Rows come in a [`RowSet`]: each row is bounds-checked against its buffer when it is added
//! (for every head the kernels may read), then read through raw pointers with unaligned,
//! width-masked loads.

/// Tokens per online-softmax tile (the leading dimension of the logits and weights).
pub(crate) const TILE: usize = 64;

/// How a row's bytes encode its elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowKind {
    F32,
    F16,
    Bf16,
    Fp8E4m3,
    Fp8E5m2,
    I8,
}

/// The selected instruction set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// [`Isa::Avx512`] plus BF16 and VBMI: bf16 and fp8 rows go through the kernels of
    /// `avx512bf16` (bf16 operands, f32 accumulation); every other kind as on `Avx512`.
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Scalar,
}

pub(crate) fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512_bf16() {
            return Isa::Avx512Bf16;
        }
        if has_avx512() {
            return Isa::Avx512;
        }
        if has_avx2() {
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

/// Whether this machine runs the AVX-512 kernels (the safe wrappers check it before every
/// call into them: `std` caches the detection).
#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx512f") && has!("avx512bw") && has!("avx512vl")
}

/// Whether this machine runs the bf16-operand kernels (checked like [`has_avx512`]).
#[cfg(target_arch = "x86_64")]
fn has_avx512_bf16() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has_avx512() && has!("avx512bf16") && has!("avx512vbmi")
}

impl Isa {
    /// Every build of the kernels this target compiles, best first.
    pub(crate) fn all() -> Vec<Isa> {
        vec![
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2,
            Isa::Scalar,
        ]
    }

    /// The build's name, as reports print it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => "avx512-bf16",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// Whether this machine runs the build; if not, the CPU features it lacks.
    pub(crate) fn runs_here(self) -> Result<(), String> {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let needs: &[(&str, bool)] = match self {
                Isa::Avx512Bf16 => &[
                    ("avx512f", has!("avx512f")),
                    ("avx512bw", has!("avx512bw")),
                    ("avx512vl", has!("avx512vl")),
                    ("avx512bf16", has!("avx512bf16")),
                    ("avx512vbmi", has!("avx512vbmi")),
                ],
                Isa::Avx512 => &[
                    ("avx512f", has!("avx512f")),
                    ("avx512bw", has!("avx512bw")),
                    ("avx512vl", has!("avx512vl")),
                ],
                Isa::Avx2 => &[
                    ("avx2", has!("avx2")),
                    ("fma", has!("fma")),
                    ("f16c", has!("f16c")),
                ],
                Isa::Scalar => &[],
            };
            let missing: Vec<&str> = needs.iter().filter(|n| !n.1).map(|n| n.0).collect();
            if !missing.is_empty() {
                return Err(format!("this machine lacks {}", missing.join(", ")));
            }
        }
        Ok(())
    }

    /// Whether this is one of the AVX-512 builds.
    pub(crate) fn avx512(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx512Bf16 => true,
            _ => false,
        }
    }

    /// Whether rows of `kind` go through the bf16-operand kernels.
    pub(crate) fn bf16_operands(self, kind: RowKind) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => {
                matches!(kind, RowKind::Bf16 | RowKind::Fp8E4m3 | RowKind::Fp8E5m2)
            }
            _ => false,
        }
    }
}

/// Whether this machine runs the AVX2 + FMA builds (checked like [`has_avx512`]).
#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx2") && has!("fma") && has!("f16c")
}

/// Every instruction set this machine can run, best first (tests run each).
#[cfg(test)]
pub(crate) fn available() -> Vec<Isa> {
    Isa::all()
        .into_iter()
        .filter(|i| i.runs_here().is_ok())
        .collect()
}

pub(crate) fn elem(kind: RowKind) -> usize {
    match kind {
        RowKind::F32 => 4,
        RowKind::F16 | RowKind::Bf16 => 2,
        RowKind::Fp8E4m3 | RowKind::Fp8E5m2 | RowKind::I8 => 1,
    }
}

/// Which rows an [`Order`] is for: query rows (read against key rows) or accumulator rows
/// (filled from value rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Key,
    Value,
}

/// How the elements of a block are permuted (see [`Order::pos`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Perm {
    Natural,
    /// Blocks of 32: even elements first, then odd (bf16 and fp8 widened to f32 on AVX-512).
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
                RowKind::Bf16 | RowKind::Fp8E4m3 | RowKind::Fp8E5m2 => (32, Perm::EvenOdd, false),
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
        let (b, t) = (self.block, self.table);
        for (d, s) in dst.chunks_mut(b).zip(src.chunks_exact(b)) {
            for (x, &p) in d.iter_mut().zip(&t[..b]) {
                *x = s[p as usize] * f;
            }
        }
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

/// For fp8 rows on AVX-512: the square root of the power of two the widened values lack
/// (2^60 for e4m3, 2^56 for e5m2). A caller that reads fp8 rows `raw` multiplies the query
/// and the logits by it (keys), or the weights and the final accumulators (values).
pub(crate) fn fp8_fold(isa: Isa, kind: RowKind) -> Option<f32> {
    match (isa, kind) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, RowKind::Fp8E4m3) => Some(f32::from_bits((127 + 60) << 23)),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, RowKind::Fp8E5m2) => Some(f32::from_bits((127 + 56) << 23)),
        _ => None,
    }
}

/// Widens a contiguous row of `kind` into `out` (f32).
pub(crate) fn widen(kind: RowKind, row: &[u8], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    match kind {
        RowKind::F32 => out.copy_from_slice(bytemuck::cast_slice(row)),
        RowKind::F16 => bytemuck::cast_slice::<u8, half::f16>(row).convert_to_f32_slice(out),
        RowKind::Bf16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        RowKind::Fp8E4m3 | RowKind::Fp8E5m2 => {
            let dtype = if kind == RowKind::Fp8E4m3 {
                kvlayout::DType::Fp8E4m3
            } else {
                kvlayout::DType::Fp8E5m2
            };
            let t = crate::elem::fp8_table(dtype);
            for (o, b) in out.iter_mut().zip(row) {
                *o = t[*b as usize];
            }
        }
        RowKind::I8 => {
            for (o, b) in out.iter_mut().zip(row) {
                *o = f32::from(*b as i8);
            }
        }
    }
}

/// `out[j] = sum_d q[j * qs + d] * k[d]` for the `out.len()` query rows.
#[inline(always)]
fn dots_portable(k: &[f32], q: &[f32], qs: usize, out: &mut [f32]) {
    let w = k.len();
    for (j, o) in out.iter_mut().enumerate() {
        let qr = &q[j * qs..j * qs + w];
        let mut acc = [0f32; 16];
        let mut chunks_q = qr.chunks_exact(16);
        let mut chunks_k = k.chunks_exact(16);
        for (a, b) in (&mut chunks_q).zip(&mut chunks_k) {
            for i in 0..16 {
                acc[i] += a[i] * b[i];
            }
        }
        let tail: f32 = chunks_q
            .remainder()
            .iter()
            .zip(chunks_k.remainder())
            .map(|(a, b)| a * b)
            .sum();
        *o = acc.iter().sum::<f32>() + tail;
    }
}

/// `acc[j * s + d] += p[j] * v[d]` for the `p.len()` accumulator rows.
#[inline(always)]
fn axpys_portable(v: &[f32], p: &[f32], acc: &mut [f32], s: usize) {
    let w = v.len();
    for (j, pj) in p.iter().enumerate() {
        for (a, x) in acc[j * s..j * s + w].iter_mut().zip(v) {
            *a += pj * x;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dots_avx2(k: &[f32], q: &[f32], qs: usize, out: &mut [f32]) {
    dots_portable(k, q, qs, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn axpys_avx2(v: &[f32], p: &[f32], acc: &mut [f32], s: usize) {
    axpys_portable(v, p, acc, s)
}

/// The rows of one tile (at most [`TILE`]). Each row is bounds-checked when it is added to
/// hold `span` bytes from its start — the rows of every head a kernel may be asked for (a
/// head's row lies `hoff` bytes further); the kernels then read them through raw pointers.
pub(crate) struct RowSet<'a> {
    ptrs: [*const u8; TILE],
    n: usize,
    span: usize,
    _rows: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> RowSet<'a> {
    /// An empty set of rows spanning `span` bytes each.
    pub(crate) fn new(span: usize) -> Self {
        RowSet {
            ptrs: [std::ptr::null(); TILE],
            n: 0,
            span,
            _rows: std::marker::PhantomData,
        }
    }

    /// Adds the row at byte `off` of `buf` (bounds-checked; panics past `TILE` rows).
    #[inline]
    pub(crate) fn push(&mut self, buf: &'a [u8], off: usize) {
        let row = &buf[off..off + self.span];
        self.ptrs[self.n] = row.as_ptr();
        self.n += 1;
    }

    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// The `len` bytes of row `i` from byte `hoff`.
    fn row(&self, i: usize, hoff: usize, len: usize) -> &'a [u8] {
        assert!(i < self.n && hoff + len <= self.span);
        // SAFETY: `ptrs[i]` starts a `&'a [u8]` of `span` bytes (`push`), and
        // `hoff + len <= span`.
        unsafe { std::slice::from_raw_parts(self.ptrs[i].add(hoff), len) }
    }

    /// Whether every row holds `need` bytes from `hoff` (an empty set holds anything).
    fn holds(&self, hoff: usize, need: usize) -> bool {
        self.n == 0 || hoff + need <= self.span
    }
}

/// An AVX-512 tile kernel. Keys ([`qk_tile`]): kind, raw, rows, prefetched rows, `hoff`,
/// `next_hoff`, width, query rows, their stride, group, logits, their stride. Values
/// ([`pv_tile`]): the same with weights, their stride, group, accumulators, their stride.
#[cfg(target_arch = "x86_64")]
type TileKernel = unsafe fn(
    RowKind,
    bool,
    &[*const u8],
    &[*const u8],
    usize,
    usize,
    usize,
    &[f32],
    usize,
    usize,
    &mut [f32],
    usize,
);

/// The key and value kernels of an AVX-512 build for rows of `kind`, after checking that this
/// machine runs them.
#[cfg(target_arch = "x86_64")]
fn avx512_kernels(isa: Isa, kind: RowKind) -> (TileKernel, TileKernel) {
    if isa.bf16_operands(kind) {
        assert!(
            has_avx512_bf16(),
            "AVX-512 BF16 kernels on a machine without them"
        );
        (avx512bf16::qk_tile, avx512bf16::pv_tile)
    } else {
        assert!(has_avx512(), "AVX-512 kernels on a machine without AVX-512");
        (avx512::qk_tile, avx512::pv_tile)
    }
}

/// Logits of a tile: `logits[j * ld + i] = sum_d q[j * qs + d] * row_i[d]` over the rows of
/// `rows` (at `hoff`) and the `g` query rows, which are in [`Order::of`]`(isa, kind, Key)`
/// (packed bf16 for the bf16-operand kernels) and zero-padded to `qs` slots. With `raw`, fp8 rows are read without their power of two
/// ([`fp8_fold`]). The rows of `next` at `next_hoff` (the rows the caller reads next) are
/// prefetched (into L1) as the rows of this one are read. `scratch` holds `width` f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qk_tile(
    isa: Isa,
    kind: RowKind,
    raw: bool,
    rows: &RowSet<'_>,
    next: &RowSet<'_>,
    hoff: usize,
    next_hoff: usize,
    width: usize,
    q: &[f32],
    qs: usize,
    g: usize,
    logits: &mut [f32],
    ld: usize,
    scratch: &mut [f32],
) {
    let nt = rows.len();
    if nt == 0 || g == 0 {
        return;
    }
    let need = width * elem(kind);
    let padded = Order::of(isa, kind, Role::Key).padded(width);
    assert!(nt <= ld && width > 0 && rows.holds(hoff, need) && next.holds(next_hoff, need));
    assert!(qs >= padded && q.len() >= (g - 1) * qs + padded);
    assert!(logits.len() >= (g - 1) * ld + nt);
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        let kernel = avx512_kernels(isa, kind).0;
        // SAFETY: the kernel's instruction sets detected (`avx512_kernels`); every row holds
        // `width` elements of `kind` from `hoff` (checked by `RowSet::push` and `holds` above);
        // the query rows hold `padded` values (packed bf16 for the bf16-operand kernels) at
        // stride `qs` and the logits `(g - 1) * ld + nt` (asserted above). The rows of `next`
        // are only prefetched.
        return unsafe {
            kernel(
                kind,
                raw,
                &rows.ptrs[..nt],
                &next.ptrs[..next.n],
                hoff,
                next_hoff,
                width,
                q,
                qs,
                g,
                logits,
                ld,
            )
        };
    }
    let _ = raw;
    #[cfg(target_arch = "x86_64")]
    assert!(
        isa != Isa::Avx2 || has_avx2(),
        "AVX2 build on a machine without AVX2"
    );
    let mut out = [0f32; 16];
    for i in 0..nt {
        widen(kind, rows.row(i, hoff, need), &mut scratch[..width]);
        let mut j0 = 0;
        while j0 < g {
            let n = (g - j0).min(16);
            let (k, q) = (&scratch[..width], &q[j0 * qs..]);
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX2 and FMA detected (asserted above).
                Isa::Avx2 => unsafe { dots_avx2(k, q, qs, &mut out[..n]) },
                _ => dots_portable(k, q, qs, &mut out[..n]),
            }
            for (j, o) in out[..n].iter().enumerate() {
                logits[(j0 + j) * ld + i] = *o;
            }
            j0 += n;
        }
    }
}

/// Value accumulation of a tile: `acc[j * s + d] += sum_i w[j * ld + i] * row_i[d]` over the
/// rows of `rows` (at `hoff`) and the `g` accumulator rows, which are in [`Order::of`]`(isa,
/// kind, Value)` and padded to `s`. The bf16-operand kernels round the weights to bf16. `raw`, `next` and `scratch` as in [`qk_tile`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn pv_tile(
    isa: Isa,
    kind: RowKind,
    raw: bool,
    rows: &RowSet<'_>,
    next: &RowSet<'_>,
    hoff: usize,
    next_hoff: usize,
    width: usize,
    w: &[f32],
    ld: usize,
    g: usize,
    acc: &mut [f32],
    s: usize,
    scratch: &mut [f32],
) {
    let nt = rows.len();
    if nt == 0 || g == 0 {
        return;
    }
    let need = width * elem(kind);
    let padded = Order::of(isa, kind, Role::Value).padded(width);
    assert!(nt <= ld && width > 0 && rows.holds(hoff, need) && next.holds(next_hoff, need));
    assert!(s >= padded && acc.len() >= (g - 1) * s + padded);
    assert!(w.len() >= (g - 1) * ld + nt);
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        let kernel = avx512_kernels(isa, kind).1;
        // SAFETY: the kernel's instruction sets detected (`avx512_kernels`); every row holds
        // `width` elements of `kind` from `hoff` (checked by `RowSet::push` and `holds` above);
        // the accumulator rows hold `padded` values at stride `s` and the weights
        // `(g - 1) * ld + nt` (asserted above). The rows of `next` are only prefetched.
        return unsafe {
            kernel(
                kind,
                raw,
                &rows.ptrs[..nt],
                &next.ptrs[..next.n],
                hoff,
                next_hoff,
                width,
                w,
                ld,
                g,
                acc,
                s,
            )
        };
    }
    let _ = raw;
    #[cfg(target_arch = "x86_64")]
    assert!(
        isa != Isa::Avx2 || has_avx2(),
        "AVX2 build on a machine without AVX2"
    );
    let mut p = [0f32; 16];
    for i in 0..nt {
        widen(kind, rows.row(i, hoff, need), &mut scratch[..width]);
        let mut j0 = 0;
        while j0 < g {
            let n = (g - j0).min(16);
            for (j, x) in p[..n].iter_mut().enumerate() {
                *x = w[(j0 + j) * ld + i];
            }
            let acc = &mut acc[j0 * s..];
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX2 and FMA detected (asserted above).
                Isa::Avx2 => unsafe { axpys_avx2(&scratch[..width], &p[..n], acc, s) },
                _ => axpys_portable(&scratch[..width], &p[..n], acc, s),
            }
            j0 += n;
        }
    }
}

/// Partial sums kept per head by [`softmax_tile`]: a head's running sum is the sum of its
/// `SUM_LANES` partial sums (the AVX-512 step adds its weights lane by lane, so a step needs
/// no horizontal sum; the portable step uses the first lane only).
pub(crate) const SUM_LANES: usize = 16;

/// One online-softmax step over a tile, for each of the `g` heads: row `j` of `logits`
/// (`nt` values at `j * ld`) becomes the weights `exp(l - m)` where `m` is the running maximum
/// `maxes[j]`, first raised to the tile's maximum when a logit exceeds it (then the partial
/// sums `sums[j * SUM_LANES ..][..SUM_LANES]` and the accumulator row `acc[j * s ..][..s]`
/// are rescaled to it); the partial sums then gain the tile's weights. The stored weights of
/// token `i` are then multiplied by `wscale` and `vscale[i]` (not counted in the sum). With
/// `round`, each weight is rounded to bf16 before it is summed, so that a value kernel with
/// bf16 operands multiplies by exactly the weights the sum counts.
#[allow(clippy::too_many_arguments)]
pub(crate) fn softmax_tile(
    isa: Isa,
    round: bool,
    nt: usize,
    g: usize,
    logits: &mut [f32],
    ld: usize,
    wscale: f32,
    vscale: Option<&[f32]>,
    maxes: &mut [f32],
    sums: &mut [f32],
    acc: &mut [f32],
    s: usize,
) {
    assert!(nt >= 1 && nt <= ld);
    assert!(logits.len() >= (g - 1) * ld + nt && maxes.len() >= g);
    assert!(sums.len() >= g * SUM_LANES && acc.len() >= g * s);
    if let Some(v) = vscale {
        assert!(v.len() >= nt);
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        assert!(has_avx512(), "AVX-512 kernels on a machine without AVX-512");
        // SAFETY: AVX-512 F/BW/VL detected and lengths asserted above.
        return unsafe {
            avx512::softmax_tile(
                round, nt, g, logits, ld, wscale, vscale, maxes, sums, acc, s,
            )
        };
    }
    for j in 0..g {
        let l = &mut logits[j * ld..j * ld + nt];
        let tile_max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = maxes[j].max(tile_max);
        let sum = &mut sums[j * SUM_LANES];
        if m > maxes[j] {
            let c = (maxes[j] - m).exp();
            *sum *= c;
            for x in &mut acc[j * s..(j + 1) * s] {
                *x *= c;
            }
            maxes[j] = m;
        }
        for (i, x) in l.iter_mut().enumerate() {
            *x = (*x - m).exp();
            if round {
                *x = half::bf16::from_f32(*x).to_f32();
            }
            *sum += *x;
            *x *= wscale * vscale.map_or(1.0, |v| v[i]);
        }
    }
}

/// Where the decode kernels prefetch the rows of a later (tile, head) step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefetchLevel {
    /// `prefetcht0`. On the AMD Zen cores measured, `prefetcht1` left the decode waiting on
    /// memory as if there were no prefetch (bf16 HND: 20 against 35 GB/s).
    L1,
    /// `prefetcht1`. On the Intel Xeon cores measured, a line prefetched into L1 holds one of
    /// the few L1 fill buffers until it arrives from memory, which caps the requests in
    /// flight: `prefetcht1` read head-major caches faster (f32 0.77 -> 0.87 of the read
    /// bound, bf16 0.64 -> 0.69) and token-major ones as fast.
    L2,
}

/// The prefetch level for a CPU vendor (the 12 bytes of CPUID leaf 0): Intel's cores take
/// [`PrefetchLevel::L2`], every other (AMD's) [`PrefetchLevel::L1`].
pub(crate) fn prefetch_level_for(vendor: &[u8; 12]) -> PrefetchLevel {
    if vendor == b"GenuineIntel" {
        PrefetchLevel::L2
    } else {
        PrefetchLevel::L1
    }
}

/// Prefetches the line holding `p` to this machine's [`PrefetchLevel`]: a hint, which never
/// faults and reads nothing into the program (a no-op off x86_64).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let p = p as *const i8;
        // SAFETY (on toolchains where `_mm_prefetch` is unsafe): a prefetch never faults,
        // whatever the address, and SSE is part of x86_64.
        #[allow(unused_unsafe)]
        unsafe {
            match prefetch_level() {
                PrefetchLevel::L1 => _mm_prefetch::<_MM_HINT_T0>(p),
                PrefetchLevel::L2 => _mm_prefetch::<_MM_HINT_T1>(p),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// This machine's prefetch level (detected once; `L1` off x86_64, where nothing prefetches).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn prefetch_level() -> PrefetchLevel {
    PrefetchLevel::L1
}

/// This machine's prefetch level (detected once).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn prefetch_level() -> PrefetchLevel {
    static LEVEL: std::sync::OnceLock<PrefetchLevel> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        // SAFETY (on toolchains where `__cpuid` is unsafe): leaf 0 exists on every x86_64.
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&r.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&r.edx.to_le_bytes());
        vendor[8..].copy_from_slice(&r.ecx.to_le_bytes());
        prefetch_level_for(&vendor)
    })
}

#[cfg(target_arch = "x86_64")]
mod avx512bf16;

// Register-blocked loops index several arrays (rows, heads, vectors) by the same counter.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod avx512 {
    use super::RowKind;
    use std::arch::x86_64::*;

    /// Row kinds as const parameters. fp8 `*_RAW`: the bits only (see `load`).
    const F32: u8 = 0;
    const F16: u8 = 1;
    const BF16: u8 = 2;
    const E4M3: u8 = 3;
    const E5M2: u8 = 4;
    const I8: u8 = 5;
    const E4M3_RAW: u8 = 6;
    const E5M2_RAW: u8 = 7;

    /// Calls `$f::<K, ...>` with the const code of `$kind` (`$raw`: fp8 without its power of
    /// two), so each row kind gets its own loops.
    macro_rules! by_kind {
        ($kind:expr, $raw:expr, $f:ident :: <$($c:tt),*> ( $($arg:expr),* )) => {
            match ($kind, $raw) {
                (RowKind::F32, _) => $f::<F32, $($c),*>($($arg),*),
                (RowKind::F16, _) => $f::<F16, $($c),*>($($arg),*),
                (RowKind::Bf16, _) => $f::<BF16, $($c),*>($($arg),*),
                (RowKind::Fp8E4m3, false) => $f::<E4M3, $($c),*>($($arg),*),
                (RowKind::Fp8E4m3, true) => $f::<E4M3_RAW, $($c),*>($($arg),*),
                (RowKind::Fp8E5m2, false) => $f::<E5M2, $($c),*>($($arg),*),
                (RowKind::Fp8E5m2, true) => $f::<E5M2_RAW, $($c),*>($($arg),*),
                (RowKind::I8, _) => $f::<I8, $($c),*>($($arg),*),
            }
        };
    }

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
            BF16 | E4M3 | E4M3_RAW | E5M2 | E5M2_RAW => 32,
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
    /// for bf16 and fp8 (the 16 even elements, then the 16 odd ones). Lanes past `n` are zero
    /// and their bytes are not read.
    ///
    /// fp8: the 7 magnitude bits go to f32 bits 26..20 (e4m3) / 27..21 (e5m2) and the sign to
    /// bit 31 (one shift and one mask per vector), which is the value times 2^-120 / 2^-112
    /// for normal and subnormal numbers alike (an fp8 subnormal lands on an f32 subnormal);
    /// the plain kinds multiply it back (exact), the `_RAW` kinds leave that to the caller.
    ///
    /// `FULL`: the whole block (`n` is the block size), read without masks.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL present; the first `n` elements of the block lie inside the row.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load<const K: u8, const FULL: bool>(
        row: *const u8,
        b: usize,
        n: usize,
    ) -> [__m512; 2] {
        let z = _mm512_setzero_ps();
        let p = row.wrapping_add(b * block(K) * esize(K));
        // SAFETY: the caller keeps the first `n` elements of the block inside the row; the
        // masks select exactly those (all of the block when `FULL`), and masked-off lanes are
        // not read (masked loads suppress faults).
        unsafe {
            match K {
                F32 if FULL => [_mm512_loadu_ps(p as *const f32), z],
                F32 => [_mm512_maskz_loadu_ps(mask(n), p as *const f32), z],
                F16 if FULL => [_mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)), z],
                F16 => [
                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p as *const i16)),
                    z,
                ],
                BF16 => {
                    let x = if FULL {
                        _mm512_loadu_si512(p as *const __m512i)
                    } else {
                        _mm512_maskz_loadu_epi16(mask32(n), p as *const i16)
                    };
                    let even = _mm512_slli_epi32::<16>(x);
                    let odd = _mm512_and_si512(x, _mm512_set1_epi32(0xFFFF_0000u32 as i32));
                    [_mm512_castsi512_ps(even), _mm512_castsi512_ps(odd)]
                }
                E4M3 | E4M3_RAW | E5M2 | E5M2_RAW => {
                    // 32 bytes sign-extended to words: dword i holds element 2i in its low
                    // half and 2i + 1 in its high half, each with the sign above its byte.
                    let x = if FULL {
                        _mm512_cvtepi8_epi16(_mm256_loadu_si256(p as *const __m256i))
                    } else {
                        _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask32(n), p as *const i8))
                    };
                    let e4 = K == E4M3 || K == E4M3_RAW;
                    let m = _mm512_set1_epi32(if e4 { 0x87F0_0000u32 } else { 0x8FE0_0000 } as i32);
                    let (even, odd) = if e4 {
                        (_mm512_slli_epi32::<20>(x), _mm512_slli_epi32::<4>(x))
                    } else {
                        (_mm512_slli_epi32::<21>(x), _mm512_slli_epi32::<5>(x))
                    };
                    let v = [
                        _mm512_castsi512_ps(_mm512_and_si512(even, m)),
                        _mm512_castsi512_ps(_mm512_and_si512(odd, m)),
                    ];
                    let scale = match K {
                        E4M3 => f32::from_bits((127 + 120) << 23),
                        E5M2 => f32::from_bits((127 + 112) << 23),
                        _ => return v,
                    };
                    let s = _mm512_set1_ps(scale);
                    [_mm512_mul_ps(v[0], s), _mm512_mul_ps(v[1], s)]
                }
                _ => {
                    let b = if FULL {
                        _mm_loadu_si128(p as *const __m128i)
                    } else {
                        _mm_maskz_loadu_epi8(mask(n), p as *const i8)
                    };
                    [_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), z]
                }
            }
        }
    }

    /// Prefetches the line of `row` holding byte `at`, when `at` starts a line, to the level
    /// [`super::prefetch_level`] picks for this machine.
    #[inline(always)]
    pub(super) fn prefetch_line(row: *const u8, at: usize) {
        if at.is_multiple_of(64) {
            // The address stays inside the (checked) row the pointer came from.
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
                1 => by_kind!(kind, raw, qk_k::<16, 1>(a)),
                2 => by_kind!(kind, raw, qk_k::<8, 2>(a)),
                _ => by_kind!(kind, raw, qk_k::<4, 4>(a)),
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
    /// dropped. While the first heads of a row block are computed, the same rows of `pf` are
    /// prefetched.
    ///
    /// # Safety
    /// As [`qk_tile`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn qk_k<const K: u8, const R: usize, const H: usize>(a: QkArgs<'_>) {
        let (rows, pf, hoff, pf_hoff, width, q, qs, g, logits, ld) = a;
        let nt = rows.len();
        let bw = block(K);
        let nv = bw / 16;
        let nb = width.div_ceil(bw);
        let mut i0 = 0;
        while i0 < nt {
            let rp: [*const u8; R] =
                std::array::from_fn(|r| rows[(i0 + r).min(nt - 1)].wrapping_add(hoff));
            // Rows of the next tile to prefetch with this block (none past its end).
            let npf = pf.len().saturating_sub(i0).min(R);
            let mut j0 = 0;
            while j0 < g {
                let npf = if j0 == 0 { npf } else { 0 };
                // SAFETY (whole block): query rows `min(j0 + h, g - 1)` hold `nb * bw` values
                // at stride `qs`; rows `rp` hold `width` elements and `load` reads only the
                // first `width - b * bw` of the last block (caller's contract).
                let sums = unsafe {
                    let qp: [*const f32; H] =
                        std::array::from_fn(|h| q.as_ptr().add((j0 + h).min(g - 1) * qs));
                    let mut acc = [_mm512_setzero_ps(); 16];
                    for b in 0..nb {
                        let n = (width - b * bw).min(bw);
                        let qv: [[__m512; 2]; H] = std::array::from_fn(|h| {
                            std::array::from_fn(|v| {
                                if v < nv {
                                    _mm512_loadu_ps(qp[h].add(b * bw + v * 16))
                                } else {
                                    _mm512_setzero_ps()
                                }
                            })
                        });
                        for r in 0..R {
                            if r < npf {
                                prefetch_line(pf[i0 + r].wrapping_add(pf_hoff), b * bw * esize(K));
                            }
                            let x = if n == bw {
                                load::<K, true>(rp[r], b, n)
                            } else {
                                load::<K, false>(rp[r], b, n)
                            };
                            for v in 0..nv {
                                for h in 0..H {
                                    // Accumulator of (h, r) so that the reduction puts head
                                    // h's rows in lanes h * R .. h * R + R.
                                    let l = h * R + r;
                                    let a = l % 4 * 4 + l / 4;
                                    acc[a] = _mm512_fmadd_ps(qv[h][v], x[v], acc[a]);
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
    pub(super) fn pv_passes(
        g: usize,
        vecs: usize,
        mut pass: impl FnMut(usize, usize, usize, usize),
    ) {
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
        let valid: [usize; C] =
            std::array::from_fn(|bb| width.saturating_sub((b0 + bb) * bw).min(bw));
        let nblk = C / nv;
        // Accumulator rows are padded to whole blocks: vectors past the row's padded width
        // (when the pass overruns it) are neither loaded nor stored.
        let live: [bool; C] = std::array::from_fn(|c| (c0 + c) * 16 < s && valid[c / nv] > 0);
        let ap = acc.as_mut_ptr();
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
            for (i, &row) in rows.iter().enumerate() {
                let row = row.wrapping_add(hoff);
                if i < pf.len() {
                    for bb in 0..nblk {
                        if valid[bb] > 0 {
                            prefetch_line(pf[i].wrapping_add(pf_hoff), (b0 + bb) * bw * esize(K));
                        }
                    }
                }
                let wv: [__m512; H] = std::array::from_fn(|h| _mm512_set1_ps(w[(j0 + h) * ld + i]));
                for bb in 0..nblk {
                    let x = if valid[bb] == bw {
                        load::<K, true>(row, b0 + bb, bw)
                    } else {
                        load::<K, false>(row, b0 + bb, valid[bb])
                    };
                    for v in 0..nv {
                        for h in 0..H {
                            let c = bb * nv + v;
                            a[h][c] = _mm512_fmadd_ps(wv[h], x[v], a[h][c]);
                        }
                    }
                }
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

    /// [`super::softmax_tile`]. Once the running maximum of a head has settled, a step needs no
    /// horizontal reduction: one comparison shows that no logit exceeds it (only then is the
    /// tile's maximum reduced and the state rescaled), and the weights are summed lane by lane
    /// into the head's partial sums.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL present; the lengths of [`super::softmax_tile`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn softmax_tile(
        round: bool,
        nt: usize,
        g: usize,
        logits: &mut [f32],
        ld: usize,
        wscale: f32,
        vscale: Option<&[f32]>,
        maxes: &mut [f32],
        sums: &mut [f32],
        acc: &mut [f32],
        s: usize,
    ) {
        let nv = nt.div_ceil(16);
        let scale = wscale != 1.0 || vscale.is_some();
        for j in 0..g {
            let l = &mut logits[j * ld..j * ld + nt];
            let sp = sums[j * super::SUM_LANES..(j + 1) * super::SUM_LANES].as_mut_ptr();
            // SAFETY (whole block): the masked lanes stay inside `l` (and `vscale`, `nt`
            // long); the partial sums of head `j` are `SUM_LANES` = 16 floats.
            unsafe {
                let mut sum = _mm512_loadu_ps(sp);
                let old = _mm512_set1_ps(maxes[j]);
                let mut above = 0;
                for v in 0..nv {
                    let x = _mm512_maskz_loadu_ps(mask(nt - v * 16), l[v * 16..].as_ptr());
                    above |= _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(mask(nt - v * 16), x, old);
                }
                if above != 0 {
                    let mut m = old;
                    for v in 0..nv {
                        let x = _mm512_mask_loadu_ps(m, mask(nt - v * 16), l[v * 16..].as_ptr());
                        m = _mm512_max_ps(m, x);
                    }
                    let m = _mm512_reduce_max_ps(m);
                    let c = (maxes[j] - m).exp();
                    sum = _mm512_mul_ps(sum, _mm512_set1_ps(c));
                    for x in &mut acc[j * s..(j + 1) * s] {
                        *x *= c;
                    }
                    maxes[j] = m;
                }
                let m = _mm512_set1_ps(maxes[j]);
                for v in 0..nv {
                    let k = mask(nt - v * 16);
                    let p = l[v * 16..].as_mut_ptr();
                    let mut r = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p), m));
                    if round {
                        r = round_bf16(r);
                    }
                    sum = _mm512_mask_add_ps(sum, k, sum, r);
                    if scale {
                        r = _mm512_mul_ps(r, _mm512_set1_ps(wscale));
                        if let Some(vs) = vscale {
                            r = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(k, vs[v * 16..].as_ptr()));
                        }
                    }
                    _mm512_mask_storeu_ps(p, k, r);
                }
                _mm512_storeu_ps(sp, sum);
            }
        }
    }

    /// `x` rounded to the nearest bf16 (ties to even), as f32; `x` finite.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn round_bf16(x: __m512) -> __m512 {
        let b = _mm512_castps_si512(x);
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
        let r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb);
        _mm512_castsi512_ps(_mm512_and_si512(
            r,
            _mm512_set1_epi32(0xFFFF_0000u32 as i32),
        ))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn exp(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
        let t = _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(std::f32::consts::LN_2));
        // e^f for |f| <= ln2 / 2, Taylor to degree 6.
        let mut y = _mm512_set1_ps(1.0 / 720.0);
        y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0 / 120.0));
        y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0 / 24.0));
        y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0 / 6.0));
        y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.5));
        y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0));
        y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0));
        _mm512_scalef_ps(y, n)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_level_by_vendor() {
        assert_eq!(prefetch_level_for(b"GenuineIntel"), PrefetchLevel::L2);
        assert_eq!(prefetch_level_for(b"AuthenticAMD"), PrefetchLevel::L1);
        assert_eq!(prefetch_level_for(b"HygonGenuine"), PrefetchLevel::L1);
        #[cfg(target_arch = "x86_64")]
        println!("this machine: {:?}", prefetch_level());
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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn hsum16_lane_order() {
        if detect() != Isa::Avx512 {
            return;
        }
        let v: [[f32; 16]; 16] =
            std::array::from_fn(|a| std::array::from_fn(|l| (a * 100 + l) as f32));
        // SAFETY: AVX-512 detected.
        let s = unsafe { avx512::hsum16_lanes(v) };
        for a in 0..16 {
            let want: f32 = v[a].iter().sum();
            assert_eq!(s[4 * (a % 4) + a / 4], want, "accumulator {a}");
        }
    }

    /// Every finite bit pattern of each kind (two-byte kinds: a spread of them) widened by
    /// each build's kernels equals the element decoder, raw fp8 included (bf16 subnormals:
    /// zero in the bf16-operand kernels); and the value kernel puts each element where the
    /// kernel order says.
    #[test]
    fn widening_matches_the_element_decoder() {
        use kvlayout::DType;
        for (kind, dtype) in [
            (RowKind::Fp8E4m3, DType::Fp8E4m3),
            (RowKind::Fp8E5m2, DType::Fp8E5m2),
            (RowKind::I8, DType::Int8),
            (RowKind::Bf16, DType::Bf16),
            (RowKind::F16, DType::F16),
            (RowKind::F32, DType::F32),
        ] {
            let e = elem(kind);
            let bytes: Vec<u8> = (0..=u16::MAX)
                .step_by(if e == 1 { 257 } else { 61 })
                .flat_map(|x| {
                    let b = (u32::from(x) * 0x0001_0001).to_le_bytes();
                    b[..e].to_vec()
                })
                .collect::<Vec<_>>()
                .chunks_exact(e)
                .filter(|b| crate::elem::decode(dtype, b).is_finite())
                .flatten()
                .copied()
                .collect();
            let width = bytes.len() / e;
            let want: Vec<f32> = bytes
                .chunks_exact(e)
                .map(|b| crate::elem::decode(dtype, b))
                .collect();
            let mut rows = RowSet::new(bytes.len());
            rows.push(&bytes, 0);
            let none = RowSet::new(0);
            for isa in available() {
                let (order, vorder) = (
                    Order::of(isa, kind, Role::Key),
                    Order::of(isa, kind, Role::Value),
                );
                let pw = order.padded(width).max(vorder.padded(width));
                // `vdpbf16ps` reads bf16 subnormals (below 2^-126) as zero; every fp8 value
                // is a normal bf16.
                let want: Vec<f32> = want
                    .iter()
                    .map(|x| {
                        if isa.bf16_operands(kind) && x.abs() < f32::MIN_POSITIVE {
                            0.0
                        } else {
                            *x
                        }
                    })
                    .collect();
                let mut scratch = vec![0f32; width];
                for raw in [false, true] {
                    let f = match (raw, fp8_fold(isa, kind)) {
                        (true, Some(f)) => f * f,
                        (true, None) => continue,
                        (false, _) => 1.0,
                    };
                    // Keys: one query row per probed element picks that element alone.
                    for i in (0..width).step_by(7) {
                        let mut q = vec![0f32; width];
                        q[i] = 1.0;
                        let mut qk = vec![0f32; pw];
                        order.arrange(&q, &mut qk);
                        let mut out = [0f32; 1];
                        qk_tile(
                            isa,
                            kind,
                            raw,
                            &rows,
                            &none,
                            0,
                            0,
                            width,
                            &qk,
                            pw,
                            1,
                            &mut out,
                            1,
                            &mut scratch,
                        );
                        assert_eq!(out[0] * f, want[i], "{kind:?} element {i} on {isa:?}");
                    }
                    // Values: weight 1 on one row.
                    let mut acc = vec![0f32; pw];
                    pv_tile(
                        isa,
                        kind,
                        raw,
                        &rows,
                        &none,
                        0,
                        0,
                        width,
                        &[1.0],
                        1,
                        1,
                        &mut acc,
                        pw,
                        &mut scratch,
                    );
                    let mut got = vec![0f32; width];
                    vorder.restore(&acc, f, &mut got);
                    assert_eq!(got, want, "{kind:?} values on {isa:?} raw {raw}");
                }
            }
        }
    }
}
