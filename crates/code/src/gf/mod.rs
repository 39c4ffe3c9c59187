//! GF(2^8) arithmetic and the engines that run it over buffers.
//!
//! Every engine implements [`Engine`]; [`engine()`] picks the fastest one the CPU supports,
//! once, unless `BITMEND_ENGINE` names one (`scalar`, `ssse3`, `avx2`, `avx512`, `gfni`). Every SIMD
//! engine is checked byte for byte against the scalar one (tests/engines.rs).

#[cfg(target_arch = "x86_64")]
mod engine_avx2;
#[cfg(target_arch = "x86_64")]
mod engine_avx512;
#[cfg(target_arch = "x86_64")]
mod engine_gfni;
mod engine_scalar;
#[cfg(target_arch = "x86_64")]
mod engine_ssse3;
pub mod tables;

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
pub use engine_avx2::Avx2;
#[cfg(target_arch = "x86_64")]
pub use engine_avx512::Avx512;
#[cfg(target_arch = "x86_64")]
pub use engine_gfni::Gfni;
pub use engine_scalar::Scalar;
#[cfg(target_arch = "x86_64")]
pub use engine_ssse3::Ssse3;
pub use tables::{div, inv, mul, pow};

/// Multiplication by a constant of GF(2^16) built as GF(2^8)[x]/(x^2 + x + t), as a 2x2 matrix
/// over GF(2^8) acting on a word (lo, hi): lo' = m[0]*lo ^ m[1]*hi, hi' = m[2]*lo ^ m[3]*hi.
/// The signature kernels step their Horner accumulators with it.
pub type WordMul = [u8; 4];

/// Applies a [`WordMul`] to one word (the scalar twin of the engines' step).
#[inline]
pub fn apply(m: &WordMul, a: u16) -> u16 {
    let (lo, hi) = (a as u8, (a >> 8) as u8);
    (mul(m[0], lo) ^ mul(m[1], hi)) as u16 | ((mul(m[2], lo) ^ mul(m[3], hi)) as u16) << 8
}

/// A 64-byte group as the signature kernels see it: bytes 0..32 are the low halves of 32
/// GF(2^16) words, bytes 32..64 their high halves (see docs/FORMAT.md, "signature").
pub type Lanes = [u8; 64];

/// 64 bytes aligned to a cache line: one vector register's worth of a precomputed table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Line(pub [u8; 64]);

/// An implementation of the hot loops over GF(2^8).
pub trait Engine: Send + Sync + 'static {
    /// A short name: `scalar`, `ssse3`, `avx2`, `gfni`.
    fn name(&self) -> &'static str;

    /// Dot products of `srcs` with each row of `coeffs` (row-major, `outs.len()` rows of
    /// `srcs.len()` constants): `outs[j] = sum_i coeffs[j * k + i] * srcs[i]`, or `^=` that sum
    /// into `outs[j]` when `accumulate`. All buffers have the same length.
    fn dot_prod(&self, coeffs: &[u8], srcs: &[&[u8]], outs: &mut [&mut [u8]], accumulate: bool);

    /// Horner steps of the algebraic signature over `data` (a multiple of 64 bytes), from its
    /// last 64-byte group to its first: for each component c, `accs[c] = accs[c] * steps[c] ^ group`
    /// with every one of the 32 lanes a GF(2^16) word (see [`Lanes`]).
    fn sig_horner(&self, data: &[u8], steps: &[WordMul], accs: &mut [Lanes]);

    /// Folds each component's 32 lane words into one word, `out[c]`: five halvings, the
    /// upper half of the words times `halves[c][level]` added into the lower half
    /// (w_r ^= w_(r + h) * m for r < h, h = 16, 8, 4, 2, 1); what is left in word 0.
    fn sig_fold(&self, accs: &[Lanes], halves: &[[WordMul; 5]], out: &mut [u16]) {
        assert!(accs.len() == halves.len() && accs.len() == out.len(), "one fold per component");
        for ((lanes, steps), o) in accs.iter().zip(halves).zip(out.iter_mut()) {
            let mut w: [u16; 32] = std::array::from_fn(|r| lanes[r] as u16 | (lanes[32 + r] as u16) << 8);
            for (level, m) in steps.iter().enumerate() {
                let h = 16 >> level;
                for r in 0..h {
                    w[r] ^= apply(m, w[r + h]);
                }
            }
            *o = w[0];
        }
    }

    /// Tables for [`sig_sign`](Engine::sig_sign) derived from a signer's constants, built
    /// once per signer rather than on every call; empty for an engine that has none.
    fn sig_prepare(&self, steps: &[WordMul], halves: &[[WordMul; 5]]) -> Vec<Line> {
        let _ = (steps, halves);
        Vec::new()
    }

    /// One signature: [`sig_horner`](Engine::sig_horner) over `data` from `accs`, then
    /// [`sig_fold`](Engine::sig_fold) into `out`. `prepared` is what
    /// [`sig_prepare`](Engine::sig_prepare) returned for the same constants; `accs` is left
    /// unspecified.
    fn sig_sign(
        &self,
        prepared: &[Line],
        data: &[u8],
        steps: &[WordMul],
        halves: &[[WordMul; 5]],
        accs: &mut [Lanes],
        out: &mut [u16],
    ) {
        let _ = prepared;
        self.sig_horner(data, steps, accs);
        self.sig_fold(accs, halves, out);
    }

    /// `dst ^= c * src`.
    fn mul_acc(&self, c: u8, src: &[u8], dst: &mut [u8]) {
        self.dot_prod(&[c], &[src], &mut [dst], true);
    }

    /// `parity[j][at..at + old.len()] ^= coeffs[j] * (old ^ new)` for every j: how each
    /// parity chunk changes when data bytes change from `old` to `new` (the small-write path;
    /// the code is linear). Engines with masked vector loads override it to skip the delta buffer.
    fn update_parity(&self, coeffs: &[u8], old: &[u8], new: &[u8], parity: &mut [&mut [u8]], at: usize) {
        let len = check_update(coeffs, old, new, parity, at);
        let mut delta = [0u8; 256];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(delta.len());
            for ((d, o), w) in delta.iter_mut().zip(&old[done..done + n]).zip(&new[done..done + n]) {
                *d = o ^ w;
            }
            let from = at + done;
            for (coeffs, group) in coeffs.chunks(4).zip(parity.chunks_mut(4)) {
                let g = group.len();
                let mut outs: [&mut [u8]; 4] = Default::default();
                for (o, p) in outs.iter_mut().zip(group.iter_mut()) {
                    *o = &mut p[from..from + n];
                }
                self.dot_prod(coeffs, &[&delta[..n]], &mut outs[..g], true);
            }
            done += n;
        }
    }
}

/// Checks the shapes of an `update_parity` call; returns the length of the range.
#[inline]
pub(crate) fn check_update(coeffs: &[u8], old: &[u8], new: &[u8], parity: &[&mut [u8]], at: usize) -> usize {
    assert_eq!(coeffs.len(), parity.len(), "one coefficient per parity chunk");
    assert_eq!(old.len(), new.len(), "old and new bytes differ in length");
    let end = at.checked_add(old.len()).expect("range overflows");
    assert!(parity.iter().all(|p| p.len() >= end), "range outside a parity chunk");
    old.len()
}

/// Checks the shapes every engine relies on; the engines call it first.
#[inline]
pub(crate) fn check_dot_prod(coeffs: &[u8], srcs: &[&[u8]], outs: &[&mut [u8]]) -> usize {
    assert_eq!(coeffs.len(), srcs.len() * outs.len(), "coefficient matrix shape");
    let len = outs.first().map_or(0, |o| o.len());
    assert!(srcs.iter().all(|s| s.len() == len), "source lengths differ");
    assert!(outs.iter().all(|o| o.len() == len), "output lengths differ");
    len
}

#[inline]
pub(crate) fn check_sig(data: &[u8], steps: &[WordMul], accs: &[Lanes]) {
    assert_eq!(data.len() % 64, 0, "signature kernels take whole 64-byte groups");
    assert_eq!(steps.len(), accs.len(), "one step per component");
}

/// Every engine this CPU can run, slowest first; the scalar engine always.
pub fn available() -> Vec<&'static dyn Engine> {
    #[allow(unused_mut)]
    let mut v: Vec<&'static dyn Engine> = vec![&Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(e) = Ssse3::new() {
            v.push(leak(e));
        }
        if let Some(e) = Avx2::new() {
            v.push(leak(e));
        }
        if let Some(e) = Avx512::new() {
            v.push(leak(e));
        }
        if let Some(e) = Gfni::new() {
            v.push(leak(e));
        }
    }
    v
}

/// The engine named `name`, if this CPU can run it.
pub fn by_name(name: &str) -> Option<&'static dyn Engine> {
    available().into_iter().find(|e| e.name() == name)
}

fn leak<E: Engine>(e: E) -> &'static dyn Engine {
    // Engines are zero-sized tokens: leaking one costs nothing.
    Box::leak(Box::new(e))
}

/// The process-wide engine: `BITMEND_ENGINE` if set and runnable, else the fastest.
pub fn engine() -> &'static dyn Engine {
    static CHOSEN: OnceLock<&'static dyn Engine> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let all = available();
        if let Ok(name) = std::env::var("BITMEND_ENGINE") {
            if let Some(e) = all.iter().find(|e| e.name() == name) {
                return *e;
            }
        }
        *all.last().expect("the scalar engine is always available")
    })
}
