//! What a worker of a supervised mount does differently from a daemon on its own
//! (docs/DESIGN.md, "The supervisor"): it shows the supervisor's counters in its status, it
//! stops when a page in its memory fails its check (a new worker recovers the page from the
//! NVRAM tier), and a panic in any thread ends it.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Under a supervisor, a worker whose memory fails a check is thrown away whole (exit status
/// [`MEMORY_FAILED`]): the NVRAM tier holds what the page must be, and the request comes
/// again to a new worker, which recovers it (Loris: a checksum failure in the cache is a
/// crash of the cache, recovered from the Dirty State Store).
pub static RESTART_ON_MEMORY_ERROR: AtomicBool = AtomicBool::new(false);

/// The exit status of a worker that stops because its memory failed a check.
pub const MEMORY_FAILED: i32 = 102;

/// Stops the worker (under a supervisor) when `e` says its memory failed a check.
pub fn stop_if_memory_failed(e: &dyn std::fmt::Display, in_memory: bool) {
    if in_memory && RESTART_ON_MEMORY_ERROR.load(Ordering::Relaxed) {
        eprintln!("bitmend: {e}: this worker stops; a new one recovers the page from the NVRAM tier");
        std::process::exit(MEMORY_FAILED);
    }
}

/// The supervisor's counters, for a worker's status (`--serve-status-fd`).
static STATUS: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();

/// What a worker does differently: it reads the supervisor's counters from the memory file
/// inherited as `status_fd`; a page whose memory fails its check stops it, for a new one to
/// recover from the tier; and a panic in any thread ends it, to the same effect (a thread
/// lost, with the file system's lock poisoned, would serve on half-dead).
pub fn become_worker(status_fd: Option<i32>) {
    if let Some(fd) = status_fd {
        // SAFETY: the descriptor was inherited from the supervisor for this process alone.
        let _ = STATUS.set(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }));
    }
    RESTART_ON_MEMORY_ERROR.store(true, Ordering::Relaxed);
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        std::process::exit(101);
    }));
}

/// The daemon's pid and the supervisor's counters (none when the mount is not supervised),
/// as JSON fields to add to the status.
pub fn status_json() -> String {
    use std::os::unix::fs::FileExt;
    // The process that holds the mount: the supervisor, or this daemon (`bitmend umount`
    // waits for it to end).
    let daemon =
        if STATUS.get().is_some() { std::os::unix::process::parent_id() } else { std::process::id() };
    let daemon = format!(", \"daemon_pid\": {daemon}");
    let Some(f) = STATUS.get() else { return daemon };
    let mut b = [0u8; 32];
    if f.read_exact_at(&mut b, 0).is_err() {
        return daemon;
    }
    let v = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    format!(
        "{daemon}, \"supervisor_restarts\": {}, \"supervisor_replayed\": {}, \"supervisor_refused\": {}, \"supervisor_longest_stall_us\": {}",
        v(0),
        v(1),
        v(2),
        v(3)
    )
}
