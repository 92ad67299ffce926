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
