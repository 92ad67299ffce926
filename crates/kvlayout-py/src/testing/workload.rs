//! The conformance suite's deterministic workload of a layout
//! (`kvlayout_conformance::cases::workload`), seeded through the case's name, as bytes and
//! shapes for `kvlayout.testing.workload` to make numpy arrays of.

use kvlayout::ops::HostTensor;
use kvlayout::{DType, KvCacheLayout, LayoutError};
use kvlayout_conformance::cases::{activation_dtype, case_from_spec, workload as suite_workload};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::errors::raise;
use crate::layout::Layout;

/// The module's workload function.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(workload, m)?)?;
    Ok(())
}

/// `(bytes, dtype name, shape)` of a host tensor, its elements in native byte order.
fn tensor<'py>(
    py: Python<'py>,
    t: &HostTensor,
    shape: Vec<usize>,
) -> (Bound<'py, PyBytes>, &'static str, Vec<usize>) {
    let (bytes, name): (&[u8], _) = match t {
        HostTensor::F32(x) => (bytemuck::cast_slice(x), "f32"),
        HostTensor::F16(x) => (bytemuck::cast_slice(x), "f16"),
        HostTensor::Bf16(x) => (bytemuck::cast_slice(x), "bf16"),
    };
    (PyBytes::new(py, bytes), name, shape)
}

/// The activation dtype of the workload of `seed`: `name` when given, else the one the
/// suite's table picks for its `seed % 3`-th case of the cache's dtype.
fn activations(layout: &KvCacheLayout, name: Option<&str>, seed: u64) -> PyResult<DType> {
    let Some(name) = name else {
        return Ok(activation_dtype(layout.dtype(), (seed % 3) as usize));
    };
    match name.parse::<DType>() {
        Ok(d @ (DType::F32 | DType::F16 | DType::Bf16)) => Ok(d),
        _ => Err(raise(LayoutError::UnknownName {
            what: "activation dtype",
            name: name.to_string(),
            known: "f32, f16, bf16".into(),
        })),
    }
}

/// The conformance suite's write and decode workload of ``layout``, seeded by ``seed`` (the
/// case is named ``kvlayout.testing/seed-<seed>``, and the suite seeds a case's generator by
/// its name). ``activations`` (``"f32"``, ``"f16"``, ``"bf16"``) is the keys', values' and
/// queries' dtype; ``None`` picks it from the cache's dtype and the seed as the suite does.
///
/// Returns a dict: ``name``, ``layer``, ``key`` and ``value`` (``None`` for MLA) as
/// ``(bytes, dtype, shape)`` with shape ``[tokens, heads, width]``, ``slot_mapping`` (i64),
/// ``block_table`` (i32, ``[seqs, blocks_per_seq]``), ``seq_lens`` (u32) as bytes,
/// ``blocks_per_seq``, and ``steps``: for each decode step a dict of ``name``, ``query``
/// (``(bytes, dtype, [seqs, num_q_heads, width])``), ``num_q_heads``, ``scale``,
/// ``sliding_window``, ``soft_cap``. Raises ``UnsupportedError`` for a layout ``write_kv``
/// or ``paged_decode`` refuses.
#[pyfunction]
#[pyo3(signature = (layout, seed, activations=None))]
fn workload<'py>(
    py: Python<'py>,
    layout: &Layout,
    seed: u64,
    activations: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let l = &layout.inner;
    let (kw, vw) = super::widths(l).map_err(raise)?;
    let act = self::activations(l, activations, seed)?;
    // The suite builds a case from its spec string: the canonical string reads back to this
    // layout (explicit strides included).
    let spec = l.to_string();
    let back: KvCacheLayout = spec.parse().map_err(raise)?;
    back.same_addressing(l).map_err(raise)?;
    let case = case_from_spec(&format!("kvlayout.testing/seed-{seed}"), &spec, act);
    let w = suite_workload(&case).ok_or_else(|| {
        raise(LayoutError::Invalid(format!(
            "the suite has no workload for {spec}"
        )))
    })?;
    let heads = l.geometry().num_kv_heads as usize;
    let tokens = w.slot_mapping.len();
    let (kw, vw) = (kw as usize, vw as usize);
    let seqs = w.seq_lens.len();
    let d = PyDict::new(py);
    d.set_item("name", &case.name)?;
    d.set_item("layer", w.layer)?;
    d.set_item("key", tensor(py, &w.key, vec![tokens, heads, kw]))?;
    let value = w
        .value
        .as_ref()
        .map(|v| tensor(py, v, vec![tokens, heads, vw]));
    d.set_item("value", value)?;
    let slots: &[u8] = bytemuck::cast_slice(&w.slot_mapping);
    d.set_item("slot_mapping", PyBytes::new(py, slots))?;
    let table: &[u8] = bytemuck::cast_slice(&w.block_table);
    d.set_item("block_table", PyBytes::new(py, table))?;
    d.set_item("blocks_per_seq", w.blocks_per_seq)?;
    let lens: &[u8] = bytemuck::cast_slice(&w.seq_lens);
    d.set_item("seq_lens", PyBytes::new(py, lens))?;
    let steps = PyList::empty(py);
    for dc in &w.decodes {
        let s = PyDict::new(py);
        let p = dc.params;
        s.set_item("name", dc.name)?;
        let shape = vec![seqs, p.num_q_heads as usize, kw];
        s.set_item("query", tensor(py, &dc.query, shape))?;
        s.set_item("num_q_heads", p.num_q_heads)?;
        s.set_item("scale", p.scale)?;
        s.set_item("sliding_window", p.sliding_window)?;
        s.set_item("soft_cap", p.soft_cap)?;
        steps.append(s)?;
    }
    d.set_item("steps", steps)?;
    Ok(d)
}
