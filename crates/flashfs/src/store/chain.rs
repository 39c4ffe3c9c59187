//! Mounting without scanning: the anchor log and the successor chain.
//!
//! Pages 1 onward of the two reserved blocks are an append-only log of anchors, one per
//! checkpoint: where the checkpoint starts and in which segment. Every page of a segment
//! carries, in its spare, the segment's successor queue: the segments of which the first
//! still free will be written next. Mount reads the newest anchor (a binary search over the
//! written pages of each reserved block), then follows the chain from the checkpoint's
//! segment: for each segment, the first of its successors whose first page carries the next
//! logical number. It reads pages in proportion to the segments written since the
//! checkpoint, not to the chip. The checkpoint holds the table of older segments in use,
//! which the file system hands back with [`PageStore::adopt_table`].

use bitmend_media::nand::{Nand, NandError};

use super::layout::erased;
use crate::store::layout::{Anchor, AnchorCkpt, Kind, Spare, RESERVED_BLOCKS};
use crate::store::superblock::HeaderCopy;
use crate::store::{PageAddr, PageStore, Segment};
use crate::{FormatError, PosixError};
use crate::{FsError, StoreMountReport};

impl<N: Nand> PageStore<N> {
    /// Mounts by the anchor log when it names a checkpoint whose segment is still where it
    /// says; otherwise scans (and says so in the report). Returns the anchored checkpoint.
    /// The segments older than the checkpoint's are unknown until the caller passes the
    /// checkpoint's table to [`adopt_table`](Self::adopt_table); until then only the chain's
    /// segments are in use and none free (a full live segment is sealed, not left).
    pub(crate) fn open_anchored(
        nand: N,
        header: HeaderCopy,
    ) -> Result<(PageStore<N>, StoreMountReport, Option<AnchorCkpt>), FsError> {
        let mut store = Self::with_superblock(nand, header)?;
        let mut report = StoreMountReport { superblock: store.sb_from, ..StoreMountReport::default() };
        let anchor = store.find_anchor(&mut report)?;
        if let Some(c) = anchor.and_then(|a| a.ckpt) {
            if let Some(chain) = store.walk_chain(c, &mut report)? {
                let Segment { logical: live, physical: live_phys } =
                    *chain.last().expect("the chain starts at the checkpoint");
                report.chain_length = chain.len() as u32;
                report.live_segment = Some(live);
                store.w.used = chain;
                store.w.free.clear();
                // The live segment's successors: where the next segment goes.
                store.w.queue = store
                    .first_spare(live_phys, &mut report)?
                    .map_or(Vec::new(), |s| s.queue.iter().flatten().copied().collect());
                // With no successor (chosen when the chip was full), resuming might need a
                // segment the table has not yet said is free: scan instead.
                if !store.w.queue.is_empty() {
                    store.w.defer_open = true;
                    store.resume_at(live_phys, live, true, &mut report)?;
                    store.w.defer_open = false;
                    return Ok((store, report, Some(c)));
                }
                store.w.used.clear();
                store.w.queue.clear();
            }
        }
        store.scan_segments(&mut report)?;
        Ok((store, report, None))
    }

    /// Completes an anchored mount with the checkpoint's table of segments in use: those
    /// older than the chain are in use unless the chain reused
    /// them; every other segment with a good data block is free. `None` (the checkpoint had
    /// no table) rebuilds both by scanning.
    pub(crate) fn adopt_table(
        &mut self,
        table: Option<&[Segment]>,
        report: &mut StoreMountReport,
    ) -> Result<(), FsError> {
        let Some(table) = table else {
            let mut scan = StoreMountReport::default();
            let live = self.w.seg;
            self.scan_used(&mut scan)?;
            report.spares_read += scan.spares_read;
            report.scanned = true;
            self.w.seg = live;
            return Ok(());
        };
        let chain_from = self.w.used.iter().map(|u| u.logical).min().unwrap_or(0);
        let mut used: Vec<Segment> = table
            .iter()
            .filter(|t| {
                t.logical < chain_from
                    && t.physical < self.layout.segments
                    && !self.w.used.iter().any(|u| u.physical == t.physical)
            })
            .copied()
            .collect();
        used.extend_from_slice(&self.w.used);
        used.sort_unstable();
        used.dedup_by_key(|u| u.physical);
        self.w.used = used;
        report.segments_in_use = self.w.used.len() as u32;
        self.rebuild_free()
    }

    /// Frees the segments in use (by the table) whose first page is erased: the cleaner
    /// released them after the checkpoint whose table a mount adopted, and a crash came
    /// before the next. Reads a spare per segment in use, so a mount does it only when too
    /// few segments are free for the cleaner (else the cleaner finds them empty in time).
    pub(crate) fn reclaim_erased(&mut self, report: &mut StoreMountReport) -> Result<(), FsError> {
        let live = self.w.seg.map(|s| s.physical);
        let mut erased_segments = Vec::new();
        for u in self.w.used.clone() {
            if Some(u.physical) != live && self.first_spare(u.physical, report)?.is_none() {
                erased_segments.push(u.physical);
            }
        }
        for phys in erased_segments {
            self.w.used.retain(|u| u.physical != phys);
            if !self.w.free.contains(&phys) {
                self.w.free.push_back(phys);
            }
            report.segments_reclaimed += 1;
        }
        report.segments_in_use = self.w.used.len() as u32;
        Ok(())
    }

    /// Every segment not in use and with a good data block is free (kept in successor order
    /// first, so the queue's choice stands).
    fn rebuild_free(&mut self) -> Result<(), FsError> {
        let mut free: std::collections::VecDeque<u32> = Default::default();
        for phys in 0..self.layout.segments {
            if self.w.used.iter().any(|u| u.physical == phys) {
                continue;
            }
            let mut good = false;
            for b in 0..self.layout.data_blocks() {
                good |= !self.nand.is_bad(self.layout.block(phys, b))?;
            }
            if good {
                free.push_back(phys);
            }
        }
        self.w.free = free;
        Ok(())
    }

    /// The segments in use, from the first written page of every segment (which names its
    /// logical number), and the free ones.
    pub(crate) fn scan_used(&mut self, report: &mut StoreMountReport) -> Result<(), FsError> {
        let layout = self.layout;
        let mut found = Vec::new();
        for phys in 0..layout.segments {
            if let Some(s) = self.first_spare(phys, report)? {
                found.push((s.segment, phys));
            }
        }
        found.sort_unstable();
        self.w.used = found.into_iter().map(|(logical, physical)| Segment { logical, physical }).collect();
        self.rebuild_free()
    }

    /// The first spare that decodes among the written pages of the first written data block
    /// of physical segment `phys` (torn pages skipped); `None` if nothing was written.
    pub(crate) fn first_spare(
        &mut self,
        phys: u32,
        report: &mut StoreMountReport,
    ) -> Result<Option<Spare>, FsError> {
        let g = self.layout.g;
        let mut spare = vec![0u8; g.spare_size as usize];
        for b in 0..self.layout.data_blocks() {
            let block = self.layout.block(phys, b);
            if self.nand.is_bad(block)? {
                continue;
            }
            for i in 0..g.pages_per_block {
                self.nand.read_spare(g.first_page(block) + i, &mut spare)?;
                report.spares_read += 1;
                if erased(&spare) && self.ends_block(g.first_page(block) + i)? {
                    return Ok(None);
                }
                if let Some(s) = Spare::decode(&spare, g.first_page(block) + i) {
                    return Ok(Some(s));
                }
            }
            // Every page of the block torn or failed: the writer went on to the next block.
        }
        Ok(None)
    }

    /// The segments from the anchored checkpoint's to the newest;
    /// `None` if the checkpoint's segment no longer holds it.
    fn walk_chain(
        &mut self,
        c: AnchorCkpt,
        report: &mut StoreMountReport,
    ) -> Result<Option<Vec<Segment>>, FsError> {
        if c.phys >= self.layout.segments {
            return Ok(None);
        }
        let Some(first) = self.first_spare(c.phys, report)? else { return Ok(None) };
        if first.segment != c.segment {
            return Ok(None);
        }
        let mut chain = vec![Segment { logical: c.segment, physical: c.phys }];
        let mut queue: Vec<u32> = first.queue.iter().flatten().copied().collect();
        // Each step moves to a segment not yet in the chain: the walk ends.
        'walk: while chain.len() <= self.layout.segments as usize {
            // Numbers come from the flash: a damaged one must end the walk, not overflow.
            let Some(next) = chain.last().expect("not empty").logical.checked_add(1) else { break };
            for q in queue {
                if q >= self.layout.segments || chain.iter().any(|c| c.physical == q) {
                    continue;
                }
                if let Some(s) = self.first_spare(q, report)? {
                    if s.segment == next {
                        chain.push(Segment { logical: next, physical: q });
                        queue = s.queue.iter().flatten().copied().collect();
                        continue 'walk;
                    }
                }
            }
            break;
        }
        Ok(Some(chain))
    }

    /// Reads the newest anchor and sets the anchor log's write position after it.
    fn find_anchor(&mut self, report: &mut StoreMountReport) -> Result<Option<Anchor>, FsError> {
        let g = self.layout.g;
        let mut page = vec![0u8; g.page_size as usize];
        let mut spare = vec![0u8; g.spare_size as usize];
        let mut newest: Option<(Anchor, u32, u32)> = None;
        let mut positions = Vec::new();
        for block in 0..RESERVED_BLOCKS {
            if self.nand.is_bad(block)? {
                continue;
            }
            // Written pages are a prefix of the block (page 0 is the superblock): it ends after
            // the last spare that is not erased. Found from the end, not by bisection: a page
            // damaged to read erased inside the prefix must not end it early (the next anchor
            // would be programmed over written pages, and the newest one missed).
            let mut lo = g.pages_per_block;
            while lo > 1 {
                self.nand.read_spare(g.first_page(block) + lo - 1, &mut spare)?;
                report.anchor_pages_read += 1;
                if !erased(&spare) {
                    break;
                }
                lo -= 1;
            }
            let mut end = lo;
            // A program cut before it reached the spare leaves the page unusable still.
            while end < g.pages_per_block {
                self.nand.read_page(g.first_page(block) + end, &mut page, &mut spare)?;
                report.anchor_pages_read += 1;
                if erased(&page) && erased(&spare) {
                    break;
                }
                end += 1;
            }
            positions.push((block, end));
            // The newest whole anchor of the block: torn ones at the end are stepped over.
            for i in (1..lo).rev() {
                self.nand.read_page(g.first_page(block) + i, &mut page, &mut spare)?;
                report.anchor_pages_read += 1;
                if let Some(a) = Anchor::decode(self.fs_id, &page) {
                    if newest.is_none_or(|n| a.seq > n.0.seq) {
                        newest = Some((a, block, end));
                    }
                    break;
                }
            }
        }
        self.w.anchor = match newest {
            Some((a, block, end)) => {
                self.w.anchor_seq = a.seq;
                self.w.anchor_chained = a.ckpt.is_some();
                Some((block, end))
            }
            // No anchor yet: the log starts in the first reserved block with room that holds
            // a good superblock; if neither does (both were destroyed), the first anchor is
            // written into a block erased for it, as if the log were full.
            None => match positions.iter().find(|p| !self.sb_damaged.contains(&p.0)) {
                Some(&p) => Some(p),
                None => positions.first().map(|p| (p.0, g.pages_per_block)),
            },
        };
        Ok(newest.map(|n| n.0))
    }

    /// Whether the newest anchor names a checkpoint (mount follows the chain from it), rather
    /// than saying "scan".
    pub fn anchored(&self) -> bool {
        self.w.anchor_chained
    }

    /// Whether the segment being written names successors (every segment opened by this
    /// version does, unless the chip was full; those of version 2 and before do not).
    pub fn has_successors(&self) -> bool {
        !self.w.queue.is_empty()
    }

    /// Records in the anchor log that the newest checkpoint starts at `page`, so that mount
    /// follows the chain from its segment. Called once the checkpoint is durable.
    pub fn record_checkpoint(&mut self, page: PageAddr) -> Result<(), FsError> {
        let Some((phys, _, _)) = self.layout.locate(page.0) else {
            return Err(PosixError::Invalid { why: format!("page {} is not in a segment", page.0) }.into());
        };
        let Some(&Segment { logical: segment, .. }) = self.w.used.iter().find(|u| u.physical == phys) else {
            return Err(
                PosixError::Invalid { why: format!("page {} is in no segment in use", page.0) }.into()
            );
        };
        self.write_anchor(Some(AnchorCkpt { page: page.0, segment, phys }))
    }

    /// Rewrites the superblock in both reserved blocks with this build's version, so that an
    /// older build, which would not know what this one wrote, refuses the image: each block
    /// in turn is erased and given the superblock and the anchor of checkpoint `page` (a cut
    /// at any point leaves a block with a superblock and that anchor, as the log's own
    /// wrapping does).
    pub fn upgrade_superblock(&mut self, page: PageAddr) -> Result<(), FsError> {
        if self.sb_version >= crate::store::layout::FS_VERSION {
            return Ok(());
        }
        // Every copy from here on is written as this version.
        self.sb_version = crate::store::layout::FS_VERSION;
        for _ in 0..RESERVED_BLOCKS {
            self.wrap_anchor_log(page)?;
        }
        // The far copies, of the older version (or none, before version 9), are damaged now.
        self.check_superblocks()?;
        for block in self.sb_damaged.clone() {
            if block >= RESERVED_BLOCKS {
                self.write_far_copy(block)?;
            }
        }
        self.check_superblocks()?;
        Ok(())
    }

    /// Moves the anchor log to the other reserved block, as if its block were full: erases
    /// it, writes the superblock into its page 0 and the anchor of checkpoint `page` after.
    pub(crate) fn wrap_anchor_log(&mut self, page: PageAddr) -> Result<(), FsError> {
        if let Some((block, _)) = self.w.anchor {
            self.w.anchor = Some((block, self.layout.g.pages_per_block));
        }
        self.record_checkpoint(page)
    }

    /// Appends an anchor; when its block is full, erases the other reserved block, writes
    /// the superblock into it and goes on there (into the same block when the other is bad:
    /// then a cut between erase and superblock leaves no superblock, the price of a chip
    /// whose reserved block failed).
    pub(crate) fn write_anchor(&mut self, ckpt: Option<AnchorCkpt>) -> Result<(), FsError> {
        let g = self.layout.g;
        let mut page = vec![0u8; g.page_size as usize];
        let anchor = Anchor { seq: self.w.anchor_seq + 1, ckpt };
        anchor.encode(self.fs_id, &mut page, Some((&self.superblock(), self.sb_version)));
        // Each attempt either programs the anchor or moves on by a page or a block.
        for _ in 0..4 * g.pages_per_block {
            let Some((block, next)) = self.w.anchor else { break };
            if next < g.pages_per_block && !self.nand.is_bad(block)? {
                self.w.anchor = Some((block, next + 1));
                let at = g.first_page(block) + next;
                let spare = self.spare_for(Kind::Anchor, 0, 0, 0, &page, at);
                match self.nand.program(at, &page, &spare) {
                    Ok(()) => {
                        self.nand.sync()?;
                        self.w.anchor_seq = anchor.seq;
                        self.w.anchor_chained = ckpt.is_some();
                        return Ok(());
                    }
                    Err(e) if self.program_refused(&e, at)? => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            self.w.anchor = self.fresh_anchor_block(block)?;
        }
        Err(FormatError::Config { why: "no reserved block can hold the anchor log".into() }.into())
    }

    /// Erases the reserved block after `full` (or `full` itself when the other is bad) and
    /// writes the superblock into its page 0; the anchor log goes on at page 1.
    fn fresh_anchor_block(&mut self, full: u32) -> Result<Option<(u32, u32)>, FsError> {
        let other = (full + 1) % RESERVED_BLOCKS;
        for target in [other, full] {
            if self.nand.is_bad(target)? {
                continue;
            }
            match self.nand.erase(target) {
                Ok(()) => {}
                Err(NandError::EraseFailed { .. }) => {
                    self.stats.erase_failures += 1;
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            self.program_superblock(target)?;
            return Ok(Some((target, 1)));
        }
        Ok(None)
    }
}
