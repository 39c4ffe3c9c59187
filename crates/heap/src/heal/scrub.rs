//! The pool's face of the protection: checking the pages a read covers, and scrubbing.

use bitmend_media::pmem::Region;

use crate::pool::Pool;
use crate::HeapError;

/// Which scrub pass to run (PRIMS section 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrubPass {
    /// The signature table alone: each stripe's parity signatures against its data
    /// signatures; a stripe that disagrees is then checked in full.
    Cheap,
    /// Every page signed from its bytes.
    Full,
}

/// What a scrub found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub stripes_checked: u64,
    /// Stripes the cheap pass found inconsistent.
    pub cheap_mismatches: u64,
    /// Data and parity pages that failed their signature.
    pub bad_pages: u64,
    /// Pages rebuilt from their stripe.
    pub pages_repaired: u64,
    /// Signature table entries rewritten from pages that agreed with their stripe.
    pub sigs_rewritten: u64,
    /// Line checks rewritten from good pages (their table lines were damaged).
    pub checks_rewritten: u64,
    /// Data pages that could not be rebuilt (more bad pages in their stripe than parity).
    pub beyond_repair: Vec<u64>,
    /// Every data page found bad, rebuilt or not.
    pub damaged: Vec<u64>,
}

impl ScrubReport {
    /// Adds what another scrub (a step of the same one) found and did.
    pub fn absorb(&mut self, r: ScrubReport) {
        self.stripes_checked += r.stripes_checked;
        self.cheap_mismatches += r.cheap_mismatches;
        self.bad_pages += r.bad_pages;
        self.pages_repaired += r.pages_repaired;
        self.sigs_rewritten += r.sigs_rewritten;
        self.checks_rewritten += r.checks_rewritten;
        self.beyond_repair.extend(r.beyond_repair);
        self.damaged.extend(r.damaged);
    }
}

impl<R: Region> Pool<R> {
    /// Whether this pool keeps signatures and parity over its pages (version 5).
    pub fn heals(&self) -> bool {
        self.log.region().shield.is_some()
    }

    /// Scrubs every stripe (see [`ScrubPass`]); rebuilds what it can. Nothing for a pool
    /// without stripes.
    pub fn scrub(&mut self, pass: ScrubPass) -> Result<ScrubReport, HeapError> {
        self.scrub_and(pass, true)
    }

    /// A scrub that only looks: the report says what [`Pool::scrub`] would rebuild
    /// (`pages_repaired` counts pages that could be; no byte is written).
    pub fn check_damage(&mut self, pass: ScrubPass) -> Result<ScrubReport, HeapError> {
        self.scrub_and(pass, false)
    }

    fn scrub_and(&mut self, pass: ScrubPass, repair: bool) -> Result<ScrubReport, HeapError> {
        let stripes = self.log.region().shield.as_ref().map_or(0, |s| s.geo.stripes);
        self.scrub_range(0..stripes, pass, repair)
    }

    /// Stripes in the pool (0 without).
    pub fn stripes(&self) -> u64 {
        self.log.region().shield.as_ref().map_or(0, |s| s.geo.stripes)
    }

    /// Scrubs the stripes in `range` (clamped to the pool's): a step of a scrub, for a
    /// scrubber that keeps the pool only a moment at a time ([`super::Scrubber`]).
    pub fn scrub_stripes(
        &mut self,
        range: std::ops::Range<u64>,
        pass: ScrubPass,
    ) -> Result<ScrubReport, HeapError> {
        self.scrub_range(range, pass, true)
    }

    fn scrub_range(
        &mut self,
        range: std::ops::Range<u64>,
        pass: ScrubPass,
        repair: bool,
    ) -> Result<ScrubReport, HeapError> {
        let mut report = ScrubReport::default();
        let Some(shield) = self.log.region().shield.as_ref() else {
            return Ok(report);
        };
        let range = range.start.min(shield.geo.stripes)..range.end.min(shield.geo.stripes);
        let stripes: Vec<u64> = match pass {
            ScrubPass::Full => range.collect(),
            ScrubPass::Cheap => {
                let bad = self.log.region().cheap_pass(range);
                report.cheap_mismatches = bad.len() as u64;
                bad
            }
        };
        for stripe in stripes {
            let check = self.log.region_mut().check_stripe_and(stripe, repair)?;
            report.stripes_checked += 1;
            report.damaged.extend(&check.bad_pages);
            report.bad_pages += (check.bad_pages.len() + check.bad_parity.len()) as u64;
            report.sigs_rewritten += check.sigs_rewritten as u64;
            report.checks_rewritten += check.checks_rewritten as u64;
            if check.repaired {
                report.pages_repaired += u64::from(check.rebuilt);
            } else {
                report.beyond_repair.extend(&check.bad_pages);
            }
        }
        Ok(report)
    }

    /// Checks the pages under `[at, at + len)` against their signatures, rebuilding a bad
    /// one's stripe; an error names the pages that could not be rebuilt (their bytes are
    /// never returned).
    pub fn verify(&mut self, at: u64, len: u64) -> Result<(), HeapError> {
        let Some(shield) = self.log.region().shield.as_ref() else {
            return Ok(());
        };
        let geo = shield.geo;
        let (Some(first), Some(last)) = (geo.page_of(at), geo.page_of(at + len.max(1) - 1)) else {
            return Ok(());
        };
        let mut beyond = Vec::new();
        for p in first..=last {
            // A page whose lines fail their checks though it matches its signature is
            // checked with its stripe too: the page may have been damaged together with its
            // entry (zeroed, both), which only the parity tells from a damaged check table.
            if self.log.region_mut().page_matches(p) && self.log.region().lines_sound(p) {
                continue;
            }
            let (stripe, _) = geo.locate(p);
            let check = self.log.region_mut().check_stripe(stripe)?;
            if !check.repaired {
                beyond.push(p);
            }
        }
        if beyond.is_empty() {
            Ok(())
        } else {
            Err(HeapError::Damaged { at, len, pages: beyond })
        }
    }

    /// The protected pages' offsets: where page `p` starts, for tests and tools.
    pub fn page_offset(&self, p: u64) -> Option<u64> {
        let geo = self.log.region().shield.as_ref()?.geo;
        (p < geo.pages).then(|| geo.page_at(p))
    }

    /// The stripes' layout, if the pool has any.
    pub fn geometry(&self) -> Option<super::Geometry> {
        self.log.region().shield.as_ref().map(|s| s.geo)
    }

    /// The protection's counters.
    pub fn heal_stats(&self) -> super::HealStats {
        self.log.region().stats()
    }

    /// Flushes each parity and signature line as it is stored instead of once before the
    /// fence (the bench's rows without cache line counters).
    pub fn set_eager_flush(&mut self, eager: bool) {
        if let Some(s) = self.log.region_mut().shield.as_mut() {
            s.eager = eager;
        }
    }
}
