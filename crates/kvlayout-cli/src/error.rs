//! The CLI's errors: every way a command fails, printed as one `error: ...` line.

use std::fmt;

use kvlayout::ops::OpError;
use kvlayout::LayoutError;

/// A user error: printed as one `error: ...` line, exit status 2.
#[derive(Debug)]
pub(crate) enum CliError {
    /// The core crate refused (bad spec, out-of-range coordinate, refused view, ...).
    Layout(LayoutError),
    /// A layout JSON file that cannot be read or does not describe a layout.
    File { path: String, detail: String },
    /// A command-line value the core crate has no parser error for.
    Usage(String),
    /// The CPU backend refused an op (content without keys and values, a bad layer, ...).
    Op(OpError),
    /// A check that ran and failed: a decode or demo that disagrees with the reference, a
    /// conformance failure, layouts that differ in `diff` (exit status 1).
    Check(String),
    /// A backend that failed while running (no memory, a device error; exit status 1).
    Failed(String),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Layout(e) => write!(f, "{e}"),
            CliError::File { path, detail } => write!(f, "{path}: {detail}"),
            CliError::Usage(m) | CliError::Check(m) | CliError::Failed(m) => f.write_str(m),
            CliError::Op(e) => write!(f, "{e}"),
        }
    }
}

impl From<LayoutError> for CliError {
    fn from(e: LayoutError) -> Self {
        CliError::Layout(e)
    }
}

impl From<OpError> for CliError {
    fn from(e: OpError) -> Self {
        match e {
            OpError::Layout(e) => CliError::Layout(e),
            e => CliError::Op(e),
        }
    }
}
