//! Writing nodes: metadata operations whole in one page, file data fragmented across pages,
//! data before the inodes that refer to it.

use bitmend_media::nand::Nand;

use super::map::keys::Pending;
use super::Ino;
use super::{Fs, Loc, LOGICAL_PAGE, SKIP_AFTER_INCOMPRESSIBLE, SKIP_AFTER_INCOMPRESSIBLE_MAX};

/// A file's compression attempts held off after poor ones.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Skip {
    /// Pages still to store plain untried.
    pub left: u32,
    /// Pages the last hold-off lasted.
    pub last: u32,
}
use crate::fs::cache::DirtyPage;
use crate::fs::node::{self, Frag, NodeKind, FLAG_LAST, FRAG_HEADER, MAX_NODE_PAGES};
use crate::store::PageAddr;
use crate::FsError;
use crate::{Corruption, PosixError};

/// Maps a write-back step writes at most when too many chunks are dirty: about a quarter
/// of a step's hold (a small file's map, not offered to zstd, takes 1 to 2 us).
const MAPS_PER_STEP: usize = 128;
/// Bytes of the page being filled that file data, maps and groups leave to metadata when
/// the chip has no page left after it (see `put_node`).
const LAST_PAGE_KEPT: usize = 512;
/// Dirty maps the steps leave for a due checkpoint to write in its one hold: each is a group
/// it must write too.
const MAPS_LEFT: usize = 16;

/// File data and inodes changed but not yet written out. Only this file changes it: the
/// operations hand it pages and inodes through the methods below.
#[derive(Debug, Default)]
pub(crate) struct WriteBack {
    /// Dirty logical pages with their CRCs, by (ino, page index).
    dirty: std::collections::BTreeMap<(u64, u64), DirtyPage>,
    /// Inodes whose node must be written again (size, times).
    dirty_inodes: std::collections::BTreeSet<u64>,
    /// Per file: logical pages still to store plain without trying to compress them, and
    /// how many pages the last skip was (the next after a poor attempt is twice as long).
    skip_compression: std::collections::HashMap<u64, Skip>,
    /// When the oldest change not yet made durable was made (none: everything is synced).
    /// The mount's commit interval is measured from it.
    unsynced_since: Option<std::time::Instant>,
}

impl WriteBack {
    pub fn get(&self, key: (u64, u64)) -> Option<&DirtyPage> {
        self.dirty.get(&key)
    }

    /// A dirty page for the read checks, which stamp it when they check it (and for
    /// memory-error injection).
    pub fn get_mut(&mut self, key: (u64, u64)) -> Option<&mut DirtyPage> {
        self.dirty.get_mut(&key)
    }

    pub fn contains(&self, key: (u64, u64)) -> bool {
        self.dirty.contains_key(&key)
    }

    /// Dirty logical pages.
    pub fn len(&self) -> usize {
        self.dirty.len()
    }

    /// Inodes waiting to be written.
    pub fn inodes_waiting(&self) -> usize {
        self.dirty_inodes.len()
    }

    /// Nothing to write: no page and no inode.
    pub fn is_clean(&self) -> bool {
        self.dirty.is_empty() && self.dirty_inodes.is_empty()
    }

    /// The dirty pages from `from` on, in order.
    pub fn from(&self, from: (u64, u64)) -> impl Iterator<Item = (&(u64, u64), &DirtyPage)> {
        self.dirty.range(from..)
    }

    /// The indexes of `ino`'s dirty pages.
    pub fn pages_of(&self, ino: u64) -> impl Iterator<Item = u64> + '_ {
        self.dirty.range((ino, 0)..=(ino, u64::MAX)).map(|(k, _)| k.1)
    }

    /// Makes `page` the dirty copy of `key`.
    pub fn put(&mut self, key: (u64, u64), page: DirtyPage) {
        self.dirty.insert(key, page);
    }

    pub fn take(&mut self, key: (u64, u64)) -> Option<DirtyPage> {
        self.dirty.remove(&key)
    }

    /// The dirty pages among `keys`, taken out (to be written now).
    pub fn take_some(&mut self, keys: &[(u64, u64)]) -> Vec<((u64, u64), DirtyPage)> {
        keys.iter().filter_map(|k| self.dirty.remove_entry(k)).collect()
    }

    /// Drops `ino`'s dirty pages in `pages` (cut, punched or deleted).
    pub fn drop_pages(&mut self, ino: u64, pages: std::ops::Range<u64>) {
        self.dirty.retain(|k, _| k.0 != ino || !pages.contains(&k.1));
    }

    /// The node of `ino` must be written again.
    pub fn mark_inode(&mut self, ino: u64) {
        self.dirty_inodes.insert(ino);
    }

    /// Whether `ino`'s node waits to be written again (memory is ahead of flash there).
    pub fn inode_waits(&self, ino: u64) -> bool {
        self.dirty_inodes.contains(&ino)
    }

    /// Whether file `ino` has dirty pages.
    pub fn has_pages_of(&self, ino: u64) -> bool {
        self.dirty.range((ino, 0)..=(ino, u64::MAX)).next().is_some()
    }

    /// Dirty file data, in bytes.
    pub fn dirty_bytes(&self) -> usize {
        self.dirty.len() * LOGICAL_PAGE
    }

    /// Notes a change that the next `sync` makes durable.
    pub fn note_unsynced(&mut self) {
        self.unsynced_since.get_or_insert_with(std::time::Instant::now);
    }

    /// When the oldest change that is not yet durable was made.
    pub fn unsynced_since(&self) -> Option<std::time::Instant> {
        self.unsynced_since
    }

    /// Holds compression attempts for `ino` off after a poor one: for
    /// [`SKIP_AFTER_INCOMPRESSIBLE`] pages, twice as long (plus one) as the last hold-off if
    /// the attempt that ended it was poor too, up to [`SKIP_AFTER_INCOMPRESSIBLE_MAX`].
    pub fn skip_after_incompressible(&mut self, ino: u64) {
        if self.skip_compression.len() >= 4096 && !self.skip_compression.contains_key(&ino) {
            self.skip_compression.clear();
        }
        let s = self.skip_compression.entry(ino).or_default();
        let next = if s.last == 0 { SKIP_AFTER_INCOMPRESSIBLE } else { s.last * 2 + 1 };
        s.last = next.min(SKIP_AFTER_INCOMPRESSIBLE_MAX);
        s.left = s.last;
    }

    /// `ino` is gone: nothing of it is written.
    pub fn forget(&mut self, ino: u64) {
        self.drop_pages(ino, 0..u64::MAX);
        self.dirty_inodes.remove(&ino);
        self.skip_compression.remove(&ino);
    }
}

/// The head of the log: the flash page being filled with nodes and how far, and the
/// newest version a node was given (node versions order the log).
#[derive(Debug)]
pub(crate) struct OpenPage {
    buf: Vec<u8>,
    fill: usize,
    /// Logical pages with fragments in `buf`.
    keys: Vec<(u64, u64)>,
    version: u64,
}

impl OpenPage {
    pub fn new(page_size: usize) -> OpenPage {
        OpenPage { buf: vec![0; page_size], fill: 0, keys: Vec::new(), version: 1 }
    }

    /// The version for the next node.
    pub fn next_version(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// The newest version given.
    pub fn last_version(&self) -> u64 {
        self.version
    }

    /// Replay found a node of version `v`: new nodes are newer.
    pub fn replayed_version(&mut self, v: u64) {
        self.version = self.version.max(v);
    }

    /// Bytes in a flash page.
    pub fn size(&self) -> usize {
        self.buf.len()
    }

    /// Bytes filled so far.
    pub fn fill(&self) -> usize {
        self.fill
    }

    /// Bytes `r` of the page being filled (a fragment not yet on flash).
    pub fn bytes(&self, r: std::ops::Range<usize>) -> Option<&[u8]> {
        self.buf.get(r)
    }

    /// Appends fragment `f`: its header, then its `f.len` bytes of `pieces` (the payload in
    /// parts) from byte `from` on. Returns where its bytes start in the page.
    pub fn put(&mut self, f: &Frag, pieces: &[&[u8]], from: usize) -> u16 {
        let at = self.fill;
        f.encode(&mut self.buf[at..at + FRAG_HEADER]);
        let (mut to, mut skip, mut left) = (at + FRAG_HEADER, from, f.len as usize);
        for piece in pieces {
            if left == 0 {
                break;
            }
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            let n = (piece.len() - skip).min(left);
            self.buf[to..to + n].copy_from_slice(&piece[skip..skip + n]);
            (to, skip, left) = (to + n, 0, left - n);
        }
        assert_eq!(left, 0, "a fragment past the end of its payload");
        // What will be programmed reads back as what was meant (the write side paired with
        // the read side).
        debug_assert_eq!(Frag::decode(&self.buf[at..]), Ok(Some(*f)));
        self.fill = to;
        (at + FRAG_HEADER) as u16
    }
}

/// A node about to be written.
pub(crate) struct Out {
    pub kind: NodeKind,
    pub key: u64,
    pub key2: u64,
    pub payload: Vec<u8>,
}

impl Out {
    /// The header of this node as one fragment (a metadata node is never split).
    pub fn whole_frag(&self, version: u64) -> Frag {
        Frag {
            kind: self.kind,
            flags: FLAG_LAST,
            len: self.payload.len() as u16,
            total: self.payload.len() as u32,
            key: self.key,
            key2: self.key2,
            version,
        }
    }
}

impl<N: Nand> Fs<N> {
    pub(crate) fn inode_node(&self, ino: u64) -> Out {
        let i = self.ns.get(ino).expect("an inode written is in the namespace");
        Out { kind: NodeKind::Inode, key: ino, key2: 0, payload: node::encode_inode(&i.attr, &i.target) }
    }

    pub(crate) fn dirent_node(parent: u64, name: &[u8], child: u64) -> Out {
        Out { kind: NodeKind::Dirent, key: parent, key2: 0, payload: node::encode_dirent(child, name) }
    }

    /// Appends the page being filled to the store (zeros after the last fragment) and points
    /// the fragments that were pending in it at their flash page. A new segment starts with a
    /// page naming the newest checkpoint.
    pub(crate) fn seal_page(&mut self) -> Result<PageAddr, FsError> {
        self.seal_page_with(false)
    }

    /// As [`seal_page`](Self::seal_page); `marked` flags the page in its spare as the start of
    /// a checkpoint.
    pub(crate) fn seal_page_with(&mut self, marked: bool) -> Result<PageAddr, FsError> {
        if self.store.next_page_opens_segment() {
            let info = self.segment_info_page();
            self.store.append(&info)?;
            self.cp.newest_is_mount_start();
        }
        self.page.buf[self.page.fill..].fill(0);
        let addr = if marked {
            self.store.append_marked(&self.page.buf)?
        } else {
            self.store.append(&self.page.buf)?
        };
        let keys = std::mem::take(&mut self.page.keys);
        self.fix_pending(addr, keys);
        self.page.fill = 0;
        Ok(addr)
    }

    /// Puts fragment `f` in the page being filled: its header, then `f.len` bytes of the
    /// payload made of `pieces` back to back, from byte `from` on.
    fn put_frag(&mut self, f: &Frag, pieces: &[&[u8]], from: usize) -> u16 {
        self.wb.note_unsynced();
        self.page.put(f, pieces, from)
    }

    /// Writes the nodes of one metadata operation into one page (starting a fresh page if the
    /// current one has no room for all of them), so that they reach the flash together; with
    /// an NVRAM tier, they are durable in it on return.
    pub(crate) fn commit(&mut self, nodes: Vec<Out>) -> Result<(), FsError> {
        self.commit_nodes(nodes, true)
    }

    /// As [`commit`](Self::commit); `record` false leaves the tier out (write-back's inode
    /// nodes: the tier holds them from the write that changed them).
    fn commit_nodes(&mut self, nodes: Vec<Out>, record: bool) -> Result<(), FsError> {
        let need: usize = nodes.iter().map(|n| FRAG_HEADER + n.payload.len()).sum();
        if need > self.page.buf.len() {
            return Err(PosixError::Invalid {
                why: format!("an operation of {need} bytes does not fit in a page"),
            }
            .into());
        }
        if self.page.fill + need > self.page.buf.len() {
            self.seal_page()?;
        }
        let start = self.page.fill;
        for n in nodes {
            let version = self.page.next_version();
            if n.kind == NodeKind::Inode {
                self.ns.set_version(n.key, version);
            }
            // Its group is written again before the next checkpoint.
            self.groups.mark_node(n.kind, n.key, &n.payload);
            self.put_frag(&n.whole_frag(version), &[&n.payload], 0);
        }
        if record && self.tier.is_some() {
            let bytes = self.page.buf[start..self.page.fill].to_vec();
            self.tier_nodes(&bytes)?;
        }
        self.maybe_clean()
    }

    /// Writes a run of consecutive dirty logical pages of a file as one data node compressed
    /// together when that saves at least an eighth, else a node per page, each with the CRC
    /// the cache carried. A run the cleaner moved whole is cold: compressed at
    /// [`FsOptions::lz4_level`], else at the writer's level. The pages are joined into one
    /// buffer only to be compressed together: stored a page per node, each goes from the
    /// cache to its node as it is.
    fn write_data_run(&mut self, ino: u64, first: u64, pages: &[DirtyPage]) -> Result<(), FsError> {
        let count = pages.len();
        let cold = pages.iter().all(|p| p.moved);
        let wanted = self.opts.compression.flag();
        let level = if cold { self.opts.lz4_level } else { self.opts.lz4_write_level };
        if count > 1 && wanted != 0 && self.wb.skip_compression.get(&ino).is_none_or(|s| s.left == 0) {
            let crcs: Vec<u32> = pages.iter().map(|p| p.crc).collect();
            let mut joined = Vec::with_capacity(count * LOGICAL_PAGE);
            pages.iter().for_each(|p| joined.extend_from_slice(&p.bytes));
            let (payload, codec) = node::encode_data(&joined, &crcs, wanted, level);
            let content = joined.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            if codec != 0 && payload.len() - 4 * count <= content - content / 8 {
                self.wb.skip_compression.remove(&ino);
                self.stats.multi_page_nodes += 1;
                self.stats.pages_in_multi_page_nodes += count as u64;
                return self.write_data_node(ino, first, joined.len(), &[&payload], codec, &crcs);
            }
            // Tried and found wanting: stored plain a page per node (a read of one need not
            // read the others), and, judged as a page alone would be (see `write_page`),
            // the pages that follow are stored plain untried.
            if content >= joined.len() / 2 {
                self.wb.skip_after_incompressible(ino);
            }
            for (i, p) in pages.iter().enumerate() {
                let (crc, plain) = node::plain_data(&p.bytes, p.crc);
                self.write_data_node(ino, first + i as u64, LOGICAL_PAGE, &[&crc, plain], 0, &[p.crc])?;
            }
            return Ok(());
        }
        for (i, p) in pages.iter().enumerate() {
            self.write_page_at(ino, first + i as u64, &p.bytes, p.crc, level)?;
        }
        Ok(())
    }

    /// Writes one logical page of file data, whose CRC is `crc`, as a data node of its own.
    pub(crate) fn write_page(&mut self, ino: u64, index: u64, page: &[u8], crc: u32) -> Result<(), FsError> {
        self.write_page_at(ino, index, page, crc, self.opts.lz4_write_level)
    }

    /// As [`write_page`](Self::write_page), compressed with lz4 at `level`.
    fn write_page_at(
        &mut self,
        ino: u64,
        index: u64,
        page: &[u8],
        crc: u32,
        level: u8,
    ) -> Result<(), FsError> {
        // After a page of a file that compressed poorly (by less than an eighth), the next
        // pages of that file are stored plain without trying (then one is tried again): data
        // that does not compress (media, archives, encrypted files) does not pay for an
        // attempt per page, which costs more CPU than the whole rest of the write path.
        let wanted = self.opts.compression.flag();
        let attempt = match self.wb.skip_compression.get_mut(&ino) {
            Some(skip) if skip.left > 0 => {
                skip.left -= 1;
                self.stats.compression_skipped += 1;
                0
            }
            _ => wanted,
        };
        if attempt == 0 {
            // Plain: the page goes from the cache to the flash page buffer with no payload
            // built in between.
            let (crc_bytes, plain) = node::plain_data(page, crc);
            return self.write_data_node(ino, index, page.len(), &[&crc_bytes, plain], 0, &[crc]);
        }
        let (payload, codec) = node::encode_data(page, &[crc], attempt, level);
        // The payload carries a 4-byte CRC before the page. Judged on the page's bytes up to
        // its trailing zeros: a short last page (or a hole) says nothing of the rest.
        let content = page.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        if content >= page.len() / 2 && (codec == 0 || payload.len() - 4 > content - content / 8) {
            self.wb.skip_after_incompressible(ino);
        } else {
            self.wb.skip_compression.remove(&ino);
        }
        self.write_data_node(ino, index, page.len(), &[&payload], codec, &[crc])
    }

    /// Writes a data node of `crcs.len()` logical pages from `first` on, in fragments across
    /// as many flash pages as it needs; the index entries are in place (with pending
    /// fragments) on return.
    fn write_data_node(
        &mut self,
        ino: u64,
        first: u64,
        logical: usize,
        payload: &[&[u8]],
        codec: u8,
        crcs: &[u32],
    ) -> Result<(), FsError> {
        self.stats.data_bytes += logical as u64;
        self.stats.data_stored += payload.iter().map(|p| p.len() as u64).sum::<u64>();
        let version = self.page.next_version();
        let count = crcs.len();
        for (slot, &crc) in crcs.iter().enumerate() {
            let loc = Loc {
                frags: Vec::new(),
                codec,
                version,
                crc: Some(crc),
                slot: slot as u8,
                count: count as u8,
            };
            self.set_loc((ino, first + slot as u64), loc)?;
        }
        let flags = codec | Frag::pages_flags(count);
        self.put_node(
            NodeKind::Data,
            flags,
            (ino, first),
            version,
            payload,
            Pending::Data((ino, first), count),
        )
    }

    /// Writes a node in fragments across as many flash pages as it needs, recording each
    /// fragment (pending until its page is sealed) where `into` says.
    pub(crate) fn put_node(
        &mut self,
        kind: NodeKind,
        flags: u8,
        key: (u64, u64),
        version: u64,
        payload: &[&[u8]],
        into: Pending,
    ) -> Result<(), FsError> {
        let total: usize = payload.iter().map(|p| p.len()).sum();
        // With no page left to seal this one into a new segment, its last bytes are kept
        // for the metadata of small operations (a truncate, a delete), which an NVRAM tier
        // makes durable without a seal: file data, maps and groups stop short of them.
        let end = if self.store.free_segments() == 0 && self.store.next_page_opens_segment() {
            self.page.buf.len() - LAST_PAGE_KEPT
        } else {
            self.page.buf.len()
        };
        let mut done = 0;
        while done < total {
            // A fragment needs its header and at least a few bytes: otherwise start afresh.
            if self.page.fill + FRAG_HEADER + 16 > end {
                self.seal_page()?;
            }
            let room = end.max(self.page.fill + FRAG_HEADER) - self.page.fill - FRAG_HEADER;
            let n = room.min(total - done);
            let last = done + n == total;
            let f = Frag {
                kind,
                flags: flags | if last { FLAG_LAST } else { 0 },
                len: n as u16,
                total: total as u32,
                key: key.0,
                key2: key.1,
                version,
            };
            let off = self.put_frag(&f, payload, done);
            match into {
                Pending::Data(first, count) => {
                    for slot in 0..count as u64 {
                        let key = (first.0, first.1 + slot);
                        self.index.push_pending(key, off, n as u16);
                        if !self.page.keys.contains(&key) {
                            self.page.keys.push(key);
                        }
                    }
                }
                Pending::Map(ck) => self.index.pend_map(ck, off, n as u16),
                Pending::Group(g) => self.groups.pend_group(g, off, n as u16),
            }
            done += n;
        }
        Ok(())
    }

    /// Writes every dirty logical page (runs of consecutive pages of a file together, up to
    /// [`FsOptions::node_pages`](super::FsOptions) and aligned to it), then the inodes whose
    /// size or times changed.
    pub(crate) fn flush_data(&mut self) -> Result<(), FsError> {
        let dirty = std::mem::take(&mut self.wb.dirty);
        self.write_runs(dirty)?;
        self.write_dirty_inodes(true)?;
        self.maybe_clean()?;
        self.maybe_checkpoint()
    }

    /// With [`FsOptions::background_write_back`](super::FsOptions): whether the write-back
    /// thread has work (dirty data past the limit), so it is woken only when it does.
    pub fn write_back_due(&self) -> bool {
        // A due checkpoint is the thread's work too, with little or no file data dirty (a
        // namespace changing): nothing else writes it then, and a writer waits for it at half
        // the limit once it is late ([`Fs::writer_should_wait`]).
        self.opts.background_write_back
            && (self.wb.dirty_bytes() >= self.opts.dirty_limit || self.checkpoint_due())
    }

    /// With [`FsOptions::background_write_back`](super::FsOptions): whether a writer should
    /// wait (without the lock) for the thread before it adds more: dirty data past
    /// [`BACKGROUND_WAIT_LIMIT`](super::BACKGROUND_WAIT_LIMIT) times the limit. The thread
    /// then writes back (and cleans) in short steps while the writer waits, rather than the
    /// writer writing back everything itself at the hard limit in one long hold.
    /// While the background cleaner is behind (free segments one above its reserve), or a
    /// due checkpoint is late (the thread could not bring dirty data down for it while the
    /// writer kept adding), a writer waits at half the limit instead: a checkpoint writes
    /// every dirty page back first, in one hold of the lock, and the writer's data would be in
    /// it. (Waiting whenever one is due cost small-file loads a third: PostMark 3,333 against
    /// 2,000 transactions/s.)
    pub fn writer_should_wait(&self) -> bool {
        if !self.opts.background_write_back {
            return false;
        }
        let limit = if self.cleaner_behind() || self.checkpoint_late() {
            self.opts.dirty_limit / 2
        } else {
            self.opts.dirty_limit.saturating_mul(super::BACKGROUND_WAIT_LIMIT)
        };
        self.wb.dirty_bytes() > limit
    }

    /// With [`FsOptions::background_write_back`](super::FsOptions): whether the write-back
    /// thread, once started, may stop (dirty data down to half the limit).
    ///
    /// With a checkpoint due, down to [`CHECKPOINT_FLUSH_MOST`](super::CHECKPOINT_FLUSH_MOST) pages (if that is less): a checkpoint
    /// writes every dirty page back first, in its one hold of the lock, so the thread brings
    /// dirty data down in its short steps and the step that ends there writes the checkpoint
    /// with little left to flush (unless it is overdue: then at half the limit, as without).
    pub fn write_back_done(&self) -> bool {
        if !self.opts.background_write_back {
            return true;
        }
        // Maps past the bound, or ahead of a checkpoint, are written a step at a time, not
        // in the hold of the next flush or checkpoint.
        if self.maps_ahead(MAPS_LEFT) > 0 {
            return false;
        }
        // So are the groups, unless the checkpoint is late (a writer changing groups as
        // fast as the steps write them would otherwise put it off for ever).
        if self.groups_ahead() > 0 && !self.checkpoint_late() {
            return false;
        }
        let dirty = self.wb.dirty_bytes();
        let half = self.opts.dirty_limit / 2;
        if self.checkpoint_due() && !self.checkpoint_overdue() {
            dirty <= half.min(super::CHECKPOINT_FLUSH_MOST * LOGICAL_PAGE)
        } else {
            dirty <= half
        }
    }

    /// One step of the write-back thread: writes about `pages` dirty logical pages (the
    /// first in (file, page) order, whole runs), then the inodes none of whose pages are
    /// dirty any more (an inode's size never reaches the flash before its data). The thread
    /// takes the lock for one step at a time, so that a request waits for at most one step.
    /// Returns the pages written.
    pub fn write_back_step(&mut self, pages: usize) -> Result<usize, FsError> {
        let batch = self.take_dirty(pages);
        let written = batch.len();
        self.write_runs(batch)?;
        self.write_dirty_inodes(false)?;
        self.maybe_clean()?;
        let ahead = self.maps_ahead(MAPS_LEFT);
        if ahead > 0 {
            self.write_maps_early(ahead.min(MAPS_PER_STEP))?;
        }
        // Then the groups those maps and this step's inodes changed, so that the checkpoint
        // has few left to write in its one hold.
        let groups = self.groups_ahead();
        if groups > 0 {
            self.write_groups(groups.min(super::map::groups::GROUPS_PER_STEP))?;
        }
        // A checkpoint writes every dirty page back first, in this one hold of the lock: it
        // is taken in the step that leaves little dirty (a burst's last), not in one that
        // would write back all a streaming writer has added meanwhile while its requests
        // wait for the lock. (A writer that outruns the thread reaches the hard limit, whose
        // flush checkpoints as before.)
        // An overdue one is written now whatever is dirty: a writer that keeps dirty data
        // level would otherwise keep every step from ending a burst, and the log (what a
        // replay reads after a power cut) would grow without bound.
        if self.write_back_done() || self.checkpoint_overdue() {
            self.maybe_checkpoint()?;
        }
        Ok(written)
    }

    /// The first `pages` dirty pages, out of `wb.dirty`, and the rest of the run the last
    /// one is in (so a step does not split a node write-back would have made whole).
    fn take_dirty(&mut self, pages: usize) -> std::collections::BTreeMap<(u64, u64), DirtyPage> {
        if pages >= self.wb.dirty.len() {
            return std::mem::take(&mut self.wb.dirty);
        }
        let most = self.opts.node_pages.clamp(1, MAX_NODE_PAGES) as u64;
        let mut batch = std::collections::BTreeMap::new();
        while let Some(((ino, index), page)) = self.wb.dirty.pop_first() {
            batch.insert((ino, index), page);
            let run_goes_on = self
                .wb
                .dirty
                .first_key_value()
                .is_some_and(|(&(i, next), _)| i == ino && next == index + 1 && next % most != 0);
            if batch.len() >= pages && !run_goes_on {
                break;
            }
        }
        batch
    }

    /// Checks the pages of a run about to be written back against their CRCs (a page
    /// damaged in memory must not reach flash as if sound): a failed one is healed from the
    /// NVRAM tier, else written under the CRC it should have, so that reads of it fail (EIO)
    /// rather than return it.
    fn heal_run(&mut self, ino: u64, first: u64, run: &mut [DirtyPage]) {
        for (i, page) in run.iter_mut().enumerate() {
            if !page.sound() {
                self.heal_page((ino, first + i as u64), page);
            }
        }
    }

    /// Writes the dirty pages `dirty` (taken out of `wb.dirty`) in runs. On an error, what
    /// was not written is dirty again.
    pub(super) fn write_runs(
        &mut self,
        dirty: std::collections::BTreeMap<(u64, u64), DirtyPage>,
    ) -> Result<(), FsError> {
        // An image still marked with an older version (before its first checkpoint here) gets
        // nodes an older build reads.
        let most = if self.store.sb_version >= 5 { self.opts.node_pages.clamp(1, MAX_NODE_PAGES) } else { 1 };
        let mut dirty = dirty.into_iter().peekable();
        let mut run: Vec<DirtyPage> = Vec::with_capacity(most);
        while let Some(((ino, first), page)) = dirty.next() {
            if !self.ns.contains(ino) {
                continue;
            }
            run.clear();
            run.push(page);
            while let Some(&((i, index), _)) = dirty.peek() {
                let next = first + run.len() as u64;
                if i != ino || index != next || index % most as u64 == 0 {
                    break;
                }
                run.push(dirty.next().expect("peeked").1);
            }
            self.heal_run(ino, first, &mut run);
            if let Err(e) = self.write_data_run(ino, first, &run) {
                // Nothing acknowledged is dropped: what was not written stays dirty (the
                // run's pages may be pending in the page being filled: written again). But
                // a run whose index chunk became unreadable since it was accepted cannot be
                // written ever: kept, it would fail every later sync. (The lock is held from
                // the take to here: no write can have made any of them newer since.)
                let lost_map = matches!(
                    e,
                    FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })
                );
                if !lost_map {
                    for (i, p) in run.drain(..).enumerate() {
                        self.wb.dirty.insert((ino, first + i as u64), p);
                    }
                }
                self.wb.dirty.extend(dirty);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Writes the node of every dirty inode (`all`), or of those none of whose pages are
    /// dirty: an inode's size goes to flash only after the data it covers.
    fn write_dirty_inodes(&mut self, all: bool) -> Result<(), FsError> {
        let inodes = std::mem::take(&mut self.wb.dirty_inodes);
        let wb = &self.wb;
        let settled = |ino: &u64| all || wb.pages_of(*ino).next().is_none();
        let (ready, waiting): (Vec<u64>, Vec<u64>) = inodes.into_iter().partition(settled);
        self.wb.dirty_inodes.extend(waiting);
        let mut inodes = ready.into_iter();
        while let Some(ino) = inodes.next() {
            if self.ns.contains(ino) {
                let n = self.inode_node(ino);
                if let Err(e) = self.commit_nodes(vec![n], false) {
                    self.wb.dirty_inodes.insert(ino);
                    self.wb.dirty_inodes.extend(inodes);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The dirty data past which a `write` writes back itself.
    pub(crate) fn write_back_limit(&self) -> usize {
        if self.opts.background_write_back {
            self.opts.dirty_limit.saturating_mul(super::BACKGROUND_HARD_LIMIT)
        } else {
            self.opts.dirty_limit
        }
    }

    /// Writes out everything and makes it durable and correctable.
    pub fn sync(&mut self) -> Result<(), FsError> {
        self.flush_data()?;
        if self.page.fill > 0 {
            self.seal_page()?;
        }
        self.store.sync()?;
        self.wb.unsynced_since = None;
        self.tier_checkout()
    }

    /// When the oldest change that is not yet durable was made; `None` when a crash now
    /// would lose nothing. The mount commits once it is older than its commit interval.
    pub fn unsynced_since(&self) -> Option<std::time::Instant> {
        self.wb.unsynced_since()
    }

    /// `fsync`: as `sync` (one log, so one file's durability is everyone's). With an NVRAM
    /// tier there is nothing to do: every operation was durable in the tier when it returned.
    pub fn fsync(&mut self, ino: Ino) -> Result<(), FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        if !self.ns.contains(ino) {
            return Err(PosixError::NotFound.into());
        }
        if self.tier.is_some() {
            return Ok(());
        }
        self.sync()
    }
}
