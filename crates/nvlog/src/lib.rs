//! # bitmend-nvlog
//!
//! The PRIMS erasure-encoded log (Greenan and Miller, HotDep'07) on a persistent-memory
//! [`Region`](bitmend_media::pmem::Region): the place where metadata that must never be lost
//! lives.
//!
//! The log is a ring of fixed-size segments, each of k data chunks and m parity chunks
//! (Reed–Solomon, from `bitmend-code`). Records are appended to the live data chunk; each
//! append writes the record and adds its parity delta to the m parity chunks over the same
//! bytes only, then fences once. Every closed chunk has an algebraic signature in its
//! segment's header, and the signatures commute with the parity, so a scrubber checks a
//! segment's signatures against each other without reading it, and a chunk against its
//! signature on every read. A chunk that fails is rebuilt from the rest of its segment;
//! up to m bad chunks per segment are corrected, whatever the damage inside each. Beyond that
//! the damaged chunks are reported and nothing of them is returned.
//!
//! Crash consistency: a record is durable when `append` returns. After a crash
//! [`NvLog::open`] finds the tail from the records' CRCs and the parity, discards a torn
//! append, and reports what it did ([`RecoveryReport`]). Layout: docs/FORMAT.md, "PRIMS log".

#![forbid(unsafe_code)]

mod error;
mod layout;
mod log;
mod record;
mod recover;
mod repair;
mod scrub;

pub use error::LogError;
pub use layout::{LogConfig, LOG_VERSION};
pub use log::{Cause, Repair};
pub use log::{LogStats, NvLog, Record};
pub use record::HEADER as RECORD_HEADER;
pub use recover::RecoveryReport;
pub use scrub::{LogScrubReport, ScrubTotals, Scrubber};

/// A record's position in the log: its byte offset in the log's record space, increasing
/// with every append and never reused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordId(pub u64);

impl std::fmt::Display for RecordId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}
