//! Mounting: the newest checkpoint found, the log after it replayed (`replay.rs`: the one
//! reader of every on-flash version the file system has had), then what an NVRAM tier held
//! applied on top (`tier.rs`). What each found is reported, and what fails verification is
//! named and never applied.

pub(crate) mod checkpoint;
mod replay;
mod tier;

use crate::StoreMountReport;

/// What mounting found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountReport {
    pub store: StoreMountReport,
    /// Data pages replayed.
    pub pages: u64,
    /// Nodes applied.
    pub nodes: u64,
    /// Pages repaired on the way (their nodes were still read).
    pub pages_repaired: u64,
    /// Pages beyond repair: their nodes are lost (and any node spanning them).
    pub pages_lost: u64,
    /// Pages with an unreadable spare outside any closed group: torn programs, skipped.
    pub pages_skipped: u64,
    /// Nodes whose fragments were not all found (cut by a crash, or on a lost page).
    pub partial_nodes: u64,
    /// Replay started at a checkpoint (not at the beginning of the log).
    pub from_checkpoint: bool,
    /// Index chunks whose map node the mount read (replay keeps the pages it finds beside
    /// maps not yet read; only a replayed shrink or removal reads them).
    pub maps_loaded: u64,
    /// Superblock copies found damaged, and rewritten from the good superblock.
    pub superblocks_damaged: u64,
    pub superblocks_rewritten: u64,
}

/// What a tier held at mount, in the order it was recorded.
#[derive(Clone, Debug, Default)]
pub struct DirtyRecovery {
    /// The id of the file system the state belongs to, as the tier recorded it (none: not
    /// recorded). A mount refuses another file system's state.
    pub owner: Option<u64>,
    /// Metadata records (each as [`DirtyState::put_nodes`] received it), oldest first.
    pub records: Vec<Vec<u8>>,
    /// Dirty pages, each verified by the tier against its CRC: (ino, index, bytes, crc).
    pub pages: Vec<(u64, u64, Vec<u8>, u32)>,
    /// Inodes still open through the connection the mount takes over (a supervisor's,
    /// after its worker died): one unlinked while open is kept, without a link, as the mount
    /// that died had it, instead of being let go as a mount lets go of every such file.
    pub held_open: Vec<u64>,
}

/// What [`Fs::open_recovering`] did with a tier's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirtyRecoveryReport {
    /// Nodes applied, and nodes already on flash (older than what the flash holds).
    pub nodes_applied: u64,
    pub nodes_on_flash: u64,
    /// Nodes that did not decode or are of a kind a tier never holds: never applied.
    pub nodes_refused: u64,
    /// Pages put back as dirty, and pages dropped: their file is gone, or they lie past its
    /// end (a write cut by the crash before its new size was recorded).
    pub pages: u64,
    pub pages_dropped: Vec<(u64, u64)>,
    /// Pages put back cut at their file's size (the tier holds them uncut until
    /// [`Fs::reconcile_dirty_state`]).
    pub pages_cut: Vec<(u64, u64)>,
}
