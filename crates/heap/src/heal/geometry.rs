//! Where a healing pool keeps its parity and signatures (docs/FORMAT.md section 9,
//! "Stripes"). The protected bytes are the pool header page and every run, read as pages of
//! [`PAGE`] bytes, numbered from the header page. Page `p` belongs to stripe `p % S` at index
//! `p / S` (S stripes of k pages): consecutive pages fall in different stripes, so damage to a
//! run of up to S pages, a large object's worth, costs each stripe at most one page. After the
//! last run come the m parity pages of every stripe (a stripe's side by side), then the
//! signature table: one 8-byte signature per data page, then one per parity page; then the
//! line checks: a 4-byte CRC-32C of every 64-byte line of the data pages, which a store
//! checks the bytes it overwrites against (see `heal/mod.rs`).

use crate::HeapError;

/// Bytes per protected page: the unit a signature covers and the parity rebuilds.
pub const PAGE: u64 = 4096;
/// Bytes per signature in the table.
pub const SIG: u64 = 8;
/// Bytes per line check.
pub const CHECK: u64 = 4;
/// Bytes a line check covers.
pub const LINE: u64 = 64;
/// The CRC-32C of a zero line: a line's check is its CRC XOR this, so that the checks of a
/// fresh (zero) pool are zero and its file stays sparse.
pub const ZERO_LINE_CRC: u32 = 0x03C8_EB67;
/// The most data pages per stripe.
pub const MAX_K: u8 = 64;
/// The most parity pages per stripe.
pub const MAX_M: u8 = 4;

/// A stripe's shape, chosen when the pool is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeShape {
    /// Data pages per stripe.
    pub k: u8,
    /// Parity pages per stripe (0: signatures only, damage is detected, not repaired).
    pub m: u8,
}

impl Default for StripeShape {
    /// Eight data pages and one parity page: an eighth more space, one bad page per stripe
    /// rebuilt.
    fn default() -> Self {
        StripeShape { k: 8, m: 1 }
    }
}

impl StripeShape {
    pub fn check(self) -> Result<StripeShape, HeapError> {
        if self.k == 0 || self.k > MAX_K || self.m > MAX_M {
            return Err(HeapError::BadShape { k: self.k, m: self.m });
        }
        Ok(self)
    }
}

/// The stripes of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub shape: StripeShape,
    /// The first protected byte (the pool header page).
    pub base: u64,
    /// Protected data pages.
    pub pages: u64,
    /// Stripes: `pages` divided by k, rounded up.
    pub stripes: u64,
    /// The first parity page.
    pub parity_at: u64,
    /// The signature table.
    pub sigs_at: u64,
    /// The line checks; `None` in a version 5 pool, which has none.
    pub checks_at: Option<u64>,
}

impl Geometry {
    /// The stripes over `pages` data pages from `base`, with parity from `parity_at`, and
    /// line checks after the signatures if `line_checks`.
    pub fn new(shape: StripeShape, base: u64, pages: u64, parity_at: u64, line_checks: bool) -> Geometry {
        let stripes = pages.div_ceil(shape.k as u64);
        let sigs_at = parity_at + stripes * shape.m as u64 * PAGE;
        let parity = stripes * shape.m as u64;
        let checks_at = line_checks.then(|| sigs_at + ((pages + parity) * SIG).next_multiple_of(PAGE));
        Geometry { shape, base, pages, stripes, parity_at, sigs_at, checks_at }
    }

    /// Bytes after the data pages of a pool made by this build: parity pages, the signature
    /// table and the line checks (each whole pages).
    pub fn overhead(shape: StripeShape, pages: u64) -> u64 {
        let stripes = pages.div_ceil(shape.k as u64);
        let parity = stripes * shape.m as u64;
        parity * PAGE + ((pages + parity) * SIG).next_multiple_of(PAGE) + Self::checks_len(pages)
    }

    fn checks_len(pages: u64) -> u64 {
        (pages * (PAGE / LINE) * CHECK).next_multiple_of(PAGE)
    }

    /// The first byte past the line checks (past the signature table without them).
    pub fn end(&self) -> u64 {
        match self.checks_at {
            Some(at) => at + Self::checks_len(self.pages),
            None => self.sigs_at + (self.sig_count() * SIG).next_multiple_of(PAGE),
        }
    }

    /// Where the check of the line holding protected byte `at` is, if the pool has them.
    pub fn check_at(&self, at: u64) -> Option<u64> {
        debug_assert!(self.page_of(at).is_some(), "a protected byte");
        Some(self.checks_at? + (at - self.base) / LINE * CHECK)
    }

    /// Signatures in the table: data pages, then parity pages.
    pub fn sig_count(&self) -> u64 {
        self.pages + self.stripes * self.shape.m as u64
    }

    /// The protected data bytes: `[base, limit)`.
    pub fn limit(&self) -> u64 {
        self.base + self.pages * PAGE
    }

    /// The data page holding byte `at`, if it is protected.
    pub fn page_of(&self, at: u64) -> Option<u64> {
        (at >= self.base && at < self.limit()).then(|| (at - self.base) / PAGE)
    }

    /// Where data page `p` starts.
    pub fn page_at(&self, p: u64) -> u64 {
        self.base + p * PAGE
    }

    /// (stripe, index in the stripe) of data page `p`.
    pub fn locate(&self, p: u64) -> (u64, usize) {
        (p % self.stripes, (p / self.stripes) as usize)
    }

    /// The data page at `index` of `stripe`; `None` past the last page (the last row of
    /// stripes may be short: its missing pages count as zeros).
    pub fn member(&self, stripe: u64, index: usize) -> Option<u64> {
        let p = index as u64 * self.stripes + stripe;
        (p < self.pages).then_some(p)
    }

    /// Where parity page `j` of `stripe` starts.
    pub fn parity_page(&self, stripe: u64, j: usize) -> u64 {
        self.parity_at + (stripe * self.shape.m as u64 + j as u64) * PAGE
    }

    /// The table index of parity page `j` of `stripe`.
    pub fn parity_sig(&self, stripe: u64, j: usize) -> u64 {
        self.pages + stripe * self.shape.m as u64 + j as u64
    }

    /// Where signature `n` of the table is.
    pub fn sig_at(&self, n: u64) -> u64 {
        self.sigs_at + n * SIG
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zero_line_crc_is_the_crc_of_a_zero_line() {
        assert_eq!(bitmend_code::crc::crc32c(&[0u8; LINE as usize]), ZERO_LINE_CRC);
    }

    #[test]
    fn every_page_has_one_place_and_the_areas_do_not_overlap() {
        for (k, m, pages) in [(8, 1, 65), (4, 2, 1), (3, 4, 130), (64, 0, 1000)] {
            let shape = StripeShape { k, m };
            let g = Geometry::new(shape, 8192, pages, 8192 + pages * PAGE, true);
            let mut seen = std::collections::BTreeSet::new();
            for p in 0..pages {
                let (s, i) = g.locate(p);
                assert!(s < g.stripes && i < k as usize);
                assert_eq!(g.member(s, i), Some(p));
                assert!(seen.insert((s, i)));
            }
            assert_eq!(g.end() - g.parity_at, Geometry::overhead(shape, pages));
            assert!(g.sigs_at >= g.parity_page(g.stripes - 1, m as usize));
            let checks = g.checks_at.expect("line checks");
            assert!(checks >= g.sig_at(g.sig_count()));
            assert_eq!(g.check_at(g.limit() - 1), Some(checks + (pages * 64 - 1) * CHECK));
            let old = Geometry::new(shape, 8192, pages, 8192 + pages * PAGE, false);
            assert_eq!(old.end(), checks);
            assert_eq!(g.page_of(g.limit()), None);
            assert_eq!(g.page_of(g.base + PAGE), (pages > 1).then_some(1));
        }
    }
}
