//! The GFNI engine: `gf2p8affineqb` multiplies 64 bytes by a constant in one instruction,
//! with any field polynomial (the constant's 8x8 bit matrix). Needs GFNI and AVX-512BW.
//! Tails use masked loads and stores, so there is no scalar remainder.

use std::arch::x86_64::*;

use super::tables::{mul, AFFINE};
use super::{check_dot_prod, check_sig, check_update, Engine, Lanes, Line, WordMul};

/// GFNI + AVX-512 engine; construct with [`Gfni::new`], which checks the CPU.
#[derive(Clone, Copy, Debug)]
pub struct Gfni(());

impl Gfni {
    /// `Some` when this CPU has GFNI, AVX-512F and AVX-512BW.
    pub fn new() -> Option<Self> {
        (is_x86_feature_detected!("gfni")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw"))
        .then_some(Gfni(()))
    }
}

impl Engine for Gfni {
    fn name(&self) -> &'static str {
        "gfni"
    }

    fn dot_prod(&self, coeffs: &[u8], srcs: &[&[u8]], outs: &mut [&mut [u8]], accumulate: bool) {
        let len = check_dot_prod(coeffs, srcs, outs);
        let k = srcs.len();
        for (g, outs) in outs.chunks_mut(4).enumerate() {
            let rows = &coeffs[g * 4 * k..(g * 4 + outs.len()) * k];
            // SAFETY: `new` checked the features; the shapes were checked above.
            unsafe {
                match outs.len() {
                    1 => dot_cols::<1>(rows, srcs, outs, accumulate, len),
                    2 => dot_cols::<2>(rows, srcs, outs, accumulate, len),
                    3 => dot_cols::<3>(rows, srcs, outs, accumulate, len),
                    _ => dot_cols::<4>(rows, srcs, outs, accumulate, len),
                }
            }
        }
    }

    fn update_parity(&self, coeffs: &[u8], old: &[u8], new: &[u8], parity: &mut [&mut [u8]], at: usize) {
        check_update(coeffs, old, new, parity, at);
        // SAFETY: `new` checked the features; `check_update` the ranges.
        unsafe { update(coeffs, old, new, parity, at) }
    }

    fn sig_horner(&self, data: &[u8], steps: &[WordMul], accs: &mut [Lanes]) {
        check_sig(data, steps, accs);
        for (steps, accs) in steps.chunks(4).zip(accs.chunks_mut(4)) {
            // SAFETY: `new` checked the features; `data` is whole 64-byte groups (checked).
            unsafe {
                match steps.len() {
                    1 => horner::<1>(data, steps, accs),
                    2 => horner::<2>(data, steps, accs),
                    3 => horner::<3>(data, steps, accs),
                    _ => horner::<4>(data, steps, accs),
                }
            }
        }
    }

    fn sig_fold(&self, accs: &[Lanes], halves: &[[WordMul; 5]], out: &mut [u16]) {
        assert!(accs.len() == halves.len() && accs.len() == out.len(), "one fold per component");
        for ((lanes, halves), out) in accs.iter().zip(halves).zip(out.iter_mut()) {
            // SAFETY: `new` checked the features.
            *out = unsafe { fold(lanes, halves) };
        }
    }

    /// The step matrices of every component, built once: building them per signature (20
    /// table lookups and broadcasts per component for the fold, 4 for the steps) cost as
    /// much as signing a 2 KiB page.
    fn sig_prepare(&self, steps: &[WordMul], halves: &[[WordMul; 5]]) -> Vec<Line> {
        assert_eq!(steps.len(), halves.len(), "one fold per component");
        let mut v = Vec::with_capacity(PREPARED * steps.len());
        for (step, halves) in steps.iter().zip(halves) {
            v.extend(matrix_lines(step));
            v.extend(matrix_lines(&square(step)));
            halves.iter().for_each(|h| v.extend(matrix_lines(h)));
        }
        v
    }

    fn sig_sign(
        &self,
        prepared: &[Line],
        data: &[u8],
        steps: &[WordMul],
        halves: &[[WordMul; 5]],
        accs: &mut [Lanes],
        out: &mut [u16],
    ) {
        check_sig(data, steps, accs);
        assert!(accs.len() == halves.len() && accs.len() == out.len(), "one fold per component");
        if prepared.len() != PREPARED * steps.len() {
            self.sig_horner(data, steps, accs);
            self.sig_fold(accs, halves, out);
            return;
        }
        for ((prep, accs), out) in
            prepared.chunks(4 * PREPARED).zip(accs.chunks_mut(4)).zip(out.chunks_mut(4))
        {
            // SAFETY: `new` checked the features; `data` is whole 64-byte groups (checked);
            // `prep` holds PREPARED lines per component (checked).
            unsafe {
                match accs.len() {
                    1 => sign_prepared::<1>(prep, data, accs, out),
                    2 => sign_prepared::<2>(prep, data, accs, out),
                    3 => sign_prepared::<3>(prep, data, accs, out),
                    _ => sign_prepared::<4>(prep, data, accs, out),
                }
            }
        }
    }
}

/// One signature of N components from their prepared lines: Horner over `data`, then the
/// N folds level by level together, so that one component's latency hides behind the
/// others' (one at a time, a fold is a chain of five dependent steps).
#[target_feature(enable = "gfni,avx512f,avx512bw")]
unsafe fn sign_prepared<const N: usize>(prep: &[Line], data: &[u8], accs: &mut [Lanes], out: &mut [u16]) {
    // SAFETY: a Line is 64 bytes, aligned to 64.
    let load = |l: &Line| unsafe { _mm512_load_si512(l.0.as_ptr().cast()) };
    let pair = |c: usize, at: usize| (load(&prep[c * PREPARED + at]), load(&prep[c * PREPARED + at + 1]));
    let one: [_; N] = std::array::from_fn(|c| pair(c, 0));
    let two: [_; N] = std::array::from_fn(|c| pair(c, 2));
    // SAFETY: the features are enabled in this function; the caller's contract on `data`.
    unsafe { horner_with::<N>(data, &one, &two, accs) };
    let level = |c: usize, l: usize| pair(c, 4 + 2 * l);
    // SAFETY: a Lanes is 64 bytes.
    let mut w: [__m512i; N] = std::array::from_fn(|c| unsafe { _mm512_loadu_si512(accs[c].as_ptr().cast()) });
    // The levels of `fold_with`, each for every component.
    for (c, w) in w.iter_mut().enumerate() {
        *w = step(_mm512_shuffle_i64x2::<0b00_11_00_01>(*w, *w), level(c, 0), *w);
    }
    for (c, w) in w.iter_mut().enumerate() {
        *w = step(_mm512_bsrli_epi128::<8>(*w), level(c, 1), *w);
    }
    for (c, w) in w.iter_mut().enumerate() {
        *w = step(_mm512_bsrli_epi128::<4>(*w), level(c, 2), *w);
    }
    for (c, w) in w.iter_mut().enumerate() {
        *w = step(_mm512_bsrli_epi128::<2>(*w), level(c, 3), *w);
    }
    for (c, w) in w.iter_mut().enumerate() {
        *w = step(_mm512_bsrli_epi128::<1>(*w), level(c, 4), *w);
    }
    for (w, out) in w.iter().zip(out.iter_mut()) {
        *out = word0(*w);
    }
}

/// Lines per component of [`Gfni::sig_prepare`]: the step's two matrices, its square's
/// two, then two for each of the five fold levels.
const PREPARED: usize = 14;

/// [`step_matrices`] as two lines: the diagonal's matrices (m00 in the low four words, m11
/// in the high), then the cross's (m01 low, m10 high).
fn matrix_lines(m: &WordMul) -> [Line; 2] {
    let [m00, m01, m10, m11] = m.map(matrix);
    let line = |lo: i64, hi: i64| {
        let mut l = Line([0; 64]);
        for (i, word) in l.0.chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&if i < 4 { lo } else { hi }.to_le_bytes());
        }
        l
    };
    [line(m00, m11), line(m01, m10)]
}

#[inline(always)]
fn matrix(c: u8) -> i64 {
    AFFINE[c as usize] as i64
}

#[target_feature(enable = "gfni,avx512f,avx512bw")]
unsafe fn dot_cols<const G: usize>(
    rows: &[u8],
    srcs: &[&[u8]],
    outs: &mut [&mut [u8]],
    accumulate: bool,
    len: usize,
) {
    let mut off = 0;
    // Four columns per pass: each constant's matrix is broadcast once for 256 bytes, not once
    // per 64 (4 x G accumulators and 4 sources fit the 32 vector registers).
    while off + 256 <= len {
        // SAFETY: off + 256 <= len of every buffer.
        unsafe { dot_block::<G, 4>(rows, srcs, outs, accumulate, off) };
        off += 256;
    }
    while off + 64 <= len {
        // SAFETY: off + 64 <= len of every buffer.
        unsafe { dot_col::<G, false>(rows, srcs, outs, accumulate, off, !0) };
        off += 64;
    }
    if off < len {
        let mask: __mmask64 = (1u64 << (len - off)) - 1;
        // SAFETY: the mask covers bytes off..len, all inside every buffer.
        unsafe { dot_col::<G, true>(rows, srcs, outs, accumulate, off, mask) };
    }
}

/// `C` adjacent 64-byte columns of `G` outputs, unmasked.
///
/// # Safety
/// Bytes off..off+64*C lie inside every buffer.
#[inline(always)]
unsafe fn dot_block<const G: usize, const C: usize>(
    rows: &[u8],
    srcs: &[&[u8]],
    outs: &mut [&mut [u8]],
    accumulate: bool,
    off: usize,
) {
    let k = srcs.len();
    let mut acc = [[_mm512_setzero_si512(); C]; G];
    if accumulate {
        for (acc, out) in acc.iter_mut().zip(outs.iter()) {
            for (c, a) in acc.iter_mut().enumerate() {
                // SAFETY: the caller's contract: off + 64 * C is inside every output.
                *a = unsafe { _mm512_loadu_si512(out.as_ptr().add(off + 64 * c).cast()) };
            }
        }
    }
    for (i, src) in srcs.iter().enumerate() {
        let mut x = [_mm512_setzero_si512(); C];
        for (c, x) in x.iter_mut().enumerate() {
            // SAFETY: the caller's contract: off + 64 * C is inside every source.
            *x = unsafe { _mm512_loadu_si512(src.as_ptr().add(off + 64 * c).cast()) };
        }
        for (j, acc) in acc.iter_mut().enumerate() {
            let a = _mm512_set1_epi64(matrix(rows[j * k + i]));
            for (a_c, x_c) in acc.iter_mut().zip(&x) {
                *a_c = _mm512_xor_si512(*a_c, _mm512_gf2p8affine_epi64_epi8::<0>(*x_c, a));
            }
        }
    }
    for (acc, out) in acc.iter().zip(outs.iter_mut()) {
        for (c, a) in acc.iter().enumerate() {
            // SAFETY: the caller's contract: off + 64 * C is inside every output.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(off + 64 * c).cast(), *a) };
        }
    }
}

/// `parity[j][at..] ^= coeffs[j] * (old ^ new)`, 64 bytes at a time with masked loads and
/// stores: no delta buffer and no call per 64 bytes (a small write's update is one column).
///
/// # Safety
/// GFNI and AVX-512BW are present; `old` and `new` have equal lengths and every parity chunk
/// holds at + old.len() bytes.
#[target_feature(enable = "gfni,avx512f,avx512bw")]
unsafe fn update(coeffs: &[u8], old: &[u8], new: &[u8], parity: &mut [&mut [u8]], at: usize) {
    let len = old.len();
    let mut off = 0;
    while off < len {
        let n = (len - off).min(64);
        let mask: __mmask64 = if n == 64 { !0 } else { (1u64 << n) - 1 };
        // SAFETY: the mask covers bytes off..off + n, inside `old`, `new` and every parity range.
        unsafe {
            let d = _mm512_xor_si512(
                _mm512_maskz_loadu_epi8(mask, old.as_ptr().add(off).cast()),
                _mm512_maskz_loadu_epi8(mask, new.as_ptr().add(off).cast()),
            );
            for (&c, p) in coeffs.iter().zip(parity.iter_mut()) {
                let q = p.as_mut_ptr().add(at + off);
                let v = _mm512_maskz_loadu_epi8(mask, q.cast());
                let v =
                    _mm512_xor_si512(v, _mm512_gf2p8affine_epi64_epi8::<0>(d, _mm512_set1_epi64(matrix(c))));
                _mm512_mask_storeu_epi8(q.cast(), mask, v);
            }
        }
        off += 64;
    }
}

/// One 64-byte column of `G` outputs; `MASKED` for the tail, with plain loads elsewhere.
///
/// # Safety
/// Bytes off..off+64 (or those in `mask` when `MASKED`) lie inside every buffer.
#[inline(always)]
unsafe fn dot_col<const G: usize, const MASKED: bool>(
    rows: &[u8],
    srcs: &[&[u8]],
    outs: &mut [&mut [u8]],
    accumulate: bool,
    off: usize,
    mask: __mmask64,
) {
    let k = srcs.len();
    // SAFETY: the caller's contract.
    let load = |p: *const u8| unsafe {
        if MASKED {
            _mm512_maskz_loadu_epi8(mask, p.cast())
        } else {
            _mm512_loadu_si512(p.cast())
        }
    };
    let mut acc = [_mm512_setzero_si512(); G];
    for j in 0..G {
        if accumulate {
            // SAFETY: the caller's contract: off plus the vector (or the mask) is inside every output.
            acc[j] = load(unsafe { outs[j].as_ptr().add(off) });
        }
    }
    for (i, src) in srcs.iter().enumerate() {
        // SAFETY: the caller's contract: off plus the vector (or the mask) is inside every source.
        let x = load(unsafe { src.as_ptr().add(off) });
        for j in 0..G {
            let a = _mm512_set1_epi64(matrix(rows[j * k + i]));
            acc[j] = _mm512_xor_si512(acc[j], _mm512_gf2p8affine_epi64_epi8::<0>(x, a));
        }
    }
    for j in 0..G {
        // SAFETY: the caller's contract: off plus the vector (or the mask) is inside every output.
        let p = unsafe { outs[j].as_mut_ptr().add(off) };
        // SAFETY: the caller's contract.
        unsafe {
            if MASKED {
                _mm512_mask_storeu_epi8(p.cast(), mask, acc[j]);
            } else {
                _mm512_storeu_si512(p.cast(), acc[j]);
            }
        }
    }
}

/// The square of a step: two groups further along.
fn square(m: &WordMul) -> WordMul {
    let [a, b, c, d] = *m;
    [mul(a, a) ^ mul(b, c), mul(a, b) ^ mul(b, d), mul(c, a) ^ mul(d, c), mul(c, b) ^ mul(d, d)]
}

/// The diagonal and cross matrices of a step (see [`horner`]).
#[target_feature(enable = "gfni,avx512f,avx512bw")]
fn step_matrices(m: &WordMul) -> (__m512i, __m512i) {
    let [m00, m01, m10, m11] = m.map(matrix);
    (
        _mm512_set_epi64(m11, m11, m11, m11, m00, m00, m00, m00),
        _mm512_set_epi64(m10, m10, m10, m10, m01, m01, m01, m01),
    )
}

/// acc * step ^ g.
#[inline(always)]
unsafe fn step(acc: __m512i, (diag, cross): (__m512i, __m512i), g: __m512i) -> __m512i {
    let swapped = _mm512_shuffle_i64x2::<0x4E>(acc, acc);
    let p = _mm512_gf2p8affine_epi64_epi8::<0>(acc, diag);
    let q = _mm512_gf2p8affine_epi64_epi8::<0>(swapped, cross);
    _mm512_ternarylogic_epi64::<0x96>(p, q, g)
}

/// The whole 64-byte group in one register: low halves in the lower 256 bits, high halves in
/// the upper. acc * step = diag(m00, m11) * acc ^ diag(m01, m10) * swap(acc). Each component
/// runs two chains (even and odd groups, stepping by step^2) so that the affine latency of one
/// hides behind the other; they merge as even ^ odd * step.
#[target_feature(enable = "gfni,avx512f,avx512bw")]
unsafe fn horner<const N: usize>(data: &[u8], steps: &[WordMul], accs: &mut [Lanes]) {
    let one: [_; N] = std::array::from_fn(|c| step_matrices(&steps[c]));
    let two: [_; N] = std::array::from_fn(|c| step_matrices(&square(&steps[c])));
    // SAFETY: the features are enabled in this function, as `horner_with` needs.
    unsafe { horner_with::<N>(data, &one, &two, accs) }
}

/// [`horner`] with each component's step matrices (`one`) and its square's (`two`) given.
#[target_feature(enable = "gfni,avx512f,avx512bw")]
#[inline]
unsafe fn horner_with<const N: usize>(
    data: &[u8],
    one: &[(__m512i, __m512i); N],
    two: &[(__m512i, __m512i); N],
    accs: &mut [Lanes],
) {
    let zero = _mm512_setzero_si512();
    let mut even = [zero; N];
    let mut odd = [zero; N];
    for c in 0..N {
        // SAFETY: a Lanes is 64 bytes.
        even[c] = unsafe { _mm512_loadu_si512(accs[c].as_ptr().cast()) };
    }
    // SAFETY: g is a 64-byte group (chunks_exact(64)): an unaligned load of exactly its bytes.
    let load = |g: &[u8]| unsafe { _mm512_loadu_si512(g.as_ptr().cast()) };
    let mut rest = data;
    if (data.len() / 64) % 2 == 1 {
        let (head, last) = data.split_at(data.len() - 64);
        let g = load(last);
        for c in 0..N {
            // SAFETY: registers only; GFNI and AVX-512 is enabled in this function.
            even[c] = unsafe { step(even[c], one[c], g) };
        }
        rest = head;
    }
    for pair in rest.chunks_exact(128).rev() {
        let (ge, go) = (load(&pair[..64]), load(&pair[64..]));
        for c in 0..N {
            // SAFETY: registers only; GFNI and AVX-512 is enabled in this function.
            even[c] = unsafe { step(even[c], two[c], ge) };
            // SAFETY: registers only; GFNI and AVX-512 is enabled in this function.
            odd[c] = unsafe { step(odd[c], two[c], go) };
        }
    }
    for c in 0..N {
        // SAFETY: registers only; GFNI and AVX-512 is enabled in this function.
        let acc = unsafe { step(odd[c], one[c], even[c]) };
        // SAFETY: a Lanes is 64 bytes.
        unsafe { _mm512_storeu_si512(accs[c].as_mut_ptr().cast(), acc) };
    }
}

/// The five halvings of [`Engine::sig_fold`] for one component, in one register (the layout
/// of [`horner`]): the upper words of each 256-bit half are moved down (a 128-bit lane
/// shuffle, then byte shifts within lanes, which move low and high halves alike) and
/// multiplied into the lower ones. Lanes 1 and 3 fill with words no later level reads into
/// word 0. Three instructions a level, where the table-driven fold needs a dozen.
#[target_feature(enable = "gfni,avx512f,avx512bw")]
unsafe fn fold(lanes: &Lanes, halves: &[WordMul; 5]) -> u16 {
    let levels = [0, 1, 2, 3, 4].map(|l| step_matrices(&halves[l]));
    // SAFETY: the features are enabled in this function, as `fold_with` needs.
    unsafe { fold_with(lanes, &levels) }
}

/// [`fold`] with each level's step matrices given.
#[target_feature(enable = "gfni,avx512f,avx512bw")]
unsafe fn fold_with(lanes: &Lanes, levels: &[(__m512i, __m512i); 5]) -> u16 {
    // SAFETY: a Lanes is 64 bytes.
    let mut w = unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) };
    // One level per shift: 16 words (a lane shuffle), then 8, 4, 2, 1 (byte shifts).
    // SAFETY: registers only; GFNI and AVX-512 are enabled in this function.
    w = unsafe { step(_mm512_shuffle_i64x2::<0b00_11_00_01>(w, w), levels[0], w) };
    // SAFETY: as above.
    w = unsafe { step(_mm512_bsrli_epi128::<8>(w), levels[1], w) };
    // SAFETY: as above.
    w = unsafe { step(_mm512_bsrli_epi128::<4>(w), levels[2], w) };
    // SAFETY: as above.
    w = unsafe { step(_mm512_bsrli_epi128::<2>(w), levels[3], w) };
    // SAFETY: as above.
    w = unsafe { step(_mm512_bsrli_epi128::<1>(w), levels[4], w) };
    word0(w)
}

/// Word 0 of a folded component: its low half is byte 0, its high half byte 32.
#[target_feature(enable = "gfni,avx512f,avx512bw")]
#[inline]
fn word0(w: __m512i) -> u16 {
    let lo = _mm_cvtsi128_si32(_mm512_castsi512_si128(w)) as u8;
    let hi = _mm_cvtsi128_si32(_mm512_extracti32x4_epi32::<2>(w)) as u8;
    lo as u16 | (hi as u16) << 8
}
