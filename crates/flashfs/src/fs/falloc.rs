//! fallocate: space reserved ahead of writes, and ranges punched out or zeroed.
//!
//! A log-structured file system places nothing in advance: every write goes to the head of
//! the log. What `fallocate` (and glibc's `posix_fallocate`, which otherwise writes zeros
//! until the chip is full) promises is that later writes to the range will not fail for lack
//! of space, and that is a reservation under the space budget: each page of the range that
//! is a hole is counted as a dirty page would be until a write to it takes the reservation
//! over. Reservations live while the file system is mounted; a remount keeps the size that
//! mode 0 set but not the reservation. Punching a hole drops the pages' index entries (and
//! any reservation), with a punch node in the log so that replay drops them too.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use bitmend_media::nand::Nand;

use super::write::Out;
use super::Ino;
use super::{now, Fs, LOGICAL_PAGE};
use crate::fs::node::{self, FileType, NodeKind};
use crate::FsError;
use crate::PosixError;

/// What `fallocate` does (Linux's mode bits 0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE,
/// FALLOC_FL_ZERO_RANGE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Falloc {
    /// Reserve space for the holes of the range; grow the file to its end unless
    /// `keep_size`.
    Reserve { keep_size: bool },
    /// Make the range a hole (the size stays).
    PunchHole,
    /// Make the range read as zeros and reserve space for it; grow the file to its end unless
    /// `keep_size`.
    ZeroRange { keep_size: bool },
}

/// Pages reserved by `fallocate`, per file, as disjoint ranges [start, end) keyed by start.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    by_ino: HashMap<u64, BTreeMap<u64, u64>>,
    /// Pages reserved in all.
    pages: u64,
}

impl Reservations {
    /// Pages reserved in all.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Reserved pages of `ino` in `r`.
    pub fn count(&self, ino: u64, r: Range<u64>) -> u64 {
        let Some(ranges) = self.by_ino.get(&ino) else { return 0 };
        ranges
            .range(..r.end)
            .rev()
            .take_while(|(_, &e)| e > r.start)
            .map(|(&s, &e)| e.min(r.end) - s.max(r.start))
            .sum()
    }

    /// Drops the reservations of `ino` in `r`; returns how many pages they held.
    pub fn take(&mut self, ino: u64, r: Range<u64>) -> u64 {
        let Some(ranges) = self.by_ino.get_mut(&ino) else { return 0 };
        let hit: Vec<(u64, u64)> =
            ranges.range(..r.end).rev().take_while(|(_, &e)| e > r.start).map(|(&s, &e)| (s, e)).collect();
        let mut taken = 0;
        for (s, e) in hit {
            ranges.remove(&s);
            taken += e.min(r.end) - s.max(r.start);
            if s < r.start {
                ranges.insert(s, r.start);
            }
            if e > r.end {
                ranges.insert(r.end, e);
            }
        }
        if ranges.is_empty() {
            self.by_ino.remove(&ino);
        }
        self.pages -= taken;
        taken
    }

    /// Reserves `r` for `ino` (pages in it must not be reserved already).
    fn add(&mut self, ino: u64, r: Range<u64>) {
        debug_assert_eq!(self.count(ino, r.clone()), 0);
        let ranges = self.by_ino.entry(ino).or_default();
        let (mut start, mut end) = (r.start, r.end);
        // Merge with the ranges that touch it on either side.
        if let Some((&s, &e)) = ranges.range(..start).next_back() {
            if e == start {
                ranges.remove(&s);
                start = s;
            }
        }
        if let Some(e) = ranges.remove(&end) {
            end = e;
        }
        ranges.insert(start, end);
        self.pages += r.end - r.start;
    }
}

impl<N: Nand> Fs<N> {
    /// Allocates, punches or zeroes `len` bytes at `off` of regular file `ino`.
    pub fn fallocate(&mut self, ino: Ino, off: u64, len: u64, how: Falloc) -> Result<(), FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        self.need_file_maps(ino)?;
        match self.inode(ino)?.attr.kind {
            FileType::File => {}
            FileType::Dir => return Err(PosixError::IsDir.into()),
            _ => {
                return Err(
                    PosixError::Unsupported { why: "fallocate of a file that is not regular".into() }.into()
                )
            }
        }
        let Some(end) = off.checked_add(len).filter(|_| len > 0) else {
            return Err(PosixError::Invalid {
                why: "fallocate of an empty range, or past the largest offset".into(),
            }
            .into());
        };
        let page = LOGICAL_PAGE as u64;
        match how {
            Falloc::Reserve { keep_size } => {
                self.reserve_range(ino, off / page..end.div_ceil(page))?;
                self.grow_to(ino, end, keep_size)
            }
            Falloc::PunchHole => self.punch(ino, off, end),
            Falloc::ZeroRange { keep_size } => {
                self.punch(ino, off, end)?;
                self.reserve_range(ino, off / page..end.div_ceil(page))?;
                self.grow_to(ino, end, keep_size)
            }
        }
    }

    /// Reserves every page of `pages` of `ino` that is a hole (not written, not dirty, not
    /// reserved), or answers `NoSpace` and reserves nothing.
    fn reserve_range(&mut self, ino: u64, pages: Range<u64>) -> Result<(), FsError> {
        // Refused before looking page by page when even the written pages could not make
        // up the difference (a reservation of a TiB on a chip of a GiB).
        let (_, free) = self.space();
        let at_least =
            (pages.end - pages.start).saturating_sub(self.index.totals().pages + self.wb.len() as u64);
        if at_least.saturating_mul(self.page_cost()) > free {
            return Err(FsError::NoSpace);
        }
        let mut holes: Vec<Range<u64>> = Vec::new();
        for i in pages {
            let hole = !self.wb.contains((ino, i))
                && self.reserved.count(ino, i..i + 1) == 0
                && self.loc(ino, i)?.is_none();
            match holes.last_mut() {
                Some(r) if hole && r.end == i => r.end += 1,
                _ if hole => holes.push(i..i + 1),
                _ => {}
            }
        }
        let need: u64 = holes.iter().map(|r| r.end - r.start).sum();
        self.reserve(need, 0)?;
        for r in holes {
            self.reserved.add(ino, r);
        }
        Ok(())
    }

    /// Grows `ino` to `end` bytes (unless `keep_size`), as a write there would.
    fn grow_to(&mut self, ino: u64, end: u64, keep_size: bool) -> Result<(), FsError> {
        let t = now();
        let size = self.inode(ino)?.attr.size;
        if !keep_size && end > size {
            self.ns.set_size(ino, end);
            self.ns.touch(ino, t);
        } else {
            self.ns.set_ctime(ino, t);
        }
        self.wb.mark_inode(ino);
        self.wb.note_unsynced();
        self.tier_inode(ino)
    }

    /// Makes bytes `off..end` of `ino` (within its size) read as zeros: whole pages leave the
    /// index (a punch node tells replay), the pages at either edge are rewritten in part.
    fn punch(&mut self, ino: u64, off: u64, end: u64) -> Result<(), FsError> {
        let size = self.inode(ino)?.attr.size;
        let end = end.min(size);
        if off >= end {
            return Ok(());
        }
        let page = LOGICAL_PAGE as u64;
        let whole = off.div_ceil(page)..end / page;
        // The edges first: a write, which may be refused for space before anything changed.
        if !off.is_multiple_of(page) {
            let to = end.min(whole.start * page);
            self.write(Ino(ino), off, &vec![0u8; (to - off) as usize])?;
        }
        if !end.is_multiple_of(page) && (off.is_multiple_of(page) || end / page != off / page) {
            let from = off.max(end / page * page);
            self.write(Ino(ino), from, &vec![0u8; (end - from) as usize])?;
        }
        if whole.start < whole.end {
            self.remove_range(ino, whole.clone(), None)?;
            self.wb.drop_pages(ino, whole.clone());
            self.tier_drop(ino, whole.clone())?;
            for i in whole.clone() {
                self.cache.forget((ino, i));
            }
            self.reserved.take(ino, whole.clone());
            let punch = Out {
                kind: NodeKind::Punch,
                key: ino,
                key2: whole.start,
                payload: node::encode_punch(whole.end),
            };
            self.commit(vec![punch])?;
        }
        self.ns.touch(ino, now());
        self.wb.mark_inode(ino);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_split_merge_and_count() {
        let mut r = Reservations::default();
        r.add(1, 10..20);
        r.add(1, 20..30);
        r.add(1, 40..50);
        r.add(2, 0..5);
        assert_eq!((r.pages, r.count(1, 0..100), r.count(1, 15..45)), (35, 30, 20));
        assert_eq!(r.by_ino[&1].len(), 2, "10..20 and 20..30 merged");
        assert_eq!(r.take(1, 25..42), 7);
        assert_eq!((r.count(1, 0..100), r.count(1, 25..40), r.pages), (23, 0, 28));
        assert_eq!(r.take(1, 0..u64::MAX), 23);
        assert_eq!((r.pages, r.count(2, 0..5)), (5, 5));
        assert!(!r.by_ino.contains_key(&1));
        r.add(1, 25..40);
        assert_eq!(r.take(1, 30..31), 1);
        assert_eq!((r.count(1, 25..40), r.by_ino[&1].len()), (14, 2));
    }
}
