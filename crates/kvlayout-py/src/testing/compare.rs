//! The conformance suite's comparisons with the scalar reference: the reference's decode with
//! the magnitude of each output row, the contract's decode tolerance
//! (`kvlayout_cpu::tolerance`), and the suite's check of a write (values within one
//! quantization step, no byte changed outside the written elements).

use kvlayout::ops::{check_slot_mapping, decode_widths, DecodeParams, OpError};
use kvlayout::{Coord, DType, Field, KvCacheLayout, LayoutError};
use kvlayout_cpu::tolerance::{decode_error as suite_decode_error, Magnitude, Tolerance};
use kvlayout_cpu::{reference, CacheRef, Decode};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::backend::{cache_arg, decode_slices, index_arg, DecodeObjects};
use crate::errors::raise;
use crate::memory::{typed, Call};

/// The module's comparison functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(reference_decode, m)?)?;
    m.add_function(wrap_pyfunction!(decode_tolerance, m)?)?;
    m.add_function(wrap_pyfunction!(decode_error, m)?)?;
    m.add_function(wrap_pyfunction!(write_error, m)?)?;
    Ok(())
}

fn shape_error(what: &str, expected: String, got: String) -> PyErr {
    raise(OpError::Shape {
        what: what.into(),
        expected,
        got,
    })
}

fn dtype(name: &str) -> PyResult<DType> {
    name.parse::<DType>().map_err(|_| {
        raise(LayoutError::UnknownName {
            what: "dtype",
            name: name.to_string(),
            known: "f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8, u8".into(),
        })
    })
}

/// The reference's output (f32 elements as bytes) and each row's `(values, logits)` magnitudes.
type Decoded<'py> = (Bound<'py, PyBytes>, Vec<(f64, f64)>);

/// The scalar reference's decode of one layer (``kvlayout.open("reference")``'s, in f64)
/// on ``cache`` (a ``kvlayout.Cache``), with the magnitudes the contract's tolerance scales
/// with: returns ``(out, magnitudes)``, ``out`` the f32 output ``[seqs, num_q_heads,
/// v_width]`` as bytes, ``magnitudes`` one ``(values, logits)`` per output row (sequence,
/// query head): the largest ``|v|`` attended and the largest ``scale * sum |q_i k_i|``.
#[pyfunction]
#[pyo3(signature = (cache, query, block_table, seq_lens, num_q_heads, scale, layer=0,
                    sliding_window=None, soft_cap=None))]
// Python's keyword arguments: one Rust parameter each.
#[allow(clippy::too_many_arguments)]
fn reference_decode<'py>(
    py: Python<'py>,
    cache: &Bound<'py, PyAny>,
    query: &Bound<'py, PyAny>,
    block_table: &Bound<'py, PyAny>,
    seq_lens: &Bound<'py, PyAny>,
    num_q_heads: u64,
    scale: f32,
    layer: u64,
    sliding_window: Option<u64>,
    soft_cap: Option<f32>,
) -> PyResult<Decoded<'py>> {
    let objects = DecodeObjects {
        cache,
        query,
        block_table,
        seq_lens,
    };
    let inputs = objects.read(py)?;
    let layout = inputs.cache.layout.get().inner.clone();
    let (kw, vw) = decode_widths(&layout).map_err(raise)?;
    inputs.check_query(num_q_heads, kw)?;
    let blocks_per_seq = inputs.blocks_per_seq;
    let mut out = vec![0f32; (inputs.seqs * num_q_heads * vw) as usize];
    let mut call = inputs.into_call(vec![])?;
    let (reads, _) = call.slices();
    let (query, block_table, seq_lens, bufs) = decode_slices(&reads)?;
    let params = DecodeParams {
        num_q_heads,
        scale,
        sliding_window,
        soft_cap,
    };
    let mags = py
        .detach(|| {
            let cache = CacheRef::new(&layout, bufs)?;
            let d = Decode {
                layer,
                query,
                block_table,
                blocks_per_seq,
                seq_lens,
                params,
            };
            reference::paged_decode_magnitudes(&cache, &d, &mut out)
        })
        .map_err(raise)?;
    let mags = mags.iter().map(|m| (m.values, m.logits)).collect();
    Ok((PyBytes::new(py, bytemuck::cast_slice(&out)), mags))
}

/// ``(relative, per_logit)``: the decode tolerance the backend contract allows for a cache of
/// ``dtype`` (``kvlayout_cpu::Tolerance::contract``). An output element of a row of
/// magnitudes ``(values, logits)`` may differ from the reference by
/// ``values * (relative + per_logit * logits)``.
#[pyfunction]
fn decode_tolerance(dtype: &str) -> PyResult<(f64, f64)> {
    let t = Tolerance::contract(self::dtype(dtype)?);
    Ok((t.relative, t.per_logit))
}

fn f32s(what: &str, b: &[u8]) -> PyResult<Vec<f32>> {
    if !b.len().is_multiple_of(4) {
        let got = format!("{} bytes", b.len());
        return Err(shape_error(what, "whole f32 elements".into(), got));
    }
    Ok(bytemuck::pod_collect_to_vec(b))
}

/// Compares a decode output with the reference's as the conformance suite does
/// (``kvlayout_cpu::tolerance::decode_error`` with the contract's tolerance for a cache of
/// ``dtype``): ``got`` and ``want`` are f32 elements as bytes, rows of ``len(want) /
/// len(magnitudes)`` elements. Returns a dict: ``ratio`` (the worst ``|got - want| / bound``;
/// at most 1 passes, infinite for a non-finite output or a length mismatch), ``relative``
/// (the worst difference over its row's values' magnitude), ``worst`` (``(index, got,
/// want)`` or ``None``), ``bound`` (the bound at the worst element), ``passed``.
#[pyfunction]
fn decode_error<'py>(
    py: Python<'py>,
    got: &[u8],
    want: &[u8],
    magnitudes: Vec<(f64, f64)>,
    dtype: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let tol = Tolerance::contract(self::dtype(dtype)?);
    let (got, want) = (f32s("got", got)?, f32s("want", want)?);
    let mags: Vec<Magnitude> = magnitudes
        .iter()
        .map(|&(values, logits)| Magnitude { values, logits })
        .collect();
    let e = suite_decode_error(&got, &want, &mags, tol);
    let row = want.len() / mags.len().max(1);
    let bound = e
        .worst
        .and_then(|(i, _, _)| mags.get(i / row.max(1)))
        .map(|m| tol.bound(m));
    let d = PyDict::new(py);
    d.set_item("ratio", e.ratio)?;
    d.set_item("relative", e.relative)?;
    d.set_item("worst", e.worst)?;
    d.set_item("bound", bound)?;
    d.set_item("passed", e.passed())?;
    Ok(d)
}

/// The fields a write stores, with their widths: the latent (MLA), or K and V, and their
/// inline scales (one element per row).
fn written_fields(l: &KvCacheLayout) -> Result<Vec<(Field, u64)>, OpError> {
    let (kw, vw) = decode_widths(l)?;
    let c = l.content();
    let mut out = if c.shares_latent() {
        vec![(Field::Latent, kw)]
    } else {
        vec![(Field::K, kw), (Field::V, vw)]
    };
    if c.inline_scales() {
        out.extend([(Field::KScale, 1), (Field::VScale, 1)]);
    }
    Ok(out)
}

/// The suite's check of a write into `got` against the reference's write into `want` (both
/// from the same bytes): `None`, or the first disagreement in words.
fn check_write(
    got: &CacheRef<'_>,
    want: &CacheRef<'_>,
    slots: &[i64],
    layer: u64,
) -> Result<Option<String>, OpError> {
    let l = got.layout();
    let g = *l.geometry();
    let bs = g.block_size as i64;
    let fields = written_fields(l)?;
    let written: Vec<i64> = slots.iter().copied().filter(|s| *s >= 0).collect();
    // Which bytes the write stores.
    let mut mask: Vec<Vec<bool>> = got.buffers().iter().map(|b| vec![false; b.len()]).collect();
    for &slot in &written {
        let (b, n) = ((slot / bs) as u64, (slot % bs) as u64);
        for h in 0..g.num_kv_heads {
            for &(field, width) in &fields {
                let e = l.field_map(field)?.elem_bytes() as usize;
                for d in 0..width {
                    let at = l.offset(&Coord::new(field, layer, b, h, n, d))?;
                    let (buf, o) = (at.buffer as usize, at.offset as usize);
                    mask[buf][o..o + e].fill(true);
                }
            }
        }
    }
    for (i, m) in mask.iter().enumerate() {
        let (a, z) = (got.buffers()[i], want.buffers()[i]);
        // Both buffers hold at least the layout's extent (`CacheRef::new`).
        let end = l.extents()[i].end as usize;
        let outside = (0..end).find(|&o| !m[o] && a[o] != z[o]);
        if let Some(o) = outside {
            return Ok(Some(format!(
                "byte {o} of buffer {i}, outside every element the write stores, changed: \
                 {:#04x}, the reference leaves {:#04x}",
                a[o], z[o]
            )));
        }
    }
    // Each written value within one quantization step of the reference's.
    let step = l.dtype().epsilon();
    for &slot in &written {
        let (b, n) = ((slot / bs) as u64, (slot % bs) as u64);
        for h in 0..g.num_kv_heads {
            for &(field, width) in fields.iter().filter(|f| !is_scale(f.0)) {
                let at = |d| Coord::new(field, layer, b, h, n, d);
                let want_row: Vec<f64> = (0..width)
                    .map(|d| reference::value_at(want, &at(d)))
                    .collect();
                let amax = want_row.iter().fold(0f64, |a, x| a.max(x.abs()));
                for (d, &x) in want_row.iter().enumerate() {
                    let y = reference::value_at(got, &at(d as u64));
                    let bound = step * x.abs().max(amax) + 1e-12;
                    if (y - x).abs() > bound || y.is_nan() != x.is_nan() {
                        return Ok(Some(format!(
                            "slot {slot} (block {b}, token {n}) head {h} {field}[{d}] = {y}, \
                             reference {x} (one step: {step} x {amax})"
                        )));
                    }
                }
            }
        }
    }
    Ok(None)
}

fn is_scale(f: Field) -> bool {
    matches!(f, Field::KScale | Field::VScale)
}

/// Checks a write into cache ``got`` against the reference's write of the same tokens into
/// cache ``want`` (both ``kvlayout.Cache`` of one layout, holding the same bytes before the
/// writes), as the conformance suite does: no byte outside the elements the write stores
/// differs, and every stored value (decoded with its scales) lies within one quantization
/// step of the reference's (``epsilon(dtype) * max(|want|, max |want| of its row)``).
/// Returns ``None`` or the first disagreement in words.
#[pyfunction]
#[pyo3(signature = (got, want, slot_mapping, layer=0))]
fn write_error(
    py: Python<'_>,
    got: &Bound<'_, PyAny>,
    want: &Bound<'_, PyAny>,
    slot_mapping: &Bound<'_, PyAny>,
    layer: u64,
) -> PyResult<Option<String>> {
    let g = cache_arg(got, "got")?;
    let w = cache_arg(want, "want")?;
    let layout = g.layout.get().inner.clone();
    if w.layout.get().inner != layout {
        let reason = format!("got is {layout}, want is {}", w.layout.get().inner);
        return Err(raise(OpError::Incompatible(reason)));
    }
    let ng = g.buffers.len();
    let mut reads = vec![index_arg(py, slot_mapping, "i64", "slot_mapping")?];
    reads.extend(g.buffers);
    reads.extend(w.buffers);
    let mut call = Call::new(reads, vec![])?;
    let (reads, _) = call.slices();
    let slots = typed::<i64>(reads[0].0, reads[0].1)?;
    let bufs: Vec<&[u8]> = reads[1..].iter().map(|(_, b)| *b).collect();
    let (gb, wb) = bufs.split_at(ng);
    py.detach(|| {
        check_slot_mapping(&layout, slots)?;
        let n = layout.num_buffers();
        if gb.len() != n || wb.len() != n {
            let (a, z) = (gb.len(), wb.len());
            let reason = format!("{n} buffers expected, got {a} and {z}");
            return Err(OpError::Incompatible(reason));
        }
        let gc = CacheRef::new(&layout, gb.to_vec())?;
        let wc = CacheRef::new(&layout, wb.to_vec())?;
        if layer >= layout.geometry().num_layers {
            return Err(LayoutError::OutOfRange {
                axis: "layer",
                value: layer,
                limit: layout.geometry().num_layers,
            }
            .into());
        }
        check_write(&gc, &wc, slots, layer)
    })
    .map_err(raise)
}
