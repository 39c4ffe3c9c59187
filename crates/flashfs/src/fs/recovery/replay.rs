//! The page store's log replayed node by node, in write order.
//!
//! (A full replay reads every data page written. The on-flash index with its checkpoint in
//! the segment summary will bound this; until then mount time grows with the data.)

use std::collections::HashMap;

use bitmend_media::nand::Nand;

use super::{DirtyRecovery, DirtyRecoveryReport, MountReport};
use crate::fs::node::{self, NodeKind, CODEC_FLAGS};
use crate::fs::scan::{Assembler, Partial};
use crate::fs::{Fs, FsOptions, Inode, Loc, ROOT};
use crate::store::{PageStore, Repaired, Segment};
use crate::FsError;
use crate::{Corruption, FormatError};

/// A node that replay cannot apply because the index chunk it belongs to has a map beyond
/// repair: the node is counted lost (the chunk's pages read as EIO); other errors stop the
/// mount.
fn lost(e: FsError, report: &mut MountReport) -> Result<(), FsError> {
    match e {
        FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. }) => {
            report.partial_nodes += 1;
            Ok(())
        }
        e => Err(e),
    }
}

impl<N: Nand> Fs<N> {
    /// Mounts the file system on `nand`, replaying its log.
    pub fn open(nand: N, opts: FsOptions) -> Result<(Fs<N>, MountReport), FsError> {
        let (fs, report, _) = Fs::open_with(nand, opts, None)?;
        Ok((fs, report))
    }

    /// Mounts as [`open`](Fs::open) does, then applies the dirty state an NVRAM tier held
    /// (`tier.rs`): its metadata on top of the log, its pages as dirty pages. The
    /// caller attaches the tier and writes a checkpoint, which puts the recovered state on
    /// flash and checks the tier out.
    pub fn open_recovering(
        nand: N,
        opts: FsOptions,
        dirty: DirtyRecovery,
    ) -> Result<(Fs<N>, MountReport, DirtyRecoveryReport), FsError> {
        Fs::open_with(nand, opts, Some(dirty))
    }

    fn open_with(
        nand: N,
        opts: FsOptions,
        dirty: Option<DirtyRecovery>,
    ) -> Result<(Fs<N>, MountReport, DirtyRecoveryReport), FsError> {
        let (store, m, anchored) =
            PageStore::open_anchored(nand, crate::fs::checkpoint::segment_info_superblock)?;
        tier_is_ours(dirty.as_ref(), &store)?;
        let mut fs = Fs::with_store(store, opts)?;
        fs.held_open = dirty.iter().flat_map(|d| d.held_open.iter().copied()).collect();
        let mut report = MountReport { store: m, ..MountReport::default() };
        // Start from the anchored checkpoint, or else from the one the newest segment names
        // (or from the beginning).
        let start = match (anchored, fs.store.live_segment()) {
            (Some(c), _) => Some(crate::fs::checkpoint::CkptAt { page: c.page, segment: c.segment }),
            (None, Some(live)) => match fs.store.first_page_of(live.physical)? {
                Some(first) => {
                    let mut page = vec![0u8; fs.page.size()];
                    match fs.store.read(first, &mut page) {
                        Ok(_) => crate::fs::checkpoint::segment_info(&page).flatten(),
                        Err(_) => None,
                    }
                }
                None => None,
            },
            (None, None) => None,
        };
        fs.cp.replay_starts(start);
        // The newest checkpoint may be in the segment being written (an unmount writes one):
        // its first page is marked in its spare. Try it first; if it was cut short, fall
        // back to the one the segment names.
        let mut candidates = Vec::new();
        // (With an anchor, a newer checkpoint, whose anchor was cut, is replayed as a node.)
        if let (Some(page), Some(Segment { logical: live, .. }), None) =
            (fs.store.last_marked(), fs.store.live_segment(), anchored)
        {
            if start.map(|c| c.page) != Some(page.0) {
                candidates.push(Some(crate::fs::checkpoint::CkptAt { page: page.0, segment: live }));
            }
        }
        candidates.push(start);
        if start.is_some() {
            // Last resort: all that is left of the log (correct, only slower).
            candidates.push(None);
        }
        // Until the table is adopted, the store knows only the segments from the anchored
        // checkpoint's on; replaying from the beginning needs them all.
        let mut table_adopted = anchored.is_none();
        let mut dirent_versions = HashMap::new();
        for (i, cand) in candidates.iter().enumerate() {
            let last = i + 1 == candidates.len();
            if cand.is_none() && !table_adopted {
                fs.store.adopt_table(None, &mut report.store)?;
                table_adopted = true;
            }
            fs.ns.clear();
            fs.index = crate::fs::map::index::Index::default();
            fs.groups = Default::default();
            fs.cp.replay_tries(*cand);
            let mut r = MountReport { store: report.store.clone(), ..MountReport::default() };
            let found;
            (found, dirent_versions) = fs.replay_from(*cand, &mut r)?;
            if found || cand.is_none() || last {
                r.from_checkpoint = cand.is_some() && found;
                report = r;
                break;
            }
        }
        if !table_adopted {
            let table = fs.cp.take_replayed_table();
            fs.store.adopt_table(table.as_deref(), &mut report.store)?;
        }
        fs.reclaim_if_short(&mut report.store)?;
        fs.need_inode(ROOT.0)?;
        if !fs.ns.contains(ROOT.0) {
            return Err(FormatError::NotAFs { why: "no root directory in the log".into() }.into());
        }
        let mut recovered = DirtyRecoveryReport::default();
        let records = dirty.as_ref().map_or(&[][..], |d| &d.records[..]);
        let shrunk = fs.apply_tier_records(records, &mut dirent_versions, &mut report, &mut recovered)?;
        // What replay or the tier changed is checked by `prune` against the inodes it names:
        // a mount with nothing after its checkpoint leaves the groups unread.
        if report.nodes > 1 || !records.is_empty() {
            fs.need_named()?;
        }
        fs.rebuild_dirs()?;
        // The next mount should follow the chain from the checkpoint this one ended with: a
        // scan, or a replay from no checkpoint, writes a new one; a checkpoint newer than the
        // anchored one (an unmount cut before its anchor) is anchored now.
        if report.store.scanned || !report.from_checkpoint {
            // A full chip mounts as it is; the next checkpoint will anchor it. A segment
            // written before successor queues existed cannot start a chain: the checkpoint
            // goes into a new one.
            let moved = if fs.store.live_segment().is_some() && !fs.store.has_successors() {
                fs.store.finish_segment()
            } else {
                Ok(())
            };
            match moved.and_then(|()| fs.checkpoint()) {
                // A full chip, or a full disk under a thin image.
                Err(e) if !e.is_no_space() => return Err(e),
                _ => {}
            }
        } else if let Some(c) = fs.cp.newest().filter(|c| anchored.is_none_or(|a| a.page != c.page)) {
            fs.store.record_checkpoint(crate::PageAddr(c.page))?;
        }
        // An image made by an older version now holds what only this one reads (map nodes):
        // its superblocks say so, and an older build refuses it.
        if let Some(c) = fs.cp.newest().filter(|_| fs.store.anchored()) {
            fs.store.upgrade_superblock(crate::PageAddr(c.page))?;
        }
        report.superblocks_damaged = fs.store.damaged_superblocks().len() as u64;
        report.superblocks_rewritten = fs.rewrite_damaged_superblocks()? as u64;
        let named = fs.segments_named();
        fs.cp.mounted(named);
        report.maps_loaded = fs.index.counts().loads;
        if let Some(d) = dirty {
            fs.cut_shrunk_pages(&shrunk, &mut recovered)?;
            fs.apply_tier_pages(d.pages, &mut recovered);
        }
        Ok((fs, report, recovered))
    }

    /// Replays the log from checkpoint `start` (or from the oldest segment); returns whether
    /// the first node found there was that checkpoint, whole.
    /// Also returns the versions of the directory entries replayed after the checkpoint.
    #[allow(clippy::type_complexity)]
    fn replay_from(
        &mut self,
        start: Option<crate::fs::checkpoint::CkptAt>,
        report: &mut MountReport,
    ) -> Result<(bool, HashMap<(u64, Vec<u8>), u64>), FsError> {
        let fs = self;
        let mut pages =
            fs.store.log_pages(start.map_or(0, |c| c.segment), start.map(|c| crate::PageAddr(c.page)))?;
        if let Some(c) = start {
            match pages.iter().position(|p| p.0 == c.page) {
                Some(i) => {
                    pages.drain(..i);
                }
                None => return Ok((false, HashMap::new())),
            }
        }
        let mut first_is_checkpoint: Option<bool> = None;
        let mut dirent_versions: HashMap<(u64, Vec<u8>), u64> = HashMap::new();
        let mut nodes = Assembler::default();
        let mut flash = vec![0u8; fs.page.size()];
        for addr in pages {
            match fs.store.read(addr, &mut flash) {
                Ok(how) => report.pages_repaired += (how != Repaired::No) as u64,
                Err(
                    e @ FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. }),
                ) => {
                    if matches!(e, FsError::Corrupt(Corruption::NotWritten { .. })) {
                        report.pages_skipped += 1;
                    } else {
                        report.pages_lost += 1;
                    }
                    nodes.lost_page();
                    continue;
                }
                Err(e) => return Err(e),
            }
            report.pages += 1;
            nodes.page(addr.0, &flash, |done| {
                let is_start = done.head.kind == NodeKind::Checkpoint
                    && done.frags.first().map(|f| f.0) == start.map(|c| c.page);
                let applied = fs.apply(done, &mut dirent_versions, report)?;
                if first_is_checkpoint.is_none() {
                    // A checkpoint that does not decode is no starting point.
                    first_is_checkpoint = Some(is_start && applied);
                }
                report.nodes += 1;
                Ok::<(), FsError>(())
            })?;
        }
        report.partial_nodes += nodes.cut;
        Ok((first_is_checkpoint.unwrap_or(false), dirent_versions))
    }

    /// Applies one complete node; false if its payload does not decode.
    pub(crate) fn apply(
        &mut self,
        n: Partial,
        dirent_versions: &mut HashMap<(u64, Vec<u8>), u64>,
        report: &mut MountReport,
    ) -> Result<bool, FsError> {
        let v = n.head.version;
        self.page.replayed_version(v);
        // A lazily read namespace: the item's group in memory before the node changes it
        // (a group read after would put its older copy over the change).
        match n.head.kind {
            NodeKind::Inode | NodeKind::Xattr | NodeKind::Punch => self.need_inode(n.head.key)?,
            NodeKind::Dirent => {
                if let Some((_, name)) = node::decode_dirent(&n.payload) {
                    self.need_entry(n.head.key, &name)?;
                }
            }
            _ => {}
        }
        // What a node after the checkpoint changed goes into its group at the next one.
        self.groups.mark_node(n.head.kind, n.head.key, &n.payload);
        match n.head.kind {
            NodeKind::Inode => return self.apply_inode(&n, report),
            NodeKind::Dirent => {
                let Some((child, name)) = node::decode_dirent(&n.payload) else { return Ok(false) };
                let key = (n.head.key, name);
                if dirent_versions.get(&key).is_some_and(|&old| old > v) {
                    return Ok(true);
                }
                let name = key.1.clone();
                dirent_versions.insert(key, v);
                self.ns.replay_entry(n.head.key, name, child);
            }
            NodeKind::Data => self.apply_data(&n, report)?,
            NodeKind::Checkpoint => return self.apply_checkpoint(&n, dirent_versions),
            NodeKind::Punch => {
                let Some(end) = node::decode_punch(&n.payload) else { return Ok(false) };
                // Pages written after the punch stay.
                if let Err(e) = self.remove_range(n.head.key, n.head.key2..end, Some(v)) {
                    lost(e, report)?;
                }
            }
            NodeKind::Xattr => {
                let Some(set) = node::decode_xattrs(&n.payload) else { return Ok(false) };
                self.ns.set_xattrs(n.head.key, set, v);
            }
            // A map or group node counts only through the checkpoint that refers to it.
            NodeKind::Commit | NodeKind::SegmentInfo | NodeKind::Map | NodeKind::Group => {}
        }
        Ok(true)
    }

    /// An inode node: newer than what is known, it replaces it; a link count of 0 removes
    /// the file, and a smaller size drops the pages past it.
    fn apply_inode(&mut self, n: &Partial, report: &mut MountReport) -> Result<bool, FsError> {
        let v = n.head.version;
        let Some((attr, target)) = node::decode_inode(n.head.key, &n.payload) else {
            return Ok(false);
        };
        if self.ns.get(attr.ino.0).is_some_and(|i| i.version > v) {
            return Ok(true);
        }
        let ino = attr.ino.0;
        let shrink_to =
            self.ns.get(ino).map(|i| i.attr.size).filter(|&old| attr.size < old).map(|_| attr.size);
        if attr.nlink == 0 && !self.held_open.contains(&ino) {
            self.ns.remove_inode(ino);
            self.remove_pages(ino, 0, None)?;
            return Ok(true);
        }
        if let Some(size) = shrink_to {
            // Pages past a shrink are gone, whatever comes after in the log.
            let keep = size.div_ceil(crate::fs::LOGICAL_PAGE as u64);
            if let Err(e) = self.remove_pages(ino, keep, Some(v)) {
                // The chunk across the new end has a map beyond repair: its pages
                // read as EIO whatever this node says.
                lost(e, report)?;
            }
        }
        // Extended attributes have nodes of their own: they stay.
        self.ns.replace_keeping_xattrs(ino, Inode::new(attr, target, v));
        Ok(true)
    }

    /// A data node: each of its logical pages points at it unless a newer node already holds
    /// the page.
    fn apply_data(&mut self, n: &Partial, report: &mut MountReport) -> Result<(), FsError> {
        let v = n.head.version;
        let codec = n.head.flags & CODEC_FLAGS;
        let count = n.head.pages();
        for slot in 0..count {
            let key = (n.head.key, n.head.key2.saturating_add(slot as u64));
            let crc = n.payload.get(4 * slot..4 * slot + 4).map(|b| bitmend_code::le::get_u32(b, 0));
            let loc =
                Loc { frags: n.frags.clone(), codec, version: v, crc, slot: slot as u8, count: count as u8 };
            let ck = crate::fs::map::keys::chunk_key(key.0, key.1);
            if let Err(e) = self.need_chunk(ck) {
                lost(e, report)?;
                continue;
            }
            if !self.index.is_loaded(ck) && self.index.maps().contains_key(&ck) {
                // Not read at mount: kept beside the chunk's map until it is loaded.
                self.overlay_loc(key, loc);
                continue;
            }
            match self.loc(key.0, key.1) {
                Ok(Some(l)) if l.version > v => continue,
                Ok(_) => {}
                Err(e) => {
                    lost(e, report)?;
                    continue;
                }
            }
            self.set_loc(key, loc)?;
        }
        Ok(())
    }

    /// A checkpoint: the namespace, the index's maps, the usage table and the health counters
    /// as they were when it was written; the log after it is replayed on top.
    fn apply_checkpoint(
        &mut self,
        n: &Partial,
        dirent_versions: &mut HashMap<(u64, Vec<u8>), u64>,
    ) -> Result<bool, FsError> {
        let Some(state) = super::checkpoint::decode_payload(n.head.flags, &n.payload) else {
            return Ok(false);
        };
        // Version 8: the groups it names, all read whole before anything is replaced; version
        // 10 with a lazy namespace: only the table, the groups read as they are needed.
        let lazy = self.opts.lazy_namespace && !state.groups_v8;
        let groups = match state.groups {
            Some(table) if lazy => match crate::fs::map::groups::Groups::of_table(&table) {
                Some(groups) if self.unsealed_groups_read(&table)? => Some((groups, table, None)),
                _ => return Ok(false),
            },
            Some(table) => match self.read_groups(&table)? {
                Some((groups, contents)) => Some((groups, table, Some(contents))),
                None => return Ok(false),
            },
            None => None,
        };
        self.ns.replace(state.inodes, state.dirs, state.next_ino);
        self.index = crate::fs::map::index::Index::from_checkpoint(
            state.maps.unwrap_or_default(),
            state.usage,
            state.totals,
        );
        // A version 3 checkpoint lists every page: they become chunks in RAM, whose
        // maps the next checkpoint writes.
        for (key, loc) in state.data {
            self.set_loc(key, loc)?;
        }
        self.groups = Default::default();
        match groups {
            Some((groups, table, Some(contents))) => {
                self.adopt_groups(groups, table, contents, state.groups_v8)
            }
            Some((groups, table, None)) => self.adopt_table(groups, table),
            None => {}
        }
        let on_flash = n.payload.len() + n.frags.len() * crate::fs::node::FRAG_HEADER;
        self.budget.checkpoint(on_flash as u64 + self.groups.bytes(), self.inode_count());
        dirent_versions.clear();
        let at = n.frags.first().map(|&(page, _, _)| {
            let segment = self.segment_logical(crate::PageAddr(page)).unwrap_or(0);
            crate::fs::checkpoint::CkptAt { page, segment }
        });
        self.cp.replayed(n.head.version, state.health, state.segments, at);
        Ok(true)
    }

    /// Drops entries of directories and names of inodes that no longer exist; gives every
    /// directory its (possibly empty) entry table; puts a state that came from no groups in
    /// groups.
    fn rebuild_dirs(&mut self) -> Result<(), FsError> {
        // An inode unlinked while open was kept for its readers; after a mount it has none.
        // (What is dropped here is dropped from its group at the next checkpoint.)
        // Groups left unread by a mount that replayed nothing: the checkpoint's state was
        // whole, and only the inodes it kept for readers go, as their groups are read
        // (`paging.rs`). After a replay, every inode that memory names is read first
        // (`need_named`), so that prune judges only what it can see.
        if self.groups.take_named_read() || self.groups.unread_count() == 0 {
            let pruned = self.ns.prune(&self.held_open);
            pruned.inodes.iter().for_each(|&ino| self.groups.mark_inode(ino));
            // Their maps may sit in groups not read: their pages go at the next checkpoint.
            self.groups.add_orphans(&pruned.inodes);
            pruned.entries.iter().for_each(|(parent, name)| self.groups.mark_entry(*parent, name));
        }
        // Pages of files that are gone, or past a file's end (written before a crash cut
        // the inode that would have grown it). Only chunks replay touched (in RAM, or pages
        // kept beside a map not yet read) can hold those: the others are as the checkpoint,
        // which was consistent, left them (a shrink replayed loaded what it cut).
        let mut gone: Vec<u64> = self.index.all_chunks().iter().map(|k| k.ino).collect();
        gone.dedup();
        for &ino in &gone {
            self.need_inode(ino)?;
        }
        gone.retain(|&ino| !self.ns.contains(ino));
        for ino in gone {
            self.remove_pages(ino, 0, None)?;
        }
        let ns = &self.ns;
        let end = |ino: u64| ns.get(ino).map_or(0, |i| i.attr.size.div_ceil(crate::fs::LOGICAL_PAGE as u64));
        let past: Vec<(crate::fs::map::keys::ChunkKey, Vec<crate::fs::Loc>)> = self.index.trim_in_ram(end);
        for (_, locs) in past {
            for l in locs {
                self.count_loc(&l, false);
            }
        }
        // A state that came from no groups (a checkpoint before version 8, or none), or from
        // groups hashed without regions (8 and 9): all of it goes into new groups at the next
        // checkpoint.
        if self.groups.table().is_empty() || self.groups.hashed_before_regions() {
            self.regroup();
        }
        Ok(())
    }
}

/// A tier's dirty state applies only to the file system that wrote it.
fn tier_is_ours<N: Nand>(dirty: Option<&DirtyRecovery>, store: &PageStore<N>) -> Result<(), FsError> {
    match dirty.and_then(|d| d.owner).filter(|&o| o != store.fs_id()) {
        Some(found) => Err(FsError::ForeignTier { found, ours: store.fs_id() }),
        None => Ok(()),
    }
}
