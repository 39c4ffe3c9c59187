//! The index with bounded RAM (docs/DESIGN.md, "Index"): chunks of a file's index live in map
//! nodes on the flash, are loaded when used and dropped past `FsOptions::index_chunks`; a
//! mount loads none of them; power cuts while maps are written, loaded, evicted and moved by
//! the cleaner lose nothing synced.

mod common;

use std::collections::BTreeMap;

use bitmend_flashfs::{Compression, Fs, FsOptions, CHUNK_PAGES, LOGICAL_PAGE, ROOT};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::nand::{FaultyNand, RamNand};
use bitmend_media::rng::Rng;
use common::{cfg, chip};

fn opts(index_chunks: usize) -> FsOptions {
    FsOptions { compression: Compression::None, dirty_limit: 256 << 10, index_chunks, ..FsOptions::default() }
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(0x9E37_79B9)) as u8 | 1).collect()
}

#[test]
fn ram_holds_a_bounded_window_of_the_index() {
    let window = 6;
    let mut fs = Fs::format(chip(4096), cfg(), opts(window)).unwrap();
    // A 24 MiB file (96 chunks) and 200 small files (a chunk each).
    let big = fs.create(ROOT, b"big", 0o644, 0, 0).unwrap();
    let pages = 96 * CHUNK_PAGES;
    for p in 0..pages {
        fs.write(big.ino, p * LOGICAL_PAGE as u64, &content(p, LOGICAL_PAGE)).unwrap();
    }
    for i in 0..200u64 {
        let f = fs.create(ROOT, format!("s{i}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.write(f.ino, 0, &content(1_000_000 + i, 5_000)).unwrap();
    }
    fs.sync().unwrap();
    fs.checkpoint().unwrap();
    // A checkpoint has written every changed chunk: what stays is the window.
    let (in_ram, dirty) = fs.index_in_ram();
    assert!(dirty == 0 && in_ram <= window, "{in_ram} chunks in RAM, {dirty} dirty");

    // Read everything back in a random order: chunks come and go, the bound holds.
    let mut order: Vec<u64> = (0..pages).collect();
    let mut r = Rng::new(5);
    for i in (1..order.len()).rev() {
        order.swap(i, r.below(i as u64 + 1) as usize);
    }
    let mut most = 0;
    for &p in &order {
        assert!(
            fs.read(big.ino, p * LOGICAL_PAGE as u64, LOGICAL_PAGE).unwrap() == content(p, LOGICAL_PAGE),
            "page {p}"
        );
        most = most.max(fs.index_in_ram().0);
    }
    assert!(most <= window, "{most} chunks in RAM at once with a window of {window}");
    let s = fs.stats();
    assert!(s.maps_loaded >= pages / CHUNK_PAGES && s.maps_evicted > 0, "{s:?}");
    let check = fs.check(true);
    assert!(check.clean(), "{:?}", check.problems);
    assert_eq!(check.data_pages, pages + 200 * 2);

    // A clean mount loads no chunk; the checkpoint holds where the maps are, not the pages.
    let ckpt = fs.stats().checkpoint_bytes;
    let (mut fs, rep) = Fs::open(fs.unmount().unwrap(), opts(window)).unwrap();
    assert_eq!(fs.index_in_ram(), (0, 0), "{rep:?}");
    assert_eq!(fs.stats().maps_loaded, 0);
    for i in (0..200u64).step_by(7) {
        let f = fs.lookup(ROOT, format!("s{i}").as_bytes()).unwrap();
        assert_eq!(fs.read(f.ino, 0, 8_000).unwrap(), content(1_000_000 + i, 5_000));
    }
    assert_eq!(fs.read(big.ino, 77 * LOGICAL_PAGE as u64, LOGICAL_PAGE).unwrap(), content(77, LOGICAL_PAGE));
    assert!(fs.index_in_ram().0 <= window);
    // Each page's CRC-32C is in the index, for the page cache.
    let crc = bitmend_code::crc::crc32c(&content(77, LOGICAL_PAGE));
    assert_eq!(fs.page_crc(big.ino, 77).unwrap(), Some(crc));
    assert_eq!(fs.page_crc(big.ino, pages + 5).unwrap(), None);
    eprintln!(
        "bounded index: {} logical pages in {} chunks, read in random order with {window} chunks in RAM (at most {most} at once, {} map loads); checkpoint {ckpt} bytes",
        pages + 400,
        pages / CHUNK_PAGES + 200,
        s.maps_loaded
    );
}

#[test]
fn a_mount_after_a_crash_reads_the_log_not_the_maps() {
    let mut fs = Fs::format(chip(512), cfg(), opts(4)).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    let pages = 8 * CHUNK_PAGES;
    let mut model = content(1, pages as usize * LOGICAL_PAGE);
    fs.write(f.ino, 0, &model).unwrap();
    fs.checkpoint().unwrap();
    // Synced overwrites across the 8 chunks, then a crash.
    let mut r = Rng::new(9);
    // Fewer than a checkpoint's worth of log pages: all of them are replayed.
    for step in 0..40u64 {
        let at = r.below(pages) as usize * LOGICAL_PAGE;
        let page = content(100 + step, LOGICAL_PAGE);
        fs.write(f.ino, at as u64, &page).unwrap();
        model[at..at + LOGICAL_PAGE].copy_from_slice(&page);
        fs.fsync(f.ino).unwrap();
    }
    let (mut fs, rep) = Fs::open(fs.into_nand(), opts(4)).unwrap();
    // Replay applied the overwrites without reading one map: they wait beside the maps.
    assert!(rep.nodes >= 40 && rep.maps_loaded == 0, "{rep:?}");
    assert!(fs.read(f.ino, 0, model.len()).unwrap() == model, "contents after the crash");
    let check = fs.check(true);
    assert!(check.clean(), "{:?}", check.problems);
    // And once merged and checkpointed, the next mount agrees.
    let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts(4)).unwrap();
    assert!(fs.read(f.ino, 0, model.len()).unwrap() == model, "contents after the remount");
    assert!(fs.check(true).clean());
    eprintln!(
        "crash mount: {} pages, {} nodes replayed onto 8 chunks, {} maps read",
        rep.pages, rep.nodes, rep.maps_loaded
    );
}

/// A file's synced state, page by page, for the cut checks.
#[derive(Clone, Debug, Default, PartialEq)]
struct State {
    big: Vec<u8>,
    small: BTreeMap<u64, Vec<u8>>,
}

/// One synced round on a file of several chunks: overwrites at random, a truncate and a
/// regrowth now and then, a small file created and an older one removed.
fn round<N: bitmend_media::nand::Nand>(
    fs: &mut Fs<N>,
    st: &mut State,
    r: u64,
) -> Result<(), bitmend_flashfs::FsError> {
    let big = fs.lookup(ROOT, b"big")?.ino;
    let mut rng = Rng::new(r);
    for k in 0..3 {
        let pages = (st.big.len() / LOGICAL_PAGE) as u64;
        let at = rng.below(pages.max(1)) as usize * LOGICAL_PAGE;
        let data = content(r * 10 + k, LOGICAL_PAGE);
        fs.write(big, at as u64, &data)?;
        if st.big.len() < at + data.len() {
            st.big.resize(at + data.len(), 0);
        }
        st.big[at..at + data.len()].copy_from_slice(&data);
    }
    if r % 6 == 5 {
        let size = (rng.below(st.big.len() as u64 / 2) + st.big.len() as u64 / 3) as usize;
        fs.setattr(big, bitmend_flashfs::SetAttr { size: Some(size as u64), ..Default::default() })?;
        st.big.truncate(size);
    }
    if r % 6 == 2 && st.big.len() < 300 * LOGICAL_PAGE {
        let end = st.big.len();
        let data = content(r + 7_000, 40 * LOGICAL_PAGE);
        fs.write(big, end as u64, &data)?;
        st.big.extend_from_slice(&data);
    }
    let f = fs.create(ROOT, format!("s{r}").as_bytes(), 0o644, 0, 0)?;
    let small = content(r + 90_000, 3_000);
    fs.write(f.ino, 0, &small)?;
    st.small.insert(r, small);
    if r >= 2 && st.small.remove(&(r - 2)).is_some() {
        fs.unlink(ROOT, format!("s{}", r - 2).as_bytes())?;
    }
    fs.sync()
}

fn read_state(fs: &mut Fs<FaultyNand<RamNand>>, last: u64) -> State {
    let big = fs.lookup(ROOT, b"big").unwrap();
    let mut st = State { big: fs.read(big.ino, 0, big.size as usize + 1).unwrap(), ..State::default() };
    for r in last.saturating_sub(3)..=last + 1 {
        if let Ok(f) = fs.lookup(ROOT, format!("s{r}").as_bytes()) {
            st.small.insert(r, fs.read(f.ino, 0, 10_000).unwrap());
        }
    }
    st
}

#[test]
fn power_cuts_with_a_two_chunk_window_keep_every_synced_state() {
    let o = opts(2);
    let mut base = Fs::format(chip(72), cfg(), o).unwrap();
    let big = base.create(ROOT, b"big", 0o644, 0, 0).unwrap();
    let mut start = State { big: content(3, 150 * LOGICAL_PAGE), ..State::default() };
    base.write(big.ino, 0, &start.big).unwrap();
    base.sync().unwrap();
    let base = base.unmount().unwrap();

    // The uncut run: the state after each round.
    let (mut probe, _) = Fs::open(FaultyNand::new(base.clone(), 0), o).unwrap();
    let rounds = 60;
    let mut states = vec![start.clone()];
    let mut marks = Vec::new();
    for r in 0..rounds {
        round(&mut probe, &mut start, r).unwrap();
        states.push(start.clone());
        marks.push(probe.store().nand().ops());
    }
    let cleaned = probe.stats().segments_cleaned;
    let loaded = probe.stats().maps_loaded;
    assert!(cleaned > 3 && loaded > 20, "the workload cleans and loads maps: {:?}", probe.stats());
    let ops = marks.last().copied().unwrap_or(0);

    let step = (ops / 700).max(1);
    // The rounds each cut run completed, from the run itself (operation counts vary from run
    // to run: see the campaign below).
    let done_rounds = std::cell::Cell::new(0u64);
    let work = |chip: &mut FaultyNand<RamNand>| {
        done_rounds.set(0);
        let (mut fs, _) = Fs::open(chip, o).expect("the mount writes nothing");
        let mut st = states[0].clone();
        for r in 0..rounds {
            if round(&mut fs, &mut st, r).is_err() {
                return false;
            }
            done_rounds.set(r + 1);
        }
        true
    };
    let c = campaign::run(&FaultyNand::new(base.clone(), 0), Schedule::EveryKth(step), work, |nand, cut| {
        let done = done_rounds.get();
        let (mut fs, rep) = Fs::open(nand, o).unwrap_or_else(|e| panic!("cut {cut}: mount: {e}"));
        let check = fs.check(true);
        assert!(check.clean(), "cut {cut}: {:?}; {rep:?}", check.problems);
        // Every page is as synced before the interrupted round, or as that round left it.
        let got = read_state(&mut fs, done);
        let (old, new) = (&states[done as usize], &states[(done as usize + 1).min(rounds as usize)]);
        assert!(
            got.big.len() == old.big.len() || got.big.len() == new.big.len(),
            "cut {cut}: size {}",
            got.big.len()
        );
        for (i, page) in got.big.chunks(LOGICAL_PAGE).enumerate() {
            let want = |s: &State| {
                let mut p = s.big.get(i * LOGICAL_PAGE..).unwrap_or(&[]).to_vec();
                p.truncate(page.len());
                p.resize(page.len(), 0);
                p
            };
            assert!(
                page == want(old) || page == want(new),
                "cut {cut} after round {done}: page {i} is neither synced state"
            );
        }
        for (r, bytes) in &got.small {
            let synced = old.small.get(r).or(new.small.get(r));
            // The interrupted round's file may exist before its data was written back.
            let ok = Some(bytes) == synced || (*r == done && bytes.is_empty());
            assert!(ok, "cut {cut}: s{r} holds {} bytes, none of its synced states", bytes.len());
        }
        for r in old.small.keys().filter(|r| new.small.contains_key(r)) {
            assert!(got.small.contains_key(r), "cut {cut}: s{r} was lost");
        }
    });
    let cuts = c.cuts;
    eprintln!(
        "power cuts with 2 index chunks in RAM: {cuts} cut points over {rounds} rounds ({ops} NAND operations, {cleaned} segments cleaned, {loaded} map loads in the uncut run); fsck (with the usage table) clean and every page as synced after each"
    );
}

/// The small files' contents after `rounds` rounds of [`map_round`].
fn small_files_after(rounds: u64) -> Vec<Vec<u8>> {
    let mut files: Vec<Vec<u8>> = (0..SMALL_FILES).map(|i| content(500 + i, 2 * LOGICAL_PAGE)).collect();
    for r in 0..rounds {
        for (i, at, page) in map_round_writes(r) {
            files[i as usize][at..at + LOGICAL_PAGE].copy_from_slice(&page);
        }
    }
    files
}

const SMALL_FILES: u64 = 100;

/// Round `r`'s writes: one page of each of 12 files, (file, offset, bytes).
fn map_round_writes(r: u64) -> Vec<(u64, usize, Vec<u8>)> {
    (0..12u64)
        .map(|k| {
            let i = (r * 12 + k * 7) % SMALL_FILES;
            (i, ((r + k) % 2) as usize * LOGICAL_PAGE, content(r * 1_000 + k, LOGICAL_PAGE))
        })
        .collect()
}

/// One synced round: a page of each of 12 small files (a chunk each) overwritten.
fn map_round<N: bitmend_media::nand::Nand>(fs: &mut Fs<N>, r: u64) -> Result<(), bitmend_flashfs::FsError> {
    for (i, at, page) in map_round_writes(r) {
        let ino = fs.lookup(ROOT, format!("m{i}").as_bytes())?.ino;
        fs.write(ino, at as u64, &page)?;
    }
    fs.sync()
}

/// More chunks dirty than the bound (32) between two checkpoints: their maps are written
/// ahead of the checkpoint, without one. A mount after a power cut takes each map from the
/// checkpoint it starts from, never from those written since, so a cut anywhere among them
/// loses nothing synced.
#[test]
fn power_cuts_among_maps_written_ahead_of_a_checkpoint_keep_every_synced_state() {
    let o = opts(64);
    let mut base = Fs::format(chip(72), cfg(), o).unwrap();
    for (i, data) in small_files_after(0).iter().enumerate() {
        let f = base.create(ROOT, format!("m{i}").as_bytes(), 0o644, 0, 0).unwrap();
        base.write(f.ino, 0, data).unwrap();
    }
    base.sync().unwrap();
    let base = base.unmount().unwrap();

    let rounds = 40;
    let (mut probe, _) = Fs::open(FaultyNand::new(base.clone(), 0), o).unwrap();
    let mut marks = Vec::new();
    // Rounds in which maps were written and no checkpoint was, and checkpoints after such.
    let (mut ahead, mut named) = (0, 0);
    for r in 0..rounds {
        let before = probe.stats();
        map_round(&mut probe, r).unwrap();
        let after = probe.stats();
        if after.maps_written > before.maps_written && after.checkpoints == before.checkpoints {
            ahead += 1;
        }
        if after.checkpoints > before.checkpoints && ahead > 0 {
            named += 1;
        }
        assert!(probe.index_in_ram().1 <= 32, "round {r}: the dirty chunks stay bounded");
        marks.push(probe.store().nand().ops());
    }
    assert!(ahead >= 2 && named >= 1, "{ahead} rounds wrote maps ahead, {named} checkpoints named such maps");
    let ops = marks.last().copied().unwrap_or(0);

    // The rounds each cut run completed, as it ran: not from the uncut run's operation
    // counts, which differ from run to run (a checkpoint's size depends on the order its
    // hash maps are encoded in).
    let done_rounds = std::cell::Cell::new(0u64);
    let work = |chip: &mut FaultyNand<RamNand>| {
        done_rounds.set(0);
        let (mut fs, _) = Fs::open(chip, o).expect("the mount writes nothing");
        for r in 0..rounds {
            if map_round(&mut fs, r).is_err() {
                return false;
            }
            done_rounds.set(r + 1);
        }
        true
    };
    let mut pages_checked = 0usize;
    let c = campaign::run(
        &FaultyNand::new(base, 0),
        Schedule::EveryKth((ops / 300).max(1)),
        work,
        |nand, cut| {
            let done = done_rounds.get();
            let (mut fs, rep) = Fs::open(nand, o).unwrap_or_else(|e| panic!("cut {cut}: mount: {e}"));
            let check = fs.check(true);
            assert!(check.clean(), "cut {cut}: {:?}; {rep:?}", check.problems);
            let (old, new) = (small_files_after(done), small_files_after((done + 1).min(rounds)));
            for i in 0..SMALL_FILES as usize {
                let ino = fs.lookup(ROOT, format!("m{i}").as_bytes()).unwrap().ino;
                let got = fs.read(ino, 0, 3 * LOGICAL_PAGE).unwrap();
                for (p, page) in got.chunks(LOGICAL_PAGE).enumerate() {
                    let span = p * LOGICAL_PAGE..(p + 1) * LOGICAL_PAGE;
                    assert!(
                        page == &old[i][span.clone()] || page == &new[i][span],
                        "cut {cut} after round {done}: page {p} of m{i} is neither synced state"
                    );
                    pages_checked += 1;
                }
            }
        },
    );
    eprintln!(
        "maps written ahead: {ahead} of {rounds} rounds wrote maps with no checkpoint, {named} checkpoints after; {} cut points ({ops} NAND operations, {} points past a run's end skipped), {pages_checked} pages checked byte for byte, fsck clean after each",
        c.cuts,
        c.skipped
    );
}
