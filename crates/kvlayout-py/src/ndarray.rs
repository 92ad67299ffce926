//! The common case of `arrays::describe` without a Python call: a numpy array read from its
//! `__array_interface__` and dtype in Rust. Each op reads several arrays, right after a
//! decode has streamed the cache through the CPU caches, when every Python frame runs cold;
//! this keeps the binding's cost per op small. Anything else (another type, a dtype
//! kvlayout does not name, strides that are not whole elements) is left to
//! `kvlayout._arrays.describe`, and `tests/test_check.py` checks that both say the same.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use crate::arrays::{Described, Fields};

/// `numpy.ndarray`.
fn ndarray_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static T: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    T.import(py, "numpy", "ndarray")
}

/// `kvlayout._arrays._NUMPY_NAMES`: numpy dtype names to kvlayout's.
fn names(py: Python<'_>) -> PyResult<&Bound<'_, PyDict>> {
    static D: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    D.import(py, "kvlayout._arrays", "_NUMPY_NAMES")
}

/// The kvlayout name of a numpy dtype in the machine's byte order (`None`: one kvlayout
/// does not name), remembered per dtype object: numpy computes `dtype.name` in Python.
fn kvlayout_name<'py>(dtype: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    static SEEN: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    let py = dtype.py();
    let seen = SEEN.get_or_init(py, || PyDict::new(py).unbind()).bind(py);
    if let Some(name) = seen.get_item(dtype)? {
        return Ok((!name.is_none()).then_some(name));
    }
    let name = if dtype.getattr(intern!(py, "isnative"))?.extract::<bool>()? {
        names(py)?.get_item(dtype.getattr(intern!(py, "name"))?)?
    } else {
        None
    };
    seen.set_item(
        dtype,
        name.clone().unwrap_or_else(|| py.None().into_bound(py)),
    )?;
    Ok(name)
}

/// `obj` read as a numpy array, or `None` where `describe` must decide.
pub fn read(obj: &Bound<'_, PyAny>) -> PyResult<Option<Described>> {
    let py = obj.py();
    if !obj.get_type().is(ndarray_type(py)?) {
        return Ok(None);
    }
    let dtype = obj.getattr(intern!(py, "dtype"))?;
    let Some(name) = kvlayout_name(&dtype)? else {
        return Ok(None);
    };
    let itemsize: u64 = dtype.getattr(intern!(py, "itemsize"))?.extract()?;
    let iface = obj.getattr(intern!(py, "__array_interface__"))?;
    let iface = iface.cast_into::<PyDict>()?;
    let (Some(data), Some(shape), Some(byte_strides)) = (
        iface.get_item(intern!(py, "data"))?,
        iface.get_item(intern!(py, "shape"))?,
        iface.get_item(intern!(py, "strides"))?,
    ) else {
        return Ok(None);
    };
    let (address, readonly): (u64, bool) = data.extract()?;
    let shape: Vec<u64> = shape.extract()?;
    let byte_strides: Option<Vec<i64>> = byte_strides.extract()?;
    let strides = match byte_strides {
        // numpy states no strides for a C-contiguous array.
        None => c_strides(&shape),
        Some(b) => {
            let size = itemsize as i64;
            if b.iter().any(|s| s % size != 0) {
                return Ok(None);
            }
            b.iter().map(|s| s / size).collect()
        }
    };
    let empty = shape.contains(&0);
    let span = shape.iter().zip(&strides).try_fold(1u64, |acc, (&n, &s)| {
        n.saturating_sub(1)
            .checked_mul(s.unsigned_abs())
            .and_then(|x| acc.checked_add(x))
    });
    let nbytes = match span.and_then(|n| n.checked_mul(itemsize)) {
        _ if empty => 0,
        // What `describe` accepts: under 2**63 bytes, ending within the address space.
        Some(n) if n < 1 << 63 && address.checked_add(n).is_some() => n,
        _ => return Ok(None),
    };
    Ok(Some(Described {
        address,
        c_contiguous: dense(&shape, &strides),
        nbytes,
        owner: None,
        shape,
        strides,
        itemsize,
        dtype: name.extract()?,
        device: "cpu".into(),
        readonly,
    }))
}

/// Row-major strides (elements) of `shape`, as `kvlayout._arrays._c_strides` gives them.
fn c_strides(shape: &[u64]) -> Vec<i64> {
    let mut out = vec![0i64; shape.len()];
    let mut step = 1i64;
    for (o, &n) in out.iter_mut().zip(shape).rev() {
        *o = step;
        step = step.saturating_mul(n.max(1) as i64);
    }
    out
}

/// Whether `strides` are row-major dense for `shape` (extent-1 axes skipped; an empty array
/// is), as `kvlayout._arrays._is_dense` says.
fn dense(shape: &[u64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut step = 1i64;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n > 1 && s != step {
            return false;
        }
        step = step.saturating_mul(n as i64);
    }
    true
}

/// The module's test hook.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_ndarray, m)?)?;
    Ok(())
}

/// Test hook: what the Rust reading of a numpy array says, as the tuple of
/// ``kvlayout._arrays._fields``, or ``None`` where it leaves the object to ``describe``.
#[pyfunction]
#[pyo3(name = "_read_ndarray")]
fn read_ndarray(obj: &Bound<'_, PyAny>) -> PyResult<Option<Fields>> {
    Ok(read(obj)?.map(Fields::from))
}
