//! `kvlayout fill`: writes a cache of a layout, filled with a pattern, as a dump (see
//! [`crate::dump`]).
//!
//! Every element is written at the offset the layout's address map gives it (each stored
//! field's `FieldMap`, over its own extents); bytes outside every field (padding) hold zero.
//! The patterns:
//!
//! - `coords`: element `dim` of field `f` at `(layer, block, head, slot)` holds the integer
//!   `(i + code(f)) mod M(dtype)`, where `i = (((layer * B + block) * H + head) * S + slot) *
//!   W + dim` counts the field's elements in that order (`B`, `H`, `S`, `W`: the field's
//!   blocks, heads, slots per block and row width), `code` is `k 0, v 1, k_scale 2, v_scale
//!   3, latent 4, bytes 5, conv 6, ssm 7`, and `M` is the count of integers from 0 the dtype
//!   holds exactly: f32 2^24, f16 2^11, bf16 2^8, fp8_e4m3 2^4, fp8_e5m2 2^3, int8 2^7, u8
//!   2^8. A reader recomputes it for any element and compares.
//! - `random`: seeded xorshift values, the same on every machine: uniform in [-1, 1) for
//!   float data, integers in [-127, 127] for int8, any byte for opaque bytes, and in [0.5, 2)
//!   for inline scales.
//!
//! It owns the patterns; the addresses are the layout's, the file format is [`crate::dump`]'s.

use std::path::PathBuf;

use kvlayout::{DType, Field, KvCacheLayout};
use kvlayout_cpu::elem::encode;
use serde::Serialize;

use crate::common::limits;
use crate::common::rng::Rng;
use crate::common::units;
use crate::dump::{self, Dump};
use crate::CliError;

/// What `kvlayout fill` was asked for (besides the spec).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct FillArgs {
    /// What the elements hold: coords (a value computed from each element's coordinates, see
    /// the README) or random (seeded).
    #[arg(long, value_name = "PATTERN")]
    pub pattern: String,
    /// Seed of the random pattern.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The dump to write (safetensors).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Largest cache to write, in GiB (each element is written on its own: about a second per
    /// GiB).
    #[arg(long, value_name = "GIB", default_value_t = 1.0)]
    pub max_cache_gib: f64,
    /// Print the record as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Coords,
    Random,
}

/// The `code` of a field in the coords pattern: its ABI code (`KVL_FIELD_*`, k 0 .. ssm 7).
pub(crate) fn field_code(f: Field) -> u64 {
    kvlayout::field_code(f).unsigned_abs().into()
}

/// How many integers from 0 a dtype holds exactly (the coords pattern's modulus).
pub(crate) fn exact_integers(d: DType) -> u64 {
    match d {
        DType::F32 => 1 << 24,
        DType::F16 => 1 << 11,
        DType::Bf16 | DType::U8 => 1 << 8,
        DType::Fp8E4m3 => 1 << 4,
        DType::Fp8E5m2 => 1 << 3,
        DType::Int8 => 1 << 7,
    }
}

/// One field as the coords pattern fills it, for the report.
#[derive(Debug, Serialize)]
struct FieldRecord {
    field: String,
    dtype: String,
    buffer: u32,
    /// `[layers, blocks, heads, slots, width]`: the extents `i` counts over.
    extents: [u64; 5],
    code: u64,
    modulus: u64,
}

/// What `fill` wrote.
#[derive(Debug, Serialize)]
struct FillRecord {
    out: String,
    layout: String,
    pattern: String,
    /// Bytes of each buffer (tensor `buffer<i>`).
    buffer_bytes: Vec<u64>,
    /// What bytes outside every field hold.
    padding: &'static str,
    fields: Vec<FieldRecord>,
}

/// One element of `field` in a random fill: scales in [0.5, 2), integers over their range,
/// floats in [-1, 1).
fn random_value(rng: &mut Rng, field: Field, dtype: DType) -> f32 {
    match (field, dtype) {
        (Field::KScale | Field::VScale, _) => 0.5 + 1.5 * rng.unit(),
        (_, DType::Int8) => (rng.next_u64() % 255) as f32 - 127.0,
        (_, DType::U8) => (rng.next_u64() % 256) as f32,
        _ => 2.0 * rng.unit() - 1.0,
    }
}

/// Zeroed buffers of the layout, refused past `max_gib` or where memory cannot be had.
pub(crate) fn zeroed_buffers(
    layout: &KvCacheLayout,
    max_gib: f64,
) -> Result<Vec<Vec<u8>>, CliError> {
    limits::gib("--max-cache-gib", max_gib)?;
    let total: u64 = layout
        .extents()
        .iter()
        .fold(0u64, |n, x| n.saturating_add(x.end));
    let gib = units::gib(total);
    if gib > max_gib {
        return Err(CliError::Usage(format!(
            "the layout's buffers take {gib:.2} GiB, more than --max-cache-gib {max_gib}; lower \
             B or L in the spec"
        )));
    }
    layout
        .extents()
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let mut b = Vec::new();
            usize::try_from(x.end)
                .ok()
                .and_then(|n| b.try_reserve_exact(n).ok().map(|()| n))
                .map(|n| {
                    b.resize(n, 0);
                    b
                })
                .ok_or_else(|| {
                    CliError::Failed(format!("cannot allocate buffer {i} ({} bytes)", x.end))
                })
        })
        .collect()
}

/// Writes every element of every stored field of `layout` into `buffers`.
fn fill(layout: &KvCacheLayout, buffers: &mut [Vec<u8>], pattern: Pattern, seed: u64) {
    let mut rng = Rng::seeded(seed);
    for m in layout.stored_fields() {
        let buf = &mut buffers[m.strides.buffer as usize];
        let size = m.elem_bytes() as usize;
        let (code, modulus) = (field_code(m.field), exact_integers(m.dtype));
        let mut i: u64 = 0;
        for l in 0..m.num_layers {
            for b in 0..m.num_blocks {
                for h in 0..m.num_heads {
                    for s in 0..m.num_slots {
                        for d in 0..m.width {
                            let at = m.offset_unchecked(l, b, h, s, d) as usize;
                            let x = match pattern {
                                Pattern::Coords => ((i + code) % modulus) as f32,
                                Pattern::Random => random_value(&mut rng, m.field, m.dtype),
                            };
                            encode(m.dtype, x, &mut buf[at..at + size]);
                            i += 1;
                        }
                    }
                }
            }
        }
    }
}

/// `fill`: writes the dump and says what it holds.
pub(crate) fn run(layout: KvCacheLayout, a: &FillArgs) -> Result<String, CliError> {
    let pattern = match a.pattern.as_str() {
        "coords" => Pattern::Coords,
        "random" => Pattern::Random,
        other => {
            return Err(CliError::Usage(format!(
                "--pattern {other:?} is no pattern (patterns: coords, random)"
            )))
        }
    };
    let mut buffers = zeroed_buffers(&layout, a.max_cache_gib)?;
    fill(&layout, &mut buffers, pattern, a.seed);
    let pattern_name = match pattern {
        Pattern::Coords => "coords".to_string(),
        Pattern::Random => format!("random seed={}", a.seed),
    };
    let record = FillRecord {
        out: a.out.display().to_string(),
        layout: layout.to_string(),
        pattern: pattern_name.clone(),
        buffer_bytes: buffers.iter().map(|b| b.len() as u64).collect(),
        padding: "zero",
        fields: layout
            .stored_fields()
            .iter()
            .map(|m| FieldRecord {
                field: m.field.to_string(),
                dtype: m.dtype.to_string(),
                buffer: m.strides.buffer,
                extents: [
                    m.num_layers,
                    m.num_blocks,
                    m.num_heads,
                    m.num_slots,
                    m.width,
                ],
                code: field_code(m.field),
                modulus: exact_integers(m.dtype),
            })
            .collect(),
    };
    let dump = Dump {
        layout,
        buffers,
        pattern: Some(pattern_name),
        step: None,
    };
    dump::write::write(&dump, &a.out, &format!("fill --pattern {}", a.pattern))?;
    if a.json {
        return crate::json(&record);
    }
    let mut text = format!(
        "wrote {}: {} ({} buffers: {:?} bytes), pattern {}, padding zero\n",
        record.out,
        record.layout,
        record.buffer_bytes.len(),
        record.buffer_bytes,
        record.pattern
    );
    if pattern == Pattern::Coords {
        for f in &record.fields {
            let [_, b, h, s, w] = f.extents;
            text.push_str(&format!(
                "  {} ({}, buffer {}): (i + {}) mod {}, i = (((layer*{b} + block)*{h} + \
                 head)*{s} + slot)*{w} + dim\n",
                f.field, f.dtype, f.buffer, f.code, f.modulus
            ));
        }
    }
    Ok(text)
}
