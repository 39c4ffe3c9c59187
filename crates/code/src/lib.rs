//! # bitmend-code
//!
//! The coding core of bitmend, with no I/O and no dependency on the rest of the system:
//!
//! - [`gf`]: GF(2^8) (polynomial 0x11D, generator 2) and its engines (scalar, SSSE3, AVX2,
//!   GFNI), chosen at run time by CPU features.
//! - [`rs`]: systematic Reed–Solomon erasure codes with ISA-L's Cauchy matrix: encode,
//!   reconstruct any pattern of up to m erasures, and update parity for a changed sub-range.
//! - [`sig`]: algebraic signatures over GF(2^16) built as a tower over GF(2^8), so they commute
//!   with the Reed–Solomon parity and detect any change of up to n bytes in chunks of up to
//!   128 KiB.
//! - [`crc`]: CRC-32C with hardware kernels, `combine`, and the partial-overwrite update.

pub mod crc;
pub mod gf;
pub mod le;
pub mod rs;
pub mod sig;
pub mod testdata;
