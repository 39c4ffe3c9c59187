//! Power-cut campaigns: a workload run again and again, the power cut at a different
//! operation each time, and what a reboot finds checked (littlefs's test runner does this at
//! every write). One harness for NAND and persistent memory alike: the medium says what an
//! operation is and what a reboot keeps.

use crate::nand::{FaultyNand, Nand, RawAccess};
use crate::pmem::{CrashPoint, CrashRegion};
use crate::rng::Rng;

/// A medium whose power can be cut at a numbered operation.
pub trait PowerCut: Clone {
    /// Operations counted so far (the numbering of [`arm`](Self::arm)).
    fn ops(&self) -> u64;
    /// Cuts the power during operation `op` (counted as [`ops`](Self::ops) counts).
    fn arm(&mut self, op: u64);
    /// Whether an armed cut has struck.
    fn cut(&self) -> bool;
    /// Power back on: the medium holds what a reboot finds (`seed` draws what a cache
    /// happened to write back, where the medium has one).
    fn reboot(&mut self, seed: u64);
}

/// NAND: an operation is a program or an erase; the one in flight is torn, by an amount
/// drawn from the cut point (each cut tears differently).
impl<N: Nand + RawAccess + Clone> PowerCut for FaultyNand<N> {
    fn ops(&self) -> u64 {
        FaultyNand::ops(self)
    }
    fn arm(&mut self, op: u64) {
        self.reseed(op);
        self.cut_power_at(op);
    }
    fn cut(&self) -> bool {
        !self.powered()
    }
    fn reboot(&mut self, _seed: u64) {
        self.power_on();
    }
}

/// Persistent memory: an operation is a fence; the lines not yet written back are kept or
/// lost line by line.
impl PowerCut for CrashRegion {
    fn ops(&self) -> u64 {
        self.fences()
    }
    fn arm(&mut self, op: u64) {
        self.arm_crash(CrashPoint::Fence(op));
    }
    fn cut(&self) -> bool {
        !self.powered()
    }
    fn reboot(&mut self, seed: u64) {
        self.crash(seed);
    }
}

/// Which operations a campaign cuts at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Every one.
    Every,
    /// Every k-th, from the first.
    EveryKth(u64),
    /// `cuts` drawn at random (without repeats) from `seed`.
    Random { seed: u64, cuts: u64 },
}

impl Schedule {
    /// The cut points among `total` operations, in order.
    pub fn points(self, total: u64) -> Vec<u64> {
        match self {
            Schedule::Every => (0..total).collect(),
            Schedule::EveryKth(k) => (0..total).step_by(k.max(1) as usize).collect(),
            Schedule::Random { seed, cuts } => {
                let mut rng = Rng::new(seed);
                let mut v: Vec<u64> = (0..cuts.min(total) * 4).map(|_| rng.below(total.max(1))).collect();
                v.sort_unstable();
                v.dedup();
                v.truncate(cuts as usize);
                v
            }
        }
    }
}

/// What a campaign did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Campaign {
    /// Operations the workload takes uncut.
    pub ops: u64,
    /// Reboots checked: one per cut point, or `reboots` per cut point (see [`run_rebooting`]).
    pub cuts: u64,
    /// Cut points a run finished before: a workload's operation count may vary a little from
    /// run to run (a flash file system's checkpoint, compressed, follows its timestamps and
    /// the order of its hash maps), so the last points of the uncut run may not be reached.
    pub skipped: u64,
}

/// Runs `work` on a copy of `base` once uncut (it must succeed: that counts its operations),
/// then once per cut point of `schedule` with the power cut there; each cut run's medium is
/// rebooted and handed to `check` with the operation the cut struck (counted from the start
/// of the workload). `work` returns whether it finished; a run that fails with the power on
/// is a bug the harness reports.
pub fn run<M: PowerCut>(
    base: &M,
    schedule: Schedule,
    work: impl FnMut(&mut M) -> bool,
    check: impl FnMut(M, u64),
) -> Campaign {
    run_rebooting(base, schedule, 1, work, check)
}

/// As [`run`], with each cut rebooted `reboots` times, each a copy of the medium as the cut
/// left it, rebooted with its own seed: on persistent memory, which lines a cache had written
/// back differs from one reboot to the next, and one cut point tries several. The workload
/// runs once per cut point, so state it recorded (what it acknowledged) holds for every
/// reboot of that cut. Reboot `r` of the cut at operation `op` uses seed `op * reboots + r`.
pub fn run_rebooting<M: PowerCut>(
    base: &M,
    schedule: Schedule,
    reboots: u64,
    mut work: impl FnMut(&mut M) -> bool,
    mut check: impl FnMut(M, u64),
) -> Campaign {
    let start = base.ops();
    let mut uncut = base.clone();
    assert!(work(&mut uncut), "the workload fails with no power cut");
    let total = uncut.ops() - start;
    let mut campaign = Campaign { ops: total, cuts: 0, skipped: 0 };
    for op in schedule.points(total) {
        let mut m = base.clone();
        m.arm(start + op);
        let finished = work(&mut m);
        if !m.cut() {
            // Never struck: the run must have finished, short of the point.
            assert!(finished, "cut at operation {op} of {total}: never struck, and the run failed");
            campaign.skipped += 1;
            continue;
        }
        for r in 0..reboots {
            let mut copy = m.clone();
            copy.reboot(op.wrapping_mul(reboots).wrapping_add(r));
            check(copy, op);
            campaign.cuts += 1;
        }
    }
    campaign
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_pick_their_points() {
        assert_eq!(Schedule::Every.points(4), vec![0, 1, 2, 3]);
        assert_eq!(Schedule::EveryKth(3).points(10), vec![0, 3, 6, 9]);
        let r = Schedule::Random { seed: 1, cuts: 5 }.points(1000);
        assert!(r.len() == 5 && r.windows(2).all(|w| w[0] < w[1]) && r[4] < 1000, "{r:?}");
        assert_eq!(Schedule::Random { seed: 1, cuts: 50 }.points(3).len(), 3);
        assert!(Schedule::Every.points(0).is_empty());
    }

    #[test]
    fn a_persistent_memory_campaign_finds_an_unordered_protocol() {
        use crate::pmem::Region;
        // A record and its valid flag, persisted in one fence: wrong (the flag may reach
        // memory without the record). A campaign at every fence must catch it.
        let unordered = |r: &mut CrashRegion| {
            r.write(0, &[7u8; 64]).is_ok() && r.write(64, &[1]).is_ok() && r.persist(0, 128).is_ok()
        };
        let mut torn = 0;
        for seed in 0..64 {
            let mut base = CrashRegion::new(4096);
            base.arm(0);
            unordered(&mut base);
            base.reboot(seed);
            let mut b = [0u8; 65];
            base.read(0, &mut b).unwrap();
            torn += (b[64] == 1 && b[0] != 7) as u32;
        }
        assert!(torn > 0, "64 crashes never tore the unordered record");
        // Ordered (the record persisted before the flag): never torn, at every cut.
        let ordered = |r: &mut CrashRegion| {
            r.write(0, &[7u8; 64]).is_ok()
                && r.persist(0, 64).is_ok()
                && r.write(64, &[1]).is_ok()
                && r.persist(64, 1).is_ok()
        };
        let c = run(&CrashRegion::new(4096), Schedule::Every, ordered, |r, op| {
            let mut b = [0u8; 65];
            r.read(0, &mut b).unwrap();
            assert!(b[64] == 0 || b[..64] == [7u8; 64], "cut at fence {op}");
        });
        assert_eq!(c, Campaign { ops: 2, cuts: 2, skipped: 0 });
    }
}
