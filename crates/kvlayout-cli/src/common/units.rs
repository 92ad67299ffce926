//! Byte counts as text and as GiB, the one way every command prints them. It does not own
//! bandwidths: those are each report's own `bytes / time` in GB/s (1e9 bytes/s).

/// Bytes in a GiB.
const GIB: f64 = (1u64 << 30) as f64;

/// `bytes` in GiB (2^30 bytes).
pub(crate) fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

/// [`gib`] of a count that may pass `u64` (an estimate summed in `u128`).
pub(crate) fn gib_wide(bytes: u128) -> f64 {
    bytes as f64 / GIB
}

/// `bytes` in the largest binary unit (B, KiB, MiB, GiB) it has at least one of, one word:
/// `1023B`, `1.5MiB`.
pub(crate) fn binary_size(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut size = bytes as f64;
    let mut unit = 0;
    while size >= 1024.0 && unit + 1 < units.len() {
        size /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else {
        format!("{size:.1}{}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_one_word_in_the_largest_unit() {
        assert_eq!(binary_size(0), "0B");
        assert_eq!(binary_size(1023), "1023B");
        assert_eq!(binary_size(32 << 10), "32.0KiB");
        assert_eq!(binary_size(3 << 19), "1.5MiB");
        assert_eq!(binary_size(5 << 30), "5.0GiB");
        assert_eq!(binary_size(1 << 50), "1048576.0GiB");
    }

    #[test]
    fn gib_is_two_to_the_thirty() {
        assert_eq!(gib(3 << 29), 1.5);
        assert_eq!(gib_wide(1u128 << 70), (1u64 << 40) as f64);
    }
}
