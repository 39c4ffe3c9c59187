//! # bitmend-flashfs
//!
//! RCFFS (Kang and Miller, EMSOFT'09) on a raw [`Nand`](bitmend_media::nand::Nand): a
//! log-structured file system whose every page is signed in its spare area and protected by
//! parity pages in its erase block and parity blocks in its segment, so that it corrects what
//! the chip's ECC cannot: many flipped bits, lost pages, torn writes.
//!
//! This crate grows in layers. The first is here: the [`PageStore`], which writes pages as a
//! log of segments, signs them, adds the parity, mounts from a bounded number of spare reads,
//! and verifies and repairs every read. The file system (nodes, index, compression, cleaner)
//! builds on it.

mod error;
mod layout;
mod mount;
mod read;
mod store;

pub use error::FsError;
pub use layout::{FsConfig, Kind, Spare, FS_VERSION, MIN_SPARE};
pub use mount::Mount;
pub use store::{PageAddr, PageStore, Repaired, StoreStats};
