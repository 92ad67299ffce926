//! Benchmark support: the Rust cost of the calls the binding wraps, timed inside Rust, so
//! that `benches/binding.py` can report the binding's overhead per call against it.

use std::hint::black_box;
use std::time::Instant;

use kvlayout::{Convention, Coord, Field, TensorClaim, ViewTarget};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::raise;
use crate::layout::Layout;

/// The module's benchmark functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(time_calls, m)?)?;
    Ok(())
}

/// Nanoseconds per call of `what` on `layout`, over `n` calls in Rust: `offset` (element 0
/// of V in the last block), `view` (the flash-attn view of K, layer 0) or `check`
/// (`check_tensor` of that view's own claim).
#[pyfunction]
#[pyo3(name = "_time_calls")]
fn time_calls(py: Python<'_>, layout: &Layout, what: &str, n: u64) -> PyResult<f64> {
    let l = &layout.inner;
    let g = *l.geometry();
    let coord = Coord {
        layer: 0,
        block: g.num_blocks - 1,
        head: g.num_kv_heads - 1,
        slot: 1,
        field: Field::V,
        dim: 3,
    };
    let target = ViewTarget::Field(Field::K);
    let view = l.view(Convention::FlashAttn, target, 0).map_err(raise)?;
    let claim = TensorClaim {
        convention: Convention::FlashAttn,
        target,
        layer: 0,
        shape: &view.shape,
        strides: &view.strides,
        dtype: view.dtype,
        storage_offset: Some(kvlayout::StorageOffset::Elements(view.offset)),
    };
    let run = || -> Result<(), kvlayout::LayoutError> {
        match what {
            "offset" => {
                for _ in 0..n {
                    black_box(l.offset(black_box(&coord))?);
                }
            }
            "view" => {
                for _ in 0..n {
                    black_box(l.view(Convention::FlashAttn, black_box(target), 0)?);
                }
            }
            _ => {
                for _ in 0..n {
                    l.check_tensor(black_box(&claim))?;
                }
            }
        }
        Ok(())
    };
    if !matches!(what, "offset" | "view" | "check") {
        return Err(PyValueError::new_err(format!(
            "what must be offset, view or check, got {what:?}"
        )));
    }
    let start = Instant::now();
    py.detach(run).map_err(raise)?;
    Ok(start.elapsed().as_nanos() as f64 / n.max(1) as f64)
}
