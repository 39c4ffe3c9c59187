//! The page store: pages read back; damage within a group's or a segment's parity is
//! repaired; beyond it reads fail, never lie; power cuts at every NAND operation lose nothing
//! synced.

use bitmend_flashfs::Corruption;
use bitmend_flashfs::{FsConfig, FsError, PageAddr, PageStore, Repaired};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::nand::{FaultyNand, Geometry, Nand, NandError, RamNand, Timing};
use bitmend_media::rng::Rng;

/// A small chip: 512 B pages, 16 pages per block, 40 blocks; segments of 4 blocks.
fn chip() -> RamNand {
    RamNand::new(Geometry::new(512, 48, 16, 40).unwrap()).unwrap().with_timing(Timing::NONE)
}

fn cfg(p: u32, s: u32) -> FsConfig {
    FsConfig { parity_pages: p, parity_blocks: s, blocks_per_segment: 4 }
}

fn page(seed: u64, i: u64) -> Vec<u8> {
    let mut v = vec![0u8; 512];
    Rng::new(seed * 1_000_003 + i).fill(&mut v);
    v
}

/// Appends `n` pages (syncing every `sync_every`), returns their addresses.
fn fill<N: Nand>(store: &mut PageStore<N>, seed: u64, n: u64, sync_every: u64) -> Vec<PageAddr> {
    (0..n)
        .map(|i| {
            let a = store.append(&page(seed, i)).unwrap();
            if (i + 1) % sync_every == 0 {
                store.sync().unwrap();
            }
            a
        })
        .collect()
}

fn read_all<N: Nand>(store: &mut PageStore<N>, seed: u64, addrs: &[PageAddr]) {
    let mut buf = vec![0u8; 512];
    for (i, a) in addrs.iter().enumerate() {
        store.read(*a, &mut buf).unwrap_or_else(|e| panic!("page {i} at {a:?}: {e}"));
        assert_eq!(buf, page(seed, i as u64), "page {i} at {a:?}");
    }
}

#[test]
fn pages_read_back_across_groups_blocks_and_segments() {
    for (p, s, sync_every) in [(1, 1, 1000), (2, 1, 7), (1, 2, 3), (3, 0, 5)] {
        let mut store = PageStore::format(chip(), cfg(p, s)).unwrap();
        let addrs = fill(&mut store, 1, 120, sync_every);
        read_all(&mut store, 1, &addrs);
        let st = store.stats();
        assert_eq!(st.data_pages, 120);
        assert_eq!((st.repaired_by_group, st.repaired_by_segment), (0, 0));
        if s > 0 {
            assert!(st.segment_parity_pages > 0, "segments were sealed");
        }
    }
}

#[test]
fn remount_after_a_clean_stop_continues_the_log() {
    let mut store = PageStore::format(chip(), cfg(1, 1)).unwrap();
    let mut addrs = fill(&mut store, 2, 70, 9);
    store.sync().unwrap();
    let (mut store, m) = PageStore::open(store.into_nand()).unwrap();
    assert!(m.live_segment.is_some());
    assert_eq!(m.torn_pages, 0);
    read_all(&mut store, 2, &addrs);
    for i in 70..130 {
        addrs.push(store.append(&page(2, i)).unwrap());
    }
    store.sync().unwrap();
    read_all(&mut store, 2, &addrs);
    let mut uniq = addrs.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), addrs.len(), "no page was handed out twice");
}

#[test]
fn bit_flips_of_any_count_are_repaired_from_the_group() {
    let mut flipped_pages = 0;
    for bits in [1, 10, 100, 1000, 4000] {
        let mut store = PageStore::format(FaultyNand::new(chip(), bits as u64), cfg(1, 1)).unwrap();
        let addrs = fill(&mut store, 3, 40, 5);
        // One damaged page per group (groups hold 5 pages here): a read repairs but does not
        // rewrite, so damage in one group would otherwise accumulate.
        for (k, a) in addrs.iter().enumerate().step_by(5) {
            store.nand_mut().flip_bits(a.0, bits).unwrap();
            flipped_pages += 1;
            let mut buf = vec![0u8; 512];
            let how = store.read(*a, &mut buf).unwrap();
            assert_eq!(how, Repaired::ByGroup, "{bits} bits in page {k}");
            assert_eq!(buf, page(3, k as u64));
        }
    }
    eprintln!("bit flips: {flipped_pages} pages with 1..4000 flipped bits, all repaired from block parity");
}

#[test]
fn lost_pages_and_damaged_spares_are_rebuilt() {
    let mut store = PageStore::format(FaultyNand::new(chip(), 9), cfg(2, 1)).unwrap();
    let addrs = fill(&mut store, 4, 40, 6);
    let mut buf = vec![0u8; 512];
    // Two pages of one group (p = 2): both lost.
    store.nand_mut().lose_page(addrs[0].0).unwrap();
    store.nand_mut().lose_page(addrs[1].0).unwrap();
    // A page whose spare alone is damaged.
    store.nand_mut().flip_bits_in(addrs[10].0, 3, bitmend_media::nand::Area::Spare).unwrap();
    for k in [0usize, 1, 10] {
        assert_eq!(store.read(addrs[k], &mut buf).unwrap(), Repaired::ByGroup);
        assert_eq!(buf, page(4, k as u64));
    }
}

#[test]
fn too_many_bad_pages_in_a_group_fall_back_to_the_segment() {
    // p = 1: two bad pages in one block's group exceed it; the segment's parity block
    // rebuilds each from its stripe (page i of every block).
    let mut store = PageStore::format(FaultyNand::new(chip(), 5), cfg(1, 1)).unwrap();
    let addrs = fill(&mut store, 5, 60, 1000);
    assert!(store.stats().segment_parity_pages > 0, "the first segment is sealed");
    let mut buf = vec![0u8; 512];
    store.nand_mut().lose_page(addrs[2].0).unwrap();
    store.nand_mut().flip_bits(addrs[3].0, 50).unwrap();
    assert_eq!(store.read(addrs[2], &mut buf).unwrap(), Repaired::BySegment);
    assert_eq!(buf, page(5, 2));
    assert_eq!(store.read(addrs[3], &mut buf).unwrap(), Repaired::BySegment);
    assert_eq!(buf, page(5, 3));
}

#[test]
fn damage_beyond_both_levels_is_an_error_never_wrong_bytes() {
    let mut store = PageStore::format(FaultyNand::new(chip(), 6), cfg(1, 1)).unwrap();
    let addrs = fill(&mut store, 6, 60, 1000);
    let g = store.nand().geometry();
    // Page 2 and 3 of block 0 (beyond its group's p = 1) and page 2 of block 1 (the same
    // stripe as page 2 of block 0, beyond the segment's s = 1).
    let block_of = |a: PageAddr| g.block_of(a.0);
    let b0 = block_of(addrs[2]);
    let same_stripe_next_block = g.first_page(b0 + 1) + g.index_in_block(addrs[2].0);
    for pg in [addrs[2].0, addrs[3].0, same_stripe_next_block] {
        store.nand_mut().lose_page(pg).unwrap();
    }
    let mut buf = vec![0u8; 512];
    assert!(matches!(
        store.read(addrs[2], &mut buf),
        Err(FsError::Corrupt(Corruption::Unrecoverable { .. }))
    ));
    // The rest reads back: page 3 from its stripe, every other page as written.
    let mut unrecoverable = 0;
    for (k, a) in addrs.iter().enumerate() {
        match store.read(*a, &mut buf) {
            Ok(_) => assert_eq!(buf, page(6, k as u64), "page {k} read back WRONG"),
            Err(FsError::Corrupt(Corruption::Unrecoverable { .. })) => unrecoverable += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!((1..=2).contains(&unrecoverable), "{unrecoverable}");
}

/// A program cut before it reached the spare: bits of the data area moved, the spare still
/// reads erased. Mount must take the page as torn, not as the end of what was written (the
/// chip would refuse to program it again, and pages written after it would be lost to the
/// next mount's scan).
#[test]
fn a_page_torn_before_its_spare_is_skipped_not_reused() {
    let mut store = PageStore::format(chip(), cfg(1, 1)).unwrap();
    let mut addrs = fill(&mut store, 3, 21, 7);
    let mut nand = store.into_nand();
    let mut next = addrs.last().unwrap().0 + 1;
    let mut spare = vec![0u8; 48];
    loop {
        nand.read_spare(next, &mut spare).unwrap();
        if spare.iter().all(|&b| b == 0xFF) {
            break;
        }
        next += 1;
    }
    let mut torn = vec![0xFFu8; 512];
    torn[100..140].fill(0x5A);
    nand.program(next, &torn, &[0xFF; 48]).unwrap();
    let (mut store, m) = PageStore::open(nand).unwrap();
    assert_eq!(m.torn_pages, 1, "{m:?}");
    read_all(&mut store, 3, &addrs);
    for i in 21..60 {
        let a = store.append(&page(3, i)).unwrap();
        assert!(a.0 > next, "page {i} went to {a:?}, at or before the torn page {next}");
        addrs.push(a);
    }
    store.sync().unwrap();
    // The pages after the torn one are found again (the scan of the segment reads past it).
    let (mut store, _) = PageStore::open(store.into_nand()).unwrap();
    read_all(&mut store, 3, &addrs);
    let log = store.log_pages(0, None).unwrap();
    assert!(log.contains(&PageAddr(next + 1)), "the log's pages stop at the torn one: {log:?}");
}

/// A workload of appends with syncs; returns the addresses of pages covered by a sync that
/// returned (the durable ones) and of every page appended.
fn workload<N: Nand>(store: &mut PageStore<N>, n: u64) -> Result<(), (FsError, usize)> {
    let mut synced = 0;
    for i in 0..n {
        store.append(&page(7, i)).map_err(|e| (e, synced))?;
        if i % 5 == 4 {
            store.sync().map_err(|e| (e, synced))?;
            synced = i as usize + 1;
        }
    }
    Ok(())
}

#[test]
fn power_cut_at_every_nand_operation_loses_nothing_synced() {
    let n = 90;
    let base = PageStore::format(chip(), cfg(1, 1)).unwrap().into_nand();
    let mut probe = PageStore::open(FaultyNand::new(base.clone(), 0)).unwrap().0;
    let mut addrs = Vec::new();
    // NAND operations when each sync returned.
    let mut marks = Vec::new();
    for i in 0..n {
        addrs.push(probe.append(&page(7, i)).unwrap());
        if i % 5 == 4 {
            probe.sync().unwrap();
            marks.push(probe.nand().ops());
        }
    }
    let mut torn = 0;
    let work = |nand: &mut FaultyNand<RamNand>| match PageStore::open(nand) {
        Ok((mut store, _)) => match workload(&mut store, n) {
            Ok(()) => true,
            Err((e, _)) => {
                assert!(matches!(e, FsError::Nand(NandError::PowerLost)), "{e}");
                false
            }
        },
        Err(e) => panic!("the mount before the workload was cut: {e}"),
    };
    let c = campaign::run(&FaultyNand::new(base.clone(), 0), Schedule::Every, work, |nand, cut| {
        let synced = 5 * marks.iter().filter(|&&m| m <= cut).count();
        let (mut store, m) = PageStore::open(nand).unwrap_or_else(|e| panic!("cut {cut}: mount: {e}"));
        torn += m.torn_pages;
        // Every synced page is where the probe run put it, byte for byte (the store is
        // deterministic: the same appends land on the same pages).
        let mut buf = vec![0u8; 512];
        for (k, a) in addrs.iter().take(synced).enumerate() {
            store.read(*a, &mut buf).unwrap_or_else(|e| panic!("cut {cut}: synced page {k}: {e}"));
            assert_eq!(buf, page(7, k as u64), "cut {cut}: synced page {k}");
        }
        // And the store goes on: more pages, synced, read back.
        let more: Vec<PageAddr> = (0..20).map(|i| store.append(&page(8, i)).unwrap()).collect();
        store.sync().unwrap();
        for (i, a) in more.iter().enumerate() {
            store.read(*a, &mut buf).unwrap();
            assert_eq!(buf, page(8, i as u64), "cut {cut}: page appended after remount");
        }
    });
    let cuts = c.cuts;
    eprintln!("power cuts: {cuts} cut points (every program and erase of the workload), {torn} torn pages found at mount; 0 synced pages lost");
    assert!(cuts > 100);
}
