//! Memory an engine registers: [`Region`], one allocation, which the engine either owns
//! ([`Region::owned`]) or borrows from its caller ([`Region::host`] for a byte slice,
//! [`Region::from_raw`] for a pointer and a length, host or device). The engines move bytes
//! through raw pointers only, never Rust references, because a transfer (or, over NIXL, a
//! peer) may write the memory at any time while it is registered.
//!
//! Registration never outlives the memory:
//! - an owned region is freed by the engine, after its last transfer;
//! - a borrowed slice is registered only inside [`crate::MemcpyEngine::scope`], which takes
//!   it back from the engine and its peers before the borrow ends, as `std::thread::scope`
//!   joins its threads;
//! - a raw region is the caller's promise, stated on [`Region::from_raw`].
//!
//! The NIXL engine takes `Region<'static>` only (owned, raw, or a slice borrowed for the
//! program's life), and no scope: NIXL has no abort, so a transfer released early may still
//! write after a scope would have ended.

use std::marker::PhantomData;
use std::ptr::NonNull;

/// Where a region's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemKind {
    /// Host memory.
    Host,
    /// GPU memory of device `id` (CUDA or HIP device ordinal).
    Device {
        /// The device ordinal.
        id: u64,
    },
}

/// One allocation an engine registers: `len` bytes from `ptr`, of kind `kind`, valid for
/// `'m`. See the module doc for who frees it.
#[derive(Debug)]
pub struct Region<'m> {
    ptr: NonNull<u8>,
    len: usize,
    kind: MemKind,
    /// Whether the region is a leaked `Box<[u8]>` this value frees.
    owned: bool,
    _borrow: PhantomData<&'m mut [u8]>,
}

// SAFETY: a region is an address range plus, when owned, the allocation; nothing in it is tied
// to a thread. The engines access it through raw-pointer copies under their own locks.
unsafe impl Send for Region<'_> {}
// SAFETY: as above; shared use only reads the pointer, the length and the kind.
unsafe impl Sync for Region<'_> {}

impl Region<'static> {
    /// A host region the engine owns: `bytes`, moved in without a copy and freed when the
    /// engine and every transfer it posted are gone.
    pub fn owned(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        let ptr = NonNull::from(Box::leak(bytes.into_boxed_slice())).cast::<u8>();
        Region {
            ptr,
            len,
            kind: MemKind::Host,
            owned: true,
            _borrow: PhantomData,
        }
    }
}

impl<'m> Region<'m> {
    /// The caller's host bytes, borrowed for `'m`: register them with an engine's `scope`.
    pub fn host(bytes: &'m mut [u8]) -> Self {
        Region {
            len: bytes.len(),
            ptr: NonNull::from(bytes).cast::<u8>(),
            kind: MemKind::Host,
            owned: false,
            _borrow: PhantomData,
        }
    }

    /// The caller's memory at `ptr`, `len` bytes of `kind` (a pointer from `malloc`, a pinned
    /// buffer, a CUDA or HIP device allocation), not owned by the engine.
    ///
    /// # Safety
    /// The `len` bytes from `ptr` must be one live allocation of `kind`, stay allocated until
    /// the engine it is registered with is dropped and every transfer that engine posted is
    /// complete or dropped, and must not be accessed through Rust references meanwhile (the
    /// engine and, over NIXL, its peers read and write them at any time). `ptr` is not null.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize, kind: MemKind) -> Self {
        Region {
            // The contract says not null; a null pointer becomes a dangling one of length 0
            // rather than undefined behaviour here (the NIXL engine refuses empty regions; the
            // memcpy engine's runs cannot fit in one).
            len: if ptr.is_null() { 0 } else { len },
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            kind,
            owned: false,
            _borrow: PhantomData,
        }
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host or device.
    pub fn kind(&self) -> MemKind {
        self.kind
    }

    /// The address of byte 0.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The same region with its borrow forgotten, for an engine that drops it before `'m`
    /// ends (the scopes).
    pub(crate) fn erase(self) -> Region<'static> {
        let this = std::mem::ManuallyDrop::new(self);
        Region {
            ptr: this.ptr,
            len: this.len,
            kind: this.kind,
            owned: this.owned,
            _borrow: PhantomData,
        }
    }

    /// A copy of `len` bytes from `offset` (host regions; the caller checked the range).
    pub(crate) fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        debug_assert!(self.kind == MemKind::Host && offset + len <= self.len);
        let mut out = vec![0u8; len];
        // SAFETY: the range is inside the region (checked by the caller), which is valid host
        // memory while `self` lives; `out` is a fresh allocation of `len` bytes, so the two
        // do not overlap. No reference to the region is made (a transfer may write it).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr().add(offset), out.as_mut_ptr(), len) };
        out
    }

    /// Writes `bytes` at `offset` (host regions; the caller checked the range).
    pub(crate) fn write(&self, offset: usize, bytes: &[u8]) {
        debug_assert!(self.kind == MemKind::Host && offset + bytes.len() <= self.len);
        // SAFETY: the range is inside the region (checked by the caller), valid host memory
        // while `self` lives; `bytes` is caller memory that no registered region can alias as
        // a reference (regions are never lent out as references). Writing through the raw
        // pointer of a shared region is the design: engines serialize their own writes.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr().add(offset), bytes.len())
        };
    }

    /// Copies `len` bytes from `src` at `src_offset` to `self` at `dst_offset` (host regions;
    /// the caller checked both ranges).
    pub(crate) fn copy_from(
        &self,
        dst_offset: usize,
        src: &Region<'_>,
        src_offset: usize,
        len: usize,
    ) {
        debug_assert!(dst_offset + len <= self.len && src_offset + len <= src.len);
        // SAFETY: both ranges are inside their regions (checked by the caller), valid host
        // memory while both live. `copy` allows overlap, which raw regions registered twice
        // could produce.
        unsafe { std::ptr::copy(src.ptr().add(src_offset), self.ptr().add(dst_offset), len) };
    }

    /// [`Region::copy_from`] with stores that bypass the caches
    /// ([`crate::stream_copy::copy_streaming`]); [`crate::stream_copy::stream_fence`] orders
    /// them before the bytes are read elsewhere.
    pub(crate) fn stream_from(
        &self,
        dst_offset: usize,
        src: &Region<'_>,
        src_offset: usize,
        len: usize,
    ) {
        debug_assert!(dst_offset + len <= self.len && src_offset + len <= src.len);
        // SAFETY: both ranges are inside their regions (checked by the caller), valid host
        // memory while both live, reached through raw pointers only; overlap is handled.
        unsafe {
            crate::stream_copy::copy_streaming(
                self.ptr().add(dst_offset),
                src.ptr().add(src_offset),
                len,
            )
        };
    }
}

impl Drop for Region<'_> {
    fn drop(&mut self) {
        if self.owned {
            let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
            // SAFETY: an owned region's pointer and length are exactly what `Box::leak` gave in
            // `owned`, freed once, here. The engines keep their regions alive (behind an
            // `Arc`) while any transfer they posted holds them.
            drop(unsafe { Box::from_raw(raw) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_and_borrowed_regions_read_and_write_their_bytes() {
        let owned = Region::owned(vec![1, 2, 3, 4]);
        assert_eq!((owned.len(), owned.kind()), (4, MemKind::Host));
        assert_eq!(owned.read(1, 2), vec![2, 3]);
        owned.write(0, &[9, 8]);
        assert_eq!(owned.read(0, 4), vec![9, 8, 3, 4]);

        let mut bytes = vec![0u8; 6];
        {
            let borrowed = Region::host(&mut bytes);
            borrowed.copy_from(2, &owned, 0, 4);
        }
        assert_eq!(bytes, vec![0, 0, 9, 8, 3, 4]);
    }

    #[test]
    fn a_null_raw_region_is_empty() {
        // SAFETY: a null pointer is turned into an empty region, never dereferenced.
        let r = unsafe { Region::from_raw(std::ptr::null_mut(), 64, MemKind::Device { id: 0 }) };
        assert!(r.is_empty());
    }
}
