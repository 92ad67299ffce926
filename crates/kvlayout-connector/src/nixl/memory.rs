//! The engine's raw host memory: [`HostBuffer`] (one registered allocation, never lent out as
//! a Rust reference), [`HostMemory`] (the engine's buffers, copied in and out through raw
//! pointers) and [`InFlight`] (the count of transfers posted and not finished). The `unsafe`
//! code of the NIXL engine's memory lives here, each block with its `SAFETY` argument.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nixl_sys::{MemType, MemoryRegion, NixlDescriptor};

#[cfg(doc)]
use super::NixlPending;

/// One registered host buffer: an allocation the engine owns and never lends out as a Rust
/// reference, because NIXL (a peer's WRITE, a READ in flight) may write it at any time.
#[derive(Debug)]
pub(super) struct HostBuffer {
    ptr: NonNull<u8>,
    pub(super) len: usize,
}

// SAFETY: the buffer is a plain heap allocation owned by this value; nothing in it is tied to
// a thread. Access goes through raw-pointer copies only (`HostMemory`), never references.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; shared use only reads the pointer and the length.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Takes ownership of `bytes` without copying them.
    pub(super) fn new(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        let ptr = NonNull::from(Box::leak(bytes.into_boxed_slice())).cast::<u8>();
        HostBuffer { ptr, len }
    }

    pub(super) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: `raw` is exactly the pointer and length `Box::leak` gave in `new`, and
        // it is freed once, here. The engine's drop order (registrations, then the agent,
        // then the memory) and the memory's `Arc` in every pending transfer ensure NIXL no
        // longer uses it.
        drop(unsafe { Box::from_raw(raw) });
    }
}

impl MemoryRegion for HostBuffer {
    /// The start of the buffer: valid for `size()` bytes while the buffer lives; NIXL
    /// registers it and moves bytes through it, never Rust references.
    ///
    /// # Safety
    /// None beyond the trait's: the body only reads the pointer; a caller dereferencing it
    /// must not outlive the buffer nor create a Rust reference to bytes a transfer may write.
    unsafe fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for HostBuffer {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

/// The engine's cache buffers. Kept alive by every transfer posted from them, so no transfer
/// can outlive its memory.
#[derive(Debug)]
pub(super) struct HostMemory {
    pub(super) buffers: Vec<HostBuffer>,
}

impl HostMemory {
    pub(super) fn lens(&self) -> Vec<u64> {
        self.buffers.iter().map(|b| b.len as u64).collect()
    }

    /// A copy of every buffer.
    pub(super) fn read(&self) -> Vec<Vec<u8>> {
        self.buffers
            .iter()
            .map(|b| {
                let mut out = vec![0u8; b.len];
                // SAFETY: `b.ptr` is valid for `b.len` bytes while `self` lives and `out` has
                // `b.len` bytes; the two do not overlap. No reference to the registered memory
                // is made: a peer may write it concurrently (any byte value is a valid `u8`).
                unsafe { std::ptr::copy_nonoverlapping(b.ptr.as_ptr(), out.as_mut_ptr(), b.len) };
                out
            })
            .collect()
    }

    /// Overwrites every buffer with `bytes` (the caller has checked the shapes).
    pub(super) fn write(&self, bytes: &[Vec<u8>]) {
        for (b, src) in self.buffers.iter().zip(bytes) {
            let n = b.len.min(src.len());
            // SAFETY: `b.ptr` is valid for `b.len >= n` bytes and `src` holds `n` bytes; they
            // do not overlap (`src` is caller memory). Writing through the raw pointer from a
            // shared `HostMemory` is the buffer's design: it is never lent as a reference.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), b.ptr.as_ptr(), n) };
        }
    }
}

/// Counts transfers posted and not finished; each [`NixlPending`] holds one count until it
/// completes, fails, is cancelled or dropped.
#[derive(Debug)]
pub(super) struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    pub(super) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(count))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
