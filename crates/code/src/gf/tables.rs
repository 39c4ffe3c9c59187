//! GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11D) and generator 2,
//! the field of ISA-L and Jerasure. All tables are computed at compile time.

/// The field polynomial, with the x^8 term.
pub const POLY: u16 = 0x11D;

const fn build_exp() -> [u8; 512] {
    let mut exp = [0u8; 512];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    // exp[510], exp[511] stay 0: never indexed (log a + log b <= 508).
    exp
}

const fn build_log(exp: &[u8; 512]) -> [u8; 256] {
    let mut log = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        log[exp[i] as usize] = i as u8;
        i += 1;
    }
    log
}

/// exp[i] = 2^i, doubled so that exp[log a + log b] needs no reduction.
pub static EXP: [u8; 512] = build_exp();
/// log[a] for a != 0; log[0] is unused.
pub static LOG: [u8; 256] = build_log(&EXP);

const fn build_mul() -> [[u8; 256]; 256] {
    let exp = build_exp();
    let log = build_log(&exp);
    let mut t = [[0u8; 256]; 256];
    let mut a = 1;
    while a < 256 {
        let mut b = 1;
        while b < 256 {
            t[a][b] = exp[log[a] as usize + log[b] as usize];
            b += 1;
        }
        a += 1;
    }
    t
}

/// The full product table, 64 KiB: MUL[a][b] = a * b. The scalar engine's workhorse.
pub static MUL: [[u8; 256]; 256] = build_mul();

const fn build_nibbles() -> [[u8; 32]; 256] {
    let mul = build_mul();
    let mut t = [[0u8; 32]; 256];
    let mut c = 0;
    while c < 256 {
        let mut i = 0;
        while i < 16 {
            t[c][i] = mul[c][i];
            t[c][16 + i] = mul[c][i << 4];
            i += 1;
        }
        c += 1;
    }
    t
}

/// Split-nibble tables (the ISA-L layout): for a constant c, bytes 0..16 are c * i and
/// bytes 16..32 are c * (i << 4), so c * x = t[x & 15] ^ t[16 + (x >> 4)].
pub static NIBBLES: [[u8; 32]; 256] = build_nibbles();

const fn build_affine() -> [u64; 256] {
    let mul = build_mul();
    let mut t = [0u64; 256];
    let mut c = 0;
    while c < 256 {
        let mut m = 0u64;
        let mut i = 0;
        while i < 8 {
            // Row i (output bit i) lives in byte 7 - i; its bit j says whether bit i of
            // c * 2^j is set.
            let mut row = 0u64;
            let mut j = 0;
            while j < 8 {
                row |= (((mul[c][1 << j] >> i) & 1) as u64) << j;
                j += 1;
            }
            m |= row << (8 * (7 - i));
            i += 1;
        }
        t[c] = m;
        c += 1;
    }
    t
}

/// For GFNI's affine transform: AFFINE[c] is the 8x8 bit matrix of x -> c * x.
pub static AFFINE: [u64; 256] = build_affine();

/// a * b by shift-and-add, with no table: for const contexts and as the tables' reference.
pub const fn mul_bitwise(mut a: u8, mut b: u8) -> u8 {
    let mut p = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            p ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= (POLY & 0xFF) as u8;
        }
        b >>= 1;
    }
    p
}

/// a * b.
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    MUL[a as usize][b as usize]
}

/// The multiplicative inverse; `inv(0)` is 0 (as ISA-L's `gf_inv`), callers never rely on it.
#[inline]
pub fn inv(a: u8) -> u8 {
    if a == 0 {
        0
    } else {
        EXP[255 - LOG[a as usize] as usize]
    }
}

/// a / b for b != 0.
#[inline]
pub fn div(a: u8, b: u8) -> u8 {
    mul(a, inv(b))
}

/// a^n.
pub fn pow(a: u8, n: u32) -> u8 {
    if n == 0 {
        return 1;
    }
    if a == 0 {
        return 0;
    }
    EXP[((LOG[a as usize] as u32 * n) % 255) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_agree_with_shift_and_add() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_bitwise(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn two_generates_the_field() {
        let mut seen = [false; 256];
        for i in 0..255 {
            assert!(!seen[EXP[i] as usize], "2^{i} repeats");
            seen[EXP[i] as usize] = true;
        }
        assert!(!seen[0]);
    }

    #[test]
    fn inverse_and_nibbles() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1);
            assert_eq!(div(mul(a, 77), 77), a);
            for x in 0..=255u8 {
                let t = &NIBBLES[a as usize];
                assert_eq!(t[(x & 15) as usize] ^ t[16 + (x >> 4) as usize], mul(a, x));
            }
        }
        assert_eq!(pow(2, 8), 0x1D);
        assert_eq!(pow(3, 0), 1);
    }
}
