//! The file system: inodes, directories and file data as nodes in the page store's log, a
//! RAM index of where every node lives, write-back of file data with a bound, and the
//! POSIX-like operations the FUSE adapter and the command line call.
//!
//! Consistency: the nodes of one metadata operation (a rename's two entries and the inodes it
//! touches, say) are written into one page, and a page is valid whole or not at all (its
//! signature), so an operation survives a crash whole or not at all. File data is written
//! before the inode that gives it its size, so a crash never leaves a size pointing past data.
//! What `fsync` or `sync` returned for is durable and correctable.

mod budget;
pub(crate) mod cache;
mod check;
mod checkpoint;
mod clean;
mod dirty_state;
mod falloc;
pub(crate) mod map;
mod namespace;
pub(crate) mod node;
mod ops;
pub use ops::PreparedWrite;
mod read_plan;
pub use read_plan::ReadPlan;
pub(crate) mod recovery;
mod scan;
mod scrub;
mod write;
mod xattr;

use bitmend_media::nand::Nand;

pub use check::CheckReport;
pub use dirty_state::{DirtyState, DirtyStateError, PagePut, TierFill, TierWrite};
pub use falloc::Falloc;
pub(crate) use namespace::Inode;
pub use node::{Ino, LOGICAL_PAGE};
pub use recovery::{DirtyRecovery, DirtyRecoveryReport, MountReport};
pub use scrub::{QuickScrubReport, ScrubPass, ScrubReport};
pub use xattr::{XattrMode, XATTR_NAME_MAX};

use crate::fs::node::Attr;
use crate::store::PageStore;
use crate::FormatError;
use crate::{FsConfig, FsError};

/// The root directory's inode number.
pub const ROOT: Ino = Ino(1);
/// Longest name in a directory.
pub const NAME_MAX: usize = 255;
/// Longest symlink target (Linux's PATH_MAX less the NUL).
pub const SYMLINK_MAX: usize = 4095;
/// Longest symlink target kept in the inode node; a longer one is the symlink's logical
/// page 0 (version 7), so that an operation's nodes still fit in one flash page.
pub const INLINE_TARGET_MAX: usize = 1024;
/// Smallest flash page the file system runs on (one metadata operation fits in a page).
pub const MIN_PAGE: u32 = 2048;

/// How file data is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Lz4,
    Zstd,
}

impl Compression {
    /// The superblock's byte for it (FORMAT.md section 7, superblock).
    pub(crate) fn recorded(self) -> u8 {
        match self {
            Compression::None => 1,
            Compression::Lz4 => 2,
            Compression::Zstd => 3,
        }
    }

    pub(crate) fn from_recorded(b: u8) -> Option<Compression> {
        match b {
            1 => Some(Compression::None),
            2 => Some(Compression::Lz4),
            3 => Some(Compression::Zstd),
            _ => None,
        }
    }

    pub(crate) fn flag(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Lz4 => crate::fs::node::FLAG_LZ4,
            Compression::Zstd => crate::fs::node::FLAG_ZSTD,
        }
    }
}

/// Choices that are not on the medium.
#[derive(Clone, Copy, Debug)]
pub struct FsOptions {
    pub compression: Compression,
    /// Dirty file data kept in RAM before it is written out.
    pub dirty_limit: usize,
    /// Whether a thread of the caller's writes dirty data back ([`Fs::write_back_step`]
    /// while [`Fs::write_back_due`]): a `write` then writes back itself only past
    /// [`BACKGROUND_HARD_LIMIT`] times `dirty_limit` (the thread fell that far behind).
    /// Otherwise each `write` that passes `dirty_limit` writes everything back itself.
    pub background_write_back: bool,
    /// Chunks of the index ([`CHUNK_PAGES`] logical pages each) kept in RAM: the least
    /// recently used are dropped past it (read again from their map nodes when needed).
    pub index_chunks: usize,
    /// lz4's effort for cold data, the pages the cleaner moves: 0 its fast compressor, 1 to
    /// [`MAX_LZ4_LEVEL`] its high-compression one (what is written is lz4's block format
    /// either way, so this is not recorded). The cleaner reads and rewrites them anyway,
    /// outside the writer's path.
    pub lz4_level: u8,
    /// lz4's effort for what is written (as [`lz4_level`](Self::lz4_level)): the fast
    /// compressor by default, so that compressing does not cost the writer.
    pub lz4_write_level: u8,
    /// The most consecutive logical pages of a file compressed together into one node
    /// (aligned: a node starts at a multiple of it), 1 to [`MAX_NODE_PAGES`]. More compress
    /// better; a read of one page then decompresses its whole node (docs/DESIGN.md, "Nodes of
    /// several pages"). Data that does not compress is stored a page per node whatever this is.
    pub node_pages: usize,
    /// When a read checks the cached page it reads against its CRC (Loris's strategies).
    pub verify: Verify,
    /// Clean logical pages kept in RAM with their CRCs (0: none; reads go to flash).
    pub cache_pages: usize,
    /// A mount reads the namespace's groups as they are needed, not all at once (format
    /// 10; an older image is read whole, to be regrouped).
    pub lazy_namespace: bool,
    /// Inodes kept in memory before groups read and unchanged since are let go
    /// ([`Fs::shed_namespace`], between operations); 0: no bound.
    pub namespace_cache: usize,
}

/// With [`FsOptions::background_write_back`], how many times `dirty_limit` of dirty data a
/// `write` lets wait for the write-back thread before it writes back itself (room for a
/// request of up to three limits while the thread is busy; RAM stays bounded).
pub const BACKGROUND_HARD_LIMIT: usize = 4;

/// With [`FsOptions::background_write_back`], how many times `dirty_limit` of dirty data a
/// writer that can wait for the thread lets build up before it does
/// ([`Fs::writer_should_wait`]): a request of one limit more stays under the hard limit.
pub const BACKGROUND_WAIT_LIMIT: usize = 2;

/// With [`FsOptions::background_write_back`], the dirty logical pages the write-back thread
/// leaves for a due checkpoint to flush in its one hold of the lock (`Fs::write_back_done`):
/// about one of the mount's steps.
pub const CHECKPOINT_FLUSH_MOST: usize = 64;

/// The default of [`FsOptions::cache_pages`]: 16 MiB of clean pages.
pub const DEFAULT_CACHE_PAGES: usize = 4096;

/// The default of [`FsOptions::node_pages`]: 16 KiB compressed together, about 10% smaller
/// than page by page on source code.
pub const DEFAULT_NODE_PAGES: usize = 4;

/// The default lz4 level: the high-compression compressor's own default, about 10% smaller
/// than the fast one on source code at about 40 MB/s, well above a NAND chip's program rate
/// (docs/DESIGN.md, "lz4's level").
pub const DEFAULT_LZ4_LEVEL: u8 = 9;

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            compression: Compression::Lz4,
            dirty_limit: 1 << 20,
            background_write_back: false,
            index_chunks: DEFAULT_INDEX_CHUNKS,
            lz4_level: DEFAULT_LZ4_LEVEL,
            lz4_write_level: 0,
            node_pages: DEFAULT_NODE_PAGES,
            verify: Verify::AfterCheck(cache::TICK),
            cache_pages: DEFAULT_CACHE_PAGES,
            lazy_namespace: true,
            namespace_cache: DEFAULT_NAMESPACE_CACHE,
        }
    }
}

pub use crate::fs::node::{MAX_LZ4_LEVEL, MAX_NODE_PAGES};

/// Inodes a mount keeps in memory by default: with their names, maps and group bookkeeping
/// about 1 KiB each (`bench namespace`), so about 16 MiB.
pub const DEFAULT_NAMESPACE_CACHE: usize = 16_384;

pub use cache::{CacheCheck, CacheStats, Cached, Verify, TICK};
pub use map::index::DEFAULT_INDEX_CHUNKS;
pub use map::keys::CHUNK_PAGES;
pub use map::state_check::StateCheck;

/// A directory entry as `readdir` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: crate::FileType,
}

/// Attribute changes; `None` leaves a field as it is.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<(i64, u32)>,
    pub mtime: Option<(i64, u32)>,
}

/// Counters since mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    /// Logical bytes of file data written out (after write-back).
    pub data_bytes: u64,
    /// Bytes those took in nodes (compressed, with their CRCs).
    pub data_stored: u64,
    /// Logical pages rewritten because a read had to repair a flash page under them.
    pub relocated: u64,
    /// Reads that failed because a flash page was beyond repair.
    pub unreadable: u64,
    pub checkpoints: u64,
    /// Size of the last checkpoint.
    pub checkpoint_bytes: u64,
    /// Segments the cleaner emptied and released.
    pub segments_cleaned: u64,
    /// Logical pages the cleaner moved out of them.
    pub pages_moved: u64,
    /// Segments whose live data was moved but which still held some when they were to be
    /// erased (a move that missed a page): kept, not erased.
    pub segments_refused: u64,
    /// Runs of the cleaner proper (free segments below its reserve: whole victims moved
    /// in one call), and steps the background cleaner took (`Fs::clean_step`), with the
    /// segments those steps released.
    pub cleaner_runs: u64,
    pub clean_steps: u64,
    pub segments_cleaned_in_steps: u64,
    /// Logical pages stored plain without a compression attempt, after a page of the same
    /// file that compressed by less than an eighth.
    pub compression_skipped: u64,
    /// Data nodes written holding more than one logical page, and the pages in them.
    pub multi_page_nodes: u64,
    pub pages_in_multi_page_nodes: u64,
    /// Index chunks read from their map nodes, dropped from RAM, and map nodes written.
    pub maps_loaded: u64,
    pub maps_evicted: u64,
    pub maps_written: u64,
    /// Index chunks whose lost map node was rebuilt from the data nodes' keys.
    pub maps_rebuilt: u64,
    /// Group nodes of the namespace written (version 8), and the groups the state is in now.
    pub groups_written: u64,
    pub groups: u64,
    /// Groups not in memory: not read since mount (`FsOptions::lazy_namespace`), or let go.
    pub groups_unread: u64,
    /// Groups let go to keep the namespace within its cache, since mount.
    pub groups_shed: u64,
    /// Inodes in memory (the namespace cache's measure).
    pub inodes_in_memory: u64,
    /// Logical pages planned to be read from flash without the lock (`plan_read`), and of
    /// those, pages whose check failed and were read again under it (`finish_read`).
    pub reads_unlocked: u64,
    pub reads_relocked: u64,
}

/// What the file system has had to repair over its life: kept in every checkpoint, so they
/// survive unmounts (events after the last checkpoint of a crashed mount are not counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Flash pages rebuilt from their group's parity pages.
    pub repaired_by_group: u64,
    /// Flash pages rebuilt from the segment's parity blocks.
    pub repaired_by_segment: u64,
    /// Logical pages rewritten away from a repaired flash page.
    pub relocated: u64,
    /// Flash pages found beyond repair (their file ranges read as EIO).
    pub unrecoverable: u64,
    /// Completed scrub passes, and the pages they checked.
    pub scrub_passes: u64,
    pub pages_scrubbed: u64,
    /// Programs and erases the chip failed.
    pub program_failures: u64,
    pub erase_failures: u64,
}

impl Health {
    /// How many counters the checkpoint's health section holds (FORMAT.md section 8,
    /// checkpoint payload), in this order.
    pub const COUNTERS: usize = 8;

    pub(crate) fn to_array(self) -> [u64; Health::COUNTERS] {
        [
            self.repaired_by_group,
            self.repaired_by_segment,
            self.relocated,
            self.unrecoverable,
            self.scrub_passes,
            self.pages_scrubbed,
            self.program_failures,
            self.erase_failures,
        ]
    }

    pub(crate) fn from_array(c: [u64; Health::COUNTERS]) -> Health {
        Health {
            repaired_by_group: c[0],
            repaired_by_segment: c[1],
            relocated: c[2],
            unrecoverable: c[3],
            scrub_passes: c[4],
            pages_scrubbed: c[5],
            program_failures: c[6],
            erase_failures: c[7],
        }
    }
}

/// Where a file's logical page lives: its node's fragments, as (flash page, offset, length).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub frags: Vec<(u32, u16, u16)>,
    /// How the payload is compressed: 0, or the node's codec flag.
    pub codec: u8,
    pub version: u64,
    /// CRC-32C of the uncompressed logical page (the end-to-end check the page cache
    /// reuses); unknown for pages carried over from a version 3 checkpoint until rewritten.
    pub crc: Option<u32>,
    /// The page's place among the logical pages its node holds, and how many it holds (a
    /// node holds consecutive pages of one file, compressed together; version 5).
    pub slot: u8,
    pub count: u8,
}

impl Loc {
    /// A node holding one logical page.
    pub fn single(frags: Vec<(u32, u16, u16)>, codec: u8, version: u64, crc: Option<u32>) -> Loc {
        Loc { frags, codec, version, crc, slot: 0, count: 1 }
    }

    /// This page's part of `bytes` of its node: a node's bytes are shared among its pages
    /// (the parts add up to the whole), so that the usage table drops by a page's part when
    /// it is overwritten, about what the cleaner then moves for the pages still live.
    pub fn part(&self, bytes: u64) -> u64 {
        node_part(bytes, self.slot, self.count)
    }
}

/// Page `slot`'s part of `bytes` of a node of `count` pages (see [`Loc::part`]).
pub(crate) fn node_part(bytes: u64, slot: u8, count: u8) -> u64 {
    let (s, c) = (slot as u64, count.max(1) as u64);
    bytes * (s + 1) / c - bytes * s / c
}

/// A data node of several pages as last read: (ino, first page, version), its pages, and
/// whether a flash page under it was repaired.
pub(crate) type DecodedNode = ((u64, u64, u64), Vec<u8>, bool);

/// A fragment that sits in the page being filled, not yet on flash.
pub(crate) const PENDING: u32 = u32::MAX;

/// The file system on a NAND chip. Its state comes in parts, each owned by the file (or
/// folder) that defines it: its fields are private there, and the operations here and in
/// the other files ask and tell each part through its methods (docs/DESIGN.md, "Parts that
/// own their state"; scripts/parts.sh checks it). Counters (`stats`) are not state: any
/// part counts its events there.
pub struct Fs<N: Nand> {
    pub(crate) store: PageStore<N>,
    pub(crate) opts: FsOptions,
    /// Inodes, directories, inode numbers and open handles (`namespace.rs`).
    pub(crate) ns: namespace::Namespace,
    /// File data and inodes changed but not yet written, and when (`write.rs`).
    pub(crate) wb: write::WriteBack,
    /// The head of the log: the flash page being filled, the newest version (`write.rs`).
    pub(crate) page: write::OpenPage,
    /// Where every logical page lives, with a bounded window of chunks in RAM (`map/index.rs`).
    pub(crate) index: map::index::Index,
    /// The checkpoints written and the one a mount would start from (`checkpoint.rs`).
    pub(crate) cp: checkpoint::CkptState,
    /// The namespace and the maps' places in groups, and which changed (`map/groups.rs`).
    pub(crate) groups: map::groups::Groups,
    /// Flash pages and nodes last read, for sequential reads (`ops.rs`).
    pub(crate) read_cache: ops::ReadCache,
    /// Clean logical pages with their CRCs, and the read checks (`cache.rs`).
    pub(crate) cache: cache::PageCache,
    /// Whether the cleaner runs and which segments it must leave alone (`clean/`).
    pub(crate) cleaner: clean::CleanerState,
    /// What the space budget knows beyond the index (`budget.rs`).
    pub(crate) budget: budget::Budget,
    /// Pages reserved by fallocate, until written (`falloc.rs`).
    pub(crate) reserved: falloc::Reservations,
    pub(crate) stats: FsStats,
    /// Scrub passes completed by this mount, and their pages (`scrub.rs`).
    pub(crate) scrubbed: (u64, u64),
    /// The NVRAM tier holding the dirty state, if the mount has one (`dirty_state.rs`; what
    /// it held at a crash is applied by `recovery/tier.rs`), and whether it holds anything
    /// since its last checkout. Behind a lock of its own: a write puts its pages after this
    /// file system's lock is let go (`TierWrite`).
    pub(crate) tier: Option<dirty_state::SharedTier>,
    pub(crate) tier_used: bool,
    /// The FUSE request being served and those recently done (`dirty_state.rs`).
    pub(crate) requests: dirty_state::Requests,
    /// Inodes the recovery keeps although unlinked ([`DirtyRecovery::held_open`]).
    pub(crate) held_open: std::collections::BTreeSet<u64>,
}

/// Logical pages of a file stored plain, untried, after one that compressed poorly; doubled
/// (plus one) after each further poor attempt in a row, up to [`SKIP_AFTER_INCOMPRESSIBLE_MAX`].
pub(crate) const SKIP_AFTER_INCOMPRESSIBLE: u32 = 15;
/// A file that keeps not compressing is tried once in 64 pages (256 KiB): an attempt costs
/// more than storing the page, and one page in 16 tried cost a sixth of the write path's time
/// on random data. Data that turns compressible waits at most this long to be compressed
/// (and the cleaner compresses what it moves anyway).
pub(crate) const SKIP_AFTER_INCOMPRESSIBLE_MAX: u32 = 63;

impl<N: Nand> std::fmt::Debug for Fs<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("inodes", &self.inode_count())
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

pub(crate) fn now() -> (i64, u32) {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

impl<N: Nand> Fs<N> {
    fn with_store(store: PageStore<N>, opts: FsOptions) -> Result<Fs<N>, FsError> {
        let page = store.layout.g.page_size;
        if page < MIN_PAGE {
            return Err(FormatError::Config {
                why: format!("{page}-byte pages: the file system needs {MIN_PAGE} or more"),
            }
            .into());
        }
        Ok(Fs {
            page: write::OpenPage::new(page as usize),
            store,
            opts,
            ns: namespace::Namespace::default(),
            wb: write::WriteBack::default(),
            index: map::index::Index::default(),
            cp: checkpoint::CkptState::default(),
            groups: map::groups::Groups::default(),
            read_cache: ops::ReadCache::default(),
            cache: cache::PageCache::new(opts.cache_pages, opts.verify),
            cleaner: clean::CleanerState::default(),
            budget: budget::Budget::default(),
            reserved: Default::default(),
            stats: FsStats::default(),
            scrubbed: (0, 0),
            tier: None,
            tier_used: false,
            requests: Default::default(),
            held_open: Default::default(),
        })
    }

    /// Makes a file system on `nand`: formats the page store and writes the root directory.
    pub fn format(nand: N, cfg: FsConfig, opts: FsOptions) -> Result<Fs<N>, FsError> {
        let mut fs =
            Fs::with_store(PageStore::format_recording(nand, cfg, opts.compression.recorded())?, opts)?;
        let t = now();
        let root = Attr {
            ino: ROOT,
            kind: crate::FileType::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 2,
            atime: t,
            mtime: t,
            ctime: t,
            rdev: 0,
        };
        fs.ns.insert(ROOT.0, Inode::new(root, vec![], 0));
        fs.commit(vec![fs.inode_node(ROOT.0)])?;
        fs.checkpoint()?;
        Ok(fs)
    }

    /// The page store underneath (for statistics, fault injection in tests, tools).
    pub fn store(&self) -> &PageStore<N> {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut PageStore<N> {
        &mut self.store
    }

    /// Writes everything out, with a checkpoint, and returns the chip.
    pub fn unmount(mut self) -> Result<N, FsError> {
        self.checkpoint()?;
        Ok(self.store.into_nand())
    }

    /// Returns the chip without writing anything (what a crash does).
    pub fn into_nand(self) -> N {
        self.store.into_nand()
    }

    pub fn stats(&self) -> FsStats {
        let index = self.index.counts();
        FsStats {
            maps_loaded: index.loads,
            maps_evicted: index.evictions,
            maps_written: index.maps_written,
            maps_rebuilt: index.rebuilt,
            groups_written: self.groups.written(),
            groups: self.groups.table().len() as u64,
            groups_unread: self.groups.unread_count() as u64,
            groups_shed: self.groups.shed_count(),
            inodes_in_memory: self.ns.len() as u64,
            ..self.stats
        }
    }

    /// Chunks in the index (each a map node on the flash once checkpointed).
    pub fn index_chunk_count(&self) -> usize {
        self.index.all_chunks().len()
    }

    /// Index chunks in RAM now, and how many of them changed since the last checkpoint.
    pub fn index_in_ram(&self) -> (usize, usize) {
        (self.index.loaded_count(), self.index.dirty_chunks())
    }

    /// The CRC-32C of logical page `index` of `ino` as the index records it (what a page
    /// cache checks its copy against); `None` for a hole or a page whose CRC is not recorded.
    pub fn page_crc(&mut self, ino: Ino, index: u64) -> Result<Option<u32>, FsError> {
        let ino = ino.0;
        if let Some(p) = self.wb.get((ino, index)) {
            return Ok(Some(p.crc));
        }
        Ok(self.loc(ino, index)?.and_then(|l| l.crc))
    }

    /// The compression chosen when the file system was made (none recorded: images made
    /// before the choice was kept).
    pub fn recorded_compression(&self) -> Option<Compression> {
        Compression::from_recorded(self.store.compression)
    }

    /// Compression for file data written from now on (each node records its own codec, so
    /// data already written stays readable whatever is chosen).
    pub fn set_compression(&mut self, c: Compression) {
        self.opts.compression = c;
    }

    /// Repairs and failures over the file system's life: the last checkpoint's counters plus
    /// this mount's.
    pub fn health(&self) -> Health {
        let b = self.cp.health_base();
        let st = self.store.stats();
        Health {
            repaired_by_group: b.repaired_by_group + st.repaired_by_group,
            repaired_by_segment: b.repaired_by_segment + st.repaired_by_segment,
            relocated: b.relocated + self.stats.relocated,
            unrecoverable: b.unrecoverable + st.unrecoverable,
            scrub_passes: b.scrub_passes + self.scrubbed.0,
            pages_scrubbed: b.pages_scrubbed + self.scrubbed.1,
            program_failures: b.program_failures + st.program_failures,
            erase_failures: b.erase_failures + st.erase_failures,
        }
    }

    /// Files, directories and symlinks (those in groups not read yet counted from the table).
    pub fn inode_count(&self) -> usize {
        self.ns.len() + self.groups.unread_inodes()
    }
}
