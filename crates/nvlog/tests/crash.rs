//! Crash campaigns on a simulated cache in front of persistent memory: the workload is cut at
//! every fence (and at random stores), unpersisted lines are lost or kept at random, and after
//! recovery every acknowledged record reads back byte for byte, nothing else appears but
//! possibly the one append in flight (whole), and the log goes on working.

mod common;

use bitmend_media::pmem::{CrashGranularity, CrashPoint, CrashRegion, RegionError};
use bitmend_media::rng::Rng;
use bitmend_nvlog::{LogError, NvLog};
use common::*;

const SEED: u64 = 77;
const RECORDS: u64 = 160;
const MAX: usize = 150;
const KEEP: usize = 50;

fn formatted(m: usize, g: CrashGranularity) -> CrashRegion {
    let cfg = small(m);
    let region = CrashRegion::new(region_len(cfg)).with_crash_model(g, 0.5);
    NvLog::format(region, cfg).unwrap().into_region()
}

/// Runs the workload on a copy of `base` with a crash armed at `point`, crashes with
/// `seed`, recovers, and checks. Returns whether the in-flight append survived whole.
fn run_once(base: &CrashRegion, point: CrashPoint, seed: u64) -> bool {
    let (mut log, _) = NvLog::open(base.clone()).unwrap();
    log.region_mut().arm_crash(point);
    let mut model = Model::default();
    let r = workload(&mut log, &mut model, SEED, 0, RECORDS, MAX, KEEP);
    assert!(
        matches!(r, Err(LogError::Region(RegionError::PowerLost))),
        "crash point {point:?} not reached: {r:?}"
    );
    let mut region = log.into_region();
    region.crash(seed);
    let (mut log, rec) = NvLog::open(region).unwrap_or_else(|e| panic!("{point:?} seed {seed}: open: {e}"));
    assert!(rec.unrecoverable.is_empty(), "{point:?}: {rec}");
    let head = log.head();
    let acked = model.live_from(head);
    let got = log.records().unwrap_or_else(|e| panic!("{point:?} seed {seed}: replay: {e}"));
    assert!(
        got.len() == acked.len() || got.len() == acked.len() + 1,
        "{point:?} seed {seed}: {} records, {} acked",
        got.len(),
        acked.len()
    );
    for (g, (id, tag, data)) in got.iter().zip(&acked) {
        assert_eq!(
            (g.id, g.tag, &g.data),
            (*id, *tag, data),
            "{point:?} seed {seed}: acknowledged record lost or changed"
        );
    }
    let survived = got.len() > acked.len();
    if survived {
        // The append in flight made it whole: it is exactly what was being appended.
        let (tag, data) = payload(SEED, model.records.len() as u64, MAX);
        let extra = got.last().unwrap();
        assert_eq!(
            (extra.tag, &extra.data),
            (tag, &data),
            "{point:?} seed {seed}: a half-written record appeared"
        );
        model.records.push((extra.id, tag, data));
    }
    for (id, tag, data) in &acked {
        let r = log.read(*id).unwrap();
        assert_eq!((r.tag, &r.data), (*tag, data));
    }
    // The log goes on: more appends, then everything checks out again.
    let next = model.records.len() as u64;
    workload(&mut log, &mut model, SEED, next, next + 30, MAX, KEEP).unwrap();
    check_all(&mut log, &model);
    survived
}

fn fences_in_workload(base: &CrashRegion) -> (u64, u64, u64, u64) {
    let (mut log, _) = NvLog::open(base.clone()).unwrap();
    let (f0, s0) = (log.region().fences(), log.region().stores());
    let mut model = Model::default();
    workload(&mut log, &mut model, SEED, 0, RECORDS, MAX, KEEP).unwrap();
    (f0, log.region().fences(), s0, log.region().stores())
}

#[test]
fn crash_at_every_fence() {
    let mut runs = 0;
    let mut survived = 0;
    for m in [0, 1, 2, 4] {
        for g in [CrashGranularity::Line, CrashGranularity::Word] {
            let base = formatted(m, g);
            let (f0, f1, _, _) = fences_in_workload(&base);
            assert!(f1 - f0 > RECORDS, "every append fences at least once");
            for f in f0..f1 {
                for seed in 0..2 {
                    survived += run_once(&base, CrashPoint::Fence(f), f * 31 + seed) as u64;
                    runs += 1;
                }
            }
        }
    }
    eprintln!("crash campaign: {runs} crashes at every fence, m=0,1,2,4, line and word loss; {survived} in-flight appends survived whole; 0 acknowledged records lost");
    assert!(runs > 2000);
    assert!(survived > 0, "some crashes keep the in-flight append (its lines happened to be written back)");
}

#[test]
fn crash_at_random_stores() {
    let mut rng = Rng::new(2026);
    let mut runs = 0;
    for m in [1, 2, 4] {
        for g in [CrashGranularity::Line, CrashGranularity::Word] {
            let base = formatted(m, g);
            let (_, _, s0, s1) = fences_in_workload(&base);
            for _ in 0..150 {
                let at = s0 + rng.below(s1 - s0);
                run_once(&base, CrashPoint::Store(at), rng.next_u64());
                runs += 1;
            }
        }
    }
    eprintln!("crash campaign: {runs} crashes at random stores, m=1,2,4; 0 acknowledged records lost");
}

#[test]
fn repeated_crashes_during_recovery_and_after() {
    // Crash, recover, append a little, crash again, many times over one log.
    let base = formatted(2, CrashGranularity::Word);
    let mut region = base;
    let mut model = Model::default();
    let mut rng = Rng::new(5);
    let mut next = 0u64;
    for round in 0..60 {
        let (mut log, rec) = NvLog::open(region).unwrap();
        assert!(rec.unrecoverable.is_empty(), "round {round}: {rec}");
        // Records acknowledged so far (and possibly one whole in-flight append) are there.
        let got = log.records().unwrap();
        let acked = model.live_from(log.head());
        assert!(got.len() == acked.len() || got.len() == acked.len() + 1, "round {round}");
        for (g, (id, tag, data)) in got.iter().zip(&acked) {
            assert_eq!((g.id, g.tag, &g.data), (*id, *tag, data), "round {round}");
        }
        if got.len() > acked.len() {
            let e = got.last().unwrap();
            model.records.push((e.id, e.tag, e.data.clone()));
            next += 1;
        }
        let stores = log.region().stores();
        log.region_mut().arm_crash(CrashPoint::Store(stores + 1 + rng.below(250)));
        let r = workload(&mut log, &mut model, 99, next, next + 100, MAX, KEEP);
        next = model.records.len() as u64;
        assert!(r.is_err(), "round {round}: crash point reached");
        region = log.into_region();
        region.crash(rng.next_u64());
        // Keep model ids consistent with the stream position.
        next = next.max(model.records.len() as u64);
    }
}
