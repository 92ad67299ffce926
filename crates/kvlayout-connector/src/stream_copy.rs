//! Copies for transfers larger than the caches: stores that bypass them (non-temporal),
//! as a large `memcpy` does, so that a plan of many runs moves at the speed of one region of
//! the same bytes. Owns the copy loop only; which runs go through it is the engine's choice.
//!
//! A cached store first reads the line it writes (read for ownership), a third more memory
//! traffic; `memcpy` avoids that only for one copy above its own threshold (a few MiB), never
//! for the 64 KiB runs of a plan. x86-64 streams 16 bytes at a time (`movntdq`, SSE2, present
//! on every x86-64); other targets copy with `ptr::copy`.

/// Bytes a transfer moves at least before its runs are streamed: past a few MiB the bytes
/// leave the caches before anyone reads them.
pub const STREAM_MIN_TRANSFER_BYTES: u64 = 8 << 20;

/// Bytes a run holds at least to be streamed: shorter runs (rows, head slices of a token)
/// land in lines scattered over many pages, where cached stores measured faster.
pub const STREAM_MIN_RUN_BYTES: usize = 4096;

/// Copies `len` bytes from `src` to `dst` with non-temporal stores where the target has them
/// and the ranges do not overlap (`ptr::copy` otherwise). Call [`stream_fence`] before the
/// bytes are read by another thread.
///
/// # Safety
/// `src..src + len` must be readable and `dst..dst + len` writable for the call, with no
/// Rust reference to either alive meanwhile.
pub unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    let (d, s) = (dst as usize, src as usize);
    let overlap = d < s.wrapping_add(len) && s < d.wrapping_add(len);
    #[cfg(target_arch = "x86_64")]
    if !overlap {
        // SAFETY: the caller's contract, and the ranges do not overlap.
        unsafe { x86::copy_nt(dst, src, len) };
        return;
    }
    let _ = overlap;
    // SAFETY: the caller's contract; `copy` allows overlap.
    unsafe { std::ptr::copy(src, dst, len) };
}

/// Orders the streamed stores before whatever follows (a notification, another thread's
/// read).
pub fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no operands and no precondition; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};

    /// `len` bytes, `dst` aligned to 16 first by a plain copy of the head, then 64 bytes a
    /// step by streaming stores, the tail by a plain copy.
    ///
    /// # Safety
    /// As [`super::copy_streaming`], and the ranges do not overlap.
    pub(super) unsafe fn copy_nt(dst: *mut u8, src: *const u8, len: usize) {
        let head = dst.align_offset(16).min(len);
        // SAFETY: `head <= len` bytes inside both ranges, which do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let (mut i, body_end) = (head, head + (len - head) / 64 * 64);
        while i < body_end {
            // SAFETY: `i + 64 <= len`: inside both ranges. `dst + i` is 16-aligned (the head
            // aligned it, steps are 64), as `_mm_stream_si128` needs; loads are unaligned.
            unsafe {
                let (s, d) = (src.add(i) as *const __m128i, dst.add(i) as *mut __m128i);
                let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
                let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
            i += 64;
        }
        // SAFETY: the last `len - i` bytes of both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_copies_equal_plain_ones_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0usize, 1, 15, 16, 63, 64, 65, 200, 511] {
            for (so, doff) in [(0, 0), (1, 0), (0, 3), (5, 17), (16, 32)] {
                let mut dst = vec![0xAAu8; 1024];
                // SAFETY: both ranges are inside their vectors, which do not overlap.
                unsafe { copy_streaming(dst.as_mut_ptr().add(doff), src.as_ptr().add(so), len) };
                stream_fence();
                assert_eq!(
                    &dst[doff..doff + len],
                    &src[so..so + len],
                    "len {len} at {so},{doff}"
                );
                assert!(dst[..doff].iter().all(|&b| b == 0xAA));
                assert!(dst[doff + len..].iter().all(|&b| b == 0xAA));
            }
        }
    }

    #[test]
    fn overlapping_ranges_copy_like_memmove() {
        let mut buf: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let want: Vec<u8> = buf[0..200].to_vec();
        // SAFETY: both ranges are inside `buf`; they overlap, which the function handles.
        unsafe { copy_streaming(buf.as_mut_ptr().add(50), buf.as_ptr(), 200) };
        assert_eq!(&buf[50..250], &want[..]);
    }
}
