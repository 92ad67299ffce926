//! How a mover writes a unit: `memcpy`, or non-temporal stores of the backend's kernel build
//! (AVX-512, AVX) that bypass the caches when a move is far larger than they are.

use crate::arch::Isa;

/// Bytes moved by one op above which destination writes bypass the caches.
pub(super) const STREAM_THRESHOLD: u64 = 8 << 20;

/// How a unit's destination is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stream {
    /// Through the caches (`memcpy`).
    No,
    /// Non-temporal 64-byte stores (AVX-512).
    Avx512,
    /// Non-temporal 32-byte stores (AVX).
    Avx,
}

/// The non-temporal stores of the backend's kernel build (which this machine runs): 64-byte
/// stores on the AVX-512 builds, 32-byte on AVX2, none on scalar; so the tests of each build
/// exercise its stores on any machine.
pub(super) fn stream_kind(isa: Isa) -> Stream {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512() {
            return Stream::Avx512;
        }
        if isa == Isa::Avx2 {
            return Stream::Avx;
        }
    }
    let _ = isa;
    Stream::No
}

/// Copies `len` bytes; with a `Stream` other than `No` (detected by [`stream_kind`]),
/// 64-byte-aligned destinations of whole 64-byte lines are written with non-temporal stores,
/// saving the read-for-ownership traffic.
///
/// # Safety
/// `src` and `dst` are valid for `len` bytes and do not overlap; `stream` comes from
/// [`stream_kind`] of a build this machine runs (its instructions are present).
#[inline]
pub(super) unsafe fn copy_unit(src: *const u8, dst: *mut u8, len: usize, stream: Stream) {
    #[cfg(target_arch = "x86_64")]
    if stream != Stream::No && (dst as usize).is_multiple_of(64) && len.is_multiple_of(64) {
        // SAFETY: the build's features are present (`stream` comes from `stream_kind` of a
        // build this machine runs: the caller's contract); `dst` is 64-byte aligned and `len` a
        // multiple of 64 (checked just above); the ranges as in this function's contract.
        return unsafe {
            match stream {
                Stream::Avx512 => stream_avx512(src, dst, len),
                _ => stream_avx(src, dst, len),
            }
        };
    }
    let _ = stream;
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Copies `len` bytes with 64-byte non-temporal stores.
///
/// # Safety
/// AVX-512 F present; `src` and `dst` valid for `len` bytes and not overlapping; `dst`
/// 64-byte aligned and `len` a multiple of 64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_avx512(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::*;
    let mut i = 0;
    while i < len {
        // SAFETY: `i + 64 <= len` (`len` is a multiple of 64), so both ranges are inside the
        // caller's; `dst + i` is 64-byte aligned, as the non-temporal store needs.
        unsafe {
            let v = _mm512_loadu_si512(src.add(i) as *const _);
            _mm512_stream_si512(dst.add(i) as *mut _, v);
        }
        i += 64;
    }
}

/// Copies `len` bytes with 32-byte non-temporal stores.
///
/// # Safety
/// AVX present; `src` and `dst` valid for `len` bytes and not overlapping; `dst` 32-byte
/// aligned and `len` a multiple of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_avx(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::*;
    let mut i = 0;
    while i < len {
        // SAFETY: `i + 32 <= len` (`len` is a multiple of 32), so both ranges are inside the
        // caller's; `dst + i` is 32-byte aligned, as the non-temporal store needs.
        unsafe {
            let v = _mm256_loadu_si256(src.add(i) as *const __m256i);
            _mm256_stream_si256(dst.add(i) as *mut __m256i, v);
        }
        i += 32;
    }
}

/// Orders this thread's non-temporal stores before anything that follows.
pub(super) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions (SSE is baseline on x86_64).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}
