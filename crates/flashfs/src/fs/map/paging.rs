//! The namespace read a group at a time: a mount that reads only the group table leaves the
//! groups *unread*, and every access first reads the groups it needs (the gates below). A
//! group is in memory whole or not at all: its inodes, entries and maps go in together, so a
//! name or an inode absent from memory is absent from the file system only once its group
//! is read.

use std::collections::BTreeSet;

use bitmend_media::nand::Nand;

use super::groups::GroupAt;
use super::groups::{decode_group, entry_hash, inode_hash, run_hash, Groups, SUPER_CHUNKS};
use super::keys::{dir_region, in_region, ino_region, ChunkKey, GroupId, CHUNK_PAGES};
use crate::fs::Fs;
use crate::fs::LOGICAL_PAGE;
use crate::FileType;
use crate::PageAddr;
use crate::ROOT;
use crate::{Corruption, FsError};

impl Groups {
    /// The unread group hash `h` falls in, if it is unread.
    fn unread_of(&self, h: u64) -> Option<GroupId> {
        if self.unread.is_empty() {
            return None;
        }
        Some(self.group_of(h)).filter(|g| self.unread.contains(g))
    }

    /// Groups not read yet.
    pub(crate) fn unread_count(&self) -> usize {
        self.unread.len()
    }

    /// Inodes in the groups not read yet, as the table counts them.
    /// Whether `need_named` read every inode memory names since this was last asked.
    pub(crate) fn take_named_read(&mut self) -> bool {
        std::mem::take(&mut self.named_read)
    }

    /// Inodes whose pages go at the next checkpoint (`Fs::drop_orphans`).
    pub(crate) fn add_orphans(&mut self, inos: &[u64]) {
        self.orphans.extend_from_slice(inos);
    }

    pub(crate) fn shed_count(&self) -> u64 {
        self.shed
    }

    pub(crate) fn unread_inodes(&self) -> usize {
        self.unread_inodes
    }

    /// The unread groups holding any hash in `[from, to]`.
    fn unread_in(&self, from: u64, to: u64) -> Vec<GroupId> {
        if self.unread.is_empty() {
            return Vec::new();
        }
        let first = self.group_of(from);
        let mut out: BTreeSet<GroupId> =
            self.ranges.range(first.start()..=to).map(|(&s, &d)| self.group_of_start(s, d)).collect();
        out.insert(first);
        out.into_iter().filter(|g| self.unread.contains(g)).collect()
    }

    /// The unread groups of region `r`.
    fn unread_in_region(&self, r: u64) -> Vec<GroupId> {
        self.unread_in(in_region(r, 0), in_region(r, u64::MAX))
    }
}

impl<N: Nand> Fs<N> {
    /// Reads group `g` into memory: its inodes, entries and maps, and its members. A group
    /// that does not read is an error for the access that needed it (its items are not
    /// guessed at).
    pub(crate) fn page_in(&mut self, g: GroupId) -> Result<(), FsError> {
        let Some(at) = self.groups.at.get(&g).cloned() else {
            self.groups.unread.remove(&g);
            return Ok(());
        };
        let first = at.frags.first().map_or(0, |f| f.0);
        let (payload, _) = self.read_payload(&at.frags)?;
        let content = decode_group(&payload, g, at.crc).ok_or(Corruption::Unrecoverable { page: first })?;
        // Members marked before the group was read (a new inode whose group a checkpoint
        // reads to write it) stay members.
        let mut members = self.groups.members.remove(&g).unwrap_or_default();
        let mut dropped = false;
        for (ino, inode) in content.inodes {
            members.inos.insert(ino);
            // Kept for its readers when the checkpoint was written; a mount has none.
            if inode.attr.nlink == 0 && !self.held_open.contains(&ino) && !self.ns.is_open(ino) {
                dropped = true;
                self.groups.orphans.push(ino);
                continue;
            }
            // Memory is newer than the copy for an inode it holds already.
            if !self.ns.contains(ino) {
                self.ns.insert(ino, inode);
            }
        }
        for (parent, name, child) in content.entries {
            members.names.insert((parent, name.clone()));
            self.ns.replay_entry(parent, name, child);
        }
        for (k, map) in content.maps {
            members.runs.insert((k.ino, k.chunk / SUPER_CHUNKS));
            self.index.maps.insert(k, map);
        }
        self.groups.members.insert(g, members);
        self.groups.unread.remove(&g);
        self.groups.unread_inodes = self.groups.unread_inodes.saturating_sub(at.inodes as usize);
        if dropped {
            // Written again without them (a file kept for readers is dropped whole by the
            // mount that finds it; its pages at the next checkpoint).
            self.groups.dirty.insert(g);
        }
        Ok(())
    }

    /// Removes the pages of the inodes dropped as their groups were read (a mount that
    /// reads every group does the same for all of them at once).
    pub(crate) fn drop_orphans(&mut self) -> Result<(), FsError> {
        while let Some(ino) = self.groups.orphans.pop() {
            self.need_file_maps(ino)?;
            self.remove_pages(ino, 0, None)?;
        }
        Ok(())
    }

    fn page_in_hash(&mut self, h: u64) -> Result<(), FsError> {
        if !self.groups.shedding {
            return match self.groups.unread_of(h) {
                Some(g) => self.page_in(g),
                None => Ok(()),
            };
        }
        let g = self.groups.group_of(h);
        self.groups.touched.insert(g);
        if self.groups.unread.contains(&g) {
            self.page_in(g)?;
        }
        Ok(())
    }

    /// Inode `ino` in memory, if the file system has it.
    pub(crate) fn need_inode(&mut self, ino: u64) -> Result<(), FsError> {
        self.page_in_hash(inode_hash(ino))
    }

    /// The entry `name` of directory `parent` in memory, if there is one.
    pub(crate) fn need_entry(&mut self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        self.page_in_hash(entry_hash(parent, name))
    }

    /// Every entry of directory `dir` in memory: every group overlapping its region.
    pub(crate) fn need_dir(&mut self, dir: u64) -> Result<(), FsError> {
        self.need_groups(self.groups.unread_in_region(dir_region(dir)))
    }

    fn need_groups(&mut self, groups: Vec<GroupId>) -> Result<(), FsError> {
        groups.into_iter().try_for_each(|g| self.page_in(g))
    }

    /// Chunk `ck`'s map in memory, if it has one.
    pub(crate) fn need_chunk(&mut self, ck: ChunkKey) -> Result<(), FsError> {
        self.page_in_hash(run_hash(ck.ino, ck.chunk / SUPER_CHUNKS))
    }

    /// Every map of file `ino` in memory (a truncate, a removal): the groups of the runs its
    /// size covers (no map lies past a file's end: a mount trims what a crash left there),
    /// or of its region when that is fewer. A directory has no maps. An inode not in the
    /// file system (one dropped as its group was read) has no size to go by: its whole
    /// region, or every group for one made before regions.
    pub(crate) fn need_file_maps(&mut self, ino: u64) -> Result<(), FsError> {
        self.need_inode(ino)?;
        let run_bytes = SUPER_CHUNKS * CHUNK_PAGES * LOGICAL_PAGE as u64;
        let runs = match self.ns.get(ino) {
            Some(i) if i.attr.kind == FileType::Dir => return Ok(()),
            Some(i) => Some(i.attr.size.div_ceil(run_bytes)),
            None => None,
        };
        let region = ino_region(ino).map(|r| self.groups.unread_in_region(r));
        match (runs, region) {
            (None, None) => self.need_all(),
            (Some(runs), Some(region)) if runs >= region.len() as u64 => self.need_groups(region),
            (Some(runs), _) => (0..runs).try_for_each(|run| self.page_in_hash(run_hash(ino, run))),
            (None, Some(region)) => self.need_groups(region),
        }
    }

    /// The entry naming directory `d` in memory, so that its parent is known. A directory
    /// never moved to another parent is named in the region it was made in, which its number
    /// carries (its parent's); one that was moved, or made before regions, is found by
    /// reading every group. An entry in memory is the file system's: its group was read
    /// whole, and is written before it is let go.
    pub(crate) fn need_parent(&mut self, d: u64) -> Result<(), FsError> {
        if d == ROOT.0 || self.ns.parent_of(d).is_some() {
            return Ok(());
        }
        if let Some(r) = ino_region(d) {
            self.need_groups(self.groups.unread_in_region(r))?;
            if self.ns.parent_of(d).is_some() {
                return Ok(());
            }
        }
        self.need_all()
    }

    /// Every inode that memory names read: each directory whose entries are in memory, and
    /// each entry's child, until reading them brings no entry more (a group read brings
    /// its own entries, whose children are read in turn; directories keep their children
    /// in their own regions, so this stays near what replay touched). Then an inode or a
    /// table absent from memory is absent from the file system, and a prune may judge.
    pub(crate) fn need_named(&mut self) -> Result<(), FsError> {
        loop {
            let before = self.groups.unread_count();
            let named: BTreeSet<u64> =
                self.ns.dirs().flat_map(|(d, e)| std::iter::once(*d).chain(e.values().copied())).collect();
            for ino in named {
                self.need_inode(ino)?;
            }
            if self.groups.unread_count() == before {
                self.groups.named_read = true;
                return Ok(());
            }
        }
    }

    /// The whole namespace in memory (fsck, and what looks at every name or map).
    pub(crate) fn need_all(&mut self) -> Result<(), FsError> {
        let all: Vec<GroupId> = self.groups.unread.iter().copied().collect();
        for g in all {
            self.page_in(g)?;
        }
        Ok(())
    }

    /// Whether every group with a page in the segment still being written reads: there a
    /// damaged page has no segment parity behind it, and a checkpoint whose groups do not
    /// read is passed over at mount for an older one (as a mount that reads every group
    /// does), not found out later. Their pages are read (each checked by its CRC), not
    /// decoded; groups in sealed segments are read when needed.
    pub(crate) fn unsealed_groups_read(&mut self, table: &[(GroupId, GroupAt)]) -> Result<bool, FsError> {
        let Some(live) = self.store.live_segment().map(|s| s.physical) else { return Ok(true) };
        for (_, at) in table {
            if !at.frags.iter().any(|f| self.store.segment_of(PageAddr(f.0)) == Some(live)) {
                continue;
            }
            match self.read_payload(&at.frags) {
                Ok(_) => {}
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                    return Ok(false)
                }
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads every unread group for fsck: returns the groups that do not read, each with
    /// its flash pages (their items are unreadable, not absent).
    pub(crate) fn page_in_all_for_check(&mut self) -> Vec<(GroupId, usize, FsError)> {
        let all: Vec<GroupId> = self.groups.unread.iter().copied().collect();
        let mut failed = Vec::new();
        for g in all {
            if let Err(e) = self.page_in(g) {
                let pages = self.groups.at.get(&g).map_or(0, |a| a.frags.len());
                failed.push((g, pages, e));
            }
        }
        failed
    }
}
