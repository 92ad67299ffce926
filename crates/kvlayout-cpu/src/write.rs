//! Fast path of `write_kv`: tokens in parallel (slots are distinct, so writes are disjoint),
//! each row converted straight into the cache: a byte copy when the dtypes match, SIMD
//! conversion (via `half`) for f32 <-> f16/bf16, row encoders for fp8/int8 ([`crate::quant`],
//! AVX-512 where present), element-wise encoding for rows that are not contiguous (legacy
//! layouts).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kvlayout::ops::{OpError, WriteShape};
use kvlayout::{DType, Field, FieldMap, KvCacheLayout};
use rayon::prelude::*;

use crate::arch::Isa;
use crate::args::{check_write, WriteKv};
use crate::backend::CpuBackend;
use crate::cache::CacheMut;
use crate::elem::{encode, inline_scale};
use crate::tensor::Activations;

/// Destination buffers shared by the workers, each writing disjoint rows.
#[derive(Clone, Copy)]
struct Dst(*mut u8, usize);
// SAFETY: the pointer is to caller-owned buffers that outlive the workers (the scope of one
// `write_kv`), and nothing in them is tied to a thread.
unsafe impl Send for Dst {}
// SAFETY: shared use only reads the pointer and length; writes through it go by `slice`,
// whose callers write disjoint byte ranges (distinct slots of an injective layout).
unsafe impl Sync for Dst {}

impl Dst {
    /// `len` bytes at `off`, bounds-checked.
    ///
    /// # Safety
    /// No other live reference may cover these bytes (guaranteed by distinct slots), and the
    /// buffer `Dst` points to (`self.1` bytes) must be live and writable for as long as the
    /// slice is used.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.1),
            "row inside its buffer"
        );
        // SAFETY: `off + len <= self.1` (asserted, without overflow), so the range lies inside
        // the live buffer of `self.1` bytes; no other reference covers it (the caller's
        // contract).
        unsafe { std::slice::from_raw_parts_mut(self.0.add(off), len) }
    }
}

/// One row to write: `x[start .. start + width]`, divided by the per-tensor scale `tensor`
/// and the row's inline scale `q`.
struct RowSrc<'a, 'x> {
    x: &'a Activations<'x>,
    start: usize,
    width: usize,
    tensor: f32,
    q: f32,
}

/// Writes a row's source into a contiguous row of `dtype` (the same operations, in the same
/// order, as the reference).
fn write_row(isa: Isa, row: &mut [u8], dtype: DType, src: &RowSrc<'_, '_>, scratch: &mut Vec<f32>) {
    let RowSrc {
        x,
        start,
        width,
        tensor,
        q,
    } = *src;
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

/// One tensor to write (keys or the latent, values): the field it goes to, its inline-scale
/// field (`kv-scaled`), the activations, elements per head, and the per-tensor scale.
struct Part<'x> {
    map: FieldMap,
    scale: Option<FieldMap>,
    src: Activations<'x>,
    width: usize,
    tensor: f32,
}

/// The parts of a validated write.
fn parts<'x>(
    layout: &KvCacheLayout,
    w: &WriteKv<'x>,
    shape: &WriteShape,
) -> Result<Vec<Part<'x>>, OpError> {
    let sc = layout.scales();
    let scaled = layout.content().inline_scales();
    let scale_map = |f| {
        if scaled {
            layout.field_map(f).ok()
        } else {
            None
        }
    };
    let first = if shape.mla { Field::Latent } else { Field::K };
    let mut parts = vec![Part {
        map: layout.field_map(first)?,
        scale: scale_map(Field::KScale),
        src: w.key,
        width: shape.k_width,
        tensor: sc.k_scale,
    }];
    if let Some(v) = w.value {
        parts.push(Part {
            map: layout.field_map(Field::V)?,
            scale: scale_map(Field::VScale),
            src: v,
            width: shape.v_width,
            tensor: sc.v_scale,
        });
    }
    Ok(parts)
}

/// A validated write, shared by the workers (one token each).
struct Writer<'x> {
    isa: Isa,
    dtype: DType,
    layer: u64,
    block_size: u64,
    heads: usize,
    parts: Vec<Part<'x>>,
    bufs: Vec<Dst>,
}

impl Writer<'_> {
    /// Writes every head of token `t` into `slot` (padding, negative, is skipped).
    fn token(&self, t: usize, slot: i64, scratch: &mut Vec<f32>) {
        if slot < 0 {
            return;
        }
        let (b, n) = (slot as u64 / self.block_size, slot as u64 % self.block_size);
        for h in 0..self.heads {
            for part in &self.parts {
                let start = (t * self.heads + h) * part.width;
                self.row(part, (b, h as u64, n), start, scratch);
            }
        }
    }

    /// Writes one row of a part (and its inline scale) at `(block, head, slot)`.
    fn row(
        &self,
        part: &Part<'_>,
        (b, h, n): (u64, u64, u64),
        start: usize,
        scratch: &mut Vec<f32>,
    ) {
        let m = &part.map;
        let buf = self.bufs[m.strides.buffer as usize];
        let mut q = 1.0f32;
        if let Some(sm) = &part.scale {
            scratch.resize(part.width, 0.0);
            part.src.read_into(start, scratch);
            let amax = scratch
                .iter()
                .fold(0f32, |a, v| a.max((v / part.tensor).abs()));
            q = inline_scale(self.dtype, amax);
            let off = sm.offset_unchecked(self.layer, b, h, n, 0) as usize;
            // SAFETY: this (slot, head) scale is written only by this token.
            let out = unsafe { self.bufs[sm.strides.buffer as usize].slice(off, 4) };
            out.copy_from_slice(&q.to_le_bytes());
        }
        if m.row_contiguous() {
            let off = m.offset_unchecked(self.layer, b, h, n, 0) as usize;
            // SAFETY: this (slot, head) row is written only by this token.
            let row = unsafe { buf.slice(off, m.row_bytes() as usize) };
            let src = RowSrc {
                x: &part.src,
                start,
                width: part.width,
                tensor: part.tensor,
                q,
            };
            write_row(self.isa, row, m.dtype, &src, scratch);
        } else {
            let e = m.elem_bytes() as usize;
            for d in 0..part.width {
                let off = m.offset_unchecked(self.layer, b, h, n, d as u64) as usize;
                // SAFETY: this element is written only by this token.
                let out = unsafe { buf.slice(off, e) };
                encode(m.dtype, part.src.get(start + d) / part.tensor / q, out);
            }
        }
    }
}

/// Writes new tokens' K and V (or MLA latents) at their slots; tokens in parallel (slots are
/// distinct, so rows are disjoint). The CPU backend's `write_kv`.
pub(crate) fn write_tokens(
    be: &CpuBackend,
    cache: &mut CacheMut<'_>,
    w: &WriteKv<'_>,
) -> Result<(), OpError> {
    let shape = check_write(cache.layout, w)?;
    let layout = cache.layout;
    let writer = Writer {
        isa: be.isa,
        dtype: layout.dtype(),
        layer: w.layer,
        block_size: layout.geometry().block_size,
        heads: shape.heads,
        parts: parts(layout, w, &shape)?,
        bufs: cache
            .buffers
            .iter_mut()
            .map(|b| Dst(b.as_mut_ptr(), b.len()))
            .collect(),
    };
    be.pool.install(|| {
        w.slot_mapping
            .par_iter()
            .enumerate()
            .for_each_init(Vec::new, |scratch, (t, &slot)| {
                writer.token(t, slot, scratch)
            });
    });
    Ok(())
}
