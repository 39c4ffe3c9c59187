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
use bitmend_heap::{Pool, PoolOptions, Ptr};
use bitmend_media::pmem::{MmapRegion, Persistence, Region};
use bitmend_media::rng::Rng;

use crate::harness::{Options, Row};

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
    fn new(len: usize) -> ShmPool {
        let path = shm_path("pool");
        let _ = std::fs::remove_file(&path);
        let region = MmapRegion::create(&path, len)
            .expect("/dev/shm region")
            .with_persistence(Persistence::CacheLineFlush);
        // The default don't-allocate period: a freed block waits 0.2 s, as a user's would.
        let pool = Pool::create(
            region,
            PoolOptions { reuse_after: Duration::from_millis(200), ..Default::default() },
        )
        .expect("pool");
        ShmPool { pool, path }
    }

    /// `OBJECTS` objects of `size` bytes, their pointers in a root array: the slots.
    fn objects(&mut self, size: u64) -> Ptr {
        self.pool
            .tx(|tx| {
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

    /// Ns per transaction writing `len` bytes at `off` of object i (cycling).
    fn overwrite(&mut self, root: Ptr, len: usize, off: u64, n: usize, payload: &[u8]) -> f64 {
        let t = Instant::now();
        for i in 0..n {
            let data = &payload[i % 16..i % 16 + len];
            self.pool
                .tx(|tx| {
                    let slot = tx.slot(root, 8 * (i % OBJECTS) as u64)?;
                    tx.write_through(slot, off, data).map(|_| ())
                })
                .expect("overwrite");
        }
        t.elapsed().as_secs_f64() * 1e9 / n as f64
    }
}

impl Drop for ShmPool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
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
    let _ = std::fs::remove_file(&floor_path);
    let mut floor = MmapRegion::create(&floor_path, span)
        .expect("floor region")
        .with_persistence(Persistence::CacheLineFlush);
    floor.prefault();
    for size in [64usize, 128, 1024, 4096, 16384] {
        // 55 B stands for MinL2R's and PRIMS's 10..100 B small writes.
        let len = if size == 64 { 55 } else { size };
        let label = format!("{len}B");
        let (mut data, mut whole, mut anchor, mut bare) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            // A fresh pool per run: pointer logging churns blocks through the 0.2 s
            // don't-allocate period.
            let mut heap = ShmPool::new(if opts.quick { 256 << 20 } else { 2 << 30 });
            heap.pool.region_mut().prefault();
            let big = heap.objects(4 * len as u64);
            data.push(heap.overwrite(big, len, len as u64, n, &payload));
            let exact = heap.objects(len as u64);
            whole.push(heap.overwrite(exact, len, 0, n, &payload));
            if let Some(p) = pmdk.as_mut() {
                anchor.push(pmdk_overwrite(p, len, span, n, &payload));
            }
            bare.push(floor_overwrite(&mut floor, len, n, &payload));
        }
        let anchor = (!anchor.is_empty()).then(|| median(&mut anchor));
        let (d, w, f) = (median(&mut data), median(&mut whole), median(&mut bare));
        let quarter = format!("tx overwrite {label}, a quarter of its object (data logging)");
        let all = format!("tx overwrite {label}, all of its object (pointer logging)");
        emit(Row::latency(format!("{quarter} vs pmdk"), d, "pmdk tx", anchor).in_bench("heap"));
        emit(Row::latency(format!("{all} vs pmdk"), w, "pmdk tx", anchor).in_bench("heap"));
        emit(Row::latency(format!("{quarter} vs floor"), d, "store+clwb+sfence", Some(f)).in_bench("heap"));
    }
    let _ = std::fs::remove_file(&floor_path);
}
