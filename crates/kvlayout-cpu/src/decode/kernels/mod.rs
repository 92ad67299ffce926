//! The decode kernels, on rows stored as f32, f16, bf16, fp8 (e4m3, e5m2) or int8 bytes: read
//! in place, or copied into contiguous rows first when the layout's rows are not contiguous.
//!
//! Per tile of up to [`TILE`] rows of one KV head: [`qk_tile`] computes the logits of every
//! row against the whole GQA group of query rows, [`softmax_tile`] is the online-softmax step,
//! [`pv_tile`] accumulates the value rows into the group's accumulators. Three builds of the
//! same contract, chosen once per call at run time (four with the bf16-operand kernels of
//! `avx512::bf16`, on AVX-512 with BF16 and VBMI):
//!
//! - AVX-512 F/BW/VL (`avx512`): rows are widened in registers, once per row for all heads
//!   of the group. `qk` works on blocks of rows x heads sharing 16 accumulators (one
//!   transposed reduction per block); `pv` holds the accumulators of up to 4 heads x 64
//!   elements in registers across all rows of the tile. f16 widens by `vcvtph2ps`; bf16 by a
//!   shift (even elements) and a mask (odd elements) of one 512-bit load, so query rows and
//!   accumulators are kept in an even/odd order within blocks of 32 ([`Order`]); fp8 (blocks
//!   of 32, natural order) widens 32 bytes to words holding each element's f16 (e4m3: its
//!   value times 2^-8, exactly, subnormals included; e5m2: itself), then by `vcvtph2ps`, so
//!   no f32 subnormal reaches an FMA; e4m3's 2^-8 is either multiplied back or folded by the
//!   caller into the query, the logits and the weights ([`fp8_fold`]); int8 by `vcvtdq2ps`.
//! - AVX2 + FMA + F16C (`avx2`): rows of every kind read in place and widened in registers
//!   eight elements at a time (fp8 through f16, as above), logits in blocks of 4 rows x 2
//!   heads with one transposed reduction, values of up to 4 heads x 16 elements held in
//!   registers across the tile, softmax weights eight at a time; natural order, unpadded.
//! - `scalar`: each row widened into a scratch row, then portable loops.
//!
//! The legacy vLLM layout is read in place on AVX-512 and AVX2: x-split keys (16-byte pieces
//! of a row `chunk` bytes apart) by [`qk_tile_split`], the logits kernels with each block
//! assembled from its pieces; transposed values (a block's tokens side by side per element
//! index) by [`pv_transposed`], which keeps one token per lane and reduces once per tile.
//! The scalar build copies them into rows first.
//!
//! This module only dispatches to the builds. `rows` holds what they share (constants, row
//! kinds, the bounds-checked rows of a tile: each row is checked against its buffer when it
//! is added, for every head the kernels may read, then read through raw pointers with
//! unaligned, width-masked loads), `args` the kernels' named arguments, `order` the element
//! orders of query and accumulator rows. The instruction sets and the prefetch level are
//! the machine's ([`crate::arch`]).

mod args;
mod order;
mod rows;
mod scalar;

/// Calls `$f::<K, ...>` with the [`codes`](rows::codes) constant of `$kind` (`$raw`: fp8
/// without its power of two). With `bf16` first: only the kinds the bf16-operand kernels
/// take (fp8 becomes bf16 exactly, so there is no raw form).
#[cfg(target_arch = "x86_64")]
macro_rules! by_kind {
    (bf16 $kind:expr, $f:ident :: <$($c:tt),+> ( $($arg:expr),* )) => {{
        use $crate::decode::kernels::rows::codes::{BF16, E4M3, E5M2};
        use $crate::decode::kernels::rows::RowKind;
        match $kind {
            RowKind::Bf16 => $f::<BF16, $($c),+>($($arg),*),
            RowKind::Fp8E4m3 => $f::<E4M3, $($c),+>($($arg),*),
            RowKind::Fp8E5m2 => $f::<E5M2, $($c),+>($($arg),*),
            k => unreachable!("{k:?} rows do not take bf16 operands"),
        }
    }};
    ($kind:expr, $raw:expr, $f:ident $(:: <$($c:tt),+>)? ( $($arg:expr),* )) => {{
        use $crate::decode::kernels::rows::codes::{BF16, E4M3, E4M3_RAW, E5M2, F16, F32, I8};
        use $crate::decode::kernels::rows::RowKind;
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
// Register-blocked loops index several arrays (rows, heads, vectors) by the same counter.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod avx512;

#[cfg(test)]
mod tests;

use args::KeyArgs;
#[cfg(target_arch = "x86_64")]
use args::ValueArgs;
pub(crate) use args::{Run, SoftmaxStep, Strided, StridedMut, TileRows, TransposedArgs};
pub(crate) use order::{Order, Role};
pub(crate) use rows::{weight, RowKind, RowSet, SPLIT_PIECE, SUM_LANES, TILE};

use crate::arch::Isa;
#[cfg(target_arch = "x86_64")]
use crate::arch::{has_avx2, has_avx512, has_avx512_bf16};

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

/// Whether [`pv_transposed`] reads transposed value rows in place on `isa` (on AVX-512 and
/// AVX2, of every kind; the scalar build copies them into rows first).
pub(crate) fn reads_transposed(isa: Isa) -> bool {
    isa != Isa::Scalar
}

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

/// A SIMD key-tile kernel: rows of a kind (and whether fp8 rows are raw), then its arguments.
#[cfg(target_arch = "x86_64")]
type KeyKernel = unsafe fn(RowKind, bool, KeyArgs<'_>);

/// A SIMD value-tile kernel, as [`KeyKernel`].
#[cfg(target_arch = "x86_64")]
type ValueKernel = unsafe fn(RowKind, bool, ValueArgs<'_>);

/// The key and value kernels of an AVX-512 build for rows of `kind`, after checking that this
/// machine runs them.
#[cfg(target_arch = "x86_64")]
fn avx512_kernels(isa: Isa, kind: RowKind) -> (KeyKernel, ValueKernel) {
    if isa.bf16_operands(kind) {
        assert!(
            has_avx512_bf16(),
            "AVX-512 BF16 kernels on a machine without them"
        );
        (avx512::bf16::qk_tile, avx512::bf16::pv_tile)
    } else {
        assert!(has_avx512(), "AVX-512 kernels on a machine without AVX-512");
        (avx512::qk_tile, avx512::pv_tile)
    }
}

impl TileRows<'_, '_> {
    /// The arguments of a key kernel on these rows (`chunk`: the piece stride of split rows).
    fn key_args<'a>(
        &'a self,
        q: Strided<'a>,
        g: usize,
        logits: StridedMut<'a>,
        chunk: usize,
    ) -> KeyArgs<'a> {
        KeyArgs {
            rows: self.rows.ptrs(),
            pf: self.next.ptrs(),
            hoff: self.hoff,
            pf_hoff: self.next_hoff,
            width: self.width,
            chunk,
            q,
            g,
            logits,
            level: self.level,
        }
    }

    /// The arguments of a value kernel on these rows.
    #[cfg(target_arch = "x86_64")]
    fn value_args<'a>(&'a self, w: Strided<'a>, g: usize, acc: StridedMut<'a>) -> ValueArgs<'a> {
        ValueArgs {
            rows: self.rows.ptrs(),
            pf: self.next.ptrs(),
            hoff: self.hoff,
            pf_hoff: self.next_hoff,
            width: self.width,
            w,
            g,
            acc,
            level: self.level,
        }
    }
}

/// Logits of a tile: `logits[j * ld + i] = sum_d q[j * qs + d] * row_i[d]` over the rows of
/// `t` and the `g` query rows of `q` (stride `qs`), which are in [`Order::of`]`(isa, kind,
/// Key)` (packed bf16 for the bf16-operand kernels) and zero-padded to `qs` slots. The rows
/// of `t.next` are prefetched as the rows of `t.rows` are read. `scratch` holds `width` f32.
// Inlined into the (tile, head) step, with the scalar kernels it falls back on: called
// apart, its `Strided` arguments (24 bytes, passed by reference to a copy) are written by
// the step with 8-byte stores and copied into the kernel's arguments with a 16-byte load,
// which cannot forward from them and waits on every step (token-major tiles of 8 tokens:
// bf16 NHD 4% slower, rows in L2).
#[inline]
pub(crate) fn qk_tile(
    isa: Isa,
    t: &TileRows<'_, '_>,
    q: Strided<'_>,
    g: usize,
    logits: StridedMut<'_>,
    scratch: &mut [f32],
) {
    let nt = t.rows.len();
    if nt == 0 || g == 0 {
        return;
    }
    let (width, qs, ld) = (t.width, q.stride, logits.stride);
    let need = width * t.kind.elem();
    let padded = Order::of(isa, t.kind, Role::Key).padded(width);
    assert!(nt <= ld && width > 0 && t.rows.holds(t.hoff, need));
    assert!(t.next.holds(t.next_hoff, need));
    assert!(qs >= padded && q.data.len() >= (g - 1) * qs + padded);
    assert!(logits.data.len() >= (g - 1) * ld + nt);
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        let kernel = avx512_kernels(isa, t.kind).0;
        // SAFETY: the kernel's instruction sets detected (`avx512_kernels`); every row holds
        // `width` elements of `kind` from `hoff` (checked by `RowSet::push` and `holds` above);
        // the query rows hold `padded` values (packed bf16 for the bf16-operand kernels) at
        // stride `qs` and the logits `(g - 1) * ld + nt` (asserted above). The rows of `next`
        // are only prefetched.
        return unsafe { kernel(t.kind, t.raw, t.key_args(q, g, logits, 0)) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        assert!(has_avx2(), "AVX2 build on a machine without AVX2");
        // SAFETY: AVX2, FMA and F16C detected just above; every row holds `width` elements
        // of `kind` from `hoff` (checked by `RowSet::push` and `holds` above); the query rows
        // hold `width` values at stride `qs >= width` and the logits `(g - 1) * ld + nt`
        // (asserted above). The rows of `next` are only prefetched.
        return unsafe { avx2::qk(t.kind, t.raw, t.key_args(q, g, logits, 0)) };
    }
    scalar::qk(t, q, g, logits, scratch)
}

/// [`qk_tile`] on key rows split into pieces of [`SPLIT_PIECE`] bytes `chunk` bytes apart
/// (the legacy vLLM key `[blocks, heads, head / x, block, x]`: element `d` of a row at
/// `(d / x) * chunk + (d % x) * elem`), read in place; `width` a multiple of `x`; query rows
/// in [`split_key_order`]. The rows of `t.next` (split alike) are prefetched as the rows of
/// `t.rows` are read. Only where [`reads_split`].
// Inlined as [`qk_tile`] is.
#[inline]
pub(crate) fn qk_tile_split(
    isa: Isa,
    t: &TileRows<'_, '_>,
    chunk: usize,
    q: Strided<'_>,
    g: usize,
    logits: StridedMut<'_>,
) {
    assert!(
        reads_split(isa),
        "split keys are not read in place on {isa:?}"
    );
    let nt = t.rows.len();
    if nt == 0 || g == 0 {
        return;
    }
    let (width, qs, ld) = (t.width, q.stride, logits.stride);
    let x = SPLIT_PIECE / t.kind.elem();
    assert!(width > 0 && width.is_multiple_of(x) && chunk >= SPLIT_PIECE);
    let need = (width / x - 1) * chunk + SPLIT_PIECE;
    let padded = split_key_order(isa, t.kind).padded(width);
    assert!(nt <= ld && t.rows.holds(t.hoff, need) && t.next.holds(t.next_hoff, need));
    assert!(qs >= padded && q.data.len() >= (g - 1) * qs + padded);
    assert!(logits.data.len() >= (g - 1) * ld + nt);
    let a = t.key_args(q, g, logits, chunk);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = a;
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        assert!(has_avx512(), "AVX-512 kernels on a machine without AVX-512");
        // SAFETY: AVX-512 F/BW/VL detected just above; every row holds its pieces from
        // `hoff` (`need` bytes, checked by `RowSet::push` and `holds` above); the query rows
        // hold `padded` values at stride `qs` and the logits `(g - 1) * ld + nt` (asserted
        // above). The rows of `next` are only prefetched.
        unsafe { avx512::qk_tile_split(t.kind, t.raw, a) }
    } else {
        assert!(has_avx2(), "AVX2 build on a machine without AVX2");
        // SAFETY: AVX2, FMA and F16C detected just above; the rest as above.
        unsafe { avx2::qk_split(t.kind, t.raw, a) }
    }
}

/// Value accumulation of a tile: `acc[j * s + d] += sum_i w[j * ld + i] * row_i[d]` over the
/// rows of `t` and the `g` accumulator rows of `acc` (stride `s`), which are in
/// [`Order::of`]`(isa, kind, Value)` and padded to `s`. The bf16-operand kernels round the
/// weights to bf16. Prefetches and `scratch` as in [`qk_tile`].
// Inlined as [`qk_tile`] is.
#[inline]
pub(crate) fn pv_tile(
    isa: Isa,
    t: &TileRows<'_, '_>,
    w: Strided<'_>,
    g: usize,
    acc: StridedMut<'_>,
    scratch: &mut [f32],
) {
    let nt = t.rows.len();
    if nt == 0 || g == 0 {
        return;
    }
    let (width, ld, s) = (t.width, w.stride, acc.stride);
    let need = width * t.kind.elem();
    let padded = Order::of(isa, t.kind, Role::Value).padded(width);
    assert!(nt <= ld && width > 0 && t.rows.holds(t.hoff, need));
    assert!(t.next.holds(t.next_hoff, need));
    assert!(s >= padded && acc.data.len() >= (g - 1) * s + padded);
    assert!(w.data.len() >= (g - 1) * ld + nt);
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        let kernel = avx512_kernels(isa, t.kind).1;
        // SAFETY: the kernel's instruction sets detected (`avx512_kernels`); every row holds
        // `width` elements of `kind` from `hoff` (checked by `RowSet::push` and `holds` above);
        // the accumulator rows hold `padded` values at stride `s` and the weights
        // `(g - 1) * ld + nt` (asserted above). The rows of `next` are only prefetched.
        return unsafe { kernel(t.kind, t.raw, t.value_args(w, g, acc)) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        assert!(has_avx2(), "AVX2 build on a machine without AVX2");
        // SAFETY: AVX2, FMA and F16C detected just above; every row holds `width` elements
        // of `kind` from `hoff` (checked by `RowSet::push` and `holds` above); the
        // accumulator rows hold `width` values at stride `s >= width` and the weights
        // `(g - 1) * ld + nt` (asserted above). The rows of `next` are only prefetched.
        return unsafe { avx2::pv(t.kind, t.raw, t.value_args(w, g, acc)) };
    }
    scalar::pv(t, w, g, acc, scratch)
}

/// The values of a tile whose rows are transposed, read in place (see [`TransposedArgs`]:
/// `runs` of at most 16 tokens, `ow >= width`, natural order). `raw`: fp8 values without
/// their power of two ([`fp8_fold`]). Only where [`reads_transposed`].
pub(crate) fn pv_transposed(isa: Isa, kind: RowKind, raw: bool, a: TransposedArgs<'_>) {
    assert!(
        reads_transposed(isa),
        "transposed values are not read in place on {isa:?}"
    );
    let (g, width, dim, ld, ow) = (a.g, a.width, a.dim, a.w.stride, a.out.stride);
    if g == 0 || width == 0 {
        return;
    }
    let e = kind.elem();
    for r in a.runs {
        assert!(r.n <= 16 && r.off + (width - 1) * dim + r.n * e <= a.buf.len());
        assert!(r.i0 + r.n <= ld && (g - 1) * ld + r.i0 + r.n <= a.w.data.len());
    }
    assert!(ow >= width && a.out.data.len() >= (g - 1) * ow + width);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (raw, a);
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
        unsafe { kernel(kind, raw, a) }
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
    logits: StridedMut<'_>,
    ks: &[f32],
    cap: Option<f32>,
) {
    let (ld, logits) = (logits.stride, logits.data);
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
        scalar::adjust_row(l, ks, cap);
    }
}

/// One online-softmax step over a tile (see [`SoftmaxStep`]), for each of the `g` heads: row
/// `j` of the logits (`nt` values) becomes the weights `exp(l - m)` ([`weight`]: zero below
/// [`WEIGHT_FLOOR`](rows::WEIGHT_FLOOR)) where `m` is the running maximum `maxes[j]`, first
/// raised to the tile's maximum when a logit exceeds it (then the partial sums `sums[j *
/// SUM_LANES ..][..SUM_LANES]` and the accumulator row `j` are rescaled to it, by the same
/// [`weight`]); the partial sums then gain the tile's weights. The stored weights of token `i`
/// are then multiplied by `wscale` and `vscale[i]` (not counted in the sum). With `round`,
/// each weight is rounded to bf16 before it is summed, so that a value kernel with bf16
/// operands multiplies by exactly the weights the sum counts.
pub(crate) fn softmax_tile(isa: Isa, s: SoftmaxStep<'_>) {
    let (nt, g, ld, sa) = (s.nt, s.g, s.logits.stride, s.acc.stride);
    assert!(nt >= 1 && nt <= ld);
    assert!(s.logits.data.len() >= (g - 1) * ld + nt && s.maxes.len() >= g);
    assert!(s.sums.len() >= g * SUM_LANES && s.acc.data.len() >= g * sa);
    if let Some(v) = s.vscale {
        assert!(v.len() >= nt);
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        assert!(has_avx512(), "AVX-512 kernels on a machine without AVX-512");
        // SAFETY: AVX-512 F/BW/VL detected and lengths asserted above.
        return unsafe { avx512::softmax_tile(s) };
    }
    let (round, wscale, vscale) = (s.round, s.wscale, s.vscale);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && !round {
        assert!(has_avx2(), "AVX2 build on a machine without AVX2");
        let vscale = vscale.map(|v| &v[..nt]);
        return scalar::softmax_heads(s, |l, m, sum| {
            // SAFETY: AVX2, FMA and F16C detected (above); `vscale` holds `nt` values.
            *sum += unsafe { avx2::weights(l, m, wscale, vscale) };
        });
    }
    scalar::softmax_heads(s, |l, m, sum| {
        scalar::head_weights(l, m, sum, round, wscale, vscale)
    });
}
