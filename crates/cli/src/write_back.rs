//! The write-back thread: dirty file data past the mount's limit is written to flash by a
//! thread of its own, one step (about [`STEP_PAGES`] pages) per hold of the file system's
//! lock, so that the request that passed the limit returns at once and a request of another
//! file waits for at most one step, not for the whole write-back (docs/DESIGN.md, "Threads
//! and locks"). A write that finds the thread far behind writes back itself (the file
//! system's hard limit), which bounds the RAM dirty data takes. The background cleaner
//! runs in the same thread the same way: a step of about as many pages per hold, in turns
//! with write-back when both are due.

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, MutexGuard};

use crate::scrubber::{lock, Mounted, Shared};

/// Dirty pages written per hold of the lock: 256 KiB, about half a millisecond of
/// compression, parity and signatures at the rates `bench flashfs` measures.
pub const STEP_PAGES: usize = 64;

/// After a failed step, how long the thread leaves the data dirty before it tries again
/// (a full or failing chip must not be hammered; the error is logged once per try).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest a writer waits for the thread before it writes back itself (a thread that
/// failed a step waits [`RETRY_AFTER`] before it tries again).
const WAIT_MOST: Duration = Duration::from_millis(200);

/// Wakes the thread: cheap, never blocks (a wake already pending is enough).
#[derive(Clone)]
pub struct Waker {
    wake: SyncSender<()>,
    /// Notified after every step, for writers waiting for room.
    stepped: Arc<Condvar>,
}

impl Waker {
    pub fn wake(&self) {
        let _ = self.wake.try_send(());
    }

    /// Before a write: while dirty data is past what a writer may add to
    /// (`Fs::writer_should_wait`), waits for the thread's steps with the lock let go, so the
    /// thread writes back in short steps (and requests of other files get the lock between
    /// them) rather than this write writing back everything in one hold at the hard limit.
    pub fn wait_for_room(&self, m: &mut MutexGuard<'_, Mounted>) {
        let deadline = Instant::now() + WAIT_MOST;
        while m.fs.as_ref().is_some_and(|fs| fs.writer_should_wait()) {
            self.wake();
            if self.stepped.wait_until(m, deadline).timed_out() {
                return;
            }
        }
    }
}

/// Starts the thread; it stops when the file system is unmounted or every waker is gone.
pub fn spawn(shared: Shared) -> (Waker, JoinHandle<()>) {
    let (tx, rx) = sync_channel(1);
    let stepped = Arc::new(Condvar::new());
    let waker = Waker { wake: tx, stepped: stepped.clone() };
    let thread = std::thread::spawn(move || run(&shared, &rx, &stepped));
    (waker, thread)
}

fn run(shared: &Shared, woken: &Receiver<()>, stepped: &Condvar) {
    let mut failed_at: Option<Instant> = None;
    loop {
        match woken.recv_timeout(RETRY_AFTER) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if failed_at.is_some_and(|t| t.elapsed() < RETRY_AFTER) {
            continue;
        }
        // Once woken (past the limit), down to half of it: a wake per request would step a
        // few pages at a time.
        let mut started = false;
        let mut turn = 0u64;
        loop {
            let mut m = lock(shared);
            let taken = Instant::now();
            let Some(fs) = m.fs.as_mut() else { return };
            let write_back = if started { !fs.write_back_done() } else { fs.write_back_due() };
            let clean = fs.clean_due();
            if !write_back && !clean {
                break;
            }
            // Both due: cleaning first (it frees the segments write-back fills), unless a
            // writer waits for room, then in turns; but cleaning first whatever waits while
            // free segments are down to the reserve, where a write-back step could start the
            // cleaner proper (whole victims in one hold of the lock).
            let cleaning =
                clean && (!write_back || fs.clean_urgent() || !fs.writer_should_wait() || turn % 2 == 1);
            turn += 1;
            let r = if cleaning {
                fs.clean_step(STEP_PAGES).map(|_| ())
            } else {
                started = true;
                fs.write_back_step(STEP_PAGES).map(|_| ())
            };
            if let Err(e) = r {
                let what = if cleaning { "cleaner" } else { "write-back" };
                eprintln!("bitmend: {what}: {e} (the data stays dirty; tried again in {RETRY_AFTER:?})");
                failed_at = Some(Instant::now());
                break;
            }
            failed_at = None;
            let held = taken.elapsed();
            if cleaning {
                m.clean_holds.record(held);
            } else {
                m.write_back_holds.record(held);
            }
            // Handed to a request waiting for it, if there is one: let go plainly, the lock
            // went back to this thread as it took the next step at once, and a request
            // waited for the whole burst of steps rather than for one.
            MutexGuard::unlock_fair(m);
            stepped.notify_all();
        }
    }
}
