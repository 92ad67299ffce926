//! The runtime and its devices ([`init`], [`device_count`], [`set_device`]), and the two
//! handles that order work: a device's [`Stream`] and an [`Event`] recorded on it.

use std::ffi::c_int;
use std::ptr;

use hip_sys::hiprt::{hipEventDisableTiming, hipEvent_t, hipStreamNonBlocking, hipStream_t};

use super::status::check;
use super::sys::{
    hipEventCreateWithFlags, hipEventDestroy, hipEventRecord, hipEventSynchronize,
    hipGetDeviceCount, hipInit, hipSetDevice, hipStreamCreateWithFlags, hipStreamDestroy,
    hipStreamSynchronize,
};
use crate::error::HipCallError;

/// `hipInit(0)`.
pub(crate) fn init() -> Result<(), HipCallError> {
    // SAFETY: no pointer arguments; flags must be 0.
    check("hipInit", unsafe { hipInit(0) })
}

/// `hipGetDeviceCount`.
pub(crate) fn device_count() -> Result<c_int, HipCallError> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid, writable c_int for the duration of the call.
    check("hipGetDeviceCount", unsafe {
        hipGetDeviceCount(&mut count)
    })?;
    Ok(count)
}

/// `hipSetDevice`: the calling thread's current device.
pub(crate) fn set_device(ordinal: c_int) -> Result<(), HipCallError> {
    // SAFETY: no pointer arguments; the runtime checks the ordinal.
    check("hipSetDevice", unsafe { hipSetDevice(ordinal) })
}

/// A non-blocking stream of one device, synchronized and destroyed on drop.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(super) raw: hipStream_t,
    ordinal: c_int,
}

// SAFETY: a stream is an opaque handle to a runtime object; the HIP runtime is thread-safe
// (its API may be called on one stream from several threads), and the handle stays valid
// until `Drop` destroys it, which needs exclusive ownership.
unsafe impl Send for Stream {}
// SAFETY: as for Send; no method gives out the handle (only `ffi`'s modules pass it to
// runtime calls).
unsafe impl Sync for Stream {}

impl Stream {
    /// A `hipStreamNonBlocking` stream on device `ordinal` (made current first).
    pub(crate) fn new(ordinal: c_int) -> Result<Stream, HipCallError> {
        set_device(ordinal)?;
        let mut raw: hipStream_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer for the call.
        check("hipStreamCreateWithFlags", unsafe {
            hipStreamCreateWithFlags(&mut raw, hipStreamNonBlocking)
        })?;
        Ok(Stream { raw, ordinal })
    }

    /// The device the stream is on.
    pub(crate) fn ordinal(&self) -> c_int {
        self.ordinal
    }

    /// Waits for all work enqueued on the stream; an asynchronous fault surfaces here.
    pub(crate) fn synchronize(&self) -> Result<(), HipCallError> {
        // SAFETY: `raw` is a live stream (destroyed only in Drop).
        check("hipStreamSynchronize", unsafe {
            hipStreamSynchronize(self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failing runtime leaks the stream at worst.
        let _ = set_device(self.ordinal);
        let _ = self.synchronize();
        // SAFETY: `raw` is a live stream owned by this value, not used after this call.
        let _ = unsafe { hipStreamDestroy(self.raw) };
    }
}

/// A point in a stream's work (`hipEventDisableTiming`), destroyed on drop.
#[derive(Debug)]
pub(crate) struct Event {
    raw: hipEvent_t,
    ordinal: c_int,
}

// SAFETY: an opaque handle to a runtime object, valid until Drop; the runtime is thread-safe.
unsafe impl Send for Event {}
// SAFETY: as for Send; waiting on an event from several threads is allowed.
unsafe impl Sync for Event {}

impl Event {
    /// An event after the work enqueued on `stream` so far.
    pub(crate) fn record(stream: &Stream) -> Result<Event, HipCallError> {
        let mut raw: hipEvent_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("hipEventCreateWithFlags", unsafe {
            hipEventCreateWithFlags(&mut raw, hipEventDisableTiming)
        })?;
        let event = Event {
            raw,
            ordinal: stream.ordinal(),
        };
        // SAFETY: a live event and a live stream of the current device.
        check("hipEventRecord", unsafe {
            hipEventRecord(event.raw, stream.raw)
        })?;
        Ok(event)
    }

    /// Waits for the event; a fault of the work before it surfaces here.
    pub(crate) fn synchronize(&self) -> Result<(), HipCallError> {
        // SAFETY: `raw` is a live, recorded event.
        check("hipEventSynchronize", unsafe {
            hipEventSynchronize(self.raw)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = set_device(self.ordinal);
        // SAFETY: `raw` is a live event owned by this value, not used after this call (a
        // pending event's resources are released by the runtime once it completes).
        let _ = unsafe { hipEventDestroy(self.raw) };
    }
}
