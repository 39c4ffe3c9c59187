//! The page store: RCFFS's segments of erase blocks, written as a log of pages, each page
//! signed in its spare area, each group of pages in a block followed by its parity pages,
//! each sealed segment followed by its parity blocks. Reads verify every page against its
//! signature and rebuild a bad one from its group's parity, else from its segment's.
//!
//! A group is normally a whole block: `max_group` data pages then p parity pages. `sync`
//! closes the open group early (interim parity): synced pages are correctable at once, at the
//! cost of p pages per sync. Group parity uses the code of the largest group, shortened (the
//! missing data pages count as zero), so the parity of a group can be accumulated page by page
//! before its length is known; segment parity likewise treats bad blocks as zero.

use bitmend_code::rs::Codec;
use bitmend_code::sig::Signer;
use bitmend_media::nand::{Nand, NandError};

mod chain;
pub(crate) mod layout;
pub(crate) mod mount;
mod read;
mod sigcheck;
pub(crate) mod superblock;

use crate::FsError;
pub use sigcheck::SigCheck;

use crate::{FormatError, PosixError};
use layout::{FsConfig, Kind, Layout, Spare, RESERVED_BLOCKS};

/// A segment in use: its logical number (how many segments were opened before it: the log's
/// order) and the physical segment it occupies on the chip. Named fields, not a tuple: the two
/// numbers are easy to swap and both look like a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Segment {
    pub logical: u64,
    pub physical: u32,
}

/// A page on the chip, as the store hands it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageAddr(pub u32);

/// How a read got its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repaired {
    /// The page matched its signature.
    No,
    /// Rebuilt from its group's parity pages.
    ByGroup,
    /// Rebuilt from its segment's parity blocks.
    BySegment,
    /// Nothing on the chip says what the page is (its spare is gone, and no group or sealed
    /// stripe rebuilds it): its bytes as they read, for a caller that knows from its own
    /// records that data is there and checks every byte (see `read_claimed`).
    Unsigned,
}

/// Counters since the store was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub data_pages: u64,
    pub group_parity_pages: u64,
    pub segment_parity_pages: u64,
    pub pad_pages: u64,
    pub syncs: u64,
    pub repaired_by_group: u64,
    pub repaired_by_segment: u64,
    pub unrecoverable: u64,
    pub program_failures: u64,
    pub erase_failures: u64,
    /// Blocks marked bad by the store: those whose erase failed, and those that failed a
    /// program, when their segment was released.
    pub blocks_retired: u64,
}

/// Where the next page goes, and the parity being accumulated for it.
pub(crate) struct Writer {
    /// The segment being written; `None` before the first.
    pub(crate) seg: Option<Segment>,
    /// Block within the segment (data blocks only).
    pub(crate) block: u32,
    /// Next page index within the block.
    pub(crate) next: u32,
    pub(crate) group_first: u32,
    pub(crate) group_len: u32,
    /// p parity pages of the open group.
    pub(crate) group_parity: Vec<u8>,
    /// s parity blocks of the segment: [t][page index][byte].
    pub(crate) seg_parity: Vec<u8>,
    /// False when the segment parity must be recomputed from the chip before sealing.
    pub(crate) seg_parity_valid: bool,
    pub(crate) seq: u64,
    /// Physical segments free for writing, in order of use.
    pub(crate) free: std::collections::VecDeque<u32>,
    /// The segment's parity blocks are written: the next page opens a new segment.
    pub(crate) sealed: bool,
    /// Segments holding pages, oldest first.
    pub(crate) used: Vec<Segment>,
    /// Pages programmed in the current segment.
    pub(crate) seg_pages: u32,
    /// The newest marked data page in the live segment.
    pub(crate) last_marked: Option<PageAddr>,
    /// Blocks that failed a program since mount: retired (marked bad) when their segment is
    /// released.
    pub(crate) failing: std::collections::BTreeSet<u32>,
    /// The successor queue of the segment being written, in every spare of it: the next
    /// segment opened is the first of these still free (docs/DESIGN.md, "mount").
    pub(crate) queue: Vec<u32>,
    /// The queue of the newest segment that got a page: where to go when the segment being
    /// written got none (every data block bad), since its own queue is on no page.
    pub(crate) prev_queue: Vec<u32>,
    /// The anchor log's write position: (reserved block, next page), and anchors written.
    pub(crate) anchor: Option<(u32, u32)>,
    pub(crate) anchor_seq: u64,
    /// The newest anchor names a checkpoint (rather than saying "scan").
    pub(crate) anchor_chained: bool,
    /// Set while an anchored mount waits for the checkpoint's table: a segment that fills
    /// is sealed, and the next one opened by the next append, once the free ones are known.
    pub(crate) defer_open: bool,
}

/// The page store on a NAND chip.
pub struct PageStore<N: Nand> {
    pub(crate) nand: N,
    pub(crate) layout: Layout,
    pub(crate) fs_id: u64,
    pub(crate) signer: Signer<4>,
    pub(crate) group_code: Codec,
    pub(crate) seg_code: Codec,
    pub(crate) w: Writer,
    pub(crate) stats: StoreStats,
    /// The superblock's compression byte.
    pub(crate) compression: u8,
    /// The version the superblock read at mount was written by (this build's for a new one).
    pub(crate) sb_version: u32,
    /// Reserved blocks (good ones) whose page 0 is not a good copy of the superblock: found
    /// at mount and by scrub, rewritten by [`rewrite_superblocks`](Self::rewrite_superblocks).
    pub(crate) sb_damaged: Vec<u32>,
    /// Where the mounted superblock was read (`None` after a format).
    pub(crate) sb_from: Option<superblock::SuperblockCopy>,
    /// Bytes of flash pages in the good data blocks of every segment (what the space budget
    /// starts from; it shrinks as blocks are retired).
    good_data_bytes: u64,
}

impl<N: Nand> std::fmt::Debug for PageStore<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageStore")
            .field("layout", &self.layout)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<N: Nand> PageStore<N> {
    pub(crate) fn assemble(nand: N, layout: Layout, fs_id: u64) -> Result<PageStore<N>, FsError> {
        let ps = layout.g.page_size as usize;
        let mut good_blocks = 0u64;
        for seg in 0..layout.segments {
            for b in 0..layout.data_blocks() {
                good_blocks += u64::from(!nand.is_bad(layout.block(seg, b))?);
            }
        }
        let good_data_bytes = good_blocks * (layout.max_group() as u64 * ps as u64);
        let code = |k: u32, m: u32| {
            Codec::new(k as usize, m as usize)
                .map_err(|e| FsError::Format(FormatError::Config { why: e.to_string() }))
        };
        Ok(PageStore {
            group_code: code(layout.max_group(), layout.cfg.parity_pages)?,
            seg_code: code(layout.data_blocks(), layout.cfg.parity_blocks)?,
            w: Writer {
                seg: None,
                block: 0,
                next: 0,
                group_first: 0,
                group_len: 0,
                group_parity: vec![0; layout.cfg.parity_pages as usize * ps],
                seg_parity: vec![0; (layout.cfg.parity_blocks * layout.g.pages_per_block) as usize * ps],
                seg_parity_valid: true,
                seq: 0,
                free: (0..layout.segments).collect(),
                sealed: false,
                used: Vec::new(),
                seg_pages: 0,
                last_marked: None,
                failing: Default::default(),
                queue: Vec::new(),
                prev_queue: Vec::new(),
                anchor: None,
                anchor_seq: 0,
                anchor_chained: false,
                defer_open: false,
            },
            nand,
            layout,
            fs_id,
            signer: Signer::new(),
            stats: StoreStats::default(),
            compression: 0,
            sb_version: layout::FS_VERSION,
            sb_damaged: Vec::new(),
            sb_from: None,
            good_data_bytes,
        })
    }

    /// Formats the chip: erases every good block and writes the superblock twice.
    pub fn format(nand: N, cfg: FsConfig) -> Result<PageStore<N>, FsError> {
        Self::format_recording(nand, cfg, 0)
    }

    /// Formats, recording `compression` (the superblock's byte 48) for the file system.
    pub(crate) fn format_recording(
        mut nand: N,
        cfg: FsConfig,
        compression: u8,
    ) -> Result<PageStore<N>, FsError> {
        let g = nand.geometry();
        let layout = Layout::new(g, cfg)?;
        let fs_id = {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            bitmend_media::rng::Rng::new(t.as_nanos() as u64).next_u64()
        };
        for b in 0..g.blocks {
            if !nand.is_bad(b)? {
                match nand.erase(b) {
                    Ok(()) | Err(NandError::EraseFailed { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let mut store = PageStore::assemble(nand, layout, fs_id)?;
        store.compression = compression;
        let mut written = 0;
        for b in 0..RESERVED_BLOCKS {
            if !store.nand.is_bad(b)? && store.program_superblock(b)? {
                written += 1;
                // The anchor log starts after the first superblock written.
                store.w.anchor = store.w.anchor.or(Some((b, 1)));
            }
        }
        if written == 0 {
            return Err(FormatError::Config { why: "both superblock blocks are bad".into() }.into());
        }
        for b in store.far_blocks()? {
            store.program_superblock(b)?;
        }
        store.nand.sync()?;
        Ok(store)
    }

    /// The identity written at format (segment summaries of later layers carry it).
    pub fn fs_id(&self) -> u64 {
        self.fs_id
    }

    pub fn layout_config(&self) -> FsConfig {
        self.layout.cfg
    }

    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    pub fn nand(&self) -> &N {
        &self.nand
    }

    pub fn nand_mut(&mut self) -> &mut N {
        &mut self.nand
    }

    pub fn into_nand(self) -> N {
        self.nand
    }

    fn ps(&self) -> usize {
        self.layout.g.page_size as usize
    }

    pub(crate) fn spare_for(
        &mut self,
        kind: Kind,
        index: u8,
        group_first: u32,
        group_len: u32,
        data: &[u8],
        at: u32,
    ) -> Vec<u8> {
        let segment = self.w.seg.map_or(0, |s| s.logical);
        let spare = Spare {
            kind,
            index,
            group_first: group_first as u8,
            group_len: group_len as u8,
            seq: self.w.seq,
            segment,
            sig: self.signer.sign(data),
            queue: std::array::from_fn(|i| self.w.queue.get(i).copied()),
        };
        let mut b = vec![0u8; self.layout.g.spare_size as usize];
        // Bound to its address once the superblock says version 6: an older build, which
        // could not read a bound spare, refuses the image first.
        spare.encode(&mut b, (self.sb_version >= 6).then_some(at));
        b
    }

    /// The chip page the next `program_here` programs.
    fn here(&self) -> u32 {
        let phys = self.w.seg.expect("segment open").physical;
        self.layout.page(phys, self.w.block, self.w.next)
    }

    /// Opens the next segment: the first of the successor queue still free, which mount will
    /// find by following the queue. Only when none is left (the file system was full when
    /// the queue was chosen) is the chain broken: the anchor log then says "scan", first.
    fn open_segment(&mut self) -> Result<(), FsError> {
        let (logical, choices) = match self.w.seg {
            // Not a page went into it (every data block bad): it is dropped, not freed, and
            // its number goes to the next, chosen from the same queue.
            Some(Segment { logical, physical: phys }) if self.w.seg_pages == 0 => {
                self.w.used.retain(|u| u.physical != phys);
                (logical, self.w.prev_queue.clone())
            }
            Some(Segment { logical, .. }) => {
                self.w.prev_queue = self.w.queue.clone();
                (logical.saturating_add(1), self.w.queue.clone())
            }
            None => (0, self.w.queue.clone()),
        };
        let phys = match choices.iter().find(|q| self.w.free.contains(q)) {
            Some(&q) => q,
            None => {
                let Some(&(_, q)) = self.least_worn_free(1)?.first() else { return Err(FsError::NoSpace) };
                if self.w.anchor_chained && self.w.seg.is_some() {
                    self.write_anchor(None)?;
                }
                q
            }
        };
        self.w.free.retain(|&f| f != phys);
        // Wear leveling: the successors are the least worn of the free segments.
        let k = layout::queue_len(self.layout.g.spare_size as usize);
        self.w.queue = self.least_worn_free(k)?.into_iter().map(|q| q.1).collect();
        self.w.seg = Some(Segment { logical, physical: phys });
        self.w.used.push(Segment { logical, physical: phys });
        self.w.block = 0;
        self.w.next = 0;
        self.w.group_first = 0;
        self.w.group_len = 0;
        self.w.group_parity.fill(0);
        self.w.seg_parity.fill(0);
        self.w.seg_parity_valid = true;
        self.w.sealed = false;
        self.w.seg_pages = 0;
        self.w.last_marked = None;
        self.start_block()
    }

    /// The `k` free segments whose blocks were erased least, as (wear, physical), least worn
    /// first; segments with no good data block are never chosen.
    fn least_worn_free(&self, k: usize) -> Result<Vec<(u64, u32)>, FsError> {
        let mut wear = Vec::with_capacity(self.w.free.len());
        for &phys in &self.w.free {
            let mut sum = 0u64;
            let mut good = false;
            for b in 0..self.layout.cfg.blocks_per_segment {
                let block = self.layout.block(phys, b);
                sum += self.nand.erase_count(block)? as u64;
                good |= b < self.layout.data_blocks() && !self.nand.is_bad(block)?;
            }
            if good {
                wear.push((sum, phys));
            }
        }
        wear.sort_unstable();
        wear.truncate(k);
        Ok(wear)
    }

    /// Erases the current block before its first page; skips blocks that are or turn bad.
    pub(crate) fn start_block(&mut self) -> Result<(), FsError> {
        loop {
            let phys = self.w.seg.expect("segment open").physical;
            if self.w.block == self.layout.data_blocks() {
                if !self.w.sealed && self.w.seg_pages > 0 {
                    self.reseal()?;
                }
                if self.w.defer_open {
                    // Mounting, free segments not known yet: the next append opens it.
                    return Ok(());
                }
                return self.open_segment();
            }
            let block = self.layout.block(phys, self.w.block);
            if !self.nand.is_bad(block)? && self.erase_block(block)? {
                return Ok(());
            }
            self.w.block += 1;
        }
    }

    /// Programs one page at the write position; returns the bytes the chip now holds there
    /// (what was asked, or what a failed program left).
    fn program_here(&mut self, data: &[u8], spare: &[u8]) -> Result<(u32, bool), FsError> {
        let page = self.here();
        let ok = match self.nand.program(page, data, spare) {
            Ok(()) => true,
            Err(e) if self.program_refused(&e, page)? => {
                // Its pages stay readable (the parity covers what it holds) until the
                // cleaner releases the segment, which then retires it.
                self.w.failing.insert(self.layout.g.block_of(page));
                false
            }
            Err(e) => return Err(e.into()),
        };
        self.w.seq += 1;
        self.w.seg_pages += 1;
        // The segment parity covers what the chip holds, whatever that is.
        let stripe_index = self.w.next as usize;
        let block = self.w.block as usize;
        if self.layout.cfg.parity_blocks > 0 && self.w.seg_parity_valid {
            if ok {
                self.accumulate_segment(block, stripe_index, data);
            } else {
                let mut held = vec![0u8; self.ps()];
                self.nand.read_data(page, &mut held)?;
                self.accumulate_segment(block, stripe_index, &held);
            }
        }
        self.w.next += 1;
        Ok((page, ok))
    }

    /// Whether a program of `page` that returned `e` failed as the medium may (counted; the
    /// caller goes on at the next page): the chip said the program failed, or refused the
    /// page as already programmed while it reads erased. The writer took it for unwritten
    /// because it reads so: a page damaged to read erased (cells that lost their charge)
    /// after it was programmed, at the end of what a mount found written. Any other refusal
    /// is an error of the writer's and is returned.
    pub(crate) fn program_refused(&mut self, e: &NandError, page: u32) -> Result<bool, FsError> {
        let refused = match e {
            NandError::ProgramFailed { .. } => true,
            NandError::NotProgrammable { .. } => {
                let mut spare = vec![0u8; self.layout.g.spare_size as usize];
                self.nand.read_spare(page, &mut spare)?;
                layout::erased(&spare) && self.unwritten(page)?
            }
            _ => false,
        };
        self.stats.program_failures += refused as u64;
        Ok(refused)
    }

    fn accumulate_segment(&mut self, block: usize, index: usize, data: &[u8]) {
        let ps = self.ps();
        let ppb = self.layout.g.pages_per_block as usize;
        let engine = self.seg_code.engine();
        for t in 0..self.layout.cfg.parity_blocks as usize {
            let coef = self.seg_code.parity_row(t)[block];
            let at = (t * ppb + index) * ps;
            engine.mul_acc(coef, data, &mut self.w.seg_parity[at..at + ps]);
        }
    }

    /// Appends one page of data; returns where it went. Not correctable until the next
    /// [`sync`](Self::sync) or until its block fills; always detectable.
    pub fn append(&mut self, data: &[u8]) -> Result<PageAddr, FsError> {
        self.append_with(data, 0)
    }

    /// Appends a page whose spare carries `mark` in its index byte (1: a checkpoint starts
    /// here), so that mount can find it from the spares alone.
    pub fn append_marked(&mut self, data: &[u8]) -> Result<PageAddr, FsError> {
        self.append_with(data, 1)
    }

    fn append_with(&mut self, data: &[u8], mark: u8) -> Result<PageAddr, FsError> {
        let ps = self.ps();
        if data.len() != ps {
            return Err(
                FormatError::Config { why: format!("a page is {ps} bytes, got {}", data.len()) }.into()
            );
        }
        if self.w.seg.is_none() {
            self.open_segment()?;
        } else if self.w.block == self.layout.data_blocks() {
            // Mounted on a full segment: seal it if needed, open the next.
            self.start_block()?;
        }
        let p = self.layout.cfg.parity_pages;
        let ppb = self.layout.g.pages_per_block;
        loop {
            // Room for this page and the group's parity pages after it?
            if self.w.next + 1 + p <= ppb {
                break;
            }
            self.close_group()?;
            self.finish_block()?;
        }
        if self.w.group_len == 0 {
            self.w.group_first = self.w.next;
        }
        let spare = self.spare_for(Kind::Data, mark, self.w.group_first, 0, data, self.here());
        let (page, ok) = self.program_here(data, &spare)?;
        if !ok {
            // The failed page is not part of any group: close the group before it, retry after.
            self.close_group()?;
            return self.append_with(data, mark);
        }
        if mark == 1 {
            self.w.last_marked = Some(PageAddr(page));
        }
        let col = (self.w.next - 1 - self.w.group_first) as usize;
        let engine = self.group_code.engine();
        for j in 0..p as usize {
            let coef = self.group_code.parity_row(j)[col];
            engine.mul_acc(coef, data, &mut self.w.group_parity[j * ps..(j + 1) * ps]);
        }
        self.w.group_len += 1;
        self.stats.data_pages += 1;
        Ok(PageAddr(page))
    }

    /// Writes the open group's parity pages (if the group has data).
    pub(crate) fn close_group(&mut self) -> Result<(), FsError> {
        if self.w.group_len == 0 {
            return Ok(());
        }
        let ps = self.ps();
        for j in 0..self.layout.cfg.parity_pages {
            let parity = self.w.group_parity[j as usize * ps..(j as usize + 1) * ps].to_vec();
            let (first, len, at) = (self.w.group_first, self.w.group_len, self.here());
            let spare = self.spare_for(Kind::GroupParity, j as u8, first, len, &parity, at);
            // A parity page that fails to program leaves the group short of one parity page:
            // still detectable, and correctable by the rest (and the segment parity).
            self.program_here(&parity, &spare)?;
            self.stats.group_parity_pages += 1;
        }
        self.w.group_len = 0;
        self.w.group_parity.fill(0);
        Ok(())
    }

    /// Pads the rest of the block and moves to the next one (sealing the segment after its
    /// last data block).
    pub(crate) fn finish_block(&mut self) -> Result<(), FsError> {
        self.pad_rest_of_block()?;
        self.w.block += 1;
        self.w.next = 0;
        self.start_block()
    }

    /// Closes the open group with its parity pages and makes everything written durable:
    /// every page appended so far is then correctable, not only detectable.
    pub fn sync(&mut self) -> Result<(), FsError> {
        if self.w.seg.is_some() {
            self.close_group()?;
            let p = self.layout.cfg.parity_pages;
            if self.w.next + 1 + p > self.layout.g.pages_per_block {
                self.finish_block()?;
            }
        }
        self.nand.sync()?;
        self.stats.syncs += 1;
        Ok(())
    }

    /// Writes the full segment's parity blocks.
    pub(crate) fn reseal(&mut self) -> Result<(), FsError> {
        let phys = self.w.seg.expect("segment open").physical;
        let s = self.layout.cfg.parity_blocks;
        if s > 0 {
            if !self.w.seg_parity_valid {
                self.recompute_segment_parity(phys)?;
            }
            let ps = self.ps();
            let ppb = self.layout.g.pages_per_block;
            for t in 0..s {
                let block = self.layout.block(phys, self.layout.data_blocks() + t);
                if self.nand.is_bad(block)? {
                    continue;
                }
                if !self.erase_block(block)? {
                    continue;
                }
                for i in 0..ppb {
                    let at = ((t * ppb + i) as usize) * ps;
                    let data = self.w.seg_parity[at..at + ps].to_vec();
                    let at = self.layout.g.first_page(block) + i;
                    let spare = self.spare_for(Kind::SegmentParity, t as u8, 0, 0, &data, at);
                    match self.nand.program(at, &data, &spare) {
                        Ok(()) => {}
                        Err(NandError::ProgramFailed { .. }) => {
                            self.stats.program_failures += 1;
                            self.w.failing.insert(block);
                        }
                        Err(e) => return Err(e.into()),
                    }
                    self.w.seq += 1;
                    self.stats.segment_parity_pages += 1;
                }
            }
        }
        self.w.sealed = true;
        Ok(())
    }

    /// Rebuilds the segment parity accumulators from what the chip holds (after a remount).
    fn recompute_segment_parity(&mut self, phys: u32) -> Result<(), FsError> {
        self.w.seg_parity.fill(0);
        self.w.seg_parity_valid = true;
        let mut buf = vec![0u8; self.ps()];
        for b in 0..self.layout.data_blocks() {
            let block = self.layout.block(phys, b);
            if self.nand.is_bad(block)? {
                continue;
            }
            for i in 0..self.layout.g.pages_per_block {
                self.nand.read_data(self.layout.g.first_page(block) + i, &mut buf)?;
                self.accumulate_segment(b as usize, i as usize, &buf.clone());
            }
        }
        Ok(())
    }
}

/// What the file system above needs to know and do about segments.
impl<N: Nand> PageStore<N> {
    /// Segments erased and ready for writing.
    pub fn free_segments(&self) -> usize {
        self.w.free.len()
    }

    /// Segments on the chip.
    pub fn segments(&self) -> u32 {
        self.layout.segments
    }

    /// Segments holding pages, oldest first.
    pub fn used_segments(&self) -> Vec<Segment> {
        self.w.used.clone()
    }

    /// The segment being written.
    pub fn live_segment(&self) -> Option<Segment> {
        self.w.seg
    }

    /// The most erases any block of physical segment `phys` has had.
    pub fn segment_wear(&self, phys: u32) -> Result<u32, FsError> {
        let mut most = 0;
        for b in 0..self.layout.cfg.blocks_per_segment {
            most = most.max(self.nand.erase_count(self.layout.block(phys, b))?);
        }
        Ok(most)
    }

    /// The physical segment holding `addr`.
    pub fn segment_of(&self, addr: PageAddr) -> Option<u32> {
        self.layout.locate(addr.0).map(|l| l.0)
    }

    /// Whether the next page appended will be the first of a new segment.
    pub fn next_page_opens_segment(&self) -> bool {
        let p = self.layout.cfg.parity_pages;
        match self.w.seg {
            None => true,
            Some(_) if self.w.block >= self.layout.data_blocks() || self.w.seg_pages == 0 => true,
            Some(_) => {
                self.w.next + 1 + p > self.layout.g.pages_per_block
                    && self.w.block + 1 >= self.layout.data_blocks()
            }
        }
    }

    /// Closes the open group, pads the current segment out and seals it: the next page
    /// opens a new segment.
    pub fn finish_segment(&mut self) -> Result<(), FsError> {
        let Some(Segment { physical: phys, .. }) = self.w.seg else { return Ok(()) };
        self.close_group()?;
        while self.w.seg.is_some_and(|s| s.physical == phys) && self.w.block < self.layout.data_blocks() {
            self.finish_block_without_advancing()?;
        }
        if !self.w.sealed {
            self.reseal()?;
        }
        Ok(())
    }

    /// Programs pad pages into the rest of the current block.
    fn pad_rest_of_block(&mut self) -> Result<(), FsError> {
        let pad = vec![0u8; self.ps()];
        while self.w.next < self.layout.g.pages_per_block {
            let spare = self.spare_for(Kind::Pad, 0, 0, 0, &pad, self.here());
            self.program_here(&pad, &spare)?;
            self.stats.pad_pages += 1;
        }
        Ok(())
    }

    fn finish_block_without_advancing(&mut self) -> Result<(), FsError> {
        if self.w.next > 0
            || !self.nand.is_bad(self.layout.block(self.w.seg.expect("open").physical, self.w.block))?
        {
            self.pad_rest_of_block()?;
        }
        self.w.block += 1;
        self.w.next = 0;
        if self.w.block < self.layout.data_blocks() {
            // Erase the next block before padding it (skipping bad ones).
            let phys = self.w.seg.expect("open").physical;
            loop {
                if self.w.block >= self.layout.data_blocks() {
                    break;
                }
                let block = self.layout.block(phys, self.w.block);
                if !self.nand.is_bad(block)? && self.erase_block(block)? {
                    break;
                }
                self.w.block += 1;
            }
        }
        Ok(())
    }

    /// Erases `block`; if the erase fails, marks it bad (the chip may not have) and returns
    /// false: every layer skips bad blocks from then on.
    pub(crate) fn erase_block(&mut self, block: u32) -> Result<bool, FsError> {
        match self.nand.erase(block) {
            Ok(()) => Ok(true),
            Err(NandError::EraseFailed { .. }) => {
                self.stats.erase_failures += 1;
                self.retire(block)?;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Marks `block` bad: no layer uses it again, and the space budget loses its pages.
    fn retire(&mut self, block: u32) -> Result<(), FsError> {
        self.nand.mark_bad(block)?;
        self.stats.blocks_retired += 1;
        let data_block = self
            .layout
            .locate(self.layout.g.first_page(block))
            .is_some_and(|(_, b, _)| b < self.layout.data_blocks());
        if data_block {
            let bytes = self.layout.max_group() as u64 * self.ps() as u64;
            self.good_data_bytes = self.good_data_bytes.saturating_sub(bytes);
        }
        Ok(())
    }

    /// Bytes of flash pages in the good data blocks of every segment.
    pub fn good_data_capacity(&self) -> u64 {
        self.good_data_bytes
    }

    /// Erases a segment the file system no longer needs and makes it free.
    pub fn release_segment(&mut self, phys: u32) -> Result<(), FsError> {
        if self.w.seg.is_some_and(|s| s.physical == phys) {
            return Err(
                PosixError::Invalid { why: "the segment being written cannot be released".into() }.into()
            );
        }
        for b in 0..self.layout.cfg.blocks_per_segment {
            let block = self.layout.block(phys, b);
            if self.nand.is_bad(block)? {
                continue;
            }
            if self.w.failing.remove(&block) {
                // A block that failed a program is not trusted again.
                self.retire(block)?;
            } else {
                self.erase_block(block)?;
            }
        }
        self.w.used.retain(|u| u.physical != phys);
        if !self.w.free.contains(&phys) {
            self.w.free.push_back(phys);
        }
        Ok(())
    }

    /// The write-order number of the page at `addr`, from its spare (`None` if unreadable).
    pub fn page_seq(&mut self, addr: PageAddr) -> Result<Option<u64>, FsError> {
        let mut spare = vec![0u8; self.layout.g.spare_size as usize];
        self.nand.read_spare(addr.0, &mut spare)?;
        Ok(Spare::decode(&spare, addr.0).map(|s| s.seq))
    }

    /// The first data page of physical segment `phys`, if written.
    pub fn first_page_of(&mut self, phys: u32) -> Result<Option<PageAddr>, FsError> {
        let mut spare = vec![0u8; self.layout.g.spare_size as usize];
        for b in 0..self.layout.data_blocks() {
            let block = self.layout.block(phys, b);
            if self.nand.is_bad(block)? {
                continue;
            }
            let page = self.layout.g.first_page(block);
            self.nand.read_spare(page, &mut spare)?;
            return Ok(Spare::decode(&spare, page).filter(|s| s.kind == Kind::Data).map(|_| PageAddr(page)));
        }
        Ok(None)
    }
}

impl<N: Nand> PageStore<N> {
    /// The newest marked page of the segment being written (see [`append_marked`](Self::append_marked)).
    pub fn last_marked(&self) -> Option<PageAddr> {
        self.w.last_marked
    }
}
