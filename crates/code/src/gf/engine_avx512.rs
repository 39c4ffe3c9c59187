//! The AVX-512BW engine: split-nibble shuffles (as the AVX2 engine) on 64-byte vectors, for
//! CPUs with AVX-512 but no GFNI (Skylake-SP, Cascade Lake). Tails use masked loads and
//! stores, so there is no scalar remainder.

use std::arch::x86_64::*;

use super::tables::{mul, NIBBLES};
use super::{check_dot_prod, check_sig, check_update, Engine, Lanes, Line, WordMul};

/// AVX-512BW engine; construct with [`Avx512::new`], which checks the CPU.
#[derive(Clone, Copy, Debug)]
pub struct Avx512(());

impl Avx512 {
    /// `Some` when this CPU has AVX-512F and AVX-512BW.
    pub fn new() -> Option<Self> {
        (is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")).then_some(Avx512(()))
    }
}

impl Engine for Avx512 {
    fn name(&self) -> &'static str {
        "avx512"
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

    fn sig_fold(&self, accs: &[Lanes], halves: &[[WordMul; 5]], out: &mut [u16]) {
        assert!(accs.len() == halves.len() && accs.len() == out.len(), "one fold per component");
        for ((accs, halves), out) in accs.chunks(4).zip(halves.chunks(4)).zip(out.chunks_mut(4)) {
            // SAFETY: `new` checked the features; the three slices have equal lengths.
            unsafe {
                match accs.len() {
                    1 => fold::<1>(accs, halves, out),
                    2 => fold::<2>(accs, halves, out),
                    3 => fold::<3>(accs, halves, out),
                    _ => fold::<4>(accs, halves, out),
                }
            }
        }
    }

    fn sig_prepare(&self, steps: &[WordMul], halves: &[[WordMul; 5]]) -> Vec<Line> {
        assert_eq!(steps.len(), halves.len(), "one fold per component");
        let mut v = vec![Line([0; 64]); PREPARED * steps.len()];
        for ((lines, step), halves) in v.chunks_exact_mut(PREPARED).zip(steps).zip(halves) {
            // SAFETY: `new` checked the features; `lines` is PREPARED lines.
            unsafe { prepare(step, halves, lines) };
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
            prepared.chunks(2 * PREPARED).zip(accs.chunks_mut(2)).zip(out.chunks_mut(2))
        {
            // SAFETY: `new` checked the features; `data` is whole groups (checked); `prep`
            // holds PREPARED lines per component.
            unsafe {
                match accs.len() {
                    1 => sign_prepared::<1>(prep, data, accs, out),
                    _ => sign_prepared::<2>(prep, data, accs, out),
                }
            }
        }
    }

    fn sig_horner(&self, data: &[u8], steps: &[WordMul], accs: &mut [Lanes]) {
        check_sig(data, steps, accs);
        for (steps, accs) in steps.chunks(2).zip(accs.chunks_mut(2)) {
            // SAFETY: `new` checked the features; `data` is whole 64-byte groups (checked).
            unsafe {
                match steps.len() {
                    1 => horner::<1>(data, steps, accs),
                    _ => horner::<2>(data, steps, accs),
                }
            }
        }
    }
}

/// The low- and high-nibble product tables of `c`, in every 128-bit lane.
#[inline(always)]
unsafe fn tables(c: u8) -> (__m512i, __m512i) {
    let t = NIBBLES[c as usize].as_ptr();
    // SAFETY: a NIBBLES row is 32 bytes: two 16-byte loads stay inside it.
    unsafe {
        (
            _mm512_broadcast_i32x4(_mm_loadu_si128(t.cast())),
            _mm512_broadcast_i32x4(_mm_loadu_si128(t.add(16).cast())),
        )
    }
}

/// Tables for `a` in the lower 256 bits and `b` in the upper (a step acts on the low halves
/// of the words with one constant and on the high halves with another).
#[inline(always)]
unsafe fn half_tables(a: u8, b: u8) -> (__m512i, __m512i) {
    // SAFETY: as in `tables`.
    unsafe {
        let (alo, ahi) = tables(a);
        let (blo, bhi) = tables(b);
        (
            _mm512_inserti64x4::<1>(alo, _mm512_castsi512_si256(blo)),
            _mm512_inserti64x4::<1>(ahi, _mm512_castsi512_si256(bhi)),
        )
    }
}

/// c * x, for x split into nibbles (lo, hi).
#[inline(always)]
unsafe fn mul_split(t: (__m512i, __m512i), lo: __m512i, hi: __m512i) -> __m512i {
    _mm512_xor_si512(_mm512_shuffle_epi8(t.0, lo), _mm512_shuffle_epi8(t.1, hi))
}

#[inline(always)]
unsafe fn split(x: __m512i) -> (__m512i, __m512i) {
    let mask = _mm512_set1_epi8(0x0f);
    (_mm512_and_si512(x, mask), _mm512_and_si512(_mm512_srli_epi16::<4>(x), mask))
}

const WIDE: usize = 4;

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dot_cols<const G: usize>(
    rows: &[u8],
    srcs: &[&[u8]],
    outs: &mut [&mut [u8]],
    accumulate: bool,
    len: usize,
) {
    let mut off = 0;
    // Several columns at a time: each table broadcast then serves 64 * WIDE bytes.
    while off + 64 * WIDE <= len {
        // SAFETY: off + 64 * WIDE <= len of every buffer.
        unsafe { dot_cols_wide::<G, WIDE>(rows, srcs, outs, accumulate, off) };
        off += 64 * WIDE;
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
        let (lo, hi) = unsafe { split(load(src.as_ptr().add(off))) };
        for j in 0..G {
            // SAFETY: `tables` has a row for every byte; AVX-512BW is enabled in this function.
            let t = unsafe { tables(rows[j * k + i]) };
            acc[j] = _mm512_ternarylogic_epi64::<0x96>(
                acc[j],
                _mm512_shuffle_epi8(t.0, lo),
                _mm512_shuffle_epi8(t.1, hi),
            );
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

/// `U` adjacent 64-byte columns of `G` outputs: each table broadcast serves 64 * U bytes.
///
/// # Safety
/// Bytes off..off + 64 * U lie inside every buffer.
#[inline(always)]
unsafe fn dot_cols_wide<const G: usize, const U: usize>(
    rows: &[u8],
    srcs: &[&[u8]],
    outs: &mut [&mut [u8]],
    accumulate: bool,
    off: usize,
) {
    let k = srcs.len();
    let mut acc = [[_mm512_setzero_si512(); U]; G];
    // SAFETY (every load and store below): the caller's contract.
    if accumulate {
        for (a, out) in acc.iter_mut().zip(outs.iter()) {
            // SAFETY: the caller's contract: off + 64 * U is inside every output.
            let p = unsafe { out.as_ptr().add(off) };
            for (u, v) in a.iter_mut().enumerate() {
                // SAFETY: u < U and off + 64 * U is inside the output (the caller's contract).
                *v = unsafe { _mm512_loadu_si512(p.add(64 * u).cast()) };
            }
        }
    }
    for (i, src) in srcs.iter().enumerate() {
        // SAFETY: the caller's contract: off + 64 * U is inside every source.
        let p = unsafe { src.as_ptr().add(off) };
        let mut lo = [_mm512_setzero_si512(); U];
        let mut hi = [_mm512_setzero_si512(); U];
        for (u, (l, h)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
            // SAFETY: u < U and off + 64 * U is inside the source (the caller's contract).
            (*l, *h) = unsafe { split(_mm512_loadu_si512(p.add(64 * u).cast())) };
        }
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: j < G <= outs, i < k: inside the coefficient rows (checked by the caller).
            let t = unsafe { tables(*rows.get_unchecked(j * k + i)) };
            for ((v, l), h) in a.iter_mut().zip(&lo).zip(&hi) {
                *v = _mm512_ternarylogic_epi64::<0x96>(
                    *v,
                    _mm512_shuffle_epi8(t.0, *l),
                    _mm512_shuffle_epi8(t.1, *h),
                );
            }
        }
    }
    for (a, out) in acc.iter().zip(outs.iter_mut()) {
        // SAFETY: the caller's contract: off + 64 * U is inside every output.
        let p = unsafe { out.as_mut_ptr().add(off) };
        for (u, v) in a.iter().enumerate() {
            // SAFETY: u < U and off + 64 * U is inside the output (the caller's contract).
            unsafe { _mm512_storeu_si512(p.add(64 * u).cast(), *v) };
        }
    }
}

/// The delta of each 64-byte piece straight from `old` and `new` in registers (masked loads
/// for the last piece), applied to every parity chunk in turn.
///
/// # Safety
/// `old` and `new` have equal lengths and every parity chunk holds at..at + that length.
#[target_feature(enable = "avx512f,avx512bw")]
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
            let (lo, hi) = split(d);
            for (&c, p) in coeffs.iter().zip(parity.iter_mut()) {
                let t = tables(c);
                let q = p.as_mut_ptr().add(at + off);
                let v = _mm512_maskz_loadu_epi8(mask, q.cast());
                let v = _mm512_ternarylogic_epi64::<0x96>(
                    v,
                    _mm512_shuffle_epi8(t.0, lo),
                    _mm512_shuffle_epi8(t.1, hi),
                );
                _mm512_mask_storeu_epi8(q.cast(), mask, v);
            }
        }
        off += 64;
    }
}

/// The square of a step: two groups further along.
fn square(m: &WordMul) -> WordMul {
    let [a, b, c, d] = *m;
    [mul(a, a) ^ mul(b, c), mul(a, b) ^ mul(b, d), mul(c, a) ^ mul(d, c), mul(c, b) ^ mul(d, d)]
}

type StepTables = ((__m512i, __m512i), (__m512i, __m512i));

/// The diagonal (m00 on low halves, m11 on high) and cross (m01, m10) tables of a step.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn step_tables(m: &WordMul) -> StepTables {
    let [m00, m01, m10, m11] = *m;
    // SAFETY: the target features are enabled on this function.
    unsafe { (half_tables(m00, m11), half_tables(m01, m10)) }
}

/// acc * step ^ g, the whole 64-byte group in one register (low halves in the lower 256 bits,
/// high halves in the upper): diag * acc ^ cross * swap(acc) ^ g.
#[inline(always)]
unsafe fn step(acc: __m512i, (diag, cross): StepTables, g: __m512i) -> __m512i {
    let swapped = _mm512_shuffle_i64x2::<0x4E>(acc, acc);
    // SAFETY: called from functions with the target features enabled.
    unsafe {
        let (lo, hi) = split(acc);
        let (slo, shi) = split(swapped);
        _mm512_ternarylogic_epi64::<0x96>(mul_split(diag, lo, hi), mul_split(cross, slo, shi), g)
    }
}

/// Lines per component of the signature tables: Horner's step (4: its diagonal and cross
/// nibble tables), its square's four nibble-table pairs (8), and the fold's five steps (20).
const PREPARED: usize = 32;
const HORNER_LINES: usize = 12;

/// Fills lines 0..12 of a component's tables.
///
/// # Safety
/// `p` points at [`HORNER_LINES`] writable lines.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn prepare_horner(step: &WordMul, p: *mut __m512i) {
    let ((a, b), (c, d)) = step_tables(step);
    // SAFETY: the caller's contract: p points at HORNER_LINES writable, 64-byte-aligned lines.
    unsafe {
        for (i, r) in [a, b, c, d].into_iter().enumerate() {
            _mm512_store_si512(p.add(i), r);
        }
        for (i, x) in square(step).into_iter().enumerate() {
            let (lo, hi) = tables(x);
            _mm512_store_si512(p.add(4 + 2 * i), lo);
            _mm512_store_si512(p.add(5 + 2 * i), hi);
        }
    }
}

/// Fills lines 12..32 of a component's tables.
///
/// # Safety
/// `p` points at a component's [`PREPARED`] writable lines.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn prepare_fold(halves: &[WordMul; 5], p: *mut __m512i) {
    for (l, m) in halves.iter().enumerate() {
        let ((a, b), (c, d)) = step_tables(m);
        // SAFETY: the caller's contract; Lines are aligned to 64.
        unsafe {
            let q = p.add(HORNER_LINES + 4 * l);
            _mm512_store_si512(q, a);
            _mm512_store_si512(q.add(1), b);
            _mm512_store_si512(q.add(2), c);
            _mm512_store_si512(q.add(3), d);
        }
    }
}

/// The step tables at `p` (four lines).
///
/// # Safety
/// `p` points at four filled, aligned lines.
#[inline(always)]
unsafe fn step_at(p: *const __m512i) -> StepTables {
    // SAFETY: the caller's contract.
    unsafe {
        (
            (_mm512_load_si512(p), _mm512_load_si512(p.add(1))),
            (_mm512_load_si512(p.add(2)), _mm512_load_si512(p.add(3))),
        )
    }
}

/// The nibble-table pair at `p` (two lines).
#[inline(always)]
unsafe fn pair_at(p: *const __m512i) -> (__m512i, __m512i) {
    // SAFETY: the caller's contract.
    unsafe { (_mm512_load_si512(p), _mm512_load_si512(p.add(1))) }
}

/// A stack buffer for the tables of two components, filled only where read.
#[repr(C, align(64))]
struct Scratch(std::mem::MaybeUninit<[Line; 2 * PREPARED]>);

impl Scratch {
    fn new() -> Scratch {
        Scratch(std::mem::MaybeUninit::uninit())
    }

    fn ptr(&mut self) -> *mut __m512i {
        self.0.as_mut_ptr().cast()
    }
}

/// The five halvings of [`Engine::sig_fold`], `N` components side by side, with tables built
/// for the call.
///
/// # Safety
/// `accs`, `halves` and `out` hold N entries each; N <= 4.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn fold<const N: usize>(accs: &[Lanes], halves: &[[WordMul; 5]], out: &mut [u16]) {
    let mut buf = [Scratch::new(), Scratch::new()];
    let zero = _mm512_setzero_si512();
    let mut w = [zero; N];
    for c in 0..N {
        // SAFETY: component c's lines are inside the two buffers; a Lanes is 64 bytes.
        unsafe {
            prepare_fold(&halves[c], buf[c / 2].ptr().add((c % 2) * PREPARED));
            w[c] = _mm512_loadu_si512(accs[c].as_ptr().cast());
        }
    }
    let (a, b) = buf.split_at_mut(1);
    // SAFETY: lines 12..32 of each component were filled above.
    let r = unsafe { fold_core::<N>(w, [a[0].ptr(), b[0].ptr()]) };
    out[..N].copy_from_slice(&r);
}

/// The halvings on lane words in registers: the upper words of each half are moved down (a
/// 128-bit lane shuffle, then byte shifts within lanes, which move the low and the high halves
/// of the words alike) and multiplied into the lower ones with `step`. Component c's tables
/// are at `at[c / 2] + (c % 2) * PREPARED`.
///
/// # Safety
/// Those tables' fold lines are filled.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn fold_core<const N: usize>(mut w: [__m512i; N], at: [*const __m512i; 2]) -> [u16; N] {
    // SAFETY: c < N components, each with PREPARED lines from at[c / 2] (two per block), the fold tables 4 * l lines after HORNER_LINES with l < 5: inside the prepared block.
    let t = |c: usize, l: usize| unsafe { at[c / 2].add((c % 2) * PREPARED + HORNER_LINES + 4 * l) };
    // SAFETY (all below): the target features are enabled here.
    for (c, w) in w.iter_mut().enumerate() {
        // Words 16..32 (lanes 1 and 3) under words 0..16 (lanes 0 and 2).
        // SAFETY: t(c, 0) points at four filled, aligned lines (see `t`); the rest is register arithmetic.
        *w = unsafe { step(_mm512_shuffle_i64x2::<0b00_11_00_01>(*w, *w), step_at(t(c, 0)), *w) };
    }
    for (c, w) in w.iter_mut().enumerate() {
        // SAFETY: t(c, 1) points at four filled, aligned lines (see `t`).
        *w = unsafe { step(_mm512_bsrli_epi128::<8>(*w), step_at(t(c, 1)), *w) };
    }
    for (c, w) in w.iter_mut().enumerate() {
        // SAFETY: t(c, 2) points at four filled, aligned lines (see `t`).
        *w = unsafe { step(_mm512_bsrli_epi128::<4>(*w), step_at(t(c, 2)), *w) };
    }
    for (c, w) in w.iter_mut().enumerate() {
        // SAFETY: t(c, 3) points at four filled, aligned lines (see `t`).
        *w = unsafe { step(_mm512_bsrli_epi128::<2>(*w), step_at(t(c, 3)), *w) };
    }
    for (c, w) in w.iter_mut().enumerate() {
        // SAFETY: t(c, 4) points at four filled, aligned lines (see `t`).
        *w = unsafe { step(_mm512_bsrli_epi128::<1>(*w), step_at(t(c, 4)), *w) };
    }
    // Word 0: its low half is byte 0, its high half byte 32 (lane 2's first).
    let mut out = [0u16; N];
    for c in 0..N {
        let lo = _mm_cvtsi128_si32(_mm512_castsi512_si128(w[c])) as u8;
        let hi = _mm_cvtsi128_si32(_mm512_extracti32x4_epi32::<2>(w[c])) as u8;
        out[c] = lo as u16 | (hi as u16) << 8;
    }
    out
}

/// The tables of one component, as [`sign_prepared`] reads them.
///
/// # Safety
/// `lines` holds [`PREPARED`] lines.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn prepare(step: &WordMul, halves: &[WordMul; 5], lines: &mut [Line]) {
    assert!(lines.len() >= PREPARED);
    let p: *mut __m512i = lines.as_mut_ptr().cast();
    // SAFETY: PREPARED lines, aligned to 64.
    unsafe {
        prepare_horner(step, p);
        prepare_fold(halves, p);
    }
}

/// Horner then the fold, `N` components, with the tables [`prepare`] made: no table is built
/// and the lane words stay in registers between the two.
///
/// # Safety
/// `prep` holds N x [`PREPARED`] lines, `accs` and `out` N entries; `data` is whole groups.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn sign_prepared<const N: usize>(prep: &[Line], data: &[u8], accs: &[Lanes], out: &mut [u16]) {
    let p: *const __m512i = prep.as_ptr().cast();
    let zero = _mm512_setzero_si512();
    let mut even = [zero; N];
    for c in 0..N {
        // SAFETY: a Lanes is 64 bytes.
        even[c] = unsafe { _mm512_loadu_si512(accs[c].as_ptr().cast()) };
    }
    // SAFETY: the caller's contract: every component's lines are filled.
    unsafe {
        let w = horner_core::<N>(data, p, even);
        out[..N].copy_from_slice(&fold_core::<N>(w, [p, p.add(PREPARED)]));
    }
}

/// Horner over the groups, last to first, each component in two chains (even and odd
/// groups, stepping by step^2) that merge as even ^ odd * step at the end; tables built for
/// the call.
///
/// The two chains share registers in a transposed form: `l` holds the low halves of the even
/// chain's 32 words (lower 256 bits) and of the odd chain's (upper 256 bits), `h` the high
/// halves. A step is then four full-width constant multiplications with no lane crossing
/// (l' = m00 l ^ m01 h, h' = m10 l ^ m11 h), and the only cross-lane shuffles are the two
/// that transpose each pair of data groups, shared by every component.
///
/// # Safety
/// `data` is whole groups; `steps` and `accs` hold N <= 2 entries.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn horner<const N: usize>(data: &[u8], steps: &[WordMul], accs: &mut [Lanes]) {
    let mut buf = Scratch::new();
    let p = buf.ptr();
    let zero = _mm512_setzero_si512();
    let mut even = [zero; N];
    for c in 0..N {
        // SAFETY: component c's Horner lines are inside the buffer; a Lanes is 64 bytes.
        unsafe {
            prepare_horner(&steps[c], p.add(c * PREPARED));
            even[c] = _mm512_loadu_si512(accs[c].as_ptr().cast());
        }
    }
    // SAFETY: the Horner lines of every component were filled above.
    let acc = unsafe { horner_core::<N>(data, p, even) };
    for c in 0..N {
        // SAFETY: a Lanes is 64 bytes.
        unsafe { _mm512_storeu_si512(accs[c].as_mut_ptr().cast(), acc[c]) };
    }
}

/// Horner from `even` (the lane words so far) over `data`, component c's tables at
/// `p + c * PREPARED`: the new lane words.
///
/// # Safety
/// `data` is whole 64-byte groups; the Horner lines of N components are filled at `p`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn horner_core<const N: usize>(
    data: &[u8],
    p: *const __m512i,
    mut even: [__m512i; N],
) -> [__m512i; N] {
    // SAFETY: c < N components, each PREPARED lines from p: inside the prepared block.
    let t = |c: usize| unsafe { p.add(c * PREPARED) };
    let zero = _mm512_setzero_si512();
    // SAFETY: g is a 64-byte group (chunks_exact(64)): an unaligned load of exactly its bytes.
    let load = |g: &[u8]| unsafe { _mm512_loadu_si512(g.as_ptr().cast()) };
    let mut rest = data;
    if (data.len() / 64) % 2 == 1 {
        let (head, last) = data.split_at(data.len() - 64);
        let g = load(last);
        for (c, e) in even.iter_mut().enumerate() {
            // SAFETY: t(c) points at four filled, aligned lines (see `t`); `step` is register arithmetic.
            *e = unsafe { step(*e, step_at(t(c)), g) };
        }
        rest = head;
    }
    let mut l = [zero; N];
    let mut h = [zero; N];
    for c in 0..N {
        l[c] = _mm512_shuffle_i64x2::<0x44>(even[c], zero);
        h[c] = _mm512_shuffle_i64x2::<0xEE>(even[c], zero);
    }
    for pair in rest.chunks_exact(128).rev() {
        let (ge, go) = (load(&pair[..64]), load(&pair[64..]));
        let gl = _mm512_shuffle_i64x2::<0x44>(ge, go);
        let gh = _mm512_shuffle_i64x2::<0xEE>(ge, go);
        for c in 0..N {
            // SAFETY: the caller's contract; the target features are enabled.
            let ((t00, t01, t10, t11), ((llo, lhi), (hlo, hhi))) = unsafe {
                let q = t(c).add(4);
                (
                    (pair_at(q), pair_at(q.add(2)), pair_at(q.add(4)), pair_at(q.add(6))),
                    (split(l[c]), split(h[c])),
                )
            };
            let x = _mm512_ternarylogic_epi64::<0x96>(
                _mm512_shuffle_epi8(t00.0, llo),
                _mm512_shuffle_epi8(t00.1, lhi),
                _mm512_shuffle_epi8(t01.0, hlo),
            );
            let y = _mm512_ternarylogic_epi64::<0x96>(
                _mm512_shuffle_epi8(t10.0, llo),
                _mm512_shuffle_epi8(t10.1, lhi),
                _mm512_shuffle_epi8(t11.0, hlo),
            );
            l[c] = _mm512_ternarylogic_epi64::<0x96>(x, _mm512_shuffle_epi8(t01.1, hhi), gl);
            h[c] = _mm512_ternarylogic_epi64::<0x96>(y, _mm512_shuffle_epi8(t11.1, hhi), gh);
        }
    }
    for c in 0..N {
        let even = _mm512_shuffle_i64x2::<0x44>(l[c], h[c]);
        let odd = _mm512_shuffle_i64x2::<0xEE>(l[c], h[c]);
        // SAFETY: the caller's contract; the target features are enabled.
        l[c] = unsafe { step(odd, step_at(t(c)), even) };
    }
    l
}
