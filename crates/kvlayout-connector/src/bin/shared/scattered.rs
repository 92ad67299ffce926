//! Scattered block ids, for the bench binaries and the planner's property test
//! (`tests/plan.rs`).

/// `n` distinct block ids below `limit` in a pseudo-random order (a seeded shuffle).
pub fn scattered(n: u64, limit: u64, seed: u64) -> Vec<u64> {
    let mut ids: Vec<u64> = (0..limit).collect();
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in (1..ids.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids.swap(i, (s % (i as u64 + 1)) as usize);
    }
    ids.truncate(n as usize);
    ids
}
