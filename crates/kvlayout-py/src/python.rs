//! The package's Python functions the native side calls, each imported once per interpreter
//! (an import per call costs tens of microseconds).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// `kvlayout._arrays._fields`: what an object states about its memory (`describe`), as a
/// tuple.
pub fn describe(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static F: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    F.import(py, "kvlayout._arrays", "_fields")
}

/// `kvlayout._arrays._strided_view`: a bounds-checked view of an allocation.
pub fn strided_view(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static F: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    F.import(py, "kvlayout._arrays", "_strided_view")
}

/// `kvlayout._ops.index_array`: an index argument as a contiguous integer array.
pub fn index_array(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static F: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    F.import(py, "kvlayout._ops", "index_array")
}

/// `numpy.zeros`.
pub fn numpy_zeros(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static F: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    F.import(py, "numpy", "zeros")
}
