//! Where things live on the chip, and the byte forms of the superblock and of every page's
//! spare area (docs/FORMAT.md, "flash file system").

use bitmend_code::byte_enum;
use bitmend_code::crc::{crc32c, crc32c_append};
use bitmend_code::le;
use bitmend_code::sig::Sig64;
use bitmend_media::nand::Geometry;

use crate::FormatError;
use crate::FsError;

/// The on-media version of the flash layout this build reads and writes.
pub const FS_VERSION: u32 = 10;
/// The oldest version this build still reads: 1 lacks the recorded compression and the
/// checkpoint's health section, which read as "not recorded" and zeros; 1 and 2 lack the
/// anchor log and the successor queue in the spares, and are mounted by scanning; 1 to 3 list
/// every logical page in the checkpoint (version 4 keeps the index in map nodes), which the
/// first checkpoint after mounting them writes out; 1 to 4 hold a logical page per data node
/// (version 5 compresses runs of pages together), which this build reads as they are; 1 to 5
/// write spares whose CRC does not cover the page's address (version 6 binds it, so a page
/// written to the wrong place is detected), read as they are; 1 to 6 keep no summary of each
/// map in the checkpoint (version 7 rebuilds a lost map from the data nodes with it, and
/// stores symlink targets over 1,024 bytes as data and extended attributes as nodes), whose
/// maps are rebuilt only once a checkpoint here has summarized them; 1 to 7 keep the namespace
/// and the maps' places in the checkpoint itself (version 8 writes them in group nodes that
/// the checkpoint names), which the first checkpoint after mounting them writes in groups;
/// 1 to 8 keep no erase blocks at the chip's end for far copies of the superblock (version 9
/// keeps [`FAR_BLOCKS`]; an older image keeps its segments, and its far copies go into the
/// blocks its segments leave over, if any) and no copy in each segment's first page; 8 and 9
/// hash the namespace's items into groups without directory regions (version 10 puts a
/// directory's entries and the inodes made in it in one region of the hashes), which the
/// first checkpoint after mounting them writes in new groups.
pub const FS_VERSION_OLDEST: u32 = 1;

const MAGIC: [u8; 8] = *b"BMFLASH\0";
/// Erase blocks 0 and 1 hold the superblock (page 0 of each) and the anchor log (pages 1 on).
pub(crate) const RESERVED_BLOCKS: u32 = 2;
/// Erase blocks kept at the chip's end (version 9) for far copies of the superblock: what
/// destroys the chip's first blocks (a wild erase, a bad write of a boot loader) leaves them.
pub(crate) const FAR_BLOCKS: u32 = 2;
/// Successor slots a spare can carry at most (fewer when the spare is small).
pub const QUEUE_SLOTS: usize = 4;
/// Spare bytes the file system needs per page: 36 hold every field and one successor (what a
/// chip's ECC leaves free of a 64-byte spare, when the kernel corrects first); 48 hold four.
pub const MIN_SPARE: u32 = 36;

/// The redundancy and shape chosen at mkfs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsConfig {
    /// Parity pages per group inside an erase block: a group survives any `parity_pages`
    /// damaged pages.
    pub parity_pages: u32,
    /// Parity erase blocks per segment: a stripe (page i of every block of the segment)
    /// survives any `parity_blocks` damaged pages.
    pub parity_blocks: u32,
    /// Erase blocks per segment (RCFFS: 16 x 128 KiB = 2 MiB).
    pub blocks_per_segment: u32,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 16 }
    }
}

/// Derived offsets, from the geometry and the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub g: Geometry,
    pub cfg: FsConfig,
    /// Segments on the chip.
    pub segments: u32,
    /// Erase blocks at the chip's end kept out of the segments for far superblock copies
    /// ([`FAR_BLOCKS`] since version 9, 0 before): the superblock records it.
    pub far_reserved: u32,
}

impl Layout {
    /// The layout of a new file system: [`FAR_BLOCKS`] kept at the chip's end.
    pub fn new(g: Geometry, cfg: FsConfig) -> Result<Layout, FsError> {
        Layout::keeping(g, cfg, FAR_BLOCKS)
    }

    /// The layout with `far_reserved` blocks kept at the chip's end (as a superblock says).
    pub fn keeping(g: Geometry, cfg: FsConfig, far_reserved: u32) -> Result<Layout, FsError> {
        let bad = |why: String| Err(FsError::Format(FormatError::Config { why }));
        if g.spare_size < MIN_SPARE {
            return bad(format!("{} spare bytes per page; the file system needs {MIN_SPARE}", g.spare_size));
        }
        if cfg.parity_pages == 0 || cfg.parity_pages + 1 >= g.pages_per_block || g.pages_per_block > 255 {
            return bad(format!(
                "{} parity pages in blocks of {} pages: need 1 <= p < pages per block - 1, and at most 255 pages",
                cfg.parity_pages, g.pages_per_block
            ));
        }
        if cfg.blocks_per_segment < 2
            || cfg.parity_blocks >= cfg.blocks_per_segment
            || cfg.blocks_per_segment > 255
        {
            return bad(format!(
                "{} parity blocks in segments of {} blocks: need s < blocks per segment <= 255",
                cfg.parity_blocks, cfg.blocks_per_segment
            ));
        }
        let segments = g.blocks.saturating_sub(RESERVED_BLOCKS + far_reserved) / cfg.blocks_per_segment;
        if segments < 2 {
            return bad(format!(
                "{} erase blocks hold fewer than two segments of {}",
                g.blocks, cfg.blocks_per_segment
            ));
        }
        Ok(Layout { g, cfg, segments, far_reserved })
    }

    /// The first erase block after the last segment: blocks from here to the chip's end
    /// hold no segment, and the last good ones of them the far superblock copies.
    pub fn far_start(&self) -> u32 {
        RESERVED_BLOCKS + self.segments * self.cfg.blocks_per_segment
    }

    /// Data (non-parity) blocks per segment.
    pub fn data_blocks(&self) -> u32 {
        self.cfg.blocks_per_segment - self.cfg.parity_blocks
    }

    /// Data pages a group can hold at most (the rest of a block is its parity).
    pub fn max_group(&self) -> u32 {
        self.g.pages_per_block - self.cfg.parity_pages
    }

    /// The erase block `b` (0..blocks_per_segment; data blocks first) of physical segment `seg`.
    pub fn block(&self, seg: u32, b: u32) -> u32 {
        RESERVED_BLOCKS + seg * self.cfg.blocks_per_segment + b
    }

    /// The page `i` of block `b` of physical segment `seg`.
    pub fn page(&self, seg: u32, b: u32, i: u32) -> u32 {
        self.g.first_page(self.block(seg, b)) + i
    }

    /// (physical segment, block within it, page within the block) of a chip page in a segment.
    pub fn locate(&self, page: u32) -> Option<(u32, u32, u32)> {
        let block = self.g.block_of(page);
        if block < RESERVED_BLOCKS {
            return None;
        }
        let rel = block - RESERVED_BLOCKS;
        let seg = rel / self.cfg.blocks_per_segment;
        (seg < self.segments).then(|| (seg, rel % self.cfg.blocks_per_segment, self.g.index_in_block(page)))
    }
}

byte_enum! {
/// What a page holds, as its spare area says (byte 0, bits 0 to 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// File-system data (nodes packed by the layers above).
    Data = 1,
    /// Parity page `index` of a group in the same block.
    GroupParity = 2,
    /// A page of segment parity block `index`.
    SegmentParity = 3,
    /// Filler after the last group of a block that had no room for another.
    Pad = 4,
    /// The superblock.
    Superblock = 5,
    /// A page of the anchor log (reserved blocks, pages 1 on).
    Anchor = 6,
}
}

/// A page's spare area: what the page is, where its group is, its place in the write order,
/// and the algebraic signature of its data. The file system never relies on the chip's ECC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spare {
    pub kind: Kind,
    /// Parity index (group or segment parity), else 0.
    pub index: u8,
    /// First data page (index within the block) of the page's group.
    pub group_first: u8,
    /// Data pages in the group (parity pages only; 0 on data pages, whose group is open when
    /// they are written).
    pub group_len: u8,
    /// Pages written before this one, file-system wide.
    pub seq: u64,
    /// The logical segment (how many segments were opened before this one).
    pub segment: u64,
    pub sig: Sig64,
    /// The segment's successor queue: the physical segments, in order, of which the first
    /// still free when this one fills is written next (mount follows it). The same on every
    /// page of a segment; `None` in unused slots, and in every slot before version 3.
    pub queue: [Option<u32>; QUEUE_SLOTS],
}

/// Where the spare area's fields are (FORMAT.md section 7, "Spare area"); its CRC is its
/// last 4 bytes, wherever that is.
mod spare_at {
    pub const KIND: usize = 0;
    pub const INDEX: usize = 1;
    pub const GROUP_FIRST: usize = 2;
    pub const GROUP_LEN: usize = 3;
    pub const SUCCESSOR_0: usize = 4;
    pub const SEQ: usize = 8;
    pub const SEGMENT: usize = 16;
    pub const SIG: usize = 24;
    pub const SUCCESSORS_1: usize = 32;
}

/// Where successor slot `i` lives in a spare of `n` bytes, if it fits: bytes 4..8, then
/// from byte 32 on, before the CRC.
fn queue_slot(i: usize, n: usize) -> Option<std::ops::Range<usize>> {
    let at = if i == 0 { spare_at::SUCCESSOR_0 } else { spare_at::SUCCESSORS_1 + 4 * (i - 1) };
    (at + 4 <= n - 4).then_some(at..at + 4)
}

/// Successor slots a spare of `n` bytes holds.
pub(crate) fn queue_len(n: usize) -> usize {
    (0..QUEUE_SLOTS).take_while(|&i| queue_slot(i, n).is_some()).count()
}

/// Bit 7 of the kind byte (version 6): the spare's CRC covers the page's address too, so a
/// page programmed at, or copied to, another address than the one it was made for fails its
/// check there, as damage does, and is rebuilt from parity.
const BOUND: u8 = 0x80;

/// The spare's CRC: over its bytes before the CRC, then, for a bound spare, the address.
fn spare_crc(body: &[u8], bound_to: Option<u32>) -> u32 {
    let crc = crc32c(body);
    bound_to.map_or(crc, |page| crc32c_append(crc, &page.to_le_bytes()))
}

impl Spare {
    /// Encodes the spare of the page at chip page `bind_to`, or, for images whose superblock
    /// predates version 6, `None`: unbound, as older builds read it.
    pub fn encode(&self, out: &mut [u8], bind_to: Option<u32>) {
        out.fill(0);
        out[spare_at::KIND] = self.kind as u8 | if bind_to.is_some() { BOUND } else { 0 };
        out[spare_at::INDEX] = self.index;
        out[spare_at::GROUP_FIRST] = self.group_first;
        out[spare_at::GROUP_LEN] = self.group_len;
        le::put_u64(out, spare_at::SEQ, self.seq);
        le::put_u64(out, spare_at::SEGMENT, self.segment);
        le::put_u64(out, spare_at::SIG, self.sig.to_u64());
        let n = out.len();
        for (i, q) in self.queue.iter().enumerate() {
            if let (Some(q), Some(r)) = (q, queue_slot(i, n)) {
                // Stored plus one: zero is an empty slot.
                le::put_u32(out, r.start, q + 1);
            }
        }
        let crc = spare_crc(&out[..n - 4], bind_to);
        le::put_u32(out, n - 4, crc);
        debug_assert_eq!(
            Spare::decode(out, bind_to.unwrap_or(0)),
            Some(Spare {
                queue: std::array::from_fn(|i| self.queue[i].filter(|_| queue_slot(i, n).is_some())),
                ..*self
            }),
            "a spare reads back as written (successors past its room dropped)"
        );
    }

    /// The spare read from chip page `at`: `None` for an erased spare, a torn one, garbage,
    /// or a bound one made for another page.
    pub fn decode(b: &[u8], at: u32) -> Option<Spare> {
        let n = b.len();
        let bound = b[spare_at::KIND] & BOUND != 0;
        if le::get_u32(b, n - 4) != spare_crc(&b[..n - 4], bound.then_some(at)) {
            return None;
        }
        let mut queue = [None; QUEUE_SLOTS];
        for (i, q) in queue.iter_mut().enumerate() {
            if let Some(r) = queue_slot(i, n) {
                *q = le::get_u32(b, r.start).checked_sub(1);
            }
        }
        Some(Spare {
            kind: Kind::from_u8(b[spare_at::KIND] & !BOUND)?,
            index: b[spare_at::INDEX],
            group_first: b[spare_at::GROUP_FIRST],
            group_len: b[spare_at::GROUP_LEN],
            seq: le::get_u64(b, spare_at::SEQ),
            segment: le::get_u64(b, spare_at::SEGMENT),
            sig: Sig64::from_u64(le::get_u64(b, spare_at::SIG)),
            queue,
        })
    }
}

/// One page of the anchor log: where the newest checkpoint starts, so that mount reads it
/// and follows the successor chain from its segment instead of scanning every segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Anchor {
    /// Anchors written before this one, over the file system's life.
    pub seq: u64,
    /// `None`: the chain was broken since (a segment was opened outside its predecessor's
    /// queue); mount scans every segment until the next checkpoint is anchored.
    pub ckpt: Option<AnchorCkpt>,
}

/// The checkpoint an anchor names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AnchorCkpt {
    /// The checkpoint's first page.
    pub page: u32,
    /// The logical and physical number of that page's segment.
    pub segment: u64,
    pub phys: u32,
}

const ANCHOR_MAGIC: [u8; 8] = *b"BMANCHOR";

/// Where an anchor page's fields are (FORMAT.md section 7, "Anchor log").
mod anchor_at {
    pub const MAGIC: usize = 0;
    pub const FS_ID: usize = 8;
    pub const SEQ: usize = 16;
    pub const TYPE: usize = 24;
    pub const CKPT_PAGE: usize = 28;
    pub const CKPT_SEGMENT: usize = 32;
    pub const CKPT_PHYS: usize = 40;
    /// CRC-32C of the bytes before it.
    pub const CRC: usize = 44;
    /// A copy of the superblock (version 6).
    pub const SUPERBLOCK: usize = 64;
}

/// An anchor's type byte: it names a checkpoint, or says the chain broke (mount scans).
const ANCHOR_CHECKPOINT: u8 = 1;
const ANCHOR_SCAN: u8 = 2;
/// Bytes of a superblock (its CRC included), and where an anchor page carries a copy of it
/// (version 6): a mount whose superblock pages are both unreadable takes it from the newest
/// anchor, so rewriting a damaged copy (which erases a reserved block) is safe at any cut.
pub(crate) const SUPERBLOCK_LEN: usize = 64;
const ANCHOR_SUPERBLOCK_AT: usize = anchor_at::SUPERBLOCK;

impl Anchor {
    /// Encodes the anchor, with a copy of the superblock `sb` as version `sb.1` wrote it
    /// when given.
    pub fn encode(&self, fs_id: u64, page: &mut [u8], sb: Option<(&Superblock, u32)>) {
        page.fill(0);
        if let Some((sb, version)) = sb {
            sb.encode_as(version, &mut page[ANCHOR_SUPERBLOCK_AT..ANCHOR_SUPERBLOCK_AT + SUPERBLOCK_LEN]);
        }
        page[anchor_at::MAGIC..anchor_at::MAGIC + 8].copy_from_slice(&ANCHOR_MAGIC);
        le::put_u64(page, anchor_at::FS_ID, fs_id);
        le::put_u64(page, anchor_at::SEQ, self.seq);
        if let Some(c) = self.ckpt {
            page[anchor_at::TYPE] = ANCHOR_CHECKPOINT;
            le::put_u32(page, anchor_at::CKPT_PAGE, c.page);
            le::put_u64(page, anchor_at::CKPT_SEGMENT, c.segment);
            le::put_u32(page, anchor_at::CKPT_PHYS, c.phys);
        } else {
            page[anchor_at::TYPE] = ANCHOR_SCAN;
        }
        let crc = crc32c(&page[..anchor_at::CRC]);
        le::put_u32(page, anchor_at::CRC, crc);
        debug_assert_eq!(Anchor::decode(fs_id, page), Some(*self), "an anchor reads back as written");
    }

    /// `None` unless the page is a whole anchor of file system `fs_id`.
    pub fn decode(fs_id: u64, page: &[u8]) -> Option<Anchor> {
        if page[anchor_at::MAGIC..anchor_at::MAGIC + 8] != ANCHOR_MAGIC
            || le::get_u32(page, anchor_at::CRC) != crc32c(&page[..anchor_at::CRC])
            || le::get_u64(page, anchor_at::FS_ID) != fs_id
        {
            return None;
        }
        let ckpt = match page[anchor_at::TYPE] {
            ANCHOR_CHECKPOINT => Some(AnchorCkpt {
                page: le::get_u32(page, anchor_at::CKPT_PAGE),
                segment: le::get_u64(page, anchor_at::CKPT_SEGMENT),
                phys: le::get_u32(page, anchor_at::CKPT_PHYS),
            }),
            ANCHOR_SCAN => None,
            _ => return None,
        };
        Some(Anchor { seq: le::get_u64(page, anchor_at::SEQ), ckpt })
    }

    /// The superblock an anchor page carries (version 6), with the anchor it is in; `None`
    /// for any other page, or an anchor without a copy or of another file system.
    pub fn superblock_in(page: &[u8]) -> Option<(Anchor, Superblock)> {
        let sb = Superblock::decode(anchor_superblock(page)).ok()?;
        Some((Anchor::decode(sb.fs_id, page)?, sb))
    }
}

/// The superblock: geometry, configuration, identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub g: Geometry,
    pub cfg: FsConfig,
    pub fs_id: u64,
    /// The compression chosen at mkfs for file data (byte 48): 0 not recorded (images made
    /// before it was), 1 none, 2 lz4, 3 zstd.
    pub compression: u8,
    /// Erase blocks kept at the chip's end for far copies (byte 49; version 9).
    pub far_reserved: u8,
}

/// Where the superblock's fields are (FORMAT.md section 7, "Superblock").
mod superblock_at {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const PAGE_SIZE: usize = 12;
    pub const SPARE_SIZE: usize = 16;
    pub const PAGES_PER_BLOCK: usize = 20;
    pub const BLOCKS: usize = 24;
    pub const PARITY_PAGES: usize = 28;
    pub const PARITY_BLOCKS: usize = 32;
    pub const BLOCKS_PER_SEGMENT: usize = 36;
    pub const FS_ID: usize = 40;
    pub const COMPRESSION: usize = 48;
    pub const FAR_RESERVED: usize = 49;
    /// CRC-32C of the bytes before it.
    pub const CRC: usize = 60;
}

/// The version field of an encoded superblock.
pub(crate) fn superblock_version(sb: &[u8]) -> u32 {
    le::get_u32(sb, superblock_at::VERSION)
}

/// Where an anchor page's copy of the superblock is.
pub(crate) fn anchor_superblock(page: &[u8]) -> &[u8] {
    &page[ANCHOR_SUPERBLOCK_AT..ANCHOR_SUPERBLOCK_AT + SUPERBLOCK_LEN]
}

impl Superblock {
    /// Encodes the superblock as version `version` wrote it (this build's, or an image's
    /// that it has not yet upgraded: a copy says what the image is).
    pub fn encode_as(&self, version: u32, page: &mut [u8]) {
        use superblock_at as at;
        page.fill(0);
        page[at::MAGIC..at::MAGIC + 8].copy_from_slice(&MAGIC);
        le::put_u32(page, at::VERSION, version);
        le::put_u32(page, at::PAGE_SIZE, self.g.page_size);
        le::put_u32(page, at::SPARE_SIZE, self.g.spare_size);
        le::put_u32(page, at::PAGES_PER_BLOCK, self.g.pages_per_block);
        le::put_u32(page, at::BLOCKS, self.g.blocks);
        le::put_u32(page, at::PARITY_PAGES, self.cfg.parity_pages);
        le::put_u32(page, at::PARITY_BLOCKS, self.cfg.parity_blocks);
        le::put_u32(page, at::BLOCKS_PER_SEGMENT, self.cfg.blocks_per_segment);
        le::put_u64(page, at::FS_ID, self.fs_id);
        page[at::COMPRESSION] = self.compression;
        page[at::FAR_RESERVED] = self.far_reserved;
        let crc = crc32c(&page[..at::CRC]);
        le::put_u32(page, at::CRC, crc);
        debug_assert_eq!(Superblock::decode(page).ok(), Some(*self), "a superblock reads back as written");
    }

    pub fn decode(page: &[u8]) -> Result<Superblock, FsError> {
        use superblock_at as at;
        let not = |why: &str| FsError::Format(FormatError::NotAFs { why: why.to_string() });
        if page[at::MAGIC..at::MAGIC + 8] != MAGIC {
            return Err(not("no file-system magic in the superblock page"));
        }
        let get = |off: usize| le::get_u32(page, off);
        if get(at::CRC) != crc32c(&page[..at::CRC]) {
            return Err(not("superblock checksum mismatch"));
        }
        let version = get(at::VERSION);
        if !(FS_VERSION_OLDEST..=FS_VERSION).contains(&version) {
            return Err(FormatError::Version { found: version, supported: FS_VERSION }.into());
        }
        Ok(Superblock {
            g: Geometry {
                page_size: get(at::PAGE_SIZE),
                spare_size: get(at::SPARE_SIZE),
                pages_per_block: get(at::PAGES_PER_BLOCK),
                blocks: get(at::BLOCKS),
            },
            cfg: FsConfig {
                parity_pages: get(at::PARITY_PAGES),
                parity_blocks: get(at::PARITY_BLOCKS),
                blocks_per_segment: get(at::BLOCKS_PER_SEGMENT),
            },
            fs_id: le::get_u64(page, at::FS_ID),
            compression: page[at::COMPRESSION],
            far_reserved: page[at::FAR_RESERVED],
        })
    }
}

/// Whether bytes read back are all ones: an erased page (or spare).
pub(crate) fn erased(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0xFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_round_trips_and_rejects_erased_and_damaged() {
        let s = Spare {
            kind: Kind::GroupParity,
            index: 1,
            group_first: 4,
            group_len: 9,
            seq: 123_456,
            segment: 7,
            sig: Sig64::from_u64(0xDEAD_BEEF_0123),
            queue: [Some(0), Some(9), None, Some(70_000)],
        };
        let mut b = [0u8; 64];
        s.encode(&mut b, Some(77));
        assert_eq!(Spare::decode(&b, 77), Some(s));
        // Bound to page 77: read at any other page, it is no spare (a misdirected write).
        for at in [0, 76, 78, 77 ^ (1 << 20)] {
            assert_eq!(Spare::decode(&b, at), None, "read at {at}");
        }
        // Unbound (images before version 6): read wherever it is.
        let mut old = [0u8; 64];
        s.encode(&mut old, None);
        assert_eq!(old[0], Kind::GroupParity as u8);
        assert_eq!((Spare::decode(&old, 77), Spare::decode(&old, 5)), (Some(s), Some(s)));
        // A 40-byte spare keeps the first two successors.
        let mut small = [0u8; 40];
        s.encode(&mut small, Some(3));
        let d = Spare::decode(&small, 3).unwrap();
        assert_eq!(d.queue, [Some(0), Some(9), None, None]);
        assert_eq!((queue_len(40), queue_len(64)), (2, 4));
        b[10] ^= 1;
        assert_eq!(Spare::decode(&b, 77), None);
        assert_eq!(Spare::decode(&[0xFF; 64], 0), None, "an erased spare is no spare");
    }

    #[test]
    fn anchor_round_trips_and_rejects_other_file_systems() {
        let mut page = vec![0u8; 2048];
        let a = Anchor { seq: 9, ckpt: Some(AnchorCkpt { page: 4711, segment: 33, phys: 12 }) };
        a.encode(5, &mut page, None);
        assert_eq!(Anchor::decode(5, &page), Some(a));
        assert_eq!(Anchor::superblock_in(&page), None, "no copy of the superblock");
        assert_eq!(Anchor::decode(6, &page), None, "another file system's anchor");
        page[30] ^= 4;
        assert_eq!(Anchor::decode(5, &page), None);
        let r = Anchor { seq: 10, ckpt: None };
        r.encode(5, &mut page, None);
        assert_eq!(Anchor::decode(5, &page), Some(r));
        // Version 6: the anchor carries the superblock, found without knowing the id first.
        let sb = Superblock {
            g: Geometry::RCFFS,
            cfg: FsConfig::default(),
            fs_id: 5,
            compression: 2,
            far_reserved: 0,
        };
        a.encode(5, &mut page, Some((&sb, FS_VERSION)));
        assert_eq!(Anchor::decode(5, &page), Some(a));
        assert_eq!(Anchor::superblock_in(&page), Some((a, sb)));
        page[70] ^= 1;
        assert_eq!(Anchor::superblock_in(&page), None, "a damaged copy is no copy");
        let other = Superblock { fs_id: 6, ..sb };
        a.encode(5, &mut page, Some((&other, FS_VERSION)));
        assert_eq!(Anchor::superblock_in(&page), None, "a copy of another file system's");
    }

    #[test]
    fn superblock_versions_1_to_10_are_read_and_later_ones_refused() {
        let sb = Superblock {
            g: Geometry::RCFFS,
            cfg: FsConfig::default(),
            fs_id: 7,
            compression: 2,
            far_reserved: 0,
        };
        let mut page = vec![0u8; 2048];
        for (version, ok) in [
            (1u32, true),
            (2, true),
            (3, true),
            (4, true),
            (5, true),
            (6, true),
            (7, true),
            (8, true),
            (9, true),
            (10, true),
            (11, false),
            (0, false),
        ] {
            sb.encode_as(FS_VERSION, &mut page);
            page[8..12].copy_from_slice(&version.to_le_bytes());
            let crc = crc32c(&page[..60]);
            page[60..64].copy_from_slice(&crc.to_le_bytes());
            match Superblock::decode(&page) {
                Ok(d) => assert!(ok && d == sb, "version {version}"),
                Err(FsError::Format(FormatError::Version { found, .. })) => {
                    assert!(!ok && found == version, "version {version}")
                }
                Err(e) => panic!("version {version}: {e}"),
            }
        }
    }

    #[test]
    fn layout_of_the_rcffs_chip() {
        let l = Layout::new(Geometry::RCFFS, FsConfig::default()).unwrap();
        assert_eq!(l.segments, (1024 - 2) / 16);
        assert_eq!(l.data_blocks(), 15);
        assert_eq!(l.max_group(), 63);
        let p = l.page(3, 2, 5);
        assert_eq!(l.locate(p), Some((3, 2, 5)));
        assert_eq!(l.locate(0), None);
        assert!(Layout::new(Geometry::RCFFS, FsConfig { parity_pages: 0, ..FsConfig::default() }).is_err());
        assert!(Layout::new(Geometry::RCFFS, FsConfig { parity_blocks: 16, ..FsConfig::default() }).is_err());
    }
}
