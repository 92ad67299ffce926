//! Fast path of `write_kv`: tokens in parallel (slots are distinct, so writes are disjoint),
//! each row converted straight into the cache: a byte copy when the dtypes match, SIMD
//! conversion (via `half`) for f32 <-> f16/bf16, row encoders for fp8/int8 ([`crate::quant`],
//! AVX-512 where present), element-wise encoding for rows that are not contiguous (legacy
//! layouts).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kvlayout::ops::OpError;
use kvlayout::{Content, DType, Field, FieldMap};
use rayon::prelude::*;

use crate::args::{check_write, WriteKv};
use crate::backend::CpuBackend;
use crate::cache::CacheMut;
use crate::elem::{encode, inline_scale};
use crate::simd::Isa;
use crate::tensor::Activations;

/// Destination buffers shared by the workers, each writing disjoint rows.
#[derive(Clone, Copy)]
struct Dst(*mut u8, usize);
// SAFETY: workers write disjoint byte ranges (distinct slots of an injective layout).
unsafe impl Send for Dst {}
unsafe impl Sync for Dst {}

impl Dst {
    /// `len` bytes at `off`, bounds-checked.
    ///
    /// # Safety
    /// No other live reference may cover these bytes (guaranteed by distinct slots).
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.1, "row inside its buffer");
        std::slice::from_raw_parts_mut(self.0.add(off), len)
    }
}

fn contiguous(m: &FieldMap) -> bool {
    m.strides.dim == m.elem_bytes() && m.strides.dim_split == m.width
}

/// Writes `x[start .. start + width] / tensor / q` into a contiguous row of `dtype` (the same
/// operations, in the same order, as the reference).
#[allow(clippy::too_many_arguments)]
fn write_row(
    isa: Isa,
    row: &mut [u8],
    dtype: DType,
    x: &Activations<'_>,
    start: usize,
    width: usize,
    (tensor, q): (f32, f32),
    scratch: &mut Vec<f32>,
) {
    if tensor == 1.0 && q == 1.0 {
        match (x, dtype) {
            (Activations::F32(v), DType::F32) => {
                return row.copy_from_slice(bytemuck::cast_slice(&v[start..start + width]))
            }
            (Activations::F16(v), DType::F16) => {
                return row.copy_from_slice(bytemuck::cast_slice(&v[start..start + width]))
            }
            (Activations::Bf16(v), DType::Bf16) => {
                return row.copy_from_slice(bytemuck::cast_slice(&v[start..start + width]))
            }
            (Activations::F32(v), DType::F16) => {
                return bytemuck::cast_slice_mut::<u8, f16>(row)
                    .convert_from_f32_slice(&v[start..start + width])
            }
            (Activations::F32(v), DType::Bf16) => {
                return bytemuck::cast_slice_mut::<u8, bf16>(row)
                    .convert_from_f32_slice(&v[start..start + width])
            }
            (_, DType::F32) => return x.read_into(start, bytemuck::cast_slice_mut::<u8, f32>(row)),
            _ => {}
        }
    }
    scratch.resize(width, 0.0);
    x.read_into(start, scratch);
    crate::quant::encode_row(isa, dtype, scratch, tensor, q, row);
}

pub(crate) fn write_kv(
    be: &CpuBackend,
    cache: &mut CacheMut<'_>,
    w: &WriteKv<'_>,
) -> Result<(), OpError> {
    let shape = check_write(cache.layout, w)?;
    let layout = cache.layout;
    let bs = layout.geometry().block_size;
    let dtype = layout.dtype();
    let sc = layout.scales();
    let scaled = matches!(layout.content(), Content::KvScaled { .. });
    let mut parts: Vec<(FieldMap, Option<FieldMap>, Activations<'_>, usize, f32)> = Vec::new();
    let first = if shape.mla { Field::Latent } else { Field::K };
    let scale_map = |f| {
        if scaled {
            layout.field_map(f).ok()
        } else {
            None
        }
    };
    parts.push((
        layout.field_map(first)?,
        scale_map(Field::KScale),
        w.key,
        shape.k_width,
        sc.k_scale,
    ));
    if let Some(v) = w.value {
        parts.push((
            layout.field_map(Field::V)?,
            scale_map(Field::VScale),
            v,
            shape.v_width,
            sc.v_scale,
        ));
    }
    let bufs: Vec<Dst> = cache
        .buffers
        .iter_mut()
        .map(|b| Dst(b.as_mut_ptr(), b.len()))
        .collect();
    let heads = shape.heads;
    be.pool.install(|| {
        w.slot_mapping
            .par_iter()
            .enumerate()
            .for_each_init(Vec::new, |scratch, (t, &slot)| {
                if slot < 0 {
                    return;
                }
                let (b, n) = (slot as u64 / bs, slot as u64 % bs);
                for h in 0..heads {
                    for (m, scale_m, src, width, tensor) in &parts {
                        let start = (t * heads + h) * width;
                        let buf = bufs[m.strides.buffer as usize];
                        let e = m.elem_bytes() as usize;
                        let mut q = 1.0f32;
                        if let Some(sm) = scale_m {
                            scratch.resize(*width, 0.0);
                            src.read_into(start, scratch);
                            let amax = scratch.iter().fold(0f32, |a, v| a.max((v / tensor).abs()));
                            q = inline_scale(dtype, amax);
                            let off = sm.offset_unchecked(w.layer, b, h as u64, n, 0) as usize;
                            // SAFETY: this (slot, head) scale is written only by this token.
                            let out = unsafe { bufs[sm.strides.buffer as usize].slice(off, 4) };
                            out.copy_from_slice(&q.to_le_bytes());
                        }
                        if contiguous(m) {
                            let off = m.offset_unchecked(w.layer, b, h as u64, n, 0) as usize;
                            // SAFETY: this (slot, head) row is written only by this token.
                            let row = unsafe { buf.slice(off, width * e) };
                            write_row(
                                be.isa,
                                row,
                                m.dtype,
                                src,
                                start,
                                *width,
                                (*tensor, q),
                                scratch,
                            );
                        } else {
                            for d in 0..*width {
                                let off =
                                    m.offset_unchecked(w.layer, b, h as u64, n, d as u64) as usize;
                                // SAFETY: this element is written only by this token.
                                let out = unsafe { buf.slice(off, e) };
                                encode(m.dtype, src.get(start + d) / tensor / q, out);
                            }
                        }
                    }
                }
            });
    });
    Ok(())
}
