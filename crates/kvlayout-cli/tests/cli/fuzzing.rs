//! What the randomized bad-input tests share: their time budget (`KVLAYOUT_FUZZ_SECONDS`,
//! 3 s by default) and a seeded xorshift64, the same inputs on every machine.

/// Seconds each randomized test runs for.
pub(crate) fn seconds() -> f64 {
    std::env::var("KVLAYOUT_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(3.0)
}

/// xorshift64 (a non-zero state).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub(crate) fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}
