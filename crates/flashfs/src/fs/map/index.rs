//! The index with bounded RAM: where every logical page of every file lives.
//!
//! A file's logical pages are mapped in chunks of [`CHUNK_PAGES`]. Each chunk is stored on the
//! flash as a map node (its pages' locations, versions and CRC-32Cs), written out of place at a
//! checkpoint when the chunk changed since the last one; the checkpoint keeps only where each
//! chunk's map node is. Chunks are loaded on first use and the least recently used clean ones
//! evicted past a bound (`FsOptions::index_chunks`), so RAM holds the metadata and a bounded
//! window of the index, not the whole of it. A chunk changed since the last checkpoint
//! (dirty) stays in RAM until the next one writes it; too many dirty chunks start one.
//!
//! The segment usage table (live bytes per physical segment, data fragments and map nodes)
//! is kept as locations change, written in every checkpoint, and adjusted by replay, so that
//! the cleaner ranks segments without walking the index. The cleaner learns which data in a
//! segment is live by reading the segment's pages: every fragment names its file, logical
//! page and version (RCFFS's reverse index, kept in the nodes themselves).

use std::collections::{BTreeMap, HashMap, HashSet};

use bitmend_code::le::{self, Put, Reader};
use bitmend_media::nand::Nand;

use super::keys::{chunk_key, frag_bytes, ChunkKey, Frags, MapSummary, CHUNK_PAGES};
use crate::fs::node::FileType;
use crate::fs::node::{frags, NodeKind, CODEC_FLAGS, FRAG_HEADER};
use crate::fs::{Fs, Loc, PENDING};
use crate::store::PageAddr;
use crate::Corruption;
use crate::FsError;
use crate::{Ino, LOGICAL_PAGE};

/// Chunks kept in RAM by default (64 Ki logical pages: 256 MiB of file data mapped).
pub const DEFAULT_INDEX_CHUNKS: usize = 1024;

const MAP_MAGIC: u32 = 0x504D_4E49; // "INMP"
/// A map payload compressed: this magic, the plain payload's length (u32), one zstd frame.
const MAP_ZSTD_MAGIC: u32 = 0x5A4D_4E49; // "INMZ"
/// The largest plain map payload: 64 entries of up to 255 fragments each.
const MAP_MAX: usize = 32 + CHUNK_PAGES as usize * (16 + 255 * 8);
/// A map entry's flag: the CRC-32C field holds the page's CRC (entries carried over from a
/// version 3 checkpoint, which had none, lack it until the page is rewritten).
const CRC_KNOWN: u8 = 0x80;
/// A map entry's flag: the page is one of a node of several, whose place and count follow
/// in one byte (version 5).
const IN_NODE_OF_SEVERAL: u8 = 0x08;

/// A map node read: its chunk's pages, and whether a flash page under it was repaired.
type ReadMap = (BTreeMap<u64, Loc>, bool);

/// Where a chunk's map node is on the flash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MapAt {
    pub frags: Frags,
    pub version: u64,
    /// Which pages it maps and a digest of their versions, to rebuild it from the data
    /// nodes if it is lost (unknown for a map read from a checkpoint before version 7 and
    /// not loaded since).
    pub summary: Option<MapSummary>,
}

/// A chunk in RAM: its pages by index, whether it changed since its map node was written, and
/// when it was last used (for eviction).
#[derive(Debug, Default)]
pub(crate) struct Chunk {
    pub pages: BTreeMap<u64, Loc>,
    pub dirty: bool,
    pub used: u64,
}

/// File data as the index knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Logical pages mapped.
    pub pages: u64,
    /// Bytes their nodes' payloads take.
    pub stored: u64,
    /// The same with the fragment headers.
    pub footprint: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Index {
    /// Every chunk's map node as the newest checkpoint refers to it, or as written ahead of
    /// the next (a chunk changed since keeps its old one here until its map is written).
    pub(super) maps: BTreeMap<ChunkKey, MapAt>,
    pub(super) loaded: BTreeMap<ChunkKey, Chunk>,
    /// Pages replayed at mount onto chunks whose map was not read (mount reads only the log):
    /// merged into the chunk when it is loaded, by version. Their bytes are counted already.
    pub(super) overlay: BTreeMap<ChunkKey, BTreeMap<u64, Loc>>,
    /// Live bytes per physical segment.
    pub(super) usage: HashMap<u32, u64>,
    pub(super) totals: Totals,
    /// Map nodes with fragments in the page being filled.
    pub(super) buf_maps: Vec<ChunkKey>,
    pub(super) tick: u64,
    /// A chunk whose map is beyond repair was dropped: its bytes are still counted in the
    /// usage table and the totals, which the next checkpoint recounts from the index.
    pub(super) stale_counts: bool,
    pub(super) loads: u64,
    /// Chunks whose lost map was rebuilt from the data nodes.
    pub(super) rebuilt: u64,
    /// Maps (chunk, version) found lost that could not be rebuilt (not tried again).
    pub(super) unrebuildable: HashSet<(ChunkKey, u64)>,
    pub(super) evictions: u64,
    /// Chunks in RAM at which the next eviction pass looks for clean ones: a pass that
    /// finds too few (most chunks dirty, as near full while the cleaner moves data) is not
    /// tried again at every load.
    pub(super) evict_at: usize,
    pub(super) maps_written: u64,
    /// Bytes of the maps written since the last checkpoint, before compression (part of what
    /// a checkpoint costs: see `Fs::checkpoint_interval`).
    pub(super) map_bytes_since: u64,
}

/// 512-byte sectors in a logical page (what `st_blocks` counts in).
const SECTORS_PER_PAGE: u64 = LOGICAL_PAGE as u64 / 512;

impl<N: Nand> Fs<N> {
    /// The file's logical pages that hold data (mapped, replayed or dirty: not holes), in
    /// 512-byte sectors: what `st_blocks` reports, so that `du`, `tar --sparse` and `rsync -S`
    /// see holes (a punched range lowers it). Counted from the chunks in RAM and, for the
    /// others, from their map's summary, without reading a map; a chunk whose map has no
    /// summary (written before version 7, not loaded since) counts every page it may map.
    pub fn stored_blocks(&mut self, ino: Ino) -> u64 {
        let ino = ino.0;
        // Its maps' summaries say which pages are stored (a group that does not read
        // leaves them out: the attributes are still answered).
        let _ = self.need_file_maps(ino);
        let Ok(inode) = self.inode(ino) else { return 0 };
        let size = inode.attr.size;
        if inode.attr.kind != FileType::File {
            return size.div_ceil(512);
        }
        let range = ChunkKey { ino, chunk: 0 }..=ChunkKey { ino, chunk: u64::MAX };
        let mut masks: BTreeMap<u64, u64> = BTreeMap::new();
        for (key, at) in self.index.maps.range(range.clone()) {
            let mask = at.summary.map_or(u64::MAX, |s| s.mask);
            *masks.entry(key.chunk).or_default() |= mask;
        }
        for (key, o) in self.index.overlay.range(range.clone()) {
            for &page in o.keys() {
                *masks.entry(key.chunk).or_default() |= 1 << (page % CHUNK_PAGES);
            }
        }
        // A chunk in RAM is the whole truth for its pages (its map may be older).
        for (key, c) in self.index.loaded.range(range) {
            let m = masks.entry(key.chunk).or_default();
            *m = c.pages.keys().fold(0, |m, &page| m | 1 << (page % CHUNK_PAGES));
        }
        for page in self.wb.pages_of(ino) {
            *masks.entry(page / CHUNK_PAGES).or_default() |= 1 << (page % CHUNK_PAGES);
        }
        let pages: u64 = masks.values().map(|m| u64::from(m.count_ones())).sum();
        // Pages past the end are being cut away: never more than the size holds.
        pages.min(size.div_ceil(LOGICAL_PAGE as u64)) * SECTORS_PER_PAGE
    }
}

impl ChunkKey {
    /// The first logical page the chunk maps.
    pub fn first_page(self) -> u64 {
        self.chunk.saturating_mul(CHUNK_PAGES)
    }
}

/// Fragments as checkpoints and groups write them (FORMAT.md section 8): a u16 count, then per
/// fragment its flash page (u32), offset (u16) and length (u16). None is pending.
pub(crate) fn put_frags(v: &mut Vec<u8>, frags: &[(u32, u16, u16)]) {
    v.put_u16(frags.len() as u16);
    for &(page, off, len) in frags {
        debug_assert_ne!(page, PENDING, "fragments are written once their page is sealed");
        v.put_u32(page);
        v.put_u16(off);
        v.put_u16(len);
    }
}

/// Reads what [`put_frags`] wrote.
pub(crate) fn read_frags(r: &mut Reader) -> Option<Frags> {
    let n = r.u16()? as usize;
    let mut frags = Vec::with_capacity(n);
    for _ in 0..n {
        frags.push((r.u32()?, r.u16()?, r.u16()?));
    }
    Some(frags)
}

/// The index's own counts since mount (`FsStats` reports them).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IndexCounts {
    pub loads: u64,
    pub evictions: u64,
    pub maps_written: u64,
    pub rebuilt: u64,
}

/// What the rest of the file system reads and tells the index: its maps and the space
/// accounting it keeps (usage per segment, totals).
impl Index {
    /// The state a checkpoint recorded: its maps, the usage table and the totals.
    pub fn from_checkpoint(
        maps: BTreeMap<ChunkKey, MapAt>,
        usage: HashMap<u32, u64>,
        totals: Totals,
    ) -> Index {
        Index { maps, usage, totals, ..Default::default() }
    }

    pub fn counts(&self) -> IndexCounts {
        IndexCounts {
            loads: self.loads,
            evictions: self.evictions,
            maps_written: self.maps_written,
            rebuilt: self.rebuilt,
        }
    }

    /// Every chunk's map node.
    pub fn maps(&self) -> &BTreeMap<ChunkKey, MapAt> {
        &self.maps
    }

    /// Whether chunk `ck` is in RAM.
    pub fn is_loaded(&self, ck: ChunkKey) -> bool {
        self.loaded.contains_key(&ck)
    }

    /// Chunks in RAM.
    pub fn loaded_count(&self) -> usize {
        self.loaded.len()
    }

    /// The pages chunk `ck` maps, if it is in RAM.
    pub fn pages_in(&self, ck: ChunkKey) -> Option<Vec<u64>> {
        self.loaded.get(&ck).map(|c| c.pages.keys().copied().collect())
    }

    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Live bytes the usage table counts in physical segment `phys`.
    pub fn usage(&self, phys: u32) -> u64 {
        self.usage.get(&phys).copied().unwrap_or(0)
    }

    pub fn usage_table(&self) -> &HashMap<u32, u64> {
        &self.usage
    }

    /// Segment `phys` was erased: nothing counts there any more.
    pub fn segment_erased(&mut self, phys: u32) {
        self.usage.remove(&phys);
    }

    /// Whether a chunk dropped with its map beyond repair left the counts to be recounted.
    pub fn counts_stale(&self) -> bool {
        self.stale_counts
    }

    /// The usage table and totals recounted from the whole index.
    pub fn set_counts(&mut self, usage: HashMap<u32, u64>, totals: Totals) {
        (self.usage, self.totals, self.stale_counts) = (usage, totals, false);
    }

    /// Bytes of the maps written since the last call (a checkpoint's cost).
    pub fn take_map_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.map_bytes_since)
    }

    /// Adds a fragment, pending in the page being filled, to a logical page's location.
    pub fn push_pending(&mut self, key: (u64, u64), off: u16, len: u16) {
        if let Some(loc) = self.loc_mut(key) {
            loc.frags.push((PENDING, off, len));
            let (stored, footprint) = (loc.part(len as u64), loc.part(len as u64 + FRAG_HEADER as u64));
            self.totals.stored += stored;
            self.totals.footprint += footprint;
        }
    }

    /// A fragment of chunk `ck`'s map node was put at `off` in the page being filled.
    pub fn pend_map(&mut self, ck: ChunkKey, off: u16, len: u16) {
        if let Some(m) = self.maps.get_mut(&ck) {
            m.frags.push((PENDING, off, len));
        }
        if !self.buf_maps.contains(&ck) {
            self.buf_maps.push(ck);
        }
    }
}

impl Index {
    /// Chunks of `ino` (on flash or only in RAM), in order.
    pub fn chunks_of(&self, ino: u64) -> Vec<ChunkKey> {
        let range = ChunkKey { ino, chunk: 0 }..=ChunkKey { ino, chunk: u64::MAX };
        let mut keys: Vec<ChunkKey> = self.maps.range(range.clone()).map(|(k, _)| *k).collect();
        keys.extend(self.loaded.range(range).map(|(k, _)| *k).filter(|k| !self.maps.contains_key(k)));
        keys.sort_unstable();
        keys
    }

    /// Every chunk.
    pub fn all_chunks(&self) -> Vec<ChunkKey> {
        let mut keys: Vec<ChunkKey> = self.maps.keys().copied().collect();
        keys.extend(self.loaded.keys().filter(|k| !self.maps.contains_key(k)));
        keys.sort_unstable();
        keys
    }

    pub fn dirty_chunks(&self) -> usize {
        self.dirty_loaded() + self.overlay.len()
    }

    /// Chunks in RAM changed since their map was written.
    pub fn dirty_loaded(&self) -> usize {
        self.loaded.values().filter(|c| c.dirty).count()
    }

    /// Takes out of the chunks in RAM and the replayed overlays every page at or past
    /// `end(ino)`; returns them (for the caller to uncount).
    pub fn trim_in_ram(&mut self, end: impl Fn(u64) -> u64) -> Vec<(ChunkKey, Vec<Loc>)> {
        let mut out = Vec::new();
        for (ck, c) in self.loaded.iter_mut() {
            let cut = c.pages.split_off(&end(ck.ino));
            if !cut.is_empty() {
                c.dirty = true;
                out.push((*ck, cut.into_values().collect()));
            }
        }
        for (ck, o) in self.overlay.iter_mut() {
            let cut = o.split_off(&end(ck.ino));
            if !cut.is_empty() {
                out.push((*ck, cut.into_values().collect()));
            }
        }
        self.overlay.retain(|_, o| !o.is_empty());
        out
    }

    /// The version of the page at `key` if its chunk is in RAM (never reads a map).
    pub fn loaded_version(&self, key: (u64, u64)) -> Option<u64> {
        self.loaded.get(&chunk_key(key.0, key.1))?.pages.get(&key.1).map(|l| l.version)
    }

    pub fn loc_mut(&mut self, key: (u64, u64)) -> Option<&mut Loc> {
        self.loaded.get_mut(&chunk_key(key.0, key.1))?.pages.get_mut(&key.1)
    }

    /// Physical segments holding the map nodes the index refers to.
    pub fn map_segments(&self, segment_of: impl Fn(u32) -> Option<u32>) -> HashSet<u32> {
        // Sorted and deduplicated first: thousands of maps lie in a few segments, and a
        // hash per map was a fifth of a millisecond of every checkpoint with 3,000 files.
        let mut segs: Vec<u32> =
            self.maps.values().flat_map(|m| m.frags.iter()).filter_map(|f| segment_of(f.0)).collect();
        segs.sort_unstable();
        segs.dedup();
        segs.into_iter().collect()
    }
}

/// A map node's payload: magic, the chunk's file and number, the entry count, then per entry
/// its index in the chunk, flags (codec bits, [`CRC_KNOWN`]), version, CRC-32C of the logical
/// page, and fragments; all of it followed by the CRC-32C of what precedes (FORMAT.md section
/// 8); zstd-compressed behind its own magic when that is smaller.
/// Bytes of a map of `entries` pages of one fragment each, before compression.
fn map_len(entries: usize) -> u64 {
    26 + 23 * entries as u64
}

/// The smallest map payload offered to zstd (five entries of one fragment).
const MAP_ZSTD_FROM: usize = 128;

fn encode_map(key: ChunkKey, pages: &BTreeMap<u64, Loc>) -> Vec<u8> {
    let mut v = Vec::with_capacity(24 + pages.len() * 24);
    v.put_u32(MAP_MAGIC);
    v.put_u64(key.ino);
    v.put_u64(key.chunk);
    v.put_u16(pages.len() as u16);
    for (index, loc) in pages {
        v.put_u8((index % CHUNK_PAGES) as u8);
        let several = if loc.count > 1 { IN_NODE_OF_SEVERAL } else { 0 };
        v.put_u8(loc.codec | several | if loc.crc.is_some() { CRC_KNOWN } else { 0 });
        if loc.count > 1 {
            v.put_u8(loc.slot << 4 | (loc.count - 1));
        }
        v.put_u64(loc.version);
        v.put_u32(loc.crc.unwrap_or(0));
        v.put_u8(loc.frags.len() as u8);
        for &(page, off, len) in &loc.frags {
            debug_assert_ne!(page, PENDING, "a map is written with no page pending");
            v.put_u32(page);
            v.put_u16(off);
            v.put_u16(len);
        }
    }
    let crc = bitmend_code::crc::crc32c(&v);
    v.put_u32(crc);
    // (A chunk number past any file offset, which only a test makes, is refused on reading.)
    debug_assert!(
        key.chunk.checked_mul(CHUNK_PAGES).is_none() || decode_map(&v, key).as_ref() == Some(pages),
        "a map reads back as written"
    );
    // Versions and flash pages rise from entry to entry: zstd takes about half away. At level
    // -1 (no Huffman stage for literals): a 1.5 KiB map in 3.6 us, not 8.7 at level 1, for
    // 13% more bytes; under random 4 KiB writes, which dirty most chunks between two
    // checkpoints, level 1 was 44% of the write-back thread (readers take any level).
    // A map of four entries or fewer is not offered: the frame and our 8 bytes cost about
    // what zstd saves there, and a call costs about a microsecond (small files, one chunk
    // each, were half of a checkpoint's maps).
    if v.len() < MAP_ZSTD_FROM {
        return v;
    }
    crate::fs::node::pack_zstd(v, -1, MAP_ZSTD_MAGIC)
}

/// Decodes a map node's payload for chunk `key`; `None` for bytes that are not its map.
fn decode_map(b: &[u8], key: ChunkKey) -> Option<BTreeMap<u64, Loc>> {
    let b = crate::fs::node::unpack_zstd(b, MAP_ZSTD_MAGIC, MAP_MAX)?;
    let (body, crc) = b.split_at(b.len().checked_sub(4)?);
    if bitmend_code::crc::crc32c(body) != le::get_u32(crc, 0) {
        return None;
    }
    let mut r = Reader::new(body);
    if r.u32()? != MAP_MAGIC || r.u64()? != key.ino || r.u64()? != key.chunk {
        return None;
    }
    let mut pages = BTreeMap::new();
    for _ in 0..r.u16()? {
        let at = r.u8()? as u64;
        let flags = r.u8()?;
        let (slot, count) = match flags & IN_NODE_OF_SEVERAL {
            0 => (0, 1),
            _ => {
                let b = r.u8()?;
                (b >> 4, (b & 15) + 1)
            }
        };
        if slot >= count {
            return None;
        }
        let version = r.u64()?;
        let crc = r.u32()?;
        let n = r.u8()? as usize;
        if at >= CHUNK_PAGES {
            return None;
        }
        let mut frags = Vec::with_capacity(n);
        for _ in 0..n {
            frags.push((r.u32()?, r.u16()?, r.u16()?));
        }
        let crc = (flags & CRC_KNOWN != 0).then_some(crc);
        let loc = Loc { frags, codec: flags & CODEC_FLAGS, version, crc, slot, count };
        pages.insert(key.chunk.checked_mul(CHUNK_PAGES)?.checked_add(at)?, loc);
    }
    Some(pages)
}

impl<N: Nand> Fs<N> {
    /// Bytes of the index's map nodes and the group nodes in physical segment `phys`, as the
    /// usage table counts them (what of its usage is not file data).
    pub(crate) fn map_bytes_in(&self, phys: u32) -> u64 {
        let groups = self.groups.at.values().flat_map(|a| a.frags.iter());
        let frags = self.index.maps.values().flat_map(|m| m.frags.iter()).chain(groups);
        frags
            .filter(|f| f.0 != PENDING && self.store.segment_of(PageAddr(f.0)) == Some(phys))
            .map(frag_bytes)
            .sum()
    }

    /// Adds (or takes away) a node's fragments on the flash to the usage of their segments.
    pub(crate) fn account(&mut self, frags: &[(u32, u16, u16)], add: bool) {
        for f in frags.iter().filter(|f| f.0 != PENDING) {
            if let Some(phys) = self.store.segment_of(PageAddr(f.0)) {
                let u = self.index.usage.entry(phys).or_insert(0);
                *u = if add { *u + frag_bytes(f) } else { u.saturating_sub(frag_bytes(f)) };
            }
        }
    }

    /// Counts a logical page's location in (or out of) the usage table and the totals: its
    /// part of its node's bytes (see [`Loc::part`]).
    pub(crate) fn count_loc(&mut self, loc: &Loc, add: bool) {
        let (mut stored, mut footprint) = (0, 0);
        for f in &loc.frags {
            stored += loc.part(f.2 as u64);
            let bytes = loc.part(frag_bytes(f));
            footprint += bytes;
            if f.0 == PENDING {
                continue;
            }
            if let Some(phys) = self.store.segment_of(PageAddr(f.0)) {
                let u = self.index.usage.entry(phys).or_insert(0);
                *u = if add { *u + bytes } else { u.saturating_sub(bytes) };
            }
        }
        let t = &mut self.index.totals;
        if add {
            t.pages += 1;
            t.stored += stored;
            t.footprint += footprint;
        } else {
            t.pages = t.pages.saturating_sub(1);
            t.stored = t.stored.saturating_sub(stored);
            t.footprint = t.footprint.saturating_sub(footprint);
        }
    }

    /// Brings chunk `key` into RAM (reading its map node) and marks it used; false if the
    /// chunk does not exist. A map node beyond repair is an error (its pages read as EIO).
    pub(crate) fn load_chunk(&mut self, key: ChunkKey) -> Result<bool, FsError> {
        self.index.tick += 1;
        let tick = self.index.tick;
        if let Some(c) = self.index.loaded.get_mut(&key) {
            c.used = tick;
            return Ok(true);
        }
        self.need_chunk(key)?;
        let Some(at) = self.index.maps.get(&key).cloned() else { return Ok(false) };
        let (mut pages, mut dirty) = match self.read_map(key, &at)? {
            Some((pages, repaired)) => (pages, repaired),
            None => {
                // Beyond repair: rebuilt from the data nodes if that matches what the
                // checkpoint says the map held, and written again at the next checkpoint.
                let lost =
                    FsError::Corrupt(Corruption::Unrecoverable { page: at.frags.first().map_or(0, |f| f.0) });
                // A rebuild reads the whole log: tried once per map.
                if !self.index.unrebuildable.insert((key, at.version)) {
                    return Err(lost);
                }
                let pages = self.rebuild_map(key, &at)?.ok_or(lost)?;
                self.index.unrebuildable.remove(&(key, at.version));
                self.index.rebuilt += 1;
                // The usage table counted the map's locations; a copy the rebuild took
                // instead may sit elsewhere: the next checkpoint recounts.
                self.index.stale_counts = true;
                (pages, true)
            }
        };
        self.index.loads += 1;
        for (i, loc) in self.index.overlay.remove(&key).unwrap_or_default() {
            if pages.get(&i).is_some_and(|old| old.version > loc.version) {
                self.count_loc(&loc, false);
                continue;
            }
            if let Some(old) = pages.insert(i, loc) {
                self.count_loc(&old, false);
            }
            dirty = true;
        }
        self.index.loaded.insert(key, Chunk { pages, dirty, used: tick });
        self.evict(key);
        Ok(true)
    }

    /// Reads and decodes the map node of chunk `key` (and whether a flash page under it was
    /// repaired); `None` if it is beyond repair or is not the map the checkpoint summarized.
    fn read_map(&mut self, key: ChunkKey, at: &MapAt) -> Result<Option<ReadMap>, FsError> {
        let (payload, repaired) = match self.read_payload(&at.frags) {
            Ok(p) => p,
            Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let pages = decode_map(&payload, key);
        let summary = pages.as_ref().and_then(MapSummary::of);
        // What the checkpoint says the map held, and what it holds, agree.
        let Some(pages) = pages.filter(|_| at.summary.is_none_or(|s| Some(s) == summary)) else {
            self.stats.unreadable += 1;
            return Ok(None);
        };
        match at.summary {
            Some(_) => {}
            None => {
                if let Some(m) = self.index.maps.get_mut(&key) {
                    m.summary = summary;
                    self.groups.mark_chunk(key);
                }
            }
        }
        Ok(Some((pages, repaired)))
    }

    /// Drops the least recently used clean chunks once more than the bound are in RAM.
    fn evict(&mut self, keep: ChunkKey) {
        let limit = self.opts.index_chunks.max(1);
        let loaded = &self.index.loaded;
        if loaded.len() <= limit.max(self.index.evict_at) {
            return;
        }
        let mut clean: Vec<(u64, ChunkKey)> = loaded
            .iter()
            .filter(|(k, c)| !c.dirty && **k != keep && self.index.maps.contains_key(k))
            .map(|(k, c)| (c.used, *k))
            .collect();
        clean.sort_unstable();
        let excess = loaded.len() - limit * 3 / 4;
        for (_, k) in clean.into_iter().take(excess) {
            self.index.loaded.remove(&k);
            self.index.evictions += 1;
        }
        // A pass scans every chunk in RAM: one that could not get under the bound (too few
        // clean) is tried again an eighth of the bound later, so that a load costs a scan
        // of eight chunks at most.
        let left = self.index.loaded.len();
        self.index.evict_at = if left > limit { left + limit.div_ceil(8) } else { 0 };
    }

    /// Records a page replayed onto a chunk whose map is not read yet.
    pub(crate) fn overlay_loc(&mut self, key: (u64, u64), loc: Loc) {
        let ck = chunk_key(key.0, key.1);
        if self.index.overlay.get(&ck).and_then(|o| o.get(&key.1)).is_some_and(|l| l.version > loc.version) {
            return;
        }
        self.count_loc(&loc, true);
        if let Some(old) = self.index.overlay.entry(ck).or_default().insert(key.1, loc) {
            self.count_loc(&old, false);
        }
    }

    /// Where logical page `index` of `ino` is, if it was written.
    pub(crate) fn loc(&mut self, ino: u64, index: u64) -> Result<Option<Loc>, FsError> {
        let ck = chunk_key(ino, index);
        if !self.load_chunk(ck)? {
            return Ok(None);
        }
        Ok(self.index.loaded[&ck].pages.get(&index).cloned())
    }

    /// Sets where a logical page is (fragments still pending in the page being filled are
    /// counted when it is sealed).
    pub(crate) fn set_loc(&mut self, key: (u64, u64), loc: Loc) -> Result<(), FsError> {
        let ck = chunk_key(key.0, key.1);
        if !self.load_chunk(ck)? {
            let used = self.index.tick;
            self.index.loaded.insert(ck, Chunk { pages: BTreeMap::new(), dirty: true, used });
        }
        self.count_loc(&loc, true);
        let chunk = self.index.loaded.get_mut(&ck).expect("loaded above");
        chunk.dirty = true;
        if let Some(old) = chunk.pages.insert(key.1, loc) {
            self.count_loc(&old, false);
        }
        Ok(())
    }

    /// Points the fragments pending in the page just sealed at `addr`, and counts them.
    pub(crate) fn fix_pending(&mut self, addr: PageAddr, keys: Vec<(u64, u64)>) {
        let mut bytes = 0;
        for key in keys {
            if let Some(loc) = self.index.loc_mut(key) {
                let (slot, count) = (loc.slot, loc.count);
                for f in loc.frags.iter_mut().filter(|f| f.0 == PENDING) {
                    f.0 = addr.0;
                    bytes += crate::fs::node_part(frag_bytes(f), slot, count);
                }
            }
        }
        for ck in std::mem::take(&mut self.index.buf_maps) {
            if let Some(m) = self.index.maps.get_mut(&ck) {
                for f in m.frags.iter_mut().filter(|f| f.0 == PENDING) {
                    f.0 = addr.0;
                    bytes += frag_bytes(f);
                }
            }
        }
        for g in std::mem::take(&mut self.groups.buf) {
            if let Some(a) = self.groups.at.get_mut(&g) {
                for f in a.frags.iter_mut().filter(|f| f.0 == PENDING) {
                    f.0 = addr.0;
                    bytes += frag_bytes(f);
                }
            }
        }
        if let Some(phys) = self.store.segment_of(addr) {
            *self.index.usage.entry(phys).or_insert(0) += bytes;
        }
    }

    /// Removes the pages of `ino` from `from` on (those newer than `unless_newer` stay: a
    /// replayed shrink does not undo writes after it). A chunk wholly removed whose map is
    /// beyond repair is dropped all the same; one that keeps pages is an error.
    pub(crate) fn remove_pages(
        &mut self,
        ino: u64,
        from: u64,
        unless_newer: Option<u64>,
    ) -> Result<(), FsError> {
        self.remove_range(ino, from..u64::MAX, unless_newer)
    }

    /// As [`remove_pages`](Self::remove_pages), for the pages in `range` only.
    pub(crate) fn remove_range(
        &mut self,
        ino: u64,
        range: std::ops::Range<u64>,
        unless_newer: Option<u64>,
    ) -> Result<(), FsError> {
        let (from, end) = (range.start, range.end);
        for ck in self.index.chunks_of(ino) {
            let (first, past) = (ck.first_page(), ck.chunk.saturating_add(1).saturating_mul(CHUNK_PAGES));
            if past <= from || first >= end {
                continue;
            }
            let whole = first >= from && past <= end && unless_newer.is_none();
            match self.load_chunk(ck) {
                Ok(_) => {}
                Err(_) if whole => {
                    // Its pages are gone either way; the map leaves at the next checkpoint,
                    // which recounts the usage table (their bytes cannot be taken out here).
                    for l in self.index.overlay.remove(&ck).unwrap_or_default().into_values() {
                        self.count_loc(&l, false);
                    }
                    self.index.stale_counts = true;
                    let used = self.index.tick;
                    self.index.loaded.insert(ck, Chunk { pages: BTreeMap::new(), dirty: true, used });
                    continue;
                }
                Err(e) => return Err(e),
            }
            let chunk = self.index.loaded.get_mut(&ck).expect("loaded above");
            let gone: Vec<u64> = chunk
                .pages
                .iter()
                .filter(|(i, l)| range.contains(i) && unless_newer.is_none_or(|v| l.version <= v))
                .map(|(i, _)| *i)
                .collect();
            if gone.is_empty() {
                continue;
            }
            chunk.dirty = true;
            let locs: Vec<Loc> = gone.iter().filter_map(|i| chunk.pages.remove(i)).collect();
            for l in locs {
                self.count_loc(&l, false);
            }
        }
        Ok(())
    }

    /// Writes the map node of every chunk changed since the last checkpoint (before the
    /// checkpoint that refers to them); drops the maps of chunks left empty.
    pub(crate) fn write_maps(&mut self) -> Result<(), FsError> {
        // Chunks with pages replayed beside their map: merged now (a map beyond repair keeps
        // its chunk unreadable, and its old map).
        let replayed: Vec<ChunkKey> = self.index.overlay.keys().copied().collect();
        for ck in replayed {
            match self.load_chunk(ck) {
                Ok(_)
                | Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                }
                Err(e) => return Err(e),
            }
        }
        self.write_dirty_maps(usize::MAX)?;
        self.evict(ChunkKey { ino: u64::MAX, chunk: u64::MAX });
        Ok(())
    }

    /// Whether so many chunks in RAM are dirty that their maps are written before a
    /// checkpoint is due: a dirty chunk stays in RAM until its map is on flash. (Chunks a
    /// replay left in the overlay are merged and written by the next checkpoint.)
    pub(crate) fn maps_due(&self) -> bool {
        self.index.dirty_loaded() > self.dirty_chunks_bound()
    }

    fn dirty_chunks_bound(&self) -> usize {
        (self.opts.index_chunks / 2).max(32)
    }

    /// Maps the write-back thread writes ahead of a checkpoint, a step at a time: past the
    /// bound, down to half of it; with a checkpoint due, down to `left` (the checkpoint
    /// writes the rest in its one hold of the lock).
    pub(crate) fn maps_ahead(&self, left: usize) -> usize {
        let dirty = self.index.dirty_loaded();
        let keep = if self.checkpoint_due() {
            left
        } else if self.maps_due() {
            self.dirty_chunks_bound() / 2
        } else {
            dirty
        };
        dirty.saturating_sub(keep)
    }

    /// Writes the maps of `count` dirty chunks (least recently used first) without a
    /// checkpoint: the chunks can leave RAM, and the checkpoint that comes has fewer maps to
    /// write in its one hold of the lock.
    ///
    /// Sound because nothing reads these maps but this mount until a checkpoint names them:
    /// replay after a crash takes each map from the checkpoint it starts from (whose map
    /// nodes the cleaner keeps until a newer checkpoint no longer names them) and replays the
    /// data nodes written since on top, skipping map nodes.
    pub(crate) fn write_maps_early(&mut self, count: usize) -> Result<(), FsError> {
        self.write_dirty_maps(count)?;
        self.evict(ChunkKey { ino: u64::MAX, chunk: u64::MAX });
        Ok(())
    }

    /// Writes the maps of up to `most` dirty chunks in RAM, least recently used first.
    fn write_dirty_maps(&mut self, most: usize) -> Result<(), FsError> {
        let mut dirty: Vec<(u64, ChunkKey)> =
            self.index.loaded.iter().filter(|(_, c)| c.dirty).map(|(k, c)| (c.used, *k)).collect();
        if most < dirty.len() {
            dirty.select_nth_unstable(most);
            dirty.truncate(most);
        }
        for (_, ck) in dirty {
            // Its group in memory before its map changes there (a group let go since the
            // chunk was loaded would otherwise be read back over the change).
            self.need_chunk(ck)?;
            let chunk = &self.index.loaded[&ck];
            if chunk.pages.is_empty() {
                self.index.loaded.remove(&ck);
                if let Some(old) = self.index.maps.remove(&ck) {
                    self.account(&old.frags, false);
                    self.groups.mark_chunk(ck);
                }
                continue;
            }
            let payload = encode_map(ck, &chunk.pages);
            self.index.map_bytes_since += map_len(chunk.pages.len());
            let summary = MapSummary::of(&chunk.pages);
            let version = self.page.next_version();
            if let Some(old) = self.index.maps.insert(ck, MapAt { frags: Vec::new(), version, summary }) {
                self.account(&old.frags, false);
            }
            self.groups.mark_chunk(ck);
            self.put_node(
                NodeKind::Map,
                0,
                (ck.ino, ck.chunk),
                version,
                &[&payload],
                super::keys::Pending::Map(ck),
            )?;
            self.index.maps_written += 1;
            if let Some(c) = self.index.loaded.get_mut(&ck) {
                c.dirty = false;
                // Clean now, it can go: the next load looks again.
                self.index.evict_at = 0;
            }
        }
        Ok(())
    }

    /// Logical pages whose data is live on flash pages `pages`, found from the fragments on
    /// those pages (each names its file, page and version) and the index. A page that cannot
    /// be read is matched against the whole index instead. Errors only on media errors.
    pub(crate) fn live_keys_on(&mut self, pages: &[u32]) -> Result<Vec<(u64, u64)>, FsError> {
        let mut keys = Vec::new();
        let mut unreadable = HashSet::new();
        let mut flash = vec![0u8; self.page.size()];
        for &page in pages {
            // Claimed: a page whose spare is lost may still hold live fragments (what it
            // seems to hold counts only where the index agrees, below).
            match self.store.read_claimed(PageAddr(page), &mut flash) {
                Ok(_) => {}
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                    unreadable.insert(page);
                    continue;
                }
                Err(e) => return Err(e),
            }
            // The node whose fragment was last looked at: its pages are checked once.
            let mut last_node = None;
            for (f, _, _) in frags(&flash) {
                if f.kind != NodeKind::Data || last_node == Some((f.key, f.key2, f.version)) {
                    continue;
                }
                last_node = Some((f.key, f.key2, f.version));
                // Every page of a node of several is live on its own (an overwrite of one
                // leaves the others where they are).
                for slot in 0..f.pages() as u64 {
                    let index = f.key2.saturating_add(slot);
                    // A map beyond repair: whatever of it is here cannot be moved.
                    let loc = match self.loc(f.key, index) {
                        Ok(l) => l,
                        Err(FsError::Corrupt(
                            Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. },
                        )) => {
                            unreadable.insert(page);
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    let here = |l: &Loc| {
                        l.version == f.version && l.slot as u64 == slot && l.frags.iter().any(|x| x.0 == page)
                    };
                    if loc.is_some_and(|l| here(&l)) {
                        keys.push((f.key, index));
                    }
                }
            }
        }
        if !unreadable.is_empty() {
            // Which logical pages sit on them is known from every map only.
            self.need_all()?;
            for ck in self.index.all_chunks() {
                if !matches!(self.load_chunk(ck), Ok(true)) {
                    continue;
                }
                for (index, loc) in &self.index.loaded[&ck].pages {
                    if loc.frags.iter().any(|f| unreadable.contains(&f.0)) {
                        keys.push((ck.ino, *index));
                    }
                }
            }
        }
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }

    /// Logical pages with a fragment in physical segment `phys`, from the whole index (a
    /// check for debug builds: it reads every map).
    pub(crate) fn index_points_into(&mut self, phys: u32) -> Vec<(u64, u64)> {
        let _ = self.need_all();
        let mut found = Vec::new();
        for ck in self.index.all_chunks() {
            if !matches!(self.load_chunk(ck), Ok(true)) {
                continue;
            }
            for (index, loc) in &self.index.loaded[&ck].pages {
                if loc.frags.iter().any(|f| self.store.segment_of(PageAddr(f.0)) == Some(phys)) {
                    found.push((ck.ino, *index));
                }
            }
        }
        found
    }

    /// The usage table and totals recomputed from every chunk (fsck compares them with the
    /// kept ones); chunks whose map cannot be read are skipped and counted.
    pub(crate) fn recount(&mut self) -> (HashMap<u32, u64>, Totals, u64) {
        let _ = self.need_all();
        let mut usage: HashMap<u32, u64> = HashMap::new();
        let mut totals = Totals::default();
        let mut lost = 0;
        let add =
            |usage: &mut HashMap<u32, u64>, store: &crate::store::PageStore<N>, page: u32, bytes: u64| {
                if let Some(phys) = store.segment_of(PageAddr(page)) {
                    *usage.entry(phys).or_insert(0) += bytes;
                }
            };
        let groups = self.groups.at.values().map(|a| &a.frags);
        for frags in self.index.maps.values().map(|m| &m.frags).chain(groups) {
            for f in frags.iter().filter(|f| f.0 != PENDING) {
                add(&mut usage, &self.store, f.0, frag_bytes(f));
            }
        }
        for ck in self.index.all_chunks() {
            if !matches!(self.load_chunk(ck), Ok(true)) {
                lost += 1;
                continue;
            }
            for loc in self.index.loaded[&ck].pages.values() {
                totals.pages += 1;
                for f in &loc.frags {
                    totals.stored += loc.part(f.2 as u64);
                    totals.footprint += loc.part(frag_bytes(f));
                    if f.0 != PENDING {
                        add(&mut usage, &self.store, f.0, loc.part(frag_bytes(f)));
                    }
                }
            }
        }
        usage.retain(|_, b| *b > 0);
        (usage, totals, lost)
    }
}

impl<N: Nand> Fs<N> {
    /// Marks the index chunks whose map node is in `phys` dirty, so that the next checkpoint
    /// writes them elsewhere. Returns whether every one could be read, and whether `phys`
    /// holds a map node a checkpoint that mount may start from refers to.
    pub(crate) fn mark_maps_in(&mut self, phys: u32) -> Result<(bool, bool), FsError> {
        let mut readable = true;
        let in_victim = match self.maps_named_in(phys)? {
            Some(keys) => keys,
            None => {
                // A page there does not read: which maps sit in it is known from every map.
                self.need_all()?;
                self.index.maps.keys().copied().collect()
            }
        };
        let in_victim: Vec<ChunkKey> = in_victim
            .into_iter()
            .filter(|k| {
                let at = self.index.maps.get(k);
                at.is_some_and(|m| m.frags.iter().any(|f| self.store.segment_of(PageAddr(f.0)) == Some(phys)))
            })
            .collect();
        for ck in in_victim {
            match self.load_chunk(ck) {
                Ok(_) => {
                    if let Some(c) = self.index.loaded.get_mut(&ck) {
                        c.dirty = true;
                    }
                }
                // A map beyond repair stays where it is: its pages read as EIO, not as holes.
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                    readable = false
                }
                Err(e) => return Err(e),
            }
        }
        // Groups there are written elsewhere by the next checkpoint too.
        let segment_of = |p: u32| self.store.segment_of(PageAddr(p));
        let groups: Vec<super::keys::GroupId> = (self.groups.at.iter())
            .filter(|(_, a)| a.frags.iter().any(|f| segment_of(f.0) == Some(phys)))
            .map(|(g, _)| *g)
            .collect();
        self.groups.dirty.extend(groups);
        let held = self.map_holding_segments().contains(&phys);
        Ok((readable, held))
    }

    /// The chunks whose map nodes segment `phys` holds, their groups read: from memory when
    /// every group is read, else from the nodes on its pages (each names its chunk), so
    /// that a cleaner's pass does not read the whole namespace. `None` if a page does not
    /// read.
    fn maps_named_in(&mut self, phys: u32) -> Result<Option<Vec<ChunkKey>>, FsError> {
        if self.groups.unread_count() == 0 {
            return Ok(Some(self.index.maps.keys().copied().collect()));
        }
        let mut keys = std::collections::BTreeSet::new();
        let mut flash = vec![0u8; self.page.size()];
        for page in self.store.data_pages_of(phys)? {
            match self.store.read_claimed(PageAddr(page), &mut flash) {
                Ok(_) => {}
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            }
            let maps = frags(&flash).filter(|(f, _, _)| f.kind == NodeKind::Map);
            keys.extend(maps.map(|(f, _, _)| ChunkKey { ino: f.key, chunk: f.key2 }));
        }
        for &ck in &keys {
            self.need_chunk(ck)?;
        }
        Ok(Some(keys.into_iter().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ck(ino: u64, chunk: u64) -> ChunkKey {
        ChunkKey { ino, chunk }
    }

    fn chunk(key: ChunkKey, n: u64) -> BTreeMap<u64, Loc> {
        (0..n)
            .map(|i| {
                let index = key.first_page() + i * 3 % CHUNK_PAGES;
                let frags = vec![(100 + i as u32, 32 * i as u16, 900), (101 + i as u32, 0, 50)];
                // Every third entry one of a node of several pages.
                let (slot, count) = if i % 3 == 1 { ((i % 4) as u8, 4 + (i % 13) as u8) } else { (0, 1) };
                let crc = (i % 2 == 0).then_some(i as u32 * 77);
                (index, Loc { frags, codec: 1, version: 1000 + i, crc, slot, count })
            })
            .collect()
    }

    #[test]
    fn maps_round_trip_compressed_or_not_and_refuse_damage() {
        for n in [1, 5, 21] {
            let key = ck(7, 3);
            let pages = chunk(key, n);
            let enc = encode_map(key, &pages);
            // The larger maps are worth compressing; a one-entry map is not.
            assert_eq!(enc[..4] == MAP_ZSTD_MAGIC.to_le_bytes(), n > 1, "{n} entries: {} bytes", enc.len());
            assert_eq!(decode_map(&enc, key), Some(pages.clone()));
            // Another chunk's map is refused; a changed byte is refused or (in a zstd frame
            // header field that does not change the output) decodes to the same map: never
            // to another one.
            assert_eq!(decode_map(&enc, ck(7, 4)), None);
            let mut refused = 0;
            for at in 0..enc.len() {
                let mut bad = enc.clone();
                bad[at] ^= 0x10;
                match decode_map(&bad, key) {
                    None => refused += 1,
                    Some(d) => assert_eq!(d, pages, "byte {at} of {n} entries"),
                }
            }
            assert!(
                refused + 8 >= enc.len(),
                "{n} entries: {refused} of {} changed bytes refused",
                enc.len()
            );
        }
        // Hostile: a chunk number whose pages would overflow, a huge claimed length, noise.
        let far = ck(1, u64::MAX);
        let mut one = BTreeMap::new();
        one.insert(0, Loc::single(vec![(1, 0, 1)], 0, 1, None));
        assert_eq!(decode_map(&encode_map(far, &one), far), None);
        let mut huge = MAP_ZSTD_MAGIC.to_le_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0u8; 64]);
        assert_eq!(decode_map(&huge, ck(1, 1)), None);
        let mut rng = bitmend_media::rng::Rng::new(3);
        for len in 0..300 {
            let mut noise = vec![0u8; len];
            rng.fill(&mut noise);
            assert_eq!(decode_map(&noise, ck(1, 1)), None);
        }
    }
}
