//! The runtime's failures as typed errors: [`check`] turns a [`Status`] other than
//! `hipSuccess` into a [`HipCallError`] naming the call, with the runtime's name and
//! description of the code.

use std::ffi::{c_char, CStr};

use super::sys::{hipGetErrorName, hipGetErrorString, Status, SUCCESS};
use crate::error::HipCallError;

/// A string the runtime returned (`"(none)"` for a null pointer).
fn runtime_text(p: *const c_char) -> String {
    if p.is_null() {
        return "(none)".to_string();
    }
    // SAFETY: non-null pointers from hipGetErrorName / hipGetErrorString point to
    // NUL-terminated strings in the runtime's static storage, valid for the process.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `Ok` for `hipSuccess`, else the call with the runtime's name and description of `status`.
pub(super) fn check(call: &'static str, status: Status) -> Result<(), HipCallError> {
    if status == SUCCESS {
        return Ok(());
    }
    // SAFETY: both take any hipError_t value by value and return a pointer to a static
    // string (for an unknown value, the runtime's "unknown" text).
    let (name, description) = unsafe { (hipGetErrorName(status), hipGetErrorString(status)) };
    Err(HipCallError {
        call,
        code: status.0,
        name: runtime_text(name),
        description: runtime_text(description),
    })
}
