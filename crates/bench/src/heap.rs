//! `bitmend bench heap`: transactional overwrites (MinL2R's IOzone range, and 10..100 B),
//! side by side in one process with PMDK's transactions (snapshot the range, copy, commit) on
//! a /dev/shm pool with PMEM_IS_PMEM_FORCE=1, and with the floor of a durable write (store,
//! clwb, sfence; no log at all).
//!
//! Two ways each size is written in the heap:
//! - a change of a quarter of its object: data logging (the old bytes go to the journal
//!   first), what PMDK does too;
//! - a change of the whole object: pointer logging (a new block is written once, only the
//!   slot's old and new pointer are logged), where PMDK still copies the old bytes first.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bitmend_anchors::pmdk;
use bitmend_heap::{LogBytes, Pool, PoolOptions, Ptr, StripeShape};
use bitmend_media::pmem::{MmapRegion, Region};
use bitmend_media::rng::Rng;

use crate::harness::{median, shm_region, LineCounts, Options, Row};
use crate::parity_floor::Recording;

/// The stripes of the healing rows: eight data pages, two parity pages.
const HEALING: StripeShape = StripeShape { k: 8, m: 2 };

/// Objects each case cycles through.
const OBJECTS: usize = 64;

fn shm_path(what: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/bitmend-bench-heap-{what}-{}", std::process::id()))
}

/// A pool on /dev/shm, persisted with cache-line write-backs, removed when dropped.
struct ShmPool {
    pool: Pool<MmapRegion>,
    path: PathBuf,
}

impl ShmPool {
    fn new(len: usize, stripes: Option<StripeShape>) -> ShmPool {
        let path = shm_path("pool");
        let pool = new_pool(shm_region(&path, len, LineCounts::Timed), stripes);
        ShmPool { pool, path }
    }
}

/// A pool on `region` with the default don't-allocate period: a freed block waits 0.2 s, as
/// a user's would.
fn new_pool<R: Region>(region: R, stripes: Option<StripeShape>) -> Pool<R> {
    let opts = PoolOptions { reuse_after: Duration::from_millis(200), stripes, ..Default::default() };
    Pool::create(region, opts).expect("pool")
}

/// `OBJECTS` objects of `size` bytes, their pointers in a root array: the slots.
fn objects<R: Region>(pool: &mut Pool<R>, size: u64) -> Ptr {
    pool.tx(|tx| {
        let root = tx.alloc(8 * OBJECTS as u64)?;
        for i in 0..OBJECTS {
            let p = tx.alloc(size)?;
            tx.write(p, 0, &vec![1; size as usize])?;
            tx.write(root, 8 * i as u64, &p.0.to_le_bytes())?;
        }
        Ok(root)
    })
    .expect("objects")
}

/// What [`overwrite`] does: `len` bytes at `off` of each object in turn, `n` transactions.
#[derive(Clone, Copy)]
struct Overwrites<'a> {
    root: Ptr,
    len: usize,
    off: u64,
    n: usize,
    payload: &'a [u8],
}

/// Ns per transaction of `w`, and the journal bytes they logged beside what redo logging
/// would have.
fn overwrite<R: Region>(pool: &mut Pool<R>, w: Overwrites) -> (f64, LogBytes) {
    let before = pool.log_bytes();
    let t = Instant::now();
    for i in 0..w.n {
        let data = &w.payload[i % 16..i % 16 + w.len];
        pool.tx(|tx| {
            let slot = tx.slot(w.root, 8 * (i % OBJECTS) as u64)?;
            tx.write_through(slot, w.off, data).map(|_| ())
        })
        .expect("overwrite");
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / w.n as f64;
    let after = pool.log_bytes();
    let logged = LogBytes {
        undo: after.undo - before.undo,
        pointer: after.pointer - before.pointer,
        other: after.other - before.other,
        redo_equivalent: after.redo_equivalent - before.redo_equivalent,
    };
    (ns, logged)
}

/// The parity floor of the healing data-logged rows (see [`crate::parity_floor`]): the same
/// transactions on a pool with [`HEALING`] stripes, every store into its parity pages noted,
/// then replayed alone on a fresh region. Ns per transaction; added to the transaction with
/// no stripes, the least any design that patches parity at commit pays.
fn data_log_parity_floor(pool_len: usize, len: usize, n: usize, payload: &[u8]) -> f64 {
    let path = shm_path("parity-floor");
    let mut pool = new_pool(Recording::new(shm_region(&path, pool_len, LineCounts::Timed)), Some(HEALING));
    let geo = pool.geometry().expect("a pool with stripes");
    let root = objects(&mut pool, 4 * len as u64);
    pool.region_mut().watch(geo.parity_at as usize, geo.sigs_at as usize);
    overwrite(&mut pool, Overwrites { root, len, off: len as u64, n, payload });
    let trace = pool.into_region().finish();
    let _ = std::fs::remove_file(&path);
    trace.replay(&shm_path("parity-floor-replay")) / n as f64
}

/// Log bytes per transaction: ours, and redo logging's for the same writes.
fn per_tx(b: LogBytes, n: usize) -> (f64, f64) {
    ((b.undo + b.pointer + b.other) as f64 / n as f64, b.redo_equivalent as f64 / n as f64)
}

impl Drop for ShmPool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Ns per PMDK transaction writing `len` bytes (cycling through its root object).
fn pmdk_overwrite(p: &mut pmdk::Pool, len: usize, span: usize, n: usize, payload: &[u8]) -> f64 {
    let t = Instant::now();
    let mut at = 0;
    for i in 0..n {
        if at + len > span {
            at = 0;
        }
        p.tx_write(at, &payload[i % 16..i % 16 + len]).expect("pmdk tx");
        at += len;
    }
    t.elapsed().as_secs_f64() * 1e9 / n as f64
}

/// Ns per store + persist of `len` bytes (the floor).
fn floor_overwrite(r: &mut MmapRegion, len: usize, n: usize, payload: &[u8]) -> f64 {
    let t = Instant::now();
    let mut at = 0;
    for i in 0..n {
        if at + len > r.len() {
            at = 0;
        }
        r.write(at, &payload[i % 16..i % 16 + len]).expect("store");
        r.persist(at, len).expect("persist");
        at += len;
    }
    t.elapsed().as_secs_f64() * 1e9 / n as f64
}

/// Ns per durable undo-logged write with nothing else (the floor of any undo log): the old
/// bytes copied to a log area and persisted, the new bytes written and persisted, a commit
/// word written and persisted; three fences, no checksum, no parity.
fn undo_floor(r: &mut MmapRegion, len: usize, n: usize, payload: &[u8]) -> f64 {
    let log = r.len() - (32 << 10);
    let data_span = log - (64 << 10);
    let mut old = vec![0u8; len];
    let t = Instant::now();
    let mut at = 0;
    for i in 0..n {
        if at + len > data_span {
            at = 0;
        }
        old.copy_from_slice(&r.bytes()[at..at + len]);
        r.write(log - len.next_multiple_of(64), &old).expect("log");
        r.persist(log - len.next_multiple_of(64), len).expect("persist");
        r.write(at, &payload[i % 16..i % 16 + len]).expect("store");
        r.persist(at, len).expect("persist");
        r.write(log, &(i as u64).to_le_bytes()).expect("commit");
        r.persist(log, 8).expect("persist");
        at += len;
    }
    t.elapsed().as_secs_f64() * 1e9 / n as f64
}

/// Runs every case, calling `emit` with each row as soon as it is measured.
pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    std::env::set_var("PMEM_IS_PMEM_FORCE", "1");
    let (n, runs) = if opts.quick { (2_000, 1) } else { (40_000, 3) };
    let mut rng = Rng::new(17);
    let mut payload = vec![0u8; (16 << 10) + 16];
    rng.fill(&mut payload);
    let span = 16 << 20;
    let pool_path = shm_path("pmdk");
    let _ = std::fs::remove_file(&pool_path);
    let mut pmdk = pmdk::Pool::create(&pool_path, 64 << 20, span).and_then(|r| r.ok());
    let floor_path = shm_path("floor");
    let mut floor = shm_region(&floor_path, span, LineCounts::Timed);
    for size in [64usize, 128, 1024, 4096, 16384] {
        // 55 B stands for MinL2R's and PRIMS's 10..100 B small writes.
        let len = if size == 64 { 55 } else { size };
        let label = format!("{len}B");
        let (mut data, mut whole, mut anchor) = (Vec::new(), Vec::new(), Vec::new());
        let (mut bare, mut undo) = (Vec::new(), Vec::new());
        let (mut healed_data, mut healed_whole, mut parity) = (Vec::new(), Vec::new(), Vec::new());
        let (mut data_log, mut whole_log) = (LogBytes::default(), LogBytes::default());
        for _ in 0..runs {
            // A fresh pool per run: pointer logging churns blocks through the 0.2 s
            // don't-allocate period.
            let pool_len = if opts.quick { 256 << 20 } else { 2 << 30 };
            let quarters = |root| Overwrites { root, len, off: len as u64, n, payload: &payload };
            let wholes = |root| Overwrites { root, len, off: 0, n, payload: &payload };
            let mut heap = ShmPool::new(pool_len, None);
            let big = objects(&mut heap.pool, 4 * len as u64);
            let (ns, logged) = overwrite(&mut heap.pool, quarters(big));
            data.push(ns);
            data_log = logged;
            let exact = objects(&mut heap.pool, len as u64);
            let (ns, logged) = overwrite(&mut heap.pool, wholes(exact));
            whole.push(ns);
            whole_log = logged;
            drop(heap);
            let mut heap = ShmPool::new(pool_len, Some(HEALING));
            let big = objects(&mut heap.pool, 4 * len as u64);
            healed_data.push(overwrite(&mut heap.pool, quarters(big)).0);
            let exact = objects(&mut heap.pool, len as u64);
            healed_whole.push(overwrite(&mut heap.pool, wholes(exact)).0);
            drop(heap);
            parity.push(data_log_parity_floor(pool_len, len, n, &payload));
            if let Some(p) = pmdk.as_mut() {
                anchor.push(pmdk_overwrite(p, len, span, n, &payload));
            }
            bare.push(floor_overwrite(&mut floor, len, n, &payload));
            undo.push(undo_floor(&mut floor, len, n, &payload));
        }
        let anchor = (!anchor.is_empty()).then(|| median(&mut anchor));
        let (d, w) = (median(&mut data), median(&mut whole));
        let (f, u) = (median(&mut bare), median(&mut undo));
        let quarter = format!("tx overwrite {label}, a quarter of its object (data logging)");
        let all = format!("tx overwrite {label}, all of its object (pointer logging)");
        emit(Row::latency(format!("{quarter} vs pmdk"), d, "pmdk tx", anchor).in_bench("heap"));
        emit(Row::latency(format!("{all} vs pmdk"), w, "pmdk tx", anchor).in_bench("heap"));
        emit(Row::latency(format!("{quarter} vs floor"), d, "store+clwb+sfence", Some(f)).in_bench("heap"));
        let floor = "undo floor (log, data, commit; 3 fences)";
        emit(Row::latency(format!("{quarter} vs undo floor"), d, floor, Some(u)).in_bench("heap"));
        let healing = format!("healing k {} m {}", HEALING.k, HEALING.m);
        let healed = [median(&mut healed_data), median(&mut healed_whole)];
        for (what, ours, plain) in [(&quarter, healed[0], d), (&all, healed[1], w)] {
            let row =
                Row::latency(format!("{what}, {healing} vs no stripes"), ours, "no stripes", Some(plain));
            emit(row.in_bench("heap"));
        }
        // Where the data-logged rows stop short of their target: the floor beside them.
        let floor = d + median(&mut parity);
        let what = format!("{quarter}, {healing}: floor (no stripes + its parity stores alone)");
        emit(Row::latency(format!("{what} vs no stripes"), floor, "no stripes", Some(d)).in_bench("heap"));
        let what = format!("{quarter}, {healing} vs its floor");
        emit(Row::latency(what, healed[0], "floor", Some(floor)).in_bench("heap"));
        for (what, logged) in [(quarter, data_log), (all, whole_log)] {
            let (ours, redo) = per_tx(logged, n);
            emit(
                Row::count(&format!("log bytes per tx, {what} vs redo"), ours, "redo logging", Some(redo))
                    .in_bench("heap"),
            );
        }
    }
    let _ = std::fs::remove_file(&floor_path);
    counters(opts, &payload, emit);
}

/// NVMalloc's cache line counters: the parity, signature and check lines a transaction
/// patches are noted and flushed once, before the fence that makes its data durable, against
/// a flush after every store (no counters). Lines and fences per transaction, healing pool.
fn counters(opts: &Options, payload: &[u8], emit: &mut dyn FnMut(Row)) {
    let n = if opts.quick { 500 } else { 10_000 };
    for (len, whole) in [(55usize, false), (4096, false), (4096, true)] {
        let mut per_tx = Vec::new();
        for eager in [false, true] {
            let mut heap = ShmPool::new(if opts.quick { 128 << 20 } else { 512 << 20 }, Some(HEALING));
            heap.pool.set_eager_flush(eager);
            let (size, off) = if whole { (len, 0) } else { (4 * len, len as u64) };
            let root = objects(&mut heap.pool, size as u64);
            let before = heap.pool.heal_stats();
            overwrite(&mut heap.pool, Overwrites { root, len, off, n, payload });
            let after = heap.pool.heal_stats();
            per_tx.push((
                (after.lines_flushed - before.lines_flushed) as f64 / n as f64,
                (after.fences - before.fences) as f64 / n as f64,
            ));
        }
        let how = if whole { "pointer logging" } else { "data logging" };
        let case = format!("tx overwrite {len}B ({how}), healing: lines flushed per tx, counters");
        emit(Row::count(&case, per_tx[0].0, "a flush per store", Some(per_tx[1].0)).in_bench("heap"));
        let case = format!("tx overwrite {len}B ({how}), healing: fences per tx, counters");
        emit(Row::count(&case, per_tx[0].1, "a flush per store", Some(per_tx[1].1)).in_bench("heap"));
    }
}
