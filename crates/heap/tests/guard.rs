//! NVMalloc's asynchronous mprotect under the heap: the pool's pages are read-only between
//! transactions, stores still work however the requests are timed, a protect request that a
//! write overtakes is cancelled, and a wild write into a protected page faults.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use bitmend_heap::kv::Kv;
use bitmend_heap::{Pool, PoolOptions};
use bitmend_media::pmem::{Guarded, MmapRegion, Region, Reprotect};

fn pool_file(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("bitmend-guard-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn guarded(path: &std::path::Path, reprotect: Reprotect) -> Pool<Guarded> {
    let region = MmapRegion::create(path, 8 << 20).unwrap();
    Pool::create(Guarded::new(region, reprotect), PoolOptions::default()).unwrap()
}

#[test]
fn stores_work_and_every_key_reads_back_with_sync_and_async_reprotection() {
    for reprotect in [
        Reprotect::Sync,
        Reprotect::After(Duration::from_micros(100)),
        Reprotect::After(Duration::from_millis(50)),
    ] {
        let path = pool_file("modes");
        let mut pool = guarded(&path, reprotect);
        let kv = Kv::create(&mut pool).unwrap();
        for i in 0..600u32 {
            kv.put(&mut pool, &i.to_be_bytes(), &[i as u8; 200]).unwrap();
        }
        for i in 0..600u32 {
            assert_eq!(kv.get(&pool, &i.to_be_bytes()).unwrap(), Some(vec![i as u8; 200]), "{reprotect:?}");
        }
        std::thread::sleep(Duration::from_millis(120));
        let st = pool.region().stats();
        assert!(st.unprotect_calls > 0 && st.pages_protected > 0, "{reprotect:?}: {st:?}");
        match reprotect {
            // Every transaction's pages, protected again at once: never a cancel.
            Reprotect::Sync => assert_eq!(st.cancelled, 0),
            // Hot pages (the leaf, the store header) written again before their request
            // ran: cancelled, so far fewer calls than transactions.
            Reprotect::After(_) => {
                assert!(st.cancelled > 0, "{st:?}");
                assert!(st.protect_calls < 600, "{st:?}");
            }
        }
        drop(pool);
        let (pool, _) =
            Pool::open(Guarded::new(MmapRegion::open(&path).unwrap(), reprotect), PoolOptions::default())
                .unwrap();
        let kv = Kv::open(&pool).unwrap();
        assert_eq!(kv.len(&pool).unwrap(), 600);
        drop(pool);
        let _ = std::fs::remove_file(&path);
    }
}

/// In the child: a wild write into a page the last transaction wrote, once it is protected.
fn wild_write_child(path: &std::path::Path) {
    let mut pool = guarded(path, Reprotect::Sync);
    let kv = Kv::create(&mut pool).unwrap();
    kv.put(&mut pool, b"key", b"value").unwrap();
    let at = pool.root().0 as usize;
    // Past the guard: what a stray pointer does. It must not return.
    let _ = pool.region_mut().inner_mut().corrupt(at, b"wild");
    std::process::exit(0);
}

#[test]
fn a_wild_write_into_a_protected_page_faults() {
    if let Ok(path) = std::env::var("BITMEND_GUARD_CHILD") {
        wild_write_child(std::path::Path::new(&path));
    }
    let path = pool_file("wild");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_wild_write_into_a_protected_page_faults", "--nocapture", "--test-threads", "1"])
        .env("BITMEND_GUARD_CHILD", &path)
        .status()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(status.signal(), Some(libc_sigsegv()), "the child was stopped by the protection: {status:?}");
}

/// SIGSEGV on Linux.
fn libc_sigsegv() -> i32 {
    11
}
