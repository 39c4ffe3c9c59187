//! The checksummed page cache (Loris sections IV and V-C): memory errors injected into cached
//! pages, clean and dirty, and what reads, the background checker and the flash make of them.

mod common;

use std::time::Duration;

use bitmend_flashfs::Corruption;
use bitmend_flashfs::{
    Cached, Compression, Fs, FsError, FsOptions, Ino, SetAttr, Verify, LOGICAL_PAGE, ROOT,
};
use bitmend_media::nand::RamNand;
use bitmend_media::rng::Rng;
use common::{cfg, chip};

const PAGES: u64 = 24;

/// Options with the cache on and write-back only at sync (dirty pages stay dirty).
fn opts(verify: Verify) -> FsOptions {
    FsOptions { compression: Compression::Lz4, dirty_limit: 1 << 30, verify, ..FsOptions::default() }
}

fn content(seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = vec![0u8; PAGES as usize * LOGICAL_PAGE];
    r.fill(&mut v);
    // Half the pages compress (text), so both node paths run.
    for (i, p) in v.chunks_mut(LOGICAL_PAGE).enumerate().filter(|(i, _)| i % 2 == 0) {
        p.iter_mut().enumerate().for_each(|(j, b)| *b = b"cache page "[(i + j) % 11]);
    }
    v
}

/// A file of [`PAGES`] pages, synced, and read once (its clean pages cached).
fn synced_file(verify: Verify) -> (Fs<RamNand>, Ino, Vec<u8>) {
    let mut fs = Fs::format(chip(128), cfg(), opts(verify)).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let data = content(1);
    fs.write(f, 0, &data).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.read(f, 0, data.len()).unwrap(), data);
    assert_eq!(fs.cache_stats().1, PAGES as usize, "every page cached");
    (fs, f, data)
}

fn read_page(fs: &mut Fs<RamNand>, f: Ino, p: u64) -> Result<Vec<u8>, FsError> {
    fs.read(f, p * LOGICAL_PAGE as u64, LOGICAL_PAGE)
}

#[test]
fn flips_in_clean_pages_are_caught_by_every_read_and_the_page_read_again_from_flash() {
    let (mut fs, f, data) = synced_file(Verify::Every);
    let mut rng = Rng::new(2);
    let flips = 300;
    for _ in 0..flips {
        let p = rng.below(PAGES);
        // A page read since its last flip is cached again; one flipped and not read yet is
        // still cached too (one page may take two flips before a read).
        let bit = rng.below(8 * LOGICAL_PAGE as u64) as usize;
        assert_eq!(fs.flip_cached(f, p, bit), Cached::Clean);
        let got = read_page(&mut fs, f, p).unwrap();
        assert_eq!(got, data[p as usize * LOGICAL_PAGE..][..LOGICAL_PAGE], "page {p} after a flip");
    }
    let (stats, _) = fs.cache_stats();
    assert_eq!(stats.clean_caught, flips, "{flips} flips injected, each caught on the read after it");
    assert_eq!(fs.read(f, 0, data.len()).unwrap(), data, "every byte, after {flips} flips");
}

#[test]
fn under_last_check_a_flip_is_read_within_the_interval_and_caught_after_it() {
    let interval = Duration::from_millis(30);
    let (mut fs, f, data) = synced_file(Verify::AfterCheck(interval));
    assert_eq!(fs.flip_cached(f, 3, 12_345), Cached::Clean);
    // Within the interval the page is served as cached: Loris's window, by design.
    let early = read_page(&mut fs, f, 3).unwrap();
    assert_ne!(early, data[3 * LOGICAL_PAGE..4 * LOGICAL_PAGE]);
    std::thread::sleep(interval * 2);
    assert_eq!(read_page(&mut fs, f, 3).unwrap(), data[3 * LOGICAL_PAGE..4 * LOGICAL_PAGE]);
    assert_eq!(fs.cache_stats().0.clean_caught, 1);
}

#[test]
fn the_background_checker_catches_what_no_read_checked() {
    let (mut fs, f, data) = synced_file(Verify::Background);
    let mut rng = Rng::new(3);
    let mut flipped = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let p = rng.below(PAGES);
        if flipped.insert(p) {
            assert_eq!(fs.flip_cached(f, p, rng.below(32_768) as usize), Cached::Clean);
        }
    }
    // Steps of 5 pages, round and round: every cached page is checked within a lap.
    let mut caught = 0;
    for _ in 0..PAGES.div_ceil(5) {
        caught += fs.check_cache(5).clean_caught;
    }
    assert_eq!(caught, flipped.len(), "{} pages flipped", flipped.len());
    assert_eq!(fs.read(f, 0, data.len()).unwrap(), data);
}

#[test]
fn a_flip_in_a_dirty_page_is_refused_to_readers_and_never_reaches_flash_under_a_valid_crc() {
    let mut fs = Fs::format(chip(128), cfg(), opts(Verify::Every)).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let data = content(4);
    fs.write(f, 0, &data).unwrap();
    // Pages 2 and 9 are hit while dirty; page 9 then takes a partial overwrite elsewhere in
    // it, whose CRC update must not launder the flip.
    assert_eq!(fs.flip_cached(f, 2, 100), Cached::Dirty);
    assert_eq!(fs.flip_cached(f, 9, 30_000), Cached::Dirty);
    let mut model = data.clone();
    fs.write(f, 9 * LOGICAL_PAGE as u64 + 10, b"partial").unwrap();
    model[9 * LOGICAL_PAGE + 10..][..7].copy_from_slice(b"partial");
    for p in [2, 9] {
        assert!(
            matches!(read_page(&mut fs, f, p), Err(FsError::Corrupt(Corruption::InMemory { page, .. })) if page == p)
        );
    }
    assert_eq!(fs.check_cache(100).dirty_caught, vec![(f.0, 2), (f.0, 9)]);
    fs.sync().unwrap();
    let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts(Verify::Every)).unwrap();
    for p in 0..PAGES {
        let got = read_page(&mut fs, f, p);
        if p == 2 || p == 9 {
            assert!(got.is_err(), "page {p}: stored under the CRC of what was written, it fails at read");
        } else {
            assert_eq!(got.unwrap(), model[p as usize * LOGICAL_PAGE..][..LOGICAL_PAGE], "page {p}");
        }
    }
}

#[test]
fn writes_truncates_and_unlinks_leave_no_stale_clean_page() {
    let (mut fs, f, mut model) = synced_file(Verify::Every);
    // A partial write over a cached clean page, a truncate into the middle of one, and a
    // grow again: each read must see the change, not the cached copy.
    fs.write(f, 5 * LOGICAL_PAGE as u64 + 7, b"new bytes").unwrap();
    model[5 * LOGICAL_PAGE + 7..][..9].copy_from_slice(b"new bytes");
    let cut = 10 * LOGICAL_PAGE as u64 + 100;
    fs.setattr(f, SetAttr { size: Some(cut), ..SetAttr::default() }).unwrap();
    fs.setattr(f, SetAttr { size: Some(model.len() as u64), ..SetAttr::default() }).unwrap();
    model[cut as usize..].fill(0);
    assert_eq!(fs.read(f, 0, model.len()).unwrap(), model);
    fs.sync().unwrap();
    assert_eq!(fs.read(f, 0, model.len()).unwrap(), model);
    // A file of the same name made again reads as itself, not as the old one's pages.
    fs.unlink(ROOT, b"f").unwrap();
    let g = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(g, 0, b"short").unwrap();
    assert_eq!(fs.read(g, 0, LOGICAL_PAGE).unwrap(), b"short");
    let (stats, _) = fs.cache_stats();
    assert_eq!((stats.clean_caught, stats.dirty_caught), (0, 0), "nothing flipped, nothing caught");
    assert!(stats.hits > 0);
}
