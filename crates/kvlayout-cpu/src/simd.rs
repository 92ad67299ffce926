//! Row kernels of the decode: `dots` (one key row against a group of query rows) and `axpys`
//! (one value row, weighted per query head, into a group of accumulators), on rows stored as
//! f32, f16 or bf16 bytes, or already widened to f32.
//!
//! Three builds of the same contract, chosen once at run time: AVX-512 (F, BW, VL: the row is
//! widened in registers, tails by masked loads), AVX2 + FMA (portable loops compiled with those
//! features; f16/bf16 rows are widened into a scratch row first), and scalar elsewhere.

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
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Scalar,
}

pub(crate) fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
            return Isa::Avx512;
        }
        if has!("avx2") && has!("fma") && has!("f16c") {
            return Isa::Avx2;
        }
    }
    Isa::Scalar
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

/// `x = exp(x)` for every element.
pub(crate) fn exp_inplace(isa: Isa, xs: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F/BW/VL detected.
        Isa::Avx512 => unsafe { avx512::exp_inplace(xs) },
        _ => {
            for x in xs {
                *x = x.exp();
            }
        }
    }
}

/// `out[j] = sum_d q[j*w + d] * k[d]` for the `out.len()` query rows of width `w = k.len()`.
#[inline(always)]
fn dots_portable(k: &[f32], q: &[f32], out: &mut [f32]) {
    let w = k.len();
    for (j, o) in out.iter_mut().enumerate() {
        let qr = &q[j * w..(j + 1) * w];
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

/// `acc[j*w + d] += p[j] * v[d]` for the `p.len()` accumulators of width `w = v.len()`.
#[inline(always)]
fn axpys_portable(v: &[f32], p: &[f32], acc: &mut [f32]) {
    let w = v.len();
    for (j, pj) in p.iter().enumerate() {
        for (a, x) in acc[j * w..(j + 1) * w].iter_mut().zip(v) {
            *a += pj * x;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dots_avx2(k: &[f32], q: &[f32], out: &mut [f32]) {
    dots_portable(k, q, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn axpys_avx2(v: &[f32], p: &[f32], acc: &mut [f32]) {
    axpys_portable(v, p, acc)
}

/// Dot products of one stored row (`width` elements of `kind`) with `out.len()` query rows.
/// `scratch` holds at least `width` f32 for the paths that widen first.
pub(crate) fn dots(
    isa: Isa,
    kind: RowKind,
    row: &[u8],
    width: usize,
    q: &[f32],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    assert!(row.len() >= width * elem(kind) && q.len() >= out.len() * width);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F/BW/VL detected; row and q lengths asserted above.
        Isa::Avx512 => unsafe { avx512::dots(kind, row.as_ptr(), width, q, out) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            widen(kind, &row[..width * elem(kind)], &mut scratch[..width]);
            // SAFETY: AVX2 and FMA detected.
            unsafe { dots_avx2(&scratch[..width], q, out) }
        }
        Isa::Scalar => {
            widen(kind, &row[..width * elem(kind)], &mut scratch[..width]);
            dots_portable(&scratch[..width], q, out)
        }
    }
}

/// `acc[j] += p[j] * row` for each of the `p.len()` accumulators of width `width`.
pub(crate) fn axpys(
    isa: Isa,
    kind: RowKind,
    row: &[u8],
    width: usize,
    p: &[f32],
    acc: &mut [f32],
    scratch: &mut [f32],
) {
    assert!(row.len() >= width * elem(kind) && acc.len() >= p.len() * width);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F/BW/VL detected; lengths asserted above.
        Isa::Avx512 => unsafe { avx512::axpys(kind, row.as_ptr(), width, p, acc) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            widen(kind, &row[..width * elem(kind)], &mut scratch[..width]);
            // SAFETY: AVX2 and FMA detected.
            unsafe { axpys_avx2(&scratch[..width], p, acc) }
        }
        Isa::Scalar => {
            widen(kind, &row[..width * elem(kind)], &mut scratch[..width]);
            axpys_portable(&scratch[..width], p, acc)
        }
    }
}

/// Whether the tile kernels below are available (AVX-512).
pub(crate) fn has_tile_kernels(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        return true;
    }
    let _ = isa;
    false
}

/// Tile dot products (see `avx512::dots_tile`); `tile` spans all `nt` rows at `stride` bytes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dots_tile(
    isa: Isa,
    kind: RowKind,
    tile: &[u8],
    stride: usize,
    nt: usize,
    width: usize,
    q: &[f32],
    g: usize,
    logits: &mut [f32],
    ld: usize,
) {
    assert!(nt >= 1 && tile.len() >= (nt - 1) * stride + width * elem(kind));
    assert!(q.len() >= g * width && logits.len() >= (g - 1) * ld + nt && nt <= ld);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: AVX-512 detected; lengths asserted above.
        return unsafe {
            avx512::dots_tile(kind, tile.as_ptr(), stride, nt, width, q, g, logits, ld)
        };
    }
    unreachable!("dots_tile without AVX-512 ({isa:?})");
}

/// Tile value accumulation (see `avx512::axpys_tile`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn axpys_tile(
    isa: Isa,
    kind: RowKind,
    tile: &[u8],
    stride: usize,
    nt: usize,
    width: usize,
    w: &[f32],
    g: usize,
    ld: usize,
    acc: &mut [f32],
) {
    assert!(nt >= 1 && tile.len() >= (nt - 1) * stride + width * elem(kind));
    assert!(acc.len() >= g * width && w.len() >= (g - 1) * ld + nt && nt <= ld);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: AVX-512 detected; lengths asserted above.
        return unsafe {
            avx512::axpys_tile(kind, tile.as_ptr(), stride, nt, width, w, g, ld, acc)
        };
    }
    unreachable!("axpys_tile without AVX-512 ({isa:?})");
}

pub(crate) fn elem(kind: RowKind) -> usize {
    match kind {
        RowKind::F32 => 4,
        RowKind::F16 | RowKind::Bf16 => 2,
        RowKind::Fp8E4m3 | RowKind::Fp8E5m2 | RowKind::I8 => 1,
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::RowKind;
    use std::arch::x86_64::*;

    /// Loads up to 16 elements (mask `m`) of `kind` at element `d` of `row`, widened to f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load<const K: u8>(row: *const u8, d: usize, m: __mmask16) -> __m512 {
        let kind = KINDS[K as usize];
        // SAFETY: the callers keep d + popcount(m) <= width, inside the asserted row length;
        // masked-off lanes are not read.
        unsafe {
            match kind {
                RowKind::F32 => _mm512_maskz_loadu_ps(m, row.add(d * 4) as *const f32),
                RowKind::F16 => {
                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row.add(d * 2) as *const i16))
                }
                RowKind::Bf16 => {
                    let h = _mm256_maskz_loadu_epi16(m, row.add(d * 2) as *const i16);
                    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                }
                RowKind::Fp8E5m2 => {
                    // e5m2 is the high byte of an f16.
                    let b = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, row.add(d) as *const i8));
                    _mm512_cvtph_ps(_mm256_slli_epi16(b, 8))
                }
                RowKind::Fp8E4m3 => {
                    // e4m3 (bias 7) as an f16 (bias 15): sign to bit 15, exponent and mantissa
                    // shifted by 7, then scaled by 2^8; subnormals map to f16 subnormals.
                    let b = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, row.add(d) as *const i8));
                    let sign = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8);
                    let mag = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7);
                    let h = _mm256_or_si256(sign, mag);
                    _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0))
                }
                RowKind::I8 => {
                    let b = _mm_maskz_loadu_epi8(m, row.add(d) as *const i8);
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b))
                }
            }
        }
    }

    const KINDS: [RowKind; 6] = [
        RowKind::F32,
        RowKind::F16,
        RowKind::Bf16,
        RowKind::Fp8E4m3,
        RowKind::Fp8E5m2,
        RowKind::I8,
    ];

    fn code(kind: RowKind) -> u8 {
        KINDS.iter().position(|k| *k == kind).unwrap_or(0) as u8
    }

    /// Calls `$f::<K>` with the const code of `$kind`, so each row kind gets its own loop.
    macro_rules! by_kind {
        ($kind:expr, $f:ident ( $($arg:expr),* )) => {
            match code($kind) {
                0 => $f::<0>($($arg),*),
                1 => $f::<1>($($arg),*),
                2 => $f::<2>($($arg),*),
                3 => $f::<3>($($arg),*),
                4 => $f::<4>($($arg),*),
                _ => $f::<5>($($arg),*),
            }
        };
    }

    /// # Safety
    /// As [`dots_k`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn dots(
        kind: RowKind,
        row: *const u8,
        width: usize,
        q: &[f32],
        out: &mut [f32],
    ) {
        // SAFETY: the caller's contract.
        unsafe { by_kind!(kind, dots_k(row, width, q, out)) }
    }

    /// # Safety
    /// As [`axpys_k`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn axpys(
        kind: RowKind,
        row: *const u8,
        width: usize,
        p: &[f32],
        acc: &mut [f32],
    ) {
        // SAFETY: the caller's contract.
        unsafe { by_kind!(kind, axpys_k(row, width, p, acc)) }
    }

    fn mask(rem: usize) -> __mmask16 {
        if rem >= 16 {
            0xFFFF
        } else {
            ((1u32 << rem) - 1) as __mmask16
        }
    }

    /// `x = exp(x)`: 2^(x log2 e) split into an integer power and a degree-6 polynomial on
    /// [-0.5, 0.5] (relative error ~2e-7); inputs below -87 flush to 0 (they are softmax
    /// weights relative to the maximum, so never positive).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn exp_inplace(xs: &mut [f32]) {
        let mut i = 0;
        while i < xs.len() {
            let m = mask(xs.len() - i);
            let p = xs[i..].as_mut_ptr();
            // SAFETY: the masked lanes stay inside `xs`.
            unsafe {
                let x = _mm512_maskz_loadu_ps(m, p);
                let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
                let t = _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E));
                let n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                let f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(std::f32::consts::LN_2));
                // e^f for |f| <= ln2 / 2, Taylor to degree 6.
                let mut y = _mm512_set1_ps(1.0 / 720.0);
                y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0 / 120.0));
                y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0 / 24.0));
                y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0 / 6.0));
                y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.5));
                y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0));
                y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0));
                let r = _mm512_scalef_ps(y, n);
                _mm512_mask_storeu_ps(p, m, r);
            }
            i += 16;
        }
    }

    /// # Safety
    /// AVX-512 F/BW/VL present; `row` valid for `width` elements of `kind`;
    /// `q.len() >= out.len() * width`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn dots_k<const K: u8>(row: *const u8, width: usize, q: &[f32], out: &mut [f32]) {
        let g = out.len();
        let qp = q.as_ptr();
        let full = width / 16 * 16;
        let tail = mask(width - full);
        let mut j0 = 0;
        // Four query rows at a time: each widened key vector feeds four FMAs.
        while j0 < g {
            let n = (g - j0).min(4);
            let mut acc = [_mm512_setzero_ps(); 4];
            // SAFETY (whole block): rows j0 .. j0 + n of q are `width` long and inside `q`
            // (asserted by the caller; rows past n repeat row n - 1); masked lanes are not read.
            unsafe {
                let rows = [0usize, 1, 2, 3].map(|j| qp.add((j0 + j.min(n - 1)) * width));
                let mut d = 0;
                while d < full {
                    let x = load::<K>(row, d, 0xFFFF);
                    acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(rows[0].add(d)), x, acc[0]);
                    acc[1] = _mm512_fmadd_ps(_mm512_loadu_ps(rows[1].add(d)), x, acc[1]);
                    acc[2] = _mm512_fmadd_ps(_mm512_loadu_ps(rows[2].add(d)), x, acc[2]);
                    acc[3] = _mm512_fmadd_ps(_mm512_loadu_ps(rows[3].add(d)), x, acc[3]);
                    d += 16;
                }
                if full < width {
                    let x = load::<K>(row, full, tail);
                    for (a, r) in acc.iter_mut().zip(rows) {
                        *a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, r.add(full)), x, *a);
                    }
                }
            }
            for j in 0..n {
                out[j0 + j] = _mm512_reduce_add_ps(acc[j]);
            }
            j0 += n;
        }
    }

    /// # Safety
    /// AVX-512 F/BW/VL present; `row` valid for `width` elements of `kind`;
    /// `acc.len() >= p.len() * width`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn axpys_k<const K: u8>(row: *const u8, width: usize, p: &[f32], acc: &mut [f32]) {
        let ap = acc.as_mut_ptr();
        let full = width / 16 * 16;
        let tail = mask(width - full);
        let mut j0 = 0;
        // Up to eight accumulator rows per pass over the value row, weights broadcast once.
        while j0 < p.len() {
            let n = (p.len() - j0).min(8);
            let mut w = [_mm512_setzero_ps(); 8];
            for (j, wj) in w.iter_mut().enumerate().take(n) {
                *wj = _mm512_set1_ps(p[j0 + j]);
            }
            // SAFETY (whole block): accumulator rows j0 .. j0 + n are `width` long and inside
            // `acc` (asserted by the caller); masked lanes are neither read nor written.
            unsafe {
                let mut d = 0;
                while d < full {
                    let x = load::<K>(row, d, 0xFFFF);
                    for (j, wj) in w.iter().enumerate().take(n) {
                        let a = ap.add((j0 + j) * width + d);
                        _mm512_storeu_ps(a, _mm512_fmadd_ps(*wj, x, _mm512_loadu_ps(a)));
                    }
                    d += 16;
                }
                if full < width {
                    let x = load::<K>(row, full, tail);
                    for (j, wj) in w.iter().enumerate().take(n) {
                        let a = ap.add((j0 + j) * width + full);
                        let y = _mm512_fmadd_ps(*wj, x, _mm512_maskz_loadu_ps(tail, a));
                        _mm512_mask_storeu_ps(a, tail, y);
                    }
                }
            }
            j0 += n;
        }
    }

    /// Dot products of the `nt` rows of a tile (row `i` at `tile + i * stride`) with the `g`
    /// query rows: `logits[j * ld + i]`.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL present; every row valid for `width` elements of `kind`;
    /// `q.len() >= g * width`; `logits.len() >= (g - 1) * ld + nt`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn dots_tile(
        kind: RowKind,
        tile: *const u8,
        stride: usize,
        nt: usize,
        width: usize,
        q: &[f32],
        g: usize,
        logits: &mut [f32],
        ld: usize,
    ) {
        // SAFETY: the caller's contract.
        unsafe { by_kind!(kind, dots_tile_k(tile, stride, nt, width, q, g, logits, ld)) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn dots_tile_k<const K: u8>(
        tile: *const u8,
        stride: usize,
        nt: usize,
        width: usize,
        q: &[f32],
        g: usize,
        logits: &mut [f32],
        ld: usize,
    ) {
        let qp = q.as_ptr();
        let mut out = [0f32; 16];
        let rows4 = nt / 4 * 4;
        let heads4 = g / 4 * 4;
        // Blocks of 4 rows x 4 query heads: 16 accumulators, each key chunk loaded once per
        // row and each query chunk once per block, then one transposed reduction of 16 sums.
        for i0 in (0..rows4).step_by(4) {
            for j0 in (0..heads4).step_by(4) {
                // SAFETY: rows i0 .. i0 + 4 < nt and query rows j0 .. j0 + 4 <= g are in bounds
                // (caller's contract); masked lanes are not read.
                let sums = unsafe {
                    let mut acc = [_mm512_setzero_ps(); 16];
                    let mut d = 0;
                    while d < width {
                        let m = mask(width - d);
                        let x = [0, 1, 2, 3].map(|r| load::<K>(tile.add((i0 + r) * stride), d, m));
                        for j in 0..4 {
                            let qv = _mm512_maskz_loadu_ps(m, qp.add((j0 + j) * width + d));
                            for r in 0..4 {
                                acc[j * 4 + r] = _mm512_fmadd_ps(qv, x[r], acc[j * 4 + r]);
                            }
                        }
                        d += 16;
                    }
                    hsum16(acc)
                };
                // SAFETY: `out` holds 16 floats.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sums) };
                for r in 0..4 {
                    for j in 0..4 {
                        logits[(j0 + j) * ld + i0 + r] = out[r * 4 + j];
                    }
                }
            }
        }
        // Remaining rows (all heads) and remaining heads (all rows), one row at a time.
        let mut four = [0f32; 4];
        for i in 0..nt {
            let j_start = if i < rows4 { heads4 } else { 0 };
            let mut j0 = j_start;
            while j0 < g {
                let n = (g - j0).min(4);
                // SAFETY: row i of the tile and query rows j0 .. j0 + n (caller's contract).
                unsafe {
                    dots_k::<K>(
                        tile.add(i * stride),
                        width,
                        &q[j0 * width..(j0 + n) * width],
                        &mut four[..n],
                    )
                };
                for (j, o) in four[..n].iter().enumerate() {
                    logits[(j0 + j) * ld + i] = *o;
                }
                j0 += n;
            }
        }
    }

    /// Lane `r * 4 + j` of the result is the horizontal sum of `v[j * 4 + r]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn hsum16(v: [__m512; 16]) -> __m512 {
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

    /// `acc[j] += sum_i w[j * ld + i] * row_i` over the `nt` rows of a tile, each accumulator
    /// chunk held in a register across the whole tile.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL present; every row valid for `width` elements of `kind`;
    /// `acc.len() >= g * width`; `w.len() >= (g - 1) * ld + nt`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn axpys_tile(
        kind: RowKind,
        tile: *const u8,
        stride: usize,
        nt: usize,
        width: usize,
        w: &[f32],
        g: usize,
        ld: usize,
        acc: &mut [f32],
    ) {
        // SAFETY: the caller's contract.
        unsafe { by_kind!(kind, axpys_tile_k(tile, stride, nt, width, w, g, ld, acc)) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn axpys_tile_k<const K: u8>(
        tile: *const u8,
        stride: usize,
        nt: usize,
        width: usize,
        w: &[f32],
        g: usize,
        ld: usize,
        acc: &mut [f32],
    ) {
        let ap = acc.as_mut_ptr();
        let mut j0 = 0;
        while j0 < g {
            let n = (g - j0).min(8);
            let mut d = 0;
            while d < width {
                let m = mask(width - d);
                let mut a = [_mm512_setzero_ps(); 8];
                // SAFETY (whole block): accumulator rows j0 .. j0 + n are inside `acc`, the
                // tile's rows are valid (caller's contract); masked lanes are not touched.
                unsafe {
                    for (j, aj) in a.iter_mut().enumerate().take(n) {
                        *aj = _mm512_maskz_loadu_ps(m, ap.add((j0 + j) * width + d));
                    }
                    for i in 0..nt {
                        let x = load::<K>(tile.add(i * stride), d, m);
                        for (j, aj) in a.iter_mut().enumerate().take(n) {
                            *aj = _mm512_fmadd_ps(_mm512_set1_ps(w[(j0 + j) * ld + i]), x, *aj);
                        }
                    }
                    for (j, aj) in a.iter().enumerate().take(n) {
                        _mm512_mask_storeu_ps(ap.add((j0 + j) * width + d), m, *aj);
                    }
                }
                d += 16;
            }
            j0 += n;
        }
    }
}

/// Asks the cache hierarchy for every line of `bytes` ahead of use.
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let mut i = 0;
        while i < bytes.len() {
            // SAFETY: a prefetch is a hint; the address is inside `bytes`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(bytes.as_ptr().add(i) as *const i8) };
            i += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}
