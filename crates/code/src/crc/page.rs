//! The CRC-32C of one 4 KiB page on CPUs with VPCLMULQDQ and AVX-512: the first 3.5 KiB
//! folded (as in `fold`), the last 512 bytes in three `crc32` streams run inside the folding
//! loop. The carry-less multiplier and the `crc32` unit are different units, so within limits
//! the streams cost the loop nothing: the fold alone was level with ISA-L's AVX-512 kernel at
//! 4 KiB (both bound by the multiplier), and this is 8% faster (73 -> 67 ns on a Zen 4).
//!
//! No merge step: the fold's lanes are moved 512 bytes further than the end of the folded
//! bytes (their constants take the streams' length in), and each stream's register is
//! multiplied by the power of x its distance from the end needs and added into the 128 bits
//! the two final `crc32` instructions reduce (`crc32(0, clmul(r, k))` is r k x^33, so k is
//! x^(8 n - 33)).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::fold::pair;
use super::shift::x_pow;

/// The length this kernel takes.
pub const PAGE: usize = 4096;
/// Bytes folded: seven 512-byte blocks (the first loaded, six rounds of the loop). With
/// 3 KiB folded and 1 KiB in the streams the `crc32` unit became the bound (71 ns).
const FOLDED: usize = 3584;
const SIDE_WORDS: usize = (PAGE - FOLDED) / 8;
/// The three streams' lengths, in bytes (22, 21 and 21 words).
const STREAM: [usize; 3] = {
    let w0 = SIDE_WORDS.div_ceil(3);
    let w1 = (SIDE_WORDS - w0).div_ceil(2);
    [8 * w0, 8 * w1, 8 * (SIDE_WORDS - w0 - w1)]
};
const ROUNDS: usize = (FOLDED - 512) / 512;
/// Words of each stream taken per round of the loop, in its first `WORD_ROUNDS` rounds; the
/// rest follow it. Four cost the loop nothing (measured: a round of 16 multiplies took as long
/// with 12 `crc32` beside it as alone, 8.7 ns; with 24, 10.4 ns; with 30, 13.2 ns).
const WORDS_PER_ROUND: usize = 4;
const WORD_ROUNDS: usize = {
    let r = STREAM[2] / 8 / WORDS_PER_ROUND;
    if r < ROUNDS {
        r
    } else {
        ROUNDS
    }
};

const _: () = assert!(FOLDED + STREAM[0] + STREAM[1] + STREAM[2] == PAGE);
const _: () = assert!(WORD_ROUNDS * WORDS_PER_ROUND <= STREAM[2] / 8);

struct Keys {
    by512: [u64; 2],
    /// Lane j of the last 512 folded bytes onto the end of the page: 496 - 16 j + 512 bytes,
    /// in memory order (one 64-byte load gives a block's four lanes their constants).
    window: [[u64; 2]; 32],
    /// Streams 0 and 1 onto the end of the page (stream 2 ends there): x^(8 n - 33).
    streams: [u64; 2],
}

static KEYS: Keys = {
    let side = (PAGE - FOLDED) as u64;
    let mut window = [[0u64; 2]; 32];
    let mut j = 0;
    while j < 32 {
        window[j] = pair(496 - 16 * j as u64 + side);
        j += 1;
    }
    let after0 = (STREAM[1] + STREAM[2]) as u64;
    let after1 = STREAM[2] as u64;
    Keys { by512: pair(512), window, streams: [x_pow(8 * after0 - 33) as u64, x_pow(8 * after1 - 33) as u64] }
};

/// x moved forward by the constants in k, XORed with d.
#[inline(always)]
unsafe fn fold(x: __m512i, k: __m512i, d: __m512i) -> __m512i {
    let h = _mm512_clmulepi64_epi128::<0x00>(x, k);
    let l = _mm512_clmulepi64_epi128::<0x11>(x, k);
    _mm512_ternarylogic_epi64::<0x96>(h, l, d)
}

/// The raw CRC register after the 4 KiB `page`, from `state`.
///
/// # Panics
/// If `page` is not [`PAGE`] bytes long (checked in every build: the loads rely on it).
///
/// # Safety
/// The CPU must have VPCLMULQDQ, AVX-512F, SSE4.2 and PCLMULQDQ (`fold::available`).
#[target_feature(enable = "vpclmulqdq,avx512f,sse4.2,pclmulqdq")]
pub unsafe fn raw(state: u32, page: &[u8]) -> u32 {
    assert_eq!(page.len(), PAGE, "crc::page::raw takes one page");
    let k = &KEYS;
    let p = page.as_ptr();
    // SAFETY: every use passes off + 64 <= FOLDED <= page.len().
    let load = |off: usize| unsafe { _mm512_loadu_si512(p.add(off).cast()) };
    let mut x = [load(0), load(64), load(128), load(192)];
    let mut y = [load(256), load(320), load(384), load(448)];
    x[0] = _mm512_xor_si512(x[0], _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, state as i64));
    // SAFETY: 16 readable bytes; registers otherwise.
    let k512 = unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(k.by512.as_ptr().cast())) };
    let side = FOLDED;
    let starts = [side, side + STREAM[0], side + STREAM[0] + STREAM[1]];
    let mut regs = [0u64; 3];
    // One round per iteration, not unrolled (a count the compiler cannot see): unrolled, it
    // ordered the folds chain by chain, each waiting on the last, with the streams before
    // them, and the kernel took 83 ns. Only the bound matters to memory safety.
    let rounds = std::hint::black_box(ROUNDS);
    assert!(rounds <= ROUNDS);
    let mut round = 0;
    while round < rounds {
        let off = 512 * (round + 1);
        for i in 0..4 {
            // SAFETY: off + 256 + 64 i + 64 <= off + 512 <= FOLDED (round < ROUNDS, asserted
            // below); `fold` is registers.
            unsafe {
                x[i] = fold(x[i], k512, load(off + 64 * i));
                y[i] = fold(y[i], k512, load(off + 256 + 64 * i));
            }
        }
        if round < WORD_ROUNDS {
            let first = round * WORDS_PER_ROUND;
            for w in first..first + WORDS_PER_ROUND {
                for (reg, &start) in regs.iter_mut().zip(&starts) {
                    // SAFETY: 8 w + 8 <= 8 WORDS_PER_ROUND WORD_ROUNDS <= every stream's length.
                    let word = unsafe { p.add(start + 8 * w).cast::<u64>().read_unaligned() };
                    *reg = _mm_crc32_u64(*reg, u64::from_le(word));
                }
            }
        }
        round += 1;
    }
    for ((reg, &start), &len) in regs.iter_mut().zip(&starts).zip(&STREAM) {
        for w in WORD_ROUNDS * WORDS_PER_ROUND..len / 8 {
            // SAFETY: 8 w + 8 <= len: inside the stream.
            let word = unsafe { p.add(start + 8 * w).cast::<u64>().read_unaligned() };
            *reg = _mm_crc32_u64(*reg, u64::from_le(word));
        }
    }
    // Every lane of the last eight blocks onto the end of the page, side by side.
    let acc = [x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3]];
    let mut chains = [_mm512_setzero_si512(), _mm512_setzero_si512()];
    for (i, a) in acc.iter().enumerate() {
        // SAFETY: window[4 i..4 i + 4] is 64 readable bytes (4 i + 4 <= 32).
        let kv = unsafe { _mm512_loadu_si512(k.window[4 * i..].as_ptr().cast()) };
        // SAFETY: register arithmetic.
        chains[i & 1] = unsafe { fold(*a, kv, chains[i & 1]) };
    }
    let sum = _mm512_xor_si512(chains[0], chains[1]);
    let half = _mm256_xor_si256(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64::<1>(sum));
    let v = _mm_xor_si128(_mm256_castsi256_si128(half), _mm256_extracti128_si256::<1>(half));
    // Streams 0 and 1 moved onto the end: their products join the high word the second
    // `crc32` reduces (which multiplies it by x^32, as the first product's form expects).
    let moved = |r: u64, key: u64| {
        let prod = _mm_clmulepi64_si128::<0>(_mm_cvtsi64_si128(r as i64), _mm_cvtsi64_si128(key as i64));
        _mm_cvtsi128_si64(prod) as u64
    };
    let hi = _mm_extract_epi64::<1>(v) as u64 ^ moved(regs[0], k.streams[0]) ^ moved(regs[1], k.streams[1]);
    let s = _mm_crc32_u64(0, _mm_cvtsi128_si64(v) as u64);
    _mm_crc32_u64(s, hi) as u32 ^ regs[2] as u32
}
