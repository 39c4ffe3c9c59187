//! The pool: one region holding the journal (an nvlog from offset 0), the pool header page
//! (two superblock copies and the root slot) and the runs of blocks.

use std::time::{Duration, Instant};

use bitmend_media::pmem::Region;
use bitmend_nvlog::{NvLog, RecordId, RecoveryReport};

use crate::alloc::{AllocStats, Allocator, BadHeader, Clock, Plan, Ptr};
use crate::heal::{Geometry, Healed, StripeShape, PAGE};
use crate::layout::{recorded_len, Superblock, HEAP_VERSION_UNCHECKED, POOL_HEADER, RUN};
use crate::record::{self, Rec};
use crate::tx::state::{LogBytes, Slot, TxBuffers, Undo};
use crate::HeapError;

/// Choices that are not on the medium.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// How long a freed block waits before it can be allocated again (NVMalloc's
    /// don't-allocate list).
    pub reuse_after: Duration,
    /// The clock that period is measured on.
    pub clock: Clock,
    /// For a pool being made: signatures and parity over its pages, in stripes of this shape,
    /// or none. An existing pool keeps what it was made with.
    pub stripes: Option<StripeShape>,
    /// At open, rebuild from their stripes the pages under headers that fail their checks
    /// (a pool that heals). Off for a check that must write nothing it was not asked to.
    pub rebuild_headers: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            reuse_after: Duration::from_millis(200),
            clock: Clock::System,
            stripes: None,
            rebuild_headers: true,
        }
    }
}

/// What opening a pool found.
#[derive(Clone, Debug, Default)]
pub struct OpenReport {
    /// The journal's recovery.
    pub journal: RecoveryReport,
    /// Headers that failed their checks; their blocks (or runs) are quarantined.
    pub bad_headers: Vec<BadHeader>,
    /// Superblock copies found damaged, and rewritten from the other.
    pub superblocks_rewritten: u32,
    /// Transactions found in the journal: committed (their frees settled), and caught
    /// before their commit record (rolled back).
    pub committed: u64,
    pub rolled_back: u64,
    /// Journal chunks rebuilt from their parity while the journal was read (a wild write or
    /// worn cells in it).
    pub journal_repairs: usize,
    /// Old bytes written back, and block headers set to what the journal says.
    pub bytes_restored: u64,
    pub blocks_settled: u64,
    /// The last transaction's commit record survived the crash but some of its writes did
    /// not (they shared a fence): it was rolled back with the uncommitted ones.
    pub torn_commit: bool,
    /// The pool format version the pool had, when it was older than version 3 (it is now
    /// version 3).
    pub upgraded_from: Option<u32>,
    /// Blocks whose headers were linked to a slot that did not point at them (an
    /// [`alloc_into`](Pool::alloc_into) a crash cut short, or a block freed from its slot):
    /// free.
    pub links_freed: u64,
    /// Pages under bad headers rebuilt from their stripes at open (a pool that heals), the
    /// allocator then rebuilt from the healed headers.
    pub header_pages_rebuilt: u64,
    /// The pool had been closed cleanly ([`Pool::close`]): nothing was recomputed.
    pub was_closed: bool,
    /// After a crash, in a pool with line checks: lines damaged while the pool was down,
    /// rebuilt from their stripes before recovery (which would have taken them in).
    pub lines_mended: u64,
    /// Data pages (by number) with damage that could not be rebuilt before recovery: they
    /// read as damaged, never as their bytes.
    pub pages_left_damaged: Vec<u64>,
}

/// How often a checkout runs at the least.
const CHECKOUT_EVERY: Duration = Duration::from_secs(5);
/// Old blocks of pointer-logged writes that make a checkout due (they cool only once released).
const CHECKOUT_BLOCKS: usize = 4096;

/// Where the pool header page starts: after the journal, on a 4 KiB boundary.
pub(crate) fn header_page(journal: usize) -> u64 {
    (journal as u64).div_ceil(4096) * 4096
}

use crate::superblocks::{SUPERBLOCK_A, SUPERBLOCK_B};
/// The root slot: the payload offset of the pool's root object (0: none).
pub(crate) const ROOT_SLOT: u64 = 128;

/// A pool on a region.
pub struct Pool<R: Region> {
    pub(crate) log: NvLog<Healed<R>>,
    /// How reads check what they read, and when each page was last checked and used.
    pub(crate) reads: crate::heal::read_checker::ReadChecker,
    pub(crate) sb: Superblock,
    pub(crate) alloc: Allocator,
    header: u64,
    pub(crate) next_tx: u64,
    /// Old blocks of committed pointer-logged writes, released at the next checkout.
    replaced: Vec<Ptr>,
    last_checkout: std::time::Instant,
    /// Journal bytes of every transaction since the pool was opened.
    log_bytes: LogBytes,
    pub(crate) checkouts: u64,
    /// Transactions finished since the last look at the clock.
    finished: u32,
    /// Reused buffers: a journal record being built, bytes being copied within the region.
    pub(crate) rec: Vec<u8>,
    pub(crate) copy: Vec<u8>,
    /// Slots that blocks allocated into them are linked to, by slot offset (version 4): such
    /// a block is allocated only while its slot points at it, so anything that writes the
    /// slot, or frees or moves the object holding it, first unlinks the block
    /// ([`Pool::unlink_within`]).
    pub(crate) links: crate::link::table::Links,
    /// The ranges the journal's last record, a checksummed commit, vouches for: a write
    /// outside a transaction that changes them would make recovery take that commit for torn
    /// ([`Pool::keep_vouched`]).
    pub(crate) vouched: Vec<(u64, u32)>,
    /// The vectors of the last transaction, emptied, for the next.
    pub(crate) tx_buffers: TxBuffers,
}

impl<R: Region> std::fmt::Debug for Pool<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("superblock", &self.sb)
            .field("stats", &self.alloc.stats)
            .finish_non_exhaustive()
    }
}

/// Protected pages of a pool of `runs` runs: the pool header page and the runs.
pub(crate) fn pages(runs: u64) -> u64 {
    (POOL_HEADER + runs * RUN) / PAGE
}

/// Where a version 5 or 6 pool's stripes are: over the header page at `header` and the
/// runs, with the parity and the tables after the last run.
pub(crate) fn geometry(sb: &Superblock, header: u64) -> Option<Geometry> {
    let shape = sb.shape?;
    let checks = sb.version > HEAP_VERSION_UNCHECKED;
    Some(Geometry::new(shape, header, pages(sb.runs as u64), sb.first_run + sb.runs as u64 * RUN, checks))
}

impl<R: Region> Pool<R> {
    pub(crate) fn assemble(log: NvLog<Healed<R>>, sb: Superblock, alloc: Allocator, header: u64) -> Pool<R> {
        Pool {
            log,
            sb,
            alloc,
            header,
            next_tx: 1,
            replaced: Vec::new(),
            last_checkout: std::time::Instant::now(),
            log_bytes: LogBytes::default(),
            checkouts: 0,
            finished: 0,
            rec: Vec::new(),
            copy: Vec::new(),
            links: Default::default(),
            vouched: Vec::new(),
            tx_buffers: TxBuffers::default(),
            reads: crate::heal::read_checker::ReadChecker::new(geometry(&sb, header).map_or(0, |g| g.pages)),
        }
    }

    /// Asks the region to keep the heap's pages (the pool header page and the runs)
    /// read-only between transactions, if it can (a `Guarded` region).
    pub(crate) fn guard(&mut self) -> Result<(), HeapError> {
        let end = self.sb.first_run + self.sb.runs as u64 * RUN;
        Ok(self.log.region_mut().guard(self.header as usize, end as usize)?)
    }

    /// Journal bytes of every transaction since open, beside redo logging's.
    pub fn log_bytes(&self) -> LogBytes {
        self.log_bytes
    }

    /// Appends a heap record to the journal, durable at the next fence (the transaction
    /// fences before it writes in place). A full journal fails the transaction with
    /// [`HeapError::JournalFull`] (it is then rolled back and checked out); no checkout here, which
    /// would trim the running transaction's own records. Commits check out once three
    /// quarters of the journal is used, so only a transaction larger than the last quarter
    /// meets this.
    pub(crate) fn log_append(&mut self, rec: &[u8]) -> Result<RecordId, HeapError> {
        match self.log.append_unfenced(record::TAG, rec) {
            Err(bitmend_nvlog::LogError::Full { .. }) => {
                Err(HeapError::JournalFull { journal: self.journal_use().1 })
            }
            r => r.map_err(Into::into),
        }
    }

    /// Where an allocation of `len` bytes goes. A pool with no free block of its kind
    /// first releases the old blocks of finished pointer-logged writes (without trimming the
    /// journal: the running transaction's records are in it), then waits for a block of its
    /// kind that is cooling, if one is (at most the don't-allocate period): the pool is full
    /// only when neither helps.
    pub(crate) fn plan(&mut self, len: u64) -> Result<Plan, HeapError> {
        loop {
            match self.alloc.plan(len) {
                Err(HeapError::Full { .. }) if !self.replaced.is_empty() => {
                    for p in std::mem::take(&mut self.replaced) {
                        self.alloc.free(self.log.region_mut(), p)?;
                    }
                }
                Err(full @ HeapError::Full { .. }) => match (self.alloc.ready_at(len), &self.alloc.clock) {
                    (Some(t), Clock::System) => {
                        std::thread::sleep(t.saturating_duration_since(Instant::now()))
                    }
                    _ => return Err(full),
                },
                planned => return planned,
            }
        }
    }

    /// A transaction committed: its pointer-logged old blocks wait for the checkout, which
    /// runs when less than a quarter of the journal is free, and every 5 s.
    pub(crate) fn note_finished(
        &mut self,
        replaced: &mut Vec<Ptr>,
        bytes: LogBytes,
    ) -> Result<(), HeapError> {
        self.replaced.append(replaced);
        let b = &mut self.log_bytes;
        b.undo += bytes.undo;
        b.pointer += bytes.pointer;
        b.other += bytes.other;
        b.redo_equivalent += bytes.redo_equivalent;
        let cfg = self.log.config();
        let capacity = cfg.segment_data() * (cfg.segments as u64 - 1);
        let used = self.log.tail().0 - self.log.head().0;
        // The clock is read every 64 transactions: reading it costs as much as a small write.
        self.finished = self.finished.wrapping_add(1);
        let due = self.finished.is_multiple_of(64) && self.last_checkout.elapsed() >= CHECKOUT_EVERY;
        if used * 4 > capacity * 3 || self.replaced.len() >= CHECKOUT_BLOCKS || due {
            self.checkout()?;
        }
        Ok(())
    }

    /// Checkout (MinL2R's CHECKOUT): releases the old blocks of committed pointer-logged
    /// writes, then trims the journal of every finished transaction. Between the two a crash
    /// leaves the records, and recovery settles the same blocks free again.
    pub fn checkout(&mut self) -> Result<(), HeapError> {
        for p in std::mem::take(&mut self.replaced) {
            self.alloc.free(self.log.region_mut(), p)?;
        }
        // The released headers durable before the records that stand for them are gone.
        self.log.region_mut().fence()?;
        let tail = self.log.tail();
        self.log.trim(tail)?;
        self.log.region_mut().seal()?;
        self.vouched.clear();
        self.last_checkout = std::time::Instant::now();
        self.checkouts += 1;
        Ok(())
    }

    /// Undoes `undo` (a transaction's, in order of logging) from the last back, durably.
    pub(crate) fn roll_back(&mut self, undo: &[Undo]) -> Result<(), HeapError> {
        for u in undo.iter().rev() {
            match *u {
                Undo::Bytes { at, len, record } => {
                    let rec = self.log.read(record)?;
                    let old = match record::decode(&rec.data) {
                        Some((_, Rec::Undo(ranges))) => {
                            ranges.into_iter().find(|(a, old)| *a == at && old.len() == len).map(|r| r.1)
                        }
                        _ => None,
                    };
                    let old = old.ok_or(HeapError::Corrupt { at, what: "the undo record of a write" })?;
                    let region = self.log.region_mut();
                    region.write(at as usize, &old)?;
                    region.flush(at as usize, len)?;
                }
                Undo::Alloc(p) => {
                    self.alloc.free(self.log.region_mut(), p)?;
                }
                Undo::Pointer { slot, old, new } => {
                    let region = self.log.region_mut();
                    region.write(slot as usize, &old.0.to_le_bytes())?;
                    region.flush(slot as usize, 8)?;
                    self.alloc.free(region, new)?;
                }
            }
        }
        self.log.region_mut().fence()?;
        Ok(())
    }

    /// The allocator's counts.
    pub fn stats(&self) -> AllocStats {
        self.alloc.stats
    }

    /// Bytes new objects could take (free blocks, cooling ones, unassigned runs; headers
    /// included): what `stat` reports as free.
    pub fn free_bytes(&self) -> u64 {
        self.alloc.free_bytes()
    }

    /// Every allocated object, in pool order (for checks: each should be reachable).
    pub fn allocated(&self) -> Vec<Ptr> {
        self.alloc.allocated()
    }

    /// The pool's format version (FORMAT.md section 9).
    pub fn version(&self) -> u32 {
        self.sb.version
    }

    /// The pool's identity (random at create).
    pub fn pool_id(&self) -> u64 {
        self.sb.pool_id
    }

    /// Bytes of the blocks' payload area (every run).
    pub fn capacity(&self) -> u64 {
        self.sb.runs as u64 * RUN
    }

    /// Wear: how many blocks have been allocated 0 times, 1, 2 to 3, 4 to 7 and so on (bucket
    /// i holds counts from 2^(i-1) to 2^i - 1; bucket 0 the never allocated).
    pub fn wear_histogram(&self) -> Vec<u64> {
        let mut h = vec![0u64; 18];
        for c in self.alloc.allocation_counts(self.log.region()) {
            let b = if c == 0 { 0 } else { 1 + c.ilog2() as usize };
            h[b] += 1;
        }
        while h.len() > 1 && h.last() == Some(&0) {
            h.pop();
        }
        h
    }

    /// Journal bytes holding records not yet checked out, and the journal's capacity.
    pub fn journal_use(&self) -> (u64, u64) {
        let cfg = self.log.config();
        (self.log.tail().0 - self.log.head().0, cfg.segment_data() * cfg.segments as u64)
    }

    /// The journal (for inspection tools and fault injection: where its chunks lie).
    pub fn journal(&self) -> &NvLog<Healed<R>> {
        &self.log
    }

    /// The region underneath (for statistics and fault injection in tests).
    pub fn region(&self) -> &R {
        self.log.region().inner()
    }

    pub fn region_mut(&mut self) -> &mut R {
        self.log.region_mut().inner_mut()
    }

    /// Gives the region back (what a crash or a close does; nothing is pending outside a
    /// transaction).
    pub fn into_region(self) -> R {
        self.close()
    }

    /// Closes the pool: every store fenced, and a version 6 pool marked closed, so that the
    /// next open recomputes nothing (and a wild write made while it was closed is found, not
    /// taken in). A pool dropped without it is opened as after a crash. Gives the region
    /// back. If the mark cannot be written the pool stays as after a crash: safe, slower.
    pub fn close(mut self) -> R {
        if self.sb.version > HEAP_VERSION_UNCHECKED && self.heals() {
            let _ = self.mark_closed();
        }
        self.log.into_region().into_inner()
    }

    fn mark_closed(&mut self) -> Result<(), HeapError> {
        // The journal emptied first (old blocks of pointer-logged writes released): the next
        // open has nothing to recover, and so nothing to take on trust.
        self.checkout()?;
        self.log.region_mut().fence()?;
        let sb = Superblock { closed: true, ..self.sb };
        for copy in [SUPERBLOCK_A, SUPERBLOCK_B] {
            let at = (self.header + copy) as usize;
            self.log.region_mut().write(at, &sb.encode())?;
            self.log.region_mut().persist(at, 64)?;
        }
        Ok(())
    }

    /// The root object (none: [`Ptr::NULL`]).
    pub fn root(&self) -> Ptr {
        let at = (self.header + ROOT_SLOT) as usize;
        Ptr(bitmend_code::le::get_u64(self.log.region().bytes(), at))
    }

    /// Where the root slot is (a persistent pointer slot).
    pub(crate) fn root_slot_at(&self) -> u64 {
        self.header + ROOT_SLOT
    }

    /// The pool's root slot.
    pub fn root_slot(&self) -> Slot {
        Slot { at: self.root_slot_at() }
    }

    /// The 8-byte pointer slot at `off` of the object at `obj`.
    pub fn slot(&self, obj: Ptr, off: u64) -> Result<Slot, HeapError> {
        self.check(obj, off, 8).map_err(|e| self.damaged_header_or(obj, e))?;
        if !(obj.0 + off).is_multiple_of(8) {
            return Err(HeapError::Misaligned { at: obj.0 + off });
        }
        Ok(Slot { at: obj.0 + off })
    }

    /// What a pointer slot holds.
    pub fn get(&self, slot: Slot) -> Ptr {
        Ptr(bitmend_code::le::get_u64(self.log.region().bytes(), slot.at as usize))
    }

    /// `len` bytes at `off` of the object at `p`.
    pub fn read(&self, p: Ptr, off: u64, len: u64) -> Result<&[u8], HeapError> {
        self.check(p, off, len).map_err(|e| self.damaged_header_or(p, e))?;
        let at = (p.0 + off) as usize;
        // The header (whose length bounded the read) and the bytes read, as one read.
        let header = crate::layout::BLOCK_HEADER as usize;
        self.check_parts_from(p.header(), &[(0, header), (header + off as usize, len as usize)])?;
        Ok(&self.log.region().bytes()[at..at + len as usize])
    }

    /// `e`, an object's bounds refused, unless its header's line fails its check (in a pool
    /// that heals): then the damage, which a caller that heals rebuilds.
    fn damaged_header_or(&self, p: Ptr, e: HeapError) -> HeapError {
        match self.check_tx_read(p.header(), crate::layout::BLOCK_HEADER) {
            Err(damaged) => damaged,
            Ok(()) => e,
        }
    }

    /// The whole object at `p`, not checked: the caller checks what it reads of it
    /// ([`Pool::check_parts`]).
    pub(crate) fn object_unchecked(&self, p: Ptr) -> Result<&[u8], HeapError> {
        let len = self.size_of(p)?;
        Ok(&self.log.region().bytes()[p.0 as usize..(p.0 + len) as usize])
    }

    /// The whole object at `p`.
    pub fn object(&self, p: Ptr) -> Result<&[u8], HeapError> {
        let len = self.size_of(p)?;
        // The header with the object, as one read: its length bounds what is returned.
        self.check_read(p.header(), crate::layout::BLOCK_HEADER + len)?;
        Ok(&self.log.region().bytes()[p.0 as usize..(p.0 + len) as usize])
    }

    /// Bytes of the object at `p`: the length it was allocated with (its block may be
    /// larger; what lies past the object is not its, and a pointer-logged write does not
    /// copy it).
    pub fn size_of(&self, p: Ptr) -> Result<u64, HeapError> {
        let cap = self.alloc.allocated_capacity(p).ok_or(HeapError::NotAllocated { at: p.0 })?;
        let len = recorded_len(self.log.region().bytes(), p.header(), self.sb.header_layout());
        Ok(len.map_or(cap, |len| len.min(cap)))
    }

    pub(crate) fn check(&self, p: Ptr, off: u64, len: u64) -> Result<(), HeapError> {
        within(p, off, len, self.size_of(p)?)
    }
}

/// `len` bytes at `off` of the `cap`-byte object at `p`, or the error that they are not.
pub(crate) fn within(p: Ptr, off: u64, len: u64, cap: u64) -> Result<(), HeapError> {
    if off.checked_add(len).is_none_or(|end| end > cap) {
        return Err(HeapError::OutOfBounds { at: p.0, off, len, cap });
    }
    Ok(())
}

/// A pool identity: random enough that leftovers of another pool are never taken for ours.
pub(crate) fn random_id() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    bitmend_media::rng::Rng::new(t.as_nanos() as u64 ^ (std::process::id() as u64) << 40).next_u64() | 1
}
