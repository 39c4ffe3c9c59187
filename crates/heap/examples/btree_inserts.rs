//! Inserts of random 8-byte keys with 256-byte values into a pool on /dev/shm, for a profiler
//! (`perf record`): the B+tree row of `bitmend bench heap` without the anchors around it.
//! Usage: `btree_inserts [N] [M]` (M = -1: no stripes; else stripes of k = 8 with M parity pages).

use std::time::Instant;

use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions, StripeShape};
use bitmend_media::pmem::{MmapRegion, Persistence};
use bitmend_media::rng::Rng;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let m: i8 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let path = std::path::PathBuf::from(format!("/dev/shm/bitmend-example-{}", std::process::id()));
    let mut region = MmapRegion::create(&path, (n * 2_000).max(256 << 20))
        .expect("a region")
        .with_persistence(Persistence::CacheLineFlush);
    region.prefault();
    let stripes = (m >= 0).then_some(StripeShape { k: 8, m: m as u8 });
    let mut pool = Pool::create(region, PoolOptions { stripes, ..PoolOptions::default() }).expect("pool");
    let kv = Kv::create(&mut pool).expect("store");
    let mut rng = Rng::new(0xB7EE);
    let t = Instant::now();
    for _ in 0..n {
        let k = rng.next_u64();
        let mut v = [0u8; 256];
        for (i, c) in v.chunks_mut(8).enumerate() {
            c.copy_from_slice(&(k ^ i as u64).to_le_bytes());
        }
        kv.put(&mut pool, &k.to_be_bytes(), &v).expect("insert");
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / n as f64;
    println!("{n} inserts, m {m}: {ns:.0} ns per insert; {:?}", pool.heal_stats());
    drop(pool);
    let _ = std::fs::remove_file(&path);
}
