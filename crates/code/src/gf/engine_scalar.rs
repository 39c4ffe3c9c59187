//! The portable engine: table lookups, one byte at a time. The reference every other engine
//! is checked against.

use super::tables::MUL;
use super::{check_dot_prod, check_sig, Engine, Lanes, WordMul};

/// The portable engine; always available.
#[derive(Clone, Copy, Debug, Default)]
pub struct Scalar;

impl Engine for Scalar {
    fn name(&self) -> &'static str {
        "scalar"
    }

    fn dot_prod(&self, coeffs: &[u8], srcs: &[&[u8]], outs: &mut [&mut [u8]], accumulate: bool) {
        check_dot_prod(coeffs, srcs, outs);
        let k = srcs.len();
        for (j, out) in outs.iter_mut().enumerate() {
            if !accumulate {
                out.fill(0);
            }
            for (i, src) in srcs.iter().enumerate() {
                let row = &MUL[coeffs[j * k + i] as usize];
                for (o, &s) in out.iter_mut().zip(src.iter()) {
                    *o ^= row[s as usize];
                }
            }
        }
    }

    fn sig_horner(&self, data: &[u8], steps: &[WordMul], accs: &mut [Lanes]) {
        check_sig(data, steps, accs);
        for (step, acc) in steps.iter().zip(accs.iter_mut()) {
            let [m00, m01, m10, m11] = step.map(|c| &MUL[c as usize]);
            for group in data.chunks_exact(64).rev() {
                for r in 0..32 {
                    let (lo, hi) = (acc[r] as usize, acc[32 + r] as usize);
                    acc[r] = m00[lo] ^ m01[hi] ^ group[r];
                    acc[32 + r] = m10[lo] ^ m11[hi] ^ group[32 + r];
                }
            }
        }
    }
}

/// The scalar dot product over `range` of every buffer: the SIMD engines finish their
/// tails (shorter than one vector) with it.
pub(super) fn dot_prod_range(
    coeffs: &[u8],
    srcs: &[&[u8]],
    outs: &mut [&mut [u8]],
    accumulate: bool,
    range: std::ops::Range<usize>,
) {
    let k = srcs.len();
    for (j, out) in outs.iter_mut().enumerate() {
        let out = &mut out[range.clone()];
        if !accumulate {
            out.fill(0);
        }
        for (i, src) in srcs.iter().enumerate() {
            let row = &MUL[coeffs[j * k + i] as usize];
            for (o, &s) in out.iter_mut().zip(src[range.clone()].iter()) {
                *o ^= row[s as usize];
            }
        }
    }
}
