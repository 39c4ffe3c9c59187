//! The names of what the index and the groups keep, and of where a node being written is
//! recorded: the vocabulary the index, the groups, the rebuild and the writer share, kept
//! below all four so that none of them reaches up into another for it.

use crate::fs::node::FRAG_HEADER;

/// Logical pages per chunk of the index (one map node each; 256 KiB of a file).
pub const CHUNK_PAGES: u64 = 64;
/// Fragments of a node: (flash page, offset in it, length).
pub(crate) type Frags = Vec<(u32, u16, u16)>;

/// A chunk of a file's index: [`CHUNK_PAGES`] logical pages of inode `ino`, the `chunk`-th.
/// A struct where a logical page's key is an (ino, page index) pair, so that the two cannot
/// be swapped unseen. Ordered by file, then chunk (a file's chunks are a range).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ChunkKey {
    pub ino: u64,
    pub chunk: u64,
}

/// The chunk that maps logical page `index` of `ino`.
pub(crate) fn chunk_key(ino: u64, index: u64) -> ChunkKey {
    ChunkKey { ino, chunk: index / CHUNK_PAGES }
}

pub(crate) fn frag_bytes(f: &(u32, u16, u16)) -> u64 {
    f.2 as u64 + FRAG_HEADER as u64
}

/// What the checkpoint keeps of a map to rebuild it: bit i of `mask` says page i of the
/// chunk is mapped; `digest` sums a hash of each mapped page's index and version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MapSummary {
    pub mask: u64,
    pub digest: u64,
}

/// SplitMix64's finalizer: every input bit moves every output bit.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A group: the hashes whose first `depth` bits are `prefix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct GroupId {
    pub depth: u8,
    pub prefix: u32,
}

impl GroupId {
    /// The first hash in it.
    pub(crate) fn start(self) -> u64 {
        if self.depth == 0 {
            0
        } else {
            u64::from(self.prefix) << (64 - self.depth)
        }
    }

    /// Hashes in it (2^64 for the whole: as u128).
    pub(crate) fn span(self) -> u128 {
        1u128 << (64 - self.depth)
    }

    pub(crate) fn holds(self, h: u64) -> bool {
        self.depth == 0 || (h >> (64 - self.depth)) as u32 == self.prefix
    }

    pub(crate) fn halves(self) -> (GroupId, GroupId) {
        let depth = self.depth + 1;
        (GroupId { depth, prefix: self.prefix << 1 }, GroupId { depth, prefix: self.prefix << 1 | 1 })
    }
}

/// Where the fragments of a node being written are recorded.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pending {
    /// The locations of the logical pages of a data node: (ino, first page index), pages.
    Data((u64, u64), usize),
    /// A chunk's map node (ino, chunk).
    Map(ChunkKey),
    /// A group node (`groups.rs`).
    Group(GroupId),
}
