//! Encoding and decoding of one cache element, for every dtype.
//!
//! fp8 follows NVIDIA's `cuda_fp8.hpp` (round to nearest even, saturate to the largest
//! finite value), as implemented by the `float8` crate; decoding goes through 256-entry tables.

use std::sync::OnceLock;

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use kvlayout::DType;

/// Largest finite magnitude of a quantized dtype (int8: 127).
pub fn quant_max(dtype: DType) -> f32 {
    match dtype {
        DType::Fp8E4m3 => 448.0,
        DType::Fp8E5m2 => 57344.0,
        DType::Int8 => 127.0,
        _ => f32::MAX,
    }
}

fn tables() -> &'static [[f32; 256]; 2] {
    static T: OnceLock<[[f32; 256]; 2]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = [[0f32; 256]; 2];
        let [t4, t5] = &mut t;
        for (b, (e4, e5)) in t4.iter_mut().zip(t5.iter_mut()).enumerate() {
            *e4 = F8E4M3::from_bits(b as u8).to_f32();
            *e5 = F8E5M2::from_bits(b as u8).to_f32();
        }
        t
    })
}

/// The 256 values of an fp8 dtype, indexed by bit pattern.
pub fn fp8_table(dtype: DType) -> &'static [f32; 256] {
    match dtype {
        DType::Fp8E5m2 => &tables()[1],
        _ => &tables()[0],
    }
}

/// Decodes one stored element (little-endian bytes, `dtype.size_bytes()` long) to f32.
#[inline]
pub fn decode(dtype: DType, bytes: &[u8]) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        DType::F16 => f16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
        DType::Bf16 => bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
        DType::Fp8E4m3 | DType::Fp8E5m2 => fp8_table(dtype)[bytes[0] as usize],
        DType::Int8 => f32::from(bytes[0] as i8),
        DType::U8 => f32::from(bytes[0]),
    }
}

/// Encodes an f32 into `out` (`dtype.size_bytes()` long): round to nearest even; int8 rounds
/// half away from zero and saturates at +-127, fp8 saturates at its largest finite value.
#[inline]
pub fn encode(dtype: DType, x: f32, out: &mut [u8]) {
    match dtype {
        DType::F32 => out[..4].copy_from_slice(&x.to_le_bytes()),
        DType::F16 => out[..2].copy_from_slice(&f16::from_f32(x).to_le_bytes()),
        DType::Bf16 => out[..2].copy_from_slice(&bf16::from_f32(x).to_le_bytes()),
        DType::Fp8E4m3 => out[0] = F8E4M3::from_f32(x).to_bits(),
        DType::Fp8E5m2 => out[0] = F8E5M2::from_f32(x).to_bits(),
        DType::Int8 => out[0] = (x.round().clamp(-127.0, 127.0) as i8) as u8,
        DType::U8 => out[0] = x.round().clamp(0.0, 255.0) as u8,
    }
}

/// Scale for one row quantized with an inline scale: `amax / qmax` (1 for an all-zero row).
#[inline]
pub fn inline_scale(dtype: DType, amax: f32) -> f32 {
    if amax > 0.0 {
        amax / quant_max(dtype)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_saturation() {
        let mut b = [0u8; 4];
        for dtype in [
            DType::F32,
            DType::F16,
            DType::Bf16,
            DType::Fp8E4m3,
            DType::Fp8E5m2,
            DType::Int8,
        ] {
            for x in [0.0f32, 1.0, -2.5, 3.0, -0.5] {
                encode(dtype, x, &mut b);
                assert_eq!(
                    decode(dtype, &b),
                    if dtype == DType::Int8 { x.round() } else { x },
                    "{dtype} {x}"
                );
            }
        }
        encode(DType::Fp8E4m3, 1e6, &mut b);
        assert_eq!(decode(DType::Fp8E4m3, &b), 448.0);
        encode(DType::Fp8E4m3, 0.3, &mut b); // e4m3 spacing in [0.25, 0.5) is 1/32
        assert_eq!(decode(DType::Fp8E4m3, &b), 0.3125); // 0.25 + 1.6 steps rounds to 2 steps
        encode(DType::Int8, -300.0, &mut b);
        assert_eq!(decode(DType::Int8, &b), -127.0);
        encode(DType::Fp8E5m2, 1e9, &mut b);
        assert_eq!(decode(DType::Fp8E5m2, &b), 57344.0);
    }
}
