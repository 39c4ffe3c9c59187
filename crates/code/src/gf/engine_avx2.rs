//! The AVX2 engine: split-nibble shuffles (the ISA-L technique), 32 bytes per step.

use std::arch::x86_64::*;

use super::engine_scalar::dot_prod_range;
use super::tables::NIBBLES;
use super::{check_dot_prod, check_sig, Engine, Lanes, WordMul};

/// AVX2 engine; construct with [`Avx2::new`], which checks the CPU.
#[derive(Clone, Copy, Debug)]
pub struct Avx2(());

impl Avx2 {
    /// `Some` when this CPU has AVX2.
    pub fn new() -> Option<Self> {
        is_x86_feature_detected!("avx2").then_some(Avx2(()))
    }
}

impl Engine for Avx2 {
    fn name(&self) -> &'static str {
        "avx2"
    }

    fn dot_prod(&self, coeffs: &[u8], srcs: &[&[u8]], outs: &mut [&mut [u8]], accumulate: bool) {
        let len = check_dot_prod(coeffs, srcs, outs);
        let body = len & !31;
        let k = srcs.len();
        for (g, outs) in outs.chunks_mut(4).enumerate() {
            let rows = &coeffs[g * 4 * k..(g * 4 + outs.len()) * k];
            // SAFETY: `new` checked AVX2; the shapes were checked above.
            unsafe {
                match outs.len() {
                    1 => dot_cols::<1>(rows, srcs, outs, accumulate, body),
                    2 => dot_cols::<2>(rows, srcs, outs, accumulate, body),
                    3 => dot_cols::<3>(rows, srcs, outs, accumulate, body),
                    _ => dot_cols::<4>(rows, srcs, outs, accumulate, body),
                }
            }
            if body < len {
                dot_prod_range(rows, srcs, outs, accumulate, body..len);
            }
        }
    }

    fn sig_fold(&self, accs: &[Lanes], halves: &[[WordMul; 5]], out: &mut [u16]) {
        // SAFETY: `new` checked AVX2, which implies SSSE3.
        unsafe { super::engine_ssse3::sig_fold(accs, halves, out) }
    }

    fn sig_horner(&self, data: &[u8], steps: &[WordMul], accs: &mut [Lanes]) {
        check_sig(data, steps, accs);
        for (steps, accs) in steps.chunks(2).zip(accs.chunks_mut(2)) {
            // SAFETY: `new` checked AVX2; `data` is whole 64-byte groups (checked).
            unsafe {
                match steps.len() {
                    1 => horner::<1>(data, steps, accs),
                    _ => horner::<2>(data, steps, accs),
                }
            }
        }
    }
}

/// Broadcast the two 16-byte nibble tables of constant `c`.
#[inline(always)]
unsafe fn tables(c: u8) -> (__m256i, __m256i) {
    let t = NIBBLES[c as usize].as_ptr();
    // SAFETY: a NIBBLES row is 32 bytes: two 16-byte loads stay inside it.
    unsafe {
        (
            _mm256_broadcastsi128_si256(_mm_loadu_si128(t.cast())),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(t.add(16).cast())),
        )
    }
}

/// c * x, from the nibbles of x already split into (lo, hi).
#[inline(always)]
unsafe fn mul(t: (__m256i, __m256i), lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_xor_si256(_mm256_shuffle_epi8(t.0, lo), _mm256_shuffle_epi8(t.1, hi))
}

#[inline(always)]
unsafe fn split(x: __m256i) -> (__m256i, __m256i) {
    let mask = _mm256_set1_epi8(0x0f);
    (_mm256_and_si256(x, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(x), mask))
}

/// The first `body` bytes (a multiple of 32) of `G` outputs: 64 bytes per step (two vectors,
/// so each table broadcast serves both), then one 32-byte step if needed.
#[target_feature(enable = "avx2")]
unsafe fn dot_cols<const G: usize>(
    rows: &[u8],
    srcs: &[&[u8]],
    outs: &mut [&mut [u8]],
    accumulate: bool,
    body: usize,
) {
    let k = srcs.len();
    let mut off = 0;
    while off + 64 <= body {
        let mut acc = [[_mm256_setzero_si256(); 2]; G];
        if accumulate {
            for j in 0..G {
                // SAFETY: off + 64 <= body <= len of every output.
                let p = unsafe { outs[j].as_ptr().add(off) };
                // SAFETY: off + 64 <= body <= len of every output, so p and p + 32 start 32-byte loads inside it.
                acc[j] = unsafe { [_mm256_loadu_si256(p.cast()), _mm256_loadu_si256(p.add(32).cast())] };
            }
        }
        for (i, src) in srcs.iter().enumerate() {
            // SAFETY: off + 64 <= body <= len of every source.
            let p = unsafe { src.as_ptr().add(off) };
            // SAFETY: off + 64 <= body <= len of every source, so p and p + 32 start 32-byte loads inside it.
            let (x0, x1) = unsafe { (_mm256_loadu_si256(p.cast()), _mm256_loadu_si256(p.add(32).cast())) };
            // SAFETY: registers only; AVX2 is enabled in this function.
            let (lo0, hi0) = unsafe { split(x0) };
            // SAFETY: registers only; AVX2 is enabled in this function.
            let (lo1, hi1) = unsafe { split(x1) };
            for j in 0..G {
                // SAFETY: `tables` has a row for every byte; AVX2 is enabled in this function.
                let t = unsafe { tables(rows[j * k + i]) };
                // SAFETY: registers only; AVX2 is enabled in this function.
                acc[j][0] = _mm256_xor_si256(acc[j][0], unsafe { mul(t, lo0, hi0) });
                // SAFETY: registers only; AVX2 is enabled in this function.
                acc[j][1] = _mm256_xor_si256(acc[j][1], unsafe { mul(t, lo1, hi1) });
            }
        }
        for j in 0..G {
            // SAFETY: as for the loads.
            unsafe {
                let p = outs[j].as_mut_ptr().add(off);
                _mm256_storeu_si256(p.cast(), acc[j][0]);
                _mm256_storeu_si256(p.add(32).cast(), acc[j][1]);
            }
        }
        off += 64;
    }
    if off < body {
        let mut acc = [_mm256_setzero_si256(); G];
        for j in 0..G {
            if accumulate {
                // SAFETY: off + 32 == body <= len of every output.
                acc[j] = unsafe { _mm256_loadu_si256(outs[j].as_ptr().add(off).cast()) };
            }
        }
        for (i, src) in srcs.iter().enumerate() {
            // SAFETY: off + 32 == body <= len of every source.
            let x = unsafe { _mm256_loadu_si256(src.as_ptr().add(off).cast()) };
            // SAFETY: registers only; AVX2 is enabled in this function.
            let (lo, hi) = unsafe { split(x) };
            for j in 0..G {
                // SAFETY: `tables` has a row for every byte; AVX2 is enabled in this function.
                let t = unsafe { tables(rows[j * k + i]) };
                // SAFETY: registers only; AVX2 is enabled in this function.
                acc[j] = _mm256_xor_si256(acc[j], unsafe { mul(t, lo, hi) });
            }
        }
        for j in 0..G {
            // SAFETY: as for the loads.
            unsafe { _mm256_storeu_si256(outs[j].as_mut_ptr().add(off).cast(), acc[j]) };
        }
    }
}

/// Horner over the 64-byte groups of `data`, last to first, for `N` components at once
/// (independent chains, so the shuffles of one hide the latency of the other).
#[target_feature(enable = "avx2")]
unsafe fn horner<const N: usize>(data: &[u8], steps: &[WordMul], accs: &mut [Lanes]) {
    let mut t = [[(_mm256_setzero_si256(), _mm256_setzero_si256()); 4]; N];
    let mut lo = [_mm256_setzero_si256(); N];
    let mut hi = [_mm256_setzero_si256(); N];
    for c in 0..N {
        for (q, &m) in steps[c].iter().enumerate() {
            // SAFETY: `tables` has a row for every byte; AVX2 is enabled in this function.
            t[c][q] = unsafe { tables(m) };
        }
        // SAFETY: a Lanes is 64 bytes.
        unsafe {
            lo[c] = _mm256_loadu_si256(accs[c].as_ptr().cast());
            hi[c] = _mm256_loadu_si256(accs[c].as_ptr().add(32).cast());
        }
    }
    for group in data.chunks_exact(64).rev() {
        // SAFETY: `group` is 64 bytes.
        let (glo, ghi) = unsafe {
            (_mm256_loadu_si256(group.as_ptr().cast()), _mm256_loadu_si256(group.as_ptr().add(32).cast()))
        };
        for c in 0..N {
            // SAFETY: registers only; AVX2 is enabled in this function.
            let (l0, l1) = unsafe { split(lo[c]) };
            // SAFETY: registers only; AVX2 is enabled in this function.
            let (h0, h1) = unsafe { split(hi[c]) };
            // SAFETY: registers only; AVX2 is enabled in this function.
            let new_lo = unsafe { _mm256_xor_si256(mul(t[c][0], l0, l1), mul(t[c][1], h0, h1)) };
            // SAFETY: registers only; AVX2 is enabled in this function.
            let new_hi = unsafe { _mm256_xor_si256(mul(t[c][2], l0, l1), mul(t[c][3], h0, h1)) };
            lo[c] = _mm256_xor_si256(new_lo, glo);
            hi[c] = _mm256_xor_si256(new_hi, ghi);
        }
    }
    for c in 0..N {
        // SAFETY: a Lanes is 64 bytes.
        unsafe {
            _mm256_storeu_si256(accs[c].as_mut_ptr().cast(), lo[c]);
            _mm256_storeu_si256(accs[c].as_mut_ptr().add(32).cast(), hi[c]);
        }
    }
}
