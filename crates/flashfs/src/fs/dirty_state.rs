//! The file system's side of an NVRAM write tier (the `bitmend-tier` crate implements it):
//! what goes into the tier before an operation returns, what a sync checks out, and how a
//! mount applies what a tier held after a crash (docs/DESIGN.md, "The NVRAM tier under
//! write-back").
//!
//! The tier holds the dirty state that is not yet on flash:
//! - every dirty page written by a `write` (or a truncate's cut), with its CRC;
//! - every metadata operation, as the nodes it puts in the page being filled, with their
//!   versions: an inode node holds the whole inode, a directory entry node the whole entry,
//!   so a node is a state, not a step, and applying it twice does no harm;
//! - the inode a write changed (its size and times), as an inode node of its own.
//!
//! Recovery applies a node only if its version is newer than the checkpoint the mount
//! replayed from and than what the flash holds for the same inode or entry (the rules replay
//! already follows), and a page only if its file still holds it (pages past the end are
//! dropped, the last page is cut at the size).

use std::ops::Range;
use std::sync::Arc;

use parking_lot::{ArcMutexGuard, Mutex, RawMutex};

use bitmend_media::nand::Nand;

use super::cache::DirtyPage;
use super::node::FRAG_HEADER;
use super::write::Out;
use super::{Fs, LOGICAL_PAGE};
pub use crate::error::DirtyStateError;
use crate::FsError;

/// Where a mount keeps its dirty state durable between flash syncs.
pub trait DirtyState: Send {
    /// Makes the dirty pages of one operation durable, each as [`PagePut`] says.
    fn put_pages(&mut self, pages: &[PagePut<'_>]) -> Result<(), DirtyStateError>;
    /// The dirty pages of `ino` in `pages` are gone (a truncate, a punch, an unlink).
    fn drop_pages(&mut self, ino: u64, pages: Range<u64>) -> Result<(), DirtyStateError>;
    /// The nodes of one metadata operation, as the page being filled holds them (fragment
    /// headers and payloads, back to back); durable on return.
    /// `request`: the FUSE request they are the effect of, recorded with them (so that a
    /// request come again after a crash is answered from the state, not done twice).
    fn put_nodes(&mut self, nodes: &[u8], request: Option<u64>) -> Result<(), DirtyStateError>;
    /// Requests whose effect the state holds, recorded after a checkout forgot their nodes.
    fn put_requests(&mut self, requests: &[u64]) -> Result<(), DirtyStateError>;
    /// Everything put so far is on flash: forget it.
    fn checkout(&mut self) -> Result<(), DirtyStateError>;
    /// How much the tier holds now.
    fn fill(&self) -> TierFill;
    /// Dirty page `index` of `ino` as the tier holds it, with its CRC, if it holds it and it
    /// verifies: what a page damaged in memory is healed from.
    fn page(&self, ino: u64, index: u64) -> Option<(Vec<u8>, u32)>;
}

/// How much an NVRAM tier holds: bytes of its record log in use and in all, and dirty pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierFill {
    pub log_used: u64,
    pub log_size: u64,
    pub pages: u64,
}

/// A dirty page to make durable: page `key` (ino, index) is `page`, whose CRC-32C is `crc`;
/// `changed` is the byte range that differs from the page last put (all of it, for a page
/// not put before).
#[derive(Clone, Debug)]
pub struct PagePut<'a> {
    pub key: (u64, u64),
    pub page: &'a [u8],
    pub crc: u32,
    pub changed: Range<usize>,
}

/// The tier behind a lock of its own. The file system's lock is always taken first: a write
/// takes this one under it and keeps it after letting that go ([`TierWrite`]), so that the
/// tier sees operations in the order the file system made them.
pub(crate) type SharedTier = Arc<Mutex<Box<dyn DirtyState>>>;

/// A write staged in the file system whose tier records are still to be made
/// ([`Fs::write_staged`]): its pages, then its inode's new size. It holds the tier's lock,
/// taken while the file system's lock was held, so every later tier operation waits for it;
/// the file system's lock is free meanwhile (write-back, reads and other requests go on).
#[must_use = "the write is not durable until `finish` puts it in the tier"]
pub struct TierWrite {
    tier: ArcMutexGuard<RawMutex, Box<dyn DirtyState>>,
    ino: u64,
    pages: Vec<StagedPage>,
    inode: Vec<u8>,
}

/// A page of a staged write: its bytes, where it changed and its CRC.
pub(crate) struct StagedPage {
    index: u64,
    bytes: StagedBytes,
    crc: u32,
    changed: Range<usize>,
}

pub(crate) enum StagedBytes {
    /// A whole page of the write's data, from this byte of it on: not copied again.
    Data(usize),
    /// A page the write changed in part, merged with what the file held (copied under the
    /// lock: at most the first and the last of a write).
    Merged(Vec<u8>),
}

impl TierWrite {
    /// Makes the write durable in the tier: its pages, then its inode. `data` is the data
    /// the write was staged with. [`DirtyStateError::Full`] asks for [`Fs::sync`] (under the
    /// file system's lock, taken again), which makes the write durable on flash instead.
    pub fn finish(mut self, data: &[u8]) -> Result<(), DirtyStateError> {
        let puts: Vec<PagePut<'_>> = self
            .pages
            .iter()
            .map(|p| PagePut {
                key: (self.ino, p.index),
                page: match &p.bytes {
                    StagedBytes::Data(from) => &data[*from..*from + LOGICAL_PAGE],
                    StagedBytes::Merged(bytes) => bytes,
                },
                crc: p.crc,
                changed: p.changed.clone(),
            })
            .collect();
        // Read side of `write_staged`'s pairing: whole pages carry the CRC of these bytes.
        debug_assert!(puts.iter().all(|p| bitmend_code::crc::crc32c(p.page) == p.crc));
        self.tier.put_pages(&puts)?;
        // The pages before the size: a crash between recovers the old size, the pages past
        // it dropped.
        if !self.inode.is_empty() {
            self.tier.put_nodes(&self.inode, None)?;
        }
        Ok(())
    }
}

/// The bytes of nodes as the page being filled holds them, each with its version.
pub(crate) fn node_bytes(nodes: &[(Out, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, version) in nodes {
        let at = out.len();
        out.resize(at + FRAG_HEADER, 0);
        n.whole_frag(*version).encode(&mut out[at..]);
        out.extend_from_slice(&n.payload);
    }
    out
}

impl<N: Nand> Fs<N> {
    /// Dirty page `key`, which failed its CRC, put right from the NVRAM tier's copy if the tier
    /// holds one that verifies and carries the same CRC (the same write made both; a write
    /// whose tier put is still to come leaves the older page there, and no heal). Whether it
    /// was; counted either way.
    pub(crate) fn heal_dirty(&mut self, key: (u64, u64)) -> bool {
        let Some(mut page) = self.wb.take(key) else { return false };
        let healed = self.heal_page(key, &mut page);
        self.wb.put(key, page);
        healed
    }

    /// [`Fs::heal_dirty`] for a dirty page taken out to be written back.
    pub(crate) fn heal_page(&mut self, key: (u64, u64), page: &mut DirtyPage) -> bool {
        let healed = heal_from(self.tier.as_ref(), key, page);
        self.cache.count_heal(healed);
        healed
    }

    /// Puts the mount's dirty state into `tier` from now on (fsync then returns once the tier
    /// holds the state). The next sync or checkpoint checks the tier out.
    pub fn attach_dirty_state(&mut self, tier: Box<dyn DirtyState>) {
        self.tier = Some(Arc::new(Mutex::new(tier)));
        self.tier_used = true;
    }

    /// Whether an NVRAM tier holds the dirty state.
    pub fn has_dirty_state(&self) -> bool {
        self.tier.is_some()
    }

    /// How full the NVRAM tier is, if there is one. Waits for a write putting its pages
    /// (the lock order is the file system's, then the tier's, as everywhere).
    pub fn tier_fill(&self) -> Option<TierFill> {
        Some(self.tier.as_ref()?.lock().fill())
    }

    /// Makes dirty page `key` durable in the tier, if there is one. A full tier is written
    /// back to flash with the page, and checked out.
    pub(crate) fn tier_page(
        &mut self,
        key: (u64, u64),
        page: &DirtyPage,
        changed: Range<usize>,
    ) -> Result<(), FsError> {
        let Some(t) = self.tier.as_ref() else { return Ok(()) };
        self.tier_used = true;
        let put = PagePut { key, page: &page.bytes, crc: page.crc, changed };
        let r = t.lock().put_pages(&[put]);
        if matches!(r, Err(DirtyStateError::Full)) {
            self.set_dirty(key, page.clone());
        }
        self.tier_outcome(r)
    }

    /// The pages of a write at `off` to `ino` that its tier records are to hold (none without
    /// a tier): `changed` are the indexes and bytes it changed, all dirty now; `whole` the
    /// CRCs of the pages it wrote whole, in order, whose bytes are the write's data. Taken
    /// before anything writes them back (a page merged in part is copied here).
    pub(crate) fn staged_pages(
        &mut self,
        (ino, off): (u64, u64),
        changed: &[(u64, Range<usize>)],
        whole: &[u32],
    ) -> Option<Vec<StagedPage>> {
        self.tier.as_ref()?;
        let mut whole = whole.iter();
        let wb = &self.wb;
        let pages = changed
            .iter()
            .map(|(index, range)| {
                let (bytes, crc) = if range.len() == LOGICAL_PAGE {
                    let from = (index * LOGICAL_PAGE as u64 - off) as usize;
                    (StagedBytes::Data(from), *whole.next().expect("a CRC for each whole page"))
                } else {
                    let p = wb.get((ino, *index)).expect("a page written in part is dirty");
                    (StagedBytes::Merged(p.bytes.clone()), p.crc)
                };
                StagedPage { index: *index, bytes, crc, changed: range.clone() }
            })
            .collect();
        Some(pages)
    }

    /// The tier records of a write to `ino` (its `pages`, then the inode as it is now: its
    /// new size and times), to be made by [`TierWrite::finish`] once the file system's lock
    /// is let go. Takes the tier's lock: so it must come last, after anything that may check
    /// the tier out.
    pub(crate) fn tier_write(&mut self, ino: u64, pages: Option<Vec<StagedPage>>) -> Option<TierWrite> {
        let pages = pages?;
        // Here, not at staging: a checkout in between (the flush's checkpoint) clears it, and
        // the tier is about to hold these pages.
        self.tier_used = true;
        let inode = self.inode_record(ino);
        let t = self.tier.as_ref()?;
        Some(TierWrite { tier: Mutex::lock_arc(t), ino, pages, inode })
    }

    /// A full tier is no error: everything goes to flash, which makes it just as durable.
    /// (After [`TierWrite::finish`], with the file system's lock taken again.)
    pub fn tier_outcome(&mut self, r: Result<(), DirtyStateError>) -> Result<(), FsError> {
        match r {
            Ok(()) => Ok(()),
            Err(DirtyStateError::Full) => self.sync(),
            Err(e @ DirtyStateError::Failed { .. }) => Err(FsError::Tier(e)),
        }
    }

    /// Drops the tier's dirty pages of `ino` in `pages` (after they left `wb.dirty`).
    pub(crate) fn tier_drop(&mut self, ino: u64, pages: Range<u64>) -> Result<(), FsError> {
        let Some(t) = self.tier.as_ref() else { return Ok(()) };
        let r = t.lock().drop_pages(ino, pages);
        self.tier_outcome(r)
    }

    /// Records an operation's nodes (already in the page being filled) in the tier. A full
    /// tier is written back to flash, and these nodes with it.
    pub(crate) fn tier_nodes(&mut self, bytes: &[u8]) -> Result<(), FsError> {
        let Some(t) = self.tier.as_ref() else { return Ok(()) };
        self.tier_used = true;
        let request = self.requests.current;
        let r = t.lock().put_nodes(bytes, request);
        if let (Some(u), Ok(())) = (request, &r) {
            self.requests.done(u);
        }
        self.tier_outcome(r)
    }

    /// The FUSE request the next operations serve (`None`: none, or one whose repetition
    /// does no harm). A request that changes the namespace is recorded with its nodes.
    pub fn set_request(&mut self, unique: Option<u64>) {
        self.requests.current = unique;
    }

    /// Requests a recovery found done, kept (and recorded after each checkout) for as long
    /// as they are among the recent ones.
    pub fn carry_requests(&mut self, done: &[u64]) {
        for &u in done {
            self.requests.done(u);
        }
    }

    /// Records inode `ino` as it is now (a write's new size and times, which reach the flash
    /// only at write-back) in the tier.
    pub(crate) fn tier_inode(&mut self, ino: u64) -> Result<(), FsError> {
        let bytes = self.inode_record(ino);
        if bytes.is_empty() {
            return Ok(());
        }
        self.tier_nodes(&bytes)
    }

    /// The tier record of inode `ino` as it is now, with a version of its own (empty without
    /// a tier, or if the inode is gone).
    fn inode_record(&mut self, ino: u64) -> Vec<u8> {
        if self.tier.is_none() || !self.ns.contains(ino) {
            return Vec::new();
        }
        let version = self.page.next_version();
        node_bytes(&[(self.inode_node(ino), version)])
    }

    /// Everything is on flash: the tier forgets what it held.
    pub(crate) fn tier_checkout(&mut self) -> Result<(), FsError> {
        let Some(t) = self.tier.as_ref().filter(|_| self.tier_used) else { return Ok(()) };
        // Waits for a write putting its pages: they were staged before this checkout's flush.
        t.lock().checkout()?;
        self.tier_used = false;
        // The requests just checked out may still be unanswered: a worker killed now is
        // replaced by one that must know them done. A tier too full for the record only
        // loses that knowledge (such a request is then done again), never state.
        if !self.requests.recent.is_empty() {
            let recent: Vec<u64> = self.requests.recent.iter().copied().collect();
            match t.lock().put_requests(&recent) {
                Ok(()) | Err(DirtyStateError::Full) => {}
                Err(e) => return Err(FsError::Tier(e)),
            }
        }
        Ok(())
    }
}

/// The FUSE requests a mount under a supervisor serves: the one being served, and the last
/// [`Requests::KEPT`] recorded as done (more than can be in flight: one per request thread).
#[derive(Default)]
pub(crate) struct Requests {
    pub(crate) current: Option<u64>,
    pub(crate) recent: std::collections::VecDeque<u64>,
}

impl Requests {
    const KEPT: usize = 256;

    fn done(&mut self, unique: u64) {
        if self.recent.back() == Some(&unique) {
            return;
        }
        if self.recent.len() == Self::KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(unique);
    }
}

/// Puts dirty page `key` right from the NVRAM tier's copy, if `tier` holds one that verifies
/// and carries the page's CRC (the same write made both). Under the file system's lock the
/// tier's put of the last write is done (a write holds the tier's lock until it is), so a
/// copy that differs is damaged too, and nothing is healed.
fn heal_from(tier: Option<&SharedTier>, key: (u64, u64), page: &mut DirtyPage) -> bool {
    let Some((bytes, crc)) = tier.and_then(|t| t.lock().page(key.0, key.1)) else { return false };
    if crc != page.crc || bytes.len() != LOGICAL_PAGE {
        return false;
    }
    page.bytes.copy_from_slice(&bytes);
    // Read side of `put_pages`' pairing: the tier verified these bytes against this CRC.
    debug_assert!(page.sound());
    true
}
