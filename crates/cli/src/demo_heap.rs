//! `bitmend demo`, the heap part: a key-value store in a pool that heals, meeting a wild
//! memset, a misdirected page and worn bits, narrated.

use std::path::Path;

use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions, ReadCheck, ScrubPass, StripeShape};
use bitmend_media::pmem::{MmapRegion, Region};
use bitmend_media::rng::Rng;

use crate::error::CliError;

const KEYS: u32 = 5000;

fn value(r: &mut Rng, i: u32) -> Vec<u8> {
    let len = 20 + r.below(400) as usize;
    format!("value of key {i}: ").bytes().cycle().take(len).collect()
}

pub fn run(path: &Path, seed: u64) -> Result<(), CliError> {
    let _ = std::fs::remove_file(path);
    let shape = StripeShape { k: 8, m: 2 };
    println!("9. heap: a key-value store in {} (16 MiB, stripes of 8 data + 2 parity pages)", path.display());
    let region = MmapRegion::create(path, 16 << 20).map_err(|e| CliError::Failed(e.to_string()))?;
    let mut pool = Pool::create(region, PoolOptions { stripes: Some(shape), ..PoolOptions::default() })?;
    let kv = Kv::create(&mut pool)?;
    let mut r = Rng::new(seed);
    let values: Vec<Vec<u8>> = (0..KEYS).map(|i| value(&mut r, i)).collect();
    for (i, v) in values.iter().enumerate() {
        kv.put(&mut pool, format!("key{i:05}").as_bytes(), v)?;
    }
    println!("   {KEYS} keys put, one transaction each");
    let geo = pool.geometry().expect("a pool with stripes");
    // Damage, around the protection: pages that hold something, in different stripes.
    let used: Vec<u64> = (0..geo.pages)
        .filter(|&p| pool.region().bytes()[geo.page_at(p) as usize..][..4096].iter().any(|&b| b != 0))
        .collect();
    let mut hit = Vec::new();
    while hit.len() < 3 {
        let p = used[r.below(used.len() as u64) as usize];
        if hit.iter().all(|&q: &u64| geo.locate(q).0 != geo.locate(p).0) {
            hit.push(p);
        }
    }
    let page = |p: u64| geo.page_at(p) as usize;
    pool.region_mut().corrupt(page(hit[0]), &[0u8; 4096]).map_err(|e| CliError::Failed(e.to_string()))?;
    println!("10. injected: a wild memset zeroed heap page {}", hit[0]);
    let copy = pool.region().bytes()[page(hit[2])..][..4096].to_vec();
    pool.region_mut().corrupt(page(hit[1]), &copy).map_err(|e| CliError::Failed(e.to_string()))?;
    println!("   injected: heap page {} copied over page {} (a store to the wrong address)", hit[2], hit[1]);
    for _ in 0..8 {
        let at = page(hit[2]) + r.below(4096) as usize;
        let b = pool.region().bytes()[at] ^ (1 << r.below(8));
        pool.region_mut().corrupt(at, &[b]).map_err(|e| CliError::Failed(e.to_string()))?;
    }
    println!("   injected: 8 bits flipped in heap page {} (worn cells)", hit[2]);
    let found = pool.check_damage(ScrubPass::Full)?;
    println!("11. check: {} damaged pages found, {} rebuildable", found.damaged.len(), found.pages_repaired);
    pool.set_read_check(ReadCheck::Every);
    let mut rebuilt_by_reads = 0;
    for (i, v) in values.iter().enumerate().step_by(7) {
        let before = pool.heal_stats().pages_repaired;
        let got = kv.get_healing(&mut pool, format!("key{i:05}").as_bytes())?;
        if got.as_ref() != Some(v) {
            return Err(format!("key{i:05}: WRONG BYTES").into());
        }
        rebuilt_by_reads += pool.heal_stats().pages_repaired - before;
    }
    println!("12. every 7th key read with every read checked: {rebuilt_by_reads} pages rebuilt before their bytes were used");
    let scrub = pool.scrub(ScrubPass::Full)?;
    println!(
        "13. scrub: {} pages rebuilt, {} beyond repair",
        scrub.pages_repaired,
        scrub.beyond_repair.len()
    );
    for (i, v) in values.iter().enumerate() {
        if kv.get(&pool, format!("key{i:05}").as_bytes())?.as_ref() != Some(v) {
            return Err(format!("key{i:05}: WRONG BYTES").into());
        }
    }
    let clean = pool.check_damage(ScrubPass::Full)?;
    drop(pool);
    let _ = std::fs::remove_file(path);
    if clean.damaged.is_empty() && scrub.beyond_repair.is_empty() {
        println!("   result: all {KEYS} keys read back; every damaged page rebuilt from its stripe");
        Ok(())
    } else {
        Err(format!("heap not clean: {clean:?}").into())
    }
}
