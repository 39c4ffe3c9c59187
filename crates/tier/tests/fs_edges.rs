//! The file system over the tier at its edges: a tier too small for the dirty state (it
//! fills, and the file system writes to flash instead), a full chip (ENOSPC, never an
//! acknowledged write lost), a tier whose slots were hit by wild writes (the pages named and
//! not applied, the file keeping what flash holds), a metadata record that does not decode
//! (refused), and a tier of another file system (refused). After each crash every
//! acknowledged byte is checked.

use bitmend_flashfs::{Compression, DirtyRecovery, Fs, FsConfig, FsError, FsOptions, Ino, ROOT};
use bitmend_media::nand::{Geometry, RamNand, Timing};
use bitmend_media::pmem::{RamRegion, Region};
use bitmend_media::rng::Rng;
use bitmend_tier::{crash, mount, DirtyTier};

mod common;

fn opts() -> FsOptions {
    FsOptions { compression: Compression::None, dirty_limit: 4 << 20, ..FsOptions::default() }
}

fn chip(blocks: u32) -> RamNand {
    RamNand::new(Geometry::new(2048, 64, 16, blocks).unwrap()).unwrap().with_timing(Timing::NONE)
}

/// A formatted chip, and a tier of `heap` bytes of slots made for it.
fn base(blocks: u32, heap: usize) -> (RamNand, RamRegion, RamRegion) {
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 };
    let fs = Fs::format(chip(blocks), cfg, opts()).unwrap();
    let id = fs.store().fs_id();
    let nand = fs.unmount().unwrap();
    let tier = DirtyTier::create_for(RamRegion::new(256 << 10), RamRegion::new(heap), id).unwrap();
    let (log, heap) = tier.into_regions();
    (nand, log, heap)
}

fn page(seed: u64) -> Vec<u8> {
    let mut p = vec![0u8; 4096];
    Rng::new(seed).fill(&mut p);
    p
}

#[test]
fn a_tier_too_small_for_the_dirty_state_writes_to_flash_and_loses_nothing() {
    // A heap of 768 KiB: a few dozen slots, against 400 pages written without a sync.
    let (nand, log, heap) = base(64, 768 << 10);
    let (mut fs, _, _) = mount(nand, opts(), log, heap).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    for i in 0..400u64 {
        fs.write(f, (i % 150) * 4096, &page(i)).unwrap();
    }
    let (nand, regions) = crash::<RamNand, RamRegion, RamRegion>(fs);
    let (log, heap) = regions.unwrap();
    let (mut fs, _, report) = mount(nand, opts(), log, heap).unwrap();
    assert!(!report.lost_anything(), "{report:?}");
    assert!(
        report.pages_found > 0 && report.pages_found < 60,
        "the tier held the last pages only: {report:?}"
    );
    let f = fs.lookup(ROOT, b"f").unwrap().ino;
    for i in 250..400u64 {
        assert_eq!(fs.read(f, (i % 150) * 4096, 4096).unwrap(), page(i), "page {}", i % 150);
    }
}

/// A file `f` written page by page until the chip answers ENOSPC, then a crash: the media,
/// and how many pages were acknowledged.
/// (the chip and the tier's regions, pages acknowledged, the file's inode number).
fn crashed_full_chip() -> ((RamNand, RamRegion, RamRegion), u64, u64) {
    let (nand, log, heap) = base(40, 4 << 20);
    let (mut fs, _, _) = mount(nand, opts(), log, heap).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut acked = 0u64;
    let refused = loop {
        match fs.write(f, acked * 4096, &page(acked)) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 10_000, "a 40-block chip took 40 MB");
    };
    assert!(matches!(refused, FsError::NoSpace), "{refused}");
    assert!(acked > 50, "{acked} pages before the chip was full");
    let (nand, regions) = crash::<RamNand, RamRegion, RamRegion>(fs);
    let (log, heap) = regions.unwrap();
    ((nand, log, heap), acked, f.0)
}

#[test]
fn a_full_chip_answers_enospc_and_every_acknowledged_write_survives_a_crash() {
    let ((nand, log, heap), acked, _) = crashed_full_chip();
    let (mut fs, _, report) = mount(nand, opts(), log, heap).unwrap();
    assert!(!report.lost_anything(), "{report:?}");
    assert!(report.still_in_tier, "{report:?}");
    // The chip is too full for the recovery's checkpoint: the tier keeps the state, so a
    // second crash right after the mount loses nothing either.
    for round in 0..2 {
        let f = fs.lookup(ROOT, b"f").unwrap();
        assert_eq!(f.size, acked * 4096, "round {round}: the refused write left no trace");
        for i in 0..acked {
            assert_eq!(
                fs.read(f.ino, i * 4096, 4096).unwrap(),
                page(i),
                "round {round}: page {i} of {acked}"
            );
        }
        let (nand, regions) = crash::<RamNand, RamRegion, RamRegion>(fs);
        let (log, heap) = regions.unwrap();
        fs = mount(nand, opts(), log, heap).unwrap().0;
    }
}

/// A recovery that cannot write to flash leaves the state in the tier: the tier must then
/// hold what the recovery kept. Here the tier also names a page past the file's end (what a
/// crash between a write's page and its new size leaves): recovery drops it, the file grows
/// (a truncate up, which needs no space), and after a second crash the grown part must
/// read as zeros, not as the page the tier would otherwise still name.
#[test]
fn a_recovery_the_chip_is_too_full_for_leaves_the_tier_holding_what_it_kept() {
    let ((nand, log, heap), acked, f) = crashed_full_chip();
    let (mut tier, _) = DirtyTier::open(log, heap).unwrap();
    let past = acked + 3;
    let stray = page(999);
    let crc = bitmend_code::crc::crc32c(&stray);
    tier.put_page((f, past), &stray, crc, 0..4096).unwrap();
    let (log, heap) = tier.into_regions();
    let (mut fs, _, report) = mount(nand, opts(), log, heap).unwrap();
    assert!(report.still_in_tier, "{report:?}");
    assert_eq!(report.applied.pages_dropped, vec![(f, past)], "{report:?}");
    let grown = (past + 1) * 4096;
    fs.setattr(Ino(f), bitmend_flashfs::SetAttr { size: Some(grown), ..Default::default() }).unwrap();
    let (nand, regions) = crash::<RamNand, RamRegion, RamRegion>(fs);
    let (log, heap) = regions.unwrap();
    let (mut fs, _, _) = mount(nand, opts(), log, heap).unwrap();
    let got = fs.getattr(Ino(f)).unwrap();
    assert_eq!(got.size, grown);
    for i in 0..acked {
        assert!(fs.read(Ino(f), i * 4096, 4096).unwrap() == page(i), "page {i}");
    }
    let grown_part = fs.read(Ino(f), acked * 4096, 4 * 4096).unwrap();
    assert!(grown_part.iter().all(|&b| b == 0), "the grown part holds the page recovery dropped");
}

#[test]
fn damaged_slots_are_named_and_the_file_keeps_what_flash_holds() {
    let (nand, log, heap) = base(64, 4 << 20);
    let (mut fs, _, _) = mount(nand, opts(), log, heap).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    for i in 0..8u64 {
        fs.write(f, i * 4096, &page(i)).unwrap();
    }
    fs.sync().unwrap();
    // Overwritten without a sync: the new pages are in the tier only.
    for i in 0..8u64 {
        fs.write(f, i * 4096, &page(100 + i)).unwrap();
    }
    let (nand, regions) = crash::<RamNand, RamRegion, RamRegion>(fs);
    let (log, mut heap) = regions.unwrap();
    // Wild writes into the slots of pages 2 and 5 (one byte each).
    let mut hit = 0;
    for i in [2u64, 5] {
        let new = page(100 + i);
        let at = heap.bytes().windows(64).position(|w| w == &new[..64]).expect("the page's slot");
        heap.corrupt(at + 999, &[heap.bytes()[at + 999] ^ 0x10]).unwrap();
        hit += 1;
    }
    let (mut fs, _, report) = mount(nand, opts(), log, heap).unwrap();
    let ino = fs.lookup(ROOT, b"f").unwrap().ino.0;
    assert_eq!(report.unverified, vec![(ino, 2), (ino, 5)], "{hit} slots hit, both named");
    assert!(report.lost_anything());
    for i in 0..8u64 {
        let want = if i == 2 || i == 5 { page(i) } else { page(100 + i) };
        assert_eq!(fs.read(Ino(ino), i * 4096, 4096).unwrap(), want, "page {i}");
    }
}

#[test]
fn a_record_that_does_not_decode_is_refused_and_another_file_systems_tier_too() {
    let (nand, _, _) = base(64, 1 << 20);
    // Bytes that are no fragment: refused, nothing applied, the tree as flash holds it.
    let garbage = DirtyRecovery {
        owner: None,
        records: vec![vec![0xEE; 40]],
        pages: Vec::new(),
        held_open: Vec::new(),
    };
    let (mut fs, _, report) = Fs::open_recovering(nand, opts(), garbage).unwrap();
    assert_eq!((report.nodes_refused, report.nodes_applied), (1, 0));
    assert_eq!(fs.readdir(ROOT).unwrap(), vec![]);
    let id = fs.store().fs_id();
    let nand = fs.into_nand();
    // State of another file system: the mount refuses it rather than apply it.
    let foreign =
        DirtyRecovery { owner: Some(id ^ 1), records: Vec::new(), pages: Vec::new(), held_open: Vec::new() };
    match Fs::open_recovering(nand, opts(), foreign) {
        Err(e @ FsError::ForeignTier { .. }) => assert!(e.to_string().contains("not of this one"), "{e}"),
        other => panic!("a foreign tier was not refused: {:?}", other.map(|r| r.2)),
    }
}

/// Wild writes into the dirty state store under a mounted file system: four files written
/// (v1) and synced, then overwritten (v2) into the tier only, and a crash. Garbage over up to
/// m chunks of a segment holding records: the log's code repairs them and the tree is v2.
/// Over m + 1 data chunks holding records: the lost chunks are named, and every page of
/// every file reads v1 or v2, never anything else.
#[test]
fn wild_writes_into_the_log_are_repaired_up_to_m_chunks_and_named_beyond() {
    let mut rng = Rng::new(5);
    let (files, pages) = (4u64, 25u64);
    let v1 = |f: u64, p: u64| page(1000 * f + p);
    let v2 = |f: u64, p: u64| page(50_000 + 1000 * f + p);
    let (mut repaired, mut beyond) = (0, 0);
    for round in 0..12u64 {
        let (nand, log, heap) = base(64, 2 << 20);
        let (mut fs, _, _) = mount(nand, opts(), log, heap).unwrap();
        let inos: Vec<Ino> = (0..files)
            .map(|f| fs.create(ROOT, format!("f{f}").as_bytes(), 0o644, 0, 0).unwrap().ino)
            .collect();
        for (f, &ino) in inos.iter().enumerate() {
            for p in 0..pages {
                fs.write(ino, p * 4096, &v1(f as u64, p)).unwrap();
            }
        }
        fs.sync().unwrap();
        for p in 0..pages {
            for (f, &ino) in inos.iter().enumerate() {
                fs.write(ino, p * 4096, &v2(f as u64, p)).unwrap();
            }
        }
        let (nand, regions) = crash::<RamNand, RamRegion, RamRegion>(fs);
        let (log, heap) = regions.unwrap();
        // Where the records lie: the chunks from the log's head to its tail.
        let (tier, _) = DirtyTier::open(log, heap).unwrap();
        let (cfg, head, tail) = (tier.log().config(), tier.log().head().0, tier.log().tail().0);
        let seg_data = (cfg.k * cfg.chunk_size) as u64;
        let live: Vec<(u64, usize)> = (head / cfg.chunk_size as u64..tail.div_ceil(cfg.chunk_size as u64))
            .map(|c| {
                (
                    c * cfg.chunk_size as u64 / seg_data,
                    (c * cfg.chunk_size as u64 % seg_data) as usize / cfg.chunk_size,
                )
            })
            .collect();
        let seg = live[0].0;
        let within = round % 2 == 0;
        let chunks: Vec<usize> = if within {
            (0..cfg.k + cfg.m).collect()
        } else {
            live.iter().filter(|c| c.0 == seg).map(|c| c.1).collect()
        };
        let hit = if within { 1 + rng.below(cfg.m as u64) as usize } else { cfg.m + 1 };
        let (log, heap) = common::hit_log_chunks(tier, seg, chunks, hit, &mut rng);
        let (mut fs, _, report) = mount(nand, opts(), log, heap).unwrap();
        let mut old = 0;
        for (f, &ino) in inos.iter().enumerate() {
            assert_eq!(fs.getattr(ino).unwrap().size, pages * 4096, "round {round}");
            for p in 0..pages {
                let got = fs.read(ino, p * 4096, 4096).unwrap();
                let (a, b) = (v1(f as u64, p), v2(f as u64, p));
                assert!(got == a || got == b, "round {round}: page {p} of f{f} is neither v1 nor v2");
                old += u64::from(got == a);
            }
        }
        if within {
            assert_eq!(old, 0, "round {round}: {hit} chunks hit, within m: every v2 page back");
            assert!(!report.lost_anything(), "round {round}: {report:?}");
            repaired += 1;
        } else {
            assert!(
                !report.lost_chunks.is_empty(),
                "round {round}: {hit} chunks of records hit, none named lost"
            );
            assert!(old > 0, "round {round}: the lost records' pages came back");
            beyond += 1;
        }
    }
    eprintln!(
        "{repaired} rounds with up to m chunks hit, every page back; {beyond} rounds with m + 1 hit, \
         the lost chunks named and every page v1 or v2"
    );
}
