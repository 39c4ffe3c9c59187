//! Matrices over GF(2^8), row-major in a flat `Vec<u8>`.

use crate::gf::{inv, mul};

/// ISA-L's `gf_gen_cauchy1_matrix(a, k + m, k)`: the k x k identity on top, then m rows with
/// a[i][j] = 1 / (i ^ j) for i in k..k+m. Every square submatrix of a Cauchy matrix is
/// invertible, so the code is MDS for any k + m <= 256.
pub fn cauchy(k: usize, m: usize) -> Vec<u8> {
    let mut a = vec![0u8; (k + m) * k];
    for i in 0..k {
        a[i * k + i] = 1;
    }
    for i in k..k + m {
        for j in 0..k {
            a[i * k + j] = inv((i ^ j) as u8);
        }
    }
    a
}

/// The inverse of the n x n matrix `a`, by Gauss–Jordan elimination; `None` if singular.
pub fn invert(a: &[u8], n: usize) -> Option<Vec<u8>> {
    let mut a = a.to_vec();
    let mut b = vec![0u8; n * n];
    for i in 0..n {
        b[i * n + i] = 1;
    }
    for col in 0..n {
        let pivot = (col..n).find(|&r| a[r * n + col] != 0)?;
        if pivot != col {
            for c in 0..n {
                a.swap(pivot * n + c, col * n + c);
                b.swap(pivot * n + c, col * n + c);
            }
        }
        let p = inv(a[col * n + col]);
        for c in 0..n {
            a[col * n + c] = mul(a[col * n + c], p);
            b[col * n + c] = mul(b[col * n + c], p);
        }
        for r in 0..n {
            let f = a[r * n + col];
            if r == col || f == 0 {
                continue;
            }
            for c in 0..n {
                a[r * n + c] ^= mul(f, a[col * n + c]);
                b[r * n + c] ^= mul(f, b[col * n + c]);
            }
        }
    }
    Some(b)
}

/// The product of row vector `v` (length n) with the n x n matrix `a`.
pub fn row_times(v: &[u8], a: &[u8], n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    for (i, &vi) in v.iter().enumerate() {
        for (o, &x) in out.iter_mut().zip(&a[i * n..(i + 1) * n]) {
            *o ^= mul(vi, x);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_of_every_cauchy_square_is_an_inverse() {
        for k in 1..=12 {
            let a = cauchy(k, 4);
            // The parity rows alone (when k <= 4) and mixed row sets must invert.
            let rows: Vec<usize> = (4..4 + k).collect();
            let sub: Vec<u8> = rows.iter().flat_map(|&r| a[r * k..(r + 1) * k].to_vec()).collect();
            let b = invert(&sub, k).expect("Cauchy submatrices are invertible");
            for r in 0..k {
                let p = row_times(&sub[r * k..(r + 1) * k], &b, k);
                for (c, &x) in p.iter().enumerate() {
                    assert_eq!(x, (r == c) as u8);
                }
            }
        }
    }

    #[test]
    fn singular_is_refused() {
        assert!(invert(&[1, 2, 1, 2], 2).is_none());
        assert!(invert(&[0, 0, 0, 0], 2).is_none());
    }
}
