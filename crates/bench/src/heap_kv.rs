//! `bitmend bench heap`, the B+tree: inserts of random 8-byte keys with 256-byte values, each
//! one transaction, into the heap's key-value store and into PMDK's example `btree_map`
//! (order 8; the value a new object copied in the same transaction). Beside the time per
//! insert, the wear NVMalloc's slide plots: the share of 64-byte lines by writes per line.
//! Then the same inserts into a pool that heals (stripes of k = 8 pages with m = 1, 2, 4
//! parity pages, signatures and line checks), against PMDK and against no protection; and
//! Zipf-distributed gets from such a pool with each read-check strategy (Loris's ER, LC and
//! LU at one tick) against reads that check nothing (the scrubber alone).

use std::path::PathBuf;
use std::time::Instant;

use bitmend_anchors::{pmdk, pmem_count};
use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions, ReadCheck, StripeShape};
use bitmend_media::pmem::{Guarded, Region, Reprotect};
use bitmend_media::rng::Rng;

use crate::harness::{median, shm_region, LineCounts, Options, Row};
use crate::parity_floor::Recording;

const VALUE: usize = 256;

fn shm(what: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/bitmend-bench-kv-{what}-{}", std::process::id()))
}

fn keys(n: usize) -> Vec<u64> {
    let mut rng = Rng::new(0xB7EE);
    (0..n).map(|_| rng.next_u64()).collect()
}

fn value(key: u64) -> [u8; VALUE] {
    let mut v = [0u8; VALUE];
    for (i, c) in v.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(key ^ i as u64).to_le_bytes());
    }
    v
}

/// Data pages per stripe in the healing rows: parity costs m/8 of the pool.
const STRIPE_K: u8 = 8;

/// Ns per insert into the heap's store (in stripes of `shape`, if any), and the writes per
/// line the inserts made (counted runs).
fn ours(keys: &[u64], pool_len: usize, lines: LineCounts, shape: Option<StripeShape>) -> (f64, Vec<u32>) {
    let path = shm("heap");
    let opts = PoolOptions { stripes: shape, ..PoolOptions::default() };
    let mut pool = Pool::create(shm_region(&path, pool_len, lines), opts).expect("pool");
    let kv = Kv::create(&mut pool).expect("store");
    let before = pool.region().line_writes().to_vec();
    let t = Instant::now();
    for &k in keys {
        kv.put(&mut pool, &k.to_be_bytes(), &value(k)).expect("insert");
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / keys.len() as f64;
    // Spot checks that the store holds what went in (a bench that measured a broken insert
    // would be worthless).
    for &k in keys.iter().step_by(keys.len() / 100 + 1) {
        assert_eq!(kv.get(&pool, &k.to_be_bytes()).expect("get"), Some(value(k).to_vec()));
    }
    let after = pool.region().line_writes();
    let lines = after.iter().zip(&before).map(|(a, b)| a - b).filter(|&d| d > 0).collect();
    drop(pool);
    let _ = std::fs::remove_file(&path);
    (ns, lines)
}

/// The parity floor of the m = 2 inserts (see [`crate::parity_floor`]): ns per insert of
/// their parity stores replayed alone, and parity lines stored per insert.
fn parity_floor(keys: &[u64], pool_len: usize) -> (f64, f64) {
    let path = shm("floor");
    let opts = PoolOptions { stripes: Some(StripeShape { k: STRIPE_K, m: 2 }), ..PoolOptions::default() };
    let region = Recording::new(shm_region(&path, pool_len, LineCounts::Timed));
    let mut pool = Pool::create(region, opts).expect("pool");
    let geo = pool.geometry().expect("a pool with stripes");
    let kv = Kv::create(&mut pool).expect("store");
    pool.region_mut().watch(geo.parity_at as usize, geo.sigs_at as usize);
    for &k in keys {
        kv.put(&mut pool, &k.to_be_bytes(), &value(k)).expect("insert");
    }
    let trace = pool.into_region().finish();
    let _ = std::fs::remove_file(&path);
    let ns = trace.replay(&shm("floor-replay"));
    (ns / keys.len() as f64, trace.lines_stored() as f64 / keys.len() as f64)
}

/// Ns per insert into PMDK's btree_map; with `count`, its line writes instead of a fair
/// time (counting costs).
fn anchor(keys: &[u64], pool_len: usize, count: bool) -> Option<(f64, Vec<u32>)> {
    let path = shm("pmdk");
    let _ = std::fs::remove_file(&path);
    let mut map = pmdk::BTreeMap::create(&path, pool_len)?.ok()?;
    if count {
        let (base, len) = map.mapping();
        pmem_count::watch(base, len);
    }
    let t = Instant::now();
    for &k in keys {
        map.insert(k, &value(k)).expect("pmdk insert");
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / keys.len() as f64;
    let lines = if count { pmem_count::take() } else { Vec::new() };
    for &k in keys.iter().step_by(keys.len() / 100 + 1) {
        assert_eq!(map.get(k, VALUE), Some(&value(k)[..]), "PMDK's map holds key {k:#x}");
    }
    Some((ns, lines))
}

/// `n` draws from a Zipf distribution (s = 0.99) over `keys`: a few keys take most gets.
fn zipf(keys: &[u64], n: usize) -> Vec<u64> {
    let weights: Vec<f64> = (1..=keys.len()).map(|r| 1.0 / (r as f64).powf(0.99)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(keys.len());
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    let mut rng = Rng::new(0x21BF);
    (0..n)
        .map(|_| {
            let u = rng.unit();
            keys[cdf.partition_point(|&c| c < u).min(keys.len() - 1)]
        })
        .collect()
}

/// The parity floor rows: the unprotected insert plus the m = 2 parity stores alone, against
/// PMDK (the best a design that patches parity at commit could do on this machine).
fn floor_rows(
    keys: &[u64],
    pool_len: usize,
    runs: usize,
    (plain, pmdk_ns): (f64, Option<f64>),
    emit: &mut dyn FnMut(Row),
) {
    let mut floors = Vec::new();
    let mut lines = 0.0;
    for _ in 0..runs {
        let (ns, l) = parity_floor(keys, pool_len);
        floors.push(ns);
        lines = l;
    }
    let floor = median(&mut floors);
    let case = format!("B+tree insert, {} inserts, healing k {STRIPE_K} m 2", keys.len());
    emit(
        Row::shown(
            format!("{case}: parity lines stored per insert"),
            lines,
            "unprotected",
            Some(0.0),
            "lines",
        )
        .in_bench("heap"),
    );
    emit(
        Row::latency(
            format!("{case}: its parity stores alone (read, XOR, write, flush, fence)"),
            floor,
            "",
            None,
        )
        .in_bench("heap"),
    );
    emit(
        Row::latency(
            format!("{case}: floor (unprotected insert + its parity stores alone) vs pmdk"),
            plain + floor,
            "pmdk btree_map",
            pmdk_ns,
        )
        .in_bench("heap"),
    );
}

/// Ns per get of `gets` from a healing store of `keys`, with each read-check strategy: ER,
/// LC and LU at one tick, and none (rows against none).
fn verified_gets(keys: &[u64], gets: &[u64], pool_len: usize, runs: usize, emit: &mut dyn FnMut(Row)) {
    let path = shm("gets");
    let opts = PoolOptions { stripes: Some(StripeShape { k: STRIPE_K, m: 2 }), ..PoolOptions::default() };
    let mut pool = Pool::create(shm_region(&path, pool_len, LineCounts::Timed), opts).expect("pool");
    let kv = Kv::create(&mut pool).expect("store");
    for &k in keys {
        kv.put(&mut pool, &k.to_be_bytes(), &value(k)).expect("insert");
    }
    let tick = bitmend_heap::heal::TICK;
    let modes = [
        ("ER (every read)", ReadCheck::Every),
        ("LC (last check a tick ago)", ReadCheck::AfterCheck(tick)),
        ("LU (last use a tick ago)", ReadCheck::AfterUse(tick)),
        // A longer interval, for where the checks cost little.
        ("LC (last check 60 ticks, 1 s, ago)", ReadCheck::AfterCheck(tick * 60)),
        ("none", ReadCheck::Background),
    ];
    let mut ns = vec![Vec::new(); modes.len()];
    let mut checks = vec![0u64; modes.len()];
    // The floors of the two strategies with targets (ER and LC at a tick).
    let mut floors = vec![Vec::new(); 2];
    for _ in 0..runs {
        for (i, f) in floors.iter_mut().enumerate() {
            f.push(check_floor(&mut pool, &kv, gets, modes[i].1));
        }
        for (i, (_, mode)) in modes.iter().enumerate() {
            pool.set_read_check(*mode);
            let before = pool.read_lines_checked();
            let t = Instant::now();
            for &k in gets {
                let v = kv.get(&pool, &k.to_be_bytes()).expect("get");
                assert!(v.is_some_and(|v| v.len() == VALUE), "key {k:#x} holds its value");
            }
            ns[i].push(t.elapsed().as_secs_f64() * 1e9 / gets.len() as f64);
            checks[i] = pool.read_lines_checked() - before;
        }
    }
    drop(pool);
    let _ = std::fs::remove_file(&path);
    let none = median(&mut ns[modes.len() - 1]);
    let case = format!("Zipf get (s 0.99) of {} keys, healing k {STRIPE_K} m 2", keys.len());
    for (i, (name, _)) in modes.iter().enumerate().take(modes.len() - 1) {
        let ours = median(&mut ns[i]);
        let row =
            Row::latency(format!("{case}, read check {name} vs none"), ours, "no read check", Some(none));
        emit(row.in_bench("heap"));
        if let Some(f) = floors.get_mut(i) {
            let floor = median(f);
            let what =
                format!("{case}, read check {name}: floor (no check, then the lines it checked, alone)");
            emit(
                Row::latency(format!("{what} vs none"), floor, "no read check", Some(none)).in_bench("heap"),
            );
            let row =
                Row::latency(format!("{case}, read check {name} vs its floor"), ours, "floor", Some(floor));
            emit(row.in_bench("heap"));
        }
        let per = checks[i] as f64 / gets.len() as f64;
        emit(
            Row::shown(
                format!("{case}, read check {name}: lines checked per get"),
                per,
                "none",
                Some(0.0),
                "lines",
            )
            .in_bench("heap"),
        );
    }
}

/// The floor of read-check strategy `mode` on `gets`: ns per get of the gets with no check,
/// each followed by the checks of the lines `mode` compared for it (noted in a run of its
/// own), with nothing else around them: no clock, no stamps, no choice of pages. What a
/// strategy costs beyond it is its bookkeeping.
fn check_floor<R: Region>(pool: &mut Pool<R>, kv: &Kv, gets: &[u64], mode: ReadCheck) -> f64 {
    pool.set_read_check(mode);
    pool.note_checked_lines(true);
    let (mut runs, mut ends) = (Vec::new(), Vec::with_capacity(gets.len()));
    for &k in gets {
        kv.get(pool, &k.to_be_bytes()).expect("get");
        runs.extend(pool.take_checked_lines());
        ends.push(runs.len());
    }
    pool.note_checked_lines(false);
    pool.set_read_check(ReadCheck::Background);
    let mut start = 0;
    let t = Instant::now();
    for (&k, &end) in gets.iter().zip(&ends) {
        let v = kv.get(pool, &k.to_be_bytes()).expect("get");
        let sound = runs[start..end].iter().all(|&(at, len)| pool.lines_match(at, len));
        assert!(sound && v.is_some_and(|v| v.len() == VALUE), "key {k:#x} holds its value, its lines sound");
        start = end;
    }
    t.elapsed().as_secs_f64() * 1e9 / gets.len() as f64
}

/// Inserts into a store whose pages are read-only between transactions (`reprotect`; none:
/// no protection): mean, median and maximum ns per insert, each timed.
fn guarded_inserts(keys: &[u64], pool_len: usize, reprotect: Option<Reprotect>) -> [f64; 3] {
    let path = shm("guard");
    let region = shm_region(&path, pool_len, LineCounts::Timed);
    let mut times = Vec::with_capacity(keys.len());
    let mut run = |pool: &mut dyn FnMut(u64)| {
        for &k in keys {
            let t = Instant::now();
            pool(k);
            times.push(t.elapsed().as_nanos() as f64);
        }
    };
    match reprotect {
        Some(r) => {
            let mut pool = Pool::create(Guarded::new(region, r), PoolOptions::default()).expect("pool");
            let kv = Kv::create(&mut pool).expect("store");
            run(&mut |k| kv.put(&mut pool, &k.to_be_bytes(), &value(k)).expect("insert"));
        }
        None => {
            let mut pool = Pool::create(region, PoolOptions::default()).expect("pool");
            let kv = Kv::create(&mut pool).expect("store");
            run(&mut |k| kv.put(&mut pool, &k.to_be_bytes(), &value(k)).expect("insert"));
        }
    }
    let _ = std::fs::remove_file(&path);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let max = times.iter().copied().fold(0.0, f64::max);
    [mean, median(&mut times), max]
}

/// NVMalloc's table: B+tree inserts with the pool's pages read-only between transactions,
/// protected again at once (synchronous mprotect) or by the background thread after several
/// quanta, against no protection.
fn mprotect_rows(keys: &[u64], pool_len: usize, emit: &mut dyn FnMut(Row)) {
    let none = guarded_inserts(keys, pool_len, None);
    let modes = [
        ("sync".to_string(), Reprotect::Sync),
        ("async, 0.1 ms quantum".to_string(), Reprotect::After(std::time::Duration::from_micros(100))),
        ("async, 1 ms quantum".to_string(), Reprotect::After(std::time::Duration::from_millis(1))),
        ("async, 10 ms quantum".to_string(), Reprotect::After(std::time::Duration::from_millis(10))),
        ("async, 200 ms quantum".to_string(), Reprotect::After(std::time::Duration::from_millis(200))),
    ];
    let case = format!("B+tree insert, {} inserts, mprotect", keys.len());
    for (name, r) in modes {
        let [mean, med, max] = guarded_inserts(keys, pool_len, Some(r));
        emit(
            Row::latency(format!("{case} {name}: mean vs none"), mean, "no protection", Some(none[0]))
                .in_bench("heap"),
        );
        emit(
            Row::latency(format!("{case} {name}: median vs none"), med, "no protection", Some(none[1]))
                .in_bench("heap"),
        );
        emit(
            Row::latency(format!("{case} {name}: max vs none"), max, "no protection", Some(none[2]))
                .in_bench("heap"),
        );
    }
}

/// Shares of written lines by writes per line, bucket i: 2^i to 2^(i+1) - 1 writes.
fn shares(lines: &[u32]) -> Vec<f64> {
    let mut h = vec![0u64; 1 + lines.iter().map(|&c| c.ilog2() as usize).max().unwrap_or(0)];
    for &c in lines {
        h[c.ilog2() as usize] += 1;
    }
    h.iter().map(|&n| 100.0 * n as f64 / lines.len().max(1) as f64).collect()
}

/// Runs the inserts on both, `runs` times, and emits the rows.
pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let (n, runs, pool_len) = if opts.quick { (20_000, 1, 256 << 20) } else { (1_000_000, 3, 3 << 30) };
    let keys = keys(n);
    let (mut ns, mut pmdk_ns) = (Vec::new(), Vec::new());
    let mut healing = vec![Vec::new(); 3];
    for _ in 0..runs {
        ns.push(ours(&keys, pool_len, LineCounts::Timed, None).0);
        if let Some((t, _)) = anchor(&keys, pool_len, false) {
            pmdk_ns.push(t);
        }
        for (m, v) in [1, 2, 4].into_iter().zip(healing.iter_mut()) {
            v.push(ours(&keys, pool_len, LineCounts::Timed, Some(StripeShape { k: STRIPE_K, m })).0);
        }
    }
    let our_lines = ours(&keys, pool_len, LineCounts::Counted, None).1;
    let pmdk_lines = anchor(&keys, pool_len, true).map(|(_, l)| l).filter(|_| pmem_count::interposed());
    let pmdk_ns = (!pmdk_ns.is_empty()).then(|| median(&mut pmdk_ns));
    let case = format!("B+tree insert, random 8 B keys, {VALUE} B values, {n} inserts");
    let plain = median(&mut ns);
    emit(Row::latency(format!("{case} vs pmdk"), plain, "pmdk btree_map", pmdk_ns).in_bench("heap"));
    for (m, mut v) in [1, 2, 4].into_iter().zip(healing) {
        let healed = median(&mut v);
        let what = format!("{case}, healing k {STRIPE_K} m {m}");
        emit(Row::latency(format!("{what} vs pmdk"), healed, "pmdk btree_map", pmdk_ns).in_bench("heap"));
        emit(
            Row::latency(format!("{what} vs unprotected"), healed, "no stripes", Some(plain))
                .in_bench("heap"),
        );
    }
    floor_rows(&keys, pool_len, runs, (plain, pmdk_ns), emit);
    let (a, b) = (shares(&our_lines), pmdk_lines.as_deref().map(shares));
    for i in 0..a.len().max(b.as_ref().map_or(0, |b| b.len())) {
        let case =
            format!("B+tree inserts: % of written lines written {}..{} times", 1u64 << i, (2u64 << i) - 1);
        let theirs = b.as_ref().map(|b| b.get(i).copied().unwrap_or(0.0));
        emit(Row::shown(case, a.get(i).copied().unwrap_or(0.0), "pmdk", theirs, "%").in_bench("heap"));
    }
    let (stored, gets) = if opts.quick { (20_000, 50_000) } else { (200_000, 1_000_000) };
    verified_gets(
        &keys[..stored.min(keys.len())],
        &zipf(&keys[..stored.min(keys.len())], gets),
        pool_len.min(1 << 30),
        runs,
        emit,
    );
    mprotect_rows(&keys, pool_len, emit);
    let hottest = |l: &[u32]| l.iter().copied().max().unwrap_or(0) as f64;
    let theirs = pmdk_lines.as_deref().map(hottest);
    emit(
        Row::count("B+tree inserts: writes to the hottest line", hottest(&our_lines), "pmdk", theirs)
            .in_bench("heap"),
    );
}
