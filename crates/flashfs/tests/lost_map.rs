//! A map node (the on-flash index of a chunk of a file) lost beyond both levels of parity is
//! rebuilt from the keys the data nodes carry, checked against what the checkpoint says the
//! map held (format version 7), on the read path and by fsck; only data actually lost reads
//! as EIO, and never as other bytes.

mod common;

use bitmend_flashfs::Corruption;
use bitmend_flashfs::{Compression, Fs, FsError, FsOptions, SetAttr, CHUNK_PAGES, LOGICAL_PAGE, ROOT};
use bitmend_media::nand::{FaultyNand, RamNand};
use common::{cfg, lose_beyond_repair, pages_with};

type Chip = FaultyNand<RamNand>;

fn chip() -> Chip {
    common::faulty_chip(256, 4)
}

fn opts() -> FsOptions {
    FsOptions {
        compression: Compression::None,
        dirty_limit: 256 << 10,
        index_chunks: 2,
        ..FsOptions::default()
    }
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(0x9E37_79B9)) as u8 | 1).collect()
}

fn remount(fs: Fs<Chip>) -> Fs<Chip> {
    Fs::open(fs.unmount().unwrap(), opts()).unwrap().0
}

#[test]
fn a_lost_map_is_rebuilt_from_the_data_nodes_and_written_again() {
    let mut fs = Fs::format(chip(), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    let data = content(11, 4 * CHUNK_PAGES as usize * LOGICAL_PAGE);
    fs.write(f.ino, 0, &data).unwrap();
    fs.sync().unwrap();
    fs.checkpoint().unwrap();
    // Another file, its map written by a later checkpoint, elsewhere.
    let g = fs.create(ROOT, b"g", 0o644, 0, 0).unwrap();
    let other = content(13, 20_000);
    fs.write(g.ino, 0, &other).unwrap();
    fs.checkpoint().unwrap();
    let p = pages_with(&mut fs, 7, f.ino.0, Some(1))[0];
    let mut fs = remount(fs);
    let lost = lose_beyond_repair(&mut fs, p);
    // The lost pages hold maps and checkpoints, no data of f: every byte of f reads back.
    assert!(lost.iter().all(|q| !pages_with(&mut fs, 3, f.ino.0, None).contains(q)));
    let check = fs.check(true);
    assert!(check.clean() && check.maps_rebuilt >= 1, "{check:?}");
    for page in 0..4 * CHUNK_PAGES as usize {
        let at = page * LOGICAL_PAGE;
        let got = fs.read(f.ino, at as u64, LOGICAL_PAGE).unwrap();
        assert!(got == data[at..at + LOGICAL_PAGE], "page {page}");
    }
    assert!(fs.read(g.ino, 0, 30_000).unwrap() == other, "the other file");
    let rebuilt = fs.stats().maps_rebuilt;
    // The chunk takes writes again (before, a write into it failed).
    let new = content(12, LOGICAL_PAGE);
    let into_lost = CHUNK_PAGES * LOGICAL_PAGE as u64;
    fs.write(f.ino, into_lost, &new).unwrap();
    // What fsck --repair does: the next checkpoint writes the rebuilt maps again. After it,
    // nothing is rebuilt and everything reads back.
    let mut fs = remount(fs);
    let check = fs.check(true);
    assert!(check.clean() && check.maps_rebuilt == 0, "{check:?}");
    let mut want = data.clone();
    want[into_lost as usize..into_lost as usize + LOGICAL_PAGE].copy_from_slice(&new);
    assert!(fs.read(f.ino, 0, want.len()).unwrap() == want);
    assert_eq!(fs.stats().maps_rebuilt, 0);
    eprintln!(
        "lost map: pages {lost:?} lost beyond parity, {rebuilt} maps rebuilt from the data nodes, all {} logical pages read back; written again, clean after a remount",
        4 * CHUNK_PAGES
    );
}

#[test]
fn a_rebuilt_map_keeps_holes_over_old_data_and_takes_the_newest_write() {
    let mut fs = Fs::format(chip(), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    let first = content(21, CHUNK_PAGES as usize * LOGICAL_PAGE);
    fs.write(f.ino, 0, &first).unwrap();
    fs.sync().unwrap();
    fs.checkpoint().unwrap();
    // Truncated to 10 pages and 100 bytes, page 3 overwritten twice, then page 30 written:
    // pages 11 to 29 are holes over nodes of the first write still on the flash.
    let cut = 10 * LOGICAL_PAGE + 100;
    fs.setattr(f.ino, SetAttr { size: Some(cut as u64), ..SetAttr::default() }).unwrap();
    fs.sync().unwrap();
    let three = content(22, LOGICAL_PAGE);
    fs.write(f.ino, 3 * LOGICAL_PAGE as u64, &content(23, LOGICAL_PAGE)).unwrap();
    fs.sync().unwrap();
    fs.write(f.ino, 3 * LOGICAL_PAGE as u64, &three).unwrap();
    let thirty = content(24, LOGICAL_PAGE);
    fs.write(f.ino, 30 * LOGICAL_PAGE as u64, &thirty).unwrap();
    fs.sync().unwrap();
    fs.checkpoint().unwrap();
    let p = *pages_with(&mut fs, 7, f.ino.0, Some(0)).last().unwrap();
    let mut fs = remount(fs);
    lose_beyond_repair(&mut fs, p);
    let mut want = first[..cut].to_vec();
    want.resize(31 * LOGICAL_PAGE, 0);
    want[3 * LOGICAL_PAGE..4 * LOGICAL_PAGE].copy_from_slice(&three);
    want[30 * LOGICAL_PAGE..].copy_from_slice(&thirty);
    let got = fs.read(f.ino, 0, want.len()).unwrap();
    for (i, (g, w)) in got.chunks(LOGICAL_PAGE).zip(want.chunks(LOGICAL_PAGE)).enumerate() {
        assert!(g == w, "page {i}");
    }
    assert_eq!(fs.stats().maps_rebuilt, 1);
    let check = fs.check(true);
    assert!(check.clean(), "{check:?}");
}

#[test]
fn a_lost_map_whose_data_is_lost_too_stays_eio_never_wrong() {
    let mut fs = Fs::format(chip(), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    let data = content(31, CHUNK_PAGES as usize * LOGICAL_PAGE);
    fs.write(f.ino, 0, &data).unwrap();
    fs.sync().unwrap();
    fs.checkpoint().unwrap();
    let map = pages_with(&mut fs, 7, f.ino.0, Some(0))[0];
    let mut fs = remount(fs);
    let data_page = pages_with(&mut fs, 3, f.ino.0, None)[5];
    lose_beyond_repair(&mut fs, map);
    lose_beyond_repair(&mut fs, data_page);
    // The rebuild cannot account for a page the map held: the whole chunk fails, as it did
    // before rebuilds existed (which pages were on the lost data page is not known).
    let mut eio = 0;
    for page in 0..CHUNK_PAGES as usize {
        let at = page * LOGICAL_PAGE;
        match fs.read(f.ino, at as u64, LOGICAL_PAGE) {
            Ok(got) => assert!(got == data[at..at + LOGICAL_PAGE], "wrong bytes in page {page}"),
            Err(FsError::Corrupt(Corruption::Unrecoverable { .. })) => eio += 1,
            Err(e) => panic!("page {page}: {e}"),
        }
    }
    assert_eq!((eio, fs.stats().maps_rebuilt), (CHUNK_PAGES, 0));
    let check = fs.check(false);
    assert!(check.problems.iter().any(|p| p.contains("index chunk 0 unreadable")), "{:?}", check.problems);
    // The file can still be removed, and the file system checks clean after that.
    fs.unlink(ROOT, b"f").unwrap();
    let mut fs = remount(fs);
    let check = fs.check(true);
    assert!(check.clean(), "{:?}", check.problems);
}
