//! What an object states about its memory, as Rust values: `kvlayout._arrays.describe` reads
//! the interfaces (`__cuda_array_interface__`, `__array_interface__`, `__dlpack__`) and checks
//! every number's range; this reads its answer. Also the checked conversions of the integers
//! `check` and `as_view` take from Python.

use kvlayout::{KvCacheLayout, LayoutError};
use pyo3::prelude::*;
use pyo3::types::PyInt;

use crate::errors::{raise, Attr, Raised};

/// An object's memory: `kvlayout._arrays.ArrayDescription` read into Rust.
#[derive(Debug)]
pub struct Described {
    /// Address of element 0.
    pub address: u64,
    /// Extents.
    pub shape: Vec<u64>,
    /// Strides in elements (negative where the object states so).
    pub strides: Vec<i64>,
    /// Bytes per element.
    pub itemsize: u64,
    /// kvlayout dtype name (`f16`, `bf16`, ...; also `i32`, `f64`, ... the layout never stores).
    pub dtype: String,
    /// `cpu`, `cuda:N`, `rocm:N`, or `cuda` where the ordinal is unknown.
    pub device: String,
    /// Bytes of the extent its elements span.
    pub nbytes: u64,
    /// One dense row-major run of bytes.
    pub c_contiguous: bool,
    /// Whether the object says its memory is read-only.
    pub readonly: bool,
    /// What keeps the memory alive besides the object (a DLPack capsule), if anything.
    pub owner: Option<Py<PyAny>>,
}

/// What `kvlayout._arrays.describe(obj)` says (its `ArrayError` passes through): a numpy
/// array read in Rust (`ndarray`), anything else in one call as the tuple of
/// `kvlayout._arrays._fields`.
pub fn describe(obj: &Bound<'_, PyAny>) -> PyResult<Described> {
    if let Some(d) = crate::ndarray::read(obj)? {
        return Ok(d);
    }
    let fields: Fields = crate::python::describe(obj.py())?
        .call1((obj,))?
        .extract()?;
    Ok(Described::from(fields))
}

/// A description as `kvlayout._arrays._fields` gives it: `(address, shape, strides,
/// itemsize, dtype, device, readonly, nbytes, c_contiguous, owner)`.
pub type Fields = (
    u64,
    Vec<u64>,
    Vec<i64>,
    u64,
    String,
    String,
    bool,
    u64,
    bool,
    Option<Py<PyAny>>,
);

impl From<Fields> for Described {
    fn from(f: Fields) -> Self {
        Described {
            address: f.0,
            shape: f.1,
            strides: f.2,
            itemsize: f.3,
            dtype: f.4,
            device: f.5,
            readonly: f.6,
            nbytes: f.7,
            c_contiguous: f.8,
            owner: f.9,
        }
    }
}

impl From<Described> for Fields {
    fn from(d: Described) -> Self {
        (
            d.address,
            d.shape,
            d.strides,
            d.itemsize,
            d.dtype,
            d.device,
            d.readonly,
            d.nbytes,
            d.c_contiguous,
            d.owner,
        )
    }
}

/// A base address stated as a Python int, or the address and byte count of an allocation
/// object (described like a tensor; it must be one contiguous run).
pub enum Base {
    /// An address.
    Address(u64),
    /// An allocation: its description.
    Allocation(Described),
}

/// Reads `base`: an int in `[0, 2**64)` or an object `describe` reads.
pub fn base(base: &Bound<'_, PyAny>) -> PyResult<Base> {
    if base.is_instance_of::<PyInt>() {
        let v: i128 = base.extract().map_err(|_| {
            raise(Raised::array(format!(
                "base address {base} is outside [0, 2**64)"
            )))
        })?;
        return u64::try_from(v).map(Base::Address).map_err(|_| {
            raise(Raised::array(format!(
                "base address {v} is outside [0, 2**64)"
            )))
        });
    }
    let d = describe(base)?;
    if !d.c_contiguous {
        return Err(raise(Raised::array(format!(
            "the allocation (shape {:?}, strides {:?} elements) is not one contiguous run of bytes",
            d.shape, d.strides
        ))));
    }
    Ok(Base::Allocation(d))
}

/// A layer index from Python: in `0..num_layers`, else `OutOfRangeError` with the value as
/// given (negative ones too).
pub fn layer(layout: &KvCacheLayout, layer: i128) -> PyResult<u64> {
    index("layer", layer, layout.geometry().num_layers)
}

/// `value` as an index when it is one (0 to 2**64 - 1; its axis checks the limit later),
/// else `index`'s `OutOfRangeError` against the axis's `limit`.
pub fn index_or(
    axis: &'static str,
    value: i128,
    limit: impl FnOnce() -> PyResult<u64>,
) -> PyResult<u64> {
    match u64::try_from(value) {
        Ok(v) => Ok(v),
        Err(_) => index(axis, value, limit()?),
    }
}

/// An index on `axis` from Python: in `0..limit`, else `OutOfRangeError` with the value as
/// given (negative ones too).
pub fn index(axis: &'static str, value: i128, limit: u64) -> PyResult<u64> {
    match u64::try_from(value) {
        Ok(v) if v < limit => Ok(v),
        Ok(v) => Err(raise(LayoutError::OutOfRange {
            axis,
            value: v,
            limit,
        })),
        Err(_) => Err(raise(Raised {
            class: "OutOfRangeError",
            message: format!("{axis} index {value} is out of range (limit {limit})"),
            fields: vec![
                ("axis", Attr::from(axis)),
                ("value", Attr::from(value)),
                ("limit", Attr::from(limit)),
            ],
        })),
    }
}

/// The kind of a device name (`cuda` of `cuda:1`) and its ordinal, if stated.
pub fn device_parts(device: &str) -> (&str, Option<&str>) {
    match device.split_once(':') {
        Some((kind, ordinal)) => (kind, Some(ordinal)),
        None => (device, None),
    }
}

/// Whether a tensor on `got` is on `want`: same kind, and same ordinal where both state one.
pub fn same_device(got: &str, want: &str) -> bool {
    let ((gk, go), (wk, wo)) = (device_parts(got), device_parts(want));
    gk == wk && (go.is_none() || wo.is_none() || go == wo)
}

/// A device name `check` accepts: `cpu`, `cuda`, `cuda:N`, `rocm`, `rocm:N`.
pub fn valid_device(device: &str) -> PyResult<()> {
    let ok = match device_parts(device) {
        ("cpu", None) => true,
        ("cuda" | "rocm", None) => true,
        ("cuda" | "rocm", Some(n)) => n.parse::<u32>().is_ok(),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(raise(LayoutError::UnknownName {
            what: "device",
            name: device.to_string(),
            known: "cpu, cuda, cuda:N, rocm, rocm:N".into(),
        }))
    }
}
