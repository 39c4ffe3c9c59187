//! The golden pools: version 1 pools checked in, read by this build. `pool-v1.bin` holds a
//! store whose entries are counted in one field (written by session 11's build);
//! `pool-v1-sharded.bin` one counted in 64 shards (written by the ignored test below). A
//! change to any persistent byte of the pool breaks these tests, and docs/FORMAT.md section 9
//! must say why.

use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions};
use bitmend_media::pmem::{CrashRegion, Region};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v1.bin");
const GOLDEN_SHARDED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v1-sharded.bin");

/// What the golden pool's store holds: small values inline, one out of line, a deleted key.
fn entries() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<(Vec<u8>, Vec<u8>)> =
        (0..40u32).map(|i| (format!("key{i:03}").into_bytes(), format!("value {i}").into_bytes())).collect();
    v.push((b"large".to_vec(), (0..4000u32).map(|i| (i % 251) as u8).collect()));
    v.sort();
    v
}

#[test]
#[ignore = "writes the golden pool; run by hand when the format changes"]
fn write_golden_pool() {
    let mut pool = Pool::create(CrashRegion::new(1 << 20), PoolOptions::default()).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    for (k, v) in entries() {
        kv.put(&mut pool, &k, &v).unwrap();
    }
    kv.put(&mut pool, b"gone", b"deleted below").unwrap();
    kv.delete(&mut pool, b"gone").unwrap();
    pool.checkout().unwrap();
    std::fs::write(GOLDEN_SHARDED, pool.region().bytes()).unwrap();
}

#[test]
fn the_golden_pool_reads_back() {
    read_golden(GOLDEN);
}

#[test]
fn the_golden_pool_with_a_sharded_count_reads_back() {
    read_golden(GOLDEN_SHARDED);
}

fn read_golden(path: &str) {
    let bytes = std::fs::read(path).expect("the golden pool is checked in");
    let mut region = CrashRegion::new(bytes.len());
    region.corrupt(0, &bytes).unwrap();
    let (pool, report) = Pool::open(region, PoolOptions::default()).unwrap();
    assert!(report.bad_headers.is_empty() && report.rolled_back == 0, "{report:?}");
    let kv = Kv::open(&pool).unwrap();
    let mut got = Vec::new();
    kv.scan(&pool, None, None, &mut |k, v| {
        got.push((k.to_vec(), v));
        true
    })
    .unwrap();
    assert!(got == entries(), "the golden store holds {} entries", got.len());
    assert_eq!(kv.get(&pool, b"gone").unwrap(), None);
    assert_eq!(kv.len(&pool).unwrap(), entries().len() as u64, "{path}: the count");
    assert_eq!(kv.check(&pool).unwrap().value_blocks, 1);
}
