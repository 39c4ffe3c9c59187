//! The x86_64 CRC-32C kernel: three `crc32` streams in flight (the instruction has a latency
//! of 3 and a throughput of 1), merged with carry-less multiplies by x^(8 L).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;
use std::sync::OnceLock;

pub use super::clmul::available;
use super::shift::Shift;
use super::LINE;

/// Stream lengths for the three-way rounds, longest first; a 4 KiB page is one round of
/// 1360 bytes per stream and 16 bytes left.
const STREAMS: [usize; 4] = [8192, 1360, 256, 64];

fn shifts() -> &'static [(Shift, Shift); 4] {
    static SHIFTS: OnceLock<[(Shift, Shift); 4]> = OnceLock::new();
    SHIFTS.get_or_init(|| STREAMS.map(|l| (Shift::new(2 * l as u64), Shift::new(l as u64))))
}

/// The raw CRC register after `data`.
///
/// # Safety
/// The CPU must have SSE4.2 and PCLMULQDQ ([`available`]).
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub unsafe fn raw(mut state: u32, data: &[u8]) -> u32 {
    let mut rest = data;
    for (&l, &(two, one)) in STREAMS.iter().zip(shifts().iter()) {
        while rest.len() >= 3 * l {
            let (mut sa, mut sb, mut sc) = (state as u64, 0u64, 0u64);
            let p = rest.as_ptr();
            // Plain unaligned loads: slice iterators here cost a tenth of a 4 KiB page.
            for i in (0..l).step_by(8) {
                // SAFETY: i + 8 <= l and 3 * l <= rest.len(): every word is inside `rest`.
                unsafe {
                    sa = _mm_crc32_u64(sa, p.add(i).cast::<u64>().read_unaligned().to_le());
                    sb = _mm_crc32_u64(sb, p.add(l + i).cast::<u64>().read_unaligned().to_le());
                    sc = _mm_crc32_u64(sc, p.add(2 * l + i).cast::<u64>().read_unaligned().to_le());
                }
            }
            state = two.apply(sa as u32) ^ one.apply(sb as u32) ^ sc as u32;
            rest = &rest[3 * l..];
        }
    }
    let mut s = state as u64;
    let mut words = rest.chunks_exact(8);
    for w in &mut words {
        s = _mm_crc32_u64(s, u64::from_le_bytes(w.try_into().unwrap()));
    }
    let mut s = s as u32;
    for &b in words.remainder() {
        s = _mm_crc32_u8(s, b);
    }
    s
}

/// The CRC-32C of each whole 64-byte line of `data` into `out` (one per line), four lines in
/// flight: a line alone is eight dependent `crc32`s, latency-bound at three cycles each,
/// where four independent lines keep the unit busy every cycle.
///
/// # Safety
/// The CPU must have SSE4.2. (Only whole lines are read, and `out` is indexed with bounds
/// checks: the shapes are the caller's to check, once, as `crc32c_lines` does.)
#[target_feature(enable = "sse4.2")]
pub unsafe fn lines(data: &[u8], out: &mut [u32]) {
    let n = data.len() / LINE;
    debug_assert!(data.len().is_multiple_of(LINE) && out.len() >= n, "whole lines, a CRC for each");
    let p = data.as_ptr();
    // SAFETY: every call reads line j < n at w + 8 <= LINE: a word inside `data`.
    let word = |j: usize, w: usize| unsafe { p.add(j * LINE + w).cast::<u64>().read_unaligned().to_le() };
    let mut j = 0;
    while j + 4 <= n {
        let mut s = [u32::MAX as u64; 4];
        for w in (0..LINE).step_by(8) {
            for (k, s) in s.iter_mut().enumerate() {
                *s = _mm_crc32_u64(*s, word(j + k, w));
            }
        }
        for (k, s) in s.iter().enumerate() {
            out[j + k] = !(*s as u32);
        }
        j += 4;
    }
    while j < n {
        let mut s = u32::MAX as u64;
        for w in (0..LINE).step_by(8) {
            s = _mm_crc32_u64(s, word(j, w));
        }
        out[j] = !(s as u32);
        j += 1;
    }
}
