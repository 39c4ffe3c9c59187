//! A dirty page damaged in the file system's memory is put right from the NVRAM tier's copy
//! (Loris: the Dirty State Store holds what the cache must hold), wherever its CRC check
//! finds it: a read, the background checker, or write-back on its way to flash. A write
//! whose tier put is still to come is waited for, never healed from the older copy.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bitmend_flashfs::{Cached, Compression, FsOptions, PreparedWrite, Verify, ROOT};
use bitmend_media::nand::RamNand;
use bitmend_media::pmem::RamRegion;
use bitmend_tier::TieredFs;
use common::bytes;

fn opts() -> FsOptions {
    FsOptions { compression: Compression::None, verify: Verify::Every, ..FsOptions::default() }
}

fn mounted() -> TieredFs<RamNand, RamRegion, RamRegion> {
    common::mounted(opts())
}

#[test]
fn a_flipped_dirty_page_is_healed_on_a_read_by_the_checker_and_at_write_back() {
    let mut fs = mounted();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let data = bytes(1, 4 * 4096);
    fs.write(f, 0, &data).unwrap();
    // A read.
    assert_eq!(fs.flip_cached(f, 1, 777), Cached::Dirty);
    assert_eq!(fs.read(f, 0, data.len()).unwrap(), data, "page 1 healed on the read");
    // The background checker.
    assert_eq!(fs.flip_cached(f, 2, 9_000), Cached::Dirty);
    let report = fs.check_cache(16);
    assert!(report.dirty_caught.is_empty(), "healed, not caught: {report:?}");
    // Write-back, with no read or check between.
    assert_eq!(fs.flip_cached(f, 3, 31), Cached::Dirty);
    fs.sync().unwrap();
    let (stats, _) = fs.cache_stats();
    assert_eq!((stats.dirty_healed, stats.dirty_caught), (3, 0), "3 flips injected, 3 healed");
    assert_eq!(fs.read(f, 0, data.len()).unwrap(), data, "what flash holds, every byte");
    assert!(fs.check(true).clean());
}

#[test]
fn a_heal_waits_for_the_write_whose_tier_put_is_to_come() {
    let fs = Arc::new(Mutex::new(mounted()));
    let f = fs.lock().unwrap().create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let (first, second) = (bytes(2, 4096), bytes(3, 4096));
    fs.lock().unwrap().write(f, 0, &first).unwrap();
    // A request writing `second`: staged under the file system's lock, its tier put made
    // 100 ms after that lock is let go. The tier holds `first` until then.
    let (staged_tx, staged_rx) = std::sync::mpsc::channel();
    let writer = {
        let (fs, second) = (Arc::clone(&fs), second.clone());
        std::thread::spawn(move || {
            let staged = {
                let mut fs = fs.lock().unwrap();
                let (_, tier) = fs.write_staged(f, PreparedWrite::new(0, &second)).unwrap();
                assert_eq!(fs.flip_cached(f, 0, 100), Cached::Dirty);
                tier.expect("a tier put to come")
            };
            staged_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            staged.finish(&second).unwrap();
        })
    };
    staged_rx.recv().unwrap();
    assert_eq!(fs.lock().unwrap().read(f, 0, 4096).unwrap(), second, "healed from the second write's copy");
    writer.join().unwrap();
    assert_eq!(fs.lock().unwrap().cache_stats().0.dirty_healed, 1);
}

/// Every dirty page of a file damaged in turn, before each of the three checks that can find
/// it (a read, the background checker, write-back): each is healed, and the whole file reads
/// back as written after each, never less than it was. 16 pages x 3 paths: 48 flips.
#[test]
fn every_dirty_page_damaged_in_turn_before_each_check_is_healed() {
    let mut fs = mounted();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut flips = 0u64;
    for page in 0..16u64 {
        for path in 0..3 {
            let data = bytes(100 + flips, 16 * 4096);
            fs.write(f, 0, &data).unwrap();
            assert_eq!(fs.flip_cached(f, page, (flips as usize * 997) % (8 * 4096)), Cached::Dirty);
            flips += 1;
            match path {
                0 => assert_eq!(fs.read(f, page * 4096, 4096).unwrap(), data[page as usize * 4096..][..4096]),
                1 => assert!(fs.check_cache(64).dirty_caught.is_empty()),
                _ => fs.sync().unwrap(),
            }
            assert_eq!(fs.read(f, 0, data.len()).unwrap(), data, "page {page}, path {path}");
            let (stats, _) = fs.cache_stats();
            assert_eq!((stats.dirty_healed, stats.dirty_caught), (flips, 0), "page {page}, path {path}");
        }
    }
    assert_eq!(flips, 48);
    assert!(fs.check(true).clean());
}
