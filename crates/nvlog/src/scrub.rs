//! Scrubbing: PRIMS's two passes, on demand or from a background thread.
//!
//! The cheap pass reads no chunk: it checks each segment's header copies against the
//! in-memory copy, and that the parity chunks' recorded signatures are the code applied to
//! the data chunks' signatures (the signatures commute with the parity). The full pass
//! recomputes every chunk's signature from its bytes (or its records' CRCs, for the live
//! chunk) and repairs what it can.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bitmend_code::sig::Sig64;
use bitmend_media::pmem::Region;

use crate::layout::{superblock_copies, HeadSlot, Superblock, SUPERBLOCK_SIZE};
use crate::log::NvLog;
use crate::log::{Cause, Repair};
use crate::LogError;

/// What a scrub checked and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogScrubReport {
    pub segments_checked: u64,
    /// Chunk bytes whose signatures were recomputed (full pass).
    pub bytes_verified: u64,
    /// Segments whose recorded signatures disagreed with each other (cheap pass).
    pub inconsistent_signatures: u64,
    pub repairs: Vec<Repair>,
    /// Chunks found damaged beyond the redundancy, as (segment, chunk).
    pub unrecoverable: Vec<(u64, usize)>,
}

impl LogScrubReport {
    /// Repairs of one cause.
    pub fn count(&self, cause: Cause) -> usize {
        self.repairs.iter().filter(|r| r.cause == cause).count()
    }

    fn absorb(&mut self, other: LogScrubReport) {
        self.segments_checked += other.segments_checked;
        self.bytes_verified += other.bytes_verified;
        self.inconsistent_signatures += other.inconsistent_signatures;
        self.repairs.extend(other.repairs);
        self.unrecoverable.extend(other.unrecoverable);
    }
}

impl std::fmt::Display for LogScrubReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} segments checked, {} chunk bytes verified",
            self.segments_checked, self.bytes_verified
        )?;
        for cause in [
            Cause::DataChunk,
            Cause::ParityChunk,
            Cause::SegmentHeader,
            Cause::Superblock,
            Cause::HeadSlot,
            Cause::Garbage,
        ] {
            let n = self.count(cause);
            if n > 0 {
                writeln!(f, "  repaired {n} x {cause:?}")?;
            }
        }
        if self.inconsistent_signatures > 0 {
            writeln!(f, "  {} segments with inconsistent recorded signatures", self.inconsistent_signatures)?;
        }
        if !self.unrecoverable.is_empty() {
            writeln!(
                f,
                "  {} chunks damaged beyond the redundancy: {:?}",
                self.unrecoverable.len(),
                self.unrecoverable
            )?;
        }
        Ok(())
    }
}

impl<R: Region> NvLog<R> {
    /// The logical segments holding live records, oldest first (empty before the first append).
    pub fn live_segments(&self) -> std::ops::Range<u64> {
        match self.tail {
            None => 0..0,
            Some(t) => self.locate(self.head).0.min(t.seg)..t.seg + 1,
        }
    }

    /// Both passes over every live segment, and the superblock and head slot.
    pub fn scrub(&mut self) -> Result<LogScrubReport, LogError> {
        let mut report = self.scrub_metadata()?;
        for seg in self.live_segments() {
            report.absorb(self.scrub_segment(seg)?);
        }
        Ok(report)
    }

    /// The cheap pass alone: no chunk is read.
    pub fn scrub_cheap(&mut self) -> Result<LogScrubReport, LogError> {
        let mut report = self.scrub_metadata()?;
        for seg in self.live_segments() {
            report.segments_checked += 1;
            if !self.cheap_check(seg, &mut report)? {
                report.inconsistent_signatures += 1;
            }
        }
        Ok(report)
    }

    /// Both passes over one segment.
    pub fn scrub_segment(&mut self, seg: u64) -> Result<LogScrubReport, LogError> {
        let before = self.repairs.len();
        let mut report = LogScrubReport { segments_checked: 1, ..LogScrubReport::default() };
        if !self.cheap_check(seg, &mut report)? {
            report.inconsistent_signatures += 1;
        }
        let lost_before = self.lost.len();
        match self.check_segment(seg) {
            Ok(_) | Err(LogError::Unrecoverable { .. }) => {}
            Err(e) => return Err(e),
        }
        report.bytes_verified += (self.layout.cfg.n() * self.layout.cfg.chunk_size) as u64;
        report
            .repairs
            .extend(self.repairs[before..].iter().filter(|r| r.cause != Cause::SegmentHeader).cloned());
        if self.lost.len() > lost_before || self.lost.iter().any(|&(s, _)| s == seg) {
            report.unrecoverable.extend(self.lost.iter().filter(|&&(s, _)| s == seg));
        }
        Ok(report)
    }

    /// Header copies and recorded signatures of `seg`; false if the signatures disagree.
    fn cheap_check(&mut self, seg: u64, report: &mut LogScrubReport) -> Result<bool, LogError> {
        let p = self.layout.physical(seg);
        let Some(h) = self.headers[p].clone() else { return Ok(false) };
        let good = h.encode(self.log_id);
        let mut rewrite = false;
        for copy in 0..2 {
            let at = self.layout.header(p, copy);
            if self.region.bytes()[at..at + good.len()] != good[..] {
                rewrite = true;
            }
        }
        if rewrite {
            self.write_header(p)?;
            let r = Repair { segment: seg, chunk: usize::MAX, cause: Cause::SegmentHeader, tags: vec![] };
            report.repairs.push(r.clone());
            self.note(r);
        }
        if !h.sealed {
            return Ok(true);
        }
        let k = self.layout.cfg.k;
        Ok((0..self.layout.cfg.m)
            .all(|j| Sig64::combine(self.codec.parity_row(j), &h.sigs[..k]) == h.sigs[k + j]))
    }

    /// The superblock copies and the current head slot, rewritten if damaged.
    fn scrub_metadata(&mut self) -> Result<LogScrubReport, LogError> {
        let mut report = LogScrubReport::default();
        let sb =
            Superblock { version: self.version, cfg: self.layout.cfg, log_id: self.log_id, region_len: 0 };
        for &at in superblock_copies(self.version) {
            let ok = Superblock::decode(&self.region.bytes()[at..at + SUPERBLOCK_SIZE], &self.signer)
                .is_ok_and(|s| s.cfg == sb.cfg && s.log_id == sb.log_id && s.version == sb.version);
            if !ok {
                let region_len = self.region.len() as u64;
                let bytes = Superblock { region_len, ..sb }.encode(&self.signer);
                self.region.write(at, &bytes)?;
                self.region.persist(at, bytes.len())?;
                let r = Repair { segment: 0, chunk: usize::MAX, cause: Cause::Superblock, tags: vec![] };
                report.repairs.push(r.clone());
                self.note(r);
            }
        }
        let want = HeadSlot { seq: self.head_seq, head: self.head };
        let lost = HeadSlot::offsets(self.head_seq, self.version)
            .any(|at| HeadSlot::decode(&self.region.bytes()[at..at + 64], self.log_id) != Some(want));
        if lost {
            self.write_head_slot(self.head_seq, self.head)?;
            let r = Repair { segment: 0, chunk: usize::MAX, cause: Cause::HeadSlot, tags: vec![] };
            report.repairs.push(r.clone());
            self.note(r);
        }
        Ok(report)
    }
}

/// Totals of a background scrubber.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubTotals {
    /// Full sweeps over the live segments completed.
    pub passes: u64,
    pub report: LogScrubReport,
    /// Errors other than unrecoverable damage (for example a region that lost power).
    pub errors: Vec<String>,
}

/// A thread that scrubs a shared log one segment at a time, holding the lock only for that
/// segment and sleeping between segments to stay under `bytes_per_sec`.
pub struct Scrubber {
    stop: Arc<AtomicBool>,
    totals: Arc<Mutex<ScrubTotals>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Scrubber {
    pub fn spawn<R: Region + 'static>(log: Arc<Mutex<NvLog<R>>>, bytes_per_sec: u64) -> Scrubber {
        let stop = Arc::new(AtomicBool::new(false));
        let totals = Arc::new(Mutex::new(ScrubTotals::default()));
        let (s, t) = (stop.clone(), totals.clone());
        let handle = std::thread::spawn(move || {
            let mut next: Option<u64> = None;
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                let (bytes, result, wrapped) = {
                    let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
                    let range = l.live_segments();
                    if range.is_empty() {
                        (0, Ok(LogScrubReport::default()), false)
                    } else {
                        let seg = next.filter(|n| range.contains(n)).unwrap_or(range.start);
                        let wrapped = seg + 1 == range.end;
                        next = Some(seg + 1);
                        let r = l.scrub_segment(seg);
                        ((l.config().n() * l.config().chunk_size) as u64, r, wrapped)
                    }
                };
                {
                    let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                    match result {
                        Ok(r) => t.report.absorb(r),
                        Err(e) => t.errors.push(e.to_string()),
                    }
                    t.passes += wrapped as u64;
                }
                let budget = Duration::from_secs_f64(bytes.max(4096) as f64 / bytes_per_sec.max(1) as f64);
                let until = started + budget.max(Duration::from_micros(100));
                while !s.load(Ordering::Relaxed) && Instant::now() < until {
                    std::thread::sleep((until - Instant::now()).min(Duration::from_millis(20)));
                }
            }
        });
        Scrubber { stop, totals, handle: Some(handle) }
    }

    /// What the scrubber has done so far.
    pub fn totals(&self) -> ScrubTotals {
        self.totals.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops the thread and returns its totals.
    pub fn stop(mut self) -> ScrubTotals {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.totals()
    }
}

impl Drop for Scrubber {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
