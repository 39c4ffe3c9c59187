//! PRIMS's on-line check in the daemon: a few namespace groups a second compared with their
//! copies on flash (`Fs::check_state`), in the scrubber's thread. A mismatch means the
//! daemon's memory is wrong: under a supervisor the worker stops, and a new one mounts the
//! state from flash and the NVRAM tier (docs/DESIGN.md, "The supervisor"); alone, the daemon
//! says so and counts it.

use std::time::Instant;

use bitmend_flashfs::Fs;

use crate::flash::Flash;

/// The check's pace and counts.
pub struct StateChecker {
    last: Instant,
    pub compared: u64,
    /// Groups passed over for a copy damaged beyond repair (the scrubber reports those).
    pub unreadable: u64,
    pub mismatches: u64,
}

impl Default for StateChecker {
    fn default() -> Self {
        StateChecker { last: Instant::now(), compared: 0, unreadable: 0, mismatches: 0 }
    }
}

impl StateChecker {
    /// Compares the groups `rate` a second allows since the last step.
    pub fn step(&mut self, fs: &mut Fs<Flash>, rate: u64) {
        let due = (self.last.elapsed().as_secs_f64() * rate as f64) as usize;
        if due == 0 {
            return;
        }
        self.last = Instant::now();
        let r = match fs.check_state(due) {
            Ok(r) => r,
            Err(e) => return eprintln!("bitmend: state check: {e} (tried again later)"),
        };
        self.compared += r.compared as u64;
        self.unreadable += r.unreadable as u64;
        for (prefix, depth) in r.mismatched {
            self.mismatches += 1;
            let said =
                format!("state check: namespace group {prefix:#x}/{depth} in memory is not what flash holds");
            crate::worker::stop_if_memory_failed(&said, true);
            eprintln!("bitmend: {said}: the daemon's memory is wrong; unmount and mount again");
        }
    }

    /// The counts, as JSON fields.
    pub fn json(&self) -> String {
        format!(
            "\"state_groups_compared\": {}, \"state_groups_unreadable\": {}, \"state_mismatches\": {}",
            self.compared, self.unreadable, self.mismatches
        )
    }
}

/// `flip-inode INO BIT` on the control file of a test build (`--features fault-points`): a
/// memory error in an inode's owner. `None` for another command; `Some(false)` for no such inode.
pub fn flip_inode(fs: &mut Fs<Flash>, command: &[u8]) -> Option<bool> {
    let mut words = std::str::from_utf8(command).ok()?.split_whitespace();
    let (Some("flip-inode"), Some(ino), Some(bit), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return None;
    };
    Some(fs.flip_inode(ino.parse().ok()?, bit.parse().ok()?))
}
