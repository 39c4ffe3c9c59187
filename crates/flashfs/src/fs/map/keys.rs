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

/// The hasher of the maps keyed by the file system's own numbers (inodes, groups): [`mix`] of
/// each word. Those keys are not a user's to choose, so the standard hasher's defence
/// against chosen keys buys nothing there, and SipHash cost a tenth of reading a group.
#[derive(Clone, Copy, Default)]
pub(crate) struct NumberHasher(u64);

impl std::hash::Hasher for NumberHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = mix(self.0 ^ x);
    }
}

/// A hash map keyed by the file system's own numbers (see [`NumberHasher`]).
pub(crate) type NumberMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<NumberHasher>>;
/// A hash set of them.
pub(crate) type NumberSet<K> = std::collections::HashSet<K, std::hash::BuildHasherDefault<NumberHasher>>;

/// The top bits of a hash that name a directory's region (format version 10): a directory's
/// entries, and the inodes made in it with their maps, hash into its region, so that the
/// groups a directory's listing and its files' attributes need are few, and the ones one
/// create changes are one.
pub(crate) const REGION_BITS: u32 = 20;
/// An inode number's bits below its region: the inode counter.
const REGION_SHIFT: u32 = 64 - REGION_BITS;

/// The region of directory `dir`: where its entries hash, and the inodes made in it.
pub(crate) fn dir_region(dir: u64) -> u64 {
    mix(dir) >> REGION_SHIFT
}

/// The number of the inode made from `counter` in directory `dir`: the directory's region
/// on top of the counter (an inode from before version 10, or one whose directory's region
/// is 0, has none, and hashes as it did). `None` once the counters are spent (2^44 inodes
/// made, or an image that says so): a number would otherwise run into the region's bits.
pub(crate) fn ino_in(dir: u64, counter: u64) -> Option<u64> {
    (counter >> REGION_SHIFT == 0).then(|| dir_region(dir) << REGION_SHIFT | counter)
}

/// The counter an inode number was made from.
pub(crate) fn ino_counter(ino: u64) -> u64 {
    ino & ((1 << REGION_SHIFT) - 1)
}

/// The region of inode `ino`, if it was made in one.
pub(crate) fn ino_region(ino: u64) -> Option<u64> {
    Some(ino >> REGION_SHIFT).filter(|&r| r != 0)
}

/// Hash `h` moved into `region`: the region on top, `h`'s first bits below it.
pub(crate) fn in_region(region: u64, h: u64) -> u64 {
    region << REGION_SHIFT | h >> REGION_BITS
}

/// A group: the hashes whose first `depth` bits are `prefix`. Ordered by first hash (then
/// depth), as the checkpoint's table is: sets of groups are built from it in one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GroupId {
    pub depth: u8,
    pub prefix: u64,
}

impl Ord for GroupId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.start(), self.depth, self.prefix).cmp(&(other.start(), other.depth, other.prefix))
    }
}

impl PartialOrd for GroupId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl GroupId {
    /// The first hash in it.
    pub(crate) fn start(self) -> u64 {
        if self.depth == 0 {
            0
        } else {
            self.prefix << (64 - self.depth)
        }
    }

    /// Hashes in it (2^64 for the whole: as u128).
    pub(crate) fn span(self) -> u128 {
        1u128 << (64 - self.depth)
    }

    pub(crate) fn holds(self, h: u64) -> bool {
        self.depth == 0 || h >> (64 - self.depth) == self.prefix
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
