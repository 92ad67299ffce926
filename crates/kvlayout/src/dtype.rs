//! Element types a KV cache can store, and the per-tensor scales that belong to them.

use serde::{Deserialize, Serialize};
use strum::{Display, EnumIter, EnumString, IntoStaticStr};

/// The element type of a field.
///
/// `U8` is used only for opaque byte rows (for example vLLM's 656-byte `fp8_ds_mla` row),
/// whose inner structure the descriptor does not interpret.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Display,
    EnumString,
    EnumIter,
    IntoStaticStr,
    Serialize,
    Deserialize,
)]
#[strum(serialize_all = "snake_case", ascii_case_insensitive)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit float, 4 exponent and 3 mantissa bits (OCP e4m3fn).
    #[strum(serialize = "fp8_e4m3", serialize = "fp8e4m3")]
    #[serde(rename = "fp8_e4m3")]
    Fp8E4m3,
    /// 8-bit float, 5 exponent and 2 mantissa bits.
    #[strum(serialize = "fp8_e5m2", serialize = "fp8e5m2")]
    #[serde(rename = "fp8_e5m2")]
    Fp8E5m2,
    /// Signed 8-bit integer (used with inline per-token-head scales).
    Int8,
    /// Opaque byte (opaque rows only).
    U8,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::Fp8E4m3 | DType::Fp8E5m2 | DType::Int8 | DType::U8 => 1,
        }
    }

    /// The vLLM paged-attention vector width `x = 16 / element_size` (bug class 12: never
    /// derived from the block size).
    pub const fn vllm_x(self) -> u64 {
        16 / self.size_bytes()
    }

    /// Whether values of this type are quantized and can carry inline scales.
    pub const fn is_quantized(self) -> bool {
        matches!(self, DType::Fp8E4m3 | DType::Fp8E5m2 | DType::Int8)
    }

    /// Spacing of representable values just above 1.0 (machine epsilon); for int8, one step of
    /// a symmetric scale (1/127). Backends derive their numeric tolerances from it.
    pub fn epsilon(self) -> f64 {
        match self {
            DType::F32 => f64::from(f32::EPSILON),
            DType::F16 => half::f16::EPSILON.to_f64(),
            DType::Bf16 => half::bf16::EPSILON.to_f64(),
            DType::Fp8E4m3 => 0.125,
            DType::Fp8E5m2 => 0.25,
            DType::Int8 => 1.0 / 127.0,
            DType::U8 => 1.0,
        }
    }

    /// Stable numeric code used in the kernel ABI (`KVL_DTYPE_*` in the C header).
    pub const fn abi_code(self) -> i32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Bf16 => 2,
            DType::Fp8E4m3 => 3,
            DType::Fp8E5m2 => 4,
            DType::Int8 => 5,
            DType::U8 => 6,
        }
    }
}

/// Per-tensor dequantization scales for K and V (as in vLLM's `k_scale` / `v_scale`).
///
/// They belong to the description: two caches with different scales hold different values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorScales {
    /// Multiplier applied to stored K values.
    pub k_scale: f32,
    /// Multiplier applied to stored V values.
    pub v_scale: f32,
}

impl Default for TensorScales {
    fn default() -> Self {
        TensorScales {
            k_scale: 1.0,
            v_scale: 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;
    use strum::IntoEnumIterator;

    #[test]
    fn names_round_trip_and_aliases_parse() {
        for d in DType::iter() {
            assert_eq!(DType::from_str(&d.to_string()).unwrap(), d);
        }
        assert_eq!(DType::from_str("fp8e4m3").unwrap(), DType::Fp8E4m3);
        assert_eq!(DType::from_str("BF16").unwrap(), DType::Bf16);
    }

    #[test]
    fn sizes_x_and_epsilon() {
        let x: Vec<u64> = [DType::F32, DType::F16, DType::Bf16, DType::Fp8E4m3]
            .iter()
            .map(|d| d.vllm_x())
            .collect();
        assert_eq!(x, [4, 8, 8, 16]);
        assert_eq!(DType::F16.epsilon(), 2f64.powi(-10));
        assert_eq!(DType::Bf16.epsilon(), 2f64.powi(-7));
        assert_eq!(DType::F32.epsilon(), 2f64.powi(-23));
    }
}
