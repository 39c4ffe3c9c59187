//! Reads without the lock (`plan_read`, `ReadPlan::read_unlocked`, `finish_read`) on an image
//! file: they return what a read under the lock returns, for every mix of pages (on flash
//! plain and compressed together, dirty, holes, past the end); a flash page damaged between
//! the plan and the read fails its check, is read again under the lock and repaired; and a
//! chip that offers no reader leaves every page to the lock.

mod common;

use bitmend_flashfs::{Compression, Fs, FsOptions, Ino, LOGICAL_PAGE, ROOT};
use bitmend_media::nand::{FileNand, Geometry, RawAccess};
use bitmend_media::rng::Rng;
use common::{cfg, pages_with};

const PAGES: usize = 48;

fn image(name: &str) -> FileNand {
    let dir = std::env::temp_dir().join(format!("bitmend-read-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    FileNand::create(&path, Geometry::new(2048, 64, 16, 96).unwrap()).unwrap()
}

/// No clean cache (every clean page is read from flash) and write-back only at sync.
fn opts() -> FsOptions {
    FsOptions { compression: Compression::Lz4, dirty_limit: 1 << 30, cache_pages: 0, ..FsOptions::default() }
}

/// Random pages and text pages (compressed together, several to a node) in runs.
fn content(seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = vec![0u8; PAGES * LOGICAL_PAGE];
    r.fill(&mut v);
    for (i, p) in v.chunks_mut(LOGICAL_PAGE).enumerate().filter(|(i, _)| (i / 5) % 2 == 0) {
        p.iter_mut().enumerate().for_each(|(j, b)| *b = b"read plan text "[(i * 3 + j) % 15]);
    }
    v
}

/// The read, planned under the lock, its flash pages read without it, finished under it.
fn read_planned(fs: &mut Fs<FileNand>, ino: Ino, off: u64, len: usize) -> Vec<u8> {
    let reader = fs.data_reader().expect("an image file offers a reader");
    let mut plan = fs.plan_read(ino, off, len).unwrap();
    plan.read_unlocked(&reader);
    fs.finish_read(plan).unwrap()
}

#[test]
fn reads_without_the_lock_return_what_a_read_under_it_returns() {
    let mut fs = Fs::format(image("same.img"), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let data = content(7);
    fs.write(f, 0, &data).unwrap();
    // A hole of three pages past the data, then a tail of half a page.
    let tail = (PAGES + 3) * LOGICAL_PAGE;
    fs.write(f, tail as u64, &data[..LOGICAL_PAGE / 2]).unwrap();
    fs.sync().unwrap();
    // Some pages dirty again (in RAM only), one of them partly.
    fs.write(f, 9 * LOGICAL_PAGE as u64 + 100, &[0xA5; 6000]).unwrap();
    fs.write(f, 30 * LOGICAL_PAGE as u64, &[0x5A; LOGICAL_PAGE]).unwrap();
    let size = (tail + LOGICAL_PAGE / 2) as u64;
    let mut r = Rng::new(11);
    for round in 0..300 {
        let off = r.below(size + 2 * LOGICAL_PAGE as u64);
        let len = 1 + r.below(12 * LOGICAL_PAGE as u64) as usize;
        let want = fs.read(f, off, len).unwrap();
        assert_eq!(read_planned(&mut fs, f, off, len), want, "round {round}: {len} bytes at {off}");
    }
    let whole = fs.read(f, 0, size as usize).unwrap();
    assert_eq!(read_planned(&mut fs, f, 0, size as usize), whole);
    let s = fs.stats();
    assert!(s.reads_unlocked > 1000, "most pages were read without the lock: {}", s.reads_unlocked);
    assert_eq!(s.reads_relocked, 0, "nothing changed between a plan and its read");
}

#[test]
fn a_page_damaged_between_plan_and_read_is_read_again_under_the_lock_and_repaired() {
    let mut fs = Fs::format(image("damaged.img"), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    // Random data: one logical page to a node, so the damage is page 20's alone or its
    // neighbour's on the same flash page.
    let mut data = vec![0u8; PAGES * LOGICAL_PAGE];
    Rng::new(3).fill(&mut data);
    fs.write(f, 0, &data).unwrap();
    fs.sync().unwrap();
    let reader = fs.data_reader().unwrap();
    let mut plan = fs.plan_read(f, 0, data.len()).unwrap();
    assert_eq!(plan.pending(), PAGES, "every page is on flash, none cached");
    // One bit flipped in the flash page holding page 20's node: 1 fault injected.
    let flash = pages_with(&mut fs, 3, f.0, Some(20))[0];
    let mut raw = vec![0u8; 2048 + 64];
    fs.store_mut().nand_mut().raw_read(flash, &mut raw).unwrap();
    fs.store_mut().nand_mut().raw_write(flash, 700, &[raw[700] ^ 0x10]).unwrap();
    plan.read_unlocked(&reader);
    let failed = plan.pending();
    assert!((1..=3).contains(&failed), "the pages on the damaged flash page failed their check: {failed}");
    let got = fs.finish_read(plan).unwrap();
    assert!(got == data, "every byte right after the read under the lock");
    assert_eq!(fs.stats().reads_relocked, failed as u64);
    let h = fs.health();
    assert!(
        h.repaired_by_group + h.repaired_by_segment >= 1,
        "the locked read repaired the flash page: {h:?}"
    );
}

#[test]
fn a_chip_without_a_reader_leaves_every_page_to_the_lock() {
    let mut fs = Fs::format(common::chip(64), cfg(), opts()).unwrap();
    assert!(fs.data_reader().is_none());
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let data = content(5);
    fs.write(f, 0, &data).unwrap();
    fs.sync().unwrap();
    // A plan still works: finished under the lock alone, it is the read.
    let plan = fs.plan_read(f, 0, data.len()).unwrap();
    assert_eq!(fs.finish_read(plan).unwrap(), data);
}
