//! Kernels of the decode, on contiguous rows stored as f32, f16, bf16, fp8 (e4m3, e5m2) or
//! int8 bytes: read in place, or copied into contiguous rows first when the layout's rows are
//! not contiguous.
//!
//! Per tile of up to [`TILE`] rows of one KV head: [`qk_tile`] computes the logits of every
//! row against the whole GQA group of query rows, [`softmax_tile`] is the online-softmax step,
//! [`pv_tile`] accumulates the value rows into the group's accumulators. Three builds of the
//! same contract, chosen once per call at run time (four with the bf16-operand kernels of
//! `avx512bf16`, on AVX-512 with BF16 and VBMI):
//!
//! - AVX-512 F/BW/VL (`avx512`): rows are widened in registers, once per row for all heads
//!   of the group. `qk` works on blocks of rows x heads sharing 16 accumulators (one transposed reduction per
//!   block); `pv` holds the accumulators of up to 4 heads x 64 elements in registers across
//!   all rows of the tile. f16 widens by `vcvtph2ps`; bf16 by a shift (even elements) and a
//!   mask (odd elements) of one 512-bit load, so query rows and accumulators are kept in an
//!   even/odd order within blocks of 32 ([`Order`]); fp8 (blocks of 32, natural order) widens
//!   32 bytes to words holding each element's f16 (e4m3: its value times 2^-8, exactly,
//!   subnormals included; e5m2: itself), then by `vcvtph2ps`, so no f32 subnormal reaches an
//!   FMA; e4m3's 2^-8 is either multiplied back or folded by the caller into the query, the
//!   logits and the weights ([`fp8_fold`]); int8 by `vcvtdq2ps`.
//! - AVX2 + FMA + F16C (`avx2`): rows of every kind read in place and widened in registers
//!   eight elements at a time (fp8 through f16, as above), logits in blocks of 4 rows x 2
//!   heads with one transposed reduction, values of up to 4 heads x 16 elements held in
//!   registers across the tile, softmax weights eight at a time; natural order, unpadded.
//!   (It replaced a row-by-row widening into scratch with portable loops: 1.8-2.2x faster.)
//! - scalar: each row widened into a scratch row, then portable loops.
//!
//! The legacy vLLM layout is read in place on AVX-512 and AVX2: x-split keys (16-byte pieces
//! of a row `chunk` bytes apart) by [`qk_tile_split`], the logits kernels with each block
//! assembled from its pieces; transposed values (a block's tokens side by side per element
//! index) by [`pv_transposed`], which keeps one token per lane and reduces once per tile.
//! The scalar build copies them into rows first.
//!
//! Rows come in a [`RowSet`]: each row is bounds-checked against its buffer when it is added
//! (for every head the kernels may read), then read through raw pointers with unaligned,
//! width-masked loads. `order` holds the element orders of query and accumulator rows,
//! `prefetch` the cache level rows are prefetched to on this machine.

/// Tokens per online-softmax tile (the leading dimension of the logits and weights).
pub(crate) const TILE: usize = 64;

/// The rows `i0 .. i0 + R` of a tile's logits kernel at `hoff` (a row past the tile repeats
/// its last; `rows` is not empty), and the matching rows of `pf` at `pf_hoff`, whose lines the
/// kernel prefetches as it reads (a row past the end of `pf` gives its own row, whose lines
/// are cached). Whole blocks take neither clamp.
#[inline(always)]
pub(crate) fn row_block<const R: usize>(
    rows: &[*const u8],
    pf: &[*const u8],
    i0: usize,
    hoff: usize,
    pf_hoff: usize,
) -> ([*const u8; R], [*const u8; R]) {
    let nt = rows.len();
    let rp: [*const u8; R] = if i0 + R <= nt {
        std::array::from_fn(|r| rows[i0 + r].wrapping_add(hoff))
    } else {
        std::array::from_fn(|r| rows[(i0 + r).min(nt - 1)].wrapping_add(hoff))
    };
    let pfp = if i0 + R <= pf.len() {
        std::array::from_fn(|r| pf[i0 + r].wrapping_add(pf_hoff))
    } else {
        std::array::from_fn(|r| pf.get(i0 + r).map_or(rp[r], |p| p.wrapping_add(pf_hoff)))
    };
    (rp, pfp)
}

/// Softmax weights `e^x` (`x` a logit minus the running maximum) below `e^WEIGHT_FLOOR` are
/// taken as zero, and so is the factor that rescales a state to a maximum this much higher.
/// Their share of a sum that holds the maximum's weight of 1 is below 2^-92, far under what an
/// f32 resolves (2^-24); kept, such a weight times a value is an f32 subnormal, and an FMA
/// with a subnormal input or result takes a microcode assist on Intel cores: a decode whose
/// logits spread over hundreds ran 2.7x (spread ~500) to 17x slower.
pub(crate) const WEIGHT_FLOOR: f32 = -64.0;

/// `e^x` as a softmax weight: zero below [`WEIGHT_FLOOR`].
pub(crate) fn weight(x: f32) -> f32 {
    if x >= WEIGHT_FLOOR {
        x.exp()
    } else {
        0.0
    }
}

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

pub(crate) fn elem(kind: RowKind) -> usize {
    match kind {
        RowKind::F32 => 4,
        RowKind::F16 | RowKind::Bf16 => 2,
        RowKind::Fp8E4m3 | RowKind::Fp8E5m2 | RowKind::I8 => 1,
    }
}

/// For fp8 rows on AVX-512 and AVX2: the square root of the power of two the widened values
/// lack (2^4 for e4m3, widened as its value times 2^-8; e5m2 lacks none). A caller that reads
/// fp8 rows `raw` multiplies the query and the logits by it (keys), or the weights and the
/// final accumulators (values).
pub(crate) fn fp8_fold(isa: Isa, kind: RowKind) -> Option<f32> {
    match (isa, kind) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512 | Isa::Avx2, RowKind::Fp8E4m3) => Some(16.0),
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

/// The arguments of the AVX2 and AVX-512 transposed-value kernels after their kind: `buf`,
/// `runs`, `pf`, `dim`, `width`, `w`, `ld`, `g`, `out`, `ow` (see [`pv_transposed`]).
#[cfg(target_arch = "x86_64")]
type TransposedArgs<'a> = (
    *const u8,
    &'a [(usize, usize, usize)],
    &'a [(usize, usize, usize)],
    usize,
    usize,
    &'a [f32],
    usize,
    usize,
    &'a mut [f32],
    usize,
);

/// Whether [`pv_transposed`] reads transposed value rows in place on `isa` (on AVX-512 and
/// AVX2, of every kind; the scalar build copies them into rows first).
pub(crate) fn reads_transposed(isa: Isa) -> bool {
    isa != Isa::Scalar
}

/// The values of a tile whose rows are transposed, read in place: run `(off, i0, n)` holds,
/// for each element index `d < width`, tokens `i0 .. i0 + n` of the tile side by side at
/// `buf[off + d * dim ..]` (`n <= 16`). `out[j * ow + d] +=` the sum over the runs' tokens
/// of `w[j * ld + i0 + t]` times element `d` of token `i0 + t`, for the `g` heads, in natural
/// order (`ow >= width`). `raw`: fp8 values without their power of two ([`fp8_fold`]). The
/// runs of `pf` (the step read later) are prefetched, each along the run of `runs` at its
/// index. Only where [`reads_transposed`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn pv_transposed(
    isa: Isa,
    kind: RowKind,
    raw: bool,
    buf: &[u8],
    runs: &[(usize, usize, usize)],
    pf: &[(usize, usize, usize)],
    dim: usize,
    width: usize,
    w: &[f32],
    ld: usize,
    g: usize,
    out: &mut [f32],
    ow: usize,
) {
    assert!(
        reads_transposed(isa),
        "transposed values are not read in place on {isa:?}"
    );
    if g == 0 || width == 0 {
        return;
    }
    let e = elem(kind);
    for &(off, i0, n) in runs {
        assert!(n <= 16 && off + (width - 1) * dim + n * e <= buf.len());
        assert!(i0 + n <= ld && (g - 1) * ld + i0 + n <= w.len());
    }
    assert!(ow >= width && out.len() >= (g - 1) * ow + width);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = raw;
    #[cfg(target_arch = "x86_64")]
    {
        let kernel = if isa.avx512() {
            assert!(has_avx512(), "AVX-512 kernels on a machine without AVX-512");
            avx512::pv_transposed
        } else {
            assert!(has_avx2(), "AVX2 build on a machine without AVX2");
            avx2::pv_transposed
        };
        // SAFETY: the kernel's instruction sets detected just above; every run's bytes, the
        // weights and the outputs are inside their slices (asserted above); `pf` is only
        // prefetched.
        unsafe {
            kernel(
                kind,
                raw,
                buf.as_ptr(),
                runs,
                pf,
                dim,
                width,
                w,
                ld,
                g,
                out,
                ow,
            )
        }
    }
}

/// Bytes of a piece of an x-split row (the legacy vLLM key: `x` elements of 16 bytes).
pub(crate) const SPLIT_PIECE: usize = 16;

/// Whether [`qk_tile_split`] reads x-split key rows in place on `isa` (on AVX-512 and AVX2;
/// the scalar build copies them into rows first).
pub(crate) fn reads_split(isa: Isa) -> bool {
    isa != Isa::Scalar
}

/// The order of the query rows [`qk_tile_split`] takes on `isa`: the plain AVX-512 kernels'
/// (the bf16-operand build reads split keys with them too).
pub(crate) fn split_key_order(isa: Isa, kind: RowKind) -> Order {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        return Order::of(Isa::Avx512, kind, Role::Key);
    }
    Order::of(isa, kind, Role::Key)
}

/// [`qk_tile`] on key rows split into pieces of [`SPLIT_PIECE`] bytes `chunk` bytes apart
/// (the legacy vLLM key `[blocks, heads, head / x, block, x]`: element `d` of a row at
/// `(d / x) * chunk + (d % x) * elem`), read in place; `width` a multiple of `x`; query rows
/// in [`split_key_order`]. The rows of `next` at `next_hoff` (split alike) are prefetched as
/// the rows of this one are read. Only where [`reads_split`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn qk_tile_split(
    isa: Isa,
    kind: RowKind,
    raw: bool,
    rows: &RowSet<'_>,
    next: &RowSet<'_>,
    hoff: usize,
    next_hoff: usize,
    width: usize,
    chunk: usize,
    q: &[f32],
    qs: usize,
    g: usize,
    logits: &mut [f32],
    ld: usize,
) {
    assert!(
        reads_split(isa),
        "split keys are not read in place on {isa:?}"
    );
    let nt = rows.len();
    if nt == 0 || g == 0 {
        return;
    }
    let x = SPLIT_PIECE / elem(kind);
    assert!(width > 0 && width.is_multiple_of(x) && chunk >= SPLIT_PIECE);
    let need = (width / x - 1) * chunk + SPLIT_PIECE;
    let padded = split_key_order(isa, kind).padded(width);
    assert!(nt <= ld && rows.holds(hoff, need) && next.holds(next_hoff, need));
    assert!(qs >= padded && q.len() >= (g - 1) * qs + padded);
    assert!(logits.len() >= (g - 1) * ld + nt);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (raw, q, logits);
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        assert!(has_avx512(), "AVX-512 kernels on a machine without AVX-512");
        // SAFETY: AVX-512 F/BW/VL detected just above; every row holds its pieces from
        // `hoff` (`need` bytes, checked by `RowSet::push` and `holds` above); the query rows
        // hold `padded` values at stride `qs` and the logits `(g - 1) * ld + nt` (asserted
        // above). The rows of `next` are only prefetched.
        unsafe {
            avx512::qk_tile_split(
                kind,
                raw,
                &rows.ptrs[..nt],
                &next.ptrs[..next.n],
                hoff,
                next_hoff,
                width,
                chunk,
                q,
                qs,
                g,
                logits,
                ld,
            )
        }
    } else {
        assert!(has_avx2(), "AVX2 build on a machine without AVX2");
        // SAFETY: AVX2, FMA and F16C detected just above; the rest as above.
        unsafe {
            avx2::qk_split(
                kind,
                raw,
                &rows.ptrs[..nt],
                (&next.ptrs[..next.n], next_hoff),
                hoff,
                width,
                chunk,
                q,
                qs,
                g,
                logits,
                ld,
            )
        }
    }
}

/// Logits of a tile: `logits[j * ld + i] = sum_d q[j * qs + d] * row_i[d]` over the rows of
/// `rows` (at `hoff`) and the `g` query rows, which are in [`Order::of`]`(isa, kind, Key)`
/// (packed bf16 for the bf16-operand kernels) and zero-padded to `qs` slots. With `raw`, fp8
/// rows are read without their power of two ([`fp8_fold`]). The rows of `next` at `next_hoff`
/// (the rows the caller reads next) are prefetched (to [`prefetch_level`]) as the rows of this
/// one are read. `scratch` holds `width` f32.
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
    if isa == Isa::Avx2 {
        assert!(has_avx2(), "AVX2 build on a machine without AVX2");
        // SAFETY: AVX2, FMA and F16C detected just above; every row holds `width` elements
        // of `kind` from `hoff` (checked by `RowSet::push` and `holds` above); the query rows
        // hold `width` values at stride `qs >= width` and the logits `(g - 1) * ld + nt`
        // (asserted above). The rows of `next` are only prefetched.
        return unsafe {
            avx2::qk(
                kind,
                raw,
                &rows.ptrs[..nt],
                (&next.ptrs[..next.n], next_hoff),
                hoff,
                width,
                q,
                qs,
                g,
                logits,
                ld,
            )
        };
    }
    let mut out = [0f32; 16];
    for i in 0..nt {
        widen(kind, rows.row(i, hoff, need), &mut scratch[..width]);
        let mut j0 = 0;
        while j0 < g {
            let n = (g - j0).min(16);
            let (k, q) = (&scratch[..width], &q[j0 * qs..]);
            dots_portable(k, q, qs, &mut out[..n]);
            for (j, o) in out[..n].iter().enumerate() {
                logits[(j0 + j) * ld + i] = *o;
            }
            j0 += n;
        }
    }
}

/// Value accumulation of a tile: `acc[j * s + d] += sum_i w[j * ld + i] * row_i[d]` over the
/// rows of `rows` (at `hoff`) and the `g` accumulator rows, which are in [`Order::of`]`(isa,
/// kind, Value)` and padded to `s`. The bf16-operand kernels round the weights to bf16. `raw`,
/// `next` and `scratch` as in [`qk_tile`].
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
    if isa == Isa::Avx2 {
        assert!(has_avx2(), "AVX2 build on a machine without AVX2");
        // SAFETY: AVX2, FMA and F16C detected just above; every row holds `width` elements
        // of `kind` from `hoff` (checked by `RowSet::push` and `holds` above); the
        // accumulator rows hold `width` values at stride `s >= width` and the weights
        // `(g - 1) * ld + nt` (asserted above). The rows of `next` are only prefetched.
        return unsafe {
            avx2::pv(
                kind,
                raw,
                &rows.ptrs[..nt],
                (&next.ptrs[..next.n], next_hoff),
                hoff,
                width,
                w,
                ld,
                g,
                acc,
                s,
            )
        };
    }
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
            axpys_portable(&scratch[..width], &p[..n], acc, s);
            j0 += n;
        }
    }
}

/// Row `j` of `logits` (`nt` values at `j * ld`, for each of the `g` heads): each logit times
/// its token's key scale `ks[i]`, then, with a soft-cap `c`, `c * tanh(l / c)`. The AVX-512
/// and AVX2 builds compute tanh from the softmax's exponential, `(1 - e^-2|x|) /
/// (1 + e^-2|x|)`: within 1.2e-7 absolute (of tanh, so `c` times that of the logit), what
/// the softmax resolves.
pub(crate) fn adjust_logits(
    isa: Isa,
    nt: usize,
    g: usize,
    logits: &mut [f32],
    ld: usize,
    ks: &[f32],
    cap: Option<f32>,
) {
    assert!(nt <= ld && ks.len() >= nt && logits.len() >= (g.max(1) - 1) * ld + nt);
    for j in 0..g {
        let l = &mut logits[j * ld..j * ld + nt];
        #[cfg(target_arch = "x86_64")]
        if isa.avx512() {
            assert!(has_avx512(), "AVX-512 kernels on a machine without AVX-512");
            // SAFETY: AVX-512 F/BW/VL detected just above.
            unsafe { avx512::adjust_logits(l, &ks[..nt], cap) };
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx2 {
            assert!(has_avx2(), "AVX2 build on a machine without AVX2");
            // SAFETY: AVX2, FMA and F16C detected just above.
            unsafe { avx2::adjust_logits(l, &ks[..nt], cap) };
            continue;
        }
        for (l, ks) in l.iter_mut().zip(ks) {
            *l *= ks;
            if let Some(c) = cap {
                *l = c * (*l / c).tanh();
            }
        }
    }
}

/// Partial sums kept per head by [`softmax_tile`]: a head's running sum is the sum of its
/// `SUM_LANES` partial sums (the AVX-512 step adds its weights lane by lane, so a step needs
/// no horizontal sum; the portable step uses the first lane only).
pub(crate) const SUM_LANES: usize = 16;

/// One online-softmax step over a tile, for each of the `g` heads: row `j` of `logits`
/// (`nt` values at `j * ld`) becomes the weights `exp(l - m)` ([`weight`]: zero below
/// [`WEIGHT_FLOOR`]) where `m` is the running maximum `maxes[j]`, first raised to the tile's
/// maximum when a logit exceeds it (then the partial sums `sums[j * SUM_LANES ..][..SUM_LANES]`
/// and the accumulator row `acc[j * s ..][..s]` are rescaled to it, by the same [`weight`]);
/// the partial sums then gain the tile's weights. The stored weights of
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
    #[cfg(target_arch = "x86_64")]
    let avx2 = isa == Isa::Avx2 && !round;
    #[cfg(target_arch = "x86_64")]
    assert!(!avx2 || has_avx2(), "AVX2 build on a machine without AVX2");
    for j in 0..g {
        let l = &mut logits[j * ld..j * ld + nt];
        let tile_max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = maxes[j].max(tile_max);
        let sum = &mut sums[j * SUM_LANES];
        if m > maxes[j] {
            let c = weight(maxes[j] - m);
            *sum *= c;
            for x in &mut acc[j * s..(j + 1) * s] {
                *x *= c;
            }
            maxes[j] = m;
        }
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: AVX2, FMA and F16C detected (above); `vscale` holds `nt` values.
            *sum += unsafe { avx2::weights(l, m, wscale, vscale.map(|v| &v[..nt])) };
            continue;
        }
        for (i, x) in l.iter_mut().enumerate() {
            *x = weight(*x - m);
            if round {
                *x = half::bf16::from_f32(*x).to_f32();
            }
            *sum += *x;
            *x *= wscale * vscale.map_or(1.0, |v| v[i]);
        }
    }
}

mod isa;
mod order;
mod prefetch;

#[cfg(target_arch = "x86_64")]
pub(crate) use isa::cpu_vendor;
pub(crate) use isa::{available, Isa};
#[cfg(target_arch = "x86_64")]
use isa::{has_avx2, has_avx512, has_avx512_bf16};
pub(crate) use order::{Order, Role};
pub use prefetch::PrefetchLevel;
pub(crate) use prefetch::{prefetch, prefetch_bytes, prefetch_level, prefetch_to};

/// Row kinds as const parameters of the AVX2 and AVX-512 kernels, so each kind gets its own
/// loops. `E4M3_RAW`: e4m3 without its power of two ([`fp8_fold`]).
#[cfg(target_arch = "x86_64")]
mod codes {
    pub(super) const F32: u8 = 0;
    pub(super) const F16: u8 = 1;
    pub(super) const BF16: u8 = 2;
    pub(super) const E4M3: u8 = 3;
    pub(super) const E5M2: u8 = 4;
    pub(super) const I8: u8 = 5;
    pub(super) const E4M3_RAW: u8 = 6;
}

/// Calls `$f::<K, ...>` with the [`codes`] constant of `$kind` (`$raw`: fp8 without its power
/// of two).
#[cfg(target_arch = "x86_64")]
macro_rules! by_kind {
    ($kind:expr, $raw:expr, $f:ident $(:: <$($c:tt),+>)? ( $($arg:expr),* )) => {{
        use $crate::simd::codes::*;
        use $crate::simd::RowKind;
        match ($kind, $raw) {
            (RowKind::F32, _) => $f::<F32 $($(, $c)+)?>($($arg),*),
            (RowKind::F16, _) => $f::<F16 $($(, $c)+)?>($($arg),*),
            (RowKind::Bf16, _) => $f::<BF16 $($(, $c)+)?>($($arg),*),
            (RowKind::Fp8E4m3, false) => $f::<E4M3 $($(, $c)+)?>($($arg),*),
            (RowKind::Fp8E4m3, true) => $f::<E4M3_RAW $($(, $c)+)?>($($arg),*),
            (RowKind::Fp8E5m2, _) => $f::<E5M2 $($(, $c)+)?>($($arg),*),
            (RowKind::I8, _) => $f::<I8 $($(, $c)+)?>($($arg),*),
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512bf16;

// Register-blocked loops index several arrays (rows, heads, vectors) by the same counter.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod avx512;

#[cfg(test)]
mod tests;
