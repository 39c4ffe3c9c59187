//! The log's errors.

use bitmend_media::pmem::RegionError;

use crate::RecordId;

/// Errors of the encoded log. The caller's mistakes, a full log, and damage beyond the
/// redundancy are distinct variants; the medium's own failures arrive as [`LogError::Region`].
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(transparent)]
    Region(#[from] RegionError),
    #[error("invalid log configuration: {why}")]
    Config { why: String },
    #[error("the region holds no bitmend log: {why}")]
    NotALog { why: String },
    #[error("log format version {found}; this build reads version {supported}")]
    Version { found: u32, supported: u32 },
    #[error("the region is {len} bytes; this log needs {needed}")]
    RegionTooSmall { len: usize, needed: usize },
    /// Every segment holds live records: trim the head first.
    #[error("the log is full: trim records before {head} to make room")]
    Full { head: RecordId },
    #[error("record of {len} bytes is larger than the {max} a chunk holds")]
    RecordTooLarge { len: usize, max: usize },
    #[error("no record starts at {id}")]
    NoSuchRecord { id: RecordId },
    #[error("record {id} was trimmed (the head is at {head})")]
    Trimmed { id: RecordId, head: RecordId },
    #[error("trim point {to} is outside [{head}, {tail}]")]
    TrimRange { to: RecordId, head: RecordId, tail: RecordId },
    /// More chunks of a segment are damaged than its parity can rebuild; nothing of the
    /// damaged chunk is returned.
    #[error("chunk {chunk} of segment {segment} is damaged beyond the code's redundancy")]
    Unrecoverable { segment: u64, chunk: usize },
    /// An append's stores failed part way (the medium lost power, or an I/O error): what the
    /// medium holds past the tail is unknown, so the log takes no more records until it is
    /// opened again (which recovers it).
    #[error("an earlier append failed part way; open the log again to recover it")]
    Interrupted,
}
