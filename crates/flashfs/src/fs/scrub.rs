//! Scrubbing: every written page of every segment checked against its signature, data pages
//! repaired from parity and the logical pages on them rewritten elsewhere, and every segment
//! with a damaged page emptied (its data rewritten under fresh parity) and erased. A pass goes one segment per step, so that a mounted file system can
//! interleave it with requests (the FUSE daemon's scrubber thread takes the file system's
//! lock for one step at a time) and the cleaner can run between steps.

use std::collections::HashSet;

use bitmend_media::nand::Nand;

use super::Fs;
use crate::store::mount::PageHealth;
use crate::store::{Repaired, SigCheck};
use crate::Corruption;
use crate::FsError;

/// What a scrub pass has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub segments_total: u64,
    pub segments_done: u64,
    pub pages_checked: u64,
    pub repaired_by_group: u64,
    pub repaired_by_segment: u64,
    /// Data pages beyond repair (their file ranges read as EIO).
    pub unreadable_pages: u64,
    /// Parity and pad pages that no longer match their signatures.
    pub parity_damaged: u64,
    /// Pages of sealed segments without a spare that decodes, named by no group, whose bytes
    /// differ from what their stripe says was programmed there (a spare and a parity page
    /// lost together, or a page that reads erased): their segment is healed.
    pub unsigned_damaged: u64,
    /// Logical pages rewritten away from repaired flash pages.
    pub logical_pages_relocated: u64,
    /// Segments with a damaged page whose data was moved under fresh parity and which were
    /// erased.
    pub segments_healed: u64,
    /// Damaged segments whose data could not be shown moved whole: left as they were.
    pub segments_refused: u64,
    /// Superblock copies found damaged (re-read at the end of the pass), and rewritten.
    pub superblocks_damaged: u64,
    pub superblocks_rewritten: u64,
    pub done: bool,
}

/// A scrub pass in progress: the segments still to check, oldest first.
#[derive(Debug)]
pub struct ScrubPass {
    todo: Vec<u64>,
    repaired: HashSet<u32>,
    /// Physical segments with a damaged page (data, parity or pad).
    damaged: Vec<u32>,
    report: ScrubReport,
}

/// What the quick pass found: the signature check of every segment in use, and what was done
/// about the segments whose parity disagreed with their data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuickScrubReport {
    pub segments_checked: u64,
    /// The checks of all segments, added up.
    pub signatures: SigCheck,
    /// Physical segments whose parity disagreed with their data's signatures.
    pub segments_mismatched: Vec<u32>,
    /// Of those, segments whose data was moved under fresh parity and which were erased.
    pub segments_healed: u64,
}

impl ScrubPass {
    pub fn report(&self) -> ScrubReport {
        self.report
    }
}

impl<N: Nand> Fs<N> {
    /// Starts a pass over the segments in use now (segments opened later are younger than
    /// the pass and written with fresh parity).
    pub fn scrub_begin(&self) -> ScrubPass {
        let mut todo: Vec<u64> = self.store.used_segments().iter().map(|u| u.logical).collect();
        todo.reverse(); // popped from the end: oldest first
        let report = ScrubReport { segments_total: todo.len() as u64, ..ScrubReport::default() };
        ScrubPass { todo, repaired: HashSet::new(), damaged: Vec::new(), report }
    }

    /// Checks the next segment of `pass`; after the last, rewrites the logical pages that sat
    /// on repaired flash pages and syncs. Returns whether the pass is complete.
    pub fn scrub_step(&mut self, pass: &mut ScrubPass) -> Result<bool, FsError> {
        if pass.report.done {
            return Ok(true);
        }
        if let Some(logical) = pass.todo.pop() {
            let mut buf = vec![0u8; self.page.size()];
            let pages = self.store.scrub_segment_pages(logical)?;
            self.scrubbed.1 += pages.len() as u64;
            let mut damaged = Vec::new();
            for (addr, health) in pages {
                let r = &mut pass.report;
                r.pages_checked += 1;
                match health {
                    PageHealth::Sound => {}
                    PageHealth::Damaged => {
                        r.parity_damaged += 1;
                        damaged.push(addr);
                    }
                    PageHealth::Data => match self.store.read(addr, &mut buf) {
                        Ok(Repaired::No) => {}
                        Ok(how) => {
                            if how == Repaired::ByGroup {
                                r.repaired_by_group += 1;
                            } else {
                                r.repaired_by_segment += 1;
                            }
                            pass.repaired.insert(addr.0);
                            damaged.push(addr);
                        }
                        Err(FsError::Corrupt(Corruption::Unrecoverable { .. })) => r.unreadable_pages += 1,
                        // No spare or group says what the page is: a torn program (nothing
                        // acknowledged there) holds what its stripe says was programmed; a
                        // damaged page does not.
                        Err(FsError::Corrupt(Corruption::NotWritten { .. })) => {
                            if self.store.matches_stripe(addr)? == Some(false) {
                                r.unsigned_damaged += 1;
                                damaged.push(addr);
                            }
                        }
                        Err(e) => return Err(e),
                    },
                }
            }
            // A segment with a damaged page, even one repaired, has less redundancy left for
            // its other pages (the damaged page counts against its group and its stripe).
            for addr in damaged {
                if let Some(phys) = self.store.segment_of(addr) {
                    if !pass.damaged.contains(&phys) {
                        pass.damaged.push(phys);
                    }
                }
            }
            pass.report.segments_done += 1;
            return Ok(false);
        }
        // The rereads that relocate repaired pages repair them again, and so do the reads
        // of the segments being healed (to find their live data): not new damage.
        let counted = self.store.stats;
        self.relocate(&pass.repaired, &mut pass.report)?;
        // A damaged page cannot be rewritten in place (a NAND page is programmed once per
        // erase): the segment's data moves and the segment is erased.
        let refused = self.stats.segments_refused;
        pass.report.segments_healed = self.heal_segments(&pass.damaged)?;
        pass.report.segments_refused = self.stats.segments_refused - refused;
        self.store.stats.repaired_by_group = counted.repaired_by_group;
        self.store.stats.repaired_by_segment = counted.repaired_by_segment;
        self.sync()?;
        pass.report.superblocks_damaged = self.store.check_superblocks()?.len() as u64;
        pass.report.superblocks_rewritten = self.rewrite_damaged_superblocks()? as u64;
        self.scrubbed.0 += 1;
        pass.report.done = true;
        Ok(true)
    }

    /// Rewrites the damaged superblock copies (see `PageStore::rewrite_superblocks`), with
    /// the anchor of the newest checkpoint; none before the file system has an anchored one.
    pub(crate) fn rewrite_damaged_superblocks(&mut self) -> Result<u32, FsError> {
        if self.store.damaged_superblocks().is_empty() {
            return Ok(0);
        }
        match self.cp.newest().filter(|_| self.store.anchored()) {
            Some(c) => self.store.rewrite_superblocks(crate::PageAddr(c.page)),
            None => Ok(0),
        }
    }

    /// Rereads every logical page with a fragment on a repaired flash page; the read repairs
    /// it again and queues it for rewriting (see `page`).
    fn relocate(&mut self, repaired: &HashSet<u32>, report: &mut ScrubReport) -> Result<(), FsError> {
        if repaired.is_empty() {
            return Ok(());
        }
        let pages: Vec<u32> = repaired.iter().copied().collect();
        let keys = self.live_keys_on(&pages)?;
        for (ino, index) in keys {
            let before = self.stats.relocated;
            match self.page(ino, index) {
                Ok(_) => report.logical_pages_relocated += self.stats.relocated - before,
                // The page went bad again between the two reads: counted where it is read.
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. })) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The quick pass (`bitmend scrub --quick`): every segment's parity checked against its
    /// data from the signatures in the spares, reading no data area. A segment whose parity
    /// disagrees cannot be corrected in place (a NAND page is programmed once per erase): its
    /// live data moves under fresh parity and the segment is erased, as the full pass does
    /// with a damaged page. Pages whose spare does not decode are left to the full pass.
    pub fn scrub_quick(&mut self) -> Result<QuickScrubReport, FsError> {
        let mut r = QuickScrubReport::default();
        for phys in self.store.used_segments().into_iter().map(|u| u.physical) {
            let c = self.store.check_signatures(phys)?;
            r.segments_checked += 1;
            if c.mismatched() {
                r.segments_mismatched.push(phys);
            }
            r.signatures.absorb(c);
        }
        if !r.segments_mismatched.is_empty() {
            r.segments_healed = self.heal_segments(&r.segments_mismatched)?;
            self.sync()?;
        }
        Ok(r)
    }

    /// Runs a whole pass.
    pub fn scrub(&mut self) -> Result<ScrubReport, FsError> {
        let mut pass = self.scrub_begin();
        while !self.scrub_step(&mut pass)? {}
        Ok(pass.report())
    }
}
