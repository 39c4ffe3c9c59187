//! The namespace kept to a bounded cache: between operations, groups that were read and are
//! unchanged since (their copy on flash is what memory holds) are let go again, and read
//! again by the gates (`paging.rs`) when they are needed. A clock hand goes round the groups
//! in hash order; a group an access found since the hand last passed is spared once.
//!
//! Only between operations: an operation's gates read what it needs before it looks, and
//! letting a group go in the middle would take what a gate had read (a listing would lose
//! names). The mount sheds when it lets go of the file system's lock.

use bitmend_media::nand::Nand;

use super::groups::{run_range, GROUPS_PER_STEP};
use super::keys::{ChunkKey, GroupId};
use crate::fs::Fs;

impl<N: Nand> Fs<N> {
    /// Lets groups go until the inodes in memory are an eighth under
    /// [`FsOptions::namespace_cache`](crate::FsOptions::namespace_cache). Call between
    /// operations, never inside one.
    pub fn shed_namespace(&mut self) {
        let limit = self.opts.namespace_cache;
        if limit == 0 || self.ns.len() <= limit {
            return;
        }
        self.groups.shedding = true;
        let target = limit - limit / 8;
        // Twice round at most: the first pass clears the marks of the groups it spares.
        self.shed_pass(target);
        self.shed_pass(target);
        // Groups changed since they were written hold memory ahead of their copies: a few
        // are written ahead of the checkpoint (as the write-back thread does before one),
        // and may go then. A full chip leaves them for the checkpoint.
        if self.ns.len() > target
            && !self.groups.dirty.is_empty()
            && self.write_groups(GROUPS_PER_STEP).is_ok()
        {
            self.shed_pass(target);
        }
    }

    /// Every group in memory once round from the hand, letting go until `target` inodes are
    /// left; a group spared as touched comes round at the next pass. Only the groups with
    /// members are gone round (those read, and a few marked before they were read): the
    /// table's tens of thousands of unread groups at a million files, gone round after
    /// every request, cost more than the requests.
    fn shed_pass(&mut self, target: usize) {
        let hand = self.groups.shed_hand;
        // A mark on a group not in memory spares nothing.
        let members = &self.groups.members;
        self.groups.touched.retain(|g| members.contains_key(g));
        let mut order: Vec<GroupId> = self.groups.members.keys().copied().collect();
        order.sort_unstable_by_key(|g| g.start());
        let after = order.partition_point(|g| g.start() <= hand);
        order.rotate_left(after);
        for g in order {
            if self.ns.len() <= target {
                break;
            }
            self.groups.shed_hand = g.start();
            if self.groups.touched.remove(&g) || !self.may_shed(g) {
                continue;
            }
            self.shed(g);
        }
    }

    /// Whether group `g` may go: read, unchanged since its copy was written, and holding no
    /// inode that memory is ahead of flash on (an open file, an inode or pages waiting to be
    /// written). Chunks of its files' maps that are loaded and changed stay in the index:
    /// they are not the group's, and their maps' groups are read before the maps are
    /// written (`write_dirty_maps`).
    fn may_shed(&self, g: GroupId) -> bool {
        let groups = &self.groups;
        if groups.unread.contains(&g) || groups.dirty.contains(&g) || !groups.at.contains_key(&g) {
            return false;
        }
        let Some(m) = groups.members.get(&g) else { return false };
        !m.inos.iter().any(|&ino| {
            self.ns.is_open(ino)
                || self.held_open.contains(&ino)
                || self.wb.inode_waits(ino)
                || self.wb.has_pages_of(ino)
                || groups.orphans.contains(&ino)
        })
    }

    /// Lets group `g` go: its items leave memory, and it is unread again.
    fn shed(&mut self, g: GroupId) {
        let Some(m) = self.groups.members.remove(&g) else { return };
        for ino in m.inos {
            self.ns.forget(ino);
        }
        for (parent, name) in m.names {
            self.ns.forget_entry(parent, &name);
        }
        for (ino, run) in m.runs {
            let keys = run_range(ino, run);
            let maps: Vec<ChunkKey> = self.index.maps.range(keys.clone()).map(|(k, _)| *k).collect();
            for k in maps {
                self.index.maps.remove(&k);
                // A clean chunk is read again with its map; a changed one stays.
                if self.index.loaded.get(&k).is_some_and(|c| !c.dirty) {
                    self.index.loaded.remove(&k);
                }
            }
        }
        let inodes = self.groups.at.get(&g).map_or(0, |a| a.inodes as usize);
        self.groups.unread.insert(g);
        self.groups.unread_inodes += inodes;
        self.groups.shed += 1;
    }
}
