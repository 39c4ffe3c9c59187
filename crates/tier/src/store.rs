//! The tier itself: slots in the heap, records in the log (see the crate docs).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use bitmend_code::crc::crc32c;
use bitmend_code::le::{self, Put};
use bitmend_heap::{Pool, PoolOptions, Ptr};
use bitmend_media::pmem::Region;
use bitmend_nvlog::{LogConfig, NvLog};

pub use bitmend_flashfs::PagePut;

use crate::record::{Entry, MAX_RUN, TAG};
use crate::TierError;

/// Bytes of a logical page.
pub const PAGE: usize = 4096;
/// Bytes of a slot: the page, then a trailer: crc u32, zero u32, ino u64, index u64.
pub const SLOT: usize = PAGE + TRAILER;
const TRAILER: usize = 24;

/// Where a slot trailer's fields are (FORMAT.md, "The NVRAM tier").
mod trailer_at {
    pub const CRC: usize = 0;
    pub const ZERO: usize = 4;
    pub const INO: usize = 8;
    pub const INDEX: usize = 16;
}

/// A change smaller than this is data-logged in place; a larger one goes to a new slot
/// (MinL2R: undo the bytes a change overwrites, or log a pointer when it changes most).
const IN_PLACE_MAX: usize = PAGE / 2;

/// The pages of one run object, largest first: 63 slots fill a 256 KiB heap run, 15, 7 and 3
/// fill blocks of the 64, 32 and 16 KiB classes (94%, 88% and 75%), and one a page-class
/// block. A write's new pages take as few objects as these sizes allow: one allocation, one
/// transaction and one record per object, where each page took one of each (a 1 MiB write:
/// 6 objects, not 256 slots; `put_pages` of 1 MiB 290 -> 73-87 us).
const RUN_SIZES: [usize; 5] = [MAX_RUN as usize, 15, 7, 3, 1];

/// Objects no record names any more freed inside each new run object's transaction: a put
/// frees more than it allocates, so what a checkout left is gone within as many puts as it
/// had objects (fewer: a 1 MiB write takes six objects), for journal records only (no fence
/// of their own).
const FREES_PER_RUN: usize = 4;

/// Where a dirty page is: slot `sub` of the run object at `block`, of `count` slots. In a
/// run object the pages come first, back to back, then their trailers; a one-page object is
/// the slot of version 1 (the page, then its trailer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SlotRef {
    block: Ptr,
    count: u32,
    sub: u32,
}

impl SlotRef {
    fn page_at(self) -> u64 {
        u64::from(self.sub) * PAGE as u64
    }

    fn trailer_at(self) -> u64 {
        u64::from(self.count) * PAGE as u64 + u64::from(self.sub) * TRAILER as u64
    }

    /// Bytes of a run object of `count` slots.
    fn object_len(count: u32) -> u64 {
        u64::from(count) * SLOT as u64
    }
}

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
    /// FUSE requests whose effect the state holds (request nodes handed over, and the
    /// requests record after the last checkout), oldest first.
    pub requests: Vec<u64>,
}

/// Counts since the tier was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Pages put: changed in place (data-logged), or into a new slot (a record each).
    pub in_place: u64,
    pub new_slots: u64,
    /// Run objects those new slots took (one allocation and one record each).
    pub runs: u64,
    pub checkouts: u64,
}

/// Dirty pages in a persistent-memory region (see the crate docs).
pub struct DirtyTier<L: Region, H: Region> {
    log: NvLog<L>,
    heap: Pool<H>,
    /// Where each dirty page's slot is.
    slots: BTreeMap<(u64, u64), SlotRef>,
    /// Run objects and how many of their slots still hold a dirty page: an object is freed
    /// when none does.
    live: BTreeMap<Ptr, u32>,
    /// Objects nothing names (a checkout's, or a crash's found at open), freed a few at a
    /// time by later puts ([`FREES_PER_RUN`]), all at once when the heap is full: a
    /// checkout is a record and a trim, not a transaction per 32 objects in the file
    /// system's checkpoint (half a millisecond with 3,000 small files).
    garbage: Vec<Ptr>,
    /// A put found the heap full since the last checkout: the next checkout frees its
    /// garbage at once, so that the reuse delay runs from then, as the file system's
    /// write-back to make room expects.
    starved: bool,
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
        let mut tier = DirtyTier::with(log, heap, owner);
        tier.record_owner()?;
        Ok(tier)
    }

    fn with(log: NvLog<L>, heap: Pool<H>, owner: u64) -> DirtyTier<L, H> {
        DirtyTier {
            log,
            heap,
            slots: BTreeMap::new(),
            live: BTreeMap::new(),
            garbage: Vec::new(),
            starved: false,
            stats: TierStats::default(),
            owner,
        }
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
        let mut named: BTreeMap<(u64, u64), SlotRef> = BTreeMap::new();
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
                Some(Entry::Page { ino, index, slot, .. }) => {
                    uncertain.remove(&(ino, index));
                    named.insert((ino, index), SlotRef { block: Ptr(slot), count: 1, sub: 0 });
                }
                Some(Entry::Run { ino, first, count, block }) => {
                    for sub in 0..count {
                        let index = first + u64::from(sub);
                        uncertain.remove(&(ino, index));
                        named.insert((ino, index), SlotRef { block: Ptr(block), count, sub });
                    }
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
                Some(Entry::RequestNodes { request, nodes }) if !lost_since => {
                    found.nodes.push(nodes);
                    found.requests.push(request);
                }
                Some(Entry::Nodes(_) | Entry::RequestNodes { .. }) => found.withheld_nodes += 1,
                Some(Entry::Requests(requests)) => found.requests.extend(requests),
                Some(Entry::Owner { fs_id }) => found.owner = Some(fs_id),
                Some(Entry::Checkout) => {
                    named.clear();
                    uncertain.clear();
                    found.nodes.clear();
                    found.requests.clear();
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
        let mut tier = DirtyTier::with(log, heap, owner);
        for (&(ino, index), &slot) in &named {
            match tier.verified(ino, index, slot) {
                Some((bytes, crc)) => {
                    found.pages.push(RecoveredPage { ino, index, bytes, crc });
                    tier.slots.insert((ino, index), slot);
                    *tier.live.entry(slot.block).or_insert(0) += 1;
                }
                None => found.unverified.push((ino, index)),
            }
        }
        // Objects nothing names (a crash between a new object and its record, or inside a
        // checkout's frees) are garbage; kept while anything is uncertain, which a later
        // open may still need to name.
        if found.unverified.is_empty() && found.lost_chunks.is_empty() {
            let live = &tier.live;
            tier.garbage = tier.heap.allocated().into_iter().filter(|p| !live.contains_key(p)).collect();
        }
        Ok((tier, found))
    }

    /// The page in `slot` and its CRC, if the slot is a slot of page `index` of `ino` and
    /// its bytes match the CRC it carries. The record's CRC is not used: a page changed in
    /// place since carries its new CRC in the trailer, changed in the same transaction.
    fn verified(&self, ino: u64, index: u64, slot: SlotRef) -> Option<(Vec<u8>, u32)> {
        let b = self.heap.object(slot.block).ok()?;
        if (b.len() as u64) < SlotRef::object_len(slot.count) {
            return None;
        }
        let (at, t_at) = (slot.page_at() as usize, slot.trailer_at() as usize);
        let (page, t) = (&b[at..at + PAGE], &b[t_at..t_at + TRAILER]);
        let crc = le::get_u32(t, trailer_at::CRC);
        let ours = le::get_u32(t, trailer_at::ZERO) == 0
            && le::get_u64(t, trailer_at::INO) == ino
            && le::get_u64(t, trailer_at::INDEX) == index;
        (ours && crc32c(page) == crc).then(|| (page.to_vec(), crc))
    }

    fn put_trailer(t: &mut Vec<u8>, ino: u64, index: u64, crc: u32) {
        let start = t.len();
        t.put_u32(crc);
        t.put_u32(0);
        t.put_u64(ino);
        t.put_u64(index);
        debug_assert_eq!(
            le::get_u64(&t[start..], trailer_at::INDEX),
            index,
            "a trailer reads back as written"
        );
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
    /// with the new pages in run objects: per object one transaction, one record and one fence,
    /// rather than one of each per page. A crash part way leaves each page old or new (the
    /// file system records the new size after).
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
        for run in runs(&fresh) {
            self.put_run(run)?;
        }
        Ok(())
    }

    /// In place: the changed bytes and the trailer in one transaction, each undone from its
    /// record if a crash cuts it short.
    fn put_in_place(&mut self, p: &PagePut<'_>) -> Result<(), TierError> {
        let slot = self.slots[&p.key];
        let mut trailer = Vec::with_capacity(TRAILER);
        Self::put_trailer(&mut trailer, p.key.0, p.key.1, p.crc);
        self.heap.tx(|tx| {
            tx.write(slot.block, slot.page_at() + p.changed.start as u64, &p.page[p.changed.clone()])?;
            tx.write(slot.block, slot.trailer_at(), &trailer)
        })?;
        self.stats.in_place += 1;
        Ok(())
    }

    /// Pages of one file with consecutive indexes, in a new run object filled and committed
    /// in one transaction; then the record that names them, durable on return (the pointer
    /// log); then the objects no page is left in freed. A crash before the record is durable
    /// leaves the old pages named.
    fn put_run(&mut self, run: &[&PagePut<'_>]) -> Result<(), TierError> {
        let count = run.len() as u32;
        debug_assert!((1..=MAX_RUN).contains(&count), "a run of {count} pages");
        let (ino, first) = run[0].key;
        debug_assert!(run.iter().enumerate().all(|(i, p)| p.key == (ino, first + i as u64)), "consecutive");
        let mut trailers = Vec::with_capacity(run.len() * TRAILER);
        for p in run {
            Self::put_trailer(&mut trailers, p.key.0, p.key.1, p.crc);
        }
        let mut block = self.fill_run_object(run, &trailers);
        if block.as_ref().is_err_and(|e| e.is_full()) && !self.garbage.is_empty() {
            // Room the garbage holds (once it has cooled: NVMalloc's reuse delay).
            self.free_garbage()?;
            block = self.fill_run_object(run, &trailers);
        }
        self.starved |= block.as_ref().is_err_and(|e| e.is_full());
        let block = block?;
        match self.log.append(TAG, &Entry::Run { ino, first, count, block: block.0 }.encode()) {
            Ok(_) => {}
            // A full log did not take it: the object goes back.
            Err(e @ bitmend_nvlog::LogError::Full { .. }) => {
                self.heap.tx(|tx| tx.free(block))?;
                return Err(e.into());
            }
            // Any other failure (the power going) may have left the record durable, naming
            // the object: it is kept (if nothing names it, the next open finds it garbage).
            Err(e) => return Err(e.into()),
        }
        let mut empty = Vec::new();
        for (sub, p) in run.iter().enumerate() {
            let slot = SlotRef { block, count, sub: sub as u32 };
            if let Some(old) = self.slots.insert(p.key, slot) {
                empty.extend(self.release(old));
            }
        }
        self.live.insert(block, count);
        self.free_objects(&empty)?;
        self.stats.new_slots += u64::from(count);
        self.stats.runs += 1;
        Ok(())
    }

    /// A new run object holding `run`'s pages and then `trailers`, filled and committed in one
    /// transaction, which also frees up to [`FREES_PER_RUN`] garbage objects.
    fn fill_run_object(&mut self, run: &[&PagePut<'_>], trailers: &[u8]) -> Result<Ptr, TierError> {
        let count = run.len() as u32;
        let frees = self.garbage.split_off(self.garbage.len().saturating_sub(FREES_PER_RUN));
        let filled = self.heap.tx(|tx| {
            let block = tx.alloc(SlotRef::object_len(count))?;
            let mut writes: Vec<(Ptr, u64, &[u8])> = Vec::with_capacity(run.len() + 1);
            for (i, p) in run.iter().enumerate() {
                writes.push((block, (i * PAGE) as u64, p.page));
            }
            writes.push((block, u64::from(count) * PAGE as u64, trailers));
            tx.write_several(&writes)?;
            frees.iter().try_for_each(|&p| tx.free(p))?;
            Ok(block)
        });
        if filled.is_err() {
            // Not committed: still garbage.
            self.garbage.extend(frees);
        }
        Ok(filled?)
    }

    /// One page less in `slot`'s object: the object, if that was its last.
    fn release(&mut self, slot: SlotRef) -> Option<Ptr> {
        let left = self.live.get_mut(&slot.block).expect("a named object is live");
        *left -= 1;
        (*left == 0).then(|| {
            self.live.remove(&slot.block);
            slot.block
        })
    }

    /// Frees every garbage object now.
    fn free_garbage(&mut self) -> Result<(), TierError> {
        let all = std::mem::take(&mut self.garbage);
        self.free_objects(&all)
    }

    /// Frees run objects, up to 32 per transaction.
    fn free_objects(&mut self, objects: &[Ptr]) -> Result<(), TierError> {
        for batch in objects.chunks(32) {
            self.heap.tx(|tx| batch.iter().try_for_each(|&b| tx.free(b)))?;
        }
        Ok(())
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
        let mut empty = Vec::new();
        for k in gone {
            let slot = self.slots.remove(&k).expect("listed");
            empty.extend(self.release(slot));
        }
        self.free_objects(&empty)
    }

    /// Everything put so far is on flash: the log is trimmed, and the objects holding the
    /// slots become garbage, freed by the puts that follow. A crash before they are freed
    /// leaves objects nothing names, which the next open finds (and a tier with nothing to
    /// recover is made afresh).
    pub fn checkout(&mut self) -> Result<(), TierError> {
        // A full log takes no record: the trim alone forgets everything before it.
        match self.log.append(TAG, &Entry::Checkout.encode()) {
            Ok(_) | Err(bitmend_nvlog::LogError::Full { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let tail = self.log.tail();
        self.log.trim(tail)?;
        self.slots.clear();
        self.garbage.extend(std::mem::take(&mut self.live).into_keys());
        if std::mem::take(&mut self.starved) {
            self.free_garbage()?;
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

    /// [`DirtyTier::put_nodes`] for the FUSE request `request`, in one record with it: the
    /// operation and the news that it was done are durable together.
    pub fn put_request_nodes(&mut self, request: u64, nodes: &[u8]) -> Result<(), TierError> {
        if nodes.len() + 9 > self.log.max_record() {
            return Err(TierError::Full);
        }
        self.log.append(TAG, &Entry::RequestNodes { request, nodes: nodes.to_vec() }.encode())?;
        Ok(())
    }

    /// Records requests whose effect the state holds (after a checkout, the recent requests
    /// whose records it trimmed), at most [`crate::record::MAX_REQUESTS`], the newest kept.
    pub fn put_requests(&mut self, requests: &[u64]) -> Result<(), TierError> {
        let from = requests.len().saturating_sub(crate::record::MAX_REQUESTS);
        self.log.append(TAG, &Entry::Requests(requests[from..].to_vec()).encode())?;
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

    /// Heap objects holding them (run objects with a dirty page left in them).
    pub fn objects(&self) -> usize {
        self.live.len()
    }

    /// Heap objects nothing names, not freed yet.
    pub fn garbage(&self) -> usize {
        self.garbage.len()
    }

    pub fn stats(&self) -> TierStats {
        self.stats
    }

    /// Dirty page `index` of `ino` as the tier holds it, with its CRC, if it holds it and
    /// its slot verifies (the copy a page damaged in the file system's memory is healed from).
    pub fn page(&self, ino: u64, index: u64) -> Option<(Vec<u8>, u32)> {
        let slot = *self.slots.get(&(ino, index))?;
        self.verified(ino, index, slot)
    }

    /// How full the log is, and the dirty pages held.
    pub fn fill(&self) -> bitmend_flashfs::TierFill {
        let (log_used, log_size) = self.log.fill();
        bitmend_flashfs::TierFill { log_used, log_size, pages: self.slots.len() as u64 }
    }

    /// The two regions back (what a crash leaves, if nothing more is done).
    pub fn into_regions(self) -> (L, H) {
        (self.log.into_region(), self.heap.into_region())
    }
}

/// `fresh` (in write order) cut into runs: pages of one file with consecutive indexes, each
/// run at most as long as the largest of [`RUN_SIZES`] it fits, largest first.
fn runs<'a, 'p>(fresh: &'a [&'a PagePut<'p>]) -> impl Iterator<Item = &'a [&'a PagePut<'p>]> {
    let mut rest = fresh;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (ino, first) = rest[0].key;
        let consecutive = rest
            .iter()
            .enumerate()
            .take_while(|(i, p)| p.key == (ino, first.wrapping_add(*i as u64)))
            .count();
        let n = RUN_SIZES.into_iter().find(|&n| n <= consecutive).expect("1 is a size");
        let (run, after) = rest.split_at(n);
        rest = after;
        Some(run)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn puts(keys: &[(u64, u64)], page: &[u8]) -> Vec<PagePut<'static>> {
        let page: &'static [u8] = Box::leak(page.to_vec().into_boxed_slice());
        keys.iter().map(|&key| PagePut { key, page, crc: 0, changed: 0..PAGE }).collect()
    }

    #[test]
    fn fresh_pages_are_cut_into_runs_of_the_sizes_that_fill_heap_blocks() {
        let page = vec![0u8; PAGE];
        let sizes = |keys: &[(u64, u64)]| {
            let p = puts(keys, &page);
            let refs: Vec<&PagePut<'_>> = p.iter().collect();
            runs(&refs).map(|r| r.len()).collect::<Vec<_>>()
        };
        let mib: Vec<(u64, u64)> = (0..256).map(|i| (3, i)).collect();
        assert_eq!(sizes(&mib), vec![63, 63, 63, 63, 3, 1]);
        assert_eq!(sizes(&mib[..14]), vec![7, 7]);
        // A gap in the indexes, or another file, ends a run.
        assert_eq!(sizes(&[(1, 0), (1, 1), (1, 3), (2, 4), (2, 5), (2, 6)]), vec![1, 1, 1, 3]);
        assert_eq!(sizes(&[]), Vec::<usize>::new());
    }
}
