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
    /// Pages rebuilt from the others (or, checking only, that would be).
    pub rebuilt: u32,
    /// Whether every bad page was rebuilt.
    pub repaired: bool,
    /// Every page matched its signature but the stripe does not agree with its parity, and
    /// the bad page could not be found (m below 2, or more than one bad): none is trusted.
    pub inconsistent: bool,
}

/// What a stripe check found to do.
enum Plan {
    /// Nothing bad.
    Sound,
    /// The pages agree with the parity: only these chunks' table entries are wrong.
    Entries(Vec<usize>),
    /// These chunks rebuilt (in the chunks given); true if a parity chunk left over vouches
    /// for them, so that one not matching its entry is still taken.
    Rebuild(Vec<usize>, bool),
    /// Beyond the code's reach.
    Lost,
}

impl<R: Region> Healed<R> {
    /// Whether data page `p` matches its signature (and is not known to be beyond repair).
    pub(crate) fn page_matches(&mut self, p: u64) -> bool {
        let s = self.shield.as_mut().expect("protected");
        s.stats.pages_checked += 1;
        s.signer.sign(page_bytes(&self.inner, &s.geo, p)) == s.sigs[p as usize]
    }

    /// Whether every line of data page `p` matches its check (true without line checks).
    pub(crate) fn lines_sound(&self, p: u64) -> bool {
        let s = self.shield.as_ref().expect("protected");
        let at = s.geo.page_at(p) as usize;
        s.lines_match(self.inner.bytes(), at, at + PAGE as usize)
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
    ///
    /// The signatures say which pages are bad, and the code checks the signatures: a stripe
    /// whose pages agree with its parity is sound, whatever its table entries say (a lost
    /// table page makes every entry in it wrong); a page rebuilt from the others that does
    /// not match its entry is taken when a parity page left over (fewer bad than m) agrees
    /// with it (the page and its entry were both lost); and a stripe whose pages all match
    /// their entries but not their parity has, with m of 2 or more, its one bad page found
    /// by trying each in turn (a page and its entry damaged alike: zeroed, say).
    pub(crate) fn check_stripe_and(&mut self, stripe: u64, repair: bool) -> Result<StripeCheck, RegionError> {
        let (mut check, erased) = self.sign_stripe(stripe);
        let s = self.shield.as_ref().expect("protected");
        let m = s.geo.shape.m as usize;
        if m == 0 {
            check.repaired = erased.is_empty();
            if check.repaired {
                check.checks_rewritten = self.rewrite_checks(stripe, repair, &[])?;
            }
            return Ok(check);
        }
        let mut chunks = self.stripe_chunks(stripe);
        let plan = if erased.is_empty() {
            if self.consistent(&chunks) {
                Plan::Sound
            } else {
                self.locate_one(&mut chunks).map_or(Plan::Lost, |c| Plan::Rebuild(vec![c], true))
            }
        } else if erased.len() > m {
            if self.consistent(&chunks) {
                Plan::Entries(erased)
            } else {
                Plan::Lost
            }
        } else {
            let codec = self.shield.as_ref().expect("protected").codec.as_ref().expect("m > 0");
            let mut refs: Vec<&mut [u8]> = chunks.iter_mut().map(|c| c.as_mut_slice()).collect();
            codec.reconstruct(&mut refs, &erased).expect("at most m erasures of equal chunks");
            // A parity page left over checks what the others rebuilt.
            let confirmed = erased.len() < m && self.consistent(&chunks);
            Plan::Rebuild(erased, confirmed)
        };
        self.carry_out(stripe, plan, &chunks, repair, &mut check)?;
        if check.repaired {
            check.sigs_rewritten += self.table_entries_lost(stripe, repair)?;
        }
        Ok(check)
    }

    /// The stripe's entries in the medium's signature table that differ from the table in
    /// DRAM (which the pages were just checked against): a table page damaged while the
    /// pool is open would otherwise be found only at the next open. Rewritten if `repair`;
    /// how many.
    fn table_entries_lost(&mut self, stripe: u64, repair: bool) -> Result<u32, RegionError> {
        let n = {
            let s = self.shield.as_ref().expect("protected");
            (s.geo.shape.k + s.geo.shape.m) as usize
        };
        let mut lost = 0;
        for c in 0..n {
            let Some((_, e)) = self.chunk_at(stripe, c) else { continue };
            let s = self.shield.as_mut().expect("protected");
            let at = s.geo.sig_at(e) as usize;
            let sig = s.sigs[e as usize];
            if bitmend_code::le::get_u64(self.inner.bytes(), at) != sig.to_u64() {
                lost += 1;
                if repair {
                    s.set_sig(&mut self.inner, e, sig)?;
                }
            }
        }
        if lost > 0 && repair {
            let s = self.shield.as_mut().expect("protected");
            s.flush_pending(&mut self.inner)?;
            self.inner.fence()?;
        }
        Ok(lost)
    }

    /// Signs the stripe's data and parity pages: which failed (data pages by number, parity
    /// by index), and the failed ones as chunk indices (data 0..k, parity k..k+m).
    fn sign_stripe(&mut self, stripe: u64) -> (StripeCheck, Vec<usize>) {
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
        (check, erased)
    }

    /// Chunk `c` of `stripe`: where it is and its signature's index (`None` for a member
    /// past the last page, a zero page).
    fn chunk_at(&self, stripe: u64, c: usize) -> Option<(u64, u64)> {
        let s = self.shield.as_ref().expect("protected");
        let k = s.geo.shape.k as usize;
        if c < k {
            s.geo.member(stripe, c).map(|p| (s.geo.page_at(p), p))
        } else {
            Some((s.geo.parity_page(stripe, c - k), s.geo.parity_sig(stripe, c - k)))
        }
    }

    /// The stripe's k + m chunks as the medium holds them.
    fn stripe_chunks(&self, stripe: u64) -> Vec<Vec<u8>> {
        let s = self.shield.as_ref().expect("protected");
        let n = (s.geo.shape.k + s.geo.shape.m) as usize;
        (0..n)
            .map(|c| {
                self.chunk_at(stripe, c).map_or(vec![0u8; PAGE as usize], |(at, _)| {
                    self.inner.bytes()[at as usize..(at + PAGE) as usize].to_vec()
                })
            })
            .collect()
    }

    /// Whether the parity chunks are the code of the data chunks.
    fn consistent(&self, chunks: &[Vec<u8>]) -> bool {
        let s = self.shield.as_ref().expect("protected");
        let codec = s.codec.as_ref().expect("m > 0");
        let k = s.geo.shape.k as usize;
        let data: Vec<&[u8]> = chunks[..k].iter().map(|c| c.as_slice()).collect();
        let mut parity = vec![vec![0u8; PAGE as usize]; chunks.len() - k];
        let mut refs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        codec.encode(&data, &mut refs).expect("chunks of one length");
        parity.iter().zip(&chunks[k..]).all(|(a, b)| a == b)
    }

    /// With m of 2 or more: the one chunk which, rebuilt from the others, makes the stripe
    /// consistent (`chunks` then holds it rebuilt). `None` if no chunk or more than one does.
    fn locate_one(&self, chunks: &mut [Vec<u8>]) -> Option<usize> {
        let s = self.shield.as_ref().expect("protected");
        let codec = s.codec.as_ref().expect("m > 0");
        if s.geo.shape.m < 2 {
            return None;
        }
        let mut found = None;
        for c in 0..chunks.len() {
            let mut trial = chunks.to_vec();
            let mut refs: Vec<&mut [u8]> = trial.iter_mut().map(|t| t.as_mut_slice()).collect();
            codec.reconstruct(&mut refs, &[c]).expect("one erasure");
            if trial[c] != chunks[c] && self.consistent(&trial) {
                if found.is_some() {
                    return None;
                }
                found = Some((c, trial.swap_remove(c)));
            }
        }
        found.map(|(c, bytes)| {
            chunks[c] = bytes;
            c
        })
    }

    /// Does what `plan` says (with `repair` false, only says whether it could).
    fn carry_out(
        &mut self,
        stripe: u64,
        plan: Plan,
        chunks: &[Vec<u8>],
        repair: bool,
        check: &mut StripeCheck,
    ) -> Result<(), RegionError> {
        let (entries, pages) = match plan {
            Plan::Lost => {
                if check.bad_pages.is_empty() && check.bad_parity.is_empty() {
                    // No page can be told from the others: none is vouched for.
                    check.inconsistent = true;
                    let s = self.shield.as_ref().expect("protected");
                    check.bad_pages =
                        (0..s.geo.shape.k as usize).filter_map(|i| s.geo.member(stripe, i)).collect();
                }
                return Ok(());
            }
            Plan::Sound => (Vec::new(), Vec::new()),
            Plan::Entries(erased) => (erased, Vec::new()),
            Plan::Rebuild(erased, confirmed) => {
                let mut entries = Vec::new();
                let mut pages = Vec::new();
                for c in erased {
                    let (at, n) = self.chunk_at(stripe, c).expect("a chunk that was signed");
                    let s = self.shield.as_ref().expect("protected");
                    let sig = s.signer.sign(&chunks[c]);
                    let unchanged = self.inner.bytes()[at as usize..(at + PAGE) as usize] == chunks[c][..];
                    if unchanged {
                        entries.push(c);
                    } else if sig == s.sigs[n as usize] || confirmed {
                        pages.push(c);
                    } else {
                        return Ok(());
                    }
                }
                self.note_found(stripe, &pages, check);
                (entries, pages)
            }
        };
        check.repaired = true;
        check.rebuilt = pages.len() as u32;
        if !repair || (entries.is_empty() && pages.is_empty()) {
            check.sigs_rewritten = entries.len() as u32;
            // Checking only: the lines of pages a scrub would rebuild are not counted (they
            // come back with their checks).
            check.checks_rewritten = self.rewrite_checks(stripe, repair, &pages)?;
            return Ok(());
        }
        for &c in entries.iter().chain(&pages) {
            let (at, n) = self.chunk_at(stripe, c).expect("a chunk that was signed");
            let s = self.shield.as_mut().expect("protected");
            let sig = s.signer.sign(&chunks[c]);
            if pages.contains(&c) {
                self.inner.write(at as usize, &chunks[c])?;
                self.inner.flush(at as usize, PAGE as usize)?;
                s.stats.pages_repaired += 1;
            } else {
                check.sigs_rewritten += 1;
            }
            if s.sigs[n as usize] != sig {
                s.set_sig(&mut self.inner, n, sig)?;
            }
        }
        check.checks_rewritten = self.rewrite_checks(stripe, true, &[])?;
        let s = self.shield.as_mut().expect("protected");
        s.flush_pending(&mut self.inner)?;
        self.inner.fence()?;
        Ok(())
    }

    /// Pages found bad by the code, not by their signatures (their entries were damaged
    /// alike): reported as the signature-found ones are.
    fn note_found(&self, stripe: u64, pages: &[usize], check: &mut StripeCheck) {
        let s = self.shield.as_ref().expect("protected");
        let k = s.geo.shape.k as usize;
        for &c in pages {
            if c < k {
                let p = s.geo.member(stripe, c).expect("a member");
                if !check.bad_pages.contains(&p) {
                    check.bad_pages.push(p);
                }
            } else if !check.bad_parity.contains(&(c - k)) {
                check.bad_parity.push(c - k);
            }
        }
    }

    /// Rewrites the line checks of `stripe`'s data pages (all matching their signatures)
    /// that disagree with their lines (with `write` false, only counts them), but those of
    /// the members in `skip`; how many.
    fn rewrite_checks(&mut self, stripe: u64, write: bool, skip: &[usize]) -> Result<u32, RegionError> {
        let s = self.shield.as_mut().expect("protected");
        let mut rewritten = 0;
        for i in (0..s.geo.shape.k as usize).filter(|i| !skip.contains(i)) {
            let Some(p) = s.geo.member(stripe, i) else { continue };
            let at = s.geo.page_at(p) as usize;
            for line in (at..at + PAGE as usize).step_by(LINE as usize) {
                if !s.lines_match(self.inner.bytes(), line, line + LINE as usize) {
                    if write {
                        s.set_checks(&mut self.inner, line, line + LINE as usize)?;
                    }
                    rewritten += 1;
                }
            }
        }
        Ok(rewritten)
    }
}
