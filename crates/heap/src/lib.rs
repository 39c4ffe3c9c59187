//! # bitmend-heap
//!
//! A persistent heap on a [`Region`](bitmend_media::pmem::Region) (NVDIMM, CXL, DAX, or an
//! mmap'd file): NVMalloc's allocator (checksummed block headers, working state in DRAM, a
//! don't-allocate list against wear), MinL2R's minimal-logging transactions with the PRIMS log
//! (`bitmend-nvlog`) as their journal, and an ordered key-value store on top.
//!
//! The pool is one region: the journal from offset 0, then the pool header page and the runs
//! of blocks (docs/FORMAT.md section 9). One fence orders the journal and the data it
//! protects.

#![forbid(unsafe_code)]

mod alloc;
mod error;
pub mod heal;
pub mod kv;
mod layout;
mod link;
mod open;
mod pool;
mod record;
mod recover;
mod superblocks;
mod tx;

pub use alloc::{AllocStats, BadHeader, Clock, Ptr};
pub use error::HeapError;
pub use heal::{HealStats, Healed, ReadCheck, ScrubPass, ScrubReport, StripeShape};
pub use layout::{HeaderFault, HEAP_VERSION, RUN};
pub use pool::{OpenReport, Pool, PoolOptions};
pub use tx::{LogBytes, Slot, Tx, TxState, REDO_OVERHEAD};
