//! How long background work held the file system's lock: the newest holds of each kind
//! (write-back steps, cleaner steps), reported in the control file's JSON, so that the claim
//! "a request waits for at most one short step" is something a user can read off a running
//! mount rather than take on trust.

use std::time::Duration;

/// Holds kept per kind: the newest, in a ring (16 KiB each).
const KEPT: usize = 4096;

/// The newest holds of one kind of step, in microseconds.
#[derive(Clone, Debug, Default)]
pub struct Holds {
    ring: Vec<u32>,
    next: usize,
    /// Every hold recorded since the mount, and the longest.
    pub count: u64,
    pub max_us: u32,
}

impl Holds {
    pub fn record(&mut self, held: Duration) {
        let us = held.as_micros().min(u32::MAX as u128) as u32;
        if self.ring.len() < KEPT {
            self.ring.push(us);
        } else {
            self.ring[self.next] = us;
        }
        self.next = (self.next + 1) % KEPT;
        self.count += 1;
        self.max_us = self.max_us.max(us);
    }

    /// The `p`th percentile (0..=100) of the kept holds, in microseconds (0 with none).
    pub fn percentile(&self, p: u32) -> u32 {
        if self.ring.is_empty() {
            return 0;
        }
        let mut sorted = self.ring.clone();
        sorted.sort_unstable();
        let rank = (sorted.len() - 1) * p.min(100) as usize / 100;
        sorted[rank]
    }

    /// `"PREFIX_steps": N, "PREFIX_hold_p50_us": .., "PREFIX_hold_p99_us": .., "PREFIX_hold_max_us": ..`
    pub fn json(&self, prefix: &str) -> String {
        format!(
            "\"{prefix}_steps\": {}, \"{prefix}_hold_p50_us\": {}, \"{prefix}_hold_p99_us\": {}, \"{prefix}_hold_max_us\": {}",
            self.count,
            self.percentile(50),
            self.percentile(99),
            self.max_us
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_over_the_newest_holds_and_the_max_over_all() {
        let mut h = Holds::default();
        assert_eq!((h.percentile(50), h.percentile(99), h.max_us), (0, 0, 0));
        h.record(Duration::from_millis(50));
        for us in 1..=KEPT as u64 {
            h.record(Duration::from_micros(us));
        }
        // The 50 ms hold fell out of the ring, but stays the max.
        assert_eq!(h.count, KEPT as u64 + 1);
        assert_eq!(h.max_us, 50_000);
        assert_eq!(h.percentile(0), 1);
        assert_eq!(h.percentile(50), (KEPT as u32 - 1) / 2 + 1);
        assert_eq!(h.percentile(100), KEPT as u32);
        assert!(h.json("clean").contains("\"clean_hold_max_us\": 50000"));
    }
}
