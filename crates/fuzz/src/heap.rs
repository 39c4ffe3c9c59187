//! The heap: the pool's superblocks and header page, run and block headers, the journal,
//! the signature and line-check tables, the key-value store's nodes.

use std::sync::OnceLock;

use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions, ReadCheck, ScrubPass, StripeShape};
use bitmend_media::pmem::{RamRegion, Region};

use crate::patches::apply;

/// A 2 MiB pool holding a store of 400 keys (some values out of line), with stripes of
/// 4+2 or without, closed.
fn base(heals: bool) -> &'static RamRegion {
    static PLAIN: OnceLock<RamRegion> = OnceLock::new();
    static HEALS: OnceLock<RamRegion> = OnceLock::new();
    let cell = if heals { &HEALS } else { &PLAIN };
    cell.get_or_init(|| {
        let stripes = heals.then_some(StripeShape { k: 4, m: 2 });
        let mut pool =
            Pool::create(RamRegion::new(2 << 20), PoolOptions { stripes, ..PoolOptions::default() })
                .expect("a pool");
        let kv = Kv::create(&mut pool).expect("a store");
        for i in 0..400u32 {
            let len = if i % 50 == 0 { 3000 } else { 20 + i as usize % 90 };
            kv.put(&mut pool, format!("key{i:04}").as_bytes(), &vec![i as u8; len]).expect("a put");
        }
        pool.close()
    })
}

/// Opens the damaged pool (the first input byte's low bit picks the healing one), scrubs
/// it, reads every entry through the checks, checks the tree, writes, and opens it again;
/// whether it opened with its store.
pub fn pool_image(data: &[u8]) -> bool {
    let heals = data.first().is_some_and(|b| b & 1 == 1);
    let mut region = base(heals).clone();
    let len = region.len() as u64;
    apply(data.get(1..).unwrap_or_default(), len, |at, b| {
        region.corrupt(at as usize, b).expect("a patch within the region");
    });
    let Ok((mut pool, _)) = Pool::open(region, PoolOptions::default()) else { return false };
    if heals {
        let _ = pool.scrub(ScrubPass::Full);
    }
    let Ok(kv) = Kv::open(&pool) else { return false };
    pool.set_read_check(ReadCheck::Every);
    let _ = kv.check(&pool);
    let _ = kv.scan_healing(&mut pool, None, None, &mut |_, _| true);
    let _ = kv.get_healing(&mut pool, b"key0100");
    let _ = kv.put(&mut pool, b"key0100", b"after the damage");
    let _ = kv.delete(&mut pool, b"key0200");
    let _ = kv.len(&pool);
    if let Ok((pool, _)) = Pool::open(pool.close(), PoolOptions::default()) {
        let _ = Kv::open(&pool).map(|kv| kv.check(&pool));
    }
    true
}
