//! The cleaner: LFS-style, it empties old segments so they can be erased and written again.
//!
//! Segments older than the checkpoint a mount would start from hold no metadata that matters
//! (the checkpoint has it all) and only the file data the index still points at. The cleaner
//! picks among them by cost-benefit (Rosenblum and Ousterhout): free space gained times the
//! segment's age, over the cost of reading it and writing its live data back. It moves the
//! live data (rewritten as new nodes), makes that durable, and erases the segment. When no
//! segment is old enough, it writes a checkpoint and starts a new segment, which makes every
//! older one eligible.

use std::collections::HashSet;

use bitmend_media::nand::Nand;

mod step;

use super::Fs;
use crate::store::Segment;
use crate::Corruption;
use crate::FsError;

/// Free segments below which the cleaner runs (room to move a segment's data and write a
/// checkpoint), for a checkpoint of a page; [`Fs::cleaner_reserve`] adds the checkpoint.
pub(crate) const RESERVE: usize = 3;
/// Erases by which a segment may lag the most worn one before the cleaner moves its data
/// for wear's sake alone.
const WEAR_GAP: u32 = 8;
/// How much more live (as a fraction of a segment) than the emptiest candidate a victim
/// may be.
const NEAR_EMPTIEST: f64 = 0.1;
/// Segments a run of the cleaner frees beyond its reserve when it can: each run writes a
/// checkpoint (the segments written since the last become victims only after one), so a
/// run that stops at the reserve puts a checkpoint in every few operations near full.
const CLEAN_PAST_RESERVE: usize = 2;

/// The cleaner's own state.
#[derive(Debug, Default)]
pub(crate) struct CleanerState {
    /// The cleaner is running (its own writes must not start it again).
    running: bool,
    /// Where the cleaner last stopped short of its reserve: free segments, and the bytes
    /// committed then (see `Fs::maybe_clean`).
    stalled: Option<(usize, u64)>,
    /// Segments the cleaner must not erase: they hold a live page beyond repair (cleared at
    /// each checkpoint, when they are tried again).
    pinned: HashSet<u32>,
    /// The mount's background cleaner, a step at a time (`step.rs`).
    background: step::BackgroundCleaner,
}

impl CleanerState {
    /// The cleaner is running (a checkpoint it writes is its own).
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// At a checkpoint: pinned segments are tried again.
    pub fn unpin_all(&mut self) {
        self.pinned.clear();
    }
}

impl<N: Nand> Fs<N> {
    /// Free segments the cleaner keeps for itself: [`RESERVE`], and a segment more per
    /// quarter of a segment the checkpoint takes. A pass writes a checkpoint and must free
    /// more than that: with tens of thousands of files a checkpoint is a third of a segment,
    /// and a pass that could afford one victim two-thirds live freed nothing.
    pub(crate) fn cleaner_reserve(&self) -> usize {
        RESERVE + (4.0 * self.checkpoint_segments()) as usize
    }

    /// The segments a checkpoint takes (a fraction, mostly).
    fn checkpoint_segments(&self) -> f64 {
        self.budget.checkpoint_bytes() as f64 / self.segment_capacity() as f64
    }

    pub(crate) fn maybe_clean(&mut self) -> Result<(), FsError> {
        let reserve = self.cleaner_reserve();
        let free = self.store.free_segments();
        if self.cleaner.running || free >= reserve {
            return Ok(());
        }
        // The cleaner stopped short of its reserve at this many free segments, and nothing
        // was freed since: running it again after every operation would redo the same work
        // for nothing (near full, each create + fsync cost seconds). It runs again once a
        // segment more is used, or once space was freed.
        if self.cleaner.stalled.is_some_and(|(at, committed)| free >= at && self.committed() >= committed) {
            return Ok(());
        }
        self.cleaner.running = true;
        self.stats.cleaner_runs += 1;
        let r = self.clean_until(reserve + CLEAN_PAST_RESERVE);
        self.cleaner.running = false;
        let free = self.store.free_segments();
        self.cleaner.stalled = (free < reserve).then(|| (free, self.committed()));
        r
    }

    /// At mount: segments the cleaner released after the checkpoint whose table the store
    /// adopted are in that table still. With too few free, the first writes (a recovery's)
    /// would leave the cleaner none to move data into: those found erased are free again.
    pub(crate) fn reclaim_if_short(&mut self, report: &mut crate::StoreMountReport) -> Result<(), FsError> {
        if self.store.free_segments() < self.cleaner_reserve() {
            self.store.reclaim_erased(report)?;
        }
        Ok(())
    }

    /// Segments the cleaner may empty: older than the mount checkpoint's segment, not live.
    pub(super) fn candidates(&self) -> Vec<Segment> {
        let Some(m) = self.cp.mount_from() else { return vec![] };
        let live = self.store.live_segment().map(|l| l.physical);
        self.store
            .used_segments()
            .into_iter()
            .filter(|u| {
                u.logical < m.segment
                    && Some(u.physical) != live
                    && !self.cleaner.pinned.contains(&u.physical)
            })
            .collect()
    }

    /// Candidates worth emptying, best first: (cost-benefit, physical segment, fraction live).
    /// None when every candidate is full of live data (moving one would free nothing).
    pub(super) fn ranked_victims(&self, cands: &[Segment]) -> Vec<(f64, u32, f64)> {
        let live = self.index.usage_table();
        let capacity = self.segment_capacity() as f64;
        let newest = self.store.used_segments().iter().map(|u| u.logical).max().unwrap_or(0);
        let mut ranked: Vec<(f64, u32, f64)> = cands
            .iter()
            .map(|c| {
                let u = (*live.get(&c.physical).unwrap_or(&0) as f64 / capacity).min(1.0);
                let age = (newest - c.logical + 1) as f64;
                ((1.0 - u) * age / (1.0 + u), c.physical, u)
            })
            .filter(|r| r.0 > 0.0)
            .collect();
        // Cost-benefit among the emptiest only: left to itself it prefers an old segment
        // nine-tenths live to a young one two-thirds live, and near full, where each
        // victim must free more than moving it and the checkpoint after cost, that
        // frees nothing (the cleaner ran the chip out of segments under small-file
        // churn at 95% full). Within a tenth of the emptiest, age still decides.
        let emptiest = ranked.iter().map(|r| r.2).fold(1.0, f64::min);
        ranked.retain(|r| r.2 <= emptiest + NEAR_EMPTIEST);
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranked
    }

    /// Cleans until `want` segments are free or nothing more can be cleaned.
    fn clean_until(&mut self, want: usize) -> Result<(), FsError> {
        // A checkpoint makes the segments written since eligible; another is worth writing
        // only once a segment was freed since the last (else nothing more can be cleaned).
        let mut forced = false;
        let mut wear_moved = false;
        // Each pass frees a segment; a bound keeps a full file system from cleaning forever.
        let mut passes = 2 * self.store.segments() as usize;
        while self.store.free_segments() < want && passes > 0 {
            passes -= 1;
            let mut cands = self.candidates();
            if cands.is_empty() {
                if forced {
                    return Ok(());
                }
                // Make every segment before the live one eligible.
                self.checkpoint_for_mount()?;
                forced = true;
                cands = self.candidates();
                if cands.is_empty() {
                    return Ok(());
                }
            }
            let ranked = self.ranked_victims(&cands);
            if ranked.is_empty() {
                // Every candidate is full of live data: moving one would free nothing.
                return Ok(());
            }
            // The best victims whose live data fits in the free segments but one (at least
            // one victim), moved together under one sync.
            // Room for the checkpoint the pass may write, and the segment being written.
            let spare = 1.0 + self.checkpoint_segments();
            let budget = (self.store.free_segments() as f64 - spare).max(0.0);
            let mut victims = Vec::new();
            let mut load = 0.0;
            for &(_, phys, u) in &ranked {
                if !victims.is_empty() && load + u > budget {
                    break;
                }
                victims.push(phys);
                load += u;
            }
            // At most one move for wear per call: it frees nothing, the others must.
            if !wear_moved {
                if let Some(cold) = self.wear_victim(&cands)? {
                    wear_moved = true;
                    victims = vec![cold];
                }
            }
            if self.empty_segments(&victims)? > 0 {
                forced = false;
            }
        }
        Ok(())
    }

    /// Moves the live data of every segment written so far once, oldest first, as the cleaner
    /// would: data written with the fast compressor is stored again at
    /// [`FsOptions::lz4_level`](super::FsOptions), and segments holding only stale data are
    /// freed. Stops early if free segments fall to the cleaner's reserve. Returns how many
    /// segments it emptied.
    pub fn compact(&mut self) -> Result<usize, FsError> {
        if self.cleaner.running {
            return Ok(0);
        }
        self.flush_data()?;
        // The live segment too, when there are segments to spare for it: closed under a
        // checkpoint named by the next one, as `heal_segments` does. Then a checkpoint in the
        // new segment makes every older one a candidate.
        if self.store.free_segments() >= self.cleaner_reserve() + 2 {
            self.checkpoint()?;
            self.store.finish_segment()?;
            self.seal_forced_segment_info()?;
        }
        self.checkpoint_for_mount()?;
        let mut todo = self.candidates();
        todo.sort_by_key(|s| s.logical);
        self.cleaner.running = true;
        let mut emptied = 0;
        let mut result = Ok(());
        for seg in todo {
            if self.store.free_segments() <= self.cleaner_reserve() {
                break;
            }
            match self.empty_segment(seg.physical) {
                Ok(done) => emptied += done as usize,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.cleaner.running = false;
        result?;
        self.sync()?;
        Ok(emptied)
    }

    /// Moves the live data out of the segments in `damaged` (physical numbers; segments whose
    /// parity the scrubber found damaged) and erases them, so that the data is protected by
    /// fresh parity again. A segment too new for the cleaner is made eligible as the cleaner
    /// does when it runs out of candidates: a checkpoint, then a new segment naming it.
    /// Returns how many segments were healed.
    pub(crate) fn heal_segments(&mut self, damaged: &[u32]) -> Result<u64, FsError> {
        if damaged.is_empty() || self.cleaner.running {
            return Ok(0);
        }
        self.cleaner.running = true;
        let r = (|| {
            let eligible = |fs: &Self, phys: u32| fs.candidates().iter().any(|c| c.physical == phys);
            // Twice at most: the segment the first checkpoint lands in (the live one) is the
            // one mount would start from, so it becomes eligible only after a second.
            for _ in 0..2 {
                let waiting = damaged.iter().any(|&p| {
                    self.store.used_segments().iter().any(|u| u.physical == p) && !eligible(self, p)
                });
                // Finishing segments early spends free ones: not when the cleaner needs them.
                if !waiting || self.store.free_segments() < self.cleaner_reserve() + 2 {
                    break;
                }
                self.checkpoint()?;
                self.store.finish_segment()?;
                self.seal_forced_segment_info()?;
            }
            let mut healed = 0;
            for &phys in damaged {
                if eligible(self, phys) && self.empty_segment(phys)? {
                    healed += 1;
                }
            }
            Ok(healed)
        })();
        self.cleaner.running = false;
        r
    }

    /// Static wear leveling: a candidate whose blocks were erased [`WEAR_GAP`] times fewer
    /// than the most worn segment's holds cold data; moving it lets its blocks take their
    /// share of erases (cost-benefit alone never picks a segment full of live data).
    pub(super) fn wear_victim(&self, cands: &[Segment]) -> Result<Option<u32>, FsError> {
        let mut most = 0;
        for phys in 0..self.store.segments() {
            most = most.max(self.store.segment_wear(phys)?);
        }
        let mut coldest: Option<(u32, u32)> = None;
        for phys in cands.iter().map(|c| c.physical) {
            let w = self.store.segment_wear(phys)?;
            if w + WEAR_GAP < most && coldest.is_none_or(|c| w < c.0) {
                coldest = Some((w, phys));
            }
        }
        Ok(coldest.map(|c| c.1))
    }

    /// Writes a checkpoint and makes it the one mount starts from. Anchored, it is at once;
    /// otherwise (the chain is broken, mount scans and starts where the newest segment says)
    /// a new segment must name it, at the cost of the rest of the live one.
    pub(super) fn checkpoint_for_mount(&mut self) -> Result<(), FsError> {
        self.checkpoint()?;
        if self.store.anchored() {
            self.cp.newest_is_mount_start();
            Ok(())
        } else {
            self.store.finish_segment()?;
            self.seal_forced_segment_info()
        }
    }

    /// A page naming the newest checkpoint at the start of the segment just opened.
    fn seal_forced_segment_info(&mut self) -> Result<(), FsError> {
        if self.store.next_page_opens_segment() {
            let info = self.segment_info_page();
            self.store.append(&info)?;
            self.cp.newest_is_mount_start();
        }
        Ok(())
    }

    pub(crate) fn segment_capacity(&self) -> u64 {
        let l = &self.store.layout;
        (l.data_blocks() * l.max_group()) as u64 * l.g.page_size as u64
    }

    /// Moves the live data out of `phys`, makes the move durable, releases the segment.
    fn empty_segment(&mut self, phys: u32) -> Result<bool, FsError> {
        Ok(self.empty_segments(&[phys])? == 1)
    }

    /// Moves the live data out of each of `victims`, makes the moves durable with one sync
    /// (a sync closes a group with its parity: one per victim costs, on a nearly full chip,
    /// about what a victim frees), and releases every victim whose data all moved. A victim
    /// holding a map node that a checkpoint mount may start from refers to is released only
    /// after a newer checkpoint, which no longer does, is the one mount starts from. Returns
    /// how many were released.
    fn empty_segments(&mut self, victims: &[u32]) -> Result<usize, FsError> {
        let mut movable = Vec::new();
        let mut stuck = Vec::new();
        let mut maps_inside = false;
        for &phys in victims {
            let (readable, maps) = self.move_out(phys)?;
            maps_inside |= maps;
            if readable {
                movable.push(phys);
            } else {
                stuck.push(phys);
            }
        }
        if !maps_inside {
            self.flush_data()?;
        }
        self.release_moved(movable, stuck, maps_inside)
    }

    /// Releases the victims in `movable`, whose live data was moved (and written, unless
    /// `maps_inside`): made durable by a sync, or, when a victim holds a map node that
    /// matters, by a checkpoint mount starts from (a victim such a checkpoint still refers
    /// to is kept). Victims in `stuck` hold a page beyond repair: pinned until the next
    /// checkpoint. Returns how many were released.
    pub(super) fn release_moved(
        &mut self,
        mut movable: Vec<u32>,
        stuck: Vec<u32>,
        maps_inside: bool,
    ) -> Result<usize, FsError> {
        if maps_inside {
            self.checkpoint_for_mount()?;
            let held = self.map_holding_segments();
            movable.retain(|p| !held.contains(p));
        } else {
            if self.page.fill() > 0 {
                self.seal_page()?;
            }
            self.store.sync()?;
        }
        // Kept until the next checkpoint, when it is tried again (the file may be gone); not
        // cleared by the checkpoint just written.
        self.cleaner.pinned.extend(stuck);
        let refused = self.still_live(&movable);
        if !refused.is_empty() {
            movable.retain(|p| !refused.contains(p));
            self.stats.segments_refused += refused.len() as u64;
            self.cleaner.pinned.extend(refused);
        }
        for &phys in &movable {
            self.store.release_segment(phys)?;
            // Whatever is left counted there (a chunk dropped with its map beyond repair)
            // is not there any more.
            self.index.segment_erased(phys);
            self.stats.segments_cleaned += 1;
        }
        // Their pages will be written again: forget any copy of them.
        self.read_cache.forget_flash();
        Ok(movable.len())
    }

    /// Of `victims`, whose live data was moved and made durable, those that still hold some:
    /// what the usage table counts there beyond the map and group nodes is file data the
    /// index still names. Erasing one would lose it, so it is refused, whatever the move
    /// missed (a repair never leaves less readable than it found). Debug builds check the
    /// table against the whole index too.
    fn still_live(&mut self, victims: &[u32]) -> Vec<u32> {
        let mut live = Vec::new();
        for &phys in victims {
            let usage = self.index.usage(phys);
            // Most victims count nothing left; the map bytes (a walk of every map) only then.
            if usage > 0 && usage > self.map_bytes_in(phys) {
                live.push(phys);
                continue;
            }
            debug_assert_eq!(self.index_points_into(phys), Vec::<(u64, u64)>::new(), "segment {phys}");
        }
        live
    }

    /// Segments holding map or group nodes a checkpoint that mount may start from refers to.
    pub(super) fn map_holding_segments(&self) -> HashSet<u32> {
        let mut held = self.segments_named();
        held.extend(self.cp.map_segments());
        held
    }

    /// Marks the live data of `phys` dirty, so that the next flush writes it elsewhere, and
    /// the index chunks whose map node is there, so that the next checkpoint does. Returns
    /// whether every live page could be read, and whether a map node that matters is there.
    pub(super) fn move_out(&mut self, phys: u32) -> Result<(bool, bool), FsError> {
        if !self.store.used_segments().iter().any(|u| u.physical == phys) {
            return Ok((true, false));
        }
        // The usage table says whether any file data in it is live (what it counts beyond
        // the map nodes there): a segment with none is not read at all (most victims, under
        // overwrites). Debug builds check that against the whole index, so every test run
        // checks the table as it goes.
        let usage = self.index.usage(phys);
        let keys = if usage <= self.map_bytes_in(phys) {
            debug_assert_eq!(self.index_points_into(phys), Vec::<(u64, u64)>::new(), "segment {phys}");
            Vec::new()
        } else {
            let pages = self.store.data_pages_of(phys)?;
            self.live_keys_on(&pages)?
        };
        let mut readable = true;
        for (ino, index) in keys {
            if self.wb.contains((ino, index)) {
                continue;
            }
            match self.page_and_crc(ino, index) {
                Ok((page, crc)) => {
                    self.set_dirty((ino, index), crate::fs::cache::DirtyPage::moved(page, crc));
                    self.stats.pages_moved += 1;
                }
                // A page beyond repair keeps its place: erasing the segment would turn a
                // read that fails (EIO) into one that returns something else.
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. })) => readable = false,
                Err(e) => return Err(e),
            }
        }
        let (maps_readable, held) = self.mark_maps_in(phys)?;
        Ok((readable && maps_readable, held))
    }
}
