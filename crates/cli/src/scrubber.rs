//! Scrubbing a mounted file system. A thread runs passes one segment at a time, each step
//! under the file system's lock, so a request waits for at most one segment's check; passes
//! start on a schedule and on request. The control file `.bitmend-scrub` in the mount's root
//! (found by name, never listed) is how a pass is requested and watched: write `start` to it,
//! read it for one line of JSON. `bitmend scrub MOUNTPOINT` does both. Writing `sync` to it
//! commits everything (`bitmend sync MOUNTPOINT`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bitmend_flashfs::{Fs, Health, ScrubPass, ScrubReport};
use bitmend_media::nand::FileNand;

/// The control file's name in the root directory, and its inode number (beyond any the file
/// system hands out).
pub const CONTROL_NAME: &[u8] = b".bitmend-scrub";
pub const CONTROL_INO: u64 = u64::MAX - 1;

/// What the FUSE session and the scrubber thread share.
pub struct Mounted {
    /// `None` once unmounted: the thread then stops.
    pub fs: Option<Fs<FileNand>>,
    pass: Option<ScrubPass>,
    /// The newest pass's report (running or finished), and its number (1 for the first).
    report: ScrubReport,
    passes_started: u64,
    requested: bool,
    next_due: Option<Instant>,
    /// Why the newest pass stopped before its end (a full chip, a failing one), if it did.
    error: Option<String>,
}

pub type Shared = Arc<Mutex<Mounted>>;

/// When passes run: every `every` (none: only on request), pausing `pause` between segments.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub every: Option<Duration>,
    pub pause: Duration,
}

pub fn share(fs: Fs<FileNand>, schedule: Schedule) -> Shared {
    Arc::new(Mutex::new(Mounted {
        fs: Some(fs),
        pass: None,
        report: ScrubReport::default(),
        passes_started: 0,
        requested: false,
        next_due: schedule.every.map(|d| Instant::now() + d),
        error: None,
    }))
}

/// Locks the shared state; a panic elsewhere while holding it does not stop the rest.
pub fn lock(shared: &Shared) -> MutexGuard<'_, Mounted> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl Mounted {
    /// Asks for a pass now (none if one is running: it is the pass asked for).
    pub fn request(&mut self) {
        if self.pass.is_none() {
            self.requested = true;
        }
    }

    /// One line of JSON: the newest pass's progress and the lifetime counters.
    pub fn status(&self) -> String {
        let h = self.fs.as_ref().map(|fs| fs.health()).unwrap_or_default();
        let state = if self.pass.is_some() || self.requested { "running" } else { "idle" };
        // Quoted as a JSON string: the message is ours, but a path in it could hold anything.
        let error = self.error.as_ref().map_or("null".to_string(), |e| format!("{e:?}"));
        let space = self.fs.as_ref().map_or(String::new(), |fs| format!(", {}", space_json(fs)));
        format!(
            "{{\"state\": \"{state}\", \"pass\": {}, \"error\": {error}, {}, {}{space}}}\n",
            self.passes_started,
            report_json(&self.report),
            health_json(&h)
        )
    }

    /// Starts a pass if one is due or asked for, then checks one segment. Returns whether
    /// there is more to do right away.
    fn step(&mut self, schedule: Schedule) -> bool {
        let Some(fs) = self.fs.as_mut() else { return false };
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

/// Space, files and the index as JSON fields (no braces), for `bitmend stat` of an image and
/// of a mounted file system (through the control file).
pub fn space_json<N: bitmend_media::nand::Nand>(fs: &bitmend_flashfs::Fs<N>) -> String {
    let (total, free) = fs.statfs();
    let (logical, stored) = fs.data_space();
    format!(
        "\"bytes_total\": {total}, \"bytes_free\": {free}, \"inodes\": {}, \"file_data_bytes\": {logical}, \
         \"stored_bytes\": {stored}, \"segments\": {}, \"segments_used\": {}, \"index_chunks\": {}",
        fs.inode_count(),
        fs.store().segments(),
        fs.store().used_segments().len(),
        fs.index_chunk_count()
    )
}

/// A pass's report as JSON fields (no braces), for the control file and `bitmend scrub`.
pub fn report_json(r: &ScrubReport) -> String {
    format!(
        "\"segments_total\": {}, \"segments_done\": {}, \"pages_checked\": {}, \"repaired_by_group\": {}, \
         \"repaired_by_segment\": {}, \"unreadable_pages\": {}, \"parity_damaged\": {}, \
         \"logical_pages_relocated\": {}, \"segments_healed\": {}, \"superblocks_damaged\": {}, \
         \"superblocks_rewritten\": {}, \"done\": {}",
        r.segments_total,
        r.segments_done,
        r.pages_checked,
        r.repaired_by_group,
        r.repaired_by_segment,
        r.unreadable_pages,
        r.parity_damaged,
        r.logical_pages_relocated,
        r.segments_healed,
        r.superblocks_damaged,
        r.superblocks_rewritten,
        r.done
    )
}

/// A pass's report in one line of text, for the daemon's log and `bitmend scrub`.
pub fn report_text(r: &ScrubReport) -> String {
    format!(
        "{} segments, {} pages checked; repaired {} from group parity, {} from segment parity; \
         {} beyond repair; {} damaged parity pages; {} logical pages rewritten; \
         {} segments rewritten under fresh parity; {} of {} damaged superblock copies rewritten",
        r.segments_done,
        r.pages_checked,
        r.repaired_by_group,
        r.repaired_by_segment,
        r.unreadable_pages,
        r.parity_damaged,
        r.logical_pages_relocated,
        r.segments_healed,
        r.superblocks_rewritten,
        r.superblocks_damaged
    )
}

/// The lifetime counters as JSON fields (no braces).
pub fn health_json(h: &Health) -> String {
    format!(
        "\"lifetime_repaired_by_group\": {}, \"lifetime_repaired_by_segment\": {}, \"lifetime_relocated\": {}, \
         \"lifetime_unrecoverable\": {}, \"lifetime_scrub_passes\": {}, \"lifetime_pages_scrubbed\": {}, \
         \"lifetime_program_failures\": {}, \"lifetime_erase_failures\": {}",
        h.repaired_by_group,
        h.repaired_by_segment,
        h.relocated,
        h.unrecoverable,
        h.scrub_passes,
        h.pages_scrubbed,
        h.program_failures,
        h.erase_failures
    )
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
