//! Algebraic signatures (Litwin–Schwarz) over GF(2^16), built as a tower over GF(2^8).
//!
//! A chunk is read as GF(2^16) words w_0, w_1, ... (see [`word_of`]: each 64-byte group holds
//! 32 words, the low halves in its first 32 bytes and the high halves in the last 32; a short
//! last group is padded with zeros). Component j of the signature is
//! `S_j = sum_i w_i * alpha^(j * i)` for j = 1..=N; [`Sig32`] has N = 2, [`Sig64`] N = 4.
//!
//! Properties (each tested in tests/signatures.rs):
//! - linear over GF(2^8): sig(A ^ B) = sig(A) ^ sig(B), sig(c * A) = c * sig(A), so the
//!   signature of a Reed–Solomon parity chunk is the same combination of the data chunks'
//!   signatures ([`Signature::combine`]);
//! - any change of up to N bytes in a chunk of up to [`MAX_LEN`] bytes is detected: the
//!   alpha^i are distinct for i < 65535, so any N columns of the check matrix are independent
//!   (a Vandermonde argument); equal errors 255 bytes apart do not cancel as they would over
//!   GF(2^8);
//! - incremental: [`Signer::update`] folds in a changed range in O(len).

pub mod gf16;

use crate::gf::{engine, Engine, Line, WordMul};
use gf16::{alpha_pow, scale16, word_mul};

/// The longest chunk with the N-byte detection guarantee: 2047 groups of 32 words, fewer
/// than the 65535 distinct powers of alpha.
pub const MAX_LEN: usize = 2047 * 64;

/// A signature of N 16-bit components.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Signature<const N: usize>(pub [u16; N]);

/// 32-bit signature (two components).
pub type Sig32 = Signature<2>;
/// 64-bit signature (four components).
pub type Sig64 = Signature<4>;

impl<const N: usize> Default for Signature<N> {
    fn default() -> Self {
        Signature([0; N])
    }
}

impl<const N: usize> Signature<N> {
    /// The signature of an all-zero chunk (of any length).
    pub const ZERO: Self = Signature([0; N]);

    /// `self ^ other`: the signature of the XOR of two chunks.
    pub fn xor(self, other: Self) -> Self {
        let mut s = self;
        for (a, b) in s.0.iter_mut().zip(other.0) {
            *a ^= b;
        }
        s
    }

    /// `c * self`: the signature of a chunk multiplied bytewise by c.
    pub fn scale(self, c: u8) -> Self {
        Signature(self.0.map(|a| scale16(a, c)))
    }

    /// The signature of `sum_i coeffs[i] * chunk_i` from the chunks' signatures: what a
    /// parity chunk's signature must be (use [`crate::rs::Codec::parity_row`]).
    pub fn combine(coeffs: &[u8], sigs: &[Self]) -> Self {
        coeffs.iter().zip(sigs).fold(Self::ZERO, |acc, (&c, s)| acc.xor(s.scale(c)))
    }

    /// Little-endian bytes, component 1 first (the on-media form).
    pub fn to_bytes(self) -> Vec<u8> {
        self.0.iter().flat_map(|c| c.to_le_bytes()).collect()
    }

    /// Reads the on-media form; `None` if `b` is not 2N bytes.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() != 2 * N {
            return None;
        }
        Some(Signature(std::array::from_fn(|i| u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))))
    }
}

impl Sig32 {
    /// As one u32, component 1 in the low half.
    pub fn to_u32(self) -> u32 {
        self.0[0] as u32 | (self.0[1] as u32) << 16
    }

    /// From [`Sig32::to_u32`]'s form.
    pub fn from_u32(v: u32) -> Self {
        Signature([v as u16, (v >> 16) as u16])
    }
}

impl Sig64 {
    /// As one u64, component 1 in the low 16 bits.
    pub fn to_u64(self) -> u64 {
        self.0.iter().rev().fold(0u64, |acc, &c| acc << 16 | c as u64)
    }

    /// From [`Sig64::to_u64`]'s form.
    pub fn from_u64(v: u64) -> Self {
        Signature(std::array::from_fn(|i| (v >> (16 * i)) as u16))
    }
}

/// Where byte `pos` of a chunk lands: (word index, true for the high half).
pub fn word_of(pos: usize) -> (usize, bool) {
    (32 * (pos / 64) + pos % 32, pos % 64 >= 32)
}

/// Computes N-component signatures on an engine.
pub struct Signer<const N: usize> {
    engine: &'static dyn Engine,
    /// alpha^(32 j): one 64-byte group further along.
    steps: [WordMul; N],
    /// Per component j, multiplication by alpha^(16 j), alpha^(8 j), ... alpha^j: the halvings
    /// that fold 32 lane words into the component.
    halves: [[WordMul; 5]; N],
    /// The engine's tables for these constants, built once (see [`Engine::sig_prepare`]).
    prepared: Vec<Line>,
}

impl<const N: usize> std::fmt::Debug for Signer<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer<{N}>({})", self.engine.name())
    }
}

impl<const N: usize> Default for Signer<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Signer<N> {
    /// A signer on the process-wide engine.
    pub fn new() -> Self {
        Self::with_engine(engine())
    }

    /// A signer on a chosen engine.
    pub fn with_engine(engine: &'static dyn Engine) -> Self {
        let j = |c: usize| (c + 1) as u64;
        let steps = std::array::from_fn(|c| word_mul(alpha_pow(32 * j(c))));
        let halves =
            std::array::from_fn(|c| std::array::from_fn(|level| word_mul(alpha_pow(j(c) * (16 >> level)))));
        Signer { engine, steps, halves, prepared: engine.sig_prepare(&steps, &halves) }
    }

    /// The engine in use.
    pub fn engine(&self) -> &'static dyn Engine {
        self.engine
    }

    /// The signature of `data`.
    pub fn sign(&self, data: &[u8]) -> Signature<N> {
        // The zero-padded partial group first (it is the last one), then the whole groups
        // and the fold in one engine call.
        let mut lanes = [[0u8; 64]; N];
        let whole = data.len() & !63;
        if whole < data.len() {
            let mut tail = [0u8; 64];
            tail[..data.len() - whole].copy_from_slice(&data[whole..]);
            self.engine.sig_horner(&tail, &self.steps, &mut lanes);
        }
        let mut words = [0u16; N];
        self.engine.sig_sign(
            &self.prepared,
            &data[..whole],
            &self.steps,
            &self.halves,
            &mut lanes,
            &mut words,
        );
        Signature(words)
    }

    /// The signature after bytes [off, off + old.len()) changed from `old` to `new`, from the
    /// signature before: O(len), the rest of the chunk is not read.
    pub fn update(&self, sig: Signature<N>, off: usize, old: &[u8], new: &[u8]) -> Signature<N> {
        assert_eq!(old.len(), new.len(), "old and new ranges differ in length");
        // A small buffer for small changes: zeroing 4 KiB costs more than a short one's sign.
        if (off % 64) + old.len() <= 256 {
            self.update_in::<256>(sig, off, old, new)
        } else {
            self.update_in::<4096>(sig, off, old, new)
        }
    }

    /// [`Signer::update`] through a delta buffer of `B` bytes.
    fn update_in<const B: usize>(
        &self,
        sig: Signature<N>,
        off: usize,
        old: &[u8],
        new: &[u8],
    ) -> Signature<N> {
        let mut sig = sig;
        // Deltas in 64-byte-aligned pieces of up to B bytes, only the partial groups at the
        // ends padded with zeros.
        let mut buf = [0u8; B];
        let mut pos = off;
        let end = off + old.len();
        while pos < end {
            let base = pos & !63;
            let stop = end.min(base + buf.len());
            let span = (stop - base + 63) & !63;
            let (from, to) = (pos - base, stop - base);
            buf[..from].fill(0);
            buf[to..span].fill(0);
            let (o, n) = (&old[pos - off..stop - off], &new[pos - off..stop - off]);
            for ((d, a), b) in buf[from..to].iter_mut().zip(o).zip(n) {
                *d = a ^ b;
            }
            sig = sig.xor(self.sign_groups_at(&buf[..span], base / 64));
            pos = stop;
        }
        sig
    }

    /// The signature of `groups` (whole 64-byte groups) as the bytes of a chunk from group
    /// `first_group` on, the rest of the chunk zero: by linearity, what a chunk's signature
    /// changes by when those bytes change by `groups` (old ^ new). One fold however long.
    pub fn sign_groups_at(&self, groups: &[u8], first_group: usize) -> Signature<N> {
        assert_eq!(groups.len() % 64, 0, "whole 64-byte groups");
        let (mut lanes, mut words) = ([[0u8; 64]; N], [0u16; N]);
        self.engine.sig_sign(&self.prepared, groups, &self.steps, &self.halves, &mut lanes, &mut words);
        self.shift(words, first_group)
    }

    /// A signature of bytes that start at group `first_group` of the chunk, from that of the
    /// same bytes at group 0: component j times alpha^(32 j first_group).
    fn shift(&self, words: [u16; N], first_group: usize) -> Signature<N> {
        Signature(std::array::from_fn(|c| {
            let w = words[c];
            if first_group == 0 || w == 0 {
                w
            } else {
                gf16::mul16(w, alpha_pow(32 * (c as u64 + 1) * first_group as u64))
            }
        }))
    }
}

/// The definition, word by word, with no engine and no folding: the reference the fast path
/// is tested against.
pub fn sign_reference<const N: usize>(data: &[u8]) -> Signature<N> {
    let mut s = [0u16; N];
    for (pos, &b) in data.iter().enumerate() {
        let (w, high) = word_of(pos);
        let v = if high { (b as u16) << 8 } else { b as u16 };
        for (c, sc) in s.iter_mut().enumerate() {
            *sc ^= gf16::mul16(v, alpha_pow((c as u64 + 1) * w as u64));
        }
    }
    Signature(s)
}
