//! Faults inside the worker, for Loris's experiment (docs/DESIGN.md, "The supervisor"): a
//! test build only, the cargo feature `fault-points`; without it every fault point is empty.
//!
//! `BITMEND_FAULT_POINTS=ONE_IN` (in the worker's environment) makes about one request in
//! ONE_IN, at random, meet a fault where it enters the worker: a panic, an abort, or a bit
//! flipped in a dirty page the worker holds (found by its CRC when next checked).

#[cfg(feature = "fault-points")]
mod active {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// One in how many requests meets a fault (0: none).
    fn one_in() -> u64 {
        static ONE_IN: OnceLock<u64> = OnceLock::new();
        *ONE_IN.get_or_init(|| {
            std::env::var("BITMEND_FAULT_POINTS").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
        })
    }

    /// A xorshift generator, seeded apart in each worker.
    fn next() -> u64 {
        static STATE: AtomicU64 = AtomicU64::new(0);
        let mut x = STATE.load(Ordering::Relaxed);
        if x == 0 {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            x = (t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)) | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        STATE.store(x, Ordering::Relaxed);
        x
    }

    pub fn at(site: &str, shared: &crate::scrubber::Shared) {
        let n = one_in();
        if n == 0 || !next().is_multiple_of(n) {
            return;
        }
        match next() % 3 {
            0 => panic!("fault point: a panic at {site}"),
            1 => {
                eprintln!("bitmend: fault point: an abort at {site}");
                std::process::abort();
            }
            _ => {
                let mut m = crate::scrubber::lock(shared);
                let Some(fs) = m.fs.as_mut() else { return };
                let pick = next() as usize;
                if let Some((ino, index)) = fs.nth_dirty_page(pick) {
                    let bit = (next() % (8 * bitmend_flashfs::LOGICAL_PAGE as u64)) as usize;
                    fs.flip_cached(ino, index, bit);
                    eprintln!(
                        "bitmend: fault point: bit {bit} of dirty page {index} of inode {} flipped at {site}",
                        ino.0
                    );
                }
            }
        }
    }
}

#[cfg(feature = "fault-points")]
pub use active::at;

/// `BITMEND_FAULT_WRITE_OUT=FILE` (a test build's): while FILE holds a count above zero, a
/// worker about to write out at the end of its mount lowers it and aborts.
#[cfg(feature = "fault-points")]
pub fn at_write_out() {
    let Some(file) = std::env::var_os("BITMEND_FAULT_WRITE_OUT") else { return };
    let left: u32 = std::fs::read_to_string(&file).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    if left > 0 && std::fs::write(&file, (left - 1).to_string()).is_ok() {
        eprintln!("bitmend: fault point: an abort as the write-out begins");
        std::process::abort();
    }
}

/// A fault point (none in this build).
#[cfg(not(feature = "fault-points"))]
#[inline(always)]
pub fn at_write_out() {}

/// A fault point (none in this build).
#[cfg(not(feature = "fault-points"))]
#[inline(always)]
pub fn at(_site: &str, _shared: &crate::scrubber::Shared) {}
