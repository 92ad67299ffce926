//! Where the kernels prefetch rows to: a cache level picked once per machine by CPU vendor.

/// Where the decode kernels prefetch the rows of a later (tile, head) step. A backend's level
/// ([`CpuBackend::prefetch_level`](crate::CpuBackend::prefetch_level)) sets it for its
/// decode kernels, and with it the decode's tile length and the order of large streamed moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchLevel {
    /// `prefetcht0`: on AMD's Zen cores, `prefetcht1` leaves the decode waiting on memory as
    /// if nothing were prefetched.
    L1,
    /// `prefetcht1`: on Intel's Xeon cores, a line prefetched into L1 holds one of the few L1
    /// fill buffers until it arrives, which caps the requests in flight.
    L2,
}

impl PrefetchLevel {
    /// This machine's level: what a backend uses unless told otherwise.
    pub fn of_this_machine() -> Self {
        prefetch_level()
    }

    /// The other level.
    pub fn other(self) -> Self {
        match self {
            PrefetchLevel::L1 => PrefetchLevel::L2,
            PrefetchLevel::L2 => PrefetchLevel::L1,
        }
    }
}

/// The prefetch level for a CPU vendor (the 12 bytes of CPUID leaf 0): Intel's cores take
/// [`PrefetchLevel::L2`], every other (AMD's) [`PrefetchLevel::L1`].
pub(crate) fn prefetch_level_for(vendor: &[u8; 12]) -> PrefetchLevel {
    if vendor == b"GenuineIntel" {
        PrefetchLevel::L2
    } else {
        PrefetchLevel::L1
    }
}

/// Prefetches the line holding `p` to `level`: a hint, which never faults and reads nothing
/// into the program (a no-op off x86_64).
#[inline(always)]
pub(crate) fn prefetch_to(p: *const u8, level: PrefetchLevel) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let p = p as *const i8;
        // `_mm_prefetch` is safe on newer toolchains, hence `unused_unsafe`.
        #[allow(unused_unsafe)]
        // SAFETY: SSE is part of x86_64, and a prefetch is a hint that never faults and reads
        // nothing into the program, whatever the address.
        unsafe {
            match level {
                PrefetchLevel::L1 => _mm_prefetch::<_MM_HINT_T0>(p),
                PrefetchLevel::L2 => _mm_prefetch::<_MM_HINT_T1>(p),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, level);
}

/// Prefetches to `level` every line holding a byte of `[from, end)` past `base` (a hint: the
/// addresses are never dereferenced).
#[inline(always)]
pub(crate) fn prefetch_bytes(base: *const u8, from: usize, end: usize, level: PrefetchLevel) {
    let mut at = from & !63;
    while at < end {
        prefetch_to(base.wrapping_add(at), level);
        at += 64;
    }
}

/// This machine's prefetch level (detected once; `L1` off x86_64, where nothing prefetches).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn prefetch_level() -> PrefetchLevel {
    PrefetchLevel::L1
}

/// This machine's prefetch level (detected once).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn prefetch_level() -> PrefetchLevel {
    static LEVEL: std::sync::OnceLock<PrefetchLevel> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| prefetch_level_for(&super::features::cpu_vendor()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_level_by_vendor() {
        assert_eq!(prefetch_level_for(b"GenuineIntel"), PrefetchLevel::L2);
        assert_eq!(prefetch_level_for(b"AuthenticAMD"), PrefetchLevel::L1);
        assert_eq!(prefetch_level_for(b"HygonGenuine"), PrefetchLevel::L1);
        #[cfg(target_arch = "x86_64")]
        println!("this machine: {:?}", prefetch_level());
    }
}
