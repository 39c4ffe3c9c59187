//! Where a healing pool keeps its parity and signatures (docs/FORMAT.md section 9,
//! "Stripes"). The protected bytes are the pool header page and every run, read as pages of
//! [`PAGE`] bytes, numbered from the header page. Page `p` belongs to stripe `p % S` at index
//! `p / S` (S stripes of k pages): consecutive pages fall in different stripes, so damage to a
//! run of up to S pages, a large object's worth, costs each stripe at most one page. After the
//! last run come the m parity pages of every stripe (a stripe's side by side), then the
//! signature table: one 8-byte signature per data page, then one per parity page.

use crate::HeapError;

/// Bytes per protected page: the unit a signature covers and the parity rebuilds.
pub const PAGE: u64 = 4096;
/// Bytes per signature in the table.
pub const SIG: u64 = 8;
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
}

impl Geometry {
    /// The stripes over `pages` data pages from `base`, with parity from `parity_at`.
    pub fn new(shape: StripeShape, base: u64, pages: u64, parity_at: u64) -> Geometry {
        let stripes = pages.div_ceil(shape.k as u64);
        let sigs_at = parity_at + stripes * shape.m as u64 * PAGE;
        Geometry { shape, base, pages, stripes, parity_at, sigs_at }
    }

    /// Bytes after the data pages: parity pages and the signature table (whole pages).
    pub fn overhead(shape: StripeShape, pages: u64) -> u64 {
        let stripes = pages.div_ceil(shape.k as u64);
        let parity = stripes * shape.m as u64;
        parity * PAGE + ((pages + parity) * SIG).next_multiple_of(PAGE)
    }

    /// The first byte past the signature table.
    pub fn end(&self) -> u64 {
        self.sigs_at + (self.sig_count() * SIG).next_multiple_of(PAGE)
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
    fn every_page_has_one_place_and_the_areas_do_not_overlap() {
        for (k, m, pages) in [(8, 1, 65), (4, 2, 1), (3, 4, 130), (64, 0, 1000)] {
            let shape = StripeShape { k, m };
            let g = Geometry::new(shape, 8192, pages, 8192 + pages * PAGE);
            let mut seen = std::collections::BTreeSet::new();
            for p in 0..pages {
                let (s, i) = g.locate(p);
                assert!(s < g.stripes && i < k as usize);
                assert_eq!(g.member(s, i), Some(p));
                assert!(seen.insert((s, i)));
            }
            assert_eq!(g.end() - g.parity_at, Geometry::overhead(shape, pages));
            assert!(g.sigs_at >= g.parity_page(g.stripes - 1, m as usize));
            assert_eq!(g.page_of(g.limit()), None);
            assert_eq!(g.page_of(g.base + PAGE), (pages > 1).then_some(1));
        }
    }
}
