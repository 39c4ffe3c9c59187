//! Checkpoints: the whole file-system state written as one node, so that mount replays the
//! log from the newest checkpoint instead of from the beginning, and so that segments older
//! than it hold nothing but file data the index points at (which the cleaner moves).
//!
//! Where replay starts: the first page of every segment holds a segment-info node naming the
//! newest checkpoint completed before the segment was opened. Mount reads it from the newest
//! segment only.

use std::collections::HashSet;

use bitmend_code::le::{Put, Reader};
use bitmend_media::nand::Nand;

use super::map::groups::GroupAt;
use super::map::index::put_frags;
use super::map::keys::GroupId;
use super::recovery::checkpoint::{
    decode, GROUPS_MAGIC, HEALTH_MAGIC, MAGIC, MAPS_MAGIC, SUMMARY_MAGIC, TABLE_MAGIC, TOTALS_MAGIC,
    USAGE_MAGIC, XATTR_MAGIC,
};
use super::{Fs, PENDING};
use crate::fs::node::{Frag, NodeKind, FLAG_LAST, FLAG_ZSTD, FRAG_HEADER};
use crate::store::{PageAddr, Segment};
use crate::FsError;

/// The fewest log pages between two checkpoints written because the log grew.
pub const CHECKPOINT_MIN_PAGES: u64 = 256;

/// Where a checkpoint starts: its first flash page and that page's logical segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CkptAt {
    pub page: u32,
    pub segment: u64,
}

/// The checkpoints: the newest written, the one a mount would start from, and when the next
/// is due.
#[derive(Debug, Default)]
pub(crate) struct CkptState {
    /// The newest checkpoint written.
    newest: Option<CkptAt>,
    /// The checkpoint a mount would start from now (the one the newest segment names).
    mount_from: Option<CkptAt>,
    /// A checkpoint is being written (the flushes inside it must not start another).
    writing: bool,
    /// The store's data-page counter when the last checkpoint ended, and its size in pages
    /// on flash and before compression: the next is written once the log since is some
    /// multiple of it (see `checkpoint_interval`).
    mark: (u64, u64, u64),
    /// The segment table of the checkpoint the mount replayed (handed to the store).
    replayed_table: Option<Vec<Segment>>,
    /// Physical segments holding map nodes that the newest checkpoint, and the one a mount
    /// would start from, refer to: the cleaner erases none of them before a newer checkpoint
    /// no longer does.
    newest_maps: std::collections::HashSet<u32>,
    mount_maps: std::collections::HashSet<u32>,
    /// Health as the checkpoint this mount started from recorded it.
    health_base: super::Health,
    /// The version of the checkpoint replay applied last (0: none): every node up to it is
    /// in that checkpoint (an NVRAM tier's records up to it are on flash).
    replayed_version: u64,
}

/// What the rest of the file system reads of the checkpoints, and what replay tells them.
impl CkptState {
    /// The newest checkpoint written (or replayed).
    pub fn newest(&self) -> Option<CkptAt> {
        self.newest
    }

    /// The checkpoint a mount would start from now.
    pub fn mount_from(&self) -> Option<CkptAt> {
        self.mount_from
    }

    /// Physical segments holding map nodes the newest checkpoint or the one a mount would
    /// start from refer to.
    pub fn map_segments(&self) -> impl Iterator<Item = &u32> {
        self.newest_maps.iter().chain(self.mount_maps.iter())
    }

    /// Mount would now start from the newest checkpoint (a new segment names it, or it is
    /// anchored).
    pub fn newest_is_mount_start(&mut self) {
        self.mount_from = self.newest;
        self.mount_maps = self.newest_maps.clone();
    }

    /// Health as the checkpoint this mount started from recorded it.
    pub fn health_base(&self) -> super::Health {
        self.health_base
    }

    /// The version of the checkpoint replay applied last (0: none).
    pub fn replayed_version(&self) -> u64 {
        self.replayed_version
    }

    /// Replay starts: a mount would start from `start`.
    pub fn replay_starts(&mut self, start: Option<CkptAt>) {
        self.mount_from = start;
    }

    /// Replay tries checkpoint `cand` (none: the whole log).
    pub fn replay_tries(&mut self, cand: Option<CkptAt>) {
        (self.newest, self.replayed_version) = (cand, 0);
    }

    /// Replay applied a checkpoint: its version, the health it recorded, its segment table,
    /// and where it is.
    pub fn replayed(
        &mut self,
        version: u64,
        health: super::Health,
        table: Option<Vec<Segment>>,
        at: Option<CkptAt>,
    ) {
        (self.replayed_version, self.health_base, self.replayed_table) = (version, health, table);
        if at.is_some() {
            self.newest = at;
        }
    }

    /// The segment table of the checkpoint replayed, for the store to adopt.
    pub fn take_replayed_table(&mut self) -> Option<Vec<Segment>> {
        self.replayed_table.take()
    }

    /// Mounted: the segments the checkpoint mount ends with refers to for its maps.
    pub fn mounted(&mut self, map_segments: std::collections::HashSet<u32>) {
        self.mount_maps = map_segments.clone();
        self.newest_maps = map_segments;
    }
}

/// The state as a checkpoint payload: zstd-compressed (its length, u32, then the zstd
/// frames of `frames`, which a reader decompresses as one stream; version 7 wrote two) when
/// that is smaller, which it is but for the smallest states; the flag says which. Also the
/// state's length.
fn payload_of(frames: &[&[u8]]) -> (Vec<u8>, bool, usize) {
    let len = frames.iter().map(|f| f.len()).sum();
    let zstd: Option<Vec<Vec<u8>>> =
        frames.iter().map(|f| crate::fs::node::zstd_compress(f, 1).ok()).collect();
    match zstd {
        Some(z) if z.iter().map(Vec::len).sum::<usize>() + 4 < len => {
            let mut v = Vec::with_capacity(4 + z.iter().map(Vec::len).sum::<usize>());
            v.put_u32(len as u32);
            for f in z {
                v.put_bytes(&f);
            }
            (v, true, len)
        }
        _ => (frames.concat(), false, len),
    }
}

impl<N: Nand> Fs<N> {
    /// The state as a checkpoint payload (see [`payload_of`]), and its length before
    /// compression: everything but the namespace and the maps, which are in the groups it
    /// names (version 8), so that its size follows the segments, not the files.
    fn state_payload(&self) -> (Vec<u8>, bool, usize) {
        let mut v = Vec::new();
        v.put_u32(MAGIC);
        v.put_u64(self.ns.next_ino());
        // No inode, entry or page here: they are in the groups.
        v.put_u32(0);
        v.put_u32(0);
        v.put_u32(0);
        let health = self.health().to_array();
        v.put_u32(HEALTH_MAGIC);
        v.put_u32(health.len() as u32);
        for c in health {
            v.put_u64(c);
        }
        let table = self.store.used_segments();
        v.put_u32(TABLE_MAGIC);
        v.put_u32(table.len() as u32);
        for u in table {
            v.put_u64(u.logical);
            v.put_u32(u.physical);
        }
        // The maps are in the groups too: none here.
        v.put_u32(MAPS_MAGIC);
        v.put_u32(0);
        let mut usage: Vec<(u32, u64)> =
            self.index.usage_table().iter().map(|(&p, &b)| (p, b)).filter(|u| u.1 > 0).collect();
        usage.sort_unstable();
        v.put_u32(USAGE_MAGIC);
        v.put_u32(usage.len() as u32);
        for (phys, bytes) in usage {
            v.put_u32(phys);
            v.put_u64(bytes);
        }
        let t = self.index.totals();
        v.put_u32(TOTALS_MAGIC);
        for x in [t.pages, t.stored, t.footprint] {
            v.put_u64(x);
        }
        v.put_u32(SUMMARY_MAGIC);
        v.put_u32(0);
        v.put_u32(XATTR_MAGIC);
        v.put_u32(0);
        // By first hash, as FORMAT.md says (`GroupId`'s order): a mount's sort of the table
        // then finds it in order.
        let mut groups: Vec<(&GroupId, &GroupAt)> = self.groups.table().iter().collect();
        groups.sort_unstable_by_key(|g| *g.0);
        v.put_u32(GROUPS_MAGIC);
        v.put_u32(groups.len() as u32);
        for (g, at) in groups {
            v.put_u8(g.depth);
            v.put_u64(g.prefix);
            v.put_u64(at.version);
            v.put_u32(at.crc);
            v.put_u32(at.inodes);
            put_frags(&mut v, &at.frags);
        }
        debug_assert!(self.reads_back(&v), "a checkpoint reads back as the state it was made from");
        payload_of(&[&v])
    }

    /// Whether checkpoint payload `v` decodes to this file system's state (the paired
    /// assertion of `state_payload`, for debug builds; `groups_match_state` checks the
    /// groups it names).
    fn reads_back(&self, v: &[u8]) -> bool {
        let Some(s) = decode(v) else { return false };
        let mut table: Vec<(GroupId, GroupAt)> =
            self.groups.table().iter().map(|(g, a)| (*g, a.clone())).collect();
        table.sort_unstable_by_key(|g| g.0);
        s.next_ino == self.ns.next_ino()
            && s.totals == self.index.totals()
            && s.usage.iter().all(|(p, b)| self.index.usage_table().get(p) == Some(b))
            && s.groups == Some(table)
            && s.inodes.is_empty()
            && s.maps.is_some_and(|m| m.is_empty())
    }

    /// Physical segments holding the map nodes and group nodes the state refers to: what
    /// the checkpoint written now would need kept.
    pub(crate) fn segments_named(&self) -> HashSet<u32> {
        let segment_of = |p: u32| self.store.segment_of(PageAddr(p));
        let mut held = self.index.map_segments(segment_of);
        held.extend(self.groups.segments(segment_of));
        held
    }

    /// Writes a checkpoint when the log since the last one has grown to
    /// [`checkpoint_interval`](Self::checkpoint_interval): replay after a crash then reads at
    /// most that much. (A state so large that this exceeds the mount budget is what the
    /// on-flash index is for.) Otherwise, with too many chunks dirty, writes maps alone
    /// (`write_maps_early`).
    pub(crate) fn maybe_checkpoint(&mut self) -> Result<(), FsError> {
        // With a write-back thread, groups still to be written ahead are left to it (a sync
        // or a writer at the hard limit would write them all in its own hold), unless the
        // checkpoint is late.
        let leave = self.opts.background_write_back && self.groups_ahead() > 0 && !self.checkpoint_late();
        if self.checkpoint_due() && !leave {
            self.checkpoint()?;
        } else if self.maps_due() {
            self.write_maps_early(self.maps_ahead(0))?;
        }
        Ok(())
    }

    /// Whether [`maybe_checkpoint`](Self::maybe_checkpoint) would write one now.
    pub(crate) fn checkpoint_due(&self) -> bool {
        if self.cleaner.is_running() || self.cp.writing {
            return false;
        }
        // (Chunks changed since the last checkpoint are bounded by writing their maps
        // early: `maps_due`.) A namespace down to half of what the last checkpoint held
        // is due too: the space budget holds the last one's size twice (it and the one a
        // mount may start from stay on flash), which after deleting most files would be
        // free space withheld until the log grew the interval.
        let shrunk = (self.inode_count() as u64) < self.budget.checkpoint_inodes() / 2;
        self.log_since_checkpoint() >= self.checkpoint_interval() || shrunk
    }

    /// Whether a due checkpoint has waited three intervals more: the write-back thread then
    /// writes it whatever is dirty, so the replay after a power cut reads at most four
    /// intervals of log. (Waiting, the thread writes back the dirty data a writer left, up
    /// to the hard limit: a log page per 2 KiB of it.)
    pub(crate) fn checkpoint_overdue(&self) -> bool {
        self.log_since_checkpoint() >= 4 * self.checkpoint_interval()
    }

    /// Whether a due checkpoint has waited an interval more: writers then wait for the
    /// write-back thread at half the dirty limit, so that it can get dirty data down for it.
    pub(crate) fn checkpoint_late(&self) -> bool {
        self.log_since_checkpoint() >= 2 * self.checkpoint_interval()
    }

    fn log_since_checkpoint(&self) -> u64 {
        self.log_pages_written().saturating_sub(self.cp.mark.0)
    }

    /// Log pages between two checkpoints: eight times the last one's pages, so that it costs
    /// at most an eighth more pages written. Counted before compression too, with the maps
    /// written for it, up to a sixteenth of the chip, so that its CPU (encoding and
    /// compressing go by those bytes) stays near an eighth of the log's: with PostMark's
    /// 3,000 files, counted by its pages on flash alone, a checkpoint every MiB of log cost
    /// five times that MiB's write-back; under random 4 KiB writes, the maps of every chunk
    /// were encoded again every 256 pages written. (The cap keeps a small chip's log since
    /// the checkpoint, which the cleaner cannot take, small.)
    fn checkpoint_interval(&self) -> u64 {
        let (_, flash, raw) = self.cp.mark;
        let page = self.page.size() as u64;
        let chip_pages = self.segment_capacity() * u64::from(self.store.segments()) / page;
        CHECKPOINT_MIN_PAGES.max(8 * flash).max((8 * raw).min(chip_pages / 16))
    }

    /// Pages written into data blocks since the store was opened: what a replay reads (the
    /// spares of all, the data pages whole).
    fn log_pages_written(&self) -> u64 {
        let s = self.store.stats();
        s.data_pages + s.group_parity_pages + s.pad_pages
    }

    /// Writes everything out, then the state as a checkpoint node, and makes it durable.
    pub fn checkpoint(&mut self) -> Result<(), FsError> {
        // Restored, not cleared: a checkpoint the cleaner writes inside this one's flush
        // must not let the flush start yet another.
        let was = std::mem::replace(&mut self.cp.writing, true);
        let r = self.write_checkpoint();
        self.cp.writing = was;
        r
    }

    fn write_checkpoint(&mut self) -> Result<(), FsError> {
        self.drop_orphans()?;
        self.cleaner.unpin_all();
        self.flush_data()?;
        if self.page.fill() > 0 {
            self.seal_page()?;
        }
        // The index chunks changed since the last checkpoint, before the checkpoint that
        // refers to them (their data is on the flash already).
        self.write_maps()?;
        if self.page.fill() > 0 {
            self.seal_page()?;
        }
        // A chip with no page left refuses the checkpoint here, before its groups fill the
        // page being filled (which would leave no room for the small operations, deletes
        // among them, that a full chip must still take).
        if self.store.next_page_opens_segment() && self.store.free_segments() == 0 {
            return Err(FsError::NoSpace);
        }
        // Then the groups changed since (most were written ahead by the write-back thread:
        // `groups_ahead`), which name those maps, before the checkpoint that names them.
        self.write_groups(usize::MAX)?;
        if self.page.fill() > 0 {
            self.seal_page()?;
        }
        debug_assert!(self.groups.all_written() && self.groups_match_state(), "every change is in a group");
        if self.index.counts_stale() {
            let (usage, totals, lost) = self.recount();
            if lost == 0 {
                self.index.set_counts(usage, totals);
            }
        }
        let (blob, zstd, raw) = self.state_payload();
        let codec = if zstd { FLAG_ZSTD } else { 0 };
        let version = self.page.next_version();
        let mut first: Option<u32> = None;
        let mut done = 0;
        let mut waiting_for_first = false;
        while done < blob.len() || blob.is_empty() {
            if self.page.fill() + FRAG_HEADER + 16 > self.page.size() {
                let addr = self.seal_page_with(waiting_for_first)?;
                if waiting_for_first {
                    first = Some(addr.0);
                    waiting_for_first = false;
                }
            }
            let room = self.page.size() - self.page.fill() - FRAG_HEADER;
            let n = room.min(blob.len() - done);
            let f = Frag {
                kind: NodeKind::Checkpoint,
                flags: codec | if done + n == blob.len() { FLAG_LAST } else { 0 },
                len: n as u16,
                total: blob.len() as u32,
                key: 0,
                key2: 0,
                version,
            };
            if first.is_none() && done == 0 {
                waiting_for_first = true;
            }
            self.page.put(&f, &[&blob], done);
            done += n;
            if blob.is_empty() {
                break;
            }
        }
        let addr = self.seal_page_with(first.is_none())?;
        let first = first.unwrap_or(addr.0);
        let segment = self.segment_logical(PageAddr(first)).unwrap_or(0);
        self.store.sync()?;
        self.tier_checkout()?;
        // Durable: now mount may start from it. Only an anchored checkpoint lets the
        // cleaner release the segments before it (the chain starts there).
        self.store.record_checkpoint(PageAddr(first))?;
        self.cp.newest = Some(CkptAt { page: first, segment });
        self.cp.newest_maps = self.segments_named();
        self.stats.checkpoints += 1;
        let room = (self.page.size() - FRAG_HEADER) as u64;
        let pages = blob.len().div_ceil(room as usize) as u64;
        // Its maps and groups, written with it or ahead of it, count as part of it.
        let (group_raw, group_stored) = self.groups.take_bytes();
        let raw = raw as u64 + self.index.take_map_bytes() + group_raw;
        let raw_pages = raw.div_ceil(room);
        let group_pages = group_stored.div_ceil(room);
        self.cp.mark = (self.log_pages_written(), pages + group_pages, raw_pages);
        self.stats.checkpoint_bytes = blob.len() as u64;
        // What a mount needs of it: the node and every group it names.
        let on_flash = blob.len() as u64 + pages * FRAG_HEADER as u64 + self.groups.bytes();
        self.budget.checkpoint(on_flash, self.inode_count());
        Ok(())
    }

    pub(crate) fn segment_logical(&self, addr: PageAddr) -> Option<u64> {
        let phys = self.store.segment_of(addr)?;
        self.store.used_segments().iter().find(|u| u.physical == phys).map(|u| u.logical)
    }

    /// The page a new segment starts with: where the newest checkpoint is, and (version 9) a
    /// copy of the superblock, which a mount finds when every other copy is lost.
    pub(crate) fn segment_info_page(&mut self) -> Vec<u8> {
        let mut page = vec![0u8; self.page.size()];
        let (ptr, seg) = self.cp.newest.map_or((PENDING, 0), |c| (c.page, c.segment));
        let mut payload = Vec::with_capacity(SEGMENT_INFO_LEN);
        payload.put_u32(ptr);
        payload.put_u64(seg);
        payload.extend_from_slice(&self.store.superblock_bytes());
        debug_assert_eq!(payload.len(), SEGMENT_INFO_LEN);
        let version = self.page.next_version();
        let f = Frag {
            kind: NodeKind::SegmentInfo,
            flags: FLAG_LAST,
            len: payload.len() as u16,
            total: payload.len() as u32,
            key: 0,
            key2: 0,
            version,
        };
        f.encode(&mut page[..FRAG_HEADER]);
        page[FRAG_HEADER..FRAG_HEADER + payload.len()].copy_from_slice(&payload);
        page
    }
}

/// A segment-info node's payload: the checkpoint pointer (12 bytes), then the superblock.
const SEGMENT_INFO_LEN: usize = 12 + crate::store::layout::SUPERBLOCK_LEN;

/// The superblock copy a segment-info node carries (version 9), if the page starts with one.
pub(crate) fn segment_info_superblock(page: &[u8]) -> Option<&[u8]> {
    let f = Frag::decode(page).ok()??;
    if f.kind != NodeKind::SegmentInfo || (f.len as usize) < SEGMENT_INFO_LEN {
        return None;
    }
    page.get(FRAG_HEADER + 12..FRAG_HEADER + SEGMENT_INFO_LEN)
}

/// Reads a segment-info node's checkpoint pointer from a page.
pub(crate) fn segment_info(page: &[u8]) -> Option<Option<CkptAt>> {
    let f = Frag::decode(page).ok()??;
    if f.kind != NodeKind::SegmentInfo || f.len < 12 {
        return None;
    }
    let b = &page[FRAG_HEADER..];
    let mut r = Reader::new(b);
    let (ptr, segment) = (r.u32()?, r.u64()?);
    Some((ptr != PENDING).then_some(CkptAt { page: ptr, segment }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::namespace::Namespace;
    use crate::fs::recovery::checkpoint::decode_payload;

    /// Version 7's first part: the magic, the next inode number and the inodes (about half of
    /// it; the names and the index are the other half).
    fn encode_inodes(ns: &Namespace) -> Vec<u8> {
        // About what it takes (an inode's record is 84 bytes), so that the vector is not copied
        // as it grows.
        let mut v = Vec::with_capacity(16 + ns.len() * 84);
        v.put_u32(MAGIC);
        v.put_u64(ns.next_ino());
        v.put_u32(ns.len() as u32);
        for (ino, i) in ns.inodes() {
            i.put_record(*ino, &mut v);
        }
        v
    }

    /// Version 7's names: its second part's beginning.
    fn encode_names(ns: &Namespace, v: &mut Vec<u8>) {
        let entries: usize = ns.dirs().map(|(_, d)| d.len()).sum();
        v.put_u32(entries as u32);
        for (parent, d) in ns.dirs() {
            for (name, child) in d {
                v.put_u64(*parent);
                v.put_u64(*child);
                v.put_u16(name.len() as u16);
                v.extend_from_slice(name);
            }
        }
    }

    /// A payload of two frames (the inodes, then the rest) decodes as the state it was
    /// made from, as a payload of one did; and one whose frames do not add up to the length
    /// it gives is refused, not half read.
    #[test]
    fn a_state_in_two_frames_reads_back_as_one() {
        let mut ns = Namespace::default();
        let inodes = (2..300u64).map(|ino| (ino, crate::fs::namespace::sample_file(ino))).collect();
        let names = (2..300u64).map(|ino| (format!("file-{ino}").into_bytes(), ino)).collect();
        ns.replace(inodes, [(1, names)].into_iter().collect(), 300);
        let mut rest = Vec::new();
        encode_names(&ns, &mut rest);
        rest.put_u32(0); // no pages listed (a version 4 state)
        let (payload, zstd, len) = payload_of(&[&encode_inodes(&ns), &rest]);
        assert!(zstd && payload.len() < len, "compressed: {} of {len} bytes", payload.len());
        let state = decode_payload(FLAG_ZSTD, &payload).expect("two frames decode");
        assert_eq!((state.next_ino, state.inodes.len()), (300, 298));
        assert!(state
            .inodes
            .iter()
            .all(|(ino, i)| ns.get(*ino).expect("written").attr == i.attr && i.version == ino * 3));
        assert_eq!(state.dirs.get(&1), ns.entries(1));
        // The second frame cut off: the length no longer matches, and nothing is returned.
        let short = &payload[..payload.len() - 3];
        assert!(decode_payload(FLAG_ZSTD, short).is_none());
    }
}
