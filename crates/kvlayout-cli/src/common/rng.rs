//! The seeded random numbers of the commands' data (`fill --pattern random`, `decode`'s
//! tokens, queries and block table, `bench`'s block table and activations): xorshift64, the
//! same sequence on every machine. It does not own what the numbers become.

/// xorshift64.
pub(crate) struct Rng(u64);

impl Rng {
    /// The generator of a user's `--seed`: the seed spread over the bits, never 0.
    pub(crate) fn seeded(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The generator that starts at `state` as given (`state | 1`, never 0).
    pub(crate) fn from_state(state: u64) -> Self {
        Self(state | 1)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut s = self.0;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        self.0 = s;
        s
    }

    /// Uniform in [0, 1), 24 bits.
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1), 24 bits.
    pub(crate) fn signed_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values of [`Rng::signed_unit`].
    pub(crate) fn signed_units(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.signed_unit()).collect()
    }

    /// `0..n` in a random order (Fisher-Yates).
    pub(crate) fn permutation(&mut self, n: u64) -> Vec<u64> {
        let mut v: Vec<u64> = (0..n).collect();
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next_u64() % (i as u64 + 1)) as usize);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first values of xorshift64 from state 1, worked by hand from its three shifts.
    #[test]
    fn the_sequence_is_xorshift64() {
        let mut r = Rng::from_state(1);
        let mut s: u64 = 1;
        for _ in 0..5 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            assert_eq!(r.next_u64(), s);
        }
        assert_eq!(Rng::from_state(1).next_u64(), 0x0000_0000_4082_2041);
    }

    #[test]
    fn units_are_in_range_and_permutations_hold_every_index() {
        let mut r = Rng::seeded(7);
        for _ in 0..1000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u), "{u}");
            let s = r.signed_unit();
            assert!((-1.0..1.0).contains(&s), "{s}");
        }
        let mut p = r.permutation(50);
        assert_ne!(p, (0..50).collect::<Vec<u64>>(), "shuffled");
        p.sort_unstable();
        assert_eq!(p, (0..50).collect::<Vec<u64>>());
    }
}
