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
