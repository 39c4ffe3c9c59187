//! Scrubbing a mounted file system. A thread runs passes one segment at a time, each step
//! under the file system's lock, so a request waits for at most one segment's check; passes
//! start on a schedule and on request. The control file `.bitmend-scrub` in the mount's root
//! (found by name, never listed) is how a pass is requested and watched: write `start` to it,
//! read it for one line of JSON. `bitmend scrub MOUNTPOINT` does both. Writing `sync` to it
//! commits everything (`bitmend sync MOUNTPOINT`).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use bitmend_flashfs::{Fs, QuickScrubReport, ScrubPass, ScrubReport};

use crate::flash::Flash;
use crate::holds::Holds;
use crate::report::{
    health_json, quick_json, quick_text, report_json, report_text, space_json, Quick, Space,
};

/// The control file's name in the root directory, and its inode number (beyond any the file
/// system hands out).
pub const CONTROL_NAME: &[u8] = b".bitmend-scrub";
pub const CONTROL_INO: u64 = u64::MAX - 1;

/// What the FUSE session and the scrubber thread share.
pub struct Mounted {
    /// `None` once unmounted: the thread then stops.
    pub fs: Option<Fs<Flash>>,
    pass: Option<ScrubPass>,
    /// The newest pass's report (running or finished), and its number (1 for the first).
    report: ScrubReport,
    passes_started: u64,
    requested: bool,
    next_due: Option<Instant>,
    /// Why the newest pass stopped before its end (a full chip, a failing one), if it did.
    error: Option<String>,
    /// The newest quick pass's report, and how many have run.
    quick: Quick,
    quick_passes: u64,
    /// When the background checker last ran.
    cache_checked: Instant,
    /// The on-line check of the namespace against flash.
    state: crate::state_check::StateChecker,
    /// How long the write-back thread's steps held the lock: write-back, and cleaning.
    pub write_back_holds: Holds,
    pub clean_holds: Holds,
}

pub type Shared = Arc<Mutex<Mounted>>;

/// When passes run: every `every` (none: only on request), pausing `pause` between segments.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub every: Option<Duration>,
    pub pause: Duration,
    /// Cached pages checked per second by the background checker (Loris's, beside any read
    /// strategy).
    pub cache_check_rate: u64,
    /// Namespace groups compared with flash per second by the on-line check (PRIMS's).
    pub state_check_rate: u64,
}

pub fn share(fs: Fs<Flash>, schedule: Schedule) -> Shared {
    Arc::new(Mutex::new(Mounted {
        fs: Some(fs),
        pass: None,
        report: ScrubReport::default(),
        passes_started: 0,
        requested: false,
        next_due: schedule.every.map(|d| Instant::now() + d),
        error: None,
        quick: Quick::default(),
        quick_passes: 0,
        cache_checked: Instant::now(),
        state: Default::default(),
        write_back_holds: Holds::default(),
        clean_holds: Holds::default(),
    }))
}

/// Locks the shared state (a panic elsewhere while holding it does not stop the rest: the
/// lock is not poisoned).
pub fn lock(shared: &Shared) -> MutexGuard<'_, Mounted> {
    shared.lock()
}

impl Mounted {
    /// Asks for a pass now (none if one is running: it is the pass asked for).
    pub fn request(&mut self) {
        if self.pass.is_none() {
            self.requested = true;
        }
    }

    /// Runs a quick pass now (it reads only spares: it holds the lock for about as long as a
    /// mount's scan would), its report then in the status.
    pub fn run_quick(&mut self) -> Result<(), bitmend_flashfs::FsError> {
        let Some(fs) = self.fs.as_mut() else { return Ok(()) };
        let r: QuickScrubReport = fs.scrub_quick()?;
        self.quick = Quick::from(&r);
        self.quick_passes += 1;
        eprintln!("bitmend: {}", quick_text(&self.quick));
        Ok(())
    }

    /// Flips a bit of a cached page (`flip INO PAGE BIT` on the control file): memory-error
    /// injection for tests and demos. Which copy it hit, if any.
    pub fn flip(&mut self, command: &[u8]) -> Option<bitmend_flashfs::Cached> {
        let text = std::str::from_utf8(command).ok()?;
        let mut words = text.split_whitespace();
        let (Some("flip"), Some(ino), Some(page), Some(bit), None) =
            (words.next(), words.next(), words.next(), words.next(), words.next())
        else {
            return None;
        };
        let (ino, page, bit) = (ino.parse().ok()?, page.parse().ok()?, bit.parse::<usize>().ok()?);
        if bit >= 8 * bitmend_flashfs::LOGICAL_PAGE {
            return None;
        }
        Some(self.fs.as_mut()?.flip_cached(bitmend_flashfs::Ino(ino), page, bit))
    }

    /// `flip-inode INO BIT` (see `state_check::flip_inode`).
    pub fn flip_inode(&mut self, command: &[u8]) -> Option<bool> {
        crate::state_check::flip_inode(self.fs.as_mut()?, command)
    }

    /// One line of JSON: the newest pass's progress and the lifetime counters.
    pub fn status(&self) -> String {
        let h = self.fs.as_ref().map(|fs| fs.health()).unwrap_or_default();
        let state = if self.pass.is_some() || self.requested { "running" } else { "idle" };
        // Quoted as a JSON string: the message is ours, but a path in it could hold anything.
        let error = self.error.as_ref().map_or("null".to_string(), |e| format!("{e:?}"));
        let space = self.fs.as_ref().map_or(String::new(), |fs| format!(", {}", space_json(&Space::of(fs))));
        let cache = self.fs.as_ref().map_or(String::new(), |fs| {
            let (s, pages) = fs.cache_stats();
            let f = fs.stats();
            format!(
                ", \"cache_pages\": {pages}, \"cache_hits\": {}, \"cache_checks\": {}, \"cache_clean_caught\": {}, \"cache_dirty_caught\": {}, \"cache_dirty_healed\": {}, \"reads_unlocked\": {}, \"reads_relocked\": {}",
                s.hits, s.checks, s.clean_caught, s.dirty_caught, s.dirty_healed, f.reads_unlocked, f.reads_relocked
            )
        });
        let cleaner = self.fs.as_ref().map_or(String::new(), |fs| {
            let f = fs.stats();
            format!(
                ", \"segments_cleaned\": {}, \"segments_cleaned_in_steps\": {}, \"cleaner_runs\": {}, \"pages_moved\": {}, \"namespace_inodes_in_memory\": {}, \"namespace_groups\": {}, \"namespace_groups_unread\": {}, \"namespace_groups_shed\": {}",
                f.segments_cleaned, f.segments_cleaned_in_steps, f.cleaner_runs, f.pages_moved, f.inodes_in_memory, f.groups, f.groups_unread, f.groups_shed
            )
        });
        let tier = self.fs.as_ref().and_then(|fs| fs.tier_fill()).map_or(String::new(), |t| {
            format!(
                ", \"tier_log_used\": {}, \"tier_log_size\": {}, \"tier_pages\": {}",
                t.log_used, t.log_size, t.pages
            )
        });
        let holds = format!(
            "{cleaner}{tier}, {}, {}, {}",
            self.state.json(),
            self.write_back_holds.json("write_back"),
            self.clean_holds.json("clean")
        );
        format!(
            "{{\"state\": \"{state}\", \"pass\": {}, \"error\": {error}, {}, \"quick_passes\": {}, {}, {}{space}{cache}{holds}{}}}\n",
            self.passes_started,
            report_json(&self.report),
            self.quick_passes,
            quick_json(&self.quick, "quick_"),
            health_json(&h),
            crate::worker::status_json() + &crate::nvram::status_json()
        )
    }

    /// The background checker: the cached pages the rate allows since its last step.
    fn check_cache(&mut self, rate: u64) {
        let Some(fs) = self.fs.as_mut() else { return };
        let due = (self.cache_checked.elapsed().as_secs_f64() * rate as f64) as usize;
        if due == 0 {
            return;
        }
        self.cache_checked = Instant::now();
        let r = fs.check_cache(due);
        if r.clean_caught > 0 {
            eprintln!(
                "bitmend: cache check: {} clean pages failed their CRC, dropped (read again from flash)",
                r.clean_caught
            );
        }
        for (ino, page) in r.dirty_caught {
            let said = format!("cache check: dirty page {page} of inode {ino} failed its CRC");
            crate::worker::stop_if_memory_failed(&said, true);
            eprintln!("bitmend: {said}: reads of it fail (EIO)");
        }
    }

    /// Starts a pass if one is due or asked for, then checks one segment. Returns whether
    /// there is more to do right away.
    fn step(&mut self, schedule: Schedule) -> bool {
        self.check_cache(schedule.cache_check_rate);
        let Some(fs) = self.fs.as_mut() else { return false };
        self.state.step(fs, schedule.state_check_rate);
        if self.pass.is_none() {
            let due = self.next_due.is_some_and(|t| Instant::now() >= t);
            if !(self.requested || due) {
                return false;
            }
            self.requested = false;
            self.error = None;
            self.passes_started += 1;
            let pass = fs.scrub_begin();
            self.report = pass.report();
            self.pass = Some(pass);
        }
        let pass = self.pass.as_mut().expect("started above");
        let finished = match fs.scrub_step(pass) {
            Ok(done) => done,
            Err(e) => {
                eprintln!("bitmend: scrub pass {} stopped: {e}", self.passes_started);
                self.error = Some(e.to_string());
                true
            }
        };
        self.report = pass.report();
        if finished {
            self.pass = None;
            self.next_due = schedule.every.map(|d| Instant::now() + d);
            eprintln!("bitmend: scrub pass {}: {}", self.passes_started, report_text(&self.report));
        }
        !finished
    }
}

/// The scrubber thread: runs until the file system is unmounted.
pub fn spawn(shared: Shared, schedule: Schedule) -> JoinHandle<()> {
    std::thread::spawn(move || loop {
        let (more, mounted) = {
            let mut m = lock(&shared);
            (m.step(schedule), m.fs.is_some())
        };
        if !mounted {
            return;
        }
        // Between segments of a pass: the pause; between passes: a look every 100 ms for a
        // request or the schedule.
        std::thread::sleep(if more { schedule.pause } else { Duration::from_millis(100) });
    })
}
