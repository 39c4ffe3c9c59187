//! GF(2^16) built as the tower GF(2^8)[x] / (x^2 + x + T). A word is (lo, hi) = hi * x + lo,
//! stored as `lo | hi << 8`. Because GF(2^8) is a subfield, multiplying a word by a byte c
//! multiplies both halves by c: bytewise Reed–Solomon arithmetic on data is field arithmetic
//! on its words, which is what lets signatures commute with the parity.

use std::sync::OnceLock;

pub use crate::gf::apply;
use crate::gf::tables::mul_bitwise;
use crate::gf::{mul, WordMul};

const fn find_t() -> u8 {
    // x^2 + x + t is irreducible over GF(2^8) iff no y has y^2 + y = t.
    let mut t = 1u16;
    while t < 256 {
        let mut has_root = false;
        let mut y = 0u16;
        while y < 256 {
            if (mul_bitwise(y as u8, y as u8) ^ y as u8) == t as u8 {
                has_root = true;
            }
            y += 1;
        }
        if !has_root {
            return t as u8;
        }
        t += 1;
    }
    panic!("an irreducible quadratic always exists");
}

/// The constant of the tower's defining polynomial x^2 + x + T (the smallest that works).
pub const T: u8 = find_t();

/// The product of two words.
#[inline]
pub fn mul16(a: u16, b: u16) -> u16 {
    let (a0, a1, b0, b1) = (a as u8, (a >> 8) as u8, b as u8, (b >> 8) as u8);
    let a1b1 = mul(a1, b1);
    let lo = mul(a1b1, T) ^ mul(a0, b0);
    let hi = a1b1 ^ mul(a1, b0) ^ mul(a0, b1);
    lo as u16 | (hi as u16) << 8
}

/// A word times a byte of the subfield: both halves scaled.
#[inline]
pub fn scale16(a: u16, c: u8) -> u16 {
    mul(a as u8, c) as u16 | (mul((a >> 8) as u8, c) as u16) << 8
}

/// Multiplication by `g` as the 2x2 matrix over GF(2^8) that the engines apply to (lo, hi).
pub fn word_mul(g: u16) -> WordMul {
    let (g0, g1) = (g as u8, (g >> 8) as u8);
    [g0, mul(g1, T), g1, g0 ^ g1]
}

/// The order of the multiplicative group.
pub const ORDER: u32 = 65535;

struct Logs {
    exp: Vec<u16>,
    log: Vec<u16>,
    alpha: u16,
}

fn logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        // The smallest primitive word: alpha^(65535/p) != 1 for every prime p | 65535.
        let pow = |a: u16, mut e: u32| {
            let (mut r, mut b) = (1u16, a);
            while e > 0 {
                if e & 1 != 0 {
                    r = mul16(r, b);
                }
                b = mul16(b, b);
                e >>= 1;
            }
            r
        };
        let alpha = (2u16..)
            .find(|&a| [3u32, 5, 17, 257].iter().all(|p| pow(a, ORDER / p) != 1))
            .expect("GF(2^16) has primitive elements");
        let mut exp = vec![0u16; ORDER as usize];
        let mut log = vec![0u16; 1 << 16];
        let mut x = 1u16;
        for (i, e) in exp.iter_mut().enumerate() {
            *e = x;
            log[x as usize] = i as u16;
            x = mul16(x, alpha);
        }
        Logs { exp, log, alpha }
    })
}

/// The primitive element the signatures are built on.
pub fn alpha() -> u16 {
    logs().alpha
}

/// alpha^e.
#[inline]
pub fn alpha_pow(e: u64) -> u16 {
    logs().exp[(e % ORDER as u64) as usize]
}

/// The discrete logarithm of a nonzero word to base alpha.
pub fn log(a: u16) -> Option<u32> {
    (a != 0).then(|| logs().log[a as usize] as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tower_is_a_field() {
        // Every nonzero word has an inverse: alpha generates all 65535 of them.
        let mut seen = vec![false; 1 << 16];
        for e in 0..ORDER as u64 {
            let a = alpha_pow(e);
            assert!(!seen[a as usize], "alpha^{e} repeats");
            seen[a as usize] = true;
        }
        assert!(!seen[0]);
        let (a, b, c) = (0x1234, 0xBEEF, 0x0F0F);
        assert_eq!(mul16(a, mul16(b, c)), mul16(mul16(a, b), c));
        assert_eq!(mul16(a, b ^ c), mul16(a, b) ^ mul16(a, c));
    }

    #[test]
    fn subfield_scaling_is_field_multiplication() {
        for c in 0..=255u8 {
            for a in [0u16, 1, 0x00FF, 0xFF00, 0x1234, 0xABCD] {
                assert_eq!(scale16(a, c), mul16(a, c as u16));
            }
        }
    }

    #[test]
    fn word_mul_matches_mul16() {
        for g in [1u16, 2, 0x100, 0x1234, alpha(), alpha_pow(77)] {
            let m = word_mul(g);
            for a in [0u16, 1, 0x8000, 0x00FF, 0x5A5A, 0xFFFF] {
                assert_eq!(apply(&m, a), mul16(a, g));
            }
        }
        assert_eq!(log(alpha_pow(1000)), Some(1000));
    }
}
