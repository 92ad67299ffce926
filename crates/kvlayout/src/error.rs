//! The one error type of the crate: every refusal names the value and the limit it broke.

use thiserror::Error;

/// Everything that can be wrong with a layout, a coordinate, a spec or a claim about a tensor.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// A size that must be positive is zero.
    #[error("{what} must be at least 1, got 0")]
    ZeroSize {
        /// The quantity, e.g. `num_blocks`.
        what: &'static str,
    },
    /// A size, stride or offset does not fit the 63-bit offset range of the kernel ABI.
    #[error("{what} overflows the 64-bit offset range (limit {limit} bytes)")]
    Overflow {
        /// What was being computed.
        what: String,
        /// The largest representable byte offset.
        limit: u64,
    },
    /// The legacy vLLM key splits the head dimension by `x = 16 / element_size`.
    #[error("head_size {head_size} is not divisible by x = {x} (16 / {elem_bytes}-byte elements)")]
    XNotDividing {
        /// Head size of the key.
        head_size: u64,
        /// The vector width.
        x: u64,
        /// Element size in bytes.
        elem_bytes: u64,
    },
    /// An inline f32 scale would sit at an offset that is not 4-byte aligned.
    #[error("{field} is at byte {offset} (or moves by a stride of that residue), which is not a multiple of {align}")]
    MisalignedScale {
        /// The scale field.
        field: String,
        /// The offending offset or stride.
        offset: u64,
        /// Required alignment.
        align: u64,
    },
    /// A field's elements would not be aligned to their own size, or a page to the stated alignment.
    #[error("{what} = {value} is not a multiple of {align}")]
    Misaligned {
        /// What is misaligned.
        what: String,
        /// Its value.
        value: u64,
        /// Required alignment.
        align: u64,
    },
    /// Two addresses of the domain map to overlapping bytes.
    #[error("aliasing: {detail}")]
    Aliasing {
        /// Which fields or axes collide and how.
        detail: String,
    },
    /// A quantity that must be a power of two, e.g. an alignment.
    #[error("{what} {value} is not a power of two")]
    NotPowerOfTwo {
        /// The quantity, e.g. `alignment`.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// A stated stride is smaller than what it must contain.
    #[error("{what} = {value} bytes is smaller than the {needed} bytes it must hold")]
    StrideTooSmall {
        /// The stride.
        what: String,
        /// Its value.
        value: u64,
        /// Minimum.
        needed: u64,
    },
    /// The parts of a description do not go together.
    #[error("invalid layout: {0}")]
    Invalid(String),
    /// A preset name that does not exist.
    #[error("unknown preset '{name}'; known presets: {known}")]
    UnknownPreset {
        /// What was asked for.
        name: String,
        /// Comma-separated list of presets.
        known: String,
    },
    /// A name (of a convention, a field) that is not one of the known ones.
    #[error("unknown {what} '{name}'; known: {known}")]
    UnknownName {
        /// What the name names, e.g. `convention`.
        what: &'static str,
        /// What was given.
        name: String,
        /// Comma-separated list of the known names.
        known: String,
    },
    /// A compact spec string that does not parse.
    #[error("spec column {column}: '{token}': {reason}")]
    Spec {
        /// 1-based column of the bad token.
        column: usize,
        /// The token.
        token: String,
        /// Why it is wrong.
        reason: String,
    },
    /// A JSON document that does not describe a layout.
    #[error("layout JSON: {0}")]
    Json(String),
    /// A coordinate outside the layout's domain.
    #[error("{axis} index {value} is out of range (limit {limit}){}", per_layer_hint(axis, *limit))]
    OutOfRange {
        /// The axis.
        axis: &'static str,
        /// The index given.
        value: u64,
        /// The exclusive upper bound.
        limit: u64,
    },
    /// A field the layout does not store.
    #[error("this layout has no field '{field}'; it has: {available}")]
    NoSuchField {
        /// Requested field.
        field: String,
        /// The fields it has.
        available: String,
    },
    /// A view that cannot exist without copying.
    #[error("no {convention} view of field {field} without a copy: {reason}")]
    ViewRefused {
        /// The convention asked for.
        convention: String,
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
    /// A transformation whose pre-conditions do not hold.
    #[error("{transform} refused: {reason}")]
    TransformRefused {
        /// The transformation.
        transform: &'static str,
        /// Why.
        reason: String,
    },
    /// A framework tensor does not match what the layout says it must be.
    #[error("tensor does not match the layout: {0}")]
    TensorMismatch(String),
    /// A query's own argument (an empty range, an index of the wrong length or past its axis)
    /// that no layout could answer.
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// A region query whose selection would enumerate more byte ranges than allowed.
    #[error("the selection has {count} byte ranges before merging, more than the limit of {limit}; ask for fewer layers, blocks or heads at a time")]
    TooManyRegions {
        /// Ranges the selection holds before merging.
        count: String,
        /// The most a query may enumerate ([`crate::MAX_REGIONS`]).
        limit: u64,
    },
    /// Two layouts address memory differently.
    #[error("layouts differ: {0}")]
    Mismatch(String),
}

/// The hint of a layer index past a one-layer cache: vLLM's per-layer tensors.
fn per_layer_hint(axis: &str, limit: u64) -> &'static str {
    if axis == "layer" && limit == 1 {
        "; a per-layer tensor (vLLM's one tensor per layer) is described with L=1 and \
         addressed as layer 0"
    } else {
        ""
    }
}

/// Result alias of this crate.
pub type Result<T, E = LayoutError> = std::result::Result<T, E>;

/// Largest byte offset the kernel ABI can carry (`INT64_MAX`).
pub const MAX_OFFSET: u64 = i64::MAX as u64;

/// `v`, or [`LayoutError::ZeroSize`] naming `what` when it is zero.
pub(crate) fn positive(what: &'static str, v: u64) -> Result<u64> {
    if v == 0 {
        Err(LayoutError::ZeroSize { what })
    } else {
        Ok(v)
    }
}

pub(crate) fn mul(a: u64, b: u64, what: impl FnOnce() -> String) -> Result<u64> {
    a.checked_mul(b)
        .filter(|v| *v <= MAX_OFFSET)
        .ok_or_else(|| LayoutError::Overflow {
            what: what(),
            limit: MAX_OFFSET,
        })
}

pub(crate) fn add(a: u64, b: u64, what: impl FnOnce() -> String) -> Result<u64> {
    a.checked_add(b)
        .filter(|v| *v <= MAX_OFFSET)
        .ok_or_else(|| LayoutError::Overflow {
            what: what(),
            limit: MAX_OFFSET,
        })
}

#[cfg(test)]
mod tests {
    use super::LayoutError;

    /// A layer past a one-layer cache says how a per-layer tensor is addressed; other axes
    /// and limits do not.
    #[test]
    fn a_layer_past_a_per_layer_tensor_names_layer_0() {
        let l: crate::KvCacheLayout = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=LBNHC"
            .parse()
            .unwrap();
        let c = crate::Coord::new(crate::Field::K, 3, 0, 0, 0, 0);
        assert_eq!(
            l.offset(&c).unwrap_err().to_string(),
            "layer index 3 is out of range (limit 1); a per-layer tensor (vLLM's one tensor per \
             layer) is described with L=1 and addressed as layer 0"
        );
        let two = LayoutError::OutOfRange {
            axis: "layer",
            value: 3,
            limit: 2,
        };
        assert_eq!(two.to_string(), "layer index 3 is out of range (limit 2)");
        let head = LayoutError::OutOfRange {
            axis: "head",
            value: 3,
            limit: 1,
        };
        assert_eq!(head.to_string(), "head index 3 is out of range (limit 1)");
    }
}
