//! Opening a log after a clean shutdown or a crash.
//!
//! The superblock, segment headers and head come from whichever of their copies is intact.
//! Every segment before the live one was sealed before the next was entered. In the live
//! segment the tail is not stored anywhere: it is where the live chunk's chain of valid
//! records ends (an append is durable once its record, with its CRC, and its parity delta are
//! fenced). A crash can leave the last append torn: part of its record, part of its parity
//! delta. Recovery compares two readings of the live chunk: its bytes, and the chunk rebuilt
//! from the other chunks and the parity. It keeps the longer valid chain (so an acknowledged
//! record damaged later is rebuilt, not cut off), zeroes everything after it, and recomputes
//! the parity from the data, which every check has by then vouched for.

use bitmend_media::pmem::Region;

use crate::layout::{
    superblock_copies, HeadSlot, Layout, SegmentHeader, Superblock, SUPERBLOCK_A, SUPERBLOCK_B, SUPERBLOCK_C,
    SUPERBLOCK_SIZE,
};
use crate::log::{Cause, Repair};
use crate::log::{NvLog, Tail};
use crate::record;
use crate::repair::Expect;
use crate::{LogError, RecordId};

/// What opening the log found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Superblock copies rewritten from the intact one.
    pub superblock_repaired: usize,
    /// The head came from a head slot (false: both were damaged, and the head was set to the
    /// oldest segment still in the ring: trimmed records may be live again).
    pub head_from_slot: bool,
    /// The live segment, if any record was ever appended.
    pub live_segment: Option<u64>,
    pub head: RecordId,
    pub tail: RecordId,
    /// Non-zero bytes after the last valid record of the live chunk (a torn append, or stray
    /// writes), zeroed.
    pub torn_bytes_discarded: usize,
    /// Records that were not readable in the live chunk's bytes but were in the chunk rebuilt
    /// from parity.
    pub records_rebuilt_from_parity: usize,
    /// Live-segment parity chunks rewritten because a torn append left them inconsistent.
    pub parity_chunks_rewritten: usize,
    /// Segment header copies rewritten from the other copy.
    pub headers_repaired: usize,
    /// Segment headers rebuilt from the segment's bytes (both copies were damaged).
    pub headers_rebuilt: usize,
    /// Repairs made while checking the live segment and rebuilding headers.
    pub repairs: Vec<Repair>,
    /// Chunks found damaged beyond the redundancy.
    pub unrecoverable: Vec<(u64, usize)>,
}

impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.live_segment {
            None => writeln!(f, "empty log")?,
            Some(s) => writeln!(f, "live segment {s}, records {}..{}", self.head, self.tail)?,
        }
        if !self.head_from_slot {
            writeln!(f, "both head slots damaged: head reset to the oldest segment in the ring")?;
        }
        let lines = [
            (self.superblock_repaired, "superblock copies rewritten"),
            (self.headers_repaired, "segment header copies rewritten"),
            (self.headers_rebuilt, "segment headers rebuilt from their segments"),
            (self.torn_bytes_discarded, "bytes of a torn append (or stray writes) past the tail discarded"),
            (self.records_rebuilt_from_parity, "records rebuilt from parity"),
            (self.parity_chunks_rewritten, "live parity chunks rewritten after a torn append"),
            (self.repairs.len(), "chunk repairs"),
            (self.unrecoverable.len(), "chunks damaged beyond the redundancy"),
        ];
        for (n, what) in lines {
            if n > 0 {
                writeln!(f, "{n} {what}")?;
            }
        }
        Ok(())
    }
}

impl<R: Region> NvLog<R> {
    /// Opens the log in `region`, recovering from a crash if there was one.
    pub fn open(mut region: R) -> Result<(NvLog<R>, RecoveryReport), LogError> {
        if region.len() < SUPERBLOCK_C + SUPERBLOCK_SIZE {
            return Err(LogError::NotALog { why: format!("region of {} bytes", region.len()) });
        }
        let mut report = RecoveryReport { head_from_slot: true, ..RecoveryReport::default() };
        let signer = bitmend_code::sig::Signer::<4>::new();
        let read = |at: usize| Superblock::decode(&region.bytes()[at..at + SUPERBLOCK_SIZE], &signer);
        // Every place a copy may be (a version 1 log has none at C: it reads as no copy).
        let copies: Vec<(usize, Result<Superblock, LogError>)> =
            [SUPERBLOCK_A, SUPERBLOCK_B, SUPERBLOCK_C].into_iter().map(|at| (at, read(at))).collect();
        let sb = match copies.iter().find_map(|(_, c)| c.as_ref().ok()) {
            Some(sb) => *sb,
            None => {
                for (_, c) in &copies {
                    if let Err(LogError::Version { found, supported }) = c {
                        return Err(LogError::Version { found: *found, supported: *supported });
                    }
                }
                let why = copies[0].1.as_ref().err().map_or(String::new(), |e| e.to_string());
                return Err(LogError::NotALog { why });
            }
        };
        let good = sb.encode(&signer);
        for (at, copy) in &copies {
            if superblock_copies(sb.version).contains(at) && copy.as_ref().ok() != Some(&sb) {
                region.write(*at, &good)?;
                region.persist(*at, good.len())?;
                report.superblock_repaired += 1;
            }
        }
        let layout = Layout::new(sb.cfg, sb.version);
        if region.len() < layout.needed() {
            return Err(LogError::RegionTooSmall { len: region.len(), needed: layout.needed() });
        }
        let mut log = NvLog::assemble(region, &sb)?;
        log.load_headers(&mut report)?;
        let Some(live) = log.headers.iter().flatten().map(|h| h.seg).max() else {
            log.load_head(None, &mut report)?;
            report.head = log.head();
            return Ok((log, report));
        };
        report.live_segment = Some(live);
        log.load_head(Some(live), &mut report)?;
        let (head_seg, _, _) = log.locate(log.head);
        for seg in head_seg..live {
            log.recover_sealed(seg, &mut report)?;
        }
        log.recover_live(live, &mut report)?;
        // Damage beyond the redundancy cut the live chunk short of the head: the records
        // from the head on are lost (named in `unrecoverable`). The head comes back to the
        // tail, so that the log stays one (head <= tail) and appends go on after it.
        if log.tail().0 < log.head {
            log.head_seq += 1;
            log.write_head_slot(log.head_seq, log.tail().0)?;
            log.head = log.tail().0;
        }
        log.region.fence()?;
        report.repairs = log.repairs.clone();
        report.unrecoverable = log.lost.iter().copied().collect();
        report.head = log.head();
        report.tail = log.tail();
        Ok((log, report))
    }

    fn load_headers(&mut self, report: &mut RecoveryReport) -> Result<(), LogError> {
        let cfg = self.layout.cfg;
        for p in 0..cfg.segments as usize {
            let read = |copy: usize| {
                let at = self.layout.header(p, copy);
                SegmentHeader::decode(
                    &self.region.bytes()[at..at + self.layout.header_size],
                    self.log_id,
                    cfg.n(),
                    cfg.k,
                )
                .filter(|h| self.layout.physical(h.seg) == p)
            };
            let (a, b) = (read(0), read(1));
            // Both copies are written before one fence: a crash may leave either one newer.
            let chosen = match (&a, &b) {
                (Some(x), Some(y)) => {
                    Some(if (y.seg, y.sealed, y.closed) > (x.seg, x.sealed, x.closed) { y } else { x })
                }
                (Some(x), None) | (None, Some(x)) => Some(x),
                (None, None) => None,
            }
            .cloned();
            if let Some(h) = &chosen {
                if a.as_ref() != Some(h) || b.as_ref() != Some(h) {
                    self.headers[p] = chosen.clone();
                    self.write_header(p)?;
                    report.headers_repaired += 1;
                    self.stats.repaired_headers += 1;
                }
            }
            self.headers[p] = chosen;
        }
        Ok(())
    }

    fn load_head(&mut self, live: Option<u64>, report: &mut RecoveryReport) -> Result<(), LogError> {
        let slots = |seq: u64| -> Vec<Option<HeadSlot>> {
            HeadSlot::offsets(seq, self.version)
                .map(|at| HeadSlot::decode(&self.region.bytes()[at..at + 64], self.log_id))
                .collect()
        };
        let best = [slots(0), slots(1)].into_iter().flatten().flatten().max_by_key(|s| s.seq);
        // A copy of the newest slot that was lost (or never written: a crash between the
        // copies) is written again from the one that holds.
        if let Some(b) = best {
            if slots(b.seq).iter().any(|c| *c != Some(b)) {
                self.write_head_slot(b.seq, b.head)?;
                self.note(Repair { segment: 0, chunk: usize::MAX, cause: Cause::HeadSlot, tags: vec![] });
            }
        }
        let s = self.layout.cfg.segments as u64;
        let oldest = live.map_or(0, |l| {
            let mut o = l;
            while o > 0
                && o + s > l + 1
                && self.headers[self.layout.physical(o - 1)].as_ref().is_some_and(|h| h.seg == o - 1)
            {
                o -= 1;
            }
            o
        });
        match best {
            Some(b) => {
                self.head = b.head;
                self.head_seq = b.seq;
            }
            None => {
                report.head_from_slot = false;
                self.head = oldest * self.seg_data();
                self.head_seq = 1;
                self.write_head_slot(1, self.head)?;
                self.note(Repair {
                    segment: oldest,
                    chunk: usize::MAX,
                    cause: Cause::HeadSlot,
                    tags: vec![],
                });
            }
        }
        // A head older than the ring can hold is stale: move it to the oldest segment.
        if let Some(l) = live {
            let floor = (l + 1).saturating_sub(s) * self.seg_data();
            if self.head < floor {
                self.head = floor;
            }
            self.head = self.head.min((l + 1) * self.seg_data());
        }
        Ok(())
    }

    /// A segment before the live one: sealed, or made so (its header is rebuilt from its
    /// bytes if both copies were lost).
    fn recover_sealed(&mut self, seg: u64, report: &mut RecoveryReport) -> Result<(), LogError> {
        let p = self.layout.physical(seg);
        let ok = self.headers[p]
            .as_ref()
            .is_some_and(|h| h.seg == seg && h.sealed && h.closed == self.layout.cfg.k);
        if ok {
            return Ok(());
        }
        let keep = self.headers[p].as_ref().filter(|h| h.seg == seg).cloned();
        self.headers[p] = Some(keep.unwrap_or_else(|| SegmentHeader::fresh(seg, self.layout.cfg.n())));
        match self.check_segment(seg) {
            Ok(sigs) => {
                let h = self.headers[p].as_mut().expect("set above");
                h.sigs = sigs;
                h.closed = self.layout.cfg.k;
                h.sealed = true;
                self.write_header(p)?;
                report.headers_rebuilt += 1;
            }
            Err(LogError::Unrecoverable { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn recover_live(&mut self, seg: u64, report: &mut RecoveryReport) -> Result<(), LogError> {
        let cfg = self.layout.cfg;
        let (k, m, cs) = (cfg.k, cfg.m, cfg.chunk_size);
        let p = self.layout.physical(seg);
        let h = self.headers[p].clone().expect("live header");
        if h.sealed || h.closed == k {
            self.tail = Some(Tail { seg, p, chunk: k, off: 0 });
            return Ok(());
        }
        let c = h.closed;
        self.tail = Some(Tail { seg, p, chunk: c, off: 0 });
        // Chunks after the live one hold zeros.
        for i in c + 1..k {
            let at = self.layout.chunk(p, i);
            let stray = self.chunk_bytes(p, i).iter().filter(|&&b| b != 0).count();
            if stray > 0 {
                self.zero_range(at, cs)?;
                report.torn_bytes_discarded += stray;
            }
        }
        let base = self.id_at(seg, c, 0);
        let bad: Vec<usize> =
            (0..c).filter(|&i| !self.passes(self.chunk_bytes(p, i), seg, i, self.expect(seg, i))).collect();
        let a = self.chunk_bytes(p, c).to_vec();
        let chain_a = record::chain(&a, base, cfg.block_size);

        // The live chunk (and any bad closed chunk) rebuilt from parity, if that reads further.
        let mut exp: Vec<Expect> = (0..k).map(|i| self.expect(seg, i)).collect();
        exp[c] = Expect::Any;
        let mut best: Option<Vec<(usize, Vec<u8>)>> = None;
        let mut best_end = chain_a.end;
        if m > 0 && bad.len() < m {
            let mut erased = bad.clone();
            erased.push(c);
            // Every choice of parity chunks, keeping the reading with the longest valid chain:
            // one parity chunk may be damaged, or torn by the crash, while another is not.
            for rebuilt in self.decode_all(seg, &erased, &exp) {
                let live = &rebuilt.iter().find(|(i, _)| *i == c).expect("rebuilt live chunk").1;
                let end = record::chain(live, base, cfg.block_size).end;
                if best.is_none() && !bad.is_empty() || end > best_end {
                    best_end = best_end.max(end);
                    best = Some(rebuilt);
                }
            }
            best_end = chain_a.end;
        }
        let mut lost_closed = false;
        if best.is_none() && !bad.is_empty() {
            // The closed chunks alone, with the live chunk cut at its own chain's end.
            let cut = chain_a.end;
            self.zero_range(self.layout.chunk(p, c) + cut, cs - cut)?;
            self.tail = Some(Tail { seg, p, chunk: c, off: cut });
            exp[c] = Expect::Chain { end: cut };
            match self.try_decode(seg, &bad, &exp) {
                Some(rebuilt) => best = Some(rebuilt),
                None => {
                    for &i in &bad {
                        if self.lost.insert((seg, i)) {
                            self.stats.unrecoverable_chunks += 1;
                        }
                    }
                    lost_closed = true;
                }
            }
        }
        let mut live = a.clone();
        if let Some(rebuilt) = best {
            for (i, bytes) in rebuilt {
                if i == c {
                    let chain_b = record::chain(&bytes, base, cfg.block_size);
                    if chain_b.end >= chain_a.end {
                        report.records_rebuilt_from_parity +=
                            chain_b.records.len().saturating_sub(chain_a.records.len());
                        live = bytes;
                        best_end = chain_b.end;
                    } else {
                        best_end = chain_a.end;
                    }
                } else {
                    let at = self.layout.chunk(p, i);
                    self.region.write(at, &bytes)?;
                    self.region.flush(at, cs)?;
                    self.note(Repair { segment: seg, chunk: i, cause: Cause::DataChunk, tags: vec![] });
                }
            }
        }
        report.torn_bytes_discarded += a[best_end..].iter().filter(|&&b| b != 0).count();
        live[best_end..].fill(0);
        if live != a {
            let at = self.layout.chunk(p, c);
            self.region.write(at, &live)?;
            self.region.flush(at, cs)?;
        }
        self.tail = Some(Tail { seg, p, chunk: c, off: best_end });
        if !lost_closed {
            report.parity_chunks_rewritten += self.rewrite_parity(seg)?;
        }
        Ok(())
    }

    /// Recomputes the parity chunks of `seg` from its data; returns how many changed.
    fn rewrite_parity(&mut self, seg: u64) -> Result<usize, LogError> {
        let cfg = self.layout.cfg;
        let (k, m, cs) = (cfg.k, cfg.m, cfg.chunk_size);
        let p = self.layout.physical(seg);
        self.shadow_seg = None;
        let mut parity = vec![0u8; m * cs];
        {
            let data: Vec<&[u8]> = (0..k).map(|i| self.chunk_bytes(p, i)).collect();
            let mut outs: Vec<&mut [u8]> = parity.chunks_mut(cs).collect();
            self.codec.encode(&data, &mut outs).expect("shapes match the codec");
        }
        let mut changed = 0;
        for j in 0..m {
            let at = self.layout.chunk(p, k + j);
            if self.region.bytes()[at..at + cs] != parity[j * cs..(j + 1) * cs] {
                self.region.write(at, &parity[j * cs..(j + 1) * cs])?;
                self.region.flush(at, cs)?;
                changed += 1;
            }
        }
        Ok(changed)
    }
}
