//! Host memory that emulated kernels write through raw addresses while Rust holds shared
//! references to it: 64-byte lines in `UnsafeCell`s, so writes the Rust side does not see are
//! allowed. Zeroed allocation and copies in and out are the module's only unsafe code.

use std::cell::UnsafeCell;

/// `len` bytes starting `start` bytes into 64-byte aligned storage (a non-zero `start` makes
/// a misaligned allocation).
#[derive(Debug)]
pub(crate) struct HostAlloc {
    lines: Box<[UnsafeCell<Line>]>,
    start: usize,
    len: usize,
}

#[repr(C, align(64))]
#[derive(Debug)]
struct Line([u8; 64]);

impl HostAlloc {
    /// Zeroed `len` bytes, `start` (< 64) bytes past a 64-byte boundary; `None` when the
    /// allocator has no such memory. The storage comes zeroed from the allocator, so the pages
    /// of a large allocation cost memory only when touched.
    pub(crate) fn new(len: usize, start: usize) -> Option<Self> {
        let lines = start.checked_add(len)?.div_ceil(64).max(1);
        let layout = std::alloc::Layout::array::<UnsafeCell<Line>>(lines).ok()?;
        // SAFETY: `layout` has a non-zero size (at least one line).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<UnsafeCell<Line>>();
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` is a live allocation of the global allocator with the layout of
        // `lines` cells, all-zero bytes are a valid `UnsafeCell<Line>` (a byte array), and the
        // box takes it over (freed with the same layout when dropped).
        let lines = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, lines)) };
        Some(HostAlloc { lines, start, len })
    }

    fn base(&self) -> *mut u8 {
        // `UnsafeCell<Line>` has the layout of `Line`, so the cells are one run of bytes.
        UnsafeCell::raw_get(self.lines.as_ptr()).cast::<u8>()
    }

    /// Address of byte 0.
    pub(crate) fn address(&self) -> u64 {
        self.base() as u64 + self.start as u64
    }

    /// Bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies `src` to byte `offset`; the caller checked `offset + src.len() <= len`.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        assert!(within(offset, src.len(), self.len));
        // SAFETY: the destination lies inside the cells (checked above), whose contents may be
        // written through a raw pointer while shared references to the cells exist; `src` is
        // Rust memory, not in these cells (a `&[u8]` of them cannot be made).
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.base().add(self.start + offset),
                src.len(),
            )
        }
    }

    /// Copies from byte `offset` into `dst`; the caller checked the range.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(within(offset, dst.len(), self.len));
        // SAFETY: the source lies inside the cells (checked above), readable through a raw
        // pointer; `dst` is exclusive Rust memory outside them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base().add(self.start + offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }

    /// Copies `len` bytes between two allocations (or within one: overlap allowed).
    pub(crate) fn copy(src: &HostAlloc, so: usize, dst: &HostAlloc, dof: usize, len: usize) {
        assert!(within(so, len, src.len) && within(dof, len, dst.len));
        // SAFETY: both ranges lie inside their cells (checked above); `ptr::copy` allows the
        // ranges to overlap.
        unsafe {
            std::ptr::copy(
                src.base().add(src.start + so),
                dst.base().add(dst.start + dof),
                len,
            )
        }
    }
}

/// Whether bytes `offset .. offset + len` lie inside `size` bytes (an overflowing end does
/// not, in release builds too).
fn within(offset: usize, len: usize, size: usize) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}
