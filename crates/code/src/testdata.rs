//! Deterministic byte patterns (xorshift64), shared by the checked-in vectors, the ISA-L
//! cross-checks and the benchmarks so that all of them talk about the same inputs.

/// `len` bytes from the xorshift64 stream seeded by `seed` (an even seed is made odd).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
