//! The heap's errors: one enum, the journal's and the region's converted at the boundary.

use bitmend_media::pmem::RegionError;
use bitmend_nvlog::LogError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeapError {
    #[error("{0}")]
    Region(#[from] RegionError),
    #[error("journal: {0}")]
    Log(#[from] LogError),
    /// The region holds no pool (or not one this build reads).
    #[error("not a bitmend pool: {why}")]
    NotAPool { why: String },
    #[error("pool format version {found}; this build reads up to {supported}")]
    Version { found: u32, supported: u32 },
    /// The region is too small for the journal, the pool header and one run.
    #[error("a region of {len} bytes is too small for a pool (at least {needed})")]
    RegionTooSmall { len: usize, needed: usize },
    /// No free block (or run) is left for an allocation of `len` bytes: nothing of the
    /// operation that asked was applied.
    #[error("the pool is full: no room for {len} more bytes")]
    Full { len: u64 },
    /// A transaction's records filled the journal (of `journal` bytes; a transaction begins
    /// with at least a quarter of it free): nothing of it was applied, and it must be split
    /// into smaller ones.
    #[error(
        "a transaction's records fill the pool's journal of {journal} bytes: split it into smaller ones"
    )]
    JournalFull { journal: u64 },
    /// An object larger than the pool could ever hold.
    #[error("an object of {len} bytes is over the limit of {max}")]
    TooLarge { len: u64, max: u64 },
    /// A key longer than a store takes.
    #[error("a key of {len} bytes is over the limit of {max} bytes a key may have")]
    KeyTooLong { len: u64, max: u64 },
    /// A pointer that is not the payload of an allocated block.
    #[error("{at:#x} is not an allocated block")]
    NotAllocated { at: u64 },
    /// A structure in the pool that does not read as what it should be.
    #[error("{what} at {at:#x} is damaged")]
    Corrupt { at: u64, what: &'static str },
    /// A pointer slot must be 8-byte aligned (an aligned 8-byte store is never torn).
    #[error("a pointer slot at {at:#x} is not 8-byte aligned")]
    Misaligned { at: u64 },
    /// A stripe shape out of range (k 1 to 64 data pages, m 0 to 4 parity pages).
    #[error("a stripe of {k} data pages and {m} parity pages: k must be 1 to 64, m 0 to 4")]
    BadShape { k: u8, m: u8 },
    /// Bytes on pages that failed their signature and could not be rebuilt (more bad pages
    /// in their stripe than it has parity pages). Nothing wrong is returned.
    #[error("{len} bytes at {at:#x} are on damaged page(s) {pages:?} beyond repair")]
    Damaged { at: u64, len: u64, pages: Vec<u64> },
    /// A read or write past the end of its block.
    #[error("{len} bytes at {off} are past the {cap}-byte block at {at:#x}")]
    OutOfBounds { at: u64, off: u64, len: u64, cap: u64 },
}
