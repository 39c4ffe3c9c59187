//! The background cleaner (`Fs::clean_step`), as the mount's write-back thread runs it: it
//! keeps free segments above the cleaner's reserve in short steps, so that the cleaner
//! proper (whole victims in one call) never has to run, and a power cut at any step loses
//! nothing that was synced.

mod common;

use bitmend_flashfs::Corruption;
use bitmend_flashfs::{Compression, Fs, FsError, FsOptions, Ino, LOGICAL_PAGE, ROOT};
use bitmend_media::nand::{Nand, RamNand};
use bitmend_media::rng::Rng;
use common::{cfg, chip};

/// 16 MiB: 128 segments of 4 blocks (96 KiB of data each).
const BLOCKS: u32 = 512;
/// Logical pages per step, as the thread's steps but smaller (the chip is small).
const STEP: usize = 16;

fn opts() -> FsOptions {
    FsOptions { background_write_back: true, dirty_limit: 64 << 10, ..common::opts(Compression::Lz4) }
}

/// What the write-back thread does between requests: cleaning first while it is due,
/// write-back until dirty data is down to half the limit. Returns the most logical pages
/// one cleaning step moved.
fn thread<N: Nand>(fs: &mut Fs<N>) -> usize {
    let mut most = 0;
    for _ in 0..100_000 {
        if fs.clean_due() {
            most = most.max(fs.clean_step(STEP).unwrap());
        } else if !fs.write_back_done() {
            fs.write_back_step(STEP).unwrap();
        } else {
            return most;
        }
    }
    panic!("the thread never ran out of work");
}

/// One step of the thread, as when a writer's requests come between its steps: dirty
/// data builds up, and cleaning passes pages that are dirty.
fn one_step<N: Nand>(fs: &mut Fs<N>) -> usize {
    if fs.clean_due() {
        fs.clean_step(STEP).unwrap()
    } else {
        if fs.write_back_due() {
            fs.write_back_step(STEP).unwrap();
        }
        0
    }
}

/// A file of `pages` random pages, synced, and its bytes.
fn filled<N: Nand>(fs: &mut Fs<N>, pages: usize, rng: &mut Rng) -> (Ino, Vec<u8>) {
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let bytes: Vec<u8> = (0..pages * LOGICAL_PAGE).map(|_| rng.next_u64() as u8).collect();
    for (i, chunk) in bytes.chunks(64 << 10).enumerate() {
        fs.write(f, (i * (64 << 10)) as u64, chunk).unwrap();
        thread(fs);
    }
    fs.sync().unwrap();
    (f, bytes)
}

/// Overwrites `count` runs of 1 to 8 pages at random places (the model too).
fn overwrite<N: Nand>(fs: &mut Fs<N>, f: Ino, model: &mut [u8], rng: &mut Rng) -> std::ops::Range<usize> {
    let pages = model.len() / LOGICAL_PAGE;
    let run = 1 + rng.below(8) as usize;
    let at = rng.below((pages - run) as u64) as usize * LOGICAL_PAGE;
    let data: Vec<u8> = (0..run * LOGICAL_PAGE).map(|_| rng.next_u64() as u8).collect();
    fs.write(f, at as u64, &data).unwrap();
    model[at..at + data.len()].copy_from_slice(&data);
    at / LOGICAL_PAGE..at / LOGICAL_PAGE + run
}

fn assert_reads_back(fs: &mut Fs<RamNand>, f: Ino, model: &[u8], when: &str) {
    let got = fs.read(f, 0, model.len()).unwrap();
    assert_eq!(got.len(), model.len(), "{when}: length");
    if let Some(i) = got.iter().zip(model).position(|(a, b)| a != b) {
        panic!("{when}: byte {i} (page {}) differs", i / LOGICAL_PAGE);
    }
}

#[test]
fn short_steps_keep_the_cleaner_proper_from_running_and_lose_nothing() {
    let mut rng = Rng::new(20);
    let mut fs = Fs::format(chip(BLOCKS), cfg(), opts()).unwrap();
    let capacity_pages = (fs.statfs().0 / LOGICAL_PAGE as u64) as usize;
    // Two-thirds full: overwrites soon leave every segment part live.
    let (f, mut model) = filled(&mut fs, capacity_pages * 2 / 3, &mut rng);
    let mut most_moved = 0;
    for i in 0..3000 {
        overwrite(&mut fs, f, &mut model, &mut rng);
        let moved = if i % 8 == 7 { thread(&mut fs) } else { one_step(&mut fs) };
        most_moved = most_moved.max(moved);
    }
    let s = fs.stats();
    eprintln!(
        "clean steps {}, segments released by them {}, pages moved {}, most in a step {most_moved}, cleaner proper runs {}",
        s.clean_steps, s.segments_cleaned_in_steps, s.pages_moved, s.cleaner_runs
    );
    // Written about four times over the free space: the background cleaner did the work.
    assert!(s.segments_cleaned_in_steps > 100, "{s:?}");
    assert!(s.pages_moved > 1000, "{s:?}");
    assert_eq!(s.cleaner_runs, 0, "the cleaner proper ran: the steps fell behind");
    // A step moves what the flash pages it looks at hold: STEP pages' worth, and the
    // nodes that reach into them from either side.
    assert!(most_moved <= 2 * STEP, "a step moved {most_moved} pages");
    assert_reads_back(&mut fs, f, &model, "mounted");
    assert!(fs.check(true).clean(), "{:?}", fs.check(true).problems);
    fs.sync().unwrap();
    let (mut again, _) = Fs::open(fs.into_nand(), opts()).unwrap();
    assert_reads_back(&mut again, f, &model, "remounted");
    assert!(again.check(true).clean(), "{:?}", again.check(true).problems);
}

#[test]
fn a_power_cut_at_any_cleaning_step_loses_nothing_synced() {
    let mut rng = Rng::new(21);
    let mut fs = Fs::format(chip(BLOCKS), cfg(), opts()).unwrap();
    let capacity_pages = (fs.statfs().0 / LOGICAL_PAGE as u64) as usize;
    let (f, mut model) = filled(&mut fs, capacity_pages * 2 / 3, &mut rng);
    let mut cuts = 0;
    let mut released_between_cuts = 0;
    let mut last_released = 0;
    for _ in 0..400 {
        overwrite(&mut fs, f, &mut model, &mut rng);
        fs.sync().unwrap();
        // Only the cleaner runs between cuts: every state it passes through is synced data
        // moved, or not yet, and each must read back exactly.
        while fs.clean_due() {
            fs.clean_step(STEP).unwrap();
            let cut: RamNand = fs.store().nand().clone();
            let (mut after, _) = Fs::open(cut, opts()).unwrap();
            assert_reads_back(&mut after, f, &model, &format!("cut {cuts}"));
            cuts += 1;
            let released = fs.stats().segments_cleaned_in_steps;
            released_between_cuts += (released > last_released) as u64;
            last_released = released;
        }
    }
    eprintln!("{cuts} power cuts, after {released_between_cuts} of which a segment had just been released");
    assert!(cuts > 300, "only {cuts} cuts");
    assert!(released_between_cuts > 10, "only {released_between_cuts} cuts right after a release");
    let (mut after, _) = Fs::open(fs.store().nand().clone(), opts()).unwrap();
    assert!(after.check(true).clean(), "{:?}", after.check(true).problems);
}

#[test]
fn a_page_beyond_repair_stays_an_error_while_the_steps_clean_around_it() {
    let mut rng = Rng::new(22);
    let mut fs = Fs::format(common::faulty_chip(BLOCKS, 5), cfg(), opts()).unwrap();
    let capacity_pages = (fs.statfs().0 / LOGICAL_PAGE as u64) as usize;
    let (f, mut model) = filled(&mut fs, capacity_pages * 2 / 3, &mut rng);
    // A data page of the file in its oldest segment, lost with enough of its group and
    // stripe that parity cannot rebuild it (3 flash pages lost).
    let page = common::pages_with(&mut fs, 3, f.0, None)[0];
    common::lose_beyond_repair(&mut fs, page);
    let pages = model.len() / LOGICAL_PAGE;
    let unreadable = |fs: &mut Fs<_>, i: usize| {
        matches!(
            fs.read(f, (i * LOGICAL_PAGE) as u64, LOGICAL_PAGE),
            Err(FsError::Corrupt(Corruption::Unrecoverable { .. }))
        )
    };
    let mut lost: Vec<usize> = (0..pages).filter(|&i| unreadable(&mut fs, i)).collect();
    assert!(!lost.is_empty(), "the lost flash page held no live logical page");
    for i in 0..2000 {
        let written = overwrite(&mut fs, f, &mut model, &mut rng);
        lost.retain(|p| !written.contains(p));
        if i % 8 == 7 {
            thread(&mut fs);
        } else {
            one_step(&mut fs);
        }
    }
    let s = fs.stats();
    eprintln!("{} logical pages still on the lost flash page; {s:?}", lost.len());
    assert!(s.segments_cleaned_in_steps > 50, "{s:?}");
    // Every page reads back as written, but for those still on the lost flash page, which
    // fail as they did (their victim was kept, not erased under them).
    for i in 0..pages {
        let got = fs.read(f, (i * LOGICAL_PAGE) as u64, LOGICAL_PAGE);
        if lost.contains(&i) {
            assert!(
                matches!(got, Err(FsError::Corrupt(Corruption::Unrecoverable { .. }))),
                "page {i}: {got:?}"
            );
        } else {
            assert_eq!(got.unwrap(), model[i * LOGICAL_PAGE..(i + 1) * LOGICAL_PAGE], "page {i}");
        }
    }
}
