//! Checking pages against their signatures, rebuilding up to m bad pages of a stripe from the
//! others, and PRIMS's two scrub passes: a cheap one over the signature table alone (every
//! parity page's signature must be its row applied to the data pages' signatures) and a full
//! one that signs every page.

use bitmend_code::sig::Sig64;
use bitmend_media::pmem::{Region, RegionError};

use super::{page_bytes, Healed, LINE, PAGE};

/// What a check of one stripe found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StripeCheck {
    /// Data pages whose bytes failed their signature.
    pub bad_pages: Vec<u64>,
    /// Parity pages (by index in the stripe) that failed theirs.
    pub bad_parity: Vec<usize>,
    /// Signature table entries found wrong and rewritten from their page (the page agreed
    /// with the rest of its stripe).
    pub sigs_rewritten: u32,
    /// Line checks found wrong on good pages and rewritten.
    pub checks_rewritten: u32,
    /// Whether every bad page was rebuilt.
    pub repaired: bool,
}

impl<R: Region> Healed<R> {
    /// Whether data page `p` matches its signature (and is not known to be beyond repair).
    pub(crate) fn page_matches(&mut self, p: u64) -> bool {
        let s = self.shield.as_mut().expect("protected");
        s.stats.pages_checked += 1;
        s.signer.sign(page_bytes(&self.inner, &s.geo, p)) == s.sigs[p as usize]
    }

    /// Whether data page `p` matches its signature, counting nothing (a read's check).
    pub(crate) fn page_sound(&self, p: u64) -> bool {
        let s = self.shield.as_ref().expect("protected");
        s.signer.sign(page_bytes(&self.inner, &s.geo, p)) == s.sigs[p as usize]
    }

    /// The stripes whose parity signatures disagree with their data signatures: the cheap
    /// pass, which reads the table only (in DRAM).
    pub(crate) fn cheap_pass(&self, range: std::ops::Range<u64>) -> Vec<u64> {
        let s = self.shield.as_ref().expect("protected");
        let Some(codec) = &s.codec else {
            return Vec::new();
        };
        let (k, m) = (s.geo.shape.k as usize, s.geo.shape.m as usize);
        let mut bad = Vec::new();
        let mut sigs = vec![Sig64::ZERO; k];
        for stripe in range {
            for (i, sig) in sigs.iter_mut().enumerate() {
                *sig = s.geo.member(stripe, i).map_or(Sig64::ZERO, |p| s.sigs[p as usize]);
            }
            let agrees = (0..m).all(|j| {
                Sig64::combine(codec.parity_row(j), &sigs) == s.sigs[s.geo.parity_sig(stripe, j) as usize]
            });
            if !agrees {
                bad.push(stripe);
            }
        }
        bad
    }

    /// Signs every page of `stripe` and its parity; rebuilds up to m bad ones from the rest
    /// and writes them back, fenced. Beyond m, or with no parity, nothing is written.
    pub(crate) fn check_stripe(&mut self, stripe: u64) -> Result<StripeCheck, RegionError> {
        self.check_stripe_and(stripe, true)
    }

    /// [`Healed::check_stripe`]; with `repair` false nothing is written, and `repaired`
    /// says whether the damage found could be rebuilt.
    pub(crate) fn check_stripe_and(&mut self, stripe: u64, repair: bool) -> Result<StripeCheck, RegionError> {
        let s = self.shield.as_mut().expect("protected");
        let (k, m) = (s.geo.shape.k as usize, s.geo.shape.m as usize);
        let mut check = StripeCheck::default();
        let mut erased = Vec::new();
        for i in 0..k {
            if let Some(p) = s.geo.member(stripe, i) {
                s.stats.pages_checked += 1;
                if s.signer.sign(page_bytes(&self.inner, &s.geo, p)) != s.sigs[p as usize] {
                    check.bad_pages.push(p);
                    erased.push(i);
                }
            }
        }
        for j in 0..m {
            let at = s.geo.parity_page(stripe, j) as usize;
            s.stats.pages_checked += 1;
            let sig = s.signer.sign(&self.inner.bytes()[at..at + PAGE as usize]);
            if sig != s.sigs[s.geo.parity_sig(stripe, j) as usize] {
                check.bad_parity.push(j);
                erased.push(k + j);
            }
        }
        if erased.is_empty() {
            check.repaired = true;
            if repair {
                check.checks_rewritten = self.rewrite_checks(stripe)?;
            }
            return Ok(check);
        }
        let Some(codec) = &s.codec else {
            return Ok(check);
        };
        if erased.len() > m {
            return Ok(check);
        }
        if !repair {
            check.repaired = true;
            return Ok(check);
        }
        let mut chunks: Vec<Vec<u8>> = (0..k + m)
            .map(|c| {
                let at = match c {
                    c if c < k => s.geo.member(stripe, c).map(|p| s.geo.page_at(p)),
                    c => Some(s.geo.parity_page(stripe, c - k)),
                };
                at.map_or(vec![0u8; PAGE as usize], |at| {
                    self.inner.bytes()[at as usize..(at + PAGE) as usize].to_vec()
                })
            })
            .collect();
        {
            let mut refs: Vec<&mut [u8]> = chunks.iter_mut().map(|c| c.as_mut_slice()).collect();
            codec.reconstruct(&mut refs, &erased).expect("at most m erasures of equal chunks");
        }
        // Each rebuilt page must match its signature; one that comes back unchanged means its
        // bytes agree with the stripe and the table entry is what was damaged.
        let mut writes = Vec::new();
        for &c in &erased {
            let (at, n) = match c {
                c if c < k => {
                    let p = s.geo.member(stripe, c).expect("a member");
                    (s.geo.page_at(p), p)
                }
                c => (s.geo.parity_page(stripe, c - k), s.geo.parity_sig(stripe, c - k)),
            };
            let sig = s.signer.sign(&chunks[c]);
            let unchanged = self.inner.bytes()[at as usize..(at + PAGE) as usize] == chunks[c][..];
            if sig == s.sigs[n as usize] {
                writes.push((at, c));
            } else if unchanged {
                s.set_sig(&mut self.inner, n, sig)?;
                check.sigs_rewritten += 1;
            } else {
                return Ok(check);
            }
        }
        for (at, c) in writes {
            self.inner.write(at as usize, &chunks[c])?;
            self.inner.flush(at as usize, PAGE as usize)?;
            s.stats.pages_repaired += 1;
        }
        check.checks_rewritten = self.rewrite_checks(stripe)?;
        let s = self.shield.as_mut().expect("protected");
        s.flush_pending(&mut self.inner)?;
        self.inner.fence()?;
        check.repaired = true;
        Ok(check)
    }

    /// Rewrites the line checks of `stripe`'s data pages (all matching their signatures)
    /// that disagree with their lines; how many.
    fn rewrite_checks(&mut self, stripe: u64) -> Result<u32, RegionError> {
        let s = self.shield.as_mut().expect("protected");
        let mut rewritten = 0;
        for i in 0..s.geo.shape.k as usize {
            let Some(p) = s.geo.member(stripe, i) else { continue };
            let at = s.geo.page_at(p) as usize;
            for line in (at..at + PAGE as usize).step_by(LINE as usize) {
                if !s.lines_match(self.inner.bytes(), line, line + LINE as usize) {
                    s.set_checks(&mut self.inner, line, line + LINE as usize)?;
                    rewritten += 1;
                }
            }
        }
        Ok(rewritten)
    }
}
