//! Scrubbing: a pass finds and repairs every damaged data page, rewrites what sat on them,
//! moves the data of a segment with damaged parity under fresh parity, reports what it cannot
//! repair, interleaves with writes, and its counters survive a remount.

mod common;

use bitmend_flashfs::Corruption;
use bitmend_flashfs::Ino;
use bitmend_flashfs::{Compression, Fs, FsConfig, FsError, FsOptions, PageAddr, PageHealth, ROOT};
use bitmend_media::nand::{FaultyNand, RamNand};
use bitmend_media::rng::Rng;
use common::cfg;

fn chip() -> FaultyNand<RamNand> {
    common::faulty_chip(128, 7)
}

fn opts() -> FsOptions {
    common::opts(Compression::Lz4)
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

type TestFs = Fs<FaultyNand<RamNand>>;

/// Ten 30 KB files, synced: about three segments.
fn populated() -> (TestFs, Vec<(Ino, Vec<u8>)>) {
    let mut fs = Fs::format(chip(), cfg(), opts()).unwrap();
    let mut files = Vec::new();
    for i in 0..10u64 {
        let f = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        let data = content(100 + i, 30_000);
        fs.write(f.ino, 0, &data).unwrap();
        files.push((f.ino, data));
    }
    fs.sync().unwrap();
    (fs, files)
}

fn pages_of(fs: &mut TestFs, segment: u64, want: PageHealth) -> Vec<PageAddr> {
    let all = fs.store_mut().scrub_segment_pages(segment).unwrap();
    all.into_iter().filter(|p| p.1 == want).map(|p| p.0).collect()
}

#[test]
fn a_pass_repairs_every_damaged_page_relocates_its_data_and_counts_damaged_parity() {
    let (mut fs, files) = populated();
    let segments: Vec<u64> = fs.store().used_segments().iter().map(|u| u.logical).collect();
    assert!(segments.len() >= 3, "{} segments", segments.len());
    // Data pages of the first segment: every 9th one damaged (1 to 1000 flipped bits, or lost).
    let data = pages_of(&mut fs, segments[0], PageHealth::Data);
    let mut injected = 0u64;
    for (k, p) in data.iter().enumerate().step_by(9).skip(1) {
        let nand = fs.store_mut().nand_mut();
        if k % 5 == 0 {
            nand.lose_page(p.0).unwrap();
        } else {
            nand.flip_bits(p.0, [1u32, 10, 100, 1000][k % 4]).unwrap();
        }
        injected += 1;
    }
    // One parity page of the second segment.
    let parity = pages_of(&mut fs, segments[1], PageHealth::Sound);
    fs.store_mut().nand_mut().flip_bits(parity[0].0, 40).unwrap();

    let before = fs.health();
    let r = fs.scrub().unwrap();
    assert!(r.done && r.segments_done == r.segments_total && r.segments_total >= 3, "{r:?}");
    assert_eq!(r.repaired_by_group + r.repaired_by_segment, injected, "{r:?}");
    assert_eq!(r.parity_damaged, 1, "{r:?}");
    assert_eq!(r.unreadable_pages, 0, "{r:?}");
    assert!(r.logical_pages_relocated > 0, "{r:?}");
    // Both damaged segments (one with bad data pages, one with a bad parity page) were
    // emptied and erased: a second pass finds
    // full redundancy everywhere.
    assert_eq!(r.segments_healed, 2, "{r:?}");
    let again = fs.scrub().unwrap();
    assert_eq!(
        (again.parity_damaged, again.repaired_by_group + again.repaired_by_segment),
        (0, 0),
        "{again:?}"
    );

    // Everything reads back, and nothing needs repair any more: the data moved.
    let repaired = |fs: &Fs<_>| fs.store().stats().repaired_by_group + fs.store().stats().repaired_by_segment;
    let at = repaired(&fs);
    for (ino, want) in &files {
        assert_eq!(&fs.read(*ino, 0, 40_000).unwrap(), want, "inode {ino}");
    }
    assert_eq!(repaired(&fs), at, "a read after the scrub still needed a repair");

    // The counters survive the unmount.
    let h = fs.health();
    assert_eq!(h.scrub_passes, before.scrub_passes + 2);
    assert_eq!(h.repaired_by_group + h.repaired_by_segment, injected);
    assert!(h.pages_scrubbed >= r.pages_checked);
    let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
    assert_eq!(fs.health(), h);
    assert!(fs.check(true).clean());
    eprintln!(
        "scrub: {injected} damaged data pages and 1 damaged parity page injected; {r:?}; health after remount {h:?}"
    );
}

#[test]
fn damage_beyond_the_redundancy_is_reported_and_the_pass_completes() {
    let (mut fs, files) = populated();
    let first = fs.store().used_segments()[0].logical;
    // A page, the next of its group (p = 1) and the same page of the next block (s = 1).
    let p = pages_of(&mut fs, first, PageHealth::Data)[6].0;
    for q in [p, p + 1, p + 16] {
        fs.store_mut().nand_mut().lose_page(q).unwrap();
    }
    let r = fs.scrub().unwrap();
    assert!(r.done, "{r:?}");
    assert!(r.unreadable_pages >= 1, "{r:?}");
    assert_eq!(fs.health().unrecoverable, fs.store().stats().unrecoverable);
    // The damaged segment is not erased by the healing (it holds a page beyond repair): the
    // lost range still fails, before and after a remount, and nothing reads back wrong.
    let check = |fs: &mut TestFs| {
        let mut eio = 0;
        for (ino, data) in &files {
            for off in (0..data.len()).step_by(4096) {
                match fs.read(*ino, off as u64, 4096) {
                    Ok(got) => {
                        assert_eq!(got, data[off..(off + 4096).min(data.len())], "inode {ino} at {off}")
                    }
                    Err(FsError::Corrupt(Corruption::Unrecoverable { .. })) => eio += 1,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        eio
    };
    assert!(check(&mut fs) >= 1);
    let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
    assert!(check(&mut fs) >= 1, "the lost range came back as something else after remount");
}

#[test]
fn a_pass_interleaves_with_writes_and_the_cleaner() {
    let (mut fs, mut files) = populated();
    let first = fs.store().used_segments()[0].logical;
    let victim = pages_of(&mut fs, first, PageHealth::Data)[3];
    fs.store_mut().nand_mut().flip_bits(victim.0, 200).unwrap();
    let mut pass = fs.scrub_begin();
    let mut round = 0u64;
    // Between steps: rewrite every file three times (1 MB a round; the chip holds 3 MB), so
    // that the cleaner reclaims segments, perhaps the very ones the pass has yet to check.
    while !fs.scrub_step(&mut pass).unwrap() {
        for k in 0..3 {
            for (i, (ino, data)) in files.iter_mut().enumerate() {
                *data = content(1000 * round + 100 * k + i as u64, 30_000);
                fs.write(*ino, 0, data).unwrap();
            }
            fs.sync().unwrap();
        }
        round += 1;
    }
    let r = pass.report();
    assert!(round >= 3 && r.done, "{round} rounds, {r:?}");
    assert!(fs.stats().segments_cleaned > 0, "the cleaner never ran: {:?}", fs.stats());
    for (ino, want) in &files {
        assert_eq!(&fs.read(*ino, 0, 40_000).unwrap(), want, "inode {ino}");
    }
    assert!(fs.check(true).clean());
}

/// The only segment, the live one, is healed too: two rounds of checkpoint and new segment
/// make it eligible, then its data moves under fresh parity.
#[test]
fn the_live_segment_is_healed_too() {
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 16 };
    let mut fs = Fs::format(chip(), cfg, opts()).unwrap();
    let f = fs.create(ROOT, b"x", 0o644, 0, 0).unwrap();
    let data = content(1, 30_000);
    fs.write(f.ino, 0, &data).unwrap();
    fs.sync().unwrap();
    let seg = fs.store().used_segments()[0];
    let p = pages_of(&mut fs, seg.logical, PageHealth::Data)[3];
    fs.store_mut().nand_mut().flip_bits(p.0, 20).unwrap();
    let r = fs.scrub().unwrap();
    assert_eq!((r.repaired_by_group, r.segments_healed), (1, 1), "{r:?}");
    assert!(!fs.store().used_segments().contains(&seg), "{:?}", fs.store().used_segments());
    let again = fs.scrub().unwrap();
    assert_eq!(again.repaired_by_group + again.repaired_by_segment + again.parity_damaged, 0, "{again:?}");
    assert_eq!(fs.read(f.ino, 0, 40_000).unwrap(), data);
    let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
    assert_eq!(fs.read(f.ino, 0, 40_000).unwrap(), data);
    assert!(fs.check(true).clean());
}

/// A misdirected write: a valid page (data and spare) lands on another page of a sealed
/// segment. Its spare binds it to the address it was made for (version 6), so where it
/// landed it is an erasure like any other: reads rebuild the page it covered from parity,
/// a scrub pass counts and heals it, and no byte read back is wrong.
#[test]
fn a_page_written_to_the_wrong_place_is_detected_and_repaired() {
    let (mut fs, files) = populated();
    let segments: Vec<u64> = fs.store().used_segments().iter().map(|u| u.logical).collect();
    let first = pages_of(&mut fs, segments[0], PageHealth::Data);
    let second = pages_of(&mut fs, segments[1], PageHealth::Data);
    let block_of = |p: &PageAddr| p.0 / 16;
    // Two faults: a page of the same group copied over its neighbour (the case no check of
    // the segment number or the kind can see), and a page of another segment.
    let (from, to) = (first[3], first[2]);
    assert_eq!(block_of(&from), block_of(&to), "same block");
    let nand = fs.store_mut().nand_mut();
    nand.misdirect(from.0, to.0).unwrap();
    nand.misdirect(first[0].0, second[5].0).unwrap();
    let injected = nand.faults().len() as u64;
    assert_eq!(injected, 2);
    // Every byte reads back through the repair.
    for (ino, data) in &files {
        assert_eq!(&fs.read(*ino, 0, data.len()).unwrap(), data, "file {ino} after the misdirected writes");
    }
    let r = fs.scrub().unwrap();
    assert_eq!(r.repaired_by_group + r.repaired_by_segment, injected, "{r:?}");
    assert_eq!(r.unreadable_pages, 0, "{r:?}");
    assert!(r.segments_healed >= 1, "{r:?}");
    let again = fs.scrub().unwrap();
    assert_eq!(again.repaired_by_group + again.repaired_by_segment + again.unreadable_pages, 0, "{again:?}");
    assert!(fs.check(true).clean());
    let (mut fs, _) = Fs::open(fs.into_nand(), opts()).unwrap();
    for (ino, data) in &files {
        assert_eq!(&fs.read(*ino, 0, data.len()).unwrap(), data, "file {ino} after a remount");
    }
}
