//! Zipf-distributed gets (s = 0.99) from a store of 8-byte keys with 256-byte values in a
//! pool that heals (k = 8, m = 2), for a profiler: the read-check rows of `bitmend bench heap`
//! without the rest. Usage: `zipf_gets [KEYS] [GETS] [MODE]`, MODE one of none, er, lc, lu,
//! lc1s (LC at 60 ticks).

use std::time::Instant;

use bitmend_heap::heal::TICK;
use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions, ReadCheck, StripeShape};
use bitmend_media::pmem::{MmapRegion, Persistence};
use bitmend_media::rng::Rng;

fn main() {
    let mut args = std::env::args().skip(1);
    let keys: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let gets: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let mode = match args.next().as_deref().unwrap_or("lc") {
        "none" => ReadCheck::Background,
        "er" => ReadCheck::Every,
        "lu" => ReadCheck::AfterUse(TICK),
        "lc1s" => ReadCheck::AfterCheck(TICK * 60),
        _ => ReadCheck::AfterCheck(TICK),
    };
    let path = std::path::PathBuf::from(format!("/dev/shm/bitmend-example-gets-{}", std::process::id()));
    let len = (keys * 2_000).max(256 << 20);
    let region =
        MmapRegion::create(&path, len).expect("a region").with_persistence(Persistence::CacheLineFlush);
    let stripes = Some(StripeShape { k: 8, m: 2 });
    let mut pool = Pool::create(region, PoolOptions { stripes, ..PoolOptions::default() }).expect("pool");
    let kv = Kv::create(&mut pool).expect("store");
    let mut rng = Rng::new(0xB7EE);
    let stored: Vec<u64> = (0..keys).map(|_| rng.next_u64()).collect();
    for &k in &stored {
        kv.put(&mut pool, &k.to_be_bytes(), &[k as u8; 256]).expect("insert");
    }
    // Zipf by inverse transform over the cumulative weights.
    let weights: Vec<f64> = (1..=keys).map(|r| 1.0 / (r as f64).powf(0.99)).collect();
    let total: f64 = weights.iter().sum();
    let cdf: Vec<f64> =
        weights.iter().scan(0.0, |acc, w| Some(*acc + w / total).inspect(|&v| *acc = v)).collect();
    let draws: Vec<u64> = (0..gets)
        .map(|_| {
            let u = rng.unit();
            stored[cdf.partition_point(|&c| c < u).min(keys - 1)]
        })
        .collect();
    pool.set_read_check(mode);
    for round in 0..3 {
        let t = Instant::now();
        for &k in &draws {
            let v = kv.get(&pool, &k.to_be_bytes()).expect("get");
            assert_eq!(v.as_deref(), Some(&[k as u8; 256][..]));
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / gets as f64;
        println!("round {round}: {mode:?}: {ns:.0} ns per get, {} lines checked", pool.read_lines_checked());
    }
    drop(pool);
    let _ = std::fs::remove_file(&path);
}
