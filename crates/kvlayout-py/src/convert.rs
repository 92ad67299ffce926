//! Names and values between Python and Rust: a field, a convention or a dtype by name (with the
//! descriptor's own error listing the known ones), and any serializable Rust value as the
//! Python value of its JSON form.

use kvlayout::{Convention, Field, LayoutError, ViewTarget};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde::Serialize;

use crate::errors::{raise, Attr, Raised};

/// A view target by name: a field (`k`, `v`, `latent`, ...) or `kv`.
pub fn target(name: &str) -> PyResult<ViewTarget> {
    name.parse::<ViewTarget>().map_err(raise)
}

/// A field by name.
pub fn field(name: &str) -> PyResult<Field> {
    name.parse::<Field>().map_err(|_| {
        raise(LayoutError::UnknownName {
            what: "field",
            name: name.to_string(),
            known: "k, v, k_scale, v_scale, latent, bytes, conv, ssm".into(),
        })
    })
}

/// A convention by name.
pub fn convention(name: &str) -> PyResult<Convention> {
    Convention::from_name(name).map_err(raise)
}

/// The Python value of `v`'s JSON form (dicts, lists, ints, floats, strings, None).
pub fn to_py<'py>(py: Python<'py>, v: &impl Serialize) -> PyResult<Bound<'py, PyAny>> {
    let json = serde_json::to_value(v)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    json_to_py(py, &json)
}

fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, json_to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// A count or index from Python (a block, a layer bound, a TP size): an integer in
/// `0..2**64`. Another integer raises `InvalidQueryError` with the value; a non-integer,
/// Python's `TypeError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Index(pub u64);

impl<'a, 'py> FromPyObject<'a, 'py> for Index {
    type Error = PyErr;

    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let v: i128 = obj.extract()?;
        u64::try_from(v).map(Index).map_err(|_| {
            let reason = format!("{v} is not an index or a count (0 to 2**64 - 1)");
            raise(Raised {
                class: "InvalidQueryError",
                message: format!("invalid query: {reason}"),
                fields: vec![("reason", Attr::Text(reason)), ("value", Attr::from(v))],
            })
        })
    }
}
