//! The memory the machine can still give, which the commands check their estimates against
//! before allocating.

/// Memory the kernel says can be allocated without swapping (`MemAvailable` of
/// `/proc/meminfo`), where it says.
pub(crate) fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
