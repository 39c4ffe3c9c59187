//! The write-back thread: dirty file data past the mount's limit is written to flash by a
//! thread of its own, one step (about [`STEP_PAGES`] pages) per hold of the file system's
//! lock, so that the request that passed the limit returns at once and a request of another
//! file waits for at most one step, not for the whole write-back (docs/DESIGN.md, "Threads
//! and locks"). A write that finds the thread far behind writes back itself (the file
//! system's hard limit), which bounds the RAM dirty data takes.

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use crate::scrubber::{lock, Shared};

/// Dirty pages written per hold of the lock: 256 KiB, about half a millisecond of
/// compression, parity and signatures at the rates `bench flashfs` measures.
pub const STEP_PAGES: usize = 64;

/// After a failed step, how long the thread leaves the data dirty before it tries again
/// (a full or failing chip must not be hammered; the error is logged once per try).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Wakes the thread: cheap, never blocks (a wake already pending is enough).
#[derive(Clone)]
pub struct Waker(SyncSender<()>);

impl Waker {
    pub fn wake(&self) {
        let _ = self.0.try_send(());
    }
}

/// Starts the thread; it stops when the file system is unmounted or every waker is gone.
pub fn spawn(shared: Shared) -> (Waker, JoinHandle<()>) {
    let (tx, rx) = sync_channel(1);
    let thread = std::thread::spawn(move || run(&shared, &rx));
    (Waker(tx), thread)
}

fn run(shared: &Shared, woken: &Receiver<()>) {
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
        loop {
            let mut m = lock(shared);
            let Some(fs) = m.fs.as_mut() else { return };
            let go_on = if started { !fs.write_back_done() } else { fs.write_back_due() };
            if !go_on {
                break;
            }
            started = true;
            if let Err(e) = fs.write_back_step(STEP_PAGES) {
                eprintln!("bitmend: write-back: {e} (the data stays dirty; tried again in {RETRY_AFTER:?})");
                failed_at = Some(Instant::now());
                break;
            }
            failed_at = None;
            // Handed to a request waiting for it, if there is one: let go plainly, the lock
            // went back to this thread as it took the next step at once, and a request
            // waited for the whole burst of steps rather than for one.
            MutexGuard::unlock_fair(m);
        }
    }
}
