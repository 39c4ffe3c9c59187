//! The SSSE3 engine: split-nibble shuffles, 16 bytes per step. For CPUs without AVX2.

use std::arch::x86_64::*;

use super::engine_scalar::dot_prod_range;
use super::tables::NIBBLES;
use super::{check_dot_prod, check_sig, Engine, Lanes, WordMul};

/// SSSE3 engine; construct with [`Ssse3::new`], which checks the CPU.
#[derive(Clone, Copy, Debug)]
pub struct Ssse3(());

impl Ssse3 {
    /// `Some` when this CPU has SSSE3.
    pub fn new() -> Option<Self> {
        is_x86_feature_detected!("ssse3").then_some(Ssse3(()))
    }
}

impl Engine for Ssse3 {
    fn name(&self) -> &'static str {
        "ssse3"
    }

    fn dot_prod(&self, coeffs: &[u8], srcs: &[&[u8]], outs: &mut [&mut [u8]], accumulate: bool) {
        let len = check_dot_prod(coeffs, srcs, outs);
        let body = len & !15;
        let k = srcs.len();
        for (g, outs) in outs.chunks_mut(4).enumerate() {
            let rows = &coeffs[g * 4 * k..(g * 4 + outs.len()) * k];
            // SAFETY: `new` checked SSSE3; the shapes were checked above.
            unsafe {
                match outs.len() {
                    1 => dot_cols::<1>(rows, srcs, outs, accumulate, body),
                    2 => dot_cols::<2>(rows, srcs, outs, accumulate, body),
                    3 => dot_cols::<3>(rows, srcs, outs, accumulate, body),
                    _ => dot_cols::<4>(rows, srcs, outs, accumulate, body),
                }
            }
            dot_prod_range(rows, srcs, outs, accumulate, body..len);
        }
    }

    fn sig_horner(&self, data: &[u8], steps: &[WordMul], accs: &mut [Lanes]) {
        check_sig(data, steps, accs);
        for (step, acc) in steps.iter().zip(accs.iter_mut()) {
            // SAFETY: `new` checked SSSE3; `data` is whole 64-byte groups (checked).
            unsafe { horner(data, step, acc) }
        }
    }

    fn sig_fold(&self, accs: &[Lanes], halves: &[[WordMul; 5]], out: &mut [u16]) {
        // SAFETY: `new` checked SSSE3.
        unsafe { sig_fold(accs, halves, out) }
    }
}

/// [`Engine::sig_fold`] in 16-byte registers (for the SSSE3 and AVX2 engines): after the
/// first halving only 16 words are left, one register of low halves and one of high.
///
/// # Safety
/// The CPU has SSSE3.
#[target_feature(enable = "ssse3")]
pub(super) unsafe fn sig_fold(accs: &[Lanes], halves: &[[WordMul; 5]], out: &mut [u16]) {
    assert!(accs.len() == halves.len() && accs.len() == out.len(), "one fold per component");
    for ((acc, m), o) in accs.iter().zip(halves).zip(out.iter_mut()) {
        // SAFETY: a Lanes is 64 bytes: loads at 0, 16, 32 and 48.
        let ld = |at: usize| unsafe { _mm_loadu_si128(acc.as_ptr().add(at).cast()) };
        // Words 16..32 into 0..16, then 8, 4, 2 and 1 words down within the register.
        // SAFETY: `ld` loads 16 bytes at offsets up to 48 of a 64-byte group; add_mul is register arithmetic.
        let (l, h) = unsafe { add_mul(ld(0), ld(32), ld(16), ld(48), &m[0]) };
        // SAFETY: registers only; SSSE3 is enabled in this function.
        let (l, h) = unsafe { add_mul(l, h, _mm_srli_si128::<8>(l), _mm_srli_si128::<8>(h), &m[1]) };
        // SAFETY: registers only; SSSE3 is enabled in this function.
        let (l, h) = unsafe { add_mul(l, h, _mm_srli_si128::<4>(l), _mm_srli_si128::<4>(h), &m[2]) };
        // SAFETY: registers only; SSSE3 is enabled in this function.
        let (l, h) = unsafe { add_mul(l, h, _mm_srli_si128::<2>(l), _mm_srli_si128::<2>(h), &m[3]) };
        // SAFETY: registers only; SSSE3 is enabled in this function.
        let (l, h) = unsafe { add_mul(l, h, _mm_srli_si128::<1>(l), _mm_srli_si128::<1>(h), &m[4]) };
        *o = (_mm_cvtsi128_si32(l) as u8) as u16 | ((_mm_cvtsi128_si32(h) as u8) as u16) << 8;
    }
}

/// (l, h) ^ m * (ul, uh), word by word (low halves in `l`, high halves in `h`).
#[target_feature(enable = "ssse3")]
#[inline]
unsafe fn add_mul(l: __m128i, h: __m128i, ul: __m128i, uh: __m128i, m: &WordMul) -> (__m128i, __m128i) {
    // SAFETY: SSSE3 is enabled here.
    unsafe {
        let nl = _mm_xor_si128(mul(tables(m[0]), ul), mul(tables(m[1]), uh));
        let nh = _mm_xor_si128(mul(tables(m[2]), ul), mul(tables(m[3]), uh));
        (_mm_xor_si128(l, nl), _mm_xor_si128(h, nh))
    }
}

#[inline(always)]
unsafe fn tables(c: u8) -> (__m128i, __m128i) {
    let t = NIBBLES[c as usize].as_ptr();
    // SAFETY: a NIBBLES row is 32 bytes.
    unsafe { (_mm_loadu_si128(t.cast()), _mm_loadu_si128(t.add(16).cast())) }
}

/// c * x with x's table lookups on its two nibbles.
#[inline(always)]
unsafe fn mul(t: (__m128i, __m128i), x: __m128i) -> __m128i {
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(x, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), mask);
    _mm_xor_si128(_mm_shuffle_epi8(t.0, lo), _mm_shuffle_epi8(t.1, hi))
}

#[target_feature(enable = "ssse3")]
unsafe fn dot_cols<const G: usize>(
    rows: &[u8],
    srcs: &[&[u8]],
    outs: &mut [&mut [u8]],
    accumulate: bool,
    body: usize,
) {
    let k = srcs.len();
    let mask = _mm_set1_epi8(0x0f);
    let mut off = 0;
    while off < body {
        let mut acc = [_mm_setzero_si128(); G];
        for j in 0..G {
            if accumulate {
                // SAFETY: off + 16 <= body <= len of every output.
                acc[j] = unsafe { _mm_loadu_si128(outs[j].as_ptr().add(off).cast()) };
            }
        }
        for (i, src) in srcs.iter().enumerate() {
            // SAFETY: off + 16 <= body <= len of every source.
            let x = unsafe { _mm_loadu_si128(src.as_ptr().add(off).cast()) };
            let lo = _mm_and_si128(x, mask);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), mask);
            for j in 0..G {
                // SAFETY: `tables` has a row for every byte; SSSE3 is enabled in this function.
                let t = unsafe { tables(rows[j * k + i]) };
                let p = _mm_xor_si128(_mm_shuffle_epi8(t.0, lo), _mm_shuffle_epi8(t.1, hi));
                acc[j] = _mm_xor_si128(acc[j], p);
            }
        }
        for j in 0..G {
            // SAFETY: as for the loads.
            unsafe { _mm_storeu_si128(outs[j].as_mut_ptr().add(off).cast(), acc[j]) };
        }
        off += 16;
    }
}

#[target_feature(enable = "ssse3")]
unsafe fn horner(data: &[u8], step: &WordMul, acc: &mut Lanes) {
    // SAFETY: `tables` has a row for every byte; SSSE3 is enabled in this function.
    let t = step.map(|m| unsafe { tables(m) });
    // The 32 lanes as two vectors of low halves and two of high halves.
    // SAFETY: a Lanes is 64 bytes; every load below is at offset 0, 16, 32 or 48.
    let ld = |p: *const u8, o: usize| unsafe { _mm_loadu_si128(p.add(o).cast()) };
    let mut lo = [ld(acc.as_ptr(), 0), ld(acc.as_ptr(), 16)];
    let mut hi = [ld(acc.as_ptr(), 32), ld(acc.as_ptr(), 48)];
    for group in data.chunks_exact(64).rev() {
        let p = group.as_ptr();
        for h in 0..2 {
            let (l, u) = (lo[h], hi[h]);
            // SAFETY: registers only; SSSE3 is enabled in this function.
            let new_lo = unsafe { _mm_xor_si128(mul(t[0], l), mul(t[1], u)) };
            // SAFETY: registers only; SSSE3 is enabled in this function.
            let new_hi = unsafe { _mm_xor_si128(mul(t[2], l), mul(t[3], u)) };
            lo[h] = _mm_xor_si128(new_lo, ld(p, 16 * h));
            hi[h] = _mm_xor_si128(new_hi, ld(p, 32 + 16 * h));
        }
    }
    for h in 0..2 {
        // SAFETY: offsets 16h and 32 + 16h of a 64-byte Lanes.
        unsafe {
            _mm_storeu_si128(acc.as_mut_ptr().add(16 * h).cast(), lo[h]);
            _mm_storeu_si128(acc.as_mut_ptr().add(32 + 16 * h).cast(), hi[h]);
        }
    }
}
