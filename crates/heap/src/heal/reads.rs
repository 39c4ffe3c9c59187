//! Checking what the API reads, with the strategies Loris names for cached pages: every
//! read, a read after a minimum time since the page's last check, a read after a minimum time
//! since its last use, or none (the scrubber alone).
//!
//! What is checked is what the read returns: in a pool with line checks (version 6), the
//! 64-byte lines it covers, each against its CRC-32C; else the pages, against their
//! signatures. A B+tree get reads a node through [`Pool::check_parts`]: the header and index,
//! the keys its search compared, and the entry it took, a few lines of an 8 KiB node. The
//! time stamps stay per page (a word per 4 KiB): a page's stamp says when a read of some of
//! its lines last passed, and a read of its other lines within the interval is not checked,
//! as Loris does not re-check a page within its interval.
//!
//! Reads inside a transaction are checked the same way: a put decides what to write from
//! what it reads, and damaged bytes read there would be written back as if committed.
//!
//! A read goes through `&Pool`, so it cannot rebuild: a page that fails is refused with
//! [`HeapError::Damaged`] (never its bytes), and a caller with the pool to itself rebuilds
//! it with [`Pool::verify`] and reads again ([`crate::kv::Kv::get_healing`] does).

use std::sync::atomic::Ordering;
use std::time::Duration;

use bitmend_media::pmem::Region;

use super::read_checker::ReadCheck;
use super::{LINE, PAGE};
use crate::pool::Pool;
use crate::HeapError;

impl<R: Region> Pool<R> {
    /// How reads check the pages they read (a pool that heals; others have nothing to
    /// check against).
    pub fn set_read_check(&mut self, mode: ReadCheck) {
        self.reads.set_mode(mode);
    }

    /// Pages signed by read checks since the pool was opened (a pool without line checks).
    pub fn read_checks(&self) -> u64 {
        self.reads.checks.load(Ordering::Relaxed)
    }

    /// Lines checked by read checks since the pool was opened (a pool with line checks).
    pub fn read_lines_checked(&self) -> u64 {
        self.reads.lines.load(Ordering::Relaxed)
    }

    /// From now on (`on`), notes the lines each read check compares, for
    /// [`Pool::take_checked_lines`]: what a strategy checked can then be checked again with
    /// nothing else around it ([`Pool::lines_match`]), the floor of its cost. Off, a check
    /// pays one branch for it.
    pub fn note_checked_lines(&mut self, on: bool) {
        self.reads.noted = on.then(|| std::sync::Mutex::new(Vec::new()));
    }

    /// The runs of lines the read checks compared since the last call, in order: (first
    /// byte, bytes), whole lines. Empty unless [`Pool::note_checked_lines`] is on.
    pub fn take_checked_lines(&self) -> Vec<(u64, u64)> {
        let Some(noted) = &self.reads.noted else { return Vec::new() };
        let runs = std::mem::take(&mut *noted.lock().unwrap_or_else(|e| e.into_inner()));
        runs.iter().map(|&r| ((r >> 24) * LINE, (r & 0xFF_FFFF) * LINE)).collect()
    }

    /// Whether the lines under `[at, at + len)` match their checks: what a read check
    /// compares, without its clock, stamps or counts (true in a pool without line checks).
    pub fn lines_match(&self, at: u64, len: u64) -> bool {
        let region = self.log.region();
        let Some(shield) = region.shield.as_ref() else { return true };
        let geo = shield.geo;
        // Only the data pages have checks.
        let lo = (at & !(LINE - 1)).max(geo.base);
        let hi = (at + len.max(1)).next_multiple_of(LINE).min(geo.limit());
        // Page by page: the checks of two pages need not be next to each other.
        let mut from = lo;
        while from < hi {
            let Some(p) = geo.page_of(from) else { return true };
            let to = hi.min(geo.page_at(p) + PAGE);
            if !shield.lines_match(region.bytes(), from as usize, to as usize) {
                return false;
            }
            from = to;
        }
        true
    }

    /// Checks the pages under `[at, at + len)` that the read strategy says are due: the
    /// read's bytes are returned only if they pass.
    pub(crate) fn check_read(&self, at: u64, len: u64) -> Result<(), HeapError> {
        self.check_spans(at, &[(0, len as usize)], false)
    }

    /// Checks every page under `[at, at + len)`, whatever the read strategy: a transaction
    /// decides what to write from what it reads, and damaged bytes read there would be
    /// written back as if committed (and the damage then lost to the scrubber for good).
    pub(crate) fn check_tx_read(&self, at: u64, len: u64) -> Result<(), HeapError> {
        self.check_spans(at, &[(0, len as usize)], true)
    }

    /// Checks, as [`Pool::check_read`] does, the parts of the object at `p` that a search
    /// read: `(offset, length)` pairs.
    pub(crate) fn check_parts(&self, p: crate::Ptr, parts: &[(usize, usize)]) -> Result<(), HeapError> {
        if self.reads.mode == ReadCheck::Background {
            return Ok(());
        }
        // With the block's header, whose length bounded the search: one read. On the stack
        // for a search's few parts (an allocation per node cost a tenth of a get).
        let header = crate::layout::BLOCK_HEADER as usize;
        let end = parts.iter().fold(0, |end, &(off, len)| end.max(off + len.max(1)));
        if self.within_interval(p.header(), p.0 + end as u64) {
            return Ok(());
        }
        let shifted = |&(off, len): &(usize, usize)| (off + header, len);
        let mut few = [(0, header); 32];
        if parts.len() < few.len() {
            few[1..].iter_mut().zip(parts).for_each(|(to, part)| *to = shifted(part));
            return self.check_due(p.header(), &few[..=parts.len()], false);
        }
        let all: Vec<_> = std::iter::once((0, header)).chain(parts.iter().map(shifted)).collect();
        self.check_due(p.header(), &all, false)
    }

    /// Checks the `parts` of the object at `p` a transaction's search read, always (see
    /// [`Pool::check_tx_read`]): a few lines of a node, not its pages.
    pub(crate) fn check_tx_parts(&self, p: crate::Ptr, parts: &[(usize, usize)]) -> Result<(), HeapError> {
        self.check_spans(p.0, parts, true)
    }

    /// Checks `parts` (`(offset, len)` from `base`) as one read, as the strategy says.
    pub(crate) fn check_parts_from(&self, base: u64, parts: &[(usize, usize)]) -> Result<(), HeapError> {
        self.check_spans(base, parts, false)
    }

    /// Whether a read of `[lo, hi)` under LC finds every page it spans checked within the
    /// interval, as nearly every read does: it then checks and stamps nothing, and costs a
    /// clock read and a stamp per page, nothing per part.
    fn within_interval(&self, lo: u64, hi: u64) -> bool {
        let r = &self.reads;
        if !matches!(r.mode, ReadCheck::AfterCheck(_)) {
            return false;
        }
        let Some(shield) = self.log.region().shield.as_ref() else { return true };
        let geo = shield.geo;
        let (Some(first), Some(last)) = (geo.page_of(lo), geo.page_of(hi.saturating_sub(1))) else {
            return false;
        };
        let now = r.now();
        (first..=last).all(|p| !r.due(p as usize, now))
    }

    /// Checks the bytes of `parts` (`(offset, len)` from `base`, one read's) on the pages
    /// that are due. Which pages are due is decided once for the whole read, page by page in
    /// order, before any is stamped, so that the read's later parts on a page are checked
    /// with its first. A read whose pages are all within their interval (nearly every read
    /// under LC and LU) costs a clock read and a stamp per page, nothing per part. `always`:
    /// every page is due (a transaction's read), and none is stamped.
    fn check_spans(&self, base: u64, parts: &[(usize, usize)], always: bool) -> Result<(), HeapError> {
        if self.reads.mode == ReadCheck::Background && !always {
            return Ok(());
        }
        if !always {
            let (lo, hi) = span_of(base, parts);
            if self.within_interval(lo, hi) {
                return Ok(());
            }
        }
        self.check_due(base, parts, always)
    }

    /// [`check_spans`](Self::check_spans) once the read is known not to be within its
    /// interval (the caller asked): the due pages checked and stamped.
    fn check_due(&self, base: u64, parts: &[(usize, usize)], always: bool) -> Result<(), HeapError> {
        let r = &self.reads;
        let Some(shield) = self.log.region().shield.as_ref() else {
            return Ok(());
        };
        let geo = shield.geo;
        let (lo, hi) = span_of(base, parts);
        let (Some(first), Some(last)) = (geo.page_of(lo), geo.page_of(hi.saturating_sub(1))) else {
            return Ok(());
        };
        let now = r.now();
        let touches = |p: u64| {
            let (start, end) = (geo.page_at(p), geo.page_at(p) + PAGE);
            parts
                .iter()
                .any(|&(off, len)| base + (off as u64) < end && base + (off + len.max(1)) as u64 > start)
        };
        // The due pages, a batch at a time (a node spans at most three pages).
        let mut due = [0u64; 8];
        let mut n = 0;
        for p in first..=last {
            if !touches(p) || !(always || r.due(p as usize, now)) {
                continue;
            }
            due[n] = p;
            n += 1;
            if n == due.len() {
                self.check_pages(&due[..n], base, parts)?;
                if !always {
                    due[..n].iter().for_each(|&p| r.passed(p as usize, now));
                }
                n = 0;
            }
        }
        if n > 0 {
            self.check_pages(&due[..n], base, parts)?;
            if !always {
                due[..n].iter().for_each(|&p| r.passed(p as usize, now));
            }
        }
        Ok(())
    }

    /// Checks the parts (from `base`) on pages `due`: their lines against their checks
    /// (version 6), a few ns a line where signing the page reads all of it; else each page
    /// against its signature.
    fn check_pages(&self, due: &[u64], base: u64, parts: &[(usize, usize)]) -> Result<(), HeapError> {
        let r = &self.reads;
        let region = self.log.region();
        let shield = region.shield.as_ref().expect("a pool that heals");
        let geo = shield.geo;
        // The page that failed, for the caller to rebuild ([`Pool::verify`]).
        let refuse = |p: u64| Err(HeapError::Damaged { at: geo.page_at(p), len: PAGE, pages: vec![p] });
        // Counted here, added once: a locked add per part would cost more than its check.
        let mut lines = 0;
        let mut result = Ok(());
        'pages: for &p in due {
            if geo.checks_at.is_none() {
                r.checks.fetch_add(1, Ordering::Relaxed);
                if !region.page_sound(p) {
                    result = refuse(p);
                    break;
                }
                continue;
            }
            let page = geo.page_at(p);
            for &(off, len) in parts {
                let at = base + off as u64;
                let lo = at.max(page) & !(LINE - 1);
                let hi = (at + len.max(1) as u64).min(page + PAGE).next_multiple_of(LINE);
                if lo >= hi {
                    continue;
                }
                lines += (hi - lo) / LINE;
                if let Some(noted) = &r.noted {
                    let run = ((lo / LINE) << 24) | ((hi - lo) / LINE);
                    noted.lock().unwrap_or_else(|e| e.into_inner()).push(run);
                }
                if !shield.lines_match(region.bytes(), lo as usize, hi as usize) {
                    result = refuse(p);
                    break 'pages;
                }
            }
        }
        if lines > 0 {
            r.lines.fetch_add(lines, Ordering::Relaxed);
        }
        result
    }
}

/// One tick, as Loris measures its strategies: a MINIX 3 clock tick, 1/60 s (Loris section
/// VI: "a MINIX 3 clock tick (1/60th of a second)"). Its target is LC at one tick.
pub const TICK: Duration = Duration::from_micros(16_667);

/// The bytes `[lo, hi)` that `parts` (`(offset, len)` from `base`) span, an empty part
/// counted as a byte.
fn span_of(base: u64, parts: &[(usize, usize)]) -> (u64, u64) {
    parts.iter().fold((u64::MAX, 0), |(lo, hi), &(off, len)| {
        (lo.min(base + off as u64), hi.max(base + (off + len.max(1)) as u64))
    })
}
