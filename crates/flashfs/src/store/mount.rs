//! Opening a page store: the superblock, the newest segment, and the write position in it.
//!
//! Pages carry their segment and a file-system-wide sequence number in their spare, so the
//! newest segment is found from the first page of each segment, and the write position from
//! the spares of that one segment: a bounded number of spare reads, whatever happened before.
//! A torn page (a program cut by power loss) has a spare that does not decode; it is skipped,
//! never reprogrammed. Data pages of a group whose parity was never written are read back,
//! and if they verify, the group is closed with its parity at mount: they are then as
//! correctable as synced pages.

use bitmend_media::nand::Nand;

use crate::store::layout::{erased, Kind, Spare};
use crate::store::superblock::SuperblockCopy;
use crate::store::{PageAddr, PageStore, Segment};
use crate::FsError;

/// What mounting found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreMountReport {
    /// Segments holding pages.
    pub segments_in_use: u32,
    /// The newest segment (logical number), if any page was ever written.
    pub live_segment: Option<u64>,
    /// Spare areas read to mount.
    pub spares_read: u64,
    /// Pages whose program was cut (spare unreadable), skipped.
    pub torn_pages: u32,
    /// Unsynced data pages found intact and given their group parity at mount.
    pub pages_protected_at_mount: u32,
    /// The newest segment was full but its parity blocks incomplete: written at mount.
    pub resealed: bool,
    /// Mounted by scanning every segment (no usable anchor: a format before version 3, or a
    /// chain broken since the last checkpoint), not by following the chain.
    pub scanned: bool,
    /// Segments followed along the successor chain from the anchored checkpoint's.
    pub chain_length: u32,
    /// Pages read in the reserved blocks to find the newest anchor.
    pub anchor_pages_read: u32,
    /// Segments the checkpoint's table said were in use, found erased (the cleaner released
    /// them after that checkpoint), and free again. Looked for only when too few are free.
    pub segments_reclaimed: u32,
    /// Where the superblock was read.
    pub superblock: Option<SuperblockCopy>,
}

impl<N: Nand> PageStore<N> {
    /// Whether a page whose spare reads erased was never programmed. A program cut early may
    /// have moved bits of the data area and none of the spare: that page is torn (skipped,
    /// never programmed again), not the end of what was written.
    pub(crate) fn unwritten(&mut self, page: u32) -> Result<bool, FsError> {
        let mut data = vec![0u8; self.layout.g.page_size as usize];
        self.nand.read_data(page, &mut data)?;
        Ok(erased(&data))
    }

    /// Whether `page`, whose spare reads erased, is where its segment's programmed pages end,
    /// read from the chip (mount, before the writer knows where it stands): its data reads
    /// erased too, and so does the spare of every later page of its block and of the first
    /// page of every later good data block. Pages are programmed in order, a segment's data
    /// blocks one after the other, so a page that reads erased with a programmed one after
    /// it was programmed, and damaged (a wild erase, or cells that lost their charge): it
    /// is not the end, and what follows it must not be taken for unwritten.
    pub(crate) fn ends_block(&mut self, page: u32) -> Result<bool, FsError> {
        if !self.unwritten(page)? {
            return Ok(false);
        }
        let g = self.layout.g;
        let mut later: Vec<u32> = (page + 1..g.first_page(g.block_of(page)) + g.pages_per_block).collect();
        if let Some((phys, b, _)) = self.layout.locate(page) {
            for next in b + 1..self.layout.data_blocks() {
                let block = self.layout.block(phys, next);
                if !self.nand.is_bad(block)? {
                    later.push(g.first_page(block));
                }
            }
        }
        let mut spare = vec![0u8; g.spare_size as usize];
        for p in later {
            self.nand.read_spare(p, &mut spare)?;
            if !erased(&spare) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Pages programmed since its erase in block `b` of physical segment `phys`, as the
    /// writer knows it, not as the chip reads: every page of a segment no longer written (a
    /// segment is closed by padding every data block to its end and sealing it), and up to
    /// the write position in the live one. Damage that makes a page read erased must not
    /// make what follows it look unwritten: a scrub that believed it erased the rest.
    fn programmed_in(&self, phys: u32, b: u32) -> u32 {
        let ppb = self.layout.g.pages_per_block;
        match self.w.seg {
            Some(live) if live.physical == phys => {
                if b >= self.layout.data_blocks() {
                    if self.w.sealed {
                        ppb
                    } else {
                        0
                    }
                } else if b < self.w.block {
                    ppb
                } else if b == self.w.block {
                    self.w.next
                } else {
                    0
                }
            }
            _ => ppb,
        }
    }
}

impl<N: Nand> PageStore<N> {
    /// Mounts the store on `nand` by scanning: the first page of every segment. Correct on
    /// any version of the format, on its own; the file system mounts through the anchor
    /// log instead ([`open_anchored`](Self::open_anchored)) when it can.
    pub fn open(nand: N) -> Result<(PageStore<N>, StoreMountReport), FsError> {
        // The store alone does not know the file system's segment headers.
        let mut store = Self::with_superblock(nand, |_| None)?;
        let mut report = StoreMountReport { superblock: store.sb_from, ..StoreMountReport::default() };
        store.scan_segments(&mut report)?;
        Ok((store, report))
    }

    /// Finds the segments in use from the first written page of every segment, then the
    /// write position in the newest.
    pub(crate) fn scan_segments(&mut self, report: &mut StoreMountReport) -> Result<(), FsError> {
        report.scanned = true;
        self.scan_used(report)?;
        report.segments_in_use = self.w.used.len() as u32;
        let Some(&Segment { logical: live, physical: live_phys }) = self.w.used.iter().max() else {
            return Ok(());
        };
        report.live_segment = Some(live);
        self.resume_at(live_phys, live, false, report)
    }

    /// Makes physical segment `phys` (logical `logical`) the one being written, at its write
    /// position. `skip_full` reads one spare of each full block (its last) instead of all:
    /// enough when the newest checkpoint is known from the anchor, not from the spares.
    pub(crate) fn resume_at(
        &mut self,
        phys: u32,
        logical: u64,
        skip_full: bool,
        report: &mut StoreMountReport,
    ) -> Result<(), FsError> {
        self.w.seg = Some(Segment { logical, physical: phys });
        self.w.seg_parity_valid = false;
        self.w.seg_pages = 1;
        self.find_position(phys, skip_full, report)
    }

    /// Scans the live segment for the write position and the open group.
    fn find_position(
        &mut self,
        phys: u32,
        skip_full: bool,
        report: &mut StoreMountReport,
    ) -> Result<(), FsError> {
        let layout = self.layout;
        let ppb = layout.g.pages_per_block;
        let mut spare = vec![0u8; layout.g.spare_size as usize];
        let mut max_seq = 0u64;
        for b in 0..layout.data_blocks() {
            let block = layout.block(phys, b);
            if self.nand.is_bad(block)? {
                continue;
            }
            if skip_full {
                // Pages are programmed in order: a written last page means a full block.
                self.nand.read_spare(layout.g.first_page(block) + ppb - 1, &mut spare)?;
                report.spares_read += 1;
                if !erased(&spare) {
                    // The newest page that decodes gives the block's last sequence number,
                    // counting the torn pages after it as if they had one each.
                    let mut newest = None;
                    for i in (0..ppb).rev() {
                        let at = layout.g.first_page(block) + i;
                        if i < ppb - 1 {
                            self.nand.read_spare(at, &mut spare)?;
                            report.spares_read += 1;
                        }
                        if let Some(s) = Spare::decode(&spare, at) {
                            newest = Some(s.seq.saturating_add((ppb - 1 - i) as u64));
                            break;
                        }
                    }
                    match newest {
                        Some(seq) => max_seq = max_seq.max(seq),
                        // Not one page of the block decodes: read everything the slow way.
                        None => return self.find_position(phys, false, report),
                    }
                    continue;
                }
            }
            let mut spares: Vec<Option<Spare>> = Vec::new();
            let mut next = ppb;
            for i in 0..ppb {
                let at = layout.g.first_page(block) + i;
                self.nand.read_spare(at, &mut spare)?;
                report.spares_read += 1;
                if erased(&spare) && self.ends_block(at)? {
                    next = i;
                    break;
                }
                let s = Spare::decode(&spare, at);
                if s.is_none() {
                    report.torn_pages += 1;
                }
                if let Some(s) = s {
                    max_seq = max_seq.max(s.seq);
                    if self.w.queue.is_empty() && s.segment == self.w.seg.map_or(0, |w| w.logical) {
                        self.w.queue = s.queue.iter().flatten().copied().collect();
                    }
                    if s.kind == Kind::Data && s.index == 1 {
                        self.w.last_marked = Some(crate::PageAddr(layout.g.first_page(block) + i));
                    }
                }
                spares.push(s);
            }
            if next == ppb {
                continue;
            }
            // The write position is in this block.
            self.w.seq = max_seq.saturating_add(1);
            self.w.block = b;
            self.w.next = next;
            if next == 0 {
                // Nothing programmed yet, but the erase itself may have been cut: erase again.
                return self.start_block();
            }
            return self.reopen_group(block, &spares, report);
        }
        // Every data block is full: the segment is sealed, or its sealing was cut.
        self.w.seq = max_seq.saturating_add(1);
        self.w.block = layout.data_blocks();
        self.w.next = 0;
        if layout.cfg.parity_blocks > 0 && !self.segment_sealed(phys)? {
            // A host with no room for the parity (a thin image on a full disk) is a state,
            // not a failed mount: the segment stays unsealed, and the next append seals it
            // (and is refused with ENOSPC while the host is still full).
            match self.reseal() {
                Ok(()) => report.resealed = true,
                Err(e) if e.is_no_space() => self.w.sealed = false,
                Err(e) => return Err(e),
            }
        } else {
            self.w.sealed = true;
        }
        Ok(())
    }

    /// Whether every page of the segment's parity blocks is written and readable.
    fn segment_sealed(&mut self, phys: u32) -> Result<bool, FsError> {
        let layout = self.layout;
        let mut spare = vec![0u8; layout.g.spare_size as usize];
        for t in 0..layout.cfg.parity_blocks {
            let block = layout.block(phys, layout.data_blocks() + t);
            if self.nand.is_bad(block)? {
                continue;
            }
            let last = layout.g.first_page(block) + layout.g.pages_per_block - 1;
            self.nand.read_spare(last, &mut spare)?;
            if Spare::decode(&spare, last).is_none_or(|s| s.kind != Kind::SegmentParity) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Reads back the data pages after the block's last group and closes them into a group.
    fn reopen_group(
        &mut self,
        block: u32,
        spares: &[Option<Spare>],
        report: &mut StoreMountReport,
    ) -> Result<(), FsError> {
        let ps = self.layout.g.page_size as usize;
        let p = self.layout.cfg.parity_pages;
        let ppb = self.layout.g.pages_per_block;
        let closed_until = spares
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some_and(|s| s.kind != Kind::Data))
            .map(|(i, _)| i + 1)
            .max()
            .unwrap_or(0);
        let mut buf = vec![0u8; ps];
        let mut group: Vec<Vec<u8>> = Vec::new();
        let mut first = None;
        // The open group: consecutive data pages from the end of the last closed group, the
        // first of which starts the group, all naming it, all matching their signatures.
        for (i, s) in spares.iter().enumerate().skip(closed_until) {
            let Some(s) = s.filter(|s| s.kind == Kind::Data) else { break };
            if s.group_first as usize != closed_until {
                break;
            }
            self.nand.read_data(self.layout.g.first_page(block) + i as u32, &mut buf)?;
            if self.signer.sign(&buf) != s.sig {
                break;
            }
            first = Some(closed_until as u32);
            group.push(buf.clone());
        }
        self.w.group_len = 0;
        self.w.group_parity.fill(0);
        if let Some(first) = first {
            self.w.group_first = first;
            let engine = self.group_code.engine();
            for (col, page) in group.iter().enumerate() {
                for j in 0..p as usize {
                    let coef = self.group_code.parity_row(j)[col];
                    engine.mul_acc(coef, page, &mut self.w.group_parity[j * ps..(j + 1) * ps]);
                }
            }
            self.w.group_len = group.len() as u32;
            if self.w.next + p <= ppb {
                report.pages_protected_at_mount = group.len() as u32;
                self.close_group()?;
            } else {
                // No room for the parity: the segment parity will cover these pages.
                self.w.group_len = 0;
            }
        }
        if self.w.next + 1 + p > ppb {
            self.finish_block()?;
        }
        Ok(())
    }
}

impl<N: Nand> PageStore<N> {
    /// The written pages of the first `blocks` blocks of physical segment `phys` (bad blocks
    /// skipped, each block as far as it was programmed: see `programmed_in`), with their
    /// spares where they decode. Pages before `from` (a page of this segment) are left out.
    fn written_pages(
        &mut self,
        phys: u32,
        blocks: u32,
        from: Option<u32>,
    ) -> Result<Vec<(u32, Option<Spare>)>, FsError> {
        let g = self.layout.g;
        let mut spare = vec![0u8; g.spare_size as usize];
        let mut out = Vec::new();
        let from = from.filter(|&p| self.layout.locate(p).is_some_and(|l| l.0 == phys));
        for b in 0..blocks {
            let block = self.layout.block(phys, b);
            if self.nand.is_bad(block)? {
                continue;
            }
            for i in 0..self.programmed_in(phys, b) {
                let page = g.first_page(block) + i;
                if from.is_some_and(|f| page < f) {
                    continue;
                }
                self.nand.read_spare(page, &mut spare)?;
                out.push((page, Spare::decode(&spare, page)));
            }
        }
        Ok(out)
    }

    /// The data pages written in physical segment `phys` (and pages whose spare does not
    /// decode, which may be data), from their spares alone.
    pub(crate) fn data_pages_of(&mut self, phys: u32) -> Result<Vec<u32>, FsError> {
        let blocks = self.layout.data_blocks();
        Ok(self
            .written_pages(phys, blocks, None)?
            .into_iter()
            .filter(|(_, s)| s.as_ref().is_none_or(|s| s.kind == Kind::Data))
            .map(|(page, _)| page)
            .collect())
    }

    /// Every data page written in segments from logical segment `from` on, in write order
    /// (the file system replays its nodes from them); in segment `from`, only from page
    /// `first` on, when given (pages before it are older).
    pub fn log_pages(&mut self, from: u64, first: Option<PageAddr>) -> Result<Vec<PageAddr>, FsError> {
        let layout = self.layout;
        let mut out = Vec::new();
        for &Segment { logical, physical: phys } in &self.w.used.clone() {
            if logical < from {
                continue;
            }
            // A data page with a damaged spare is found by what its neighbours say: any page
            // not otherwise accounted for is offered to the reader, which repairs it or
            // reports it.
            let start = if logical == from { first.map(|p| p.0) } else { None };
            for (page, spare) in self.written_pages(phys, layout.data_blocks(), start)? {
                match spare {
                    Some(s) if s.kind == Kind::Data => out.push((s.seq, crate::PageAddr(page))),
                    Some(_) => {}
                    None => out.push((u64::MAX, crate::PageAddr(page))),
                }
            }
        }
        // Pages with unreadable spares sort by position among their neighbours.
        let mut last = 0;
        for e in out.iter_mut() {
            if e.0 == u64::MAX {
                e.0 = last;
            } else {
                last = e.0;
            }
        }
        out.sort_by_key(|e| e.0);
        Ok(out.into_iter().map(|e| e.1).collect())
    }
}

/// What the scrubber found on one page that is not file-system data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageHealth {
    /// A data page, to be read (and repaired) through [`PageStore::read`].
    Data,
    /// A parity or pad page whose bytes match its signature.
    Sound,
    /// A parity or pad page whose bytes do not: the redundancy of its group or segment is
    /// down by one until the cleaner rewrites the segment.
    Damaged,
}

impl<N: Nand> PageStore<N> {
    /// Every written page of logical segment `logical` (none once the cleaner released it),
    /// data pages marked for reading and every other page checked against its signature.
    pub fn scrub_segment_pages(
        &mut self,
        logical: u64,
    ) -> Result<Vec<(crate::PageAddr, PageHealth)>, FsError> {
        let Some(&Segment { physical: phys, .. }) = self.w.used.iter().find(|u| u.logical == logical) else {
            return Ok(Vec::new());
        };
        let layout = self.layout;
        let mut data = vec![0u8; layout.g.page_size as usize];
        let mut out = Vec::new();
        for (page, spare) in self.written_pages(phys, layout.cfg.blocks_per_segment, None)? {
            let health = match spare {
                // A damaged spare: the reader decides whether the page held data.
                None => PageHealth::Data,
                Some(s) if s.kind == Kind::Data => PageHealth::Data,
                Some(s) => {
                    self.nand.read_data(page, &mut data)?;
                    if self.signer.sign(&data) == s.sig {
                        PageHealth::Sound
                    } else {
                        PageHealth::Damaged
                    }
                }
            };
            out.push((crate::PageAddr(page), health));
        }
        Ok(out)
    }
}
