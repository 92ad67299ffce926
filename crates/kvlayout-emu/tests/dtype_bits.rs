//! The kernels' element conversions (`kernels-cuda/include/kvl_dtype.h`, compiled for the host
//! and exported as `kvl_emu_encode` / `kvl_emu_decode`) against the CPU crate's encoders
//! (`kvlayout_cpu::elem::{encode, decode}`), bit for bit, for every dtype: every stored pattern
//! of the 1- and 2-byte dtypes decoded; encodes over a strided sweep of the f32 bit patterns,
//! the neighbourhoods of every midpoint between adjacent representable values of each target
//! type (where round to nearest even and half away from zero decide), the saturation and
//! underflow thresholds, and the special values (zeros, subnormals, infinities, NaN payloads).
//! NaNs are compared by their bits. The C side must also write and read exactly
//! `size_bytes` bytes.
//!
//! Sized to run in well under 5 s at opt-level 1.

use kvlayout::DType;
use kvlayout_cpu::elem::{decode, encode};
use strum::IntoEnumIterator;

/// Bytes after the element, which neither side may touch.
const FILL: u8 = 0xA5;

fn kernel_encode(dtype: DType, x: f32) -> [u8; 4] {
    let mut out = [FILL; 4];
    kvlayout_emu::kernel_encode(dtype.abi_code(), x, &mut out);
    out
}

fn kernel_decode(dtype: DType, bytes: &[u8; 4]) -> f32 {
    kvlayout_emu::kernel_decode(dtype.abi_code(), bytes)
}

fn cpu_encode(dtype: DType, x: f32) -> [u8; 4] {
    let mut out = [FILL; 4];
    encode(dtype, x, &mut out);
    out
}

/// Mismatches, with the first few described.
#[derive(Default)]
struct Diffs {
    count: u64,
    checked: u64,
    shown: Vec<String>,
}

impl Diffs {
    fn note(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checked += 1;
        if !ok {
            self.count += 1;
            if self.shown.len() < 20 {
                self.shown.push(what());
            }
        }
    }

    fn assert_none(&self, label: &str) {
        assert!(
            self.count == 0,
            "{label}: {} of {} differ, e.g.\n{}",
            self.count,
            self.checked,
            self.shown.join("\n")
        );
    }
}

fn check_encode(d: &mut Diffs, dtype: DType, bits: u32) {
    let x = f32::from_bits(bits);
    let (want, got) = (cpu_encode(dtype, x), kernel_encode(dtype, x));
    d.note(want == got, || {
        format!("{dtype} encode {bits:#010x} ({x:e}): cpu {want:02x?}, kernel {got:02x?}")
    });
}

#[test]
fn decode_every_stored_pattern() {
    let mut d = Diffs::default();
    for dtype in DType::iter() {
        let patterns: Box<dyn Iterator<Item = u32>> = match dtype.size_bytes() {
            1 => Box::new(0..=0xFF),
            2 => Box::new(0..=0xFFFF),
            // f32 is a byte copy: a strided sample, and the specials.
            _ => Box::new((0..=u32::MAX).step_by(65_537).chain([
                0x7F80_0000,
                0xFF80_0000,
                0x7F80_0001,
                0x7FC0_0000,
                0xFFBF_FFFF,
                0x8000_0000,
                0x0000_0001,
                0x807F_FFFF,
                u32::MAX,
            ])),
        };
        let n = dtype.size_bytes() as usize;
        for p in patterns {
            let mut bytes = [FILL; 4];
            bytes[..n].copy_from_slice(&p.to_le_bytes()[..n]);
            let want = decode(dtype, &bytes).to_bits();
            let got = kernel_decode(dtype, &bytes).to_bits();
            d.note(want == got, || {
                format!("{dtype} decode {p:#x}: cpu {want:#010x}, kernel {got:#010x}")
            });
        }
    }
    d.assert_none("decode");
}

#[test]
fn encode_strided_sweep_and_specials() {
    let mut d = Diffs::default();
    // A prime stride, so every exponent and many mantissa tails are visited (~8.4M patterns).
    let mut pats: Vec<u32> = (0..=u32::MAX).step_by(509).collect();
    pats.push(u32::MAX);
    for sign in [0u32, 0x8000_0000] {
        // NaNs: every value of the top 10 mantissa bits (all that f16/bf16/e5m2 keep), with
        // several low tails; the infinities.
        for top in 0..1024u32 {
            for low in [0u32, 1, 0x1000, 0x1FFF] {
                let m = (top << 13) | low;
                if m != 0 {
                    pats.push(sign | 0x7F80_0000 | m);
                }
            }
        }
        pats.push(sign | 0x7F80_0000);
        // Zero, f32 subnormals, the smallest normals.
        pats.extend((0..4096u32).map(|m| sign | m));
        pats.extend((0..=22).map(|k| sign | (1u32 << k)));
        pats.extend([0x007F_FFFF, 0x0080_0000, 0x0080_0001].map(|b| sign | b));
        // The largest finite f32 and its neighbours.
        pats.extend((0..64u32).map(|k| sign | (0x7F7F_FFFF - k)));
    }
    for dtype in DType::iter() {
        for &b in &pats {
            check_encode(&mut d, dtype, b);
        }
    }
    d.assert_none("encode (sweep and specials)");
}

/// The non-negative finite values of `dtype`'s grid, increasing, and one step past the largest
/// (where the next value would be: the overflow and saturation thresholds lie halfway to it).
fn grid(dtype: DType) -> Vec<f64> {
    let mut v: Vec<f64> = match dtype {
        DType::Int8 => (0..=130).map(f64::from).collect(),
        DType::U8 => (0..=260).map(f64::from).collect(),
        DType::F32 => Vec::new(),
        _ => {
            let top: u32 = if dtype.size_bytes() == 2 {
                0x7FFF
            } else {
                0x7F
            };
            let n = dtype.size_bytes() as usize;
            (0..=top)
                .map(|p| {
                    let mut bytes = [0u8; 4];
                    bytes[..n].copy_from_slice(&p.to_le_bytes()[..n]);
                    f64::from(decode(dtype, &bytes))
                })
                .filter(|x| x.is_finite())
                .collect()
        }
    };
    if matches!(
        dtype,
        DType::F16 | DType::Bf16 | DType::Fp8E4m3 | DType::Fp8E5m2
    ) {
        v.sort_by(f64::total_cmp);
        v.dedup();
        let (max, prev) = (v[v.len() - 1], v[v.len() - 2]);
        v.push(max + (max - prev));
    }
    v
}

#[test]
fn encode_midpoints_and_thresholds() {
    let mut d = Diffs::default();
    for dtype in DType::iter() {
        let g = grid(dtype);
        assert!(
            g.windows(2).all(|w| w[0] < w[1]),
            "{dtype}: grid not increasing"
        );
        // Many midpoints (f16, bf16): a few patterns each side; few (fp8, int8, u8): many.
        let k: i64 = if g.len() > 1000 { 8 } else { 64 };
        let mut centres: Vec<f32> = Vec::new();
        for w in g.windows(2) {
            let m = (w[0] + w[1]) / 2.0;
            assert_eq!(
                f64::from(m as f32),
                m,
                "{dtype}: midpoint {m} is not an f32"
            );
            centres.push(m as f32);
        }
        // The representable values themselves, where a grid has few.
        if g.len() <= 1000 {
            centres.extend(g.iter().map(|&v| v as f32).filter(|v| v.is_finite()));
        }
        for c in centres {
            for sign in [0u32, 0x8000_0000] {
                let centre = i64::from(c.to_bits() | sign);
                for b in centre - k..=centre + k {
                    if let Ok(b) = u32::try_from(b) {
                        check_encode(&mut d, dtype, b);
                    }
                }
            }
        }
    }
    // Thresholds named by the encoders, for every dtype: fp8 saturation (464, 61440) and
    // underflow (2^-10, 2^-17), the f16 overflow (65520), the int8/u8 clamps.
    let thresholds = [
        464.0f32,
        480.0,
        448.0,
        61440.0,
        57344.0,
        65504.0,
        65520.0,
        65536.0,
        126.5,
        127.5,
        254.5,
        255.5,
        0.5,
        1.0 / 1024.0,
        1.0 / 131_072.0,
        1.0 / 16_777_216.0,
        1.0 / 33_554_432.0,
    ];
    for dtype in DType::iter() {
        for t in thresholds {
            for sign in [0u32, 0x8000_0000] {
                let c = i64::from(t.to_bits() | sign);
                for b in c - 16..=c + 16 {
                    check_encode(&mut d, dtype, b as u32);
                }
            }
        }
    }
    d.assert_none("encode (midpoints and thresholds)");
}
