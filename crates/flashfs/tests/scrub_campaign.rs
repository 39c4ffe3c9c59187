//! A repair never leaves less readable than it found: every programmed page of a small file
//! system damaged in turn, in four ways, then a scrub pass (the whole pass at once, as
//! `bitmend scrub IMAGE` runs it, and a step at a time with reads between, as the mount's
//! scrubber does), then a remount, fsck and a read of every file. Every file that read back
//! before the scrub reads back after it, byte for byte; no read ever returns a wrong byte.
//!
//! The damage, each on one page P (and its neighbour for the first):
//! - erased: P's spare and the whole of P + 1 read as erased cells (0xFF), the shape that
//!   made a scrub believe the block ended at P + 1 and erase the rest of its segment;
//! - garbage: P's data and spare replaced by random bytes;
//! - flipped: 400 random bits of P flipped;
//! - copied: another programmed page, data and spare, copied over P.
//!
//! `SCRUB_CAMPAIGN_FILES` sets the number of files (120 by default; the chip grows with it),
//! `SCRUB_CAMPAIGN_STRIDE` damages every n-th page only (1, every page, by default).

mod common;

use std::collections::BTreeSet;

use bitmend_flashfs::{Compression, Fs, FsConfig, FsError, FsOptions, Ino, PageAddr, ROOT};
use bitmend_flashfs::{Corruption, PosixError};
use bitmend_media::nand::{Geometry, Nand, RamNand, RawAccess, Timing};
use bitmend_media::rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Damage {
    Erased,
    Garbage,
    Flipped,
    Copied,
}

const KINDS: [Damage; 4] = [Damage::Erased, Damage::Garbage, Damage::Flipped, Damage::Copied];

/// How the pass is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    Whole,
    Stepped,
}

struct Model {
    /// (parent directory's name, file name, content); directory "" is the root.
    files: Vec<(String, String, Vec<u8>)>,
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn opts() -> FsOptions {
    FsOptions { compression: Compression::Lz4, dirty_limit: 64 << 10, ..FsOptions::default() }
}

/// File contents: random bytes (incompressible), text (nodes of several pages), or empty.
fn content(rng: &mut Rng, i: usize) -> Vec<u8> {
    let len = match i % 10 {
        0 => 0,
        1..=6 => rng.below(6000) as usize,
        7 | 8 => 6000 + rng.below(20_000) as usize,
        _ => 30_000 + rng.below(30_000) as usize,
    };
    let mut v = vec![0u8; len];
    if i.is_multiple_of(3) {
        let words: &[&[u8]] = &[b"segment ", b"parity ", b"erase ", b"block ", b"page\n"];
        for (k, b) in v.iter_mut().enumerate() {
            *b = words[(k / 7 + i) % words.len()][k % 5];
        }
    } else {
        rng.fill(&mut v);
    }
    v
}

/// A file system of `n` files in eight directories, some rewritten, some deleted, unmounted
/// cleanly. Returns the chip and what it holds.
fn build(n: usize) -> (RamNand, Model) {
    let blocks = (64 + n / 3) as u32;
    let chip = RamNand::new(Geometry::new(2048, 64, 16, blocks).unwrap()).unwrap().with_timing(Timing::NONE);
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 };
    let mut fs = Fs::format(chip, cfg, opts()).unwrap();
    let mut rng = Rng::new(47);
    let mut dirs = vec![(String::new(), ROOT)];
    for d in 0..8 {
        let name = format!("d{d}");
        let a = fs.mkdir(ROOT, name.as_bytes(), 0o755, 0, 0).unwrap();
        dirs.push((name, a.ino));
    }
    let mut files = Vec::new();
    for i in 0..n {
        let (dname, dino) = dirs[i % dirs.len()].clone();
        let name = format!("file-{i:04}");
        let a = fs.create(dino, name.as_bytes(), 0o644, 0, 0).unwrap();
        let data = content(&mut rng, i);
        fs.write(a.ino, 0, &data).unwrap();
        files.push((dname, name, data));
        if i.is_multiple_of(37) {
            fs.sync().unwrap();
        }
    }
    // Some rewritten (stale data for the cleaner), some deleted.
    for i in (0..n).step_by(11) {
        let (d, name, _) = &files[i];
        let ino = lookup(&mut fs, d, name).unwrap();
        let data = content(&mut rng, i + 1);
        fs.setattr(ino, bitmend_flashfs::SetAttr { size: Some(0), ..Default::default() }).unwrap();
        fs.write(ino, 0, &data).unwrap();
        files[i].2 = data;
    }
    for i in (5..n).step_by(23).rev() {
        let (d, name, _) = files.remove(i);
        let parent = if d.is_empty() { ROOT } else { fs.lookup(ROOT, d.as_bytes()).unwrap().ino };
        fs.unlink(parent, name.as_bytes()).unwrap();
    }
    (fs.unmount().unwrap(), Model { files })
}

fn lookup<N: Nand>(fs: &mut Fs<N>, dir: &str, name: &str) -> Result<Ino, FsError> {
    let parent = if dir.is_empty() { ROOT } else { fs.lookup(ROOT, dir.as_bytes())?.ino };
    Ok(fs.lookup(parent, name.as_bytes())?.ino)
}

/// Reads every file; returns the indices of those that read back whole. A read that returns
/// bytes other than the model's fails the test: damage may cost a file, never its truth.
fn readable<N: Nand>(fs: &mut Fs<N>, model: &Model, what: &str) -> BTreeSet<usize> {
    let mut ok = BTreeSet::new();
    for (i, (d, name, want)) in model.files.iter().enumerate() {
        let ino = match lookup(fs, d, name) {
            Ok(ino) => ino,
            Err(FsError::Posix(PosixError::NotFound)) => panic!("{what}: {d}/{name} is gone"),
            Err(_) => continue,
        };
        match fs.read(ino, 0, want.len() + 1) {
            Ok(got) => {
                assert!(got == *want, "{what}: {d}/{name} read back {} bytes that differ", got.len());
                ok.insert(i);
            }
            Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {}
            Err(e) => panic!("{what}: {d}/{name}: {e}"),
        }
    }
    ok
}

/// Every page of the chip that holds something (its raw bytes are not all erased).
fn programmed(chip: &mut RamNand) -> Vec<u32> {
    let g = chip.geometry();
    let mut raw = vec![0u8; g.raw_page_size()];
    (0..g.pages()).filter(|&p| chip.raw_read(p, &mut raw).is_ok() && raw.iter().any(|&b| b != 0xFF)).collect()
}

fn damage(chip: &mut RamNand, kind: Damage, page: u32, pages: &[u32], rng: &mut Rng) {
    let g = chip.geometry();
    let (ps, raw) = (g.page_size as usize, g.raw_page_size());
    match kind {
        Damage::Erased => {
            chip.raw_write(page, ps, &vec![0xFF; raw - ps]).unwrap();
            if page + 1 < g.pages() {
                chip.raw_write(page + 1, 0, &vec![0xFF; raw]).unwrap();
            }
        }
        Damage::Garbage => {
            let mut bytes = vec![0u8; raw];
            rng.fill(&mut bytes);
            chip.raw_write(page, 0, &bytes).unwrap();
        }
        Damage::Flipped => {
            let mut bytes = vec![0u8; raw];
            chip.raw_read(page, &mut bytes).unwrap();
            for bit in rng.distinct(400, raw as u64 * 8) {
                bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
            }
            chip.raw_write(page, 0, &bytes).unwrap();
        }
        Damage::Copied => {
            let from =
                pages[(pages.iter().position(|&p| p == page).unwrap() + pages.len() / 2) % pages.len()];
            let mut bytes = vec![0u8; raw];
            chip.raw_read(from, &mut bytes).unwrap();
            chip.raw_write(page, 0, &bytes).unwrap();
        }
    }
}

/// What one damaged page came to.
#[derive(Default, Debug)]
struct Tally {
    cases: u64,
    /// The mount refused the damaged image (before any repair ran).
    unmountable: u64,
    /// Cases in which some file was unreadable before the scrub, and after it.
    files_lost_before: u64,
    files_lost_after: u64,
    /// Files made readable again by the scrub (a read before it failed; after, whole).
    files_recovered: u64,
    repaired_pages: u64,
}

/// Where and how one case damages.
#[derive(Clone, Copy)]
struct Target {
    kind: Damage,
    pass: Pass,
    page: u32,
    /// The page is in the segment still being written (group parity only).
    live: bool,
}

/// One case: damage, a read of everything, a pass, a remount, fsck, a read of everything.
fn case(base: &RamNand, model: &Model, at: Target, pages: &[u32], t: &mut Tally) {
    let Target { kind, pass, page, live } = at;
    let what = format!("{kind:?} at page {page}, {pass:?} pass");
    let mut chip = base.clone();
    damage(&mut chip, kind, page, pages, &mut Rng::new(page as u64 * 4 + kind as u64));
    t.cases += 1;
    let before = match Fs::open(chip.clone(), opts()) {
        Ok((mut fs, _)) => readable(&mut fs, model, &format!("{what}, before")),
        Err(e) => {
            // Nothing was readable, so nothing may be lost; but the scrub must refuse too.
            t.unmountable += 1;
            assert!(Fs::open(chip, opts()).is_err(), "{what}: {e}, then mounted");
            return;
        }
    };
    let (mut fs, _) = Fs::open(chip, opts()).unwrap();
    let r = match pass {
        Pass::Whole => fs.scrub().unwrap_or_else(|e| panic!("{what}: scrub: {e}")),
        Pass::Stepped => {
            let mut p = fs.scrub_begin();
            let mut k = 0;
            while !fs.scrub_step(&mut p).unwrap_or_else(|e| panic!("{what}: scrub step: {e}")) {
                // A request between steps, as the mount serves them.
                let (d, name, _) = &model.files[k * 7 % model.files.len()];
                if let Ok(ino) = lookup(&mut fs, d, name) {
                    let _ = fs.read(ino, 0, 4096);
                }
                k += 1;
            }
            p.report()
        }
    };
    t.repaired_pages += r.repaired_by_group + r.repaired_by_segment;
    let (mut fs, _) = Fs::open(fs.unmount().unwrap_or_else(|e| panic!("{what}: unmount: {e}")), opts())
        .unwrap_or_else(|e| panic!("{what}: the scrubbed image does not mount: {e}"));
    let after = readable(&mut fs, model, &format!("{what}, after"));
    let lost: Vec<_> = before.difference(&after).map(|&i| &model.files[i].1).collect();
    assert!(lost.is_empty(), "{what}: readable before the scrub, not after: {lost:?} ({r:?})");
    let check = fs.check(true);
    if after.len() == model.files.len() {
        assert!(check.clean(), "{what}: every file reads back but fsck says {check:?}");
    } else {
        assert!(check.unreadable_pages > 0, "{what}: files unreadable, fsck names none: {check:?}");
    }
    if before.len() < model.files.len() {
        // Beyond the redundancy only: two pages of one group of the segment still being
        // written (no segment parity yet). Anywhere else one damaged page costs nothing.
        assert!(
            kind == Damage::Erased && live,
            "{what}: {} files unreadable",
            model.files.len() - before.len()
        );
    }
    t.files_lost_before += (before.len() < model.files.len()) as u64;
    t.files_lost_after += (after.len() < model.files.len()) as u64;
    t.files_recovered += after.difference(&before).count() as u64;
}

#[test]
fn no_scrub_leaves_less_readable_than_it_found() {
    let n = env("SCRUB_CAMPAIGN_FILES", 120);
    let stride = env("SCRUB_CAMPAIGN_STRIDE", 1).max(1);
    let (mut base, model) = build(n);
    {
        let (mut fs, _) = Fs::open(base.clone(), opts()).unwrap();
        assert_eq!(readable(&mut fs, &model, "undamaged").len(), model.files.len());
        assert!(fs.check(true).clean());
    }
    let pages = programmed(&mut base);
    let live_segment = {
        let (fs, _) = Fs::open(base.clone(), opts()).unwrap();
        let live = fs.store().live_segment().unwrap().physical;
        move |p: u32| fs.store().segment_of(PageAddr(p)) == Some(live)
    };
    for kind in KINDS {
        let mut t = Tally::default();
        for (k, &page) in pages.iter().enumerate().step_by(stride) {
            let pass = if k % 2 == 0 { Pass::Whole } else { Pass::Stepped };
            let at = Target { kind, pass, page, live: live_segment(page) || live_segment(page + 1) };
            case(&base, &model, at, &pages, &mut t);
        }
        eprintln!(
            "scrub campaign, {kind:?}: {} files, {} of {} programmed pages damaged in turn; {t:?}",
            model.files.len(),
            t.cases,
            pages.len()
        );
    }
}
