//! Before recovery after a crash: damage made while the pool was down is found by the line
//! checks and rebuilt, line by line, before recovery stores anything or recomputes parity
//! and signatures from the bytes (which would take the damage in).
//!
//! The lines the journal names (its undo ranges, its commits' ranges, its allocations, the
//! linked headers and slots) are *suspect*: a crash may have torn their patches, so neither
//! their checks nor the parity at their offsets can be trusted. Every other line of their
//! stripes was patched and fenced before the crash, so a line that fails its check there is
//! damage, and the stripe's parity at its offset rebuilds it. A damaged line at an offset
//! where a stripe member is suspect cannot be rebuilt (the parity there is of unknown age):
//! its page keeps the signature it had, so that it reads as damaged and is never taken in.
//!
//! The last commit is special: its writes shared their fence with its record, and a range
//! that does not match the record's CRC makes recovery roll it back as torn. Damage made
//! after that fence returned would roll back an acknowledged transaction; so the lines of
//! its ranges that fail their checks are rebuilt from parity first, and kept only if the
//! record's CRC then matches (the fence returned: every patch was durable).

use std::collections::{BTreeMap, BTreeSet};

use bitmend_media::pmem::{Region, RegionError};

use super::{Healed, Shield, LINE, PAGE};

const LINES: usize = (PAGE / LINE) as usize;
/// Bytes of a block header, at the start of its line (blocks are whole lines).
const HEADER: usize = crate::layout::BLOCK_HEADER as usize;

/// What [`Healed::mend_around`] and [`Healed::mend_written`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mend {
    /// Lines that failed their checks and were rebuilt from their stripes.
    pub lines_rebuilt: u64,
    /// Line checks found wrong over good lines, rewritten.
    pub checks_rewritten: u64,
    /// Block headers that an earlier recovery, cut short, left torn: put back as they were
    /// before it (recovery settles them again).
    pub headers_torn: u64,
    /// Data pages with damage that could not be rebuilt: they keep their signatures, and
    /// read as damaged.
    pub pages_beyond: Vec<u64>,
}

/// A line of a stripe: the member's index and the line's number in its page.
type Line = (usize, usize);

/// The ranges [`Healed::mend_around`] works with.
pub(crate) struct MendRanges<'a> {
    /// What recovery will recompute: the stripes to look at.
    pub recomputed: &'a [(u64, u64)],
    /// Stores whose patches a crash may have torn: neither rebuilt nor taken for damage.
    pub suspect: &'a [(u64, u64)],
    /// Headers recovery rewrites: rebuilt if they can be, else left to recovery.
    pub settled: &'a [(u64, u64)],
}

/// A stripe's lines of [`MendRanges::suspect`] and [`MendRanges::settled`].
struct Suspect {
    torn: BTreeSet<Line>,
    settled: BTreeSet<Line>,
}

impl<R: Region> Healed<R> {
    /// Whether the pool has line checks to mend by (version 6).
    pub(crate) fn can_mend(&self) -> bool {
        self.shield.as_ref().is_some_and(|s| s.geo.checks_at.is_some() && s.codec.is_some())
    }

    /// Rebuilds the damaged lines of the stripes that `recomputed` (the ranges recovery
    /// will recompute) touches, outside the `suspect` lines (see the module docs). A line of
    /// `settled` (a header recovery rewrites, which an earlier recovery cut short may have
    /// torn) is rebuilt if its stripe can, and else left to recovery. Pages left damaged
    /// keep their signatures through the recompute.
    pub(crate) fn mend_around(&mut self, ranges: MendRanges) -> Result<Mend, RegionError> {
        let mut mend = Mend::default();
        if !self.can_mend() {
            return Ok(mend);
        }
        let mut suspect = self.lines_of(ranges.suspect);
        let mut settled = self.lines_of(ranges.settled);
        for stripe in self.lines_of(ranges.recomputed).into_keys() {
            let lines = Suspect {
                torn: suspect.remove(&stripe).unwrap_or_default(),
                settled: settled.remove(&stripe).unwrap_or_default(),
            };
            self.mend_stripe(stripe, &lines, &mut mend)?;
        }
        let shield = self.shield.as_mut().expect("protected");
        shield.keep_sigs.extend(mend.pages_beyond.iter().copied());
        Ok(mend)
    }

    /// The lines of `ranges`, by stripe.
    fn lines_of(&self, ranges: &[(u64, u64)]) -> BTreeMap<u64, BTreeSet<Line>> {
        let geo = self.shield.as_ref().expect("protected").geo;
        let mut by_stripe: BTreeMap<u64, BTreeSet<Line>> = BTreeMap::new();
        for &(at, len) in ranges {
            let Some((start, end)) = self.protected(at as usize, len as usize) else { continue };
            for line in (start & !63..end).step_by(LINE as usize) {
                let p = geo.page_of(line as u64).expect("a protected byte");
                let (stripe, index) = geo.locate(p);
                let n = (line as u64 - geo.page_at(p)) / LINE;
                by_stripe.entry(stripe).or_default().insert((index, n as usize));
            }
        }
        by_stripe
    }

    fn mend_stripe(&mut self, stripe: u64, suspect: &Suspect, mend: &mut Mend) -> Result<(), RegionError> {
        let torn_at: BTreeSet<usize> = suspect.torn.iter().map(|&(_, n)| n).collect();
        let k = self.shield.as_ref().expect("protected").geo.shape.k as usize;
        let lines = (0..k).flat_map(|i| (0..LINES).map(move |n| (i, n)));
        let damaged = self.failing_lines(stripe, lines.filter(|l| !suspect.torn.contains(l)));
        for (n, lost) in damaged {
            let shield = self.shield.as_ref().expect("protected");
            let rebuilt = match torn_at.contains(&n) {
                true => None,
                false => shield.rebuild_lines(&self.inner, stripe, n, &lost),
            };
            let Some(rebuilt) = rebuilt else {
                let beyond = lost.iter().filter(|&&i| !suspect.settled.contains(&(i, n)));
                mend.pages_beyond.extend(beyond.filter_map(|&i| shield.geo.member(stripe, i)));
                continue;
            };
            for (&i, line) in lost.iter().zip(&rebuilt) {
                let header = suspect.settled.contains(&(i, n));
                self.store_line(stripe, (i, n), line, header, mend)?;
            }
        }
        mend.pages_beyond.sort_unstable();
        mend.pages_beyond.dedup();
        Ok(())
    }

    /// The lines of `lines` in `stripe` that fail their checks, by line number: the members
    /// whose line it is.
    fn failing_lines(&self, stripe: u64, lines: impl Iterator<Item = Line>) -> BTreeMap<usize, Vec<usize>> {
        let shield = self.shield.as_ref().expect("protected");
        let mut failing: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, n) in lines {
            let Some(at) = shield.line_at(stripe, (i, n)) else { continue };
            if !shield.lines_match(self.inner.bytes(), at, at + LINE as usize) {
                failing.entry(n).or_default().push(i);
            }
        }
        failing
    }

    /// Writes rebuilt line `n` of member `i`, raw (the parity already holds it), or its
    /// check if the line was good and its check was what was damaged. A settled `header`
    /// line (a block header in its first 16 bytes) that differs in the header alone was
    /// most likely torn by a recovery cut short, which the one to come redoes: not damage.
    fn store_line(
        &mut self,
        stripe: u64,
        (i, n): Line,
        line: &[u8; 64],
        header: bool,
        mend: &mut Mend,
    ) -> Result<(), RegionError> {
        let shield = self.shield.as_mut().expect("protected");
        let at = shield.line_at(stripe, (i, n)).expect("a member's line");
        let now = &self.inner.bytes()[at..at + LINE as usize];
        if now == line {
            mend.checks_rewritten += 1;
        } else {
            match header && now[HEADER..] == line[HEADER..] {
                true => mend.headers_torn += 1,
                false => mend.lines_rebuilt += 1,
            }
            self.inner.write(at, line)?;
            self.inner.flush(at, LINE as usize)?;
        }
        shield.set_checks(&mut self.inner, at, at + LINE as usize)
    }

    /// The lines of `ranges` that fail their checks, rebuilt from their stripes, kept if
    /// `holds` then accepts the bytes (the last commit's CRC), else put back as they were.
    /// How many lines were kept.
    pub(crate) fn mend_written(
        &mut self,
        ranges: &[(u64, u64)],
        holds: impl Fn(&[u8]) -> bool,
    ) -> Result<u64, RegionError> {
        if !self.can_mend() || holds(self.inner.bytes()) {
            return Ok(0);
        }
        let mut candidates = Vec::new();
        for (stripe, lines) in self.lines_of(ranges) {
            let lost = self.failing_lines(stripe, lines.into_iter());
            let shield = self.shield.as_ref().expect("protected");
            for (n, lost) in lost {
                let Some(rebuilt) = shield.rebuild_lines(&self.inner, stripe, n, &lost) else { continue };
                for (i, line) in lost.into_iter().zip(rebuilt) {
                    candidates.push((shield.line_at(stripe, (i, n)).expect("a member's line"), line));
                }
            }
        }
        let old: Vec<Vec<u8>> =
            candidates.iter().map(|(at, _)| self.inner.bytes()[*at..*at + LINE as usize].to_vec()).collect();
        for (at, line) in &candidates {
            self.inner.write(*at, line)?;
        }
        if !holds(self.inner.bytes()) {
            for ((at, _), bytes) in candidates.iter().zip(&old) {
                self.inner.write(*at, bytes)?;
            }
            return Ok(0);
        }
        for (at, _) in &candidates {
            self.inner.flush(*at, LINE as usize)?;
        }
        Ok(candidates.len() as u64)
    }
}

impl Shield {
    /// Where line `n` of `stripe`'s member `i` is (none past the last data page).
    fn line_at(&self, stripe: u64, (i, n): Line) -> Option<usize> {
        Some(self.geo.page_at(self.geo.member(stripe, i)?) as usize + n * LINE as usize)
    }

    /// Line `n` of `stripe`'s members `lost`, rebuilt from the other members' and the
    /// parity's lines `n`, each matching its check. A parity line has no check of its own:
    /// each choice of parity lines to leave out is tried while the erasures fit in m.
    fn rebuild_lines<R: Region>(
        &self,
        inner: &R,
        stripe: u64,
        n: usize,
        lost: &[usize],
    ) -> Option<Vec<[u8; 64]>> {
        let codec = self.codec.as_ref()?;
        let (k, m) = (self.geo.shape.k as usize, self.geo.shape.m as usize);
        let bytes = inner.bytes();
        let off = n * LINE as usize;
        let line_of = |c: usize| -> [u8; 64] {
            let at = match c {
                c if c < k => self.line_at(stripe, (c, n)),
                c => Some(self.geo.parity_page(stripe, c - k) as usize + off),
            };
            at.map_or([0; 64], |at| bytes[at..at + 64].try_into().expect("a line"))
        };
        let mut masks: Vec<u32> =
            (0..1u32 << m).filter(|s| lost.len() + s.count_ones() as usize <= m).collect();
        masks.sort_by_key(|s| s.count_ones());
        for mask in masks {
            let mut chunks: Vec<[u8; 64]> = (0..k + m).map(line_of).collect();
            let mut erased = lost.to_vec();
            erased.extend((0..m).filter(|j| mask & (1 << j) != 0).map(|j| k + j));
            let mut refs: Vec<&mut [u8]> = chunks.iter_mut().map(|c| c.as_mut_slice()).collect();
            codec.reconstruct(&mut refs, &erased).ok()?;
            let sound = lost.iter().all(|&i| {
                let at = self.line_at(stripe, (i, n)).expect("a member's line");
                self.check_matches(bytes, at, &chunks[i])
            });
            if sound {
                return Some(lost.iter().map(|&i| chunks[i]).collect());
            }
        }
        None
    }
}
