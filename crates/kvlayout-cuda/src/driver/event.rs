//! Events on a device's stream.

use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::sys;

use super::DeviceHandles;
use crate::error::{driver, CudaError};

/// A point in a device's stream; destroyed on drop.
#[derive(Debug)]
pub struct CudaEvent {
    handles: Arc<DeviceHandles>,
    event: sys::CUevent,
}

// SAFETY: the event is a driver handle; the driver API is thread-safe.
unsafe impl Send for CudaEvent {}
// SAFETY: as for `Send`; shared references only wait on it.
unsafe impl Sync for CudaEvent {}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.handles.bind().is_ok() {
            // SAFETY: created by `record` and destroyed once, here.
            let _ = unsafe { result::event::destroy(self.event) };
        }
    }
}

/// An event after the work enqueued so far.
pub(crate) fn record(handles: &Arc<DeviceHandles>) -> Result<CudaEvent, CudaError> {
    handles.bind()?;
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(driver("cuEventCreate"))?;
    // Destroys the event should recording fail.
    let event = CudaEvent {
        handles: handles.clone(),
        event,
    };
    let _order = handles.order();
    // SAFETY: the event and the stream are live.
    unsafe { result::event::record(event.event, handles.stream) }
        .map_err(driver("cuEventRecord"))?;
    Ok(event)
}

/// Waits for `event`; an asynchronous failure of the work before it is the `Err`.
pub(crate) fn wait(handles: &Arc<DeviceHandles>, event: &CudaEvent) -> Result<(), CudaError> {
    if !Arc::ptr_eq(&event.handles, handles) {
        return Err(CudaError::ForeignHandle { what: "event" });
    }
    handles.bind()?;
    // SAFETY: the event is live (borrowed).
    unsafe { result::event::synchronize(event.event) }.map_err(driver("cuEventSynchronize"))
}
