//! MinL2R transactions: undo logging of only the bytes a write overwrites (data logging), or,
//! for a write that changes half of its block or more, a new block and a log of the old
//! pointer alone (pointer logging). The journal is the pool's nvlog: every record is durable
//! (encoded, signed) before the in-place write it protects.
//!
//! States (MinL2R section 3.2): BEGIN when the first record is logged, LOGGING while undo
//! records go out, WRITING once data is written in place, COMMIT when the commit record is
//! durable, CHECKOUT when the log of finished transactions is trimmed and the old blocks of
//! pointer-logged writes are released. A crash in LOGGING or WRITING rolls back at open;
//! BEGIN and COMMIT need nothing (a committed transaction's frees are settled from the log).

use bitmend_code::le::Put;
use bitmend_media::pmem::Region;
use bitmend_nvlog::RecordId;

use crate::alloc::{Plan, Ptr};
use crate::layout::BLOCK_HEADER;
use crate::pool::Pool;
use crate::record::{self, kind, Written, HEAD, MAX_RANGES};
use crate::HeapError;

pub(crate) mod state;
pub use state::{LogBytes, Slot, TxState, REDO_OVERHEAD};
use state::{TxBuffers, Undo};

/// A transaction in progress; see [`Pool::tx`].
pub struct Tx<'p, R: Region> {
    pool: &'p mut Pool<R>,
    id: u64,
    /// Ranges this transaction's reads have checked (a pool that heals): read again, they
    /// are not checked again (what the transaction wrote there since carries fresh checks).
    checked: std::cell::RefCell<Vec<(u64, u64)>>,
    pub(crate) state: TxState,
    /// Blocks allocated by this transaction, with their lengths (written without undo:
    /// rollback frees them). Few per transaction: a vector is faster to search than a set.
    fresh: Vec<(Ptr, u64)>,
    /// Of those, the ones whose header is not written yet: it waits for the fence that makes
    /// their alloc records durable (which a later record can share).
    headers_due: Vec<(Ptr, u64)>,
    /// Records appended since the last fence: the next write in place fences first.
    unfenced: bool,
    /// Undo actions in order, for a rollback in this process.
    undo: Vec<Undo>,
    /// The ranges whose old bytes the undo records hold.
    saved: Saved,
    frees: Vec<Ptr>,
    /// Old blocks of pointer-logged writes, released at checkout.
    replaced: Vec<Ptr>,
    /// Every range written in place since the last fence, in order (block headers
    /// included): what a checksummed commit record vouches for.
    written: Vec<(u64, u32)>,
    written_bytes: u64,
    /// The CRC of those ranges, kept as they are written (from the bytes in hand, which
    /// are cached; a block written with streaming stores is not), unless `overlap`: a later
    /// write changed an earlier range, and the commit reads the ranges back instead.
    written_crc: u32,
    overlap: bool,
    pub(crate) bytes: LogBytes,
    /// Scratch for `write_several`: the ranges it writes, and those not saved yet (kept
    /// from call to call, so that a write makes no allocation for them).
    ranges: Vec<(u64, usize)>,
    unsaved: Vec<(u64, usize)>,
}

/// Writes of this many bytes or more bypass the cache.
const STREAM_MIN: usize = 1024;

/// Whether the lines a write in place goes to are likely cached, which decides how it is
/// written: a data-logged overwrite's lines were just read for its undo record, and ordinary
/// stores to them need no read for ownership, where streaming stores would evict them and
/// the next undo of the same bytes would miss (`bench heap`: a 1 KiB data-logged overwrite
/// 770 to 589 ns); a new block's lines are cold, and streamed past a few lines.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lines {
    Cached,
    Cold,
}

/// The most bytes a checksummed commit covers: above it, checking them costs more than the
/// fence it saves, and the commit is fenced after the writes instead (`bench heap`).
const CHECKSUM_MAX: u64 = 8192;

/// Pages a healing transaction rebuilds at most before it gives up (each round one or more).
const HEALING_ROUNDS: usize = 16;

impl<R: Region> Pool<R> {
    /// Runs `f` as one transaction: all of its writes, allocations and frees, or none. An
    /// error from `f`, or a failure before the commit record is durable, rolls it back. In a
    /// pool that heals, every read `f` makes is checked, and a transaction that met damage
    /// is rolled back, the page rebuilt, and `f` run again from the start
    /// ([`tx_healing`](Self::tx_healing)): `f` may run more than once.
    pub fn tx<T>(&mut self, f: impl FnMut(&mut Tx<R>) -> Result<T, HeapError>) -> Result<T, HeapError> {
        self.tx_healing(f)
    }

    /// One run of a transaction (see [`tx`](Self::tx)).
    fn tx_once<T>(&mut self, f: impl FnOnce(&mut Tx<R>) -> Result<T, HeapError>) -> Result<T, HeapError> {
        let r = self.tx_unsealed(f);
        // The pages it wrote may be protected again (a guarded region).
        self.log.region_mut().seal()?;
        r
    }

    /// [`tx`](Self::tx), healing what its reads refuse: a transaction that read a damaged
    /// page is aborted (it changed nothing), the page rebuilt from its stripe
    /// ([`verify`](Self::verify)), and the transaction run again. Beyond repair, the error
    /// names the pages, and nothing changed.
    pub fn tx_healing<T>(
        &mut self,
        mut f: impl FnMut(&mut Tx<R>) -> Result<T, HeapError>,
    ) -> Result<T, HeapError> {
        // Each round rebuilds at least one page or fails; a transaction reads a few pages.
        for _ in 0..HEALING_ROUNDS {
            match self.tx_once(&mut f) {
                Err(HeapError::Damaged { at, len, .. }) if self.heals() => self.verify(at, len)?,
                r => return r,
            }
        }
        self.tx_once(f)
    }

    fn tx_unsealed<T>(&mut self, f: impl FnOnce(&mut Tx<R>) -> Result<T, HeapError>) -> Result<T, HeapError> {
        let id = self.next_tx;
        self.next_tx += 1;
        let mut tx = Tx::new(self, id);
        match f(&mut tx) {
            Ok(v) => match tx.commit() {
                Ok(_) => Ok(v),
                Err(e) if tx.state == TxState::Commit => Err(e),
                Err(e) => {
                    tx.abort()?;
                    Err(e)
                }
            },
            Err(e) => {
                tx.abort()?;
                Err(e)
            }
        }
    }
}

impl<'p, R: Region> Tx<'p, R> {
    pub(crate) fn new(pool: &'p mut Pool<R>, id: u64) -> Tx<'p, R> {
        let b = std::mem::take(&mut pool.tx_buffers);
        debug_assert!(b.undo.is_empty() && b.written.is_empty(), "buffers come back empty");
        Tx {
            pool,
            id,
            checked: Default::default(),
            state: TxState::Begin,
            fresh: b.fresh,
            headers_due: b.headers_due,
            unfenced: false,
            undo: b.undo,
            saved: Saved(b.saved),
            frees: b.frees,
            replaced: b.replaced,
            written: b.written,
            written_bytes: 0,
            written_crc: 0,
            overlap: false,
            bytes: LogBytes::default(),
            ranges: b.ranges,
            unsaved: b.unsaved,
        }
    }

    /// The state of the transaction (MinL2R's).
    pub fn state(&self) -> TxState {
        self.state
    }

    /// Appends a journal record of `kind`, its body put by `body`. It becomes durable at the
    /// next fence, which comes before any write in place ([`Tx::fence_records`]): records
    /// logged back to back share one. No record marks BEGIN: a transaction's first record
    /// carries its id, and recovery groups records by id (a begin record would cost a
    /// durable append, a fence, per transaction).
    fn log(&mut self, kind: u8, body: impl FnOnce(&mut Vec<u8>, &R)) -> Result<RecordId, HeapError> {
        let mut rec = std::mem::take(&mut self.pool.rec);
        record::start(&mut rec, kind, self.id);
        body(&mut rec, self.pool.log.region().inner());
        let result = self.pool.log_append(&rec);
        let len = rec.len() as u64;
        self.pool.rec = rec;
        let id = result?;
        self.unfenced = true;
        match kind {
            kind::UNDO | kind::UNDO_RANGES => self.bytes.undo += len,
            kind::POINTER => self.bytes.pointer += len,
            _ => self.bytes.other += len,
        }
        if self.state == TxState::Begin {
            self.state = TxState::Logging;
        }
        Ok(id)
    }

    /// Makes the records logged so far durable (MinL2R's order: the log before any write in
    /// place it protects), then writes the headers of blocks allocated since, which their
    /// alloc records vouch for.
    fn fence_records(&mut self) -> Result<(), HeapError> {
        if self.unfenced {
            self.pool.log.region_mut().fence()?;
            self.unfenced = false;
            // What was written in place so far is durable now, before the commit record is
            // appended: the commit need not vouch for it (a pointer-logged write's new block,
            // filled before this fence, is not checksummed again).
            self.written.clear();
            self.written_bytes = 0;
            self.written_crc = 0;
            self.overlap = false;
        }
        let mut due = std::mem::take(&mut self.headers_due);
        for &(p, len) in &due {
            self.pool.alloc.mark_allocated(self.pool.log.region_mut(), p, len)?;
            let at = p.header() as usize;
            let header: [u8; BLOCK_HEADER as usize] =
                self.pool.log.region().bytes()[at..at + BLOCK_HEADER as usize].try_into().expect("a header");
            self.note_written(p.header(), &header);
        }
        due.clear();
        self.headers_due = due;
        Ok(())
    }

    /// Allocates a block of at least `len` payload bytes, its contents unspecified (zero if
    /// never used). Freed again if the transaction does not commit.
    pub fn alloc(&mut self, len: u64) -> Result<Ptr, HeapError> {
        let p = self.take_block(len)?;
        let logged = self.log(kind::ALLOC, |rec, _| {
            rec.put_u64(p.0);
            rec.put_u64(len);
        });
        if let Err(e) = logged {
            self.pool.alloc.unpick(p);
            return Err(e);
        }
        self.undo.push(Undo::Alloc(p));
        self.take_fresh(p, len);
        self.fence_fresh()?;
        Ok(p)
    }

    /// In a pool that heals, the record that names a fresh block is made durable before the
    /// block is written: a crash could otherwise leave its stores' parity, signature and
    /// line check patches torn in what recovery, without the record, takes for free space
    /// that nothing wrote (and a later store there for damage). One fence more per
    /// transaction that allocates.
    fn fence_fresh(&mut self) -> Result<(), HeapError> {
        match self.pool.heals() {
            true => self.fence_records(),
            false => Ok(()),
        }
    }

    /// Block `p`, taken for this transaction, is its object of `len` bytes: written
    /// without undo, its header written allocated after the next fence.
    fn take_fresh(&mut self, p: Ptr, len: u64) {
        self.fresh.push((p, len));
        self.headers_due.push((p, len));
        self.state = TxState::Writing;
    }

    fn fresh_len(&self, p: Ptr) -> Option<u64> {
        self.fresh.iter().find(|(q, _)| *q == p).map(|&(_, len)| len)
    }

    /// Bytes of the object at `p` (one this transaction allocated included).
    fn size_of(&self, p: Ptr) -> Result<u64, HeapError> {
        match self.fresh_len(p) {
            Some(len) => Ok(len),
            None => {
                // A pointer to no block (damage in what held it) is refused before its
                // header is looked for.
                if self.pool.alloc.allocated_capacity(p).is_none() {
                    return Err(HeapError::NotAllocated { at: p.0 });
                }
                // The header's length bounds what the transaction reads and writes.
                self.check_once(p.header(), crate::layout::BLOCK_HEADER)?;
                self.pool.size_of(p)
            }
        }
    }

    /// Checks `[at, at + len)` as a transaction's read (always, in a pool that heals),
    /// unless this transaction checked it already.
    fn check_once(&self, at: u64, len: u64) -> Result<(), HeapError> {
        if !self.pool.heals() {
            return Ok(());
        }
        let mut checked = self.checked.borrow_mut();
        if checked.iter().any(|&(a, l)| a <= at && at + len <= a + l) {
            return Ok(());
        }
        self.pool.check_tx_read(at, len)?;
        checked.push((at, len));
        Ok(())
    }

    fn check(&self, p: Ptr, off: u64, len: u64) -> Result<(), HeapError> {
        crate::pool::within(p, off, len, self.size_of(p)?)
    }

    /// Adds `data`, just written at `at`, to what the commit vouches for.
    fn note_written(&mut self, at: u64, data: &[u8]) {
        // With records waiting for a fence, that fence comes before the commit record (the
        // commit fences them first), and makes this write durable with them.
        if self.unfenced {
            return;
        }
        // Past either limit the commit is fenced, and needs no CRC.
        if self.written.len() < MAX_RANGES && self.written_bytes + data.len() as u64 <= CHECKSUM_MAX {
            let end = at + data.len() as u64;
            self.overlap |= self.written.iter().any(|&(a, l)| a < end && at < a + l as u64);
            self.written_crc = bitmend_code::crc::crc32c_append(self.written_crc, data);
        }
        self.written.push((at, data.len() as u32));
        self.written_bytes += data.len() as u64;
    }

    /// A block for `len` bytes, taken from the allocator; a run it formats first is recorded
    /// in the journal before its headers are written (recovery finishes a torn format).
    fn take_block(&mut self, len: u64) -> Result<Ptr, HeapError> {
        let plan = self.pool.plan(len)?;
        let format = match plan {
            Plan::Block(_) => None,
            Plan::Run { run, class } => Some((run, class, 1)),
            Plan::Span { head, runs } => Some((head, 0, runs)),
        };
        if let Some((run, class, runs)) = format {
            let logged = self.log(kind::FORMAT, |rec, _| {
                rec.put_u32(run);
                rec.put_u8(class);
                rec.put_u32(runs);
            });
            // The run's headers are written next: its format record first.
            if let Err(e) = logged.and_then(|_| self.fence_records()) {
                self.pool.alloc.unplan(plan);
                return Err(e);
            }
        }
        self.pool.alloc.realize(self.pool.log.region_mut(), plan)
    }

    /// Frees the block at `p` when the transaction commits (not before: a rollback keeps it).
    pub fn free(&mut self, p: Ptr) -> Result<(), HeapError> {
        if !self.pool.alloc.is_allocated(p) || self.frees.contains(&p) {
            return Err(HeapError::NotAllocated { at: p.0 });
        }
        self.log(kind::FREE, |rec, _| rec.put_u64(p.0))?;
        self.frees.push(p);
        // Blocks linked to slots inside the object: unlinked, durable by the commit's fence.
        let len = self.size_of(p)?;
        self.unlink_within(p.0, p.0 + len)?;
        Ok(())
    }

    /// Unlinks the blocks linked to slots in `[start, end)` (see `link.rs`); the next fence,
    /// which comes before any write in place, makes that durable.
    fn unlink_within(&mut self, start: u64, end: u64) -> Result<bool, HeapError> {
        let unlinked = self.pool.unlink_within(start, end)?;
        self.unfenced |= unlinked;
        Ok(unlinked)
    }

    /// Writes `data` at `off` of the object at `p`: data logging (the bytes it overwrites go
    /// to the journal first; none for a block this transaction allocated).
    pub fn write(&mut self, p: Ptr, off: u64, data: &[u8]) -> Result<(), HeapError> {
        self.write_several(&[(p, off, data)])
    }

    /// Several writes as [`write`](Self::write) makes them, whose undo records share one
    /// fence (each `write` takes its own).
    pub fn write_several(&mut self, writes: &[(Ptr, u64, &[u8])]) -> Result<(), HeapError> {
        let mut ranges = std::mem::take(&mut self.ranges);
        ranges.clear();
        let result = self.write_ranges(writes, &mut ranges);
        self.ranges = ranges;
        result
    }

    /// `write_several`, with `ranges` to fill.
    fn write_ranges(
        &mut self,
        writes: &[(Ptr, u64, &[u8])],
        ranges: &mut Vec<(u64, usize)>,
    ) -> Result<(), HeapError> {
        for &(p, off, data) in writes {
            self.check(p, off, data.len() as u64)?;
            if self.fresh_len(p).is_none() && !data.is_empty() {
                ranges.push((p.0 + off, data.len()));
            }
        }
        let mut unlinked = false;
        for &(at, len) in ranges.iter() {
            unlinked |= self.unlink_within(at, at + len as u64)?;
        }
        let logged = self.log_old(ranges)?;
        if logged || unlinked {
            self.fence_records()?;
        }
        for &(p, off, data) in writes.iter().filter(|w| !w.2.is_empty()) {
            self.bytes.redo_equivalent += (REDO_OVERHEAD + data.len()) as u64;
            // A data-logged range was just read for its undo record: its lines are cached.
            let lines = if self.fresh_len(p).is_some() { Lines::Cold } else { Lines::Cached };
            self.write_in_place(p.0 + off, data, lines)?;
        }
        Ok(())
    }

    /// Writes `data` at `off` of the object at `p` without logging the bytes it overwrites:
    /// for bytes that neither the object's committed state nor anything this transaction
    /// wrote before uses (the gap of a slotted node). After a rollback they may hold
    /// anything, which is why nothing may use them. No fence comes first, for the same
    /// reason.
    pub fn write_unused(&mut self, p: Ptr, off: u64, data: &[u8]) -> Result<(), HeapError> {
        self.check(p, off, data.len() as u64)?;
        self.bytes.redo_equivalent += (REDO_OVERHEAD + data.len()) as u64;
        self.write_in_place(p.0 + off, data, Lines::Cold)
    }

    /// Saves the old bytes of `ranges` that this transaction has not saved yet (a later
    /// write into saved bytes needs no record: a rollback writes the first, original bytes
    /// back last), in one record of several ranges when they fit. Whether it logged any.
    fn log_old(&mut self, ranges: &[(u64, usize)]) -> Result<bool, HeapError> {
        let mut fresh = std::mem::take(&mut self.unsaved);
        fresh.clear();
        for &(at, len) in ranges {
            self.saved.unsaved(at, at + len as u64, &mut fresh);
        }
        let result = self.log_unsaved(&fresh);
        self.unsaved = fresh;
        result
    }

    /// `log_old` for the ranges not saved yet.
    fn log_unsaved(&mut self, fresh: &[(u64, usize)]) -> Result<bool, HeapError> {
        let together = fresh.iter().map(|r| record::UNDO_RANGE + r.1).sum::<usize>();
        if fresh.len() > 1 && together <= self.pool.log.max_record() - HEAD {
            self.log_undo_ranges(fresh)?;
        } else {
            for &(at, len) in fresh {
                self.log_undo(at, len)?;
            }
        }
        for &(at, len) in fresh {
            self.saved.add(at, at + len as u64);
        }
        Ok(!fresh.is_empty())
    }

    /// Saves the bytes of several ranges in one undo record: one append where each range
    /// would take its own.
    fn log_undo_ranges(&mut self, ranges: &[(u64, usize)]) -> Result<(), HeapError> {
        let record = self.log(kind::UNDO_RANGES, |rec, region| {
            for &(at, len) in ranges {
                record::put_undo_range(rec, region.bytes(), at, len);
            }
        })?;
        for &(at, len) in ranges {
            self.undo.push(Undo::Bytes { at, len, record });
        }
        Ok(())
    }

    /// Saves the `len` bytes at `at` in undo records (as many as the record size needs).
    fn log_undo(&mut self, at: u64, len: usize) -> Result<(), HeapError> {
        let room = self.pool.log.max_record() - HEAD - 8;
        let mut done = 0;
        while done < len {
            let n = room.min(len - done);
            let from = at as usize + done;
            let record = self.log(kind::UNDO, |rec, region| {
                rec.put_u64(from as u64);
                rec.put_bytes(&region.bytes()[from..from + n]);
            })?;
            self.undo.push(Undo::Bytes { at: from as u64, len: n, record });
            done += n;
        }
        Ok(())
    }

    fn write_in_place(&mut self, at: u64, data: &[u8], lines: Lines) -> Result<(), HeapError> {
        let region = self.pool.log.region_mut();
        if lines == Lines::Cold && data.len() >= STREAM_MIN {
            // Past a few lines, non-temporal stores: no read for ownership of lines that are
            // not cached (a pointer-logged write's new block never is: freed blocks cool
            // before reuse), and no write-back to issue.
            region.write_streaming(at as usize, data)?;
        } else {
            region.write(at as usize, data)?;
            region.flush(at as usize, data.len())?;
        }
        self.note_written(at, data);
        self.state = TxState::Writing;
        Ok(())
    }

    /// The 8-byte pointer slot at `off` of the object at `obj`.
    pub fn slot(&self, obj: Ptr, off: u64) -> Result<Slot, HeapError> {
        self.check(obj, off, 8)?;
        if !(obj.0 + off).is_multiple_of(8) {
            return Err(HeapError::Misaligned { at: obj.0 + off });
        }
        Ok(Slot { at: obj.0 + off })
    }

    /// The pool's root slot.
    pub fn root_slot(&self) -> Slot {
        self.pool.root_slot()
    }

    /// What a pointer slot holds, unchecked (see [`get_checked`](Self::get_checked)).
    pub fn get(&self, slot: Slot) -> Ptr {
        Ptr(bitmend_code::le::get_u64(self.pool.log.region().bytes(), slot.at as usize))
    }

    /// What a pointer slot holds, its bytes checked as every read of a transaction is: a
    /// damaged pointer followed would lead the transaction to write where it must not.
    pub fn get_checked(&self, slot: Slot) -> Result<Ptr, HeapError> {
        self.check_once(slot.at, 8)?;
        Ok(self.get(slot))
    }

    /// Points `slot` at `p` (the slot's old value data-logged).
    pub fn set(&mut self, slot: Slot, p: Ptr) -> Result<(), HeapError> {
        self.bytes.redo_equivalent += (REDO_OVERHEAD + 8) as u64;
        let unlinked = self.unlink_within(slot.at, slot.at + 8)?;
        if self.log_old(&[(slot.at, 8)])? || unlinked {
            self.fence_records()?;
        }
        self.write_in_place(slot.at, &p.0.to_le_bytes(), Lines::Cached)
    }

    /// Writes `data` at `off` of the object `slot` points to, as MinL2R chooses: a write that
    /// changes half of the object or more is pointer-logged (a new block gets the object with
    /// the change, the slot is swung to it, only the old pointer is logged, and the old block
    /// is released at checkout); a smaller one is data-logged. Returns where the object is now.
    pub fn write_through(&mut self, slot: Slot, off: u64, data: &[u8]) -> Result<Ptr, HeapError> {
        let old = self.get(slot);
        let len = self.size_of(old)?;
        self.check(old, off, data.len() as u64)?;
        if self.fresh_len(old).is_some() || (data.len() as u64) * 2 < len {
            self.write(old, off, data)?;
            return Ok(old);
        }
        self.bytes.redo_equivalent += (REDO_OVERHEAD + data.len()) as u64;
        // The new block: the old object with the change, each byte written once.
        let end = off + data.len() as u64;
        self.swing(slot, old, len, |tx, new| {
            tx.copy_within(old.0, new.0, off)?;
            tx.write_in_place(new.0 + off, data, Lines::Cold)?;
            tx.copy_within(old.0 + end, new.0 + end, len - end)
        })
    }

    /// Replaces the object `slot` points to with a new version that holds `parts` (offset,
    /// bytes) and nothing else: bytes no part covers are left as they are in the new block,
    /// for a caller that never reads them (the gap of a slotted node). Pointer-logged like
    /// a [`write_through`](Self::write_through) of the whole object, but only the parts are
    /// written (and patched into parity); an object this transaction allocated is written
    /// in place. Returns where the object is now.
    pub fn rewrite(&mut self, slot: Slot, parts: &[(u64, &[u8])]) -> Result<Ptr, HeapError> {
        let old = self.get(slot);
        let len = self.size_of(old)?;
        for &(off, data) in parts {
            self.check(old, off, data.len() as u64)?;
        }
        if self.fresh_len(old).is_some() {
            let writes: Vec<(Ptr, u64, &[u8])> = parts.iter().map(|&(off, d)| (old, off, d)).collect();
            self.write_several(&writes)?;
            return Ok(old);
        }
        self.bytes.redo_equivalent += (REDO_OVERHEAD as u64) + len;
        self.swing(slot, old, len, |tx, new| {
            for &(off, data) in parts.iter().filter(|p| !p.1.is_empty()) {
                tx.write_in_place(new.0 + off, data, Lines::Cold)?;
            }
            Ok(())
        })
    }

    /// Pointer logging: a new block of `len` bytes, filled by `fill`, takes the place of
    /// `old` in `slot`; only the slot's old and new pointer are logged, and the old block is
    /// released at checkout.
    fn swing(
        &mut self,
        slot: Slot,
        old: Ptr,
        len: u64,
        fill: impl FnOnce(&mut Self, Ptr) -> Result<(), HeapError>,
    ) -> Result<Ptr, HeapError> {
        // The slot is swung, and the old object's slots move with it: their links go
        // (durable by the fence before the swing).
        self.unlink_within(slot.at, slot.at + 8)?;
        self.unlink_within(old.0, old.0 + len)?;
        let new = self.take_block(len)?;
        let logged = self.log(kind::POINTER, |rec, _| {
            rec.put_u64(slot.at);
            rec.put_u64(old.0);
            rec.put_u64(new.0);
        });
        if let Err(e) = logged {
            self.pool.alloc.unpick(new);
            return Err(e);
        }
        self.undo.push(Undo::Pointer { slot: slot.at, old, new });
        self.take_fresh(new, len);
        // The new block is a free block's payload until its header says otherwise: no
        // fence is needed before it is written (but in a pool that heals, see below).
        self.fence_fresh()?;
        fill(self, new)?;
        self.fence_records()?;
        self.write_in_place(slot.at, &new.0.to_le_bytes(), Lines::Cached)?;
        self.replaced.push(old);
        Ok(new)
    }

    /// Copies `len` bytes of the region from `from` to `to` (ranges that do not overlap).
    fn copy_within(&mut self, from: u64, to: u64, len: u64) -> Result<(), HeapError> {
        if len == 0 {
            return Ok(());
        }
        let mut copy = std::mem::take(&mut self.pool.copy);
        copy.clear();
        copy.extend_from_slice(&self.pool.log.region().bytes()[from as usize..(from + len) as usize]);
        let result = self.write_in_place(to, &copy, Lines::Cold);
        self.pool.copy = copy;
        result
    }

    /// The whole object at `p`, through the pool (this transaction's writes included).
    pub fn object(&self, p: Ptr) -> Result<&[u8], HeapError> {
        let len = self.size_of(p)?;
        self.check_once(p.0, len)?;
        Ok(&self.pool.log.region().bytes()[p.0 as usize..(p.0 + len) as usize])
    }

    /// The whole object at `p`, its bytes not checked (its header is): the caller checks
    /// the parts it reads with [`check_parts`](Self::check_parts) before it uses them.
    pub(crate) fn object_unchecked(&self, p: Ptr) -> Result<&[u8], HeapError> {
        let len = self.size_of(p)?;
        Ok(&self.pool.log.region().bytes()[p.0 as usize..(p.0 + len) as usize])
    }

    /// Checks the parts (`(offset, len)` pairs) of the object at `p` that a search read.
    pub(crate) fn check_parts(&self, p: Ptr, parts: &[(usize, usize)]) -> Result<(), HeapError> {
        if !self.pool.heals() {
            return Ok(());
        }
        self.pool.check_tx_parts(p, parts)
    }

    /// Reads through the pool (this transaction's writes included).
    pub fn read(&self, p: Ptr, off: u64, len: u64) -> Result<&[u8], HeapError> {
        self.check(p, off, len)?;
        let at = (p.0 + off) as usize;
        self.check_once(at as u64, len)?;
        Ok(&self.pool.log.region().bytes()[at..at + len as usize])
    }

    /// Commits. A small transaction's commit record carries the CRC of every range it wrote
    /// in place, and one fence makes the writes and the record durable together; a large
    /// one's writes are fenced before its commit record. The frees are applied after it. A
    /// commit record that cannot be logged leaves the transaction to [`abort`](Self::abort).
    pub(crate) fn commit(&mut self) -> Result<LogBytes, HeapError> {
        if self.state == TxState::Begin {
            return Ok(self.bytes);
        }
        self.fence_records()?;
        let small = self.written.len() <= MAX_RANGES && self.written_bytes <= CHECKSUM_MAX;
        if small && !self.releases_written()? {
            let ranges = std::mem::take(&mut self.written);
            let crc = match self.overlap {
                true => Written::crc_of(self.pool.log.region().bytes(), &ranges),
                false => self.written_crc,
            };
            let w = Written { crc, ranges };
            debug_assert!(w.matches(self.pool.log.region().bytes()), "a commit vouches for what is there");
            self.log(kind::COMMIT, |rec, _| record::put_written(rec, &w))?;
            // The vouched ranges' old vector comes back as this one's (no allocation).
            self.written = std::mem::replace(&mut self.pool.vouched, w.ranges);
        } else {
            self.pool.log.region_mut().fence()?;
            self.log(kind::COMMIT, |_, _| {})?;
            self.pool.vouched.clear();
        }
        self.pool.log.region_mut().fence()?;
        self.unfenced = false;
        self.state = TxState::Commit;
        let region = self.pool.log.region_mut();
        for &p in &self.frees {
            self.pool.alloc.free(region, p)?;
        }
        self.pool.note_finished(&mut self.replaced, self.bytes)?;
        Ok(self.bytes)
    }

    /// Whether a block this transaction frees, or releases after a pointer-logged write,
    /// holds bytes it wrote. After the commit such a block's header is rewritten free, and
    /// later its payload may be reused, before any fence: the writes would no longer match a
    /// checksummed commit that is still the journal's last record, and recovery would undo a
    /// committed transaction. Such a transaction's commit is fenced instead.
    fn releases_written(&self) -> Result<bool, HeapError> {
        for &p in self.frees.iter().chain(&self.replaced) {
            let (start, end) = (p.header(), p.0 + self.size_of(p)?);
            if self.written.iter().any(|&(at, len)| at < end && start < at + len as u64) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Rolls back what this process wrote (as recovery would), then checks out: the
    /// journal is trimmed past this transaction, so that no later recovery applies its undo
    /// records over what later transactions write.
    pub(crate) fn abort(mut self) -> Result<(), HeapError> {
        if self.state == TxState::Begin {
            return Ok(());
        }
        let undo = std::mem::take(&mut self.undo);
        self.pool.roll_back(&undo)?;
        self.pool.checkout()
    }
}

impl<R: Region> Drop for Tx<'_, R> {
    /// The vectors go back to the pool, emptied, for the next transaction.
    fn drop(&mut self) {
        let mut b = TxBuffers {
            fresh: std::mem::take(&mut self.fresh),
            headers_due: std::mem::take(&mut self.headers_due),
            undo: std::mem::take(&mut self.undo),
            saved: std::mem::take(&mut self.saved.0),
            frees: std::mem::take(&mut self.frees),
            replaced: std::mem::take(&mut self.replaced),
            written: std::mem::take(&mut self.written),
            ranges: std::mem::take(&mut self.ranges),
            unsaved: std::mem::take(&mut self.unsaved),
        };
        b.fresh.clear();
        b.headers_due.clear();
        b.undo.clear();
        b.saved.clear();
        b.frees.clear();
        b.replaced.clear();
        b.written.clear();
        self.pool.tx_buffers = b;
    }
}

/// Disjoint ranges `[start, end)` of the pool, in order.
#[derive(Debug, Default)]
struct Saved(Vec<(u64, u64)>);

impl Saved {
    /// The parts of `[start, end)` not in the set, appended to `out` as (offset, length).
    fn unsaved(&self, start: u64, end: u64, out: &mut Vec<(u64, usize)>) {
        let mut at = start;
        let first = self.0.partition_point(|r| r.1 <= start);
        for &(s, e) in &self.0[first..] {
            if s >= end {
                break;
            }
            if s > at {
                out.push((at, (s - at) as usize));
            }
            at = at.max(e);
        }
        if at < end {
            out.push((at, (end - at) as usize));
        }
    }

    /// Adds `[start, end)`, merged with the ranges it touches.
    fn add(&mut self, start: u64, end: u64) {
        let from = self.0.partition_point(|r| r.1 < start);
        let to = self.0.partition_point(|r| r.0 <= end);
        let (mut s, mut e) = (start, end);
        if from < to {
            s = s.min(self.0[from].0);
            e = e.max(self.0[to - 1].1);
        }
        self.0.splice(from..to, [(s, e)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The set against a byte map, over random ranges.
    #[test]
    fn saved_ranges_are_what_was_added_and_nothing_else() {
        let mut rng = bitmend_media::rng::Rng::new(9);
        let mut set = Saved::default();
        let mut map = vec![false; 600];
        for _ in 0..400 {
            let a = rng.below(580);
            let b = a + 1 + rng.below(20);
            let mut out = Vec::new();
            set.unsaved(a, b, &mut out);
            let want: Vec<u64> = (a..b).filter(|&i| !map[i as usize]).collect();
            let got: Vec<u64> = out.iter().flat_map(|&(at, len)| at..at + len as u64).collect();
            assert_eq!(got, want, "unsaved {a}..{b}");
            set.add(a, b);
            (a..b).for_each(|i| map[i as usize] = true);
            assert!(set.0.windows(2).all(|w| w[0].1 < w[1].0), "disjoint, apart, in order: {:?}", set.0);
        }
    }
}
