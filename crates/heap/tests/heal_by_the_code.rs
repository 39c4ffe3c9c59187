//! Damage the signatures alone cannot settle, settled by the code: a lost signature table
//! (every entry in a page wrong, the pages sound), a page lost together with its own entry
//! (m of 2 or more), and a page zeroed with its entry zeroed (it matches its signature; only
//! the parity says it is wrong). Every object is compared byte for byte after each.

use std::time::Duration;

use bitmend_heap::{Pool, PoolOptions, Ptr, ScrubPass, StripeShape};
use bitmend_media::pmem::{RamRegion, Region};

fn opts(k: u8, m: u8) -> PoolOptions {
    PoolOptions { reuse_after: Duration::ZERO, stripes: Some(StripeShape { k, m }), ..PoolOptions::default() }
}

/// A pool of `k`+`m` with 60 objects of 3,000 bytes, each filled with its own pattern, and
/// the root array pointing at them.
fn filled(k: u8, m: u8) -> (Pool<RamRegion>, Vec<(Ptr, Vec<u8>)>) {
    let mut pool = Pool::create(RamRegion::new(4 << 20), opts(k, m)).unwrap();
    let objects = pool
        .tx(|tx| {
            let root = tx.alloc(60 * 8)?;
            let mut made = Vec::new();
            for i in 0..60u64 {
                let bytes: Vec<u8> = (0..3000u64).map(|b| (b * 7 + i * 13) as u8 | 1).collect();
                let p = tx.alloc(3000)?;
                tx.write(p, 0, &bytes)?;
                tx.write(root, i * 8, &p.0.to_le_bytes())?;
                made.push((p, bytes));
            }
            let slot = tx.root_slot();
            tx.set(slot, root)?;
            Ok(made)
        })
        .unwrap();
    (pool, objects)
}

/// Closes `pool` and opens it again, rebuilding damaged headers at open or (as `bitmend kv
/// check` opens) not.
fn reopen(pool: Pool<RamRegion>, rebuild_headers: bool) -> Pool<RamRegion> {
    Pool::open(pool.close(), PoolOptions { rebuild_headers, ..opts(1, 0) }).unwrap().0
}

fn zero(pool: &mut Pool<RamRegion>, at: u64, len: usize) {
    pool.region_mut().corrupt(at as usize, &vec![0u8; len]).unwrap();
}

fn assert_objects(pool: &Pool<RamRegion>, objects: &[(Ptr, Vec<u8>)], when: &str) {
    for (p, bytes) in objects {
        assert_eq!(pool.object(*p).unwrap(), &bytes[..], "{when}: the object at {p:?}");
    }
}

/// The data page holding the first object's bytes (not its header's page).
fn object_page(pool: &Pool<RamRegion>, objects: &[(Ptr, Vec<u8>)]) -> u64 {
    let geo = pool.geometry().unwrap();
    (objects[0].0 .0 + 100 - geo.base) / 4096
}

#[test]
fn a_lost_signature_table_page_is_rewritten_from_sound_stripes() {
    for (k, m) in [(4, 1), (8, 2)] {
        let (pool, objects) = filled(k, m);
        let geo = pool.geometry().unwrap();
        let mut region = pool.into_region();
        // Entries of zero pages are zero: only the others are lost.
        let table = &region.bytes()[geo.sigs_at as usize..geo.sigs_at as usize + 4096];
        let entries = table.chunks(8).filter(|e| e.iter().any(|&b| b != 0)).count() as u64;
        region.corrupt(geo.sigs_at as usize, &[0u8; 4096]).unwrap();
        let (mut pool, _) = Pool::open(region, opts(1, 0)).unwrap();
        let r = pool.scrub(ScrubPass::Full).unwrap();
        assert!(r.beyond_repair.is_empty() && r.pages_repaired == 0, "{k}+{m}: {r:?}");
        assert!(entries > 50, "{k}+{m}: {entries} entries not zero");
        assert_eq!(r.sigs_rewritten, entries, "{k}+{m}: {r:?}");
        assert_objects(&pool, &objects, "after the table page was lost");
        let again = pool.scrub(ScrubPass::Full).unwrap();
        assert_eq!((again.bad_pages, again.sigs_rewritten), (0, 0), "{again:?}");
    }
}

#[test]
fn a_page_lost_with_its_own_signature_entry_is_rebuilt_with_two_parity_pages() {
    let (mut pool, objects) = filled(8, 2);
    let geo = pool.geometry().unwrap();
    let p = object_page(&pool, &objects);
    let at = geo.page_at(p);
    pool.region_mut().corrupt(at as usize + 512, &[0xA5; 1000]).unwrap();
    pool.region_mut().corrupt(geo.sig_at(p) as usize, &[0x3C; 8]).unwrap();
    let (mut pool, _) = Pool::open(pool.into_region(), opts(1, 0)).unwrap();
    let r = pool.scrub(ScrubPass::Full).unwrap();
    assert_eq!((r.pages_repaired, r.beyond_repair.len()), (1, 0), "{r:?}");
    assert_objects(&pool, &objects, "after the page and its entry were lost");
    assert_eq!(pool.scrub(ScrubPass::Full).unwrap().bad_pages, 0);
}

#[test]
fn a_page_zeroed_with_its_entry_zeroed_is_found_by_the_parity() {
    // m = 2: the code finds which page and rebuilds it.
    let (mut pool, objects) = filled(8, 2);
    let geo = pool.geometry().unwrap();
    let p = object_page(&pool, &objects);
    zero(&mut pool, geo.page_at(p), 4096);
    zero(&mut pool, geo.sig_at(p), 8);
    let mut pool = reopen(pool, false);
    let checked = pool.check_damage(ScrubPass::Full).unwrap();
    assert_eq!(checked.damaged, vec![p], "check names the page: {checked:?}");
    let r = pool.scrub(ScrubPass::Full).unwrap();
    assert_eq!((r.pages_repaired, r.beyond_repair.len()), (1, 0), "{r:?}");
    let pool = reopen(pool, true);
    assert_objects(&pool, &objects, "after the page and its entry were zeroed");
    // Found at open too, when its lines fail their checks: the headers on it are rebuilt
    // before the allocator is built from them.
    let mut pool = pool;
    zero(&mut pool, geo.page_at(p), 4096);
    zero(&mut pool, geo.sig_at(p), 8);
    let pool = reopen(pool, true);
    assert_objects(&pool, &objects, "rebuilt at open");

    // m = 1: which page is wrong cannot be told; the stripe's pages are reported, not
    // called clean.
    let (mut pool, objects) = filled(4, 1);
    let geo = pool.geometry().unwrap();
    let p = object_page(&pool, &objects);
    zero(&mut pool, geo.page_at(p), 4096);
    zero(&mut pool, geo.sig_at(p), 8);
    let mut pool = reopen(pool, false);
    let r = pool.scrub(ScrubPass::Full).unwrap();
    assert!(r.beyond_repair.contains(&p), "{r:?}");
}

#[test]
fn check_reports_a_damaged_parity_page_and_line_check_table() {
    let (mut pool, objects) = filled(4, 2);
    let geo = pool.geometry().unwrap();
    zero(&mut pool, geo.parity_page(3, 1), 4096);
    let checks = geo.checks_at.unwrap();
    zero(&mut pool, checks, 4096);
    let mut pool = reopen(pool, false);
    let checked = pool.check_damage(ScrubPass::Full).unwrap();
    assert!(checked.bad_pages >= 1 && checked.checks_rewritten > 0, "{checked:?}");
    assert!(checked.damaged.is_empty() && checked.beyond_repair.is_empty(), "{checked:?}");
    let r = pool.scrub(ScrubPass::Full).unwrap();
    assert!(r.pages_repaired >= 1 && r.checks_rewritten > 0, "{r:?}");
    assert_objects(&pool, &objects, "after the parity page and the line checks were lost");
    let again = pool.scrub(ScrubPass::Full).unwrap();
    assert_eq!((again.bad_pages, again.checks_rewritten), (0, 0), "{again:?}");
}
