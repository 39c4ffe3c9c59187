//! Space budgeting: the file system never acknowledges a write it cannot store
//! (docs/DESIGN.md, "A full chip").
//!
//! As UBIFS does, every operation that will need flash reserves it pessimistically before it
//! is acknowledged: a dirty logical page is counted at what it takes stored plain (its CRC,
//! a fragment header per flash page it may span, its map entry), and the space comes back
//! when write-back compresses it. The live bytes are what the index counts (data fragments,
//! map nodes) plus the checkpoint, twice (the newest and the one a mount may start from).
//!
//! The capacity leaves the cleaner what it needs to make progress at 100% full: its reserve
//! of free segments, the segment being written, and an eighth of the rest, so that the emptiest
//! segment is at most about seven-eighths live and cleaning one always frees room for more
//! than it moves. Deleting, truncating, renaming and unmounting reserve nothing: they free
//! space, and the slack pays for the pages they write until the cleaner gives it back.

use bitmend_media::nand::Nand;

use super::{Fs, LOGICAL_PAGE};
use crate::fs::node::FRAG_HEADER;
use crate::FsError;

/// Bytes of a map node per logical page, at most (a page's entry, uncompressed).
const MAP_ENTRY: u64 = 24;
/// Bytes a new name costs in the log and in the checkpoint, beyond the name itself (an
/// inode node, a dirent node, the parent's inode node; the inode and entry in the state).
const NAME_COST: u64 = 4 * FRAG_HEADER as u64 + 3 * 96;
/// The capacity is this fraction of the segments the cleaner may fill (see the module).
const FILL_NUM: u64 = 7;
const FILL_DEN: u64 = 8;

/// What the budget knows beyond the index: the checkpoint's size.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Budget {
    /// Bytes of the newest checkpoint, and inodes it held.
    ckpt_bytes: u64,
    ckpt_inodes: u64,
}

impl Budget {
    /// Records a checkpoint written or read: `bytes` on the flash, holding `inodes`.
    pub fn checkpoint(&mut self, bytes: u64, inodes: usize) {
        self.ckpt_bytes = bytes;
        self.ckpt_inodes = inodes as u64;
    }

    /// Bytes of the newest checkpoint on the flash.
    pub fn checkpoint_bytes(&self) -> u64 {
        self.ckpt_bytes
    }

    /// Inodes the newest checkpoint held.
    pub fn checkpoint_inodes(&self) -> u64 {
        self.ckpt_inodes
    }
}

impl<N: Nand> Fs<N> {
    /// Flash bytes a dirty logical page takes at worst once written.
    pub(crate) fn page_cost(&self) -> u64 {
        let payload = LOGICAL_PAGE as u64 + 4;
        let room = (self.page.size() - FRAG_HEADER) as u64;
        // A node may start anywhere in a page: one fragment more than its length needs.
        let frags = payload.div_ceil(room) + 1;
        payload + frags * FRAG_HEADER as u64 + MAP_ENTRY
    }

    /// Bytes of live data and metadata the file system may hold (statfs's total).
    pub(crate) fn capacity(&self) -> u64 {
        let held_back = (self.cleaner_reserve() as u64 + 1) * self.segment_capacity();
        let fillable = self.store.good_data_capacity().saturating_sub(held_back);
        fillable / FILL_DEN * FILL_NUM
    }

    /// Bytes counted against the capacity now: live data, map nodes, the checkpoint (twice:
    /// the one a mount may start from stays until a newer one replaces it) with what the
    /// names created since add to it, and the reservations of dirty pages and inodes.
    pub(crate) fn committed(&self) -> u64 {
        let grown = (self.inode_count() as u64).saturating_sub(self.budget.ckpt_inodes);
        let ckpt = self.budget.ckpt_bytes + grown * NAME_COST;
        let dirty = (self.wb.len() as u64 + self.reserved.pages()) * self.page_cost();
        let inodes = self.wb.inodes_waiting() as u64 * NAME_COST;
        self.index.totals().footprint + self.index.totals().pages * MAP_ENTRY + 2 * ckpt + dirty + inodes
    }

    /// Reserves room for `pages` more dirty logical pages and `names` new names; when there
    /// is none, writes back what is dirty (compression gives back part of its reservation)
    /// and tries again, then answers `NoSpace`.
    pub(crate) fn reserve(&mut self, pages: u64, names: u64) -> Result<(), FsError> {
        let need = pages * self.page_cost() + names * NAME_COST;
        if self.committed() + need <= self.capacity() {
            return Ok(());
        }
        if !self.wb.is_clean() {
            self.flush_data()?;
            if self.committed() + need <= self.capacity() {
                return Ok(());
            }
        }
        Err(FsError::NoSpace)
    }

    /// (capacity, free) in bytes, as statfs reports them.
    pub(crate) fn space(&self) -> (u64, u64) {
        let total = self.capacity();
        (total, total.saturating_sub(self.committed()))
    }
}
