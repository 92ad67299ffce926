//! Rust errors as Python exceptions: one class per error kind (defined in
//! `kvlayout/errors.py`), raised with the Rust message and the error's fields (the value, the
//! limit, ...) as attributes.

use kvlayout::ops::OpError;
use kvlayout::LayoutError;
use kvlayout_backends::OpenError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod handshake;

/// An attribute value of an exception.
#[derive(Clone)]
pub enum Attr {
    /// An integer (values, limits, indices).
    Int(i128),
    /// Text (names, reasons).
    Text(String),
}

impl From<i128> for Attr {
    fn from(v: i128) -> Self {
        Attr::Int(v)
    }
}
impl From<u64> for Attr {
    fn from(v: u64) -> Self {
        Attr::Int(v.into())
    }
}
impl From<i64> for Attr {
    fn from(v: i64) -> Self {
        Attr::Int(v.into())
    }
}
impl From<usize> for Attr {
    fn from(v: usize) -> Self {
        Attr::Int(v as i128)
    }
}
impl From<u32> for Attr {
    fn from(v: u32) -> Self {
        Attr::Int(v.into())
    }
}
impl From<u16> for Attr {
    fn from(v: u16) -> Self {
        Attr::Int(v.into())
    }
}
impl From<&str> for Attr {
    fn from(v: &str) -> Self {
        Attr::Text(v.to_string())
    }
}
impl From<&String> for Attr {
    fn from(v: &String) -> Self {
        Attr::Text(v.clone())
    }
}

/// An error as a Python exception: its class name in `kvlayout.errors`, and its fields.
pub trait PyErrorKind: std::fmt::Display {
    /// The exception class (in `kvlayout/errors.py`) and the fields it carries.
    fn class_and_fields(&self) -> (&'static str, Vec<(&'static str, Attr)>);
}

/// The Python exception of `e`: an instance of its class in `kvlayout.errors`, its message
/// the Rust one, its fields attributes. A `ValueError` with the message where the package's
/// Python part cannot be imported.
pub fn raise(e: impl PyErrorKind) -> PyErr {
    let message = e.to_string();
    let (class, fields) = e.class_and_fields();
    Python::attach(|py| {
        let made = (|| -> PyResult<PyErr> {
            let cls = py.import("kvlayout.errors")?.getattr(class)?;
            let kwargs = PyDict::new(py);
            for (name, value) in fields {
                match value {
                    Attr::Int(v) => kwargs.set_item(name, v)?,
                    Attr::Text(v) => kwargs.set_item(name, v)?,
                }
            }
            Ok(PyErr::from_value(
                cls.call((message.as_str(),), Some(&kwargs))?,
            ))
        })();
        made.unwrap_or_else(|_| PyValueError::new_err(message.clone()))
    })
}

/// An exception made here, not from a Rust error value: a value out of a Python int's range
/// (a negative layer), an object whose memory cannot be read.
pub struct Raised {
    /// The class name in `kvlayout.errors`.
    pub class: &'static str,
    /// The message.
    pub message: String,
    /// The attributes.
    pub fields: Vec<(&'static str, Attr)>,
}

impl Raised {
    /// An `ArrayError` whose message is its reason.
    pub fn array(reason: String) -> Raised {
        Raised {
            class: "ArrayError",
            fields: vec![("reason", Attr::Text(reason.clone()))],
            message: reason,
        }
    }
}

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl PyErrorKind for Raised {
    fn class_and_fields(&self) -> (&'static str, Vec<(&'static str, Attr)>) {
        (self.class, self.fields.clone())
    }
}

impl PyErrorKind for LayoutError {
    fn class_and_fields(&self) -> (&'static str, Vec<(&'static str, Attr)>) {
        use LayoutError as E;
        match self {
            E::ZeroSize { what } => ("ZeroSizeError", vec![("what", (*what).into())]),
            E::Overflow { what, limit } => (
                "OffsetOverflowError",
                vec![("what", what.into()), ("limit", (*limit).into())],
            ),
            E::XNotDividing {
                head_size,
                x,
                elem_bytes,
            } => (
                "XNotDividingError",
                vec![
                    ("head_size", (*head_size).into()),
                    ("x", (*x).into()),
                    ("elem_bytes", (*elem_bytes).into()),
                ],
            ),
            E::MisalignedScale {
                field,
                offset,
                align,
            } => (
                "MisalignedScaleError",
                vec![
                    ("field", field.into()),
                    ("offset", (*offset).into()),
                    ("align", (*align).into()),
                ],
            ),
            E::Misaligned { what, value, align } => (
                "MisalignedError",
                vec![
                    ("what", what.into()),
                    ("value", (*value).into()),
                    ("align", (*align).into()),
                ],
            ),
            E::Aliasing { detail } => ("AliasingError", vec![("detail", detail.into())]),
            E::NotPowerOfTwo { what, value } => (
                "NotPowerOfTwoError",
                vec![("what", (*what).into()), ("value", (*value).into())],
            ),
            E::StrideTooSmall {
                what,
                value,
                needed,
            } => (
                "StrideTooSmallError",
                vec![
                    ("what", what.into()),
                    ("value", (*value).into()),
                    ("needed", (*needed).into()),
                ],
            ),
            E::Invalid(reason) => ("InvalidLayoutError", vec![("reason", reason.into())]),
            E::UnknownPreset { name, known } => (
                "UnknownPresetError",
                vec![("name", name.into()), ("known", known.into())],
            ),
            E::UnknownName { what, name, known } => (
                "UnknownNameError",
                vec![
                    ("what", (*what).into()),
                    ("name", name.into()),
                    ("known", known.into()),
                ],
            ),
            E::Spec {
                column,
                token,
                reason,
            } => (
                "SpecError",
                vec![
                    ("column", (*column).into()),
                    ("token", token.into()),
                    ("reason", reason.into()),
                ],
            ),
            E::Json(reason) => ("LayoutJsonError", vec![("reason", reason.into())]),
            E::OutOfRange { axis, value, limit } => (
                "OutOfRangeError",
                vec![
                    ("axis", (*axis).into()),
                    ("value", (*value).into()),
                    ("limit", (*limit).into()),
                ],
            ),
            E::NoSuchField { field, available } => (
                "NoSuchFieldError",
                vec![("field", field.into()), ("available", available.into())],
            ),
            E::ViewRefused {
                convention,
                field,
                reason,
            } => (
                "ViewRefusedError",
                vec![
                    ("convention", convention.into()),
                    ("field", field.into()),
                    ("reason", reason.into()),
                ],
            ),
            E::TransformRefused { transform, reason } => (
                "TransformRefusedError",
                vec![
                    ("transform", (*transform).into()),
                    ("reason", reason.into()),
                ],
            ),
            E::TensorMismatch(reason) => ("TensorMismatchError", vec![("reason", reason.into())]),
            E::InvalidQuery(reason) => ("InvalidQueryError", vec![("reason", reason.into())]),
            E::TooManyRegions { count, limit } => (
                "TooManyRegionsError",
                vec![("count", count.into()), ("limit", (*limit).into())],
            ),
            E::Mismatch(reason) => ("LayoutMismatchError", vec![("reason", reason.into())]),
        }
    }
}

impl PyErrorKind for OpError {
    fn class_and_fields(&self) -> (&'static str, Vec<(&'static str, Attr)>) {
        use OpError as E;
        match self {
            E::Layout(e) => e.class_and_fields(),
            E::SlotOutOfRange { token, slot, limit } => (
                "SlotOutOfRangeError",
                vec![
                    ("token", (*token).into()),
                    ("slot", (*slot).into()),
                    ("limit", (*limit).into()),
                ],
            ),
            E::DuplicateSlot { token, slot, first } => (
                "DuplicateSlotError",
                vec![
                    ("token", (*token).into()),
                    ("slot", (*slot).into()),
                    ("first", (*first).into()),
                ],
            ),
            E::BlockOutOfRange {
                seq,
                position,
                block,
                limit,
            } => (
                "BlockOutOfRangeError",
                vec![
                    ("seq", (*seq).into()),
                    ("position", (*position).into()),
                    ("block", (*block).into()),
                    ("limit", (*limit).into()),
                ],
            ),
            E::SequenceTooLong {
                seq,
                len,
                blocks,
                capacity,
            } => (
                "SequenceTooLongError",
                vec![
                    ("seq", (*seq).into()),
                    ("len", (*len).into()),
                    ("blocks", (*blocks).into()),
                    ("capacity", (*capacity).into()),
                ],
            ),
            E::Shape {
                what,
                expected,
                got,
            } => (
                "ShapeError",
                vec![
                    ("what", what.into()),
                    ("expected", expected.into()),
                    ("got", got.into()),
                ],
            ),
            E::BufferTooShort {
                buffer,
                len,
                needed,
            } => (
                "BufferTooShortError",
                vec![
                    ("buffer", (*buffer).into()),
                    ("len", (*len).into()),
                    ("needed", (*needed).into()),
                ],
            ),
            E::Misaligned {
                buffer,
                address,
                align,
            } => (
                "BufferMisalignedError",
                vec![
                    ("buffer", (*buffer).into()),
                    ("address", (*address).into()),
                    ("align", (*align).into()),
                ],
            ),
            E::Incompatible(reason) => ("IncompatibleError", vec![("reason", reason.into())]),
            E::BadPair {
                index,
                src,
                dst,
                reason,
            } => (
                "BadPairError",
                vec![
                    ("index", (*index).into()),
                    ("src", (*src).into()),
                    ("dst", (*dst).into()),
                    ("reason", reason.into()),
                ],
            ),
            E::OutOfMemory { buffer, bytes } => (
                "OutOfMemoryError",
                vec![("buffer", (*buffer).into()), ("bytes", (*bytes).into())],
            ),
            E::Unsupported { op, reason } => (
                "UnsupportedError",
                vec![("op", (*op).into()), ("reason", reason.into())],
            ),
            E::Kernel { kernel, detail } => (
                "KernelError",
                vec![("kernel", (*kernel).into()), ("detail", detail.into())],
            ),
        }
    }
}

impl PyErrorKind for OpenError {
    fn class_and_fields(&self) -> (&'static str, Vec<(&'static str, Attr)>) {
        match self {
            OpenError::Unknown { name } => ("UnknownBackendError", vec![("name", name.into())]),
            OpenError::Unavailable { name, reason } => (
                "BackendUnavailableError",
                vec![("name", name.into()), ("reason", reason.into())],
            ),
        }
    }
}

/// An object whose memory cannot be used as the call needs: not on the host, not
/// contiguous, read-only where the op writes, misaligned, or overlapping another argument.
pub struct ArrayError(pub String);

impl std::fmt::Display for ArrayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PyErrorKind for ArrayError {
    fn class_and_fields(&self) -> (&'static str, Vec<(&'static str, Attr)>) {
        ("ArrayError", vec![("reason", (&self.0).into())])
    }
}

/// A failure of a backend's memory call (no memory, no device), reported as text by the
/// contract.
pub struct BackendFailure(pub String);

impl std::fmt::Display for BackendFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PyErrorKind for BackendFailure {
    fn class_and_fields(&self) -> (&'static str, Vec<(&'static str, Attr)>) {
        ("BackendFailure", vec![("reason", (&self.0).into())])
    }
}
