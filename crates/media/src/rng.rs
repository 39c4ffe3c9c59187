//! A small seeded generator (SplitMix64) for fault injection and crash draws.
//!
//! Faults must replay exactly from a seed, on every machine and every version of our
//! dependencies, so the generator is ours and its stream is fixed.

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, passes BigCrush, trivially seedable.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), without modulo bias worth measuring (Lemire's multiply).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// How many Bernoulli(p) trials fail before the next success: lets a per-bit rate be
    /// applied to a large range in time proportional to the number of hits, not of bits.
    /// Returns `u64::MAX` for p <= 0.
    pub fn geometric_skip(&mut self, p: f64) -> u64 {
        if p <= 0.0 {
            return u64::MAX;
        }
        if p >= 1.0 {
            return 0;
        }
        let u = 1.0 - self.unit(); // (0, 1]
        let skip = (u.ln() / (1.0 - p).ln()).floor();
        if skip >= u64::MAX as f64 {
            u64::MAX
        } else {
            skip as u64
        }
    }

    /// `n` distinct values from `0..range` (n <= range), in draw order.
    pub fn distinct(&mut self, n: usize, range: u64) -> Vec<u64> {
        debug_assert!(n as u64 <= range);
        let mut picked = std::collections::HashSet::with_capacity(n);
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let v = self.below(range);
            if picked.insert(v) {
                out.push(v);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_is_fixed() {
        // The first outputs of SplitMix64 seeded with 0, as published with the algorithm.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = Rng::new(7);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let v = r.below(10);
            assert!(v < 10);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn geometric_skip_has_the_right_mean() {
        let mut r = Rng::new(3);
        let p = 0.01;
        let n = 20_000;
        let mean = (0..n).map(|_| r.geometric_skip(p) as f64).sum::<f64>() / n as f64;
        // Mean of failures before success is (1-p)/p = 99.
        assert!((mean - 99.0).abs() < 5.0, "mean {mean}");
        assert_eq!(r.geometric_skip(0.0), u64::MAX);
        assert_eq!(r.geometric_skip(1.0), 0);
    }

    #[test]
    fn distinct_is_distinct() {
        let mut r = Rng::new(9);
        let v = r.distinct(100, 100);
        let mut s = v.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 100);
    }
}
