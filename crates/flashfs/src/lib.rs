//! # bitmend-flashfs
//!
//! RCFFS (Kang and Miller, EMSOFT'09) on a raw [`Nand`](bitmend_media::nand::Nand): a
//! log-structured file system whose every page is signed in its spare area and protected by
//! parity pages in its erase block and parity blocks in its segment, so that it corrects what
//! the chip's ECC cannot: many flipped bits, lost pages, torn writes.
//!
//! Two layers:
//! - the [`PageStore`] writes pages as a log of segments, signs them, adds the parity, mounts
//!   from a bounded number of spare reads, and verifies and repairs every read;
//! - the file system [`Fs`] writes inodes, directory entries, extended attributes and
//!   (compressed) file data as nodes into that log, keeps an index of where every logical
//!   page lives in map nodes on the flash with a bounded window of them in RAM (with the
//!   CRC-32C of every logical page, checked end to end), writes checkpoints, cleans segments,
//!   scrubs, checks, and offers the POSIX-like operations.

#![forbid(unsafe_code)]

mod error;
mod fs;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod store;

pub use fs::node::{Attr, FileType};
pub use fs::{
    CacheCheck, CacheStats, Cached, CheckReport, Compression, DirEntry, DirtyRecovery, DirtyRecoveryReport,
    DirtyState, DirtyStateError, Falloc, Fs, FsOptions, FsStats, Health, Ino, MountReport, PagePut,
    PreparedWrite, QuickScrubReport, ReadPlan, ScrubPass, ScrubReport, SetAttr, StateCheck, TierFill,
    TierWrite, Verify, XattrMode, BACKGROUND_HARD_LIMIT, BACKGROUND_WAIT_LIMIT, CHECKPOINT_FLUSH_MOST,
    CHUNK_PAGES, DEFAULT_CACHE_PAGES, DEFAULT_INDEX_CHUNKS, DEFAULT_LZ4_LEVEL, DEFAULT_NAMESPACE_CACHE,
    DEFAULT_NODE_PAGES, INLINE_TARGET_MAX, LOGICAL_PAGE, MAX_LZ4_LEVEL, MAX_NODE_PAGES, NAME_MAX, ROOT,
    SYMLINK_MAX, TICK, XATTR_NAME_MAX,
};

pub use error::{Corruption, FormatError, FsError, PosixError};
pub use store::layout::{FsConfig, Kind, Spare, FS_VERSION, MIN_SPARE};
pub use store::mount::{PageHealth, StoreMountReport};
pub use store::superblock::{recorded_geometry, SuperblockCopy};
pub use store::{PageAddr, PageStore, Repaired, Segment, SigCheck, StoreStats};
