//! The CRC-32C kernel for long buffers on CPUs with VPCLMULQDQ and AVX-512: the message is
//! folded 256 bytes at a time into four 512-bit accumulators by carry-less multiplication
//! (Intel's folding method), then reduced to a CRC register with the `crc32` instruction.
//! When the loops leave less than one block, every lane is moved onto the last in a single
//! step ([`reduce`]): at 4 KiB the tail's waiting, not the loop, was what ISA-L did better.
//!
//! In the reflected form a 128-bit lane holds coefficients x^127 (bit 0) .. x^0 (bit 127); its
//! low qword H and high qword L move D bits forward as H * x^(D+31) ^ L * x^(D-33), both
//! products of a 64-bit and a 32-bit reflected value (the carry-less product of reflected
//! values carries an extra x^33, absorbed in the exponents).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::shift::{x_pow, Shift};

/// VPCLMULQDQ, AVX-512F and SSE4.2 are all present.
#[inline]
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("vpclmulqdq")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("sse4.2")
    })
}

/// The two 32-bit constants that move a 128-bit lane `bytes` forward, as (H's, L's).
pub(super) const fn pair(bytes: u64) -> [u64; 2] {
    let d = 8 * bytes;
    [x_pow(d + 31) as u64, x_pow(d - 33) as u64]
}

struct Keys {
    by512: [u64; 2],
    by256: [u64; 2],
    by64: [u64; 2],
    /// x0, x1, x2 onto x3: 192, 128 and 64 bytes.
    tail: [[u64; 2]; 3],
    /// Lanes 0, 1, 2 of the last block onto lane 3: 48, 32, 16 bytes.
    lanes: [u64; 8],
    /// Lane j of the last 512 bytes onto the last lane: 496 - 16 j bytes, in memory order,
    /// so that one 64-byte load gives a block's four lanes their own constants. The last
    /// lane's pair is zero (it passes through); the second half serves the last 256 bytes.
    window: [[u64; 2]; 32],
}

/// The keys, computed at compile time: a 4 KiB CRC takes about 73 ns, and looking them up
/// behind a once-cell cost a nanosecond of it.
static KEYS: Keys = {
    let (l0, l1, l2) = (pair(48), pair(32), pair(16));
    let mut window = [[0u64; 2]; 32];
    let mut j = 0;
    while j < 31 {
        window[j] = pair(496 - 16 * j as u64);
        j += 1;
    }
    Keys {
        by512: pair(512),
        by256: pair(256),
        by64: pair(64),
        tail: [pair(192), pair(128), pair(64)],
        lanes: [l0[0], l0[1], l1[0], l1[1], l2[0], l2[1], 0, 0],
        window,
    }
};

fn keys() -> &'static Keys {
    &KEYS
}

/// The pair in every 128-bit lane: one 16-byte load and one broadcast, not eight inserts.
#[inline(always)]
unsafe fn broadcast(k: &[u64; 2]) -> __m512i {
    // SAFETY: `k` is 16 readable bytes; the load is unaligned.
    _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128((k as *const [u64; 2]).cast()) })
}

/// x moved forward by the constants in k, XORed with d.
#[inline(always)]
unsafe fn fold(x: __m512i, k: __m512i, d: __m512i) -> __m512i {
    let h = _mm512_clmulepi64_epi128::<0x00>(x, k);
    let l = _mm512_clmulepi64_epi128::<0x11>(x, k);
    _mm512_ternarylogic_epi64::<0x96>(h, l, d)
}

/// The CRC register from accumulators that hold the last `N` blocks of the message (N = 4
/// or 8, nothing after them): every lane moved onto the last lane in one step, each with its
/// own distance, so the tail waits for one multiplication, not three.
#[inline(always)]
unsafe fn reduce<const N: usize>(acc: [__m512i; N], k: &Keys) -> u32 {
    let first = 32 - 4 * N;
    // SAFETY: block i's constants are window[first + 4 i ..][..4], 64 readable bytes
    // (first + 4 i + 4 <= 32); registers otherwise.
    let moved = |i: usize, d: __m512i| unsafe {
        let kv = _mm512_loadu_si512(k.window[first + 4 * i..].as_ptr().cast());
        fold(acc[i], kv, d)
    };
    // The last lane passes through: its constants are zero, so its product is zero.
    let last = _mm512_maskz_mov_epi64(0xC0, acc[N - 1]);
    let mut chains = [last, _mm512_setzero_si512()];
    for i in (0..N).rev() {
        chains[i & 1] = moved(i, chains[i & 1]);
    }
    let sum = _mm512_xor_si512(chains[0], chains[1]);
    let half = _mm256_xor_si256(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64::<1>(sum));
    let v = _mm_xor_si128(_mm256_castsi256_si128(half), _mm256_extracti128_si256::<1>(half));
    let s = _mm_crc32_u64(0, _mm_cvtsi128_si64(v) as u64);
    _mm_crc32_u64(s, _mm_extract_epi64::<1>(v) as u64) as u32
}

/// The raw CRC register after `data`, for `data.len() >= 256`. Returns the state and how many
/// bytes it consumed (a multiple of 64); the caller finishes the rest.
///
/// # Panics
/// If `data` is shorter than 256 bytes: the first four loads read 256 bytes before any loop
/// checks the length, so this is checked in every build, not only in debug ones.
///
/// # Safety
/// The CPU must have VPCLMULQDQ, AVX-512F and SSE4.2 ([`available`]).
#[target_feature(enable = "vpclmulqdq,avx512f,sse4.2,pclmulqdq")]
pub unsafe fn raw(state: u32, data: &[u8]) -> (u32, usize) {
    // SAFETY: the caller's contract; no side streams.
    let (state, done, _) = unsafe { raw_with::<false>(state, data, Side { bytes: &[], rounds: 0 }) };
    (state, done)
}

/// Words each of the three side streams of [`raw_hybrid`] takes per 512-byte round: 96 bytes
/// beside the fold's 512. Eight words made every length slower (the `crc32` unit became the
/// bound); two gained as much as four.
const SIDE_WORDS: usize = 4;

/// From this length on [`raw_hybrid`] is used. Shorter, the merge and the fold's longer tail
/// cost more than the side streams save (at 4 KiB, 79 -> 92 ns); at 256 KiB they save 6%.
pub const HYBRID_MIN: usize = 16384;

/// The raw CRC register after `data` (at least [`HYBRID_MIN`] bytes): folding for most of it,
/// and, for its last bytes, three `crc32` streams run inside the folding loop. The `crc32`
/// instruction and the carry-less multiplier are different units, so within limits the
/// streams' bytes cost the loop nothing; the four parts are merged by shifts ([`Shift`]).
///
/// # Safety
/// The CPU must have VPCLMULQDQ, AVX-512F and SSE4.2 ([`available`]).
#[target_feature(enable = "vpclmulqdq,avx512f,sse4.2,pclmulqdq")]
pub unsafe fn raw_hybrid(state: u32, data: &[u8]) -> u32 {
    assert!(data.len() >= HYBRID_MIN, "fold::raw_hybrid needs {HYBRID_MIN} bytes or more");
    let per_round = 8 * SIDE_WORDS;
    let rounds = (data.len() - 512) / (512 + 3 * per_round);
    let stream = rounds * per_round;
    let (folded, side) = data.split_at(data.len() - 3 * stream);
    // SAFETY: the caller's contract; `folded` has 512 + 512 * rounds bytes or more, so its
    // loop runs `rounds` times or more.
    let (v, done, [a, b, c]) = unsafe { raw_with::<true>(state, folded, Side { bytes: side, rounds }) };
    // SAFETY: the same CPU has SSE4.2 and PCLMULQDQ.
    let v = unsafe { super::kernel::raw(v, &folded[done..]) };
    let [three, two, one] = side_shifts(rounds);
    three.apply(v) ^ two.apply(a as u32) ^ one.apply(b as u32) ^ c as u32
}

/// The shifts past one, two and three side streams of `rounds` rounds: built once for up to
/// 31 rounds (lengths under 20 KiB, where building them would cost a tenth of the CRC), each
/// time beyond.
fn side_shifts(rounds: usize) -> [Shift; 3] {
    static CACHED: [OnceLock<[Shift; 3]>; 32] = [const { OnceLock::new() }; 32];
    let build = || {
        let s = (rounds * 8 * SIDE_WORDS) as u64;
        [Shift::new(3 * s), Shift::new(2 * s), Shift::new(s)]
    };
    match CACHED.get(rounds) {
        Some(cell) => *cell.get_or_init(build),
        None => build(),
    }
}

/// Three streams of `crc32` run beside the folding loop, each over a third of `bytes`, for
/// the loop's first `rounds` rounds ([`SIDE_WORDS`] words each a round).
#[derive(Clone, Copy)]
struct Side<'a> {
    bytes: &'a [u8],
    rounds: usize,
}

/// [`raw`], with (`SIDE`) the side streams of `side` run inside its 512-byte rounds; returns
/// their registers (each started at zero) too. Without, the loop has no trace of them (a
/// check per round cost 4 KiB CRCs 3 ns).
#[target_feature(enable = "vpclmulqdq,avx512f,sse4.2,pclmulqdq")]
unsafe fn raw_with<const SIDE: bool>(state: u32, data: &[u8], side: Side<'_>) -> (u32, usize, [u64; 3]) {
    assert!(data.len() >= 256, "fold::raw needs 256 bytes or more, got {}", data.len());
    let stream = side.rounds * 8 * SIDE_WORDS;
    if SIDE {
        assert!(side.bytes.len() == 3 * stream, "three side streams of {stream} bytes");
        assert!(data.len() >= 512 * (side.rounds + 1), "a round for each side round");
    }
    let mut streams = [0u64; 3];
    let k = keys();
    // SAFETY: every use passes an off with off + 64 <= data.len() (the loops below check it).
    let load = |off: usize| unsafe { _mm512_loadu_si512(data.as_ptr().add(off).cast()) };
    let mut x = [load(0), load(64), load(128), load(192)];
    x[0] = _mm512_xor_si512(x[0], _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, state as i64));
    let mut off = 256;
    // SAFETY: registers only; VPCLMULQDQ and AVX-512F is enabled in this function.
    let k256 = unsafe { broadcast(&k.by256) };
    if data.len() >= 1024 {
        // Eight chains, 512 bytes a round: with four, each round waited for a product's
        // latency; eight keep the multiplier busy. The second four then fold onto the first.
        let mut y = [load(256), load(320), load(384), load(448)];
        off = 512;
        // SAFETY: registers only; VPCLMULQDQ and AVX-512F is enabled in this function.
        let k512 = unsafe { broadcast(&k.by512) };
        let mut round = 0;
        while off + 512 <= data.len() {
            for (i, (xi, yi)) in x.iter_mut().zip(y.iter_mut()).enumerate() {
                // SAFETY: off + 64 * i + 320 <= off + 512 <= data.len() (the loop
                // condition); `fold` is register arithmetic.
                unsafe {
                    *xi = fold(*xi, k512, load(off + 64 * i));
                    *yi = fold(*yi, k512, load(off + 256 + 64 * i));
                }
            }
            if SIDE && round < side.rounds {
                let p = side.bytes.as_ptr();
                let at = round * 8 * SIDE_WORDS;
                for w in (at..at + 8 * SIDE_WORDS).step_by(8) {
                    for (j, s) in streams.iter_mut().enumerate() {
                        // SAFETY: w + 8 <= 8 * SIDE_WORDS * side.rounds = stream, and the
                        // side is three streams long (asserted): inside `side.bytes`.
                        let word = unsafe { p.add(j * stream + w).cast::<u64>().read_unaligned() };
                        *s = _mm_crc32_u64(*s, u64::from_le(word));
                    }
                }
                round += 1;
            }
            off += 512;
        }
        if data.len() - off < 64 {
            // SAFETY: registers and `k`; the features are enabled in this function.
            return (unsafe { reduce([x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3]], k) }, off, streams);
        }
        for (xi, yi) in x.iter_mut().zip(y) {
            // SAFETY: register arithmetic.
            *xi = unsafe { fold(*xi, k256, yi) };
        }
    }
    while off + 256 <= data.len() {
        for (i, xi) in x.iter_mut().enumerate() {
            // SAFETY: off + 64 * i + 64 <= off + 256 <= data.len() (the loop condition); `fold` is register arithmetic.
            *xi = unsafe { fold(*xi, k256, load(off + 64 * i)) };
        }
        off += 256;
    }
    if data.len() - off < 64 {
        // SAFETY: registers and `k`; the features are enabled in this function.
        return (unsafe { reduce(x, k) }, off, streams);
    }
    // x0, x1 and x2 onto x3 side by side, not one after another: three independent pairs
    // of products, then two XORs, so the tail waits for one multiplication's latency instead
    // of three (5% of a 4 KiB CRC).
    // SAFETY: registers only; VPCLMULQDQ and AVX-512F is enabled in this function.
    let mut acc = unsafe {
        let (t0, t1, t2) = (broadcast(&k.tail[0]), broadcast(&k.tail[1]), broadcast(&k.tail[2]));
        let a = fold(x[0], t0, x[3]);
        let b = _mm512_clmulepi64_epi128::<0x00>(x[1], t1);
        let c = _mm512_clmulepi64_epi128::<0x11>(x[1], t1);
        let d = fold(x[2], t2, b);
        _mm512_ternarylogic_epi64::<0x96>(a, c, d)
    };
    // SAFETY: registers only; VPCLMULQDQ and AVX-512F is enabled in this function.
    let k64 = unsafe { broadcast(&k.by64) };
    while off + 64 <= data.len() {
        // SAFETY: off + 64 <= data.len() (the loop condition); `fold` is register arithmetic.
        acc = unsafe { fold(acc, k64, load(off)) };
        off += 64;
    }
    // Lanes 0..2 onto lane 3; lane 3 itself passes through (its constants are 0).
    // SAFETY: `lanes` is 64 readable bytes; the load is unaligned.
    let kl = unsafe { _mm512_loadu_si512(k.lanes.as_ptr().cast()) };
    // SAFETY: registers only; VPCLMULQDQ and AVX-512F is enabled in this function.
    let moved = unsafe { fold(acc, kl, _mm512_setzero_si512()) };
    let lane3 = _mm512_extracti64x4_epi64::<1>(acc);
    let lane3 = _mm256_extracti128_si256::<1>(lane3);
    let lo = _mm512_castsi512_si256(moved);
    let hi = _mm512_extracti64x4_epi64::<1>(moved);
    let v = _mm_xor_si128(
        _mm_xor_si128(_mm256_castsi256_si128(lo), _mm256_extracti128_si256::<1>(lo)),
        _mm_xor_si128(_mm256_castsi256_si128(hi), lane3),
    );
    let s = _mm_crc32_u64(0, _mm_cvtsi128_si64(v) as u64);
    let s = _mm_crc32_u64(s, _mm_extract_epi64::<1>(v) as u64);
    (s as u32, off, streams)
}
