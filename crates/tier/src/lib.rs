//! # bitmend-tier
//!
//! The NVRAM write tier: dirty state of the flash file system, kept durable in a
//! persistent-memory region instead of process memory (docs/DESIGN.md, "The tier under
//! write-back"; Loris section V; PRIMS's argument for an NVRAM tier in front of slow
//! storage).
//!
//! Two regions, which may be two windows of one file:
//! - the **slots**, a `bitmend-heap` pool. Each dirty logical page has a slot, holding the
//!   page and a trailer with its CRC-32C and whose page it is. The new pages of one write
//!   share run objects allocated by NVMalloc (up to 63 slots each: one allocation, one
//!   transaction and one record per object, not per page). A slot is changed only by MinL2R
//!   transactions. A small change is data-logged in place, so the page and its CRC change
//!   together or not at all. A large one goes to a new slot, so that a crash leaves the old
//!   page or the new one, never a mix; an object is freed with its last named page.
//! - the **dirty state store**, a PRIMS log (`bitmend-nvlog`: erasure-coded, signed). Its
//!   records say which slot holds which page and which pages were dropped. A checkout, once
//!   the file system has written the pages to flash, trims the log and frees the slots.
//!
//! Recovery ([`DirtyTier::open`]) trusts nothing it cannot verify. Each page a record names
//! is returned only if its slot parses, names the same page, and matches its CRC; the rest
//! are named in [`Recovered::unverified`]. It never guesses at bytes.

mod mount;
mod record;
mod store;

pub use mount::{crash, mount, mount_holding, TierMountError, TierReport, TieredFs};
pub use record::{Entry, TAG};
pub use store::{DirtyTier, PagePut, Recovered, RecoveredPage, TierStats, PAGE, SLOT};

use bitmend_heap::HeapError;
use bitmend_nvlog::LogError;

/// What can go wrong in the tier.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    #[error("dirty state store: {0}")]
    Log(#[from] LogError),
    #[error("dirty page slots: {0}")]
    Heap(#[from] HeapError),
    /// The region has no room for another dirty page, or another record: the file system
    /// must write back to flash and check out before it takes more.
    #[error("the NVRAM region is full: write back to flash to make room")]
    Full,
    #[error("invalid: {why}")]
    Invalid { why: String },
}

impl TierError {
    /// Whether this is the region running out of room (a normal state: write back and check
    /// out), not a fault.
    pub fn is_full(&self) -> bool {
        matches!(
            self,
            TierError::Full
                | TierError::Log(LogError::Full { .. })
                | TierError::Heap(HeapError::Full { .. } | HeapError::JournalFull { .. })
        )
    }
}
