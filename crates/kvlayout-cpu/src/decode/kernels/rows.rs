//! What every kernel build shares: the tile and softmax constants, the row kinds (with their
//! codes as const parameters), the portable widening, and the bounds-checked rows of a tile.

use kvlayout::ops::OpError;
use kvlayout::DType;

/// Tokens per online-softmax tile (the leading dimension of the logits and weights).
pub(crate) const TILE: usize = 64;

/// Partial sums kept per head by the softmax step: a head's running sum is the sum of its
/// `SUM_LANES` partial sums (the AVX-512 step adds its weights lane by lane, so a step needs
/// no horizontal sum; the portable step uses the first lane only).
pub(crate) const SUM_LANES: usize = 16;

/// Bytes of a piece of an x-split row (the legacy vLLM key: `x` elements of 16 bytes).
pub(crate) const SPLIT_PIECE: usize = 16;

/// Softmax weights `e^x` (`x` a logit minus the running maximum) below `e^WEIGHT_FLOOR` are
/// taken as zero, and so is the factor that rescales a state to a maximum this much higher.
/// Their share of a sum that holds the maximum's weight of 1 is below 2^-92, far under what an
/// f32 resolves (2^-24); kept, such a weight times a value is an f32 subnormal, and an FMA
/// with a subnormal input or result takes a slow microcode assist on Intel cores.
pub(crate) const WEIGHT_FLOOR: f32 = -64.0;

/// `e^x` as a softmax weight: zero below [`WEIGHT_FLOOR`].
#[inline]
pub(crate) fn weight(x: f32) -> f32 {
    if x >= WEIGHT_FLOOR {
        x.exp()
    } else {
        0.0
    }
}

/// How a row's bytes encode its elements: one kind per dtype that holds keys or values. The
/// discriminants are the kinds' [`codes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RowKind {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
    Fp8E4m3 = 3,
    Fp8E5m2 = 4,
    I8 = 5,
}

impl RowKind {
    /// The row kind of a field's dtype (raw bytes hold no keys or values).
    pub(crate) fn of(dtype: DType) -> Result<RowKind, OpError> {
        Ok(match dtype {
            DType::F32 => RowKind::F32,
            DType::F16 => RowKind::F16,
            DType::Bf16 => RowKind::Bf16,
            DType::Fp8E4m3 => RowKind::Fp8E4m3,
            DType::Fp8E5m2 => RowKind::Fp8E5m2,
            DType::Int8 => RowKind::I8,
            DType::U8 => {
                return Err(OpError::Unsupported {
                    op: "paged_decode",
                    reason: "raw bytes (dtype u8) hold no keys or values".into(),
                })
            }
        })
    }

    /// The dtype whose elements rows of this kind hold.
    pub(crate) const fn dtype(self) -> DType {
        match self {
            RowKind::F32 => DType::F32,
            RowKind::F16 => DType::F16,
            RowKind::Bf16 => DType::Bf16,
            RowKind::Fp8E4m3 => DType::Fp8E4m3,
            RowKind::Fp8E5m2 => DType::Fp8E5m2,
            RowKind::I8 => DType::Int8,
        }
    }

    /// Bytes per element.
    #[inline]
    pub(crate) const fn elem(self) -> usize {
        self.dtype().size_bytes() as usize
    }
}

/// Row kinds as const parameters of the SIMD kernels, so each kind gets its own loops: the
/// [`RowKind`] discriminants, and `E4M3_RAW`, e4m3 without its power of two
/// ([`fp8_fold`](super::fp8_fold)). The `by_kind!` macro maps a kind to its code.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) mod codes {
    use super::RowKind;

    pub(crate) const F32: u8 = RowKind::F32 as u8;
    pub(crate) const F16: u8 = RowKind::F16 as u8;
    pub(crate) const BF16: u8 = RowKind::Bf16 as u8;
    pub(crate) const E4M3: u8 = RowKind::Fp8E4m3 as u8;
    pub(crate) const E5M2: u8 = RowKind::Fp8E5m2 as u8;
    pub(crate) const I8: u8 = RowKind::I8 as u8;
    pub(crate) const E4M3_RAW: u8 = 6;

    /// Bytes per element of code `k` ([`RowKind::elem`]), a match every kernel folds to a
    /// constant before it is optimized, wherever it is compiled.
    #[inline(always)]
    pub(crate) const fn esize(k: u8) -> usize {
        match k {
            F32 => 4,
            F16 | BF16 => 2,
            _ => 1,
        }
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
            let t = crate::elem::fp8_table(kind.dtype());
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

    /// The start of each row, valid for `span` bytes.
    #[inline]
    pub(crate) fn ptrs(&self) -> &[*const u8] {
        &self.ptrs[..self.n]
    }

    /// The `len` bytes of row `i` from byte `hoff`.
    pub(crate) fn row(&self, i: usize, hoff: usize, len: usize) -> &'a [u8] {
        assert!(i < self.n && hoff + len <= self.span);
        // SAFETY: `ptrs[i]` starts a `&'a [u8]` of `span` bytes (`push`), and
        // `hoff + len <= span`.
        unsafe { std::slice::from_raw_parts(self.ptrs[i].add(hoff), len) }
    }

    /// Whether every row holds `need` bytes from `hoff` (an empty set holds anything).
    pub(crate) fn holds(&self, hoff: usize, need: usize) -> bool {
        self.n == 0 || hoff + need <= self.span
    }
}

/// The rows `i0 .. i0 + R` of a tile's logits kernel at `hoff` (a row past the tile repeats
/// its last; `rows` is not empty), and the matching rows of `pf` at `pf_hoff`, whose lines the
/// kernel prefetches as it reads (a row past the end of `pf` gives its own row, whose lines
/// are cached). Whole blocks take neither clamp.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
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
