//! A small, stable pseudo-random generator (SplitMix64) for data generation and sampling.
//!
//! Written out here rather than taken from a crate so that a seed produces the same data on
//! every platform and in every future build: synthetic data sets are part of the results.

/// SplitMix64: 64 bits of state, passes BigCrush, and never changes its output for a seed.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose output depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// A generator for one of several independent streams derived from `seed` (for example
    /// one stream per training step, so a resumed run draws the same batches).
    pub fn for_stream(seed: u64, stream: u64) -> Self {
        let mut mix = Rng::new(seed ^ 0x5851_f42d_4c95_7f2d);
        let a = mix.next_u64();
        Rng::new(a ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "Rng::below(0)");
        // Multiply-shift: bias is below 2^-32 for the sizes used here.
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A stable 64-bit hash of bytes (FNV-1a), used to split examples into train and held-out parts.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::new(7);
        let b: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(Rng::new(8).next_u64(), a[0]);
        assert_ne!(
            Rng::for_stream(7, 1).next_u64(),
            Rng::for_stream(7, 2).next_u64()
        );
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = Rng::new(1);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let x = r.below(5);
            seen[x] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
