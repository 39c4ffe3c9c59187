//! The state of the read checks (Loris's strategies, `reads.rs`): per page, when it was last
//! checked or used, and the clock that stamps it. It knows nothing of the pool: the pool
//! holds one, and the checked reads consult it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// When a read checks the pages it reads (Loris section 4.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadCheck {
    /// Every read (ER).
    Every,
    /// A read of a page last checked at least this long ago (LC).
    AfterCheck(Duration),
    /// A read of a page last used at least this long ago (LU): a page read often is
    /// checked rarely, one left alone is checked when it is taken up again.
    AfterUse(Duration),
    /// No read checks: the scrubber alone.
    #[default]
    Background,
}

/// The state of the read checks: per page, one stamp (microseconds since the pool was
/// opened, 0 for never): when it was last checked (LC) or last used (LU), whichever the mode
/// needs, so that a read touches one word per page.
pub(crate) struct ReadChecker {
    pub mode: ReadCheck,
    /// The mode's interval in microseconds (a `Duration`'s conversion costs a 128-bit
    /// division, more than the rest of a read's bookkeeping).
    pub(super) interval: u64,
    pub(super) epoch: Instant,
    pub(super) stamps: Vec<AtomicU64>,
    /// The clock, read every [`CLOCK_EVERY`] checks (a read of it costs as much as a get's
    /// whole check): microseconds since `epoch`, and the checks since it was read.
    pub(super) now: AtomicU64,
    pub(super) calls: AtomicU64,
    /// Pages signed by read checks (pools without line checks).
    pub checks: AtomicU64,
    /// Lines checked by read checks (pools with line checks).
    pub lines: AtomicU64,
    /// When noting: each run of lines a read check compared, as `line << 24 | lines` (see
    /// [`crate::Pool::note_checked_lines`]).
    pub(super) noted: Option<Mutex<Vec<u64>>>,
}

/// Checks between two reads of the clock: a tick (1/60 s) is tens of thousands of reads.
const CLOCK_EVERY: u64 = 32;

impl ReadChecker {
    pub fn new(pages: u64) -> ReadChecker {
        ReadChecker {
            mode: ReadCheck::Background,
            interval: 0,
            epoch: Instant::now(),
            stamps: (0..pages).map(|_| AtomicU64::new(0)).collect(),
            now: AtomicU64::new(1),
            calls: AtomicU64::new(0),
            checks: AtomicU64::new(0),
            lines: AtomicU64::new(0),
            noted: None,
        }
    }

    /// A new mode: no page has a stamp of it yet.
    pub fn set_mode(&mut self, mode: ReadCheck) {
        self.mode = mode;
        self.interval = match mode {
            ReadCheck::AfterCheck(d) | ReadCheck::AfterUse(d) => d.as_micros().min(u64::MAX as u128) as u64,
            ReadCheck::Every | ReadCheck::Background => 0,
        };
        for s in &self.stamps {
            s.store(0, Ordering::Relaxed);
        }
    }

    /// Microseconds since the pool was opened, never 0 (which means "never"), as of at most
    /// [`CLOCK_EVERY`] checks ago.
    pub(super) fn now(&self) -> u64 {
        // A plain load and store, not a locked add: a lost count between two threads only
        // moves the next clock read.
        let n = self.calls.load(Ordering::Relaxed);
        self.calls.store(n.wrapping_add(1), Ordering::Relaxed);
        if n.is_multiple_of(CLOCK_EVERY) {
            self.now.store(self.epoch.elapsed().as_micros() as u64 + 1, Ordering::Relaxed);
        }
        self.now.load(Ordering::Relaxed)
    }

    /// Whether page `p`, read at `now`, is due a check; notes the use (LU).
    pub(super) fn due(&self, p: usize, now: u64) -> bool {
        let since = || {
            let t = self.stamps[p].load(Ordering::Relaxed);
            t == 0 || now.saturating_sub(t) >= self.interval
        };
        match self.mode {
            ReadCheck::Every => true,
            ReadCheck::AfterCheck(_) => since(),
            ReadCheck::AfterUse(_) => {
                let due = since();
                self.stamps[p].store(now, Ordering::Relaxed);
                due
            }
            ReadCheck::Background => false,
        }
    }

    /// Page `p` passed its check at `now`.
    pub(super) fn passed(&self, p: usize, now: u64) {
        if let ReadCheck::AfterCheck(_) = self.mode {
            self.stamps[p].store(now, Ordering::Relaxed);
        }
    }
}
