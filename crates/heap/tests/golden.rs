//! The golden pools, checked in and read by this build: `pool-v1.bin`, format version 1
//! (written by session 11's build: a store whose entries are counted in one field),
//! `pool-v2.bin`, version 2 (session 12's: checksummed commits, the count in 64 shards),
//! `pool-v3.bin`, version 3 (session 13's: slotted nodes), and `pool-v4.bin`, version 4
//! (written by the ignored test below: two-word block headers, three of them linked to the
//! root array's slots and one linked to a slot it was freed from; and `pool-v4-kv.bin`, the
//! store of the older ones in a version 4 pool, which keeps no count and has appended
//! leaves); `pool-v5-kv.bin`, the same store in a version 5 pool with stripes of four data
//! and two parity pages, their signatures and parity (written by the second ignored test).
//! `pool-v7.bin`, version 7 (written by the third ignored test: objects of the page class);
//! `pool-v8-kv.bin`, version 8 (the fourth: the store in stripes of 4+2, a superblock copy
//! in the region's last page).
//! A change to any persistent byte of the pool breaks these tests, and
//! docs/FORMAT.md section 9 must say why.

use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions, ScrubPass, StripeShape};
use bitmend_media::pmem::{CrashRegion, Region};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v1.bin");
const GOLDEN_V2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v2.bin");
const GOLDEN_V3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v3.bin");
const GOLDEN_V4: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v4.bin");
const GOLDEN_V4_KV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v4-kv.bin");
const GOLDEN_V5_KV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v5-kv.bin");
const GOLDEN_V6_KV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v6-kv.bin");
const GOLDEN_V7: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v7.bin");
const GOLDEN_V8_KV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pool-v8-kv.bin");

/// The version 7 golden pool: objects of the page class, one per root array slot.
const PAGE_OBJECTS: u64 = 63;
const PAGE_OBJECT: u64 = 4120;

fn healing() -> PoolOptions {
    PoolOptions { stripes: Some(StripeShape { k: 4, m: 2 }), ..PoolOptions::default() }
}

/// What the golden pool's store holds: small values inline, one out of line, a deleted key.
fn entries() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<(Vec<u8>, Vec<u8>)> =
        (0..40u32).map(|i| (format!("key{i:03}").into_bytes(), format!("value {i}").into_bytes())).collect();
    v.push((b"large".to_vec(), (0..4000u32).map(|i| (i % 251) as u8).collect()));
    v.sort();
    v
}

/// The version 4 golden pool's objects, by root array slot: length and fill (slot 3 null).
const LINKED: [Option<(u64, u8)>; 4] = [Some((100, 0xA1)), Some((110, 0xB2)), Some((40, 0xC3)), None];

#[test]
#[ignore = "wrote the version 4 golden pools with an older build; this one makes version 7 pools, so \
            running it would overwrite them with version 7 images"]
fn write_golden_pool() {
    let mut pool = Pool::create(CrashRegion::new(1 << 20), PoolOptions::default()).unwrap();
    let root = pool
        .tx(|tx| {
            let r = tx.alloc(32)?;
            tx.write(r, 0, &[0; 32])?;
            let slot = tx.root_slot();
            tx.set(slot, r)?;
            Ok(r)
        })
        .unwrap();
    // The 128-byte class's run formatted first, by a transaction, so that the objects below
    // are linked (the root's class has its run).
    let spare = pool.slot(root, 24).unwrap();
    let warm = pool.tx(|tx| tx.alloc(100)).unwrap();
    pool.tx(|tx| tx.free(warm)).unwrap();
    pool.checkout().unwrap();
    // A block freed from slot 3 (its header still linked to it), then the three objects.
    pool.alloc_into(spare, 100).unwrap();
    pool.free_from(spare).unwrap();
    for (i, obj) in LINKED.iter().enumerate() {
        if let Some((len, fill)) = *obj {
            let p = pool.alloc_into(pool.slot(root, 8 * i as u64).unwrap(), len).unwrap();
            pool.tx(|tx| tx.write(p, 0, &vec![fill; len as usize])).unwrap();
        }
    }
    pool.checkout().unwrap();
    std::fs::write(GOLDEN_V4, pool.region().bytes()).unwrap();

    // 2 MiB: the 16-byte header, the 8 KiB leaves and the 4 KiB value each take a run.
    let pool = store_of_entries(Pool::create(CrashRegion::new(2 << 20), PoolOptions::default()).unwrap());
    std::fs::write(GOLDEN_V4_KV, pool.region().bytes()).unwrap();
}

/// The golden stores: [`entries`], and a key put and deleted, the journal checked out.
fn store_of_entries(mut pool: Pool<CrashRegion>) -> Pool<CrashRegion> {
    let kv = Kv::create(&mut pool).unwrap();
    for (k, v) in entries() {
        kv.put(&mut pool, &k, &v).unwrap();
    }
    kv.put(&mut pool, b"gone", b"deleted below").unwrap();
    kv.delete(&mut pool, b"gone").unwrap();
    pool.checkout().unwrap();
    pool
}

#[test]
#[ignore = "wrote the version 6 golden pool with an older build; this one makes version 7 pools, so \
            running it would overwrite it with a version 7 image"]
fn write_golden_healing_pool() {
    let pool = store_of_entries(Pool::create(CrashRegion::new(3 << 20), healing()).unwrap());
    // Closed: the image carries the mark (superblock byte 42).
    std::fs::write(GOLDEN_V6_KV, pool.close().bytes()).unwrap();
}

#[test]
#[ignore = "wrote the version 7 golden pool with an older build; this one makes version 8 pools"]
fn write_golden_page_class_pool() {
    let mut pool = Pool::create(CrashRegion::new(1 << 20), PoolOptions::default()).unwrap();
    let root = pool
        .tx(|tx| {
            let r = tx.alloc(PAGE_OBJECTS * 8)?;
            tx.write(r, 0, &vec![0; (PAGE_OBJECTS * 8) as usize])?;
            let slot = tx.root_slot();
            tx.set(slot, r)?;
            Ok(r)
        })
        .unwrap();
    for i in 0..PAGE_OBJECTS {
        pool.tx(|tx| {
            let p = tx.alloc(PAGE_OBJECT)?;
            tx.write(p, 0, &vec![i as u8; PAGE_OBJECT as usize])?;
            let slot = tx.slot(root, i * 8)?;
            tx.set(slot, p)
        })
        .unwrap();
    }
    pool.checkout().unwrap();
    std::fs::write(GOLDEN_V7, pool.region().bytes()).unwrap();
}

#[test]
#[ignore = "writes the version 8 golden pool; run by hand when its format changes"]
fn write_golden_far_copy_pool() {
    let pool = store_of_entries(Pool::create(CrashRegion::new(3 << 20), healing()).unwrap());
    std::fs::write(GOLDEN_V8_KV, pool.close().bytes()).unwrap();
}

/// Version 8: the superblock's third copy in the region's last page (its closed mark
/// clear). The pool header page lost whole, both copies in it with the root slot, is
/// rebuilt from its stripe, whose shape the far copy gives; the store reads back whole.
#[test]
fn the_version_8_golden_pool_survives_the_loss_of_its_header_page() {
    assert_eq!(read_golden(GOLDEN_V8_KV), None);
    let bytes = std::fs::read(GOLDEN_V8_KV).unwrap();
    let header = (0..bytes.len()).step_by(4096).find(|&at| &bytes[at..at + 8] == b"BMHEAP\0\0").unwrap();
    let far = bytes.len() - 4096;
    assert_eq!(bytes[far..far + 42], bytes[header..header + 42], "copy C is A");
    assert_eq!((bytes[header + 42], bytes[far + 42]), (1, 0), "A is marked closed, C never is");
    let mut region = CrashRegion::new(bytes.len());
    region.corrupt(0, &bytes).unwrap();
    region.corrupt(header, &[0u8; 4096]).unwrap();
    let (pool, report) = Pool::open(region, PoolOptions::default()).unwrap();
    assert_eq!(pool.version(), 8);
    assert!(report.bad_headers.is_empty(), "{report:?}");
    let got = store_entries(&pool);
    assert!(got == entries(), "the store after its header page was rebuilt: {} entries", got.len());
    // Copy C lost too (with A and B whole): written back at open.
    let mut region = pool.close();
    region.corrupt(far, &[0u8; 64]).unwrap();
    let (pool, report) = Pool::open(region, PoolOptions::default()).unwrap();
    assert_eq!(report.superblocks_rewritten, 1, "{report:?}");
    assert_eq!(pool.region().bytes()[far..far + 42], bytes[header..header + 42]);
}

/// Version 7: the page class. Its 63 objects fill one run to its last byte, 4,160 bytes
/// apart; each reads back, and a free then an allocation of the same size reuses a block of
/// that run.
#[test]
fn the_version_7_golden_pool_reads_its_page_class_objects_back() {
    let mut pool = open_golden(GOLDEN_V7);
    assert_eq!(pool.version(), 7);
    assert!(pool.geometry().is_none(), "made without stripes");
    let root = pool.root();
    let objects: Vec<bitmend_heap::Ptr> =
        (0..PAGE_OBJECTS).map(|i| pool.get(pool.slot(root, i * 8).unwrap())).collect();
    for (i, &p) in objects.iter().enumerate() {
        assert_eq!(pool.size_of(p).unwrap(), PAGE_OBJECT);
        assert!(pool.read(p, 0, PAGE_OBJECT).unwrap().iter().all(|&b| b == i as u8), "object {i}");
    }
    let mut sorted = objects.clone();
    sorted.sort();
    assert!(sorted.windows(2).all(|w| w[1].0 - w[0].0 == 4160), "one run, 4,160 bytes apart");
    assert_eq!(sorted[62].0 + 4160 - sorted[0].0, 262_144 - 64, "the run filled to its last byte");
    let slot = pool.slot(root, 0).unwrap();
    pool.tx(|tx| {
        tx.free(objects[0])?;
        tx.set(slot, bitmend_heap::Ptr::NULL)
    })
    .unwrap();
    let (mut pool, _) = Pool::open(pool.into_region(), PoolOptions::default()).unwrap();
    assert_eq!(pool.allocated().len() as u64, PAGE_OBJECTS, "the root and 62 objects");
    let again = pool.tx(|tx| tx.alloc(PAGE_OBJECT)).unwrap();
    assert!(again.0 >= sorted[0].0 && again.0 <= sorted[62].0, "a block of the page class's run");
}

#[test]
fn the_version_5_golden_pool_reads_back_scrubs_clean_and_rebuilds_two_pages() {
    assert_eq!(read_golden(GOLDEN_V5_KV), None);
    let mut pool = open_golden(GOLDEN_V5_KV);
    assert_eq!(pool.version(), 5);
    let geo = pool.geometry().expect("a version 5 pool has stripes");
    assert_eq!(geo.shape, StripeShape { k: 4, m: 2 });
    let clean = pool.scrub(ScrubPass::Full).unwrap();
    assert_eq!((clean.bad_pages, clean.stripes_checked), (0, geo.stripes), "{clean:?}");
    // The store's header page and another page of its stripe, wiped: both rebuilt.
    let p = geo.page_of(pool.root().0).unwrap();
    let (stripe, index) = geo.locate(p);
    let other = geo.member(stripe, (index + 1) % 4).unwrap();
    let before = pool.region().bytes().to_vec();
    for q in [p, other] {
        pool.region_mut().corrupt(geo.page_at(q) as usize, &[0x5A; 4096]).unwrap();
    }
    let healed = pool.scrub(ScrubPass::Full).unwrap();
    assert_eq!((healed.bad_pages, healed.pages_repaired), (2, 2), "{healed:?}");
    assert!(pool.region().bytes() == &before[..], "every byte rebuilt");
}

#[test]
fn the_version_6_golden_pool_checks_its_lines_and_heals_a_wild_write_a_store_then_covers() {
    assert_eq!(read_golden(GOLDEN_V6_KV), None);
    let mut pool = open_golden(GOLDEN_V6_KV);
    assert_eq!(pool.version(), 6);
    let geo = pool.geometry().expect("a version 6 pool has stripes");
    assert!(geo.checks_at.is_some(), "and line checks");
    let clean = pool.scrub(ScrubPass::Full).unwrap();
    assert_eq!((clean.bad_pages, clean.checks_rewritten), (0, 0), "{clean:?}");
    // A wild write into the store's header, then a put that overwrites those bytes: the
    // check of the lines it overwrites finds the damage first, and the page is rebuilt.
    let before = pool.region().bytes().to_vec();
    let root = pool.root();
    let at = root.0 as usize;
    pool.region_mut().corrupt(at, &[0xEE; 16]).unwrap();
    pool.tx(|tx| tx.write(root, 0, &before[at..at + 16])).unwrap();
    let after = pool.scrub(ScrubPass::Full).unwrap();
    assert_eq!(after.bad_pages, 0, "{after:?}");
    assert_eq!(pool.heal_stats().pages_repaired, 1);
}

#[test]
fn the_version_4_golden_store_reads_back_and_counts_its_leaves() {
    assert_eq!(read_golden(GOLDEN_V4_KV), None);
    let pool = open_golden(GOLDEN_V4_KV);
    assert_eq!(pool.size_of(pool.root()).unwrap(), 16, "a store that keeps no count");
    let root = u64::from_le_bytes(pool.read(pool.root(), 8, 8).unwrap().try_into().unwrap());
    assert_eq!(pool.read(bitmend_heap::Ptr(root), 0, 1).unwrap()[0], 5, "an appended leaf");
}

#[test]
fn the_version_4_golden_pool_reads_its_linked_objects_back() {
    let bytes = std::fs::read(GOLDEN_V4).expect("the golden pool is checked in");
    let mut region = CrashRegion::new(bytes.len());
    region.corrupt(0, &bytes).unwrap();
    let (mut pool, report) = Pool::open(region, PoolOptions::default()).unwrap();
    assert!(report.bad_headers.is_empty() && report.rolled_back == 0, "{report:?}");
    assert_eq!(report.links_freed, 1, "the block freed from slot 3");
    assert_eq!(pool.linked_blocks(), 3);
    let root = pool.root();
    let mut live = vec![root];
    for (i, obj) in LINKED.iter().enumerate() {
        let p = pool.get(pool.slot(root, 8 * i as u64).unwrap());
        match *obj {
            None => assert_eq!(p, bitmend_heap::Ptr::NULL),
            Some((len, fill)) => {
                assert_eq!(pool.read(p, 0, len).unwrap(), &vec![fill; len as usize][..], "slot {i}");
                assert_eq!(pool.size_of(p).unwrap(), len);
                live.push(p);
            }
        }
    }
    live.sort();
    assert_eq!(pool.allocated(), live);
    // Freed from its slot, linked or not, and gone after a reopen.
    let slot = pool.slot(root, 8).unwrap();
    pool.free_from(slot).unwrap();
    let (pool, _) = Pool::open(pool.into_region(), PoolOptions::default()).unwrap();
    assert_eq!(pool.allocated().len(), 3);
}

#[test]
fn the_version_1_golden_pool_reads_back_and_is_marked_version_3() {
    assert_eq!(read_golden(GOLDEN), Some(1));
}

#[test]
fn the_version_2_golden_pool_reads_back_and_is_marked_version_3() {
    assert_eq!(read_golden(GOLDEN_V2), Some(2));
}

#[test]
fn the_version_3_golden_pool_reads_back() {
    assert_eq!(read_golden(GOLDEN_V3), None);
}

/// Stores of versions 1 and 2 hold packed nodes: a delete rewrites the packed root leaf
/// slotted (keeping its 4080 bytes), puts then splice into it, and every entry still reads.
/// (Not enough puts to split it: the 1 MiB version 1 pool has no room for a run of the
/// 8 KiB blocks a new node takes.)
#[test]
fn packed_nodes_of_older_pools_take_puts_and_deletes() {
    for path in [GOLDEN, GOLDEN_V2] {
        let mut pool = open_golden(path);
        let kv = Kv::open(&pool).unwrap();
        let mut want: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = entries().into_iter().collect();
        // The root is a packed leaf: the delete rewrites it slotted, the puts splice.
        let root = u64::from_le_bytes(pool.read(pool.root(), 8, 8).unwrap().try_into().unwrap());
        assert_eq!(pool.read(bitmend_heap::Ptr(root), 0, 1).unwrap()[0], 1, "{path}: a packed leaf");
        assert!(kv.delete(&mut pool, b"key039").unwrap());
        want.remove(&b"key039"[..]);
        kv.put(&mut pool, b"key005", b"changed").unwrap();
        want.insert(b"key005".to_vec(), b"changed".to_vec());
        kv.put(&mut pool, b"new", &[7; 300]).unwrap();
        want.insert(b"new".to_vec(), vec![7; 300]);
        for i in 0..10u32 {
            let k = format!("more{i:02}").into_bytes();
            kv.put(&mut pool, &k, &[i as u8; 200]).unwrap();
            want.insert(k, vec![i as u8; 200]);
        }
        let (pool, _) = Pool::open(pool.into_region(), PoolOptions::default()).unwrap();
        let kv = Kv::open(&pool).unwrap();
        let mut got = std::collections::BTreeMap::new();
        kv.scan(&pool, None, None, &mut |k, v| got.insert(k.to_vec(), v).is_none()).unwrap();
        assert!(got == want, "{path}: {} entries, {} expected", got.len(), want.len());
        assert_eq!(kv.check(&pool).unwrap().entries, want.len() as u64);
        let root = u64::from_le_bytes(pool.read(pool.root(), 8, 8).unwrap().try_into().unwrap());
        assert_eq!(pool.read(bitmend_heap::Ptr(root), 0, 1).unwrap()[0], 3, "{path}: a slotted leaf");
        assert_eq!(pool.size_of(bitmend_heap::Ptr(root)).unwrap(), 4080);
    }
}

/// Every entry of the pool's store, in key order.
fn store_entries(pool: &Pool<CrashRegion>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut got = Vec::new();
    Kv::open(pool)
        .unwrap()
        .scan(pool, None, None, &mut |k, v| {
            got.push((k.to_vec(), v));
            true
        })
        .unwrap();
    got
}

fn open_golden(path: &str) -> Pool<CrashRegion> {
    let bytes = std::fs::read(path).expect("the golden pool is checked in");
    let mut region = CrashRegion::new(bytes.len());
    region.corrupt(0, &bytes).unwrap();
    Pool::open(region, PoolOptions::default()).unwrap().0
}

/// Opens the golden pool at `path`, checks its store; returns the version it was upgraded
/// from.
fn read_golden(path: &str) -> Option<u32> {
    let bytes = std::fs::read(path).expect("the golden pool is checked in");
    let mut region = CrashRegion::new(bytes.len());
    region.corrupt(0, &bytes).unwrap();
    let (pool, report) = Pool::open(region, PoolOptions::default()).unwrap();
    assert!(report.bad_headers.is_empty() && report.rolled_back == 0, "{report:?}");
    let kv = Kv::open(&pool).unwrap();
    let got = store_entries(&pool);
    assert!(got == entries(), "the golden store holds {} entries", got.len());
    assert_eq!(kv.get(&pool, b"gone").unwrap(), None);
    assert_eq!(kv.len(&pool).unwrap(), entries().len() as u64, "{path}: the count");
    assert_eq!(kv.check(&pool).unwrap().value_blocks, 1);
    // Opened again, it is this build's version and needs nothing.
    let (pool, again) = Pool::open(pool.into_region(), PoolOptions::default()).unwrap();
    assert_eq!(again.upgraded_from, None);
    assert_eq!(Kv::open(&pool).unwrap().len(&pool).unwrap(), entries().len() as u64);
    report.upgraded_from
}
