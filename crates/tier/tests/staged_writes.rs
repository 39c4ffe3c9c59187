//! A write's tier records made after the file system's lock is let go (`Fs::write_staged`,
//! `TierWrite::finish`): the file system serves other requests meanwhile, and the tier still
//! sees the writes in the order the file system staged them. A second write of the same page
//! waits for the first one's records; after a crash the page holds the second write's bytes,
//! which a tier taking the second write's records first would lose.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bitmend_flashfs::{Compression, FsOptions, PreparedWrite, ROOT};
use bitmend_media::nand::RamNand;
use bitmend_media::pmem::RamRegion;
use bitmend_tier::{crash, mount, TieredFs};
use common::bytes;

fn opts() -> FsOptions {
    FsOptions { compression: Compression::None, ..FsOptions::default() }
}

fn mounted() -> TieredFs<RamNand, RamRegion, RamRegion> {
    common::mounted(opts())
}

#[test]
fn a_second_write_of_a_page_reaches_the_tier_after_the_first_and_wins_after_a_crash() {
    let fs = Arc::new(Mutex::new(mounted()));
    let f = fs.lock().unwrap().create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    // Pages 0-2 whole and 5 bytes of page 3 (a merged page), then 4 KiB over pages 1-2.
    let first = bytes(1, 3 * 4096 + 5);
    let second = bytes(2, 4096);
    let staged = {
        let mut fs = fs.lock().unwrap();
        let (n, tier) = fs.write_staged(f, PreparedWrite::new(0, &first)).unwrap();
        assert_eq!(n, first.len());
        tier.expect("a mount over a tier stages its records")
    };
    // The file system's lock is free while the first write's records wait: a read is served,
    // and sees the staged bytes.
    assert_eq!(fs.lock().unwrap().read(f, 0, first.len()).unwrap(), first);
    let writer = {
        let (fs, second) = (Arc::clone(&fs), second.clone());
        std::thread::spawn(move || fs.lock().unwrap().write(f, 2048, &second).unwrap())
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!writer.is_finished(), "the second write waits for the first one's records");
    staged.finish(&first).unwrap();
    assert_eq!(writer.join().unwrap(), second.len());

    let fs = Arc::into_inner(fs).unwrap().into_inner().unwrap();
    let (nand, regions) = crash::<RamNand, RamRegion, RamRegion>(fs);
    let (log, heap) = regions.unwrap();
    let (mut fs, _, report) = mount(nand, opts(), log, heap).unwrap();
    assert!(!report.lost_anything(), "{report:?}");
    assert_eq!(report.pages_found, 4, "{report:?}");
    let mut want = first;
    want[2048..2048 + 4096].copy_from_slice(&second);
    let f = fs.lookup(ROOT, b"f").unwrap().ino;
    assert_eq!(fs.getattr(f).unwrap().size, want.len() as u64);
    assert_eq!(fs.read(f, 0, want.len() + 1).unwrap(), want, "every byte of both writes, in order");
}

#[test]
fn a_staged_write_not_finished_before_a_crash_was_never_acknowledged_and_the_rest_survives() {
    let mut fs = mounted();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let kept = bytes(3, 8192);
    fs.write(f, 0, &kept).unwrap();
    // Staged, never finished: the daemon died before the records (and the reply).
    let lost = bytes(4, 8192);
    let (_, tier) = fs.write_staged(f, PreparedWrite::new(8192, &lost)).unwrap();
    drop(tier);
    let (nand, regions) = crash::<RamNand, RamRegion, RamRegion>(fs);
    let (log, heap) = regions.unwrap();
    let (mut fs, _, report) = mount(nand, opts(), log, heap).unwrap();
    assert!(!report.lost_anything(), "{report:?}");
    let f = fs.lookup(ROOT, b"f").unwrap().ino;
    assert_eq!(fs.getattr(f).unwrap().size, 8192, "the size the last finished write recorded");
    assert_eq!(fs.read(f, 0, 16384).unwrap(), kept);
}
