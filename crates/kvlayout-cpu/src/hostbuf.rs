//! An owned, zero-filled byte buffer in host memory, 64-byte aligned. A buffer of at least
//! [`HUGE`] bytes is aligned to it and, on Linux, advised as transparent huge pages before it is
//! first touched: a decode reads blocks in the block table's (random) order, and with 4 KiB
//! pages almost every block is a TLB miss that software prefetches do not get past.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Size and alignment of a huge page (x86-64 and aarch64 with 4 KiB base pages).
pub(crate) const HUGE: usize = 2 << 20;

/// A type whose dangling pointer is 64-byte aligned (the empty buffer's address).
#[repr(align(64))]
struct Align64;

pub(crate) struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// The allocation's layout (`None`: nothing allocated, `len` is 0).
    layout: Option<Layout>,
}

// SAFETY: the buffer owns its bytes (no interior mutability, no aliasing); `&HostBuffer` gives
// shared reads only and `&mut HostBuffer` exclusive writes, as for `Vec<u8>`.
unsafe impl Send for HostBuffer {}
// SAFETY: as above.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// `len` zero bytes (aborts on allocation failure, as `Vec` does).
    pub(crate) fn zeroed(len: usize) -> Self {
        if len == 0 {
            return HostBuffer {
                ptr: NonNull::<Align64>::dangling().cast(),
                len: 0,
                layout: None,
            };
        }
        let align = if len >= HUGE { HUGE } else { 64 };
        let layout = Layout::from_size_align(len.next_multiple_of(align), align)
            .unwrap_or_else(|_| panic!("a host buffer of {len} bytes exceeds the address space"));
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        if align == HUGE {
            advise_huge(ptr.as_ptr(), layout.size());
        }
        // SAFETY: `ptr` is valid for `layout.size() >= len` bytes; zeroing is the first touch,
        // so the advice above applies to every page.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, layout.size()) };
        HostBuffer {
            ptr,
            len,
            layout: Some(layout),
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid and initialized for `len` bytes (dangling but aligned when
        // `len` is 0), owned by `self` and not mutated while `&self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for HostBuffer {
    fn clone(&self) -> Self {
        let mut b = HostBuffer::zeroed(self.len);
        b.as_mut_slice().copy_from_slice(self.as_slice());
        b
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `zeroed` with this very layout, freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Asks the kernel to back `[ptr, ptr + len)` with transparent huge pages (a hint: ignored
/// where THP is off, and a failure only costs speed).
#[cfg(target_os = "linux")]
fn advise_huge(ptr: *mut u8, len: usize) {
    // SAFETY: `madvise` with MADV_HUGEPAGE on a range this process owns changes no memory
    // contents; the range is 2 MiB aligned as the call requires.
    let _ = unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_ptr: *mut u8, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_cloned() {
        for len in [0, 1, 63, 64, 4097, HUGE - 1, HUGE, HUGE + 5] {
            let mut b = HostBuffer::zeroed(len);
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|x| *x == 0));
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            if len >= HUGE {
                assert_eq!(b.as_slice().as_ptr() as usize % HUGE, 0);
            }
            if len > 0 {
                b.as_mut_slice()[len - 1] = 7;
            }
            let c = b.clone();
            assert_eq!(c.as_slice(), b.as_slice());
        }
    }
}
