//! # kvlayout-py: the Python package `kvlayout`
//!
//! This crate owns the Python bindings (PyO3, one abi3 extension module `kvlayout._native`,
//! built by maturin with the pure-Python part under `python/kvlayout/`): the layout as a
//! Python class (`layout.rs`), Rust errors as Python exceptions carrying their values
//! (`errors.rs`), the check of a framework's tensor (`check.rs`) and zero-copy views of its
//! allocation (`as_view.rs`), the backends on memory the caller owns (`backend.rs`), the
//! test harness for other people's kernels (`testing.rs`), the connector's handshake
//! (`handshake.rs`), and the Rust side of the binding benchmark (`bench.rs`).
//!
//! It does not own any layout logic, op, backend or wire format: every answer comes from the
//! `kvlayout` crate, the backends and the connector. What an object exposes about its memory
//! (`__array_interface__`, `__cuda_array_interface__`, `__dlpack__`) is read by the Python
//! side (`kvlayout/_arrays.py`; a plain numpy array by `ndarray.rs`, the same way) and handed
//! here as plain integers (`arrays.rs`); `memory.rs` makes slices of host memory for one
//! call. Nothing is guessed from a shape.

#![deny(unsafe_code)]

use pyo3::prelude::*;

mod arrays;
mod as_view;
mod backend;
mod bench;
mod check;
mod convert;
mod errors;
mod handshake;
mod layout;
#[allow(unsafe_code)]
mod memory;
mod ndarray;
mod python;
mod testing;

/// The native module, `kvlayout._native` (the package re-exports it).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    layout::register(m)?;
    ndarray::register(m)?;
    backend::register(m)?;
    bench::register(m)?;
    testing::register(m)?;
    handshake::register(m)?;
    Ok(())
}
