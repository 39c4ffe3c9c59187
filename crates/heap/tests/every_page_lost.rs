//! One page must not kill a pool that heals: for every 4 KiB page of a small pool with
//! stripes (the journal's superblocks and head slots, the pool header page, the runs, the
//! parity, the signature and line check tables, the far superblock copy), the page is
//! zeroed, the pool opened and scrubbed, and every key compared with the model; then a put
//! and a reopen. `EVERY_PAGE_STRIDE` (default 1: every page) takes every n-th page;
//! `EVERY_PAGE_POOL_MIB` (default 2) sets the pool's size, and the keys grow with it.

use std::collections::BTreeMap;

use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions, ScrubPass, StripeShape};
use bitmend_media::pmem::{RamRegion, Region};

mod common;
use common::kv_contents;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn model(keys: u32) -> BTreeMap<Vec<u8>, Vec<u8>> {
    (0..keys)
        .map(|i| {
            (
                format!("key{i:06}").into_bytes(),
                format!("value-{i}-{}", "x".repeat(i as usize % 50)).into_bytes(),
            )
        })
        .chain([(b"large".to_vec(), (0..9000u32).map(|i| (i % 253) as u8).collect())])
        .collect()
}

#[test]
fn any_one_page_zeroed_loses_nothing() {
    let stride = env("EVERY_PAGE_STRIDE", 1);
    let mib = env("EVERY_PAGE_POOL_MIB", 2);
    let want = model(150 * mib as u32);
    for (k, m) in [(4u8, 2u8), (8, 1)] {
        let opts = PoolOptions { stripes: Some(StripeShape { k, m }), ..PoolOptions::default() };
        let mut pool = Pool::create(RamRegion::new(mib << 20), opts).unwrap();
        let kv = Kv::create(&mut pool).unwrap();
        for (key, v) in &want {
            kv.put(&mut pool, key, v).unwrap();
        }
        let image = pool.close();
        let pages = image.len() / 4096;
        let (mut zeroed, mut held_data) = (0, 0);
        for p in (0..pages).step_by(stride) {
            let mut region = image.clone();
            held_data += usize::from(region.bytes()[p * 4096..(p + 1) * 4096].iter().any(|&b| b != 0));
            region.corrupt(p * 4096, &[0u8; 4096]).unwrap();
            zeroed += 1;
            let (mut pool, _) = Pool::open(region, PoolOptions::default())
                .unwrap_or_else(|e| panic!("{k}+{m}, page {p} zeroed: the pool does not open: {e}"));
            let r = pool.scrub(ScrubPass::Full).unwrap();
            assert!(r.beyond_repair.is_empty(), "{k}+{m}, page {p}: {r:?}");
            assert!(kv_contents(&pool) == want, "{k}+{m}, page {p} zeroed: the store differs");
            let kv = Kv::open(&pool).unwrap();
            kv.put(&mut pool, b"after", b"the loss").unwrap();
            let (pool, report) = Pool::open(pool.close(), PoolOptions::default()).unwrap();
            assert!(report.bad_headers.is_empty(), "{k}+{m}, page {p}: {report:?}");
            let kv = Kv::open(&pool).unwrap();
            assert_eq!(kv.get(&pool, b"after").unwrap().as_deref(), Some(&b"the loss"[..]));
            assert_eq!(kv.len(&pool).unwrap(), want.len() as u64 + 1, "{k}+{m}, page {p}");
        }
        eprintln!("{k}+{m}: {zeroed} of {pages} pages zeroed in turn ({held_data} held bytes), nothing lost");
        assert!(zeroed * stride >= pages && held_data > 100);
    }
}
