//! The PMDK shim works: transactions write what they are given into the pool.

use bitmend_anchors::pmdk::{available, Pool};

#[test]
fn transactions_write_through() {
    if !available() {
        assert!(std::env::var_os("BITMEND_REQUIRE_ANCHORS").is_none(), "libpmemobj required but not linked");
        eprintln!("libpmemobj not installed: skipped");
        return;
    }
    let path = std::env::temp_dir().join(format!("bitmend-pmdk-test-{}.pool", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut pool = Pool::create(&path, 16 << 20, 1 << 20).unwrap().unwrap();
    assert!(pool.root().iter().all(|&b| b == 0));
    pool.tx_write(100, b"persistent").unwrap();
    pool.tx_write(5000, &[7; 300]).unwrap();
    assert_eq!(&pool.root()[100..110], b"persistent");
    assert!(pool.root()[5000..5300].iter().all(|&b| b == 7));
    assert!(pool.tx_write((1 << 20) - 2, b"abc").is_err());
    drop(pool);
    assert!(!path.exists(), "the pool file is removed");
}

#[test]
fn allocations_link_into_root_slots_and_free_clears_them() {
    if !available() {
        return;
    }
    let path = std::env::temp_dir().join(format!("bitmend-pmdk-alloc-{}.pool", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut pool = Pool::create(&path, 16 << 20, 16 * 8).unwrap().unwrap();
    pool.alloc_into(3, 100).unwrap();
    assert!(pool.root()[48..64].iter().any(|&b| b != 0), "slot 3 holds the new object's id");
    pool.free_slot(3).unwrap();
    assert!(pool.root()[48..64].iter().all(|&b| b == 0), "pmemobj_free zeroes the slot");
    assert!(pool.alloc_into(8, 10).is_err(), "slot 8 is outside the 8-slot root");
}

#[test]
fn the_example_btree_holds_what_was_inserted() {
    use bitmend_anchors::pmdk::{btree_available, BTreeMap};
    if !btree_available() {
        assert!(std::env::var_os("BITMEND_REQUIRE_ANCHORS").is_none(), "PMDK's btree_map example required");
        return;
    }
    let path = std::env::temp_dir().join(format!("bitmend-pmdk-btree-{}.pool", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut map = BTreeMap::create(&path, 64 << 20).unwrap().unwrap();
    let keys: Vec<u64> = (0..2000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    for &k in &keys {
        map.insert(k, &k.to_le_bytes().repeat(32)).unwrap();
    }
    for &k in &keys {
        assert_eq!(map.get(k, 256), Some(&k.to_le_bytes().repeat(32)[..]), "key {k:#x}");
    }
    assert_eq!(map.get(12345, 256), None);
}
