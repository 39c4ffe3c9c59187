//! The tier itself: slots in the heap, records in the log (see the crate docs).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use bitmend_code::crc::crc32c;
use bitmend_code::le::{self, Put};
use bitmend_heap::{Pool, PoolOptions, Ptr};
use bitmend_media::pmem::Region;
use bitmend_nvlog::{LogConfig, NvLog};

pub use bitmend_flashfs::PagePut;

use crate::record::{Entry, TAG};
use crate::TierError;

/// Bytes of a logical page.
pub const PAGE: usize = 4096;
/// Bytes of a slot: the page, then a trailer: crc u32, zero u32, ino u64, index u64.
pub const SLOT: usize = PAGE + TRAILER;
const TRAILER: usize = 24;

/// A change smaller than this is data-logged in place; a larger one goes to a new slot
/// (MinL2R: undo the bytes a change overwrites, or log a pointer when it changes most).
const IN_PLACE_MAX: usize = PAGE / 2;

/// New slots allocated and filled in one heap transaction (a write of up to 128 KiB in
/// one): the journal records each allocation, not the bytes written into it.
const NEW_SLOTS_PER_TX: usize = 32;

/// A page recovered from the region: verified against its CRC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredPage {
    pub ino: u64,
    pub index: u64,
    pub bytes: Vec<u8>,
    pub crc: u32,
}

/// What [`DirtyTier::open`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Every page a record names whose slot verified, in (ino, index) order.
    pub pages: Vec<RecoveredPage>,
    /// Pages a record names whose slot did not verify: (ino, index). Never applied.
    pub unverified: Vec<(u64, u64)>,
    /// Records read, and records that were not the tier's (refused).
    pub records: usize,
    pub foreign_records: usize,
    /// Chunks of the dirty state store damaged beyond its code's repair: (segment, chunk).
    /// The pages named before them are in `unverified`; pages named only in them are unknown.
    pub lost_chunks: Vec<(u64, usize)>,
    /// The file system's metadata records since the last checkout, oldest first, up to the
    /// first lost chunk.
    pub nodes: Vec<Vec<u8>>,
    /// Metadata records after a lost chunk: never handed over (the lost records before them
    /// may be the operations they build on).
    pub withheld_nodes: usize,
    /// The file system the state belongs to, as the last owner record says (none: a tier
    /// made without one, or one holding nothing).
    pub owner: Option<u64>,
}

/// Counts since the tier was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Pages put: changed in place (data-logged), or into a new slot (a record each).
    pub in_place: u64,
    pub new_slots: u64,
    pub checkouts: u64,
}

/// Dirty pages in a persistent-memory region (see the crate docs).
pub struct DirtyTier<L: Region, H: Region> {
    log: NvLog<L>,
    heap: Pool<H>,
    /// Where each dirty page's slot is.
    slots: BTreeMap<(u64, u64), Ptr>,
    stats: TierStats,
    /// The file system this tier holds the state of (0: not bound to one).
    owner: u64,
}

impl<L: Region, H: Region> DirtyTier<L, H> {
    /// Makes an empty tier: a log formatted in `log`, a heap made in `heap`.
    pub fn create(log: L, heap: H) -> Result<DirtyTier<L, H>, TierError> {
        DirtyTier::create_for(log, heap, 0)
    }

    /// Makes an empty tier for the file system whose id is `owner` (an owner record is kept
    /// ahead of any state, so that a mount never applies another file system's state).
    pub fn create_for(log: L, heap: H, owner: u64) -> Result<DirtyTier<L, H>, TierError> {
        let log = NvLog::format(log, LogConfig::default())?;
        let heap = Pool::create(heap, PoolOptions::default())?;
        let mut tier = DirtyTier { log, heap, slots: BTreeMap::new(), stats: TierStats::default(), owner };
        tier.record_owner()?;
        Ok(tier)
    }

    fn record_owner(&mut self) -> Result<(), TierError> {
        if self.owner != 0 {
            self.log.append(TAG, &Entry::Owner { fs_id: self.owner }.encode())?;
        }
        Ok(())
    }

    /// The file system this tier is bound to (0: none).
    pub fn owner(&self) -> u64 {
        self.owner
    }

    /// Binds the tier to file system `owner` (after an open found it bound to none).
    pub fn bind(&mut self, owner: u64) -> Result<(), TierError> {
        self.owner = owner;
        self.record_owner()
    }

    /// Opens a tier after a crash of the daemon or of the power: the log and the heap
    /// recover, then every page a record names is read from its slot and verified. The
    /// caller applies [`Recovered::pages`] to the file system, writes them to flash, and calls
    /// [`DirtyTier::checkout`].
    pub fn open(log: L, heap: H) -> Result<(DirtyTier<L, H>, Recovered), TierError> {
        let (mut log, _) = NvLog::open(log)?;
        let mut found = Recovered::default();
        // The records in order, and where chunks beyond the log's repair were passed over.
        let events = std::cell::RefCell::new(Vec::new());
        log.replay_lossy(
            bitmend_nvlog::RecordId(0),
            |_, tag, data| events.borrow_mut().push(Ok((tag, data.to_vec()))),
            &mut |seg, chunk| events.borrow_mut().push(Err((seg, chunk))),
        )?;
        let mut named: BTreeMap<(u64, u64), (u64, u32)> = BTreeMap::new();
        // Pages named before a lost chunk: that chunk may have dropped them, checked them out
        // or moved them to another slot, so they are never applied.
        let mut uncertain: BTreeSet<(u64, u64)> = BTreeSet::new();
        // Since the last checkout: whether a chunk was lost (later metadata is withheld).
        let mut lost_since = false;
        for event in events.into_inner() {
            let (tag, data) = match event {
                Ok(r) => r,
                Err(chunk) => {
                    found.lost_chunks.push(chunk);
                    uncertain.extend(std::mem::take(&mut named).into_keys());
                    lost_since = true;
                    continue;
                }
            };
            found.records += 1;
            match (tag == TAG).then(|| Entry::decode(&data)).flatten() {
                Some(Entry::Page { ino, index, slot, crc }) => {
                    uncertain.remove(&(ino, index));
                    named.insert((ino, index), (slot, crc));
                }
                Some(Entry::Drop { ino, from }) => {
                    named.retain(|&(i, p), _| i != ino || p < from);
                    uncertain.retain(|&(i, p)| i != ino || p < from);
                }
                Some(Entry::DropRange { ino, from, end }) => {
                    named.retain(|&(i, p), _| i != ino || !(from..end).contains(&p));
                    uncertain.retain(|&(i, p)| i != ino || !(from..end).contains(&p));
                }
                Some(Entry::Nodes(nodes)) if !lost_since => found.nodes.push(nodes),
                Some(Entry::Nodes(_)) => found.withheld_nodes += 1,
                Some(Entry::Owner { fs_id }) => found.owner = Some(fs_id),
                Some(Entry::Checkout) => {
                    named.clear();
                    uncertain.clear();
                    found.nodes.clear();
                    found.withheld_nodes = 0;
                    lost_since = false;
                }
                None => found.foreign_records += 1,
            }
        }
        found.unverified.extend(uncertain);
        // Nothing named: every slot in the heap is garbage (a crash between a checkout's trim
        // and its frees, or between a new slot and its record), and the heap is made afresh.
        let heap = if named.is_empty() && found.unverified.is_empty() && !lost_since {
            Pool::create(heap, PoolOptions::default())?
        } else {
            Pool::open(heap, PoolOptions::default())?.0
        };
        let owner = found.owner.unwrap_or(0);
        let mut tier = DirtyTier { log, heap, slots: BTreeMap::new(), stats: TierStats::default(), owner };
        for (&(ino, index), &(slot, _)) in &named {
            match tier.verified(ino, index, Ptr(slot)) {
                Some((bytes, crc)) => {
                    found.pages.push(RecoveredPage { ino, index, bytes, crc });
                    tier.slots.insert((ino, index), Ptr(slot));
                }
                None => found.unverified.push((ino, index)),
            }
        }
        Ok((tier, found))
    }

    /// The page in `slot` and its CRC, if the slot is a slot of page `index` of `ino` and
    /// its bytes match the CRC it carries. The record's CRC is not used: a page changed in
    /// place since carries its new CRC in the trailer, changed in the same transaction.
    fn verified(&self, ino: u64, index: u64, slot: Ptr) -> Option<(Vec<u8>, u32)> {
        let b = self.heap.object(slot).ok()?;
        if b.len() < SLOT {
            return None;
        }
        let (page, t) = (&b[..PAGE], &b[PAGE..SLOT]);
        let crc = le::get_u32(t, 0);
        let ours = le::get_u32(t, 4) == 0 && le::get_u64(t, 8) == ino && le::get_u64(t, 16) == index;
        (ours && crc32c(page) == crc).then(|| (page.to_vec(), crc))
    }

    fn trailer(ino: u64, index: u64, crc: u32) -> Vec<u8> {
        let mut t = Vec::with_capacity(TRAILER);
        t.put_u32(crc);
        t.put_u32(0);
        t.put_u64(ino);
        t.put_u64(index);
        t
    }

    /// Makes page `index` of `ino` (`page`, whose CRC is `crc`) durable in the region.
    /// `changed` is the byte range that differs from the page as last put (all of it for a
    /// page not put before). Returns once it is durable: an fsync needs nothing more.
    pub fn put_page(
        &mut self,
        (ino, index): (u64, u64),
        page: &[u8],
        crc: u32,
        changed: Range<usize>,
    ) -> Result<(), TierError> {
        self.put_pages(&[PagePut { key: (ino, index), page, crc, changed }])
    }

    /// Makes the pages of one write durable in the region, each as [`put_page`] would, but
    /// with one transaction, one fence for their records and one transaction freeing the
    /// slots they replace per group of new slots, rather than one of each per page. A crash
    /// part way leaves each page old or new (the file system records the new size after).
    ///
    /// [`put_page`]: Self::put_page
    pub fn put_pages(&mut self, pages: &[PagePut<'_>]) -> Result<(), TierError> {
        if let Some(p) = pages
            .iter()
            .find(|p| p.page.len() != PAGE || p.changed.end > PAGE || p.changed.start > p.changed.end)
        {
            return Err(TierError::Invalid {
                why: format!("a page of {} bytes, changed {:?}", p.page.len(), p.changed),
            });
        }
        let in_place = |p: &&PagePut<'_>| self.slots.contains_key(&p.key) && p.changed.len() < IN_PLACE_MAX;
        let (small, fresh): (Vec<&PagePut<'_>>, Vec<&PagePut<'_>>) = pages.iter().partition(in_place);
        for p in small {
            self.put_in_place(p)?;
        }
        for group in fresh.chunks(NEW_SLOTS_PER_TX) {
            self.put_new_slots(group)?;
        }
        Ok(())
    }

    /// In place: the changed bytes and the trailer in one transaction, each undone from its
    /// record if a crash cuts it short.
    fn put_in_place(&mut self, p: &PagePut<'_>) -> Result<(), TierError> {
        let slot = self.slots[&p.key];
        let trailer = Self::trailer(p.key.0, p.key.1, p.crc);
        self.heap.tx(|tx| {
            tx.write(slot, p.changed.start as u64, &p.page[p.changed.clone()])?;
            tx.write(slot, PAGE as u64, &trailer)
        })?;
        self.stats.in_place += 1;
        Ok(())
    }

    /// New slots, filled and committed in one transaction; then the records that name them,
    /// made durable by one fence (the pointer log); then the slots they replace freed. A
    /// crash before a record is durable leaves its old page named.
    fn put_new_slots(&mut self, group: &[&PagePut<'_>]) -> Result<(), TierError> {
        let slots = self.heap.tx(|tx| {
            let mut slots = Vec::with_capacity(group.len());
            for p in group {
                let slot = tx.alloc(SLOT as u64)?;
                tx.write(slot, 0, p.page)?;
                tx.write(slot, PAGE as u64, &Self::trailer(p.key.0, p.key.1, p.crc))?;
                slots.push(slot);
            }
            Ok(slots)
        })?;
        let mut named = 0;
        let mut failed = None;
        for (p, slot) in group.iter().zip(&slots) {
            let (ino, index) = p.key;
            match self
                .log
                .append_unfenced(TAG, &Entry::Page { ino, index, slot: slot.0, crc: p.crc }.encode())
            {
                Ok(_) => named += 1,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let full = matches!(failed, Some(bitmend_nvlog::LogError::Full { .. }));
        if failed.is_none() || full {
            self.log.region_mut().fence().map_err(bitmend_nvlog::LogError::from)?;
        }
        let mut old = Vec::new();
        for (p, &slot) in group.iter().zip(&slots).take(named) {
            old.extend(self.slots.insert(p.key, slot));
        }
        // A full log did not take the rest: their slots go back. Any other failure (the
        // power going) may have left records durable, naming them: they are kept (if nothing
        // names them, the next open of a tier with nothing named reclaims them).
        let unnamed: Vec<Ptr> = if full { slots[named..].to_vec() } else { Vec::new() };
        if !old.is_empty() || !unnamed.is_empty() {
            self.heap.tx(|tx| old.iter().chain(&unnamed).try_for_each(|&s| tx.free(s)))?;
        }
        self.stats.new_slots += named as u64;
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Drops the pages of `ino` from page `from` on (a truncate; 0: an unlink).
    pub fn drop_pages(&mut self, ino: u64, from: u64) -> Result<(), TierError> {
        self.drop_range(ino, from..u64::MAX)
    }

    /// Drops the pages of `ino` in `pages` (a punched hole; to the end: a truncate).
    pub fn drop_range(&mut self, ino: u64, pages: Range<u64>) -> Result<(), TierError> {
        let gone: Vec<(u64, u64)> =
            self.slots.range((ino, pages.start)..(ino, pages.end)).map(|(&k, _)| k).collect();
        if gone.is_empty() {
            return Ok(());
        }
        let entry = if pages.end == u64::MAX {
            Entry::Drop { ino, from: pages.start }
        } else {
            Entry::DropRange { ino, from: pages.start, end: pages.end }
        };
        self.log.append(TAG, &entry.encode())?;
        for k in gone {
            let slot = self.slots.remove(&k).expect("listed");
            self.heap.tx(|tx| tx.free(slot))?;
        }
        Ok(())
    }

    /// Everything put so far is on flash: the log is trimmed and the slots freed. A crash
    /// between leaves slots that nothing names; they are reclaimed at the next open of a
    /// tier with nothing to recover.
    pub fn checkout(&mut self) -> Result<(), TierError> {
        // A full log takes no record: the trim alone forgets everything before it.
        match self.log.append(TAG, &Entry::Checkout.encode()) {
            Ok(_) | Err(bitmend_nvlog::LogError::Full { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let tail = self.log.tail();
        self.log.trim(tail)?;
        let slots: Vec<Ptr> = std::mem::take(&mut self.slots).into_values().collect();
        for batch in slots.chunks(32) {
            self.heap.tx(|tx| batch.iter().try_for_each(|&s| tx.free(s)))?;
        }
        self.stats.checkouts += 1;
        // A crash before this leaves a tier holding nothing, bound to no one: harmless.
        self.record_owner()
    }

    /// Records the file system's nodes of one metadata operation (opaque to the tier);
    /// durable on return. Larger than a record can be: [`TierError::Full`] (the file system
    /// then writes the operation to flash instead).
    pub fn put_nodes(&mut self, nodes: &[u8]) -> Result<(), TierError> {
        if nodes.len() + 1 > self.log.max_record() {
            return Err(TierError::Full);
        }
        self.log.append(TAG, &Entry::Nodes(nodes.to_vec()).encode())?;
        Ok(())
    }

    /// The dirty state store (for inspection tools and fault injection: where its chunks lie).
    pub fn log(&self) -> &NvLog<L> {
        &self.log
    }

    /// Dirty pages held.
    pub fn pages(&self) -> usize {
        self.slots.len()
    }

    pub fn stats(&self) -> TierStats {
        self.stats
    }

    /// The two regions back (what a crash leaves, if nothing more is done).
    pub fn into_regions(self) -> (L, H) {
        (self.log.into_region(), self.heap.into_region())
    }
}
