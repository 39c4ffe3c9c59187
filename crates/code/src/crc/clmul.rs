//! The carry-less multiply reduced by `crc32`: a * b * x^33 mod P in two instructions, the
//! step both the three-stream kernel and the shifts of a CRC by a length are built on.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;
use std::sync::OnceLock;

/// SSE4.2 (`crc32`) and PCLMULQDQ are both present.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| is_x86_feature_detected!("sse4.2") && is_x86_feature_detected!("pclmulqdq"))
}

/// a * b * x^33 mod P (reflected): a 32x32 carry-less product, reduced by the `crc32`
/// instruction, which multiplies its 64-bit input by x^32 mod P.
///
/// # Safety
/// The CPU must have SSE4.2 and PCLMULQDQ ([`available`]).
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub unsafe fn mul_x33(a: u32, b: u32) -> u32 {
    let p = _mm_clmulepi64_si128::<0>(_mm_cvtsi32_si128(a as i32), _mm_cvtsi32_si128(b as i32));
    _mm_crc32_u64(0, _mm_cvtsi128_si64(p) as u64) as u32
}
