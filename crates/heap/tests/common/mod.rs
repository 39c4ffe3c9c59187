//! What the crash tests share.
#![allow(dead_code)]

use std::collections::BTreeMap;

use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions};
use bitmend_media::pmem::{CrashPoint, CrashRegion, Region};
use bitmend_media::rng::Rng;

/// A store's entries, or what a model says they are.
pub type Entries = BTreeMap<Vec<u8>, Vec<u8>>;

/// Every entry of the store in `pool`, read with the pool's checks.
pub fn kv_contents<R: Region>(pool: &Pool<R>) -> Entries {
    let kv = Kv::open(pool).unwrap();
    let mut got = Entries::new();
    kv.scan(pool, None, None, &mut |k, v| {
        got.insert(k.to_vec(), v);
        true
    })
    .unwrap();
    got
}

/// After a crash (`when` names it): the pool in `region` opens, its store passes its check,
/// and holds the last committed state of `states` or the one in flight (its commit record
/// made it): the last two.
pub fn assert_committed<R: Region>(region: R, opts: PoolOptions, states: &[Entries], when: &str) {
    let (pool, _) = Pool::open(region, opts).unwrap_or_else(|e| panic!("{when}: {e}"));
    let kv = Kv::open(&pool).unwrap();
    kv.check(&pool).unwrap_or_else(|e| panic!("{when}: {e}"));
    let got = kv_contents(&pool);
    let n = states.len();
    assert!(
        states[n.saturating_sub(2)..].contains(&got),
        "{when}: {} entries match no committed state",
        got.len()
    );
}

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
