//! How far a decode output may lie from the scalar reference: a bound per output row, from
//! the magnitudes that row was computed from and the products the kernels take.
//!
//! The reference reads the same stored values as every backend, so the differences come only
//! from how a backend rounds what it computes. Two sources, each bounded by a magnitude the
//! reference measures while it decodes ([`Magnitude`]):
//!
//! - a logit moves when its operands are rounded: rounding each product `q_i * k_i` by at most
//!   `u` relative moves the logit by at most `u * logits`, and a softmax whose logits all move
//!   by at most `e` changes each weight by a factor within `e^(+-2e)`, so the output (a convex
//!   combination of value rows) moves by at most about `2e * values`;
//! - rounding the weights by `u` relative moves the output by at most `2u * values` (numerator
//!   and normalizing sum).
//!
//! So an output element may differ by `values * (relative + per_logit * logits)`
//! ([`Tolerance::bound`]), with `relative` and `per_logit` set by the products: f32 products
//! ([`Tolerance::F32_PRODUCTS`]) or bf16 operands, `u = 2^-8` ([`Tolerance::BF16_PRODUCTS`]).
//! Both scale with the values and logits compared, per-tensor and inline scales included, so
//! no tolerance holds for one value range or one kernel build only.

use kvlayout::DType;

/// The magnitudes one decode output row (one sequence and query head) was computed from,
/// measured by [`reference::paged_decode_magnitudes`](crate::reference::paged_decode_magnitudes).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Magnitude {
    /// The largest `|v|` over the value elements attended (scales included). The output is a
    /// convex combination of those rows, so it lies within this, and so do its errors.
    pub values: f64,
    /// The largest `scale * sum_i |q_i * k_i|` over the tokens attended (scales included):
    /// how far a logit moves per unit of relative rounding of every product.
    pub logits: f64,
}

/// An error bound on a decode output element: `values * (relative + per_logit * logits)` of
/// its row's [`Magnitude`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Bound per unit of the values' magnitude.
    pub relative: f64,
    /// Bound per unit of the values' magnitude and of the logits' magnitude.
    pub per_logit: f64,
}

impl Tolerance {
    /// Kernels that widen every operand to f32 and accumulate in f32 (the CPU's `scalar`,
    /// `avx2` and `avx512` builds, and `avx512-bf16` on f32, f16 and int8 rows): f32
    /// rounding over contexts of thousands of tokens stays far below `1e-5` of the values,
    /// and a logit summed in f32 moves by about `sqrt(terms) * 2^-24` of its magnitude
    /// (rounding errors of varied sign), under `2^-19` for up to 2^10 terms: `2^-18` per unit.
    pub const F32_PRODUCTS: Tolerance = Tolerance {
        relative: 1e-5,
        per_logit: 1.0 / 262_144.0,
    };

    /// Kernels that multiply bf16 operands (the scaled query and the softmax weights rounded
    /// to bf16, `u = 2^-8`) with f32 accumulation: `2u` for the weights, `2u` per unit of
    /// logit magnitude for the query, plus the f32 terms.
    pub const BF16_PRODUCTS: Tolerance = Tolerance {
        relative: 2.0 / 256.0 + 1e-5,
        per_logit: 2.0 / 256.0,
    };

    /// What the backend contract allows any backend for a cache of `dtype` (the conformance
    /// suite holds every backend to it): f32 caches, f32 products; f16 and bf16 caches, bf16
    /// products; fp8 and int8 caches, bf16 products or one quantization step of the values
    /// ([`DType::epsilon`]), whichever is larger.
    pub fn contract(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance::F32_PRODUCTS,
            DType::F16 | DType::Bf16 => Tolerance::BF16_PRODUCTS,
            other => Tolerance {
                relative: other.epsilon().max(Tolerance::BF16_PRODUCTS.relative),
                ..Tolerance::BF16_PRODUCTS
            },
        }
    }

    /// The bound on an element of a row of magnitude `m`.
    pub fn bound(&self, m: &Magnitude) -> f64 {
        m.values * (self.relative + self.per_logit * m.logits)
    }
}

/// How a decode output compares with the reference's: its worst element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeError {
    /// The worst `|got - want| / bound` (at most 1 passes; infinite for a non-finite output).
    pub ratio: f64,
    /// The worst `|got - want|` relative to its row's values' magnitude.
    pub relative: f64,
    /// The element of the worst ratio, with both values (`None` when nothing was compared).
    pub worst: Option<(usize, f32, f32)>,
}

impl DecodeError {
    /// Whether every element lies within its bound.
    pub fn passed(&self) -> bool {
        self.ratio <= 1.0
    }
}

/// Compares `got` with the reference's `want` (same length, rows of `want.len() /
/// magnitudes.len()` elements), each element within `tol` of its row's magnitude.
///
/// ```
/// use kvlayout_cpu::tolerance::{decode_error, Magnitude, Tolerance};
/// let m = [Magnitude { values: 4.0, logits: 0.0 }];
/// let e = decode_error(&[1.0, 2.0], &[1.0, 2.0 + 3e-5], &m, Tolerance::F32_PRODUCTS);
/// assert!(e.passed() && (e.relative - 7.5e-6).abs() < 1e-7);
/// let e = decode_error(&[1.0, f32::NAN], &[1.0, 2.0], &m, Tolerance::F32_PRODUCTS);
/// assert!(!e.passed());
/// ```
pub fn decode_error(
    got: &[f32],
    want: &[f32],
    magnitudes: &[Magnitude],
    tol: Tolerance,
) -> DecodeError {
    let row = want.len() / magnitudes.len().max(1);
    let mut e = DecodeError {
        ratio: 0.0,
        relative: 0.0,
        worst: None,
    };
    if got.len() != want.len() || row * magnitudes.len() != want.len() {
        e.ratio = f64::INFINITY;
        return e;
    }
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        let m = &magnitudes[i / row.max(1)];
        let diff = (f64::from(a) - f64::from(b)).abs();
        let bound = tol.bound(m);
        let ratio = match (diff.is_finite(), diff == 0.0) {
            (false, _) => f64::INFINITY,
            (true, true) => 0.0,
            (true, false) if bound > 0.0 => diff / bound,
            (true, false) => f64::INFINITY,
        };
        if e.worst.is_none() || ratio > e.ratio {
            e.ratio = ratio;
            e.worst = Some((i, a, b));
        }
        if m.values > 0.0 {
            e.relative = e.relative.max(diff / m.values);
        } else if diff > 0.0 {
            e.relative = f64::INFINITY;
        }
    }
    e
}
