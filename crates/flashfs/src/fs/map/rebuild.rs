//! Rebuilding a lost map node from the data nodes' own keys (RCFFS's reverse index).
//!
//! Every data node names its file, its first logical page and its version. A chunk's map is
//! therefore, for each page it maps, the newest data node for that page older than the map.
//! Two things cannot be read off the data nodes, and the checkpoint keeps them for every
//! chunk (format version 7): which pages the map held (a page truncated away and a hole
//! later written over it leave old nodes behind that must not come back), and a digest of
//! the (page, version) pairs, which a rebuilt map must match before it is used. A rebuild
//! that does not match (a live node of the chunk was lost too, or was moved and its old
//! place erased before a crash) is not used: the chunk stays unreadable, never wrong.

use std::collections::BTreeMap;

use bitmend_media::nand::Nand;

use super::index::MapAt;
use super::keys::{chunk_key, mix, ChunkKey, MapSummary, CHUNK_PAGES};
use crate::fs::node::{NodeKind, CODEC_FLAGS};
use crate::fs::scan::{Assembler, Partial};
use crate::fs::{Fs, Loc};
use crate::Corruption;
use crate::FsError;

impl MapSummary {
    /// The summary of a chunk's pages (none for a chunk without pages, which has no map).
    pub fn of(pages: &BTreeMap<u64, Loc>) -> Option<MapSummary> {
        let mut s = MapSummary { mask: 0, digest: 0 };
        for (&index, loc) in pages {
            s.mask |= 1 << (index % CHUNK_PAGES);
            s.digest = s.digest.wrapping_add(mix(index ^ mix(loc.version)));
        }
        (s.mask != 0).then_some(s)
    }
}

impl<N: Nand> Fs<N> {
    /// The pages of chunk `key`, whose map node `at` cannot be read, rebuilt from the data
    /// nodes on the flash; `None` when the checkpoint keeps no summary of the map (written
    /// before version 7) or the rebuild does not match it. Reads every data page written.
    pub(crate) fn rebuild_map(
        &mut self,
        key: ChunkKey,
        at: &MapAt,
    ) -> Result<Option<BTreeMap<u64, Loc>>, FsError> {
        let Some(want) = at.summary else { return Ok(None) };
        let mut found = BTreeMap::new();
        let mut nodes = Assembler::default();
        let mut flash = vec![0u8; self.page.size()];
        for addr in self.store.log_pages(0, None)? {
            match self.store.read(addr, &mut flash) {
                Ok(_) => {}
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                    nodes.lost_page();
                    continue;
                }
                Err(e) => return Err(e),
            }
            nodes.page(addr.0, &flash, |n| {
                consider(&mut found, &n, key, at.version, want.mask);
                Ok::<(), FsError>(())
            })?;
        }
        // A live node of the chunk lost too, or moved and its old place erased before a
        // crash: no rebuild.
        Ok((MapSummary::of(&found) == Some(want)).then_some(found))
    }
}

/// Takes data node `n` as the location of each page of chunk `key` it holds that the map
/// had (`mask`), if it is older than the map (`below`) and newer than what was found so far.
fn consider(found: &mut BTreeMap<u64, Loc>, n: &Partial, key: ChunkKey, below: u64, mask: u64) {
    let h = &n.head;
    if h.kind != NodeKind::Data || h.key != key.ino || h.version >= below {
        return;
    }
    let count = h.pages();
    for slot in 0..count {
        let index = h.key2.saturating_add(slot as u64);
        if chunk_key(key.ino, index) != key || mask & (1 << (index % CHUNK_PAGES)) == 0 {
            continue;
        }
        if found.get(&index).is_some_and(|l: &Loc| l.version >= h.version) {
            continue;
        }
        let crc = n.payload.get(4 * slot..4 * slot + 4).map(|b| bitmend_code::le::get_u32(b, 0));
        let loc = Loc {
            frags: n.frags.clone(),
            codec: h.flags & CODEC_FLAGS,
            version: h.version,
            crc,
            slot: slot as u8,
            count: count as u8,
        };
        found.insert(index, loc);
    }
}
