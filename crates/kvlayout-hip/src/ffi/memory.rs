//! Device and pinned host memory: an [`Allocation`] and the copies into, out of and between
//! allocations, each checked against the allocation's length before the runtime sees it.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError};

use hip_sys::hiprt::{hipHostMallocDefault, hipMemcpyKind};
use kvlayout_device::Place;

use super::runtime::{set_device, Stream};
use super::status::check;
use super::sys::{
    hipFree, hipHostFree, hipHostGetDevicePointer, hipHostMalloc, hipMalloc, hipMemcpyAsync,
    hipMemcpyDtoHAsync, hipMemcpyHtoDAsync,
};
use crate::error::HipError;

/// One allocation in device memory (`hipMalloc`) or pinned host memory (`hipHostMalloc`),
/// `misalign` bytes of it before byte 0; freed on drop after its stream's work.
#[derive(Debug)]
pub(crate) struct Allocation {
    /// What the runtime returned (the host pointer for pinned memory); null when nothing
    /// was allocated (0 bytes).
    base: *mut c_void,
    /// `base` in the kernels' address space.
    device_base: u64,
    misalign: usize,
    len: usize,
    place: Place,
    /// Keeps the stream (and its device ordinal) for the drop.
    stream: Arc<Stream>,
    /// Held while the host reads or writes pinned memory.
    host_access: Mutex<()>,
}

// SAFETY: the pointers are addresses of a runtime allocation, valid until Drop frees it;
// the runtime is thread-safe, and host accesses to pinned memory hold `host_access`.
unsafe impl Send for Allocation {}
// SAFETY: as for Send: shared use only enqueues runtime copies or touches pinned memory
// under `host_access`.
unsafe impl Sync for Allocation {}

fn too_large(what: &'static str, bytes: u64, extra: u64) -> HipError {
    HipError::TooLarge { what, bytes, extra }
}

impl Allocation {
    /// `len` bytes at `place`, starting `misalign` bytes into the runtime's allocation, on the
    /// current device (`stream`'s).
    pub(crate) fn new(
        stream: &Arc<Stream>,
        len: u64,
        misalign: u64,
        place: Place,
    ) -> Result<Allocation, HipError> {
        let what = match place {
            Place::Device => "device allocation",
            Place::PinnedHost => "pinned host allocation",
        };
        let total = len
            .checked_add(misalign)
            .and_then(|t| usize::try_from(t).ok())
            .ok_or_else(|| too_large(what, len, misalign))?;
        let (len, misalign) = (total - misalign as usize, misalign as usize);
        let mut alloc = Allocation {
            base: ptr::null_mut(),
            device_base: 0,
            misalign,
            len,
            place,
            stream: Arc::clone(stream),
            host_access: Mutex::new(()),
        };
        if total == 0 {
            return Ok(alloc);
        }
        match place {
            Place::Device => {
                // SAFETY: `alloc.base` is a valid out-pointer; on failure it stays null and
                // Drop frees nothing.
                check("hipMalloc", unsafe { hipMalloc(&mut alloc.base, total) })?;
                alloc.device_base = alloc.base as u64;
            }
            Place::PinnedHost => {
                // SAFETY: as for hipMalloc. Default flags: mapped into the device's address
                // space.
                check("hipHostMalloc", unsafe {
                    hipHostMalloc(&mut alloc.base, total, hipHostMallocDefault)
                })?;
                let mut device: *mut c_void = ptr::null_mut();
                // SAFETY: `device` is a valid out-pointer and `alloc.base` a live
                // hipHostMalloc allocation (freed by Drop if this fails).
                check("hipHostGetDevicePointer", unsafe {
                    hipHostGetDevicePointer(&mut device, alloc.base, 0)
                })?;
                alloc.device_base = device as u64;
            }
        }
        Ok(alloc)
    }

    /// Byte 0 in the kernels' address space (0 for an empty allocation).
    pub(crate) fn address(&self) -> u64 {
        if self.base.is_null() {
            0
        } else {
            self.device_base.wrapping_add(self.misalign as u64)
        }
    }

    /// Bytes, the misalignment excluded.
    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// Where it lives.
    pub(crate) fn place(&self) -> Place {
        self.place
    }

    /// Offset from `base` of bytes `offset..offset + len`, after checking they are inside.
    fn range(&self, op: &'static str, offset: u64, len: usize) -> Result<usize, HipError> {
        let out = || HipError::OutOfRange {
            op,
            offset,
            len: len as u64,
            buffer_len: self.len as u64,
        };
        let start = usize::try_from(offset).map_err(|_| out())?;
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.misalign + start),
            _ => Err(out()),
        }
    }

    /// `base + at` as the runtime's copies take it (a host pointer for pinned memory).
    fn at(&self, at: usize) -> *mut c_void {
        self.base.cast::<u8>().wrapping_add(at).cast()
    }

    /// Copies `src` to the start; `src` may be reused on return.
    pub(crate) fn upload(&self, stream: &Stream, src: &[u8]) -> Result<(), HipError> {
        let at = self.range("upload", 0, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        match self.place {
            Place::Device => {
                // SAFETY: `at..at + src.len()` is inside this live device allocation (checked
                // by `range`); `src` is readable for `src.len()` bytes and the runtime only
                // reads it. The stream is synchronized before returning, so the copy has
                // finished with `src` when the caller gets it back.
                check("hipMemcpyHtoDAsync", unsafe {
                    hipMemcpyHtoDAsync(
                        self.at(at),
                        src.as_ptr().cast_mut().cast(),
                        src.len(),
                        stream.raw,
                    )
                })?;
                stream.synchronize()?;
            }
            Place::PinnedHost => {
                // Work enqueued before may read or write these bytes.
                stream.synchronize()?;
                let _host = self
                    .host_access
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // SAFETY: `at..at + src.len()` is inside this live host allocation (`range`);
                // `src` is a distinct Rust slice, so the two do not overlap; the device's work
                // on the stream has finished and other host accesses hold `host_access`.
                unsafe {
                    ptr::copy_nonoverlapping(src.as_ptr(), self.at(at).cast::<u8>(), src.len());
                }
            }
        }
        Ok(())
    }

    /// Copies the start into `dst` after the work enqueued on `stream` before.
    pub(crate) fn download(&self, stream: &Stream, dst: &mut [u8]) -> Result<(), HipError> {
        let at = self.range("download", 0, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        match self.place {
            Place::Device => {
                // SAFETY: `at..at + dst.len()` is inside this live device allocation
                // (`range`); `dst` is writable for `dst.len()` bytes and exclusively borrowed
                // until the stream synchronization below, after which the copy has finished.
                check("hipMemcpyDtoHAsync", unsafe {
                    hipMemcpyDtoHAsync(dst.as_mut_ptr().cast(), self.at(at), dst.len(), stream.raw)
                })?;
                stream.synchronize()?;
            }
            Place::PinnedHost => {
                stream.synchronize()?;
                let _host = self
                    .host_access
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // SAFETY: `at..at + dst.len()` is inside this live host allocation (`range`);
                // `dst` is an exclusive Rust slice, so they do not overlap; the device's work
                // on the stream has finished and other host accesses hold `host_access`.
                unsafe {
                    ptr::copy_nonoverlapping(self.at(at).cast::<u8>(), dst.as_mut_ptr(), dst.len());
                }
            }
        }
        Ok(())
    }

    /// Enqueues copying `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`
    /// (`hipMemcpyDefault`: either may be device or pinned host memory).
    pub(crate) fn copy(
        stream: &Stream,
        src: &Allocation,
        src_offset: u64,
        dst: &Allocation,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), HipError> {
        let n = usize::try_from(len).map_err(|_| too_large("copy", len, 0))?;
        let from = src.range("copy (source)", src_offset, n)?;
        let to = dst.range("copy (destination)", dst_offset, n)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: both ranges are inside live allocations of the runtime (`range`), which the
        // runtime recognizes by address under hipMemcpyDefault. They stay allocated until the
        // copy is done: an Allocation synchronizes its stream before freeing.
        check("hipMemcpyAsync", unsafe {
            hipMemcpyAsync(
                dst.at(to),
                src.at(from),
                n,
                hipMemcpyKind::hipMemcpyDefault as c_int,
                stream.raw,
            )
        })?;
        Ok(())
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if self.base.is_null() {
            return;
        }
        let _ = set_device(self.stream.ordinal());
        // Work enqueued before may still read or write the memory.
        let _ = self.stream.synchronize();
        // SAFETY: `base` is what hipMalloc / hipHostMalloc returned for this value, freed
        // once, here, with the matching call; nothing refers to it afterwards.
        let _ = unsafe {
            match self.place {
                Place::Device => hipFree(self.base),
                Place::PinnedHost => hipHostFree(self.base),
            }
        };
    }
}
