//! The commit interval: a mounted file system makes every change durable within a bounded
//! time even when no one syncs, as RCFFS's write-back does. Linux passes `fsync` on to a
//! FUSE daemon but not `sync`/`syncfs` (FUSE_SYNCFS is sent to virtiofs servers only), so
//! this bound, `fsync`, and `bitmend sync MOUNTPOINT` are what make data durable.

use std::thread::JoinHandle;
use std::time::Duration;

use crate::scrubber::{lock, Shared};

/// How often the thread looks: a tenth of the interval, between 10 ms and 100 ms, so a
/// change waits at most about 10% longer than the interval (plus the commit itself).
fn tick(interval: Duration) -> Duration {
    (interval / 10).clamp(Duration::from_millis(10), Duration::from_millis(100))
}

/// Commits whatever has waited `interval` or longer; runs until the file system is unmounted.
pub fn spawn(shared: Shared, interval: Duration) -> JoinHandle<()> {
    std::thread::spawn(move || {
        // After a failed commit, the next try waits a whole interval: a full or failing chip
        // must not be hammered (and the error logged) ten times a second.
        let mut retry_after = None;
        loop {
            std::thread::sleep(tick(interval));
            let mut m = lock(&shared);
            let Some(fs) = m.fs.as_mut() else { return };
            let due = fs.unsynced_since().is_some_and(|t| t.elapsed() >= interval);
            if !due || retry_after.is_some_and(|t: std::time::Instant| t.elapsed() < interval) {
                continue;
            }
            match fs.sync() {
                Ok(()) => retry_after = None,
                Err(e) => {
                    eprintln!("bitmend: commit after {interval:?}: {e} (tried again in {interval:?})");
                    retry_after = Some(std::time::Instant::now());
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_looks_often_enough_and_not_too_often() {
        assert_eq!(tick(Duration::from_secs(5)), Duration::from_millis(100));
        assert_eq!(tick(Duration::from_millis(500)), Duration::from_millis(50));
        assert_eq!(tick(Duration::from_millis(20)), Duration::from_millis(10));
    }
}
