//! The superblock's copies, and finding one when others are lost.
//!
//! Page 0 of each reserved block (blocks 0 and 1) holds the superblock, and so does every
//! anchor after it (version 6). Version 9 keeps more copies far from those: page 0 of the
//! last good blocks of the chip, after the last segment (as UBI keeps its two volume-table
//! copies apart), and the first page of every segment (in the node the file system starts a
//! segment with). A mount takes the first good copy in that order: the reserved blocks, the
//! far blocks, the newest anchor, and, when every one of those is gone, the newest segment's,
//! found by reading the first page of every erase block, as RCFFS's scanning mount does. It
//! says which it used; every copy found damaged is rewritten from it.

use bitmend_media::nand::{Nand, NandError};

use crate::store::layout::{
    anchor_superblock, superblock_version, Anchor, Kind, Layout, Spare, Superblock, FAR_BLOCKS,
    RESERVED_BLOCKS,
};
use crate::store::{PageAddr, PageStore};
use crate::FormatError;
use crate::FsError;

/// Where the superblock a mount used was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SuperblockCopy {
    /// Page 0 of reserved block `block` (0 or 1).
    Reserved { block: u32 },
    /// Page 0 of erase block `block`, one of the last good ones of the chip.
    Far { block: u32 },
    /// The newest anchor that carries a copy, at chip page `page`.
    Anchor { page: u32 },
    /// The first page of a segment, at chip page `page`: no other copy was readable.
    SegmentHeader { page: u32 },
}

impl std::fmt::Display for SuperblockCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SuperblockCopy::Reserved { block } => write!(f, "the copy in reserved block {block}"),
            SuperblockCopy::Far { block } => write!(f, "the far copy in erase block {block}"),
            SuperblockCopy::Anchor { page } => write!(f, "the newest anchor's copy (page {page})"),
            SuperblockCopy::SegmentHeader { page } => {
                write!(f, "the newest segment's copy (page {page}; every other copy was unreadable)")
            }
        }
    }
}

/// The superblock copy in a page the file system wrote first in a segment, if it carries
/// one: the file system's node format, which the store does not know, says where.
pub type HeaderCopy = fn(&[u8]) -> Option<&[u8]>;

/// A copy read from a page: the superblock and the version that wrote it.
type Found = (Superblock, u32);

/// The geometry a file system on `nand` recorded, from the first superblock copy in a
/// reserved block that decodes (their data areas only: the spare size is what is asked).
/// A real chip whose spare can be used two ways (raw, or what its ECC leaves free) is
/// opened the way the file system on it was made.
pub fn recorded_geometry<N: Nand + ?Sized>(nand: &mut N) -> Option<bitmend_media::nand::Geometry> {
    let g = nand.geometry();
    let mut page = vec![0u8; g.page_size as usize];
    (0..RESERVED_BLOCKS.min(g.blocks)).find_map(|block| {
        nand.read_data(g.first_page(block), &mut page).ok()?;
        Superblock::decode(&page).ok().map(|sb| sb.g)
    })
}

/// Erase blocks read from the chip's end, at most, to find its last good blocks.
const FAR_SCAN: u32 = 64;

impl<N: Nand> PageStore<N> {
    /// Reads the superblock from the first good copy (module doc) and assembles the store,
    /// with nothing known yet about its segments. Notes which copies are damaged and which
    /// was used.
    pub(crate) fn with_superblock(mut nand: N, header: HeaderCopy) -> Result<PageStore<N>, FsError> {
        let g = nand.geometry();
        let mut why = FsError::Format(FormatError::NotAFs {
            why: "no readable superblock: none in reserved blocks 0 and 1, at the chip's end, in an anchor, \
                  or in the first page of any segment"
                .into(),
        });
        let mut found = None;
        let reserved = (0..RESERVED_BLOCKS.min(g.blocks)).map(|b| (b, SuperblockCopy::Reserved { block: b }));
        let far: Vec<_> =
            chip_end(&nand)?.into_iter().map(|b| (b, SuperblockCopy::Far { block: b })).collect();
        for (block, source) in reserved.chain(far) {
            if nand.is_bad(block)? {
                continue;
            }
            match read_copy(&mut nand, g.first_page(block)) {
                Ok(copy) if copy.0.g == g => {
                    found = Some((copy, source));
                    break;
                }
                Ok(_) => {
                    why = FsError::Format(FormatError::NotAFs {
                        why: "superblock geometry differs from the chip's".into(),
                    })
                }
                // A version this build does not read says more than "unreadable".
                Err(e @ FsError::Format(FormatError::Version { .. })) => why = e,
                Err(_) => {}
            }
        }
        if found.is_none() {
            found = from_anchors(&mut nand)?;
        }
        if found.is_none() {
            found = from_segment_headers(&mut nand, header)?;
        }
        let Some(((sb, version), source)) = found else { return Err(why) };
        let layout = Layout::keeping(g, sb.cfg, u32::from(sb.far_reserved))?;
        let mut store = PageStore::assemble(nand, layout, sb.fs_id)?;
        store.compression = sb.compression;
        store.sb_version = version;
        store.sb_from = Some(source);
        store.check_superblocks()?;
        Ok(store)
    }

    /// This file system's superblock, as every copy carries it.
    pub(crate) fn superblock(&self) -> Superblock {
        let (g, cfg) = (self.layout.g, self.layout.cfg);
        let far_reserved = self.layout.far_reserved as u8;
        Superblock { g, cfg, fs_id: self.fs_id, compression: self.compression, far_reserved }
    }

    /// The superblock's bytes, for the copy the file system puts in each segment's first
    /// page (of the version the image is at).
    pub(crate) fn superblock_bytes(&self) -> [u8; crate::store::layout::SUPERBLOCK_LEN] {
        let mut b = [0u8; crate::store::layout::SUPERBLOCK_LEN];
        self.superblock().encode_as(self.sb_version, &mut b);
        b
    }

    /// Where the mounted superblock was read (`None` for a file system just formatted).
    pub fn superblock_source(&self) -> Option<SuperblockCopy> {
        self.sb_from
    }

    /// The erase blocks that hold the far copies: the last good ones after the last segment.
    pub(crate) fn far_blocks(&self) -> Result<Vec<u32>, FsError> {
        let mut far = Vec::new();
        for b in (self.layout.far_start()..self.layout.g.blocks).rev() {
            if far.len() as u32 == FAR_BLOCKS {
                break;
            }
            if !self.nand.is_bad(b)? {
                far.push(b);
            }
        }
        Ok(far)
    }

    /// Blocks (reserved or far) whose superblock copy is damaged (as of the mount or the
    /// last [`check_superblocks`](Self::check_superblocks)).
    pub fn damaged_superblocks(&self) -> &[u32] {
        &self.sb_damaged
    }

    /// Reads every copy in page 0 of a reserved or far block again (mount, scrub); returns
    /// the blocks whose copy is not this superblock at this version (erased, zeroed, random,
    /// another file system's, or one left by the version before an upgrade).
    pub fn check_superblocks(&mut self) -> Result<&[u32], FsError> {
        let want = (self.superblock(), self.sb_version);
        let mut damaged = Vec::new();
        let mut blocks: Vec<u32> = (0..RESERVED_BLOCKS).collect();
        blocks.extend(self.far_blocks()?);
        for b in blocks {
            if self.nand.is_bad(b)? {
                continue;
            }
            if read_copy(&mut self.nand, self.layout.g.first_page(b)).ok() != Some(want) {
                damaged.push(b);
            }
        }
        self.sb_damaged = damaged;
        Ok(&self.sb_damaged)
    }

    /// Rewrites every damaged copy from the good superblock. A far copy is erased and
    /// written again. A reserved one gets the anchor log moved into its block (erased, given
    /// the superblock, then the anchor of checkpoint `page`): a cut at any point leaves a
    /// superblock to mount from (the other reserved block, the far copies, the newest
    /// anchor's). Returns how many were rewritten; a reserved copy whose log has no anchor
    /// with a copy (written before version 6), or whose partner block is bad, stays damaged.
    pub fn rewrite_superblocks(&mut self, page: PageAddr) -> Result<u32, FsError> {
        let mut rewritten = 0;
        for block in self.sb_damaged.clone() {
            let done = if block < RESERVED_BLOCKS {
                self.rewrite_reserved(block, page)?
            } else {
                self.write_far_copy(block)?
            };
            rewritten += u32::from(done);
        }
        self.check_superblocks()?;
        Ok(rewritten)
    }

    fn rewrite_reserved(&mut self, block: u32, page: PageAddr) -> Result<bool, FsError> {
        let other = (block + 1) % RESERVED_BLOCKS;
        if self.nand.is_bad(other)? {
            return Ok(false);
        }
        if self.w.anchor.map(|a| a.0) == Some(block) {
            // The log is in the damaged block: it moves out first, which erases the good
            // copy; the newest anchor here must carry the superblock meanwhile.
            if !self.newest_anchor_carries_superblock()? {
                return Ok(false);
            }
            self.wrap_anchor_log(page)?;
        }
        self.wrap_anchor_log(page)?;
        Ok(true)
    }

    fn newest_anchor_carries_superblock(&mut self) -> Result<bool, FsError> {
        let Some((block, next)) = self.w.anchor.filter(|a| a.1 > 1) else { return Ok(false) };
        let g = self.layout.g;
        let (mut page, mut spare) = (vec![0u8; g.page_size as usize], vec![0u8; g.spare_size as usize]);
        self.nand.read_page(g.first_page(block) + next - 1, &mut page, &mut spare)?;
        Ok(Anchor::superblock_in(&page).is_some_and(|(_, sb)| sb == self.superblock()))
    }

    /// Writes the superblock into page 0 of far block `block`, erased first unless `erased`
    /// (mkfs erased it). Returns whether the copy was written; a block that fails its erase
    /// or program keeps no copy (the other far block, and the reserved ones, still do).
    pub(crate) fn write_far_copy(&mut self, block: u32) -> Result<bool, FsError> {
        match self.nand.erase(block) {
            Ok(()) => {}
            Err(NandError::EraseFailed { .. }) => {
                self.stats.erase_failures += 1;
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
        self.program_superblock(block)
    }

    /// Programs the superblock into page 0 of `block` (erased); whether it took.
    pub(crate) fn program_superblock(&mut self, block: u32) -> Result<bool, FsError> {
        let g = self.layout.g;
        let mut sb = vec![0u8; g.page_size as usize];
        self.superblock().encode_as(self.sb_version, &mut sb);
        let at = g.first_page(block);
        let spare = self.spare_for(Kind::Superblock, 0, 0, 0, &sb, at);
        match self.nand.program(at, &sb, &spare) {
            Ok(()) => Ok(true),
            Err(NandError::ProgramFailed { .. }) => {
                self.stats.program_failures += 1;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The superblock in page 0 of a block, with its version.
fn read_copy<N: Nand>(nand: &mut N, page: u32) -> Result<Found, FsError> {
    let g = nand.geometry();
    let (mut data, mut spare) = (vec![0u8; g.page_size as usize], vec![0u8; g.spare_size as usize]);
    nand.read_page(page, &mut data, &mut spare)?;
    Ok((Superblock::decode(&data)?, superblock_version(&data)))
}

/// The last good erase blocks of the chip, where a far copy may be, before the superblock
/// says where the segments end: a page there that is not a copy fails its magic and CRC.
fn chip_end<N: Nand>(nand: &N) -> Result<Vec<u32>, FsError> {
    let g = nand.geometry();
    let mut blocks = Vec::new();
    let lowest = g.blocks.saturating_sub(FAR_SCAN).max(RESERVED_BLOCKS);
    for b in (lowest..g.blocks).rev() {
        if blocks.len() as u32 == FAR_BLOCKS {
            break;
        }
        if !nand.is_bad(b)? {
            blocks.push(b);
        }
    }
    Ok(blocks)
}

/// The superblock as the newest anchor carrying a copy has it (version 6).
fn from_anchors<N: Nand>(nand: &mut N) -> Result<Option<(Found, SuperblockCopy)>, FsError> {
    let g = nand.geometry();
    let mut page = vec![0u8; g.page_size as usize];
    let mut spare = vec![0u8; g.spare_size as usize];
    let mut newest: Option<(u64, Found, SuperblockCopy)> = None;
    for b in 0..RESERVED_BLOCKS.min(g.blocks) {
        if nand.is_bad(b)? {
            continue;
        }
        for i in 1..g.pages_per_block {
            let at = g.first_page(b) + i;
            nand.read_page(at, &mut page, &mut spare)?;
            if let Some((a, sb)) = Anchor::superblock_in(&page).filter(|(_, sb)| sb.g == g) {
                if newest.as_ref().is_none_or(|n| a.seq > n.0) {
                    let version = superblock_version(anchor_superblock(&page));
                    newest = Some((a.seq, (sb, version), SuperblockCopy::Anchor { page: at }));
                }
            }
        }
    }
    Ok(newest.map(|(_, found, source)| (found, source)))
}

/// The superblock the newest segment's first page carries (version 9): read from the first
/// written page of every erase block, the one with the highest sequence number wins.
fn from_segment_headers<N: Nand>(
    nand: &mut N,
    header: HeaderCopy,
) -> Result<Option<(Found, SuperblockCopy)>, FsError> {
    let g = nand.geometry();
    let mut page = vec![0u8; g.page_size as usize];
    let mut spare = vec![0u8; g.spare_size as usize];
    let mut newest: Option<(u64, Found, SuperblockCopy)> = None;
    for b in RESERVED_BLOCKS..g.blocks {
        if nand.is_bad(b)? {
            continue;
        }
        // The first page whose spare decodes: a torn first page moved the header to the next.
        for i in 0..g.pages_per_block.min(4) {
            let at = g.first_page(b) + i;
            nand.read_page(at, &mut page, &mut spare)?;
            let Some(s) = Spare::decode(&spare, at) else { continue };
            let copy = (s.kind == Kind::Data).then(|| header(&page)).flatten();
            if let Some(sb) = copy.and_then(|c| Some((Superblock::decode(c).ok()?, superblock_version(c)))) {
                if sb.0.g == g && newest.as_ref().is_none_or(|n| s.seq > n.0) {
                    newest = Some((s.seq, sb, SuperblockCopy::SegmentHeader { page: at }));
                }
            }
            break;
        }
    }
    Ok(newest.map(|(_, found, source)| (found, source)))
}
