//! An owned, zero-filled byte buffer in host memory, 64-byte aligned. A buffer of at least
//! [`HUGE`] bytes is aligned to it and, on Linux, advised as transparent huge pages before it is
//! first touched: a decode reads blocks in the block table's (random) order, and with 4 KiB
//! pages almost every block is a TLB miss that software prefetches do not get past. Such a
//! buffer is obtained with `mmap` on Linux, whose pages read as zero until first written: a
//! cache of tens of GiB is allocated at once, and each page costs its fault when first used
//! (not a single-threaded zeroing pass up front: 2 GiB took seconds). Allocation failure is a
//! value ([`HostBuffer::try_zeroed`]), so a cache too large for the machine is an error, not an
//! abort.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Size and alignment of a huge page (x86-64 and aarch64 with 4 KiB base pages).
pub(crate) const HUGE: usize = 2 << 20;

/// A type whose dangling pointer is 64-byte aligned (the empty buffer's address).
#[repr(align(64))]
struct Align64;

/// Where a buffer's bytes come from.
enum Backing {
    /// Nothing allocated (`len` is 0).
    Empty,
    /// The global allocator, with this layout.
    Heap(Layout),
    /// An anonymous mapping of `len` bytes from `base` (the buffer starts inside it, aligned).
    #[cfg(target_os = "linux")]
    Mapped { base: *mut u8, len: usize },
}

pub(crate) struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: the buffer owns its bytes (no interior mutability, no aliasing); `&HostBuffer` gives
// shared reads only and `&mut HostBuffer` exclusive writes, as for `Vec<u8>`.
unsafe impl Send for HostBuffer {}
// SAFETY: as above.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// `len` zero bytes (aborts on allocation failure, as `Vec` does).
    pub(crate) fn zeroed(len: usize) -> Self {
        HostBuffer::try_zeroed(len).unwrap_or_else(|()| {
            alloc::handle_alloc_error(
                Layout::from_size_align(len, 64).unwrap_or_else(|_| Layout::new::<Align64>()),
            )
        })
    }

    /// `len` zero bytes, or `Err` when the machine cannot provide them.
    pub(crate) fn try_zeroed(len: usize) -> Result<Self, ()> {
        if len == 0 {
            return Ok(HostBuffer {
                ptr: NonNull::<Align64>::dangling().cast(),
                len: 0,
                backing: Backing::Empty,
            });
        }
        #[cfg(target_os = "linux")]
        if len >= HUGE {
            return HostBuffer::mapped(len);
        }
        let align = if len >= HUGE { HUGE } else { 64 };
        let layout = Layout::from_size_align(len.next_multiple_of(align), align).map_err(|_| ())?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(())?;
        if align == HUGE {
            advise_huge(ptr.as_ptr(), layout.size());
        }
        Ok(HostBuffer {
            ptr,
            len,
            backing: Backing::Heap(layout),
        })
    }

    /// An anonymous private mapping, trimmed so that the buffer starts on a [`HUGE`] boundary,
    /// advised as huge pages before any page is touched. Its pages read as zero.
    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Result<Self, ()> {
        let size = len.checked_next_multiple_of(HUGE).ok_or(())?;
        let map_len = size.checked_add(HUGE).ok_or(())?;
        // SAFETY: a new anonymous private mapping (no file, no fixed address); checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(());
        }
        let base = base.cast::<u8>();
        let start = (base as usize).next_multiple_of(HUGE) - base as usize;
        // SAFETY: `start < HUGE` and `start + size <= map_len`: inside the mapping.
        let ptr = unsafe { base.add(start) };
        advise_huge(ptr, size);
        Ok(HostBuffer {
            // Non-null: inside a successful mapping.
            ptr: NonNull::new(ptr).ok_or(())?,
            len,
            backing: Backing::Mapped { base, len: map_len },
        })
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid and initialized (allocated zeroed, or mapped pages, which read
        // as zero) for `len` bytes (dangling but aligned when `len` is 0), owned by `self` and
        // not mutated while `&self` lives.
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
        match self.backing {
            Backing::Empty => {}
            // SAFETY: allocated in `try_zeroed` with this very layout, freed once.
            Backing::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: the mapping made in `mapped`, unmapped once.
            #[cfg(target_os = "linux")]
            Backing::Mapped { base, len } => unsafe {
                libc::munmap(base.cast(), len);
            },
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
        for len in [0, 1, 63, 64, 4097, HUGE - 1, HUGE, HUGE + 5, 3 * HUGE + 1] {
            let mut b = HostBuffer::zeroed(len);
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|x| *x == 0));
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            if len >= HUGE {
                assert_eq!(b.as_slice().as_ptr() as usize % HUGE, 0);
            }
            if len > 0 {
                b.as_mut_slice()[0] = 9;
                b.as_mut_slice()[len - 1] = 7;
            }
            let c = b.clone();
            assert_eq!(c.as_slice(), b.as_slice());
        }
    }

    /// More bytes than any machine maps (1 PiB, past the 128 TiB a process can address without
    /// asking for more): an `Err`, not an abort.
    #[test]
    fn impossible_sizes_are_errors() {
        assert!(HostBuffer::try_zeroed(1 << 50).is_err());
        assert!(HostBuffer::try_zeroed(usize::MAX - 4096).is_err());
    }
}
