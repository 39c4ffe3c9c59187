//! The namespace in groups (format version 8): the inodes, the directory entries and where
//! each index chunk's map is, split by hash into groups, each written as a group node out of
//! place when it changed, as the index's maps are. A checkpoint then holds only where each
//! group is, so that its hold of the lock follows what changed since the last one, not how
//! many files there are (30,000 files: 10-17 ms encoding them all, version 7).
//!
//! What is in a group: the inodes whose number hashes into its range, the entries whose
//! (parent, name) does, and the maps of the runs of [`SUPER_CHUNKS`] chunks whose (file, run)
//! does. An entry is grouped by its name, not by its child, because a node removing an entry
//! names no child. A group is a range of the 64-bit hashes: the hashes whose first `depth`
//! bits are its `prefix` (extendible hashing). A group found holding more than
//! [`SPLIT_AT`] items when it is written is split in two and written as its halves, so the
//! groups grow with the namespace a group at a time, never all at once.
//!
//! What marks a group changed: every metadata node written or replayed (an inode, an entry,
//! extended attributes), and every map written or dropped. The state after a crash is the
//! groups a checkpoint names plus the nodes written after it, so a change that reaches the
//! log marks its group before the next checkpoint, and that checkpoint names a copy written
//! after it. Debug builds check this at every checkpoint: every group, encoded afresh from the
//! state, is the one written (`groups_match_state`).

use std::collections::{BTreeMap, BTreeSet};

use bitmend_code::le::{self, Put, Reader};
use bitmend_media::nand::Nand;

use super::index::{put_frags, read_frags, MapAt};
use super::keys::{
    dir_region, frag_bytes, in_region, ino_region, mix, ChunkKey, Frags, GroupId, MapSummary, NumberMap,
    NumberSet,
};
use crate::fs::namespace::Namespace;
use crate::fs::node::{self, NodeKind};
use crate::fs::{Fs, Inode, PENDING};
use crate::Corruption;
use crate::FsError;

/// A group payload of version 10 (its prefix a u64; version 8's, "NSGR", a u32).
const GROUP_MAGIC: u32 = 0x3247_534E; // "NSG2"
const GROUP_MAGIC_V8: u32 = 0x5247_534E; // "NSGR"
/// A group payload compressed: this magic, the plain payload's length (u32), a zstd frame.
const GROUP_ZSTD_MAGIC: u32 = 0x5A47_534E; // "NSGZ"
/// Bytes before a group payload's inode count: magic, depth, prefix.
const GROUP_HEADER: usize = 4 + 1 + 8;
/// The largest plain group payload a mount decompresses.
const GROUP_MAX: usize = 1 << 28;
/// Consecutive chunks of a file whose maps are grouped together (16 MiB of file): a file of
/// many chunks spreads over groups, not into one that grows with it.
pub(crate) const SUPER_CHUNKS: u64 = 64;
/// Items a group holds at most before it is split as it is written (an inode with its entry
/// is about 150 bytes before compression; a map about 50, counted as a third).
const SPLIT_AT: usize = 128;
/// The deepest a group goes: 2^24 groups in a directory's region.
pub(crate) const MAX_DEPTH: u8 = 20 + 24;
/// Groups the write-back thread writes ahead of a due checkpoint in one step, and how many
/// it leaves for the checkpoint's own hold.
pub(crate) const GROUPS_PER_STEP: usize = 4;
pub(crate) const GROUPS_LEFT: usize = 4;

/// Where a group's node is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupAt {
    pub frags: Frags,
    pub version: u64,
    /// CRC-32C of the plain payload (the check of `groups_match_state`, and of a mount).
    pub crc: u32,
    /// Inodes it holds (version 10: the namespace's size is known without reading the
    /// groups; 0 in a table of version 8 or 9, whose groups are read at mount).
    pub inodes: u32,
}

/// What a group holds (a superset: items gone are dropped when it is next encoded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Members {
    pub(super) inos: BTreeSet<u64>,
    pub(super) names: BTreeSet<(u64, Vec<u8>)>,
    /// (file, run of [`SUPER_CHUNKS`] chunks).
    pub(super) runs: BTreeSet<(u64, u64)>,
}

impl Members {
    /// The members whose hash `into` holds, taken out.
    fn split_off(&mut self, into: GroupId) -> Members {
        let mut out = Members::default();
        let (inos, names, runs) = (&mut self.inos, &mut self.names, &mut self.runs);
        inos.retain(|&i| !(into.holds(inode_hash(i)) && out.inos.insert(i)));
        names.retain(|k| !(into.holds(entry_hash(k.0, &k.1)) && out.names.insert(k.clone())));
        runs.retain(|&(i, r)| !(into.holds(run_hash(i, r)) && out.runs.insert((i, r))));
        out
    }
}

#[derive(Debug)]
pub(crate) struct Groups {
    /// The groups as ranges of hashes: first hash to depth. They cover every hash, once.
    pub(super) ranges: BTreeMap<u64, u8>,
    /// Where each group not empty is, as written last.
    pub(super) at: NumberMap<GroupId, GroupAt>,
    pub(super) members: NumberMap<GroupId, Members>,
    /// Groups changed since written.
    pub(super) dirty: BTreeSet<GroupId>,
    /// Groups with fragments in the page being filled.
    pub(super) buf: Vec<GroupId>,
    /// Bytes of the groups written since the last checkpoint, before compression and on
    /// flash (part of what a checkpoint costs: see `Fs::checkpoint_interval`).
    pub(super) raw_since: u64,
    pub(super) stored_since: u64,
    pub(super) written: u64,
    pub(super) splits: u64,
    /// The last group the on-line check compared (`state_check.rs`): the next step goes on
    /// after it.
    pub(super) checked_to: Option<GroupId>,
    /// Read from a checkpoint of version 8 or 9, whose items were hashed without directory
    /// regions: the mount puts the state in new groups.
    pub(super) hashed_flat: bool,
    /// Groups the table names whose items are not in memory (`paging.rs`).
    pub(super) unread: BTreeSet<GroupId>,
    /// Inodes the unread groups hold, by their table entries (kept, not summed per call:
    /// the checkpoint's trigger asks for it at every write).
    pub(super) unread_inodes: usize,
    /// Inodes without a link found as their group was read: their pages go at the next
    /// checkpoint (`Fs::drop_orphans`), not inside whatever read the group.
    pub(super) orphans: Vec<u64>,
    /// Where the last shedding pass stopped (`shedding.rs`): the next goes on after it.
    pub(super) shed_hand: u64,
    /// Groups an access found read since the shedding pass last went by: spared once.
    pub(super) touched: NumberSet<GroupId>,
    /// Whether the namespace has filled its cache once (only then are accesses noted).
    pub(super) shedding: bool,
    /// Groups let go since mount.
    pub(super) shed: u64,
    /// Every inode memory names has been read (`need_named`): a prune may judge memory.
    pub(super) named_read: bool,
}

impl Default for Groups {
    fn default() -> Self {
        Groups::of_depth(0)
    }
}

/// Hash `h` of an item of inode `ino`, moved into the inode's region if it has one.
fn in_ino_region(ino: u64, h: u64) -> u64 {
    ino_region(ino).map_or(h, |r| in_region(r, h))
}

pub(super) fn inode_hash(ino: u64) -> u64 {
    in_ino_region(ino, mix(ino))
}

pub(super) fn entry_hash(parent: u64, name: &[u8]) -> u64 {
    let crc = bitmend_code::crc::crc32c(name) as u64;
    in_region(
        dir_region(parent),
        mix(parent.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ crc ^ (name.len() as u64) << 32),
    )
}

pub(super) fn run_hash(ino: u64, run: u64) -> u64 {
    in_ino_region(ino, mix(ino ^ run.rotate_left(40) ^ 0x5555_AAAA_0000_0000))
}

pub(super) fn run_range(ino: u64, run: u64) -> std::ops::Range<ChunkKey> {
    let from = run.saturating_mul(SUPER_CHUNKS);
    ChunkKey { ino, chunk: from }..ChunkKey { ino, chunk: from.saturating_add(SUPER_CHUNKS) }
}

/// Group `g`'s payload, from what its members are now, and how many items it holds
/// (maps counted as a third); `None` if it holds nothing. Members gone are dropped on the way.
pub(super) fn encode_group(
    g: GroupId,
    m: &mut Members,
    ns: &Namespace,
    maps: &BTreeMap<ChunkKey, MapAt>,
) -> Option<(Vec<u8>, usize)> {
    let mut inodes: Vec<(u64, &Inode)> = Vec::with_capacity(m.inos.len());
    m.inos.retain(|i| ns.get(*i).map(|inode| inodes.push((*i, inode))).is_some());
    let mut entries: Vec<(u64, &[u8], u64)> = Vec::with_capacity(m.names.len());
    m.names.retain(|(p, n)| {
        // The name as the directory holds it: the member's copy is not borrowed past here.
        let entry = ns.entries(*p).and_then(|d| d.get_key_value(n));
        entry.map(|(n, c)| entries.push((*p, n.as_slice(), *c))).is_some()
    });
    let mut mapped: Vec<(&ChunkKey, &MapAt)> = Vec::new();
    m.runs.retain(|&(ino, r)| {
        let before = mapped.len();
        mapped.extend(maps.range(run_range(ino, r)));
        mapped.len() > before
    });
    if inodes.is_empty() && entries.is_empty() && mapped.is_empty() {
        return None;
    }
    let items = inodes.len() + entries.len() + mapped.len() / 3;
    let mut v = Vec::with_capacity(16 + inodes.len() * 110 + entries.len() * 40 + mapped.len() * 50);
    v.put_u32(GROUP_MAGIC);
    v.put_u8(g.depth);
    v.put_u64(g.prefix);
    v.put_u32(inodes.len() as u32);
    for (ino, i) in inodes {
        i.put_record(ino, &mut v);
        v.put_u64(i.xattr_version);
        if i.xattrs.is_empty() {
            v.put_u32(0);
        } else {
            let x = node::encode_xattrs(&i.xattrs);
            v.put_u32(x.len() as u32);
            v.put_bytes(&x);
        }
    }
    v.put_u32(entries.len() as u32);
    for (parent, name, child) in entries {
        v.put_u64(parent);
        v.put_u64(child);
        v.put_u16(name.len() as u16);
        v.put_bytes(name);
    }
    v.put_u32(mapped.len() as u32);
    for (k, at) in mapped {
        v.put_u64(k.ino);
        v.put_u64(k.chunk);
        v.put_u64(at.version);
        put_frags(&mut v, &at.frags);
        let s = at.summary.unwrap_or(MapSummary { mask: 0, digest: 0 });
        v.put_u64(s.mask);
        v.put_u64(s.digest);
    }
    let crc = bitmend_code::crc::crc32c(&v);
    v.put_u32(crc);
    Some((v, items))
}

/// A group read back: its inodes (with their extended attributes), entries and maps.
#[derive(Debug, Default)]
pub(crate) struct GroupContent {
    pub inodes: Vec<(u64, Inode)>,
    pub entries: Vec<(u64, Vec<u8>, u64)>,
    pub maps: Vec<(ChunkKey, MapAt)>,
}

/// Decodes group `g`'s payload; `None` for bytes that are not that group, whole (or not the
/// copy whose CRC the checkpoint holds).
/// The CRC a group node's payload `b` carries, if the payload passes it (`None`: damaged).
pub(crate) fn sound_group_crc(b: &[u8]) -> Option<u32> {
    let b = node::unpack_zstd(b, GROUP_ZSTD_MAGIC, GROUP_MAX)?;
    let (body, tail) = b.split_at(b.len().checked_sub(4)?);
    let stored = le::get_u32(tail, 0);
    (bitmend_code::crc::crc32c(body) == stored).then_some(stored)
}

pub(crate) fn decode_group(b: &[u8], g: GroupId, crc: u32) -> Option<GroupContent> {
    let b = node::unpack_zstd(b, GROUP_ZSTD_MAGIC, GROUP_MAX)?;
    let (body, tail) = b.split_at(b.len().checked_sub(4)?);
    let stored = le::get_u32(tail, 0);
    if bitmend_code::crc::crc32c(body) != stored || stored != crc {
        return None;
    }
    let mut r = Reader::new(body);
    let prefix = match (r.u32()?, r.u8()? == g.depth) {
        (GROUP_MAGIC, true) => r.u64()?,
        (GROUP_MAGIC_V8, true) => u64::from(r.u32()?),
        _ => return None,
    };
    if prefix != g.prefix {
        return None;
    }
    let mut c = GroupContent::default();
    for _ in 0..r.u32()? {
        let (ino, mut inode) = Inode::take_record(&mut r)?;
        inode.xattr_version = r.u64()?;
        let xlen = r.u32()? as usize;
        if xlen > 0 {
            inode.xattrs = node::decode_xattrs(r.take(xlen)?)?;
        }
        c.inodes.push((ino, inode));
    }
    for _ in 0..r.u32()? {
        let (parent, child) = (r.u64()?, r.u64()?);
        let len = r.u16()? as usize;
        c.entries.push((parent, r.take(len)?.to_vec(), child));
    }
    for _ in 0..r.u32()? {
        let key = ChunkKey { ino: r.u64()?, chunk: r.u64()? };
        let version = r.u64()?;
        let frags = read_frags(&mut r)?;
        let (mask, digest) = (r.u64()?, r.u64()?);
        let summary = (mask != 0).then_some(MapSummary { mask, digest });
        c.maps.push((key, MapAt { frags, version, summary }));
    }
    r.is_empty().then_some(c)
}

/// The depth for groups of a state of `inodes` inodes and `maps` maps, made all at once
/// (after a mount from a version before 8): each group about half of [`SPLIT_AT`].
fn wanted_depth(inodes: usize, maps: usize) -> u8 {
    let items = inodes * 2 + maps / 3;
    let mut depth = 0;
    while depth < MAX_DEPTH && items > (SPLIT_AT / 2) << depth {
        depth += 1;
    }
    depth
}

/// What the rest of the file system reads and tells the groups.
impl Groups {
    /// Where each group is, as written last.
    pub fn table(&self) -> &NumberMap<GroupId, GroupAt> {
        &self.at
    }

    /// Whether the groups were read from a checkpoint of version 8 or 9 (hashed without
    /// directory regions: the mount puts the state in new ones).
    pub fn hashed_before_regions(&self) -> bool {
        self.hashed_flat
    }

    /// Group nodes written since mount.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Whether every change is in a group written.
    pub fn all_written(&self) -> bool {
        self.dirty.is_empty()
    }

    /// Bytes of groups written since the last call, before and after compression (a
    /// checkpoint's cost).
    pub fn take_bytes(&mut self) -> (u64, u64) {
        (std::mem::take(&mut self.raw_since), std::mem::take(&mut self.stored_since))
    }

    /// A fragment of group `g`'s node was put at `off` in the page being filled.
    pub fn pend_group(&mut self, g: GroupId, off: u16, len: u16) {
        if let Some(a) = self.at.get_mut(&g) {
            a.frags.push((PENDING, off, len));
        }
        if !self.buf.contains(&g) {
            self.buf.push(g);
        }
    }
}

impl Groups {
    /// Empty groups, 2^depth of them.
    fn of_depth(depth: u8) -> Groups {
        let ranges = (0..1u64 << depth).map(|p| (GroupId { depth, prefix: p }.start(), depth)).collect();
        Groups {
            ranges,
            at: NumberMap::default(),
            members: NumberMap::default(),
            dirty: BTreeSet::new(),
            buf: Vec::new(),
            raw_since: 0,
            stored_since: 0,
            written: 0,
            splits: 0,
            checked_to: None,
            hashed_flat: false,
            unread: BTreeSet::new(),
            unread_inodes: 0,
            orphans: Vec::new(),
            shed_hand: 0,
            touched: NumberSet::default(),
            shedding: false,
            shed: 0,
            named_read: false,
        }
    }

    /// The group hash `h` falls in.
    pub(super) fn group_of(&self, h: u64) -> GroupId {
        let (&start, &depth) = self.ranges.range(..=h).next_back().expect("the ranges cover every hash");
        self.group_of_start(start, depth)
    }

    /// The group of the range starting at `start`, `depth` bits deep.
    pub(super) fn group_of_start(&self, start: u64, depth: u8) -> GroupId {
        let prefix = if depth == 0 { 0 } else { start >> (64 - depth) };
        GroupId { depth, prefix }
    }

    pub fn mark_inode(&mut self, ino: u64) {
        let g = self.group_of(inode_hash(ino));
        self.members.entry(g).or_default().inos.insert(ino);
        self.dirty.insert(g);
    }

    pub fn mark_entry(&mut self, parent: u64, name: &[u8]) {
        let g = self.group_of(entry_hash(parent, name));
        self.members.entry(g).or_default().names.insert((parent, name.to_vec()));
        self.dirty.insert(g);
    }

    pub fn mark_chunk(&mut self, ck: ChunkKey) {
        let run = ck.chunk / SUPER_CHUNKS;
        let g = self.group_of(run_hash(ck.ino, run));
        self.members.entry(g).or_default().runs.insert((ck.ino, run));
        self.dirty.insert(g);
    }

    fn chunk_group(&self, ck: ChunkKey) -> GroupId {
        self.group_of(run_hash(ck.ino, ck.chunk / SUPER_CHUNKS))
    }

    /// Marks what a metadata node changes (written, or replayed at mount).
    pub fn mark_node(&mut self, kind: NodeKind, key: u64, payload: &[u8]) {
        match kind {
            NodeKind::Inode | NodeKind::Xattr => self.mark_inode(key),
            NodeKind::Dirent => {
                if let Some((_, name)) = node::decode_dirent(payload) {
                    self.mark_entry(key, &name);
                }
            }
            // A punch changes maps, which are marked when they are written.
            _ => {}
        }
    }

    /// Physical segments holding group nodes.
    pub fn segments(&self, segment_of: impl Fn(u32) -> Option<u32>) -> Vec<u32> {
        let mut segs: Vec<u32> =
            self.at.values().flat_map(|a| a.frags.iter()).filter_map(|f| segment_of(f.0)).collect();
        segs.sort_unstable();
        segs.dedup();
        segs
    }

    /// Bytes the group nodes take on flash, with their headers.
    pub fn bytes(&self) -> u64 {
        self.at.values().flat_map(|a| a.frags.iter()).map(frag_bytes).sum()
    }

    /// Membership from scratch: every inode, entry and map of the state put in its group.
    fn members_of(&self, ns: &Namespace, maps: &BTreeMap<ChunkKey, MapAt>) -> NumberMap<GroupId, Members> {
        let mut members: NumberMap<GroupId, Members> = NumberMap::default();
        for (ino, _) in ns.inodes() {
            members.entry(self.group_of(inode_hash(*ino))).or_default().inos.insert(*ino);
        }
        for (parent, d) in ns.dirs() {
            for name in d.keys() {
                let g = self.group_of(entry_hash(*parent, name));
                members.entry(g).or_default().names.insert((*parent, name.clone()));
            }
        }
        for k in maps.keys() {
            members.entry(self.chunk_group(*k)).or_default().runs.insert((k.ino, k.chunk / SUPER_CHUNKS));
        }
        members
    }

    /// Splits group `g` in two (both to be written); its old node is no longer named.
    fn split(&mut self, g: GroupId) -> Option<GroupAt> {
        let (low, high) = g.halves();
        let mut m = self.members.remove(&g).unwrap_or_default();
        let upper = m.split_off(high);
        self.members.insert(low, m);
        self.members.insert(high, upper);
        self.ranges.insert(low.start(), low.depth);
        self.ranges.insert(high.start(), high.depth);
        self.dirty.remove(&g);
        self.dirty.extend([low, high]);
        self.splits += 1;
        self.at.remove(&g)
    }

    /// The groups a table read at mount names, with ranges for the hashes none of them
    /// holds (each as large as alignment allows: any cover is right, as nothing is in them);
    /// `None` if the table's groups overlap or are not groups.
    pub(crate) fn of_table(table: &[(GroupId, GroupAt)]) -> Option<Groups> {
        let mut ids: Vec<GroupId> = table.iter().map(|t| t.0).collect();
        if ids.iter().any(|g| g.depth > MAX_DEPTH || g.prefix >> g.depth != 0) {
            return None;
        }
        ids.sort_unstable_by_key(|g| g.start());
        // In order, then built in one pass: inserted one by one, the ranges of a million
        // files' table took a fifth of the mount.
        let mut ranges = Vec::with_capacity(2 * ids.len() + 64);
        let mut next: u128 = 0;
        for g in ids {
            if (g.start() as u128) < next {
                return None;
            }
            fill_gap(&mut ranges, next, g.start() as u128);
            ranges.push((g.start(), g.depth));
            next = g.start() as u128 + g.span();
        }
        fill_gap(&mut ranges, next, 1u128 << 64);
        let mut groups = Groups::of_depth(0);
        groups.ranges = ranges.into_iter().collect();
        Some(groups)
    }
}

/// Covers hashes `[next, end)` with ranges, each the largest aligned one that fits: the
/// largest power of two that `next` is a multiple of and that ends by `end`.
fn fill_gap(ranges: &mut Vec<(u64, u8)>, mut next: u128, end: u128) {
    while next < end {
        let aligned = if next == 0 { 64 } else { next.trailing_zeros().min(64) };
        let fits = 127 - (end - next).leading_zeros();
        let shift = aligned.min(fits);
        ranges.push((next as u64, (64 - shift) as u8));
        next += 1u128 << shift;
    }
}

impl<N: Nand> Fs<N> {
    /// Puts the whole state in new groups, all to be written: after a mount from a
    /// checkpoint that kept the state inline (a version before 8), or from none.
    pub(crate) fn regroup(&mut self) {
        for a in std::mem::take(&mut self.groups.at).into_values() {
            self.account(&a.frags, false);
        }
        self.groups = Groups::of_depth(wanted_depth(self.ns.len(), self.index.maps.len()));
        self.groups.members = self.groups.members_of(&self.ns, &self.index.maps);
        self.groups.dirty = self.groups.members.keys().copied().collect();
    }

    /// Groups the write-back thread writes ahead of a due checkpoint.
    pub(crate) fn groups_ahead(&self) -> usize {
        if !self.checkpoint_due() {
            return 0;
        }
        self.groups.dirty.len().saturating_sub(GROUPS_LEFT)
    }

    /// Writes up to `most` changed groups; those holding a map still pending in the page
    /// being filled wait (the checkpoint seals the page first and writes them all), unless
    /// all of them do: the page is then sealed, so that a step always makes progress (a
    /// write-back thread waiting for the groups to be written would otherwise spin).
    pub(crate) fn write_groups(&mut self, most: usize) -> Result<(), FsError> {
        let waiting = |fs: &Self| -> BTreeSet<GroupId> {
            fs.index.buf_maps.iter().map(|k| fs.groups.chunk_group(*k)).collect()
        };
        let mut held = waiting(self);
        if !self.groups.dirty.is_empty() && self.groups.dirty.iter().all(|g| held.contains(g)) {
            self.seal_page()?;
            held = waiting(self);
        }
        let due: Vec<GroupId> =
            self.groups.dirty.iter().filter(|g| !held.contains(g)).take(most).copied().collect();
        debug_assert!(self.groups.dirty.is_empty() || !due.is_empty(), "a call writes a group");
        // A split writes two: the step's budget counts nodes written.
        let before = self.groups.written;
        for g in due {
            if self.groups.written - before >= most as u64 {
                break;
            }
            self.write_group(g)?;
        }
        Ok(())
    }

    /// Writes group `g` as the state now has it (none if it holds nothing); past
    /// [`SPLIT_AT`] items, writes its two halves instead.
    fn write_group(&mut self, g: GroupId) -> Result<(), FsError> {
        // Marked without being read (the cleaner moves what sits in a victim): read first,
        // so that it is written whole.
        if self.groups.unread.contains(&g) {
            self.page_in(g)?;
        }
        self.groups.dirty.remove(&g);
        let (ns, maps) = (&self.ns, &self.index.maps);
        let encoded = self.groups.members.get_mut(&g).and_then(|m| encode_group(g, m, ns, maps));
        let Some((plain, items)) = encoded else {
            self.groups.members.remove(&g);
            if let Some(old) = self.groups.at.remove(&g) {
                self.account(&old.frags, false);
            }
            return Ok(());
        };
        if items > SPLIT_AT && g.depth < MAX_DEPTH {
            if let Some(old) = self.groups.split(g) {
                self.account(&old.frags, false);
            }
            let (low, high) = g.halves();
            self.write_group(low)?;
            return self.write_group(high);
        }
        let (crc, raw) = (le::get_u32(&plain, plain.len() - 4), plain.len() as u64);
        let inodes = le::get_u32(&plain, GROUP_HEADER);
        let payload = node::pack_zstd(plain, 1, GROUP_ZSTD_MAGIC);
        let version = self.page.next_version();
        if let Some(old) = self.groups.at.insert(g, GroupAt { frags: Vec::new(), version, crc, inodes }) {
            self.account(&old.frags, false);
        }
        self.put_node(
            NodeKind::Group,
            0,
            (g.prefix, u64::from(g.depth)),
            version,
            &[&payload],
            super::keys::Pending::Group(g),
        )?;
        self.groups.raw_since += raw;
        self.groups.stored_since += payload.len() as u64;
        self.groups.written += 1;
        Ok(())
    }

    /// Reads every group a checkpoint names; `None` if one cannot be read whole, or the
    /// table is not one of groups (the checkpoint is then no starting point).
    pub(crate) fn read_groups(
        &mut self,
        table: &[(GroupId, GroupAt)],
    ) -> Result<Option<(Groups, Vec<GroupContent>)>, FsError> {
        let Some(groups) = Groups::of_table(table) else { return Ok(None) };
        let mut out = Vec::with_capacity(table.len());
        for (g, at) in table {
            let payload = match self.read_payload(&at.frags) {
                Ok((p, _)) => p,
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            };
            match decode_group(&payload, *g, at.crc) {
                Some(c) => out.push(c),
                None => return Ok(None),
            }
        }
        Ok(Some((groups, out)))
    }

    /// Takes the groups read at mount as the state (and as written: none is changed yet).
    pub(crate) fn adopt_groups(
        &mut self,
        groups: Groups,
        table: Vec<(GroupId, GroupAt)>,
        contents: Vec<GroupContent>,
        hashed_v8: bool,
    ) {
        for c in contents {
            for (ino, inode) in c.inodes {
                self.ns.insert(ino, inode);
            }
            for (parent, name, child) in c.entries {
                self.ns.replay_entry(parent, name, child);
            }
            for (k, at) in c.maps {
                self.index.maps.insert(k, at);
            }
        }
        self.groups = groups;
        self.groups.hashed_flat = hashed_v8;
        self.groups.members = self.groups.members_of(&self.ns, &self.index.maps);
        self.groups.at = table.into_iter().collect();
    }

    /// Takes the groups a table names as the state, none of them read yet (`paging.rs`).
    pub(crate) fn adopt_table(&mut self, groups: Groups, table: Vec<(GroupId, GroupAt)>) {
        self.groups = groups;
        // From the table, in its order (a checkpoint writes it sorted): built in one pass.
        self.groups.unread = table.iter().map(|t| t.0).collect();
        self.groups.at = table.into_iter().collect();
        self.groups.unread_inodes = self.groups.at.values().map(|a| a.inodes as usize).sum();
    }

    /// Whether every group, encoded afresh from the state, is the one last written (the
    /// paired check of the marks, for debug builds): a change that marked no group would
    /// be lost at the next mount.
    pub(crate) fn groups_match_state(&self) -> bool {
        let mut fresh = self.groups.members_of(&self.ns, &self.index.maps);
        // Groups not read yet hold what was written: nothing in memory to compare.
        fresh.retain(|g, _| !self.groups.unread.contains(g));
        let mut ok = true;
        for (g, m) in fresh.iter_mut() {
            let crc =
                encode_group(*g, m, &self.ns, &self.index.maps).map(|(v, _)| le::get_u32(&v, v.len() - 4));
            if crc != self.groups.at.get(g).map(|a| a.crc) {
                eprintln!("group {g:?}: written {:?}, state {crc:?}", self.groups.at.get(g));
                ok = false;
            }
        }
        let named = self.groups.at.keys().filter(|g| fresh.contains_key(g)).count();
        ok && named + self.groups.at.keys().filter(|g| self.groups.unread.contains(g)).count()
            == self.groups.at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_covered_by_the_largest_aligned_ranges_that_fit() {
        // The definition: from the whole space down, halve until the range starts aligned
        // and ends by the gap's end.
        fn by_halving(mut next: u128, end: u128) -> Vec<(u64, u8)> {
            let mut out = Vec::new();
            while next < end {
                let mut span = 1u128 << 64;
                while !next.is_multiple_of(span) || next + span > end {
                    span >>= 1;
                }
                out.push((next as u64, 64 - span.trailing_zeros() as u8));
                next += span;
            }
            out
        }
        let mut rng = bitmend_media::rng::Rng::new(7);
        let mut cases = vec![(0, 1u128 << 64), (0, 1), (1, 1u128 << 64), (u64::MAX as u128, 1u128 << 64)];
        for _ in 0..2000 {
            let (a, b) = (rng.next_u64() >> rng.below(64), rng.next_u64() >> rng.below(64));
            cases.push((a.min(b) as u128, a.max(b) as u128 + 1));
        }
        for (next, end) in cases {
            let mut ranges = Vec::new();
            fill_gap(&mut ranges, next, end);
            assert_eq!(ranges, by_halving(next, end), "the gap [{next:#x}, {end:#x})");
        }
    }

    /// `files` files in 140 directories, numbered as version 10 numbers them (the counter in
    /// their directory's region): the state and the maps.
    fn state(files: u64) -> (Namespace, BTreeMap<ChunkKey, MapAt>) {
        let mut ns = Namespace::default();
        let mut maps = BTreeMap::new();
        for k in 2..2 + files {
            let dir = 1_000_000 + k % 140;
            let ino = crate::fs::map::keys::ino_in(dir, k).expect("a counter below 2^44");
            let mut i = crate::fs::namespace::sample_file(ino);
            if ino.is_multiple_of(7) {
                i.xattrs.insert(b"user.k".to_vec(), vec![ino as u8; 5]);
                i.xattr_version = k * 5;
            }
            ns.insert(ino, i);
            ns.replay_entry(dir, format!("file-{ino}").into_bytes(), ino);
            let summary = Some(MapSummary { mask: 1, digest: ino });
            maps.insert(
                ChunkKey { ino, chunk: 0 },
                MapAt { frags: vec![(k as u32, 8, 40)], version: k, summary },
            );
        }
        (ns, maps)
    }

    /// Every group of a state reads back as what it holds, compressed or not, and together
    /// they are the whole state; a group read as another, or damaged, is refused.
    #[test]
    fn groups_read_back_as_the_state_and_refuse_another_or_damage() {
        let (ns, maps) = state(700);
        let depth = wanted_depth(ns.len(), maps.len());
        assert_eq!(depth, 5, "700 inodes, entries and maps: 32 groups");
        let groups = Groups::of_depth(depth);
        let mut members = groups.members_of(&ns, &maps);
        let (mut inodes, mut entries, mut mapped) = (0, 0, 0);
        for (g, m) in members.iter_mut() {
            let (plain, items) = encode_group(*g, m, &ns, &maps).expect("not empty");
            assert!(items > 10 && items <= SPLIT_AT, "{items} items");
            let crc = le::get_u32(&plain, plain.len() - 4);
            let packed = node::pack_zstd(plain.clone(), 1, GROUP_ZSTD_MAGIC);
            assert!(packed.len() < plain.len(), "compressed: {} of {}", packed.len(), plain.len());
            for bytes in [&plain, &packed] {
                let c = decode_group(bytes, *g, crc).expect("reads back");
                for (ino, i) in &c.inodes {
                    let o = ns.get(*ino).expect("in the state");
                    assert!(o.attr == i.attr && o.version == i.version && o.xattrs == i.xattrs);
                    assert_eq!(o.xattr_version, i.xattr_version);
                }
                assert!(c.entries.iter().all(|(p, n, c)| ns.entries(*p).expect("a directory")[n] == *c));
                assert!(c.maps.iter().all(|(k, m)| maps[k] == *m));
                if bytes == &plain {
                    (inodes, entries, mapped) =
                        (inodes + c.inodes.len(), entries + c.entries.len(), mapped + c.maps.len());
                }
            }
            let other = GroupId { prefix: g.prefix ^ 1, ..*g };
            assert!(decode_group(&plain, other, crc).is_none(), "another group");
            assert!(decode_group(&plain, GroupId { depth: g.depth + 1, ..*g }, crc).is_none(), "other depth");
            assert!(decode_group(&plain, *g, crc ^ 1).is_none(), "an older copy");
            let mut bad = plain.clone();
            bad[20] ^= 4;
            assert!(decode_group(&bad, *g, crc).is_none(), "damaged");
            assert!(decode_group(&packed[..packed.len() - 2], *g, crc).is_none(), "cut short");
        }
        assert_eq!((inodes, entries, mapped), (700, 700, 700));
        // A directory's region: its entries, and the inodes made in it with their maps, are
        // in one group (at any depth up to the region's bits).
        for (dir, d) in ns.dirs() {
            for (name, &ino) in d {
                let g = groups.group_of(entry_hash(*dir, name));
                assert!(g.holds(inode_hash(ino)) && g.holds(run_hash(ino, 0)), "{dir}/{name:?}");
            }
        }
    }

    /// An inode number carries its directory's region above its counter, and none is made
    /// once the counters reach the region's bits.
    #[test]
    fn inode_numbers_carry_their_region_until_the_counters_are_spent() {
        use crate::fs::map::keys::{ino_counter, ino_in};
        let last = (1u64 << 44) - 1;
        for dir in [1u64, 2, 77, 1 << 50] {
            for counter in [2, 1_000_000, last] {
                let ino = ino_in(dir, counter).expect("a counter below 2^44");
                assert_eq!(ino_counter(ino), counter);
                assert_eq!(ino_region(ino), Some(dir_region(dir)).filter(|&r| r != 0));
            }
            assert_eq!(ino_in(dir, last + 1), None, "the counters are spent");
        }
    }

    /// A split moves each member to the half its hash falls in; a table's groups, with the
    /// gaps between them filled, cover every hash once; overlapping groups are refused.
    #[test]
    fn splits_partition_and_tables_cover_every_hash_once() {
        let (ns, maps) = state(700);
        let mut groups = Groups::of_depth(0);
        groups.members = groups.members_of(&ns, &maps);
        let g = GroupId { depth: 0, prefix: 0 };
        groups.split(g);
        let (low, high) = g.halves();
        let split = groups.members_of(&ns, &maps);
        assert_eq!(
            (split.get(&low), split.get(&high)),
            (groups.members.get(&low), groups.members.get(&high))
        );
        assert!(groups.members[&low].inos.len() > 200 && groups.members[&high].inos.len() > 200);
        let at = GroupAt { frags: vec![], version: 1, crc: 0, inodes: 0 };
        let table: Vec<(GroupId, GroupAt)> = [(2, 0), (3, 5), (5, 31), (1, 1)]
            .map(|(depth, prefix)| (GroupId { depth, prefix }, at.clone()))
            .into_iter()
            .filter(|t| t.0 != GroupId { depth: 1, prefix: 1 })
            .collect();
        let groups = Groups::of_table(&table).expect("groups");
        let ranges: Vec<(u64, u8)> = groups.ranges.iter().map(|(s, d)| (*s, *d)).collect();
        let mut next: u128 = 0;
        for (start, depth) in &ranges {
            assert_eq!(*start as u128, next, "{ranges:?}");
            next += 1u128 << (64 - depth);
        }
        assert_eq!(next, 1u128 << 64);
        for (g, _) in &table {
            assert!(ranges.contains(&(g.start(), g.depth)));
        }
        for h in (0..1000u64).map(mix) {
            assert!(groups.group_of(h).holds(h));
        }
        let mut overlapping = table.clone();
        overlapping.push((GroupId { depth: 3, prefix: 1 }, at.clone()));
        assert!(Groups::of_table(&overlapping).is_none());
        assert!(Groups::of_table(&[(GroupId { depth: 2, prefix: 4 }, at)]).is_none(), "not a group");
    }
}
