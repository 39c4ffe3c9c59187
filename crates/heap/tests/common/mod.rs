//! What the crash tests share.

use bitmend_heap::{Pool, PoolOptions};
use bitmend_media::pmem::{CrashPoint, CrashRegion};
use bitmend_media::rng::Rng;

/// Runs `work` on copies of `base`, each cut by a crash at a random store of its run (`cuts`
/// of them), each crash followed by up to three recoveries themselves cut at a fence; then
/// hands the region and what `work` recorded to `check`. Returns how many crashes struck
/// the workload and how many struck recoveries.
pub fn at_random_stores<P: Default>(
    base: &CrashRegion,
    rng: &mut Rng,
    cuts: usize,
    opts: impl Fn() -> PoolOptions,
    mut work: impl FnMut(&mut CrashRegion, &mut P) -> bool,
    mut check: impl FnMut(CrashRegion, &P),
) -> (u64, u64) {
    let (s0, s1) = {
        let mut r = base.clone();
        let s0 = r.stores();
        assert!(work(&mut r, &mut P::default()), "the workload fails with no crash");
        (s0, r.stores())
    };
    let (mut crashes, mut during_recovery) = (0, 0);
    for _ in 0..cuts {
        let mut r = base.clone();
        r.arm_crash(CrashPoint::Store(s0 + rng.below(s1 - s0)));
        let mut progress = P::default();
        assert!(!work(&mut r, &mut progress), "the crash struck");
        r.crash(rng.next_u64());
        crashes += 1;
        for _ in 0..rng.below(4) {
            let f = r.fences();
            r.arm_crash(CrashPoint::Fence(f + rng.below(6)));
            let opened = Pool::open(&mut r, opts()).is_ok();
            if r.powered() {
                assert!(opened, "a recovery with the power on failed");
                r.disarm();
                break;
            }
            r.crash(rng.next_u64());
            during_recovery += 1;
        }
        check(r, &progress);
    }
    (crashes, during_recovery)
}

/// How many crashes a random-store campaign makes per granularity: `default` in CI, or the
/// count in environment variable `var` for a longer campaign outside it.
pub fn crash_count(var: &str, default: usize) -> usize {
    std::env::var(var).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{var}: a count")))
}
