//! The cheap scrub pass (PRIMS, and RCFFS section 3.3): the signature and the erasure code are
//! linear over the same field, so a parity page's signature must be the code's combination
//! of its data pages' signatures. Checked from the spares alone, it reads no data area, and
//! it catches parity that disagrees with the data it should protect, which a page-by-page
//! check against each page's own signature cannot see when both were written consistently
//! wrong (a misdirected or stale parity program).

use bitmend_code::sig::Sig64;
use bitmend_media::nand::Nand;

use super::layout::{Kind, Spare};
use super::PageStore;
use crate::FsError;

/// What the signature check of one segment found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SigCheck {
    /// Spare areas read (no data area is read).
    pub spares_read: u64,
    /// Groups whose parity pages' signatures were compared, and those that disagreed.
    pub groups_checked: u64,
    pub groups_mismatched: u64,
    /// Stripes across the data blocks (page i of each) whose segment parity pages'
    /// signatures were compared, and those that disagreed.
    pub stripes_checked: u64,
    pub stripes_mismatched: u64,
    /// Groups and stripes left unchecked because a page in them has a spare that does not
    /// decode (torn, or damaged: the full pass reads those pages).
    pub unverifiable: u64,
}

impl SigCheck {
    /// Whether any parity disagreed with its data.
    pub fn mismatched(&self) -> bool {
        self.groups_mismatched + self.stripes_mismatched > 0
    }

    pub(crate) fn absorb(&mut self, o: SigCheck) {
        self.spares_read += o.spares_read;
        self.groups_checked += o.groups_checked;
        self.groups_mismatched += o.groups_mismatched;
        self.stripes_checked += o.stripes_checked;
        self.stripes_mismatched += o.stripes_mismatched;
        self.unverifiable += o.unverifiable;
    }
}

/// A block's pages as their spares say: `None` for a bad block, else one entry per page,
/// `None` where the spare does not decode (or the page is unwritten).
type BlockSpares = Option<Vec<Option<Spare>>>;

impl<N: Nand> PageStore<N> {
    /// Checks physical segment `phys`'s group parity and (once sealed) segment parity
    /// against its data pages, from their signatures alone.
    pub fn check_signatures(&mut self, phys: u32) -> Result<SigCheck, FsError> {
        let mut c = SigCheck::default();
        let blocks = self.read_block_spares(phys, &mut c)?;
        let data_blocks = self.layout.data_blocks() as usize;
        for spares in blocks[..data_blocks].iter().flatten() {
            self.check_groups(spares, &mut c);
        }
        self.check_stripes(&blocks, &mut c);
        Ok(c)
    }

    /// Every spare of the segment, block by block.
    fn read_block_spares(&mut self, phys: u32, c: &mut SigCheck) -> Result<Vec<BlockSpares>, FsError> {
        let g = self.layout.g;
        let mut raw = vec![0u8; g.spare_size as usize];
        let mut out = Vec::new();
        for b in 0..self.layout.cfg.blocks_per_segment {
            let block = self.layout.block(phys, b);
            if self.nand.is_bad(block)? {
                out.push(None);
                continue;
            }
            let mut pages = Vec::with_capacity(g.pages_per_block as usize);
            for i in 0..g.pages_per_block {
                let page = g.first_page(block) + i;
                self.nand.read_spare(page, &mut raw)?;
                c.spares_read += 1;
                pages.push(Spare::decode(&raw, page));
            }
            out.push(Some(pages));
        }
        Ok(out)
    }

    /// Each group parity page against the group's data pages (a group is `group_len` data
    /// pages from `group_first`, its parity the shortened code's first `group_len` columns).
    fn check_groups(&self, spares: &[Option<Spare>], c: &mut SigCheck) {
        for parity in spares.iter().flatten().filter(|s| s.kind == Kind::GroupParity) {
            let (first, len) = (parity.group_first as usize, parity.group_len as usize);
            let data: Option<Vec<Sig64>> = spares.get(first..first + len).and_then(|g| {
                g.iter().map(|s| s.as_ref().filter(|s| s.kind == Kind::Data).map(|s| s.sig)).collect()
            });
            let Some(data) = data else {
                c.unverifiable += 1;
                continue;
            };
            let row = self.group_code.parity_row(parity.index as usize);
            c.groups_checked += 1;
            if Sig64::combine(&row[..len], &data) != parity.sig {
                c.groups_mismatched += 1;
            }
        }
    }

    /// Each segment parity page (page i of parity block t) against page i of every good data
    /// block: the segment parity covers every page the data blocks hold (data, group parity,
    /// pad), bad blocks counting as zero. Only a sealed segment has it.
    fn check_stripes(&self, blocks: &[BlockSpares], c: &mut SigCheck) {
        let data_blocks = self.layout.data_blocks() as usize;
        let (data, parity) = blocks.split_at(data_blocks);
        for (t, pblock) in parity.iter().enumerate() {
            let Some(pspares) = pblock else { continue };
            let row = self.seg_code.parity_row(t);
            for (i, ps) in pspares.iter().enumerate() {
                let Some(ps) = ps.as_ref().filter(|s| s.kind == Kind::SegmentParity) else { continue };
                let mut coeffs = Vec::with_capacity(data_blocks);
                let mut sigs = Vec::with_capacity(data_blocks);
                let mut whole = true;
                for (b, block) in data.iter().enumerate() {
                    let Some(pages) = block else { continue };
                    match &pages[i] {
                        Some(s) => {
                            coeffs.push(row[b]);
                            sigs.push(s.sig);
                        }
                        None => whole = false,
                    }
                }
                if !whole {
                    c.unverifiable += 1;
                    continue;
                }
                c.stripes_checked += 1;
                if Sig64::combine(&coeffs, &sigs) != ps.sig {
                    c.stripes_mismatched += 1;
                }
            }
        }
    }
}
