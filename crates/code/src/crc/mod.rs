//! CRC-32C (Castagnoli), as in iSCSI, ext4 and the Loris page cache.
//!
//! - [`crc32c`] / [`crc32c_append`]: on x86_64 with SSE4.2 and PCLMULQDQ, three interleaved
//!   `crc32` streams merged by carry-less multiplication (`kernel`); with VPCLMULQDQ and
//!   AVX-512, folding (`fold`), from 16 KiB on with three `crc32` streams run inside the
//!   folding loop, and for a 4 KiB page a kernel of its own that does the same (`page`);
//!   elsewhere the `crc32c` crate.
//! - [`Shift`]: the operator "append `len` zero bytes" (multiplication by x^(8 len) mod P),
//!   built in O(1) table steps and applied in a few nanoseconds; [`combine`] uses it.
//! - [`update`]: the CRC of a page after a sub-range changed, from the old CRC and the old and
//!   new bytes of that range only (Loris section V-C).

mod clmul;
mod fold;
mod kernel;
mod page;
mod shift;

pub use shift::Shift;

/// From this length on, the folding kernel beats three `crc32` streams (measured).
const FOLD_MIN: usize = 256;

/// CRC-32C of `data` (initial value and final XOR 0xFFFFFFFF, reflected).
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// Continues `crc` (a finished CRC-32C of earlier bytes) over `data`.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    !raw(!crc, data)
}

/// The CRC register after feeding `data` into state `state`, without the initial and final
/// inversions: linear in the data, which `update` relies on.
#[inline]
pub fn raw(state: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() == page::PAGE && fold::available() {
        // SAFETY: `available` checked VPCLMULQDQ, AVX-512F, SSE4.2 (and so PCLMULQDQ).
        return unsafe { page::raw(state, data) };
    }
    #[cfg(target_arch = "x86_64")]
    if data.len() >= fold::HYBRID_MIN && fold::available() {
        // SAFETY: `available` checked VPCLMULQDQ, AVX-512F and SSE4.2.
        return unsafe { fold::raw_hybrid(state, data) };
    }
    #[cfg(target_arch = "x86_64")]
    if data.len() >= FOLD_MIN && fold::available() {
        // SAFETY: `available` checked VPCLMULQDQ, AVX-512F and SSE4.2.
        let (state, done) = unsafe { fold::raw(state, data) };
        if done == data.len() {
            return state;
        }
        // SAFETY: the same CPU has SSE4.2 and PCLMULQDQ.
        return unsafe { kernel::raw(state, &data[done..]) };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel::available() {
        // SAFETY: `available` checked SSE4.2 and PCLMULQDQ.
        return unsafe { kernel::raw(state, data) };
    }
    portable_raw(state, data)
}

/// The implementations of [`raw`], for tests and benches that compare them.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// VPCLMULQDQ folding for the bulk, then the three-stream kernel.
    Fold,
    /// Three interleaved `crc32` streams.
    ThreeWay,
    /// The `crc32c` crate.
    Portable,
}

/// Bytes of a line for [`crc32c_lines`].
pub const LINE: usize = 64;

/// The CRC-32C of each whole 64-byte line of `data`: `out[i]` is [`crc32c`] of line i. The
/// heap checks a line at a time; its lines come in runs, which a kernel takes several at once.
///
/// # Panics
/// If `data` is not whole lines or `out` has fewer entries than lines.
pub fn crc32c_lines(data: &[u8], out: &mut [u32]) {
    assert!(data.len().is_multiple_of(LINE) && out.len() >= data.len() / LINE, "whole lines, a CRC for each");
    #[cfg(target_arch = "x86_64")]
    if kernel::available() {
        // SAFETY: `available` checked SSE4.2; the shapes were checked above.
        return unsafe { kernel::lines(data, out) };
    }
    portable_lines(data, out);
}

/// [`crc32c_lines`] a line at a time on the portable path: what the kernel is checked against.
pub fn portable_lines(data: &[u8], out: &mut [u32]) {
    for (line, o) in data.chunks_exact(LINE).zip(out.iter_mut()) {
        *o = !portable_raw(!0, line);
    }
}

/// The paths this CPU can run.
pub fn paths() -> Vec<Path> {
    let mut v = vec![Path::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        if kernel::available() {
            v.push(Path::ThreeWay);
        }
        if kernel::available() && fold::available() {
            v.push(Path::Fold);
        }
    }
    v
}

/// [`raw`] on a chosen path; `None` if this CPU cannot run it.
pub fn raw_on(path: Path, state: u32, data: &[u8]) -> Option<u32> {
    if !paths().contains(&path) {
        return None;
    }
    Some(match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `paths` checked the features of each kernel.
        Path::Fold if data.len() == page::PAGE => unsafe { page::raw(state, data) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Path::Fold if data.len() >= fold::HYBRID_MIN => unsafe { fold::raw_hybrid(state, data) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Path::Fold if data.len() >= 256 => unsafe {
            let (state, done) = fold::raw(state, data);
            kernel::raw(state, &data[done..])
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Path::Fold | Path::ThreeWay => unsafe { kernel::raw(state, data) },
        _ => portable_raw(state, data),
    })
}

/// The portable path: the `crc32c` crate (its own tables or instructions).
pub fn portable_raw(state: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!state, data)
}

/// The CRC-32C of A followed by B, from crc(A), crc(B) and B's length.
pub fn combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    Shift::new(len_b).apply(crc_a) ^ crc_b
}

/// The CRC-32C of a `page_len`-byte page after bytes [off, off + old.len()) changed from `old`
/// to `new`, given its CRC before. Reads only the changed range: CRC is affine, so the change
/// in CRC is the raw CRC of (old ^ new) shifted past the bytes that follow it.
pub fn update(crc: u32, page_len: usize, off: usize, old: &[u8], new: &[u8]) -> u32 {
    assert_eq!(old.len(), new.len(), "old and new ranges differ in length");
    let end = off + old.len();
    assert!(end <= page_len, "range {off}..{end} outside a {page_len}-byte page");
    let mut delta = [0u8; 256];
    let mut state = 0u32;
    for (o, n) in old.chunks(delta.len()).zip(new.chunks(delta.len())) {
        for ((d, a), b) in delta.iter_mut().zip(o).zip(n) {
            *d = a ^ b;
        }
        state = raw(state, &delta[..o.len()]);
    }
    crc ^ Shift::new((page_len - end) as u64).apply(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // RFC 3720 B.4 and the common check value.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        assert_eq!(crc32c(&[]), 0);
    }
}
