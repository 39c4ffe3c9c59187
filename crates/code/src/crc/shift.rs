//! Multiplication by x^(8 len) modulo the CRC-32C polynomial, in the reflected form the CRC
//! register uses (bit 31 is x^0).

use std::sync::OnceLock;

/// The reflected CRC-32C polynomial (without x^32).
const POLY: u32 = 0x82F6_3B78;
/// x^0 in the reflected form.
const ONE: u32 = 1 << 31;

/// a * b mod P, bit by bit: the portable multiplication, and the reference for the fast one.
pub(crate) const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut p = 0u32;
    let mut m = ONE;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        m >>= 1;
    }
    p
}

/// x^n mod P (a `const fn`: the folding kernel's keys are computed at compile time).
pub(crate) const fn x_pow(mut n: u64) -> u32 {
    let (mut r, mut sq) = (ONE, ONE >> 1);
    while n > 0 {
        if n & 1 != 0 {
            r = mul_mod(r, sq);
        }
        sq = mul_mod(sq, sq);
        n >>= 1;
    }
    r
}

/// The multiplication the tables are kept for: with PCLMULQDQ + SSE4.2, `crc32(0, clmul(a, b))`
/// is a * b * x^33 mod P, so tables hold values times x^-33 and products stay in that form.
fn fast() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::clmul::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The product of a and b in the table form (see [`fast`]).
#[inline]
fn mul_form(a: u32, b: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if fast() {
        // SAFETY: `fast` checked SSE4.2 and PCLMULQDQ.
        return unsafe { super::clmul::mul_x33(a, b) };
    }
    mul_mod(a, b)
}

/// Tables of x^(8 d 256^i) for each byte d of a length, in the table form.
fn tables() -> &'static [[u32; 256]; 8] {
    static TABLES: OnceLock<Box<[[u32; 256]; 8]>> = OnceLock::new();
    TABLES.get_or_init(|| {
        // x^-33 = (x^-1)^33; x^-1 = (P + 1) / x.
        let scale = if fast() { (0..33).fold(ONE, |a, _| mul_mod(a, (POLY << 1) | 1)) } else { ONE };
        let mut t = Box::new([[0u32; 256]; 8]);
        for (i, row) in t.iter_mut().enumerate() {
            let unit = x_pow(8 << (8 * i));
            let mut v = ONE;
            for slot in row.iter_mut() {
                *slot = mul_mod(v, scale);
                v = mul_mod(v, unit);
            }
        }
        t
    })
}

/// The operator "append `len` zero bytes to the message", for raw CRC states and finished
/// CRCs alike. Build it once for a fixed length (a page) and apply it in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shift {
    /// x^(8 len), in the table form.
    k: u32,
}

impl Shift {
    /// The shift by `len` bytes: one table product per nonzero byte of `len`.
    pub fn new(len: u64) -> Shift {
        let t = tables();
        let mut k: Option<u32> = None;
        for (i, row) in t.iter().enumerate() {
            let d = (len >> (8 * i)) as u8;
            if d != 0 {
                k = Some(match k {
                    None => row[d as usize],
                    Some(k) => mul_form(k, row[d as usize]),
                });
            }
        }
        Shift { k: k.unwrap_or(t[0][0]) }
    }

    /// `crc` times x^(8 len) mod P.
    #[inline]
    pub fn apply(self, crc: u32) -> u32 {
        mul_form(crc, self.k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift_is_multiplication_by_a_power_of_x() {
        for len in [0u64, 1, 3, 4, 5, 64, 255, 256, 4096, 65_537, 1 << 40, u64::MAX] {
            let want = mul_mod(0x1234_5678, x_pow(8 * (len % (u64::MAX / 8))));
            if len == u64::MAX {
                continue;
            }
            assert_eq!(Shift::new(len).apply(0x1234_5678), want, "len {len}");
        }
    }

    #[test]
    fn inverse_of_x() {
        assert_eq!(mul_mod((POLY << 1) | 1, ONE >> 1), ONE);
    }
}
