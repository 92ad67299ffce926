//! Allocations in device and pinned host memory, and the copies between them and the host.
//! Every copy checks its byte range against the buffer it names.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::sys;
use kvlayout_device::Place;

use super::DeviceHandles;
use crate::error::{driver, CudaError};

/// One allocation of a [`crate::CudaDevice`], in device memory or pinned host memory; freed
/// on drop after the work enqueued before.
#[derive(Debug)]
pub struct CudaBuffer {
    handles: Arc<DeviceHandles>,
    /// The allocation's base: a device pointer, or the pinned host pointer (the same address
    /// on the device under unified addressing).
    base: u64,
    misalign: u64,
    len: u64,
    place: Place,
}

// SAFETY: the buffer owns its allocation; the driver calls on it are thread-safe and host
// accesses to pinned memory are serialized by `DeviceHandles::order`.
unsafe impl Send for CudaBuffer {}
// SAFETY: as for `Send`; shared references only enqueue driver work or read the address.
unsafe impl Sync for CudaBuffer {}

impl CudaBuffer {
    /// Address of byte 0 (the allocation's base plus the misalignment).
    pub fn address(&self) -> u64 {
        self.base + self.misalign
    }

    /// Bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it has no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where it lives.
    pub fn place(&self) -> Place {
        self.place
    }

    /// The address of `len` bytes at `offset`, after checking they lie in the buffer and the
    /// buffer belongs to `handles`.
    fn span(
        &self,
        handles: &Arc<DeviceHandles>,
        what: &'static str,
        offset: u64,
        len: u64,
    ) -> Result<u64, CudaError> {
        if !Arc::ptr_eq(&self.handles, handles) {
            return Err(CudaError::ForeignHandle { what });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.address() + offset),
            _ => Err(CudaError::OutOfRange {
                what,
                offset,
                len,
                buffer_len: self.len,
            }),
        }
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        // Failures are ignored: nothing is left to report them to.
        let h = &self.handles;
        if h.bind().is_err() {
            return;
        }
        // SAFETY: `base` was allocated by `alloc` at `place` and is freed once, here: device
        // memory in stream order (or after the stream's work), pinned memory after it.
        unsafe {
            match self.place {
                Place::Device if h.async_alloc => {
                    let _ = result::free_async(self.base, h.stream);
                }
                Place::Device => {
                    let _ = h.sync_bound();
                    let _ = result::free_sync(self.base);
                }
                Place::PinnedHost => {
                    let _ = h.sync_bound();
                    let _ = result::free_host(self.base as usize as *mut c_void);
                }
            }
        }
    }
}

/// `len` bytes at `place`, starting `misalign` bytes past the allocation's base; at least
/// one byte is allocated.
pub(crate) fn alloc(
    handles: &Arc<DeviceHandles>,
    len: u64,
    misalign: u64,
    place: Place,
) -> Result<CudaBuffer, CudaError> {
    let too_large = || CudaError::TooLarge {
        what: "alloc",
        len,
        misalign,
    };
    let total = len.checked_add(misalign).ok_or_else(too_large)?.max(1);
    let bytes = usize::try_from(total).map_err(|_| too_large())?;
    handles.bind()?;
    let base = match place {
        // SAFETY: the stream lives as long as `handles`; the memory is freed by the buffer.
        Place::Device if handles.async_alloc => unsafe {
            result::malloc_async(handles.stream, bytes).map_err(driver("cuMemAllocAsync"))?
        },
        // SAFETY: the memory is freed by the buffer.
        Place::Device => unsafe { result::malloc_sync(bytes).map_err(driver("cuMemAlloc"))? },
        Place::PinnedHost => {
            let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
            // SAFETY: the memory is freed by the buffer.
            let p =
                unsafe { result::malloc_host(bytes, flags) }.map_err(driver("cuMemHostAlloc"))?;
            p as usize as u64
        }
    };
    Ok(CudaBuffer {
        handles: handles.clone(),
        base,
        misalign,
        len,
        place,
    })
}

/// Copies `src` to the start of `dst`: enqueued for device memory (the driver stages pageable
/// `src` before returning), written by the host after the stream's work for pinned memory.
pub(crate) fn upload(
    handles: &Arc<DeviceHandles>,
    dst: &CudaBuffer,
    src: &[u8],
) -> Result<(), CudaError> {
    let at = dst.span(handles, "upload", 0, src.len() as u64)?;
    if src.is_empty() {
        return Ok(());
    }
    handles.bind()?;
    let _order = handles.order();
    match dst.place {
        // SAFETY: `at..at + src.len()` lies in `dst`'s device allocation; the driver stages
        // the pageable source before the call returns.
        Place::Device => unsafe {
            sys::cuMemcpyHtoDAsync_v2(at, src.as_ptr().cast(), src.len(), handles.stream)
                .result()
                .map_err(driver("cuMemcpyHtoDAsync"))
        },
        Place::PinnedHost => {
            handles.sync_bound()?;
            // SAFETY: the range lies in `dst`'s host allocation; the stream is idle and no work
            // can be enqueued while `_order` is held, so nothing else touches it.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), at as usize as *mut u8, src.len());
            }
            Ok(())
        }
    }
}

/// Copies the start of `src` into `dst` once the work enqueued before has finished.
pub(crate) fn download(
    handles: &Arc<DeviceHandles>,
    src: &CudaBuffer,
    dst: &mut [u8],
) -> Result<(), CudaError> {
    let at = src.span(handles, "download", 0, dst.len() as u64)?;
    handles.bind()?;
    match src.place {
        Place::Device => {
            if !dst.is_empty() {
                let _order = handles.order();
                // SAFETY: the range lies in `src`'s device allocation; `dst` holds `len` bytes
                // and stays borrowed until the synchronization below.
                unsafe {
                    sys::cuMemcpyDtoHAsync_v2(
                        dst.as_mut_ptr().cast(),
                        at,
                        dst.len(),
                        handles.stream,
                    )
                }
                .result()
                .map_err(driver("cuMemcpyDtoHAsync"))?;
            }
            handles.sync_bound()
        }
        Place::PinnedHost => {
            let _order = handles.order();
            handles.sync_bound()?;
            // SAFETY: the range lies in `src`'s host allocation; the stream is idle and no
            // work can be enqueued while `_order` is held.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    at as usize as *const u8,
                    dst.as_mut_ptr(),
                    dst.len(),
                );
            }
            Ok(())
        }
    }
}

/// Enqueues a copy of `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
pub(crate) fn copy(
    handles: &Arc<DeviceHandles>,
    (src, src_offset): (&CudaBuffer, u64),
    (dst, dst_offset): (&CudaBuffer, u64),
    len: u64,
) -> Result<(), CudaError> {
    let from = src.span(handles, "copy source", src_offset, len)?;
    let to = dst.span(handles, "copy destination", dst_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let bytes = usize::try_from(len).map_err(|_| CudaError::OutOfRange {
        what: "copy",
        offset: src_offset,
        len,
        buffer_len: src.len,
    })?;
    handles.bind()?;
    let _order = handles.order();
    // SAFETY: both ranges lie in live allocations of this device (unified addresses, so the
    // driver infers each side's kind).
    unsafe { sys::cuMemcpyAsync(to, from, bytes, handles.stream) }
        .result()
        .map_err(driver("cuMemcpyAsync"))
}
