//! What a transaction leaves in the pool and the pool keeps for the next: the states, the
//! slots, the log's byte counts, the undo actions a rollback takes, and the buffers a
//! transaction borrows. The pool holds these; the transactions themselves (`mod.rs`) hold
//! the pool.

use bitmend_nvlog::RecordId;

use crate::alloc::Ptr;
use crate::record::HEAD;

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

/// A transaction's vectors, kept by the pool between transactions (empty), so that a small
/// transaction allocates nothing on the heap.
#[derive(Debug, Default)]
pub(crate) struct TxBuffers {
    pub(super) fresh: Vec<(Ptr, u64)>,
    pub(super) headers_due: Vec<(Ptr, u64)>,
    pub(super) undo: Vec<Undo>,
    pub(super) saved: Vec<(u64, u64)>,
    pub(super) frees: Vec<Ptr>,
    pub(super) replaced: Vec<Ptr>,
    pub(super) written: Vec<(u64, u32)>,
    pub(super) ranges: Vec<(u64, usize)>,
    pub(super) unsaved: Vec<(u64, usize)>,
}

#[derive(Clone, Debug)]
pub(crate) enum Undo {
    /// `len` bytes at `at`, whose old bytes are in journal record `record`.
    Bytes {
        at: u64,
        len: usize,
        record: RecordId,
    },
    Alloc(Ptr),
    Pointer {
        slot: u64,
        old: Ptr,
        new: Ptr,
    },
}

/// A redo record's bytes besides its data: the fixed part and the offset.
pub const REDO_OVERHEAD: usize = HEAD + 8;
