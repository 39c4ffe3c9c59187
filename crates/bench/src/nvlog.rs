//! `bitmend bench nvlog`: the PRIMS paper's Figure 2, side by side in one process.
//!
//! Small writes (random 10..100 bytes, and fixed 10, 25, 50, 100) into:
//! (a) the encoded log, m = 1, 2, 4 (k = 8, 4 KiB chunks), on a /dev/shm mapping persisted
//!     with cache-line write-backs (what persistent memory would cost);
//! (b) a region kept read-only by mprotect, unprotected and reprotected around each write;
//! (c) plain stores plus clwb + sfence on the same kind of mapping: the floor;
//! (d) PMDK libpmemobj transactions (snapshot the range, copy, commit) on a /dev/shm pool
//!     with PMEM_IS_PMEM_FORCE=1.
//! Each contender runs the same sizes; the figure is the median ns per write over the runs.

use std::path::PathBuf;
use std::time::Instant;

use bitmend_anchors::pmdk;
use bitmend_media::pmem::{MmapRegion, Persistence, ProtectedRegion, Region};
use bitmend_media::rng::Rng;
use bitmend_nvlog::{LogConfig, NvLog, RecordId};

use crate::harness::{median, Options, Row};

const SPAN: usize = 16 << 20;

fn shm_path(what: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/bitmend-bench-{what}-{}", std::process::id()))
}

/// Touches every page once, so that no contender pays first-touch page faults in the timing.
fn prefault<R: Region>(mut r: R) -> R {
    let len = r.len();
    r.update(0, len, &mut |b| b.fill(0)).expect("prefault");
    r
}

/// One way of making a small write durable.
trait Contender {
    fn write(&mut self, data: &[u8]);
}

struct Log {
    log: NvLog<MmapRegion>,
    ring: u64,
    path: PathBuf,
    count: u64,
}

impl Log {
    fn new(m: usize) -> Log {
        let path = shm_path(&format!("nvlog-m{m}"));
        let _ = std::fs::remove_file(&path);
        let region = prefault(
            MmapRegion::create(&path, 96 << 20)
                .expect("create /dev/shm region")
                .with_persistence(Persistence::CacheLineFlush),
        );
        let log = NvLog::format(region, LogConfig::new(8, m, 4096)).expect("format");
        let ring = log.config().segments as u64 * log.config().segment_data();
        Log { log, ring, path, count: 0 }
    }
}

impl Contender for Log {
    fn write(&mut self, data: &[u8]) {
        self.log.append(1, data).expect("append");
        self.count += 1;
        if self.count.is_multiple_of(4096) {
            let (head, tail) = (self.log.head().0, self.log.tail().0);
            if tail - head > self.ring / 2 {
                self.log.trim(RecordId(tail - self.ring / 4)).expect("trim");
            }
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A sequential cursor over a span, wrapping.
struct Cursor(usize);

impl Cursor {
    fn next(&mut self, len: usize) -> usize {
        if self.0 + len > SPAN {
            self.0 = 0;
        }
        let at = self.0;
        self.0 += len;
        at
    }
}

struct Mprotect(ProtectedRegion, Cursor);

impl Contender for Mprotect {
    fn write(&mut self, data: &[u8]) {
        let at = self.1.next(data.len());
        self.0.write(at, data).expect("mprotect write");
    }
}

struct Floor(MmapRegion, Cursor, PathBuf);

impl Contender for Floor {
    fn write(&mut self, data: &[u8]) {
        let at = self.1.next(data.len());
        self.0.write(at, data).expect("store");
        self.0.persist(at, data.len()).expect("persist");
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.2);
    }
}

struct Pmdk(pmdk::Pool, Cursor);

impl Contender for Pmdk {
    fn write(&mut self, data: &[u8]) {
        let at = self.1.next(data.len());
        self.0.tx_write(at, data).expect("pmdk tx");
    }
}

/// Nanoseconds per write of `sizes` (cycling through `payload`).
fn time(c: &mut dyn Contender, sizes: &[usize], payload: &[u8]) -> f64 {
    let t = Instant::now();
    for (i, &len) in sizes.iter().enumerate() {
        let start = i % 16;
        c.write(&payload[start..start + len]);
    }
    t.elapsed().as_secs_f64() * 1e9 / sizes.len() as f64
}

/// Runs every case, calling `emit` with each row as soon as it is measured.
pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    // PMDK reads this when it first checks whether a mapping is persistent memory; without
    // it a tmpfs pool would be msync'ed on every commit.
    std::env::set_var("PMEM_IS_PMEM_FORCE", "1");
    let (mixed_n, bucket_n, runs) = if opts.quick { (20_000, 10_000, 1) } else { (1_000_000, 200_000, 3) };
    let mut rng = Rng::new(2007);
    let mut payload = vec![0u8; 128];
    rng.fill(&mut payload);
    let mixed: Vec<usize> = (0..mixed_n).map(|_| 10 + rng.below(91) as usize).collect();
    let mut workloads: Vec<(String, Vec<usize>)> = vec![("10..100B".into(), mixed)];
    for size in [10usize, 25, 50, 100] {
        workloads.push((format!("{size}B"), vec![size; bucket_n]));
    }

    let ms = [1usize, 2, 4];
    let mut logs: Vec<Log> = ms.iter().map(|&m| Log::new(m)).collect();
    let mut mprotect = Mprotect(prefault(ProtectedRegion::new(SPAN).expect("mprotect region")), Cursor(0));
    let floor_path = shm_path("floor");
    let _ = std::fs::remove_file(&floor_path);
    let floor_region = MmapRegion::create(&floor_path, SPAN)
        .expect("floor region")
        .with_persistence(Persistence::CacheLineFlush);
    let mut floor = Floor(floor_region, Cursor(0), floor_path);
    let pool_path = shm_path("pmdk");
    let _ = std::fs::remove_file(&pool_path);
    let mut pmdk =
        pmdk::Pool::create(&pool_path, 64 << 20, SPAN).and_then(|r| r.ok()).map(|p| Pmdk(p, Cursor(0)));

    for (name, sizes) in &workloads {
        let mut log_ns: Vec<Vec<f64>> = vec![Vec::new(); ms.len()];
        let (mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            for (i, l) in logs.iter_mut().enumerate() {
                log_ns[i].push(time(l, sizes, &payload));
            }
            b.push(time(&mut mprotect, sizes, &payload));
            c.push(time(&mut floor, sizes, &payload));
            if let Some(p) = pmdk.as_mut() {
                d.push(time(p, sizes, &payload));
            }
        }
        let (b, c) = (median(&mut b), median(&mut c));
        let d = (!d.is_empty()).then(|| median(&mut d));
        for (i, &m) in ms.iter().enumerate() {
            let ours = median(&mut log_ns[i]);
            let case = |vs: &str| format!("append m={m} {name} vs {vs}");
            emit(Row::latency(case("mprotect"), ours, "mprotect pair", Some(b)).in_bench("nvlog"));
            emit(Row::latency(case("pmdk"), ours, "pmdk tx", d).in_bench("nvlog"));
            emit(Row::latency(case("floor"), ours, "store+clwb+sfence", Some(c)).in_bench("nvlog"));
        }
    }
}
