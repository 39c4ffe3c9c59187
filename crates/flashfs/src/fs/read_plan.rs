//! Reads without the file system's lock (docs/DESIGN.md, "Reads without the lock").
//!
//! A read is planned under the lock: pages that are dirty, cached, holes, or not simply on
//! flash are copied then; for every other page the plan keeps where the index says it is
//! (its fragments, its version, its CRC). The flash pages are then read without the lock,
//! through the chip's [`DataReader`], and each logical page is decoded and checked against
//! the CRC the index holds. Between the plan and the read the cleaner may have moved a page
//! and erased its block, or the log may have programmed the block anew: the check fails,
//! and that page is read again under the lock ([`Fs::finish_read`]), verified and repaired
//! as every read was before. So a read never returns bytes the index did not name for it,
//! and holds the lock only for its plan: reads do not wait for each other's flash reads and
//! checks, nor does write-back wait for them. The plan itself still waits for whatever holds
//! the lock (a write-back step, at most about half a millisecond).

use bitmend_media::nand::{DataReader, Nand};

use super::ops::{checked_node, page_pieces};
use super::{Fs, Ino, Loc, LOGICAL_PAGE, PENDING};
use crate::FsError;

/// Flash pages one read of the image covers at most (a 1 MiB read on 2 KiB pages is about
/// 530), and the run of pages not needed that a read covers rather than making two.
const MAX_RUN_PAGES: u32 = 1024;
const MAX_GAP_PAGES: u32 = 4;

/// A logical page of a read, to be read from flash without the lock.
struct Planned {
    /// Where its bytes go in the read, and which of its bytes.
    at: usize,
    within: usize,
    len: usize,
    index: u64,
    loc: Loc,
}

/// A read planned under the lock ([`Fs::plan_read`]), read from flash without it
/// ([`ReadPlan::read_unlocked`]), and finished under it again for the pages whose check
/// failed ([`Fs::finish_read`]).
pub struct ReadPlan {
    ino: u64,
    out: Vec<u8>,
    flash: Vec<Planned>,
    /// Pages read and checked without the lock, kept for the daemon's cache when asked
    /// (`keep_checked`): (index, bytes, version, CRC).
    checked: Vec<(u64, Vec<u8>, u64, u32)>,
    keep_checked: bool,
}

impl ReadPlan {
    /// Logical pages still to be read from flash.
    pub fn pending(&self) -> usize {
        self.flash.len()
    }

    /// Keeps the pages [`read_unlocked`](Self::read_unlocked) checks, for
    /// [`Fs::cache_checked`] (a mount whose kernel keeps no copy: `--direct-io`).
    pub fn keep_checked(&mut self) {
        self.keep_checked = true;
    }

    /// The read's bytes, once no page is left to read from flash.
    pub fn into_bytes(self) -> Result<Vec<u8>, ReadPlan> {
        if self.flash.is_empty() {
            Ok(self.out)
        } else {
            Err(self)
        }
    }

    /// Reads the planned pages through `reader`, a run of flash pages per call, and checks
    /// each logical page against its CRC; a page that fails (or whose flash could not be
    /// read) stays planned, for [`Fs::finish_read`].
    pub fn read_unlocked(&mut self, reader: &DataReader) {
        let ps = reader.page_size();
        let mut scratch = Vec::new();
        let mut fetched: Vec<(u32, Vec<u8>)> = Vec::new();
        for (first, count) in runs(&self.flash) {
            let mut buf = Vec::new();
            if reader.read_data(first, count, &mut buf, &mut scratch).is_ok() {
                fetched.push((first, buf));
            }
        }
        let flash_page = |page: u32| -> Option<&[u8]> {
            let i = fetched.partition_point(|(f, _)| *f <= page).checked_sub(1)?;
            let (first, buf) = &fetched[i];
            let k = (page - first) as usize;
            buf.get(k * ps..(k + 1) * ps)
        };
        // The node decoded last: the pages of a node compressed together are decoded once.
        let mut last: Option<((u64, u64), Vec<u8>)> = None;
        let mut payload = Vec::with_capacity(LOGICAL_PAGE + 64);
        let mut failed = Vec::new();
        for p in std::mem::take(&mut self.flash) {
            let Some(first) = p.index.checked_sub(p.loc.slot as u64) else {
                failed.push(p);
                continue;
            };
            let node = (first, p.loc.version);
            // Decoded for this page, the node was checked against this page's CRC already; a
            // node decoded for an earlier page is checked against this one's here.
            let fresh = last.as_ref().is_none_or(|l| l.0 != node);
            if fresh {
                last = payload_of(&p.loc, &flash_page, &mut payload)
                    .and_then(|()| checked_node(&payload, &p.loc))
                    .map(|pages| (node, pages));
            }
            let slot = p.loc.slot as usize * LOGICAL_PAGE;
            let page = last.as_ref().and_then(|l| l.1.get(slot..slot + LOGICAL_PAGE));
            match page.filter(|pg| fresh || Some(bitmend_code::crc::crc32c(pg)) == p.loc.crc) {
                Some(page) => {
                    self.out[p.at..p.at + p.len].copy_from_slice(&page[p.within..p.within + p.len]);
                    if self.keep_checked {
                        let crc = p.loc.crc.expect("planned with a CRC");
                        self.checked.push((p.index, page.to_vec(), p.loc.version, crc));
                    }
                }
                None => failed.push(p),
            }
        }
        self.flash = failed;
    }
}

/// The payload of the node `loc` names, from the flash pages fetched; None if a fragment is
/// not among them or lies outside its page (a damaged index: the locked path reports it).
fn payload_of<'a>(
    loc: &Loc,
    flash_page: &impl Fn(u32) -> Option<&'a [u8]>,
    payload: &mut Vec<u8>,
) -> Option<()> {
    payload.clear();
    for &(page, off, len) in &loc.frags {
        let bytes = flash_page(page)?.get(off as usize..off as usize + len as usize)?;
        payload.extend_from_slice(bytes);
    }
    Some(())
}

/// The runs of flash pages the planned pages lie on: (first, count), ascending, each at most
/// [`MAX_RUN_PAGES`], gaps of up to [`MAX_GAP_PAGES`] read over.
fn runs(planned: &[Planned]) -> Vec<(u32, u32)> {
    let mut pages: Vec<u32> = planned.iter().flat_map(|p| p.loc.frags.iter().map(|f| f.0)).collect();
    pages.sort_unstable();
    pages.dedup();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for page in pages {
        match runs.last_mut() {
            Some((first, count))
                if page - (*first + *count) <= MAX_GAP_PAGES && page - *first < MAX_RUN_PAGES =>
            {
                *count = page - *first + 1;
            }
            _ => runs.push((page, 1)),
        }
    }
    runs
}

/// Whether a page at `loc` can be read without the lock: it is on programmed flash pages,
/// and the index holds the CRC to check it against.
fn on_flash_with_crc(loc: &Loc) -> bool {
    loc.crc.is_some() && !loc.frags.is_empty() && loc.frags.iter().all(|f| f.0 != PENDING)
}

impl<N: Nand> Fs<N> {
    /// A reader of the chip's pages for reads without the lock, if the chip offers one.
    pub fn data_reader(&self) -> Option<DataReader> {
        self.store.nand().data_reader()
    }

    /// Plans a read of up to `len` bytes at `off` (fewer at the end of the file), as
    /// [`read`](Self::read) would return them: every page not simply on flash is copied now,
    /// the others are left for [`ReadPlan::read_unlocked`].
    pub fn plan_read(&mut self, ino: Ino, off: u64, len: usize) -> Result<ReadPlan, FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        let span = self.read_span(ino, off, len)?;
        let mut plan = ReadPlan {
            ino,
            out: Vec::with_capacity((span.end - span.start) as usize),
            flash: Vec::new(),
            checked: Vec::new(),
            keep_checked: false,
        };
        for (index, within, n) in page_pieces(span) {
            let on_flash = if self.cached((ino, index)) {
                None
            } else {
                self.loc(ino, index)?.filter(on_flash_with_crc)
            };
            match on_flash {
                Some(loc) => {
                    plan.flash.push(Planned { at: plan.out.len(), within, len: n, index, loc });
                    plan.out.resize(plan.out.len() + n, 0);
                    self.stats.reads_unlocked += 1;
                }
                None => {
                    let page = self.page(ino, index)?;
                    plan.out.extend_from_slice(&page[within..within + n]);
                }
            }
        }
        Ok(plan)
    }

    /// Finishes `plan` under the lock: the pages whose check failed without it are read as
    /// [`read`](Self::read) reads them (verified against their signatures, repaired from
    /// parity, rewritten elsewhere if they had to be).
    pub fn finish_read(&mut self, mut plan: ReadPlan) -> Result<Vec<u8>, FsError> {
        for p in std::mem::take(&mut plan.flash) {
            self.stats.reads_relocked += 1;
            let page = self.page(plan.ino, p.index)?;
            plan.out[p.at..p.at + p.len].copy_from_slice(&page[p.within..p.within + p.len]);
        }
        Ok(plan.out)
    }

    /// Puts the pages `plan` read and checked without the lock into the cache: those whose
    /// place in the index is still the one they were read from (a page written since keeps
    /// its newer copy; one whose index chunk left RAM since is not cached).
    pub fn cache_checked(&mut self, plan: &mut ReadPlan) {
        for (index, bytes, version, crc) in std::mem::take(&mut plan.checked) {
            let key = (plan.ino, index);
            if !self.cached(key) && self.index.loaded_version(key) == Some(version) {
                self.cache.insert(key, &bytes, crc);
            }
        }
    }
}
