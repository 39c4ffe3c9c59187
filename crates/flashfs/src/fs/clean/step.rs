//! The cleaner a step at a time, for the mount's write-back thread.
//!
//! The cleaner proper ([`mod.rs`](super)) runs when free segments fall below its
//! reserve, inside whatever operation found them short, and moves whole victims in one go:
//! through a mount, a request then waited for a victim's worth of reads and writes (8.6 ms
//! at p99, 12 ms at most, on a 2 MiB segment). The background cleaner starts earlier, at
//! [`AHEAD`] segments above that reserve, and empties one victim a few flash pages per step:
//! each step reads the live data on the next pages of the victim and writes it elsewhere,
//! at once, so a step costs about what a write-back step does. Once every page was looked
//! at, a sync makes the moves durable and the victim is released, as the cleaner proper
//! would. Between steps the victim may be emptied by the cleaner proper, or its data
//! overwritten or deleted: each step checks it is still a candidate, and a page is moved
//! only if the index still places it there.

use bitmend_media::nand::Nand;

use crate::fs::cache::DirtyPage;
use crate::fs::checkpoint::CkptAt;
use crate::fs::Fs;
use crate::store::Segment;
use crate::Corruption;
use crate::FsError;

/// Free segments above the cleaner's reserve that the background cleaner keeps: a
/// sixteenth of the chip's segments, at least [`AHEAD_LEAST`] and at most [`AHEAD_MOST`]
/// (within the eighth of the segments the budget keeps free of live data, so a full file
/// system can reach it). Room to fall back on while the cleaner catches up with a writer.
const AHEAD_LEAST: usize = 4;
const AHEAD_MOST: usize = 64;

/// The most live (as a fraction of a segment) a victim of the background cleaner may be:
/// moving a fuller one frees little for what it costs, and is left to the cleaner proper
/// (which must, near full, where the budget keeps the emptiest at most seven-eighths live).
const MOST_LIVE: f64 = 0.9;

/// A victim the background cleaner is emptying.
#[derive(Debug)]
pub(crate) struct Evacuation {
    /// Physical and logical number: a victim released and reused meanwhile has a new one.
    victim: Segment,
    /// Its data pages (from their spares), and the next to look at.
    pages: Vec<u32>,
    next: usize,
    /// Live pages that were dirty when a step passed them: written at the end.
    skipped: Vec<(u64, u64)>,
    /// A live page could not be read (beyond repair): the victim is kept, and pinned.
    stuck: bool,
}

/// A victim whose data all moved, kept until no checkpoint a mount may start from refers
/// to a map node in it (the chunks were marked dirty: the next checkpoint writes them
/// elsewhere, and the next segment opened makes that checkpoint the one mount starts from).
#[derive(Debug)]
struct AwaitingMaps {
    victim: Segment,
    /// The checkpoint mount started from when last looked at: looked at again once it changed.
    mount_from: Option<CkptAt>,
}

/// What the background cleaner remembers between steps.
#[derive(Debug, Default)]
pub(crate) struct BackgroundCleaner {
    pub evacuation: Option<Evacuation>,
    awaiting_maps: Vec<AwaitingMaps>,
    /// Nothing to clean when free segments and checkpoints were these: not due again
    /// until one of them changes (no busy loop on a chip that cannot be cleaned).
    pub(super) idle_at: Option<(usize, u64)>,
    /// This run (since free segments were last at the target) moved a victim for wear.
    wear_moved: bool,
}

impl<N: Nand> Fs<N> {
    /// Free segments the background cleaner keeps: the reserve and a few more (`AHEAD_*`).
    fn background_target(&self) -> usize {
        let ahead = (self.store.segments() as usize / 16).clamp(AHEAD_LEAST, AHEAD_MOST);
        self.cleaner_reserve() + ahead
    }

    /// Whether the background cleaner has work: a victim part emptied or one whose maps may
    /// have moved on, or free segments below its target and something worth cleaning when
    /// last looked.
    pub fn clean_due(&self) -> bool {
        let bg = &self.cleaner.background;
        if bg.evacuation.is_some() || self.awaiting_due() {
            return true;
        }
        let free = self.store.free_segments();
        free < self.background_target() && bg.idle_at != Some((free, self.stats.checkpoints))
    }

    /// Whether the background cleaner is due and free segments are down to the cleaner's
    /// reserve: a write-back step now could open a segment and start the cleaner proper,
    /// which empties whole victims in one hold of the lock. The thread cleans first.
    pub fn clean_urgent(&self) -> bool {
        self.clean_due() && self.store.free_segments() <= self.cleaner_reserve()
    }

    /// Whether the background cleaner is due with free segments at most one above the
    /// cleaner's reserve: writers wait for it with less dirty data ([`Fs::writer_should_wait`]).
    pub(crate) fn cleaner_behind(&self) -> bool {
        self.store.free_segments() <= self.cleaner_reserve() + 1 && self.clean_due()
    }

    /// One step of the background cleaner: looks at about `pages` logical pages' worth of
    /// the victim's flash pages and moves the live data on them (or, past the last, makes
    /// the moves durable and releases the victim). Returns the logical pages moved.
    pub fn clean_step(&mut self, pages: usize) -> Result<usize, FsError> {
        if self.cleaner.running {
            return Ok(0);
        }
        self.cleaner.running = true;
        let r = self.release_awaiting().and_then(|()| self.clean_step_inner(pages.max(1)));
        self.cleaner.running = false;
        self.stats.clean_steps += 1;
        r
    }

    fn clean_step_inner(&mut self, pages: usize) -> Result<usize, FsError> {
        let free = self.store.free_segments();
        if free >= self.background_target() {
            self.cleaner.background.wear_moved = false;
            if self.cleaner.background.evacuation.is_none() {
                return Ok(0);
            }
        }
        let current = self.cleaner.background.evacuation.take();
        let still = current.filter(|e| self.candidates().contains(&e.victim));
        let Some(mut ev) = still.map_or_else(|| self.start_evacuation(), |e| Ok(Some(e)))? else {
            self.cleaner.background.idle_at = Some((free, self.stats.checkpoints));
            return Ok(0);
        };
        if ev.next < ev.pages.len() {
            let flash_pages = (pages * crate::fs::LOGICAL_PAGE).div_ceil(self.page.size());
            let end = (ev.next + flash_pages).min(ev.pages.len());
            let keys = self.live_keys_on(&ev.pages[ev.next..end])?;
            ev.next = end;
            // On an error the evacuation is dropped: pages this step read may be dirty
            // again, not written, and only a new look at the victim finds them.
            let moved = self.move_now(&keys, &mut ev)?;
            self.cleaner.background.evacuation = Some(ev);
            return Ok(moved);
        }
        self.finish_evacuation(ev)?;
        Ok(0)
    }

    /// The best victim (or, once per run, one held back for wear), and its data pages.
    fn start_evacuation(&mut self) -> Result<Option<Evacuation>, FsError> {
        let awaiting: Vec<u32> =
            self.cleaner.background.awaiting_maps.iter().map(|a| a.victim.physical).collect();
        let cands: Vec<Segment> =
            self.candidates().into_iter().filter(|c| !awaiting.contains(&c.physical)).collect();
        // Room for the victim's data at the cleaner's reserve or above: the background
        // cleaner spends no more of it than the cleaner proper starts with.
        if self.store.free_segments() < self.cleaner_reserve() {
            return Ok(None);
        }
        let mut victim = self.ranked_victims(&cands).first().filter(|r| r.2 <= MOST_LIVE).map(|r| r.1);
        if !self.cleaner.background.wear_moved {
            if let Some(cold) = self.wear_victim(&cands)? {
                self.cleaner.background.wear_moved = true;
                victim = Some(cold);
            }
        }
        let Some(victim) = victim.and_then(|p| cands.iter().find(|c| c.physical == p).copied()) else {
            return Ok(None);
        };
        // No file data counted live there (most victims under overwrites, but for map nodes):
        // nothing to read. Debug builds check that against the whole index at the end.
        let usage = self.index.usage(victim.physical);
        let data_live = usage.saturating_sub(self.map_bytes_in(victim.physical));
        let pages = if data_live == 0 { Vec::new() } else { self.store.data_pages_of(victim.physical)? };
        Ok(Some(Evacuation { victim, pages, next: 0, skipped: Vec::new(), stuck: false }))
    }

    /// Reads the pages `keys` (live in the victim) and writes them elsewhere now; pages
    /// dirty already are left to the end: their dirty copy is what goes out.
    fn move_now(&mut self, keys: &[(u64, u64)], ev: &mut Evacuation) -> Result<usize, FsError> {
        let mut batch = std::collections::BTreeMap::new();
        for &(ino, index) in keys {
            if self.wb.contains((ino, index)) {
                ev.skipped.push((ino, index));
                continue;
            }
            match self.page_and_crc(ino, index) {
                Ok((page, crc)) => {
                    self.cache.forget((ino, index));
                    batch.insert((ino, index), DirtyPage::moved(page, crc));
                }
                // Left where it is: erasing the victim would turn a read that fails (EIO)
                // into one that returns something else.
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. })) => ev.stuck = true,
                Err(e) => return Err(e),
            }
        }
        let moved = batch.len();
        self.write_runs(batch)?;
        self.stats.pages_moved += moved as u64;
        Ok(moved)
    }

    /// Past the victim's last page: the pages skipped because they were dirty are written,
    /// the chunks whose map node is there are marked for the next checkpoint, and the
    /// victim is released as the cleaner proper releases one (after a sync), or, if a
    /// checkpoint mount may start from refers to a map node there, once none does.
    fn finish_evacuation(&mut self, ev: Evacuation) -> Result<(), FsError> {
        let phys = ev.victim.physical;
        let batch = self.wb.take_some(&ev.skipped).into_iter().collect();
        self.write_runs(batch)?;
        let (maps_readable, held) = self.mark_maps_in(phys)?;
        if ev.stuck || !maps_readable {
            self.cleaner.pinned.insert(phys);
            return Ok(());
        }
        debug_assert_eq!(self.index_points_into(phys), Vec::<(u64, u64)>::new(), "segment {phys}");
        if held {
            let mount_from = self.cp.mount_from();
            self.cleaner.background.awaiting_maps.push(AwaitingMaps { victim: ev.victim, mount_from });
            return Ok(());
        }
        self.stats.segments_cleaned_in_steps += self.release_moved(vec![phys], Vec::new(), false)? as u64;
        Ok(())
    }

    /// Whether victims await their maps and something may release them: the checkpoint
    /// mount starts from changed, or a checkpoint for mount is cheap now (little dirty data
    /// to write back first) or needed (free segments down to the reserve).
    fn awaiting_due(&self) -> bool {
        let awaiting = &self.cleaner.background.awaiting_maps;
        !awaiting.is_empty()
            && (awaiting.iter().any(|a| a.mount_from != self.cp.mount_from())
                || self.wb.dirty_bytes() <= self.opts.dirty_limit / 2
                || self.store.free_segments() <= self.cleaner_reserve())
    }

    /// Releases the victims awaiting their maps that no checkpoint a mount may start from
    /// refers to any more, writing such a checkpoint first when it is cheap or needed.
    fn release_awaiting(&mut self) -> Result<(), FsError> {
        if !self.awaiting_due() {
            return Ok(());
        }
        let now = self.cp.mount_from();
        let forced = self.cleaner.background.awaiting_maps.iter().all(|a| a.mount_from == now);
        if forced {
            self.checkpoint_for_mount()?;
        }
        let now = self.cp.mount_from();
        let cands = self.candidates();
        let held = self.map_holding_segments();
        let mut free = Vec::new();
        let mut given_up = false;
        self.cleaner.background.awaiting_maps.retain_mut(|a| {
            if !cands.contains(&a.victim) {
                return false; // released or pinned meanwhile by the cleaner proper
            }
            if held.contains(&a.victim.physical) {
                // Still held after a checkpoint written for it: given up (the cleaner
                // proper may take it), rather than a checkpoint per step for nothing.
                a.mount_from = now;
                given_up |= forced;
                return !forced;
            }
            free.push(a.victim.physical);
            false
        });
        if given_up {
            self.cleaner.background.idle_at = Some((self.store.free_segments(), self.stats.checkpoints));
        }
        if !free.is_empty() {
            self.stats.segments_cleaned_in_steps += self.release_moved(free, Vec::new(), false)? as u64;
        }
        Ok(())
    }
}
