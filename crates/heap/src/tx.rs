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

use std::collections::BTreeSet;

use bitmend_code::le::{Put, Reader};
use bitmend_media::pmem::Region;

use crate::alloc::{Plan, Ptr};
use crate::pool::Pool;
use crate::HeapError;

/// The journal tag of the heap's records.
pub(crate) const TAG: u16 = 0x4854;

/// A record's kind (its first byte), FORMAT.md section 9, "Journal records".
pub(crate) mod kind {
    /// Read, not written: a transaction's first record is its begin.
    pub const BEGIN: u8 = 1;
    pub const UNDO: u8 = 2;
    pub const ALLOC: u8 = 3;
    pub const FREE: u8 = 4;
    pub const POINTER: u8 = 5;
    pub const COMMIT: u8 = 6;
    pub const FORMAT: u8 = 7;
}

/// Where a transaction is (MinL2R's states).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxState {
    Begin,
    Logging,
    Writing,
    Commit,
    Checkout,
}

/// A persistent pointer slot: 8 bytes at `off` of the object at `obj` (or the pool's root
/// slot), through which [`Tx::write_through`] can swap a block for a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub(crate) at: u64,
}

/// Log bytes by kind, for one transaction or summed (MinL2R's Figure 3 compares them with
/// redo logging of the same writes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogBytes {
    /// Old bytes data logging saved.
    pub undo: u64,
    /// Pointer records (old and new pointer).
    pub pointer: u64,
    /// Allocation, free, begin and commit records.
    pub other: u64,
    /// What redo logging of the same writes would have logged: a record of every new byte,
    /// with the same record overhead as an undo record.
    pub redo_equivalent: u64,
}

/// A transaction in progress; see [`Pool::tx`].
pub struct Tx<'p, R: Region> {
    pool: &'p mut Pool<R>,
    id: u64,
    pub(crate) state: TxState,
    /// Blocks allocated by this transaction (written without undo: rollback frees them).
    fresh: BTreeSet<Ptr>,
    /// Undo actions in order, for a rollback in this process.
    undo: Vec<Undo>,
    frees: Vec<Ptr>,
    /// Old blocks of pointer-logged writes, released at checkout.
    replaced: Vec<Ptr>,
    pub(crate) bytes: LogBytes,
}

#[derive(Clone, Debug)]
pub(crate) enum Undo {
    Bytes { at: u64, old: Vec<u8> },
    Alloc(Ptr),
    Pointer { slot: u64, old: Ptr, new: Ptr },
}

/// Bytes of a record's fixed part: kind and transaction id.
const HEAD: usize = 9;
/// A redo record's bytes besides its data: the fixed part and the offset.
pub const REDO_OVERHEAD: usize = HEAD + 8;

impl<'p, R: Region> Tx<'p, R> {
    pub(crate) fn new(pool: &'p mut Pool<R>, id: u64) -> Tx<'p, R> {
        Tx {
            pool,
            id,
            state: TxState::Begin,
            fresh: BTreeSet::new(),
            undo: Vec::new(),
            frees: Vec::new(),
            replaced: Vec::new(),
            bytes: LogBytes::default(),
        }
    }

    /// The state of the transaction (MinL2R's).
    pub fn state(&self) -> TxState {
        self.state
    }

    /// Appends a journal record of `kind` with `body`; durable when it returns. No record
    /// marks BEGIN: a transaction's first record carries its id, and recovery groups records
    /// by id (a begin record would cost a durable append, a fence, per transaction).
    fn log(&mut self, kind: u8, body: &[u8]) -> Result<(), HeapError> {
        let mut rec = Vec::with_capacity(HEAD + body.len());
        rec.put_u8(kind);
        rec.put_u64(self.id);
        rec.put_bytes(body);
        self.pool.log_append(&rec)?;
        match kind {
            kind::UNDO => self.bytes.undo += rec.len() as u64,
            kind::POINTER => self.bytes.pointer += rec.len() as u64,
            _ => self.bytes.other += rec.len() as u64,
        }
        if self.state == TxState::Begin {
            self.state = TxState::Logging;
        }
        Ok(())
    }

    /// Allocates a block of at least `len` payload bytes, its contents unspecified (zero if
    /// never used). Freed again if the transaction does not commit.
    pub fn alloc(&mut self, len: u64) -> Result<Ptr, HeapError> {
        let p = self.take_block(len)?;
        let mut body = Vec::with_capacity(16);
        body.put_u64(p.0);
        body.put_u64(len);
        if let Err(e) = self.log(kind::ALLOC, &body) {
            self.pool.alloc.unpick(p);
            return Err(e);
        }
        self.pool.alloc.mark_allocated(self.pool.log.region_mut(), p, len)?;
        self.fresh.insert(p);
        self.undo.push(Undo::Alloc(p));
        self.state = TxState::Writing;
        Ok(p)
    }

    /// A block for `len` bytes, taken from the allocator; a run it formats first is recorded
    /// in the journal before its headers are written (recovery finishes a torn format).
    fn take_block(&mut self, len: u64) -> Result<Ptr, HeapError> {
        let plan = self.pool.alloc.plan(len)?;
        let format = match plan {
            Plan::Block(_) => None,
            Plan::Run { run, class } => Some((run, class, 1)),
            Plan::Span { head, runs } => Some((head, 0, runs)),
        };
        if let Some((run, class, runs)) = format {
            let mut body = Vec::with_capacity(9);
            body.put_u32(run);
            body.put_u8(class);
            body.put_u32(runs);
            if let Err(e) = self.log(kind::FORMAT, &body) {
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
        let mut body = Vec::with_capacity(8);
        body.put_u64(p.0);
        self.log(kind::FREE, &body)?;
        self.frees.push(p);
        Ok(())
    }

    /// Writes `data` at `off` of the object at `p`: data logging (the bytes it overwrites go
    /// to the journal first; none for a block this transaction allocated).
    pub fn write(&mut self, p: Ptr, off: u64, data: &[u8]) -> Result<(), HeapError> {
        self.pool.check(p, off, data.len() as u64)?;
        self.bytes.redo_equivalent += (REDO_OVERHEAD + data.len()) as u64;
        let at = p.0 + off;
        if !self.fresh.contains(&p) {
            self.log_undo(at, data.len())?;
        }
        self.write_in_place(at, data)
    }

    /// Saves the `len` bytes at `at` in undo records (as many as the record size needs).
    fn log_undo(&mut self, at: u64, len: usize) -> Result<(), HeapError> {
        let room = self.pool.log.max_record() - HEAD - 8;
        let mut done = 0;
        while done < len {
            let n = room.min(len - done);
            let from = at as usize + done;
            let old = self.pool.log.region().bytes()[from..from + n].to_vec();
            let mut body = Vec::with_capacity(8 + n);
            body.put_u64(from as u64);
            body.put_bytes(&old);
            self.log(kind::UNDO, &body)?;
            self.undo.push(Undo::Bytes { at: from as u64, old });
            done += n;
        }
        Ok(())
    }

    fn write_in_place(&mut self, at: u64, data: &[u8]) -> Result<(), HeapError> {
        let region = self.pool.log.region_mut();
        region.write(at as usize, data)?;
        region.flush(at as usize, data.len())?;
        self.state = TxState::Writing;
        Ok(())
    }

    /// The 8-byte pointer slot at `off` of the object at `obj`.
    pub fn slot(&self, obj: Ptr, off: u64) -> Result<Slot, HeapError> {
        self.pool.check(obj, off, 8)?;
        if !(obj.0 + off).is_multiple_of(8) {
            return Err(HeapError::Misaligned { at: obj.0 + off });
        }
        Ok(Slot { at: obj.0 + off })
    }

    /// The pool's root slot.
    pub fn root_slot(&self) -> Slot {
        Slot { at: self.pool.root_slot() }
    }

    /// What a pointer slot holds.
    pub fn get(&self, slot: Slot) -> Ptr {
        Ptr(bitmend_code::le::get_u64(self.pool.log.region().bytes(), slot.at as usize))
    }

    /// Points `slot` at `p` (the slot's old value data-logged).
    pub fn set(&mut self, slot: Slot, p: Ptr) -> Result<(), HeapError> {
        self.bytes.redo_equivalent += (REDO_OVERHEAD + 8) as u64;
        self.log_undo(slot.at, 8)?;
        self.write_in_place(slot.at, &p.0.to_le_bytes())
    }

    /// Writes `data` at `off` of the object `slot` points to, as MinL2R chooses: a write that
    /// changes half of the block or more is pointer-logged (a new block gets the object with
    /// the change, the slot is swung to it, only the old pointer is logged, and the old block
    /// is released at checkout); a smaller one is data-logged. Returns where the object is now.
    pub fn write_through(&mut self, slot: Slot, off: u64, data: &[u8]) -> Result<Ptr, HeapError> {
        let old = self.get(slot);
        let cap = self.pool.size_of(old)?;
        self.pool.check(old, off, data.len() as u64)?;
        if self.fresh.contains(&old) || (data.len() as u64) * 2 < cap {
            self.write(old, off, data)?;
            return Ok(old);
        }
        self.bytes.redo_equivalent += (REDO_OVERHEAD + data.len()) as u64;
        let new = self.take_block(cap)?;
        let mut body = Vec::with_capacity(24);
        body.put_u64(slot.at);
        body.put_u64(old.0);
        body.put_u64(new.0);
        if let Err(e) = self.log(kind::POINTER, &body) {
            self.pool.alloc.unpick(new);
            return Err(e);
        }
        self.pool.alloc.mark_allocated(self.pool.log.region_mut(), new, cap)?;
        self.undo.push(Undo::Pointer { slot: slot.at, old, new });
        self.fresh.insert(new);
        // The new block: the old object with the change, written once.
        let mut object = self.pool.read(old, 0, cap)?.to_vec();
        object[off as usize..off as usize + data.len()].copy_from_slice(data);
        self.write_in_place(new.0, &object)?;
        self.write_in_place(slot.at, &new.0.to_le_bytes())?;
        self.replaced.push(old);
        Ok(new)
    }

    /// Reads through the pool (this transaction's writes included).
    pub fn read(&self, p: Ptr, off: u64, len: u64) -> Result<&[u8], HeapError> {
        self.pool.read(p, off, len)
    }

    /// Commits: the in-place writes are made durable, then the commit record; the frees are
    /// applied after it. A commit record that cannot be logged leaves the transaction to
    /// [`abort`](Self::abort).
    pub(crate) fn commit(&mut self) -> Result<LogBytes, HeapError> {
        if self.state == TxState::Begin {
            return Ok(self.bytes);
        }
        self.pool.log.region_mut().fence()?;
        self.log(kind::COMMIT, &[])?;
        self.state = TxState::Commit;
        let region = self.pool.log.region_mut();
        for p in std::mem::take(&mut self.frees) {
            self.pool.alloc.free(region, p)?;
        }
        self.pool.note_finished(std::mem::take(&mut self.replaced), self.bytes)?;
        Ok(self.bytes)
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

/// A journal record of the heap, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rec {
    Begin,
    Undo { at: u64, old: Vec<u8> },
    Alloc { p: Ptr, len: u64 },
    Free(Ptr),
    Pointer { slot: u64, old: Ptr, new: Ptr },
    Commit,
    Format { run: u32, class: u8, runs: u32 },
}

/// Decodes a heap record: (transaction, what); `None` for bytes that are not one.
pub(crate) fn decode(b: &[u8]) -> Option<(u64, Rec)> {
    let mut r = Reader::new(b);
    let k = r.u8()?;
    let id = r.u64()?;
    let rec = match k {
        kind::BEGIN => Rec::Begin,
        kind::UNDO => Rec::Undo { at: r.u64()?, old: r.rest().to_vec() },
        kind::ALLOC => Rec::Alloc { p: Ptr(r.u64()?), len: r.u64()? },
        kind::FREE => Rec::Free(Ptr(r.u64()?)),
        kind::POINTER => Rec::Pointer { slot: r.u64()?, old: Ptr(r.u64()?), new: Ptr(r.u64()?) },
        kind::COMMIT => Rec::Commit,
        kind::FORMAT => Rec::Format { run: r.u32()?, class: r.u8()?, runs: r.u32()? },
        _ => return None,
    };
    Some((id, rec))
}
