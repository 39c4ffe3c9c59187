//! The NVRAM tier: pages put survive a reopen, checkouts empty it, a damaged slot is named and
//! never applied, and power cuts at random stores of either region lose no acknowledged page
//! (each recovered page is the acknowledged one, or the one being put when the power went).
//! Writes of many pages go into run objects: they are in every workload below.

use std::collections::BTreeMap;

use bitmend_code::crc::crc32c;
use bitmend_media::pmem::{CrashGranularity, CrashPoint, CrashRegion, RamRegion, Region};
use bitmend_media::rng::Rng;
use bitmend_tier::{DirtyTier, PagePut, Recovered, PAGE};

mod common;

const LOG: usize = 256 << 10;
const HEAP: usize = 4 << 20;

type Model = BTreeMap<(u64, u64), Vec<u8>>;

fn recovered_map(r: &Recovered) -> Model {
    r.pages.iter().map(|p| ((p.ino, p.index), p.bytes.clone())).collect()
}

/// A step that failed: the model had it completed, and whether it was a write of several
/// pages (a crash part way leaves each of its pages old or new, not all of one or the other).
#[derive(Debug)]
struct InFlight {
    after: Model,
    several: bool,
}

/// One step of the workload, applied to the tier: the model as it is once the step returned,
/// or, if the step failed, the step in flight.
fn step<L: Region, H: Region>(
    tier: &mut DirtyTier<L, H>,
    model: &mut Model,
    rng: &mut Rng,
) -> Result<(), InFlight> {
    let key = (1 + rng.below(3), rng.below(6));
    let mut after = model.clone();
    let mut several = false;
    let done = match rng.below(12) {
        0 => {
            after.retain(|&(i, p), _| i != key.0 || p < key.1);
            tier.drop_pages(key.0, key.1)
        }
        1 => {
            after.clear();
            tier.checkout()
        }
        // A write of 2 to 70 pages from `key` on: run objects of 63, 15, 7, 3 and 1 pages,
        // cut where a page already held takes a small change in place instead.
        2 | 3 => {
            several = true;
            let n = 2 + rng.below(69);
            let mut pages = Vec::new();
            for index in key.1..key.1 + n {
                let k = (key.0, index);
                let mut page = model.get(&k).cloned().unwrap_or_else(|| vec![0; PAGE]);
                let small = model.contains_key(&k) && rng.below(4) == 0;
                let (at, len) =
                    if small { (rng.below(4000) as usize, 1 + rng.below(64) as usize) } else { (0, PAGE) };
                rng.fill(&mut page[at..at + len]);
                after.insert(k, page.clone());
                pages.push((k, page, if small { at..at + len } else { 0..PAGE }));
            }
            let puts: Vec<PagePut<'_>> = pages
                .iter()
                .map(|(k, page, changed)| PagePut {
                    key: *k,
                    page,
                    crc: crc32c(page),
                    changed: changed.clone(),
                })
                .collect();
            tier.put_pages(&puts)
        }
        roll => {
            let mut page = model.get(&key).cloned().unwrap_or_else(|| vec![0; PAGE]);
            // Small changes (in place) and large ones (a new slot).
            let (at, len) =
                if roll < 8 { (rng.below(4000) as usize, 1 + rng.below(96) as usize) } else { (0, PAGE) };
            let len = len.min(PAGE - at);
            rng.fill(&mut page[at..at + len]);
            let changed = if model.contains_key(&key) { at..at + len } else { 0..PAGE };
            let crc = crc32c(&page);
            after.insert(key, page.clone());
            tier.put_page(key, &page, crc, changed)
        }
    };
    match done {
        Ok(()) => {
            *model = after;
            Ok(())
        }
        Err(_) => Err(InFlight { after, several }),
    }
}

/// Whether `got` is what a crash may leave: the acknowledged pages, or the step in flight
/// done; for a write of several pages, each page old or new.
fn may_leave(got: &Model, acked: &Model, in_flight: Option<&InFlight>) -> bool {
    if got == acked {
        return true;
    }
    let Some(f) = in_flight else { return false };
    if !f.several {
        return *got == f.after;
    }
    let keys: std::collections::BTreeSet<_> = acked.keys().chain(f.after.keys()).chain(got.keys()).collect();
    keys.into_iter().all(|k| got.get(k) == acked.get(k) || got.get(k) == f.after.get(k))
}

#[test]
fn pages_survive_a_reopen_and_a_checkout_empties_the_tier() {
    let mut tier = DirtyTier::create(RamRegion::new(LOG), RamRegion::new(HEAP)).unwrap();
    let mut model = Model::new();
    let mut rng = Rng::new(1);
    for _ in 0..400 {
        step(&mut tier, &mut model, &mut rng).unwrap();
    }
    let stats = tier.stats();
    assert!(stats.in_place > 20 && stats.new_slots > 50 && stats.checkouts > 10, "{stats:?}");
    assert!(stats.runs * 3 < stats.new_slots, "several pages a run object: {stats:?}");
    let (log, heap) = tier.into_regions();
    let (mut tier, found) = DirtyTier::open(log, heap).unwrap();
    assert!(found.unverified.is_empty(), "{:?}", found.unverified);
    assert_eq!(recovered_map(&found), model, "every page put, as put");
    for p in &found.pages {
        assert_eq!(crc32c(&p.bytes), p.crc);
    }
    tier.checkout().unwrap();
    let (log, heap) = tier.into_regions();
    let (_, found) = DirtyTier::open(log, heap).unwrap();
    assert_eq!(found.pages, vec![], "checked out: nothing left to recover");
}

#[test]
fn a_damaged_slot_is_named_and_never_applied() {
    let mut tier = DirtyTier::create(RamRegion::new(LOG), RamRegion::new(HEAP)).unwrap();
    let mut pages = Vec::new();
    let mut rng = Rng::new(3);
    for i in 0..8u64 {
        let mut page = vec![0u8; PAGE];
        rng.fill(&mut page);
        tier.put_page((5, i), &page, crc32c(&page), 0..PAGE).unwrap();
        pages.push(page);
    }
    let (log, mut heap) = tier.into_regions();
    // A wild write into the heap region: find page 3's bytes and flip one.
    let at = heap.bytes().windows(64).position(|w| w == &pages[3][..64]).expect("page 3 is in the heap");
    heap.corrupt(at + 10, &[heap.bytes()[at + 10] ^ 0x40]).unwrap();
    let (_, found) = DirtyTier::open(log, heap).unwrap();
    assert_eq!(found.unverified, vec![(5, 3)]);
    let got = recovered_map(&found);
    assert_eq!(got.len(), 7);
    for (i, p) in pages.iter().enumerate().filter(|&(i, _)| i != 3) {
        assert_eq!(got[&(5, i as u64)], *p, "page {i}");
    }
}

/// A run object holds many pages: damage to one is named for that page alone, and the object
/// is freed once no page is left in it (overwritten, dropped or checked out).
#[test]
fn a_damaged_page_in_a_run_is_named_alone_and_a_run_is_freed_with_its_last_page() {
    let mut tier = DirtyTier::create(RamRegion::new(LOG), RamRegion::new(HEAP)).unwrap();
    let mut rng = Rng::new(4);
    let pages: Vec<Vec<u8>> = (0..22)
        .map(|_| {
            let mut p = vec![0u8; PAGE];
            rng.fill(&mut p);
            p
        })
        .collect();
    let put = |tier: &mut DirtyTier<RamRegion, RamRegion>, first: u64, pages: &[Vec<u8>]| {
        let puts: Vec<PagePut<'_>> = pages
            .iter()
            .enumerate()
            .map(|(i, p)| PagePut { key: (8, first + i as u64), page: p, crc: crc32c(p), changed: 0..PAGE })
            .collect();
        tier.put_pages(&puts).unwrap();
    };
    // 22 pages: runs of 15 and 7.
    put(&mut tier, 0, &pages);
    assert_eq!((tier.pages(), tier.objects(), tier.stats().runs), (22, 2, 2));
    // The 7-page run overwritten whole, one page at a time: freed with the last of them.
    for (i, p) in pages.iter().enumerate().skip(15) {
        assert_eq!(tier.objects(), 2 + (i - 15), "before page {i}");
        put(&mut tier, i as u64, std::slice::from_ref(p));
    }
    assert_eq!(tier.objects(), 1 + 7, "the 7-page run freed, seven 1-page runs");
    // Pages 10 to 14 of the 15-page run dropped: the run stays for pages 0 to 9.
    tier.drop_range(8, 10..15).unwrap();
    assert_eq!((tier.pages(), tier.objects()), (17, 8));
    let (log, mut heap) = tier.into_regions();
    let at = heap.bytes().windows(64).position(|w| w == &pages[4][..64]).expect("page 4 is in the heap");
    heap.corrupt(at + 3000, &[heap.bytes()[at + 3000] ^ 0x01]).unwrap();
    let (tier, found) = DirtyTier::open(log, heap).unwrap();
    assert_eq!(found.unverified, vec![(8, 4)], "only the damaged page");
    let got = recovered_map(&found);
    let want: Model = (0..22u64)
        .filter(|&i| i != 4 && !(10..15).contains(&i))
        .map(|i| ((8, i), pages[i as usize].clone()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(tier.objects(), 8, "the reopened tier counts the run's live pages");
}

/// Formatted regions: the tier made, nothing put.
fn formatted(g: CrashGranularity) -> (CrashRegion, CrashRegion) {
    let (mut log, mut heap) =
        (CrashRegion::new(LOG).with_crash_model(g, 0.5), CrashRegion::new(HEAP).with_crash_model(g, 0.5));
    DirtyTier::create(&mut log, &mut heap).expect("create");
    (log, heap)
}

/// Opens the tier on copies of `base` and runs `steps` steps, the power cut at store `cut`
/// (counted from the open) of region `which` (0 the log, 1 the heap); both regions then lose
/// what was not persisted. Returns the model as acknowledged, the model had the step in
/// flight completed, and the regions after the crash.
fn run_to_cut(
    base: &(CrashRegion, CrashRegion),
    steps: usize,
    cut: Option<(usize, u64)>,
    seed: u64,
) -> (Model, Option<InFlight>, CrashRegion, CrashRegion) {
    let (mut log, mut heap) = (base.0.clone(), base.1.clone());
    if let Some((which, n)) = cut {
        let r = if which == 0 { &mut log } else { &mut heap };
        r.arm_crash(CrashPoint::Store(r.stores() + n));
    }
    let mut model = Model::new();
    let mut in_flight = None;
    if let Ok((mut tier, _)) = DirtyTier::open(&mut log, &mut heap) {
        let mut rng = Rng::new(seed);
        for _ in 0..steps {
            if let Err(after) = step(&mut tier, &mut model, &mut rng) {
                in_flight = Some(after);
                break;
            }
        }
    }
    let mut crash = Rng::new(seed ^ 0x5EED);
    log.crash(crash.next_u64());
    heap.crash(crash.next_u64());
    (model, in_flight, log, heap)
}

#[test]
fn power_cuts_at_random_stores_lose_no_acknowledged_page() {
    let cuts: usize = std::env::var("TIER_CRASHES").map_or(120, |v| v.parse().expect("a count"));
    let steps = 60;
    let mut rng = Rng::new(7);
    let mut verified_pages = 0;
    let mut cut_in_several = 0;
    for g in [CrashGranularity::Line, CrashGranularity::Word] {
        let base = formatted(g);
        // The stores each region takes with no cut (the open's and the steps'), to choose
        // cuts among.
        let stores = {
            let (mut log, mut heap) = (base.0.clone(), base.1.clone());
            let (l0, h0) = (log.stores(), heap.stores());
            let (mut tier, _) = DirtyTier::open(&mut log, &mut heap).unwrap();
            let (mut model, mut r) = (Model::new(), Rng::new(100));
            for _ in 0..steps {
                step(&mut tier, &mut model, &mut r).unwrap();
            }
            drop(tier);
            [log.stores() - l0, heap.stores() - h0]
        };
        for _ in 0..cuts {
            let which = rng.below(2) as usize;
            let (acked, in_flight, log, heap) =
                run_to_cut(&base, steps, Some((which, rng.below(stores[which]))), 100);
            let (_, found) =
                DirtyTier::open(log, heap).unwrap_or_else(|e| panic!("{g:?}: recovery failed: {e}"));
            assert!(found.unverified.is_empty(), "{g:?}: unverified {:?}", found.unverified);
            let got = recovered_map(&found);
            assert!(
                may_leave(&got, &acked, in_flight.as_ref()),
                "{g:?}: cut in region {which}: recovered {} pages from {} records, acknowledged {}, in flight {:?}",
                got.len(),
                found.records,
                acked.len(),
                in_flight.as_ref().map(|f| (f.after.len(), f.several))
            );
            cut_in_several += usize::from(in_flight.as_ref().is_some_and(|f| f.several));
            verified_pages += got.len();
        }
    }
    eprintln!(
        "{} power cuts ({cut_in_several} in a write of several pages), {verified_pages} pages recovered and checked byte for byte",
        2 * cuts
    );
    assert!(cut_in_several * 10 >= cuts, "cuts inside writes of several pages: {cut_in_several}");
}

/// Wild writes into the dirty state store: garbage over whole chunks of its first segment.
/// Up to m = 2 chunks, the log's code repairs them and every page comes back. Beyond that the
/// lost chunks are named, every page returned is right, and the pages whose fate the lost
/// records decided are named, never applied.
#[test]
fn wild_writes_into_the_store_are_repaired_up_to_m_chunks_and_named_beyond() {
    let mut rng = Rng::new(9);
    let (mut repaired, mut beyond) = (0, 0);
    for round in 0..40u64 {
        let mut tier = DirtyTier::create(RamRegion::new(LOG), RamRegion::new(HEAP)).unwrap();
        let mut model = Model::new();
        // 300 new pages: 300 records, over several chunks of segment 0; a few dropped.
        for i in 0..300u64 {
            let mut page = vec![0u8; PAGE];
            rng.fill(&mut page);
            tier.put_page((1 + i % 3, i), &page, crc32c(&page), 0..PAGE).unwrap();
            model.insert((1 + i % 3, i), page);
        }
        tier.drop_pages(2, 250).unwrap();
        model.retain(|&(i, p), _| i != 2 || p < 250);
        let cfg = tier.log().config();
        // Within m: any chunks of the segment. Beyond: m + 1 of the first four data chunks,
        // which hold records (the rest of the segment is parity and chunks not yet written).
        let within = round % 2 == 0;
        let (hit, chunks): (usize, Vec<usize>) = if within {
            (1 + rng.below(cfg.m as u64) as usize, (0..cfg.k + cfg.m).collect())
        } else {
            (cfg.m + 1, (0..4).collect())
        };
        let (log, heap) = common::hit_log_chunks(tier, 0, chunks, hit, &mut rng);
        let (_, found) = DirtyTier::open(log, heap).unwrap();
        let got = recovered_map(&found);
        for (k, bytes) in &got {
            assert_eq!(model.get(k), Some(bytes), "round {round}: page {k:?} came back wrong");
        }
        if within {
            assert_eq!(got, model, "round {round}: {hit} chunks hit, within m");
            assert!(found.lost_chunks.is_empty() && found.unverified.is_empty());
            repaired += 1;
        } else {
            assert!(
                !found.lost_chunks.is_empty(),
                "round {round}: {hit} chunks of records hit, none named lost"
            );
            assert!(
                got.len() + found.unverified.len() < model.len(),
                "round {round}: the lost records' pages are not returned"
            );
            beyond += 1;
        }
    }
    eprintln!("{repaired} rounds within m, every page back; {beyond} rounds beyond m, lost chunks named, nothing wrong returned");
}

/// A dirty page's slot is a block of the heap's page class (4,160 bytes), not of the 8 KiB
/// class a page and its trailer would otherwise need: a 4 MiB heap holds 882 pages (14 runs
/// of 63; the journal and the pool header take the rest), where 8 KiB slots held 434.
#[test]
fn a_heap_holds_a_page_per_4160_bytes() {
    let mut tier = DirtyTier::create(RamRegion::new(LOG), RamRegion::new(HEAP)).unwrap();
    let mut rng = Rng::new(3);
    let mut page = vec![0u8; PAGE];
    let mut held = 0u64;
    let full = loop {
        rng.fill(&mut page);
        match tier.put_page((1, held), &page, crc32c(&page), 0..PAGE) {
            Ok(()) => held += 1,
            Err(e) => break e,
        }
        assert!(held < 10_000);
    };
    assert!(matches!(full, bitmend_tier::TierError::Full | bitmend_tier::TierError::Heap(_)), "{full}");
    let footprint = held * 4160;
    assert!(
        footprint * 10 >= HEAP as u64 * 8,
        "{held} pages in a heap of {HEAP} bytes: {footprint} bytes of slots"
    );
    let (log, heap) = tier.into_regions();
    let (_, found) = DirtyTier::open(log, heap).unwrap();
    assert_eq!(found.pages.len() as u64, held, "every page held is named and verifies");
}

/// `n` pages of random bytes.
fn random_pages(rng: &mut Rng, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            let mut p = vec![0u8; PAGE];
            rng.fill(&mut p);
            p
        })
        .collect()
}

/// `pages` put as one write, as pages `first` on of file `ino`.
fn put_write(
    tier: &mut DirtyTier<RamRegion, RamRegion>,
    (ino, first): (u64, u64),
    pages: &[Vec<u8>],
) -> Result<(), bitmend_tier::TierError> {
    let puts: Vec<PagePut<'_>> = pages
        .iter()
        .enumerate()
        .map(|(i, p)| PagePut { key: (ino, first + i as u64), page: p, crc: crc32c(p), changed: 0..PAGE })
        .collect();
    tier.put_pages(&puts)
}

/// Writes of 40 pages (runs of 15, 15, 7 and 3) until the heap is full: the write that finds
/// no room fails as full (the file system then writes to flash instead), and every page of
/// every write that returned comes back after a reopen, byte for byte.
#[test]
fn a_full_heap_refuses_a_write_of_many_pages_and_keeps_every_one_that_returned() {
    let mut tier = DirtyTier::create(RamRegion::new(LOG), RamRegion::new(HEAP)).unwrap();
    let mut rng = Rng::new(12);
    let mut model = Model::new();
    let mut writes = 0u64;
    let (full, refused) = loop {
        let pages = random_pages(&mut rng, 40);
        let first = writes * 40;
        match put_write(&mut tier, (2, first), &pages) {
            Ok(()) => {
                for (i, p) in pages.into_iter().enumerate() {
                    model.insert((2, first + i as u64), p);
                }
                writes += 1;
            }
            Err(e) => {
                let refused: Model =
                    pages.into_iter().enumerate().map(|(i, p)| ((2, first + i as u64), p)).collect();
                break (e, refused);
            }
        }
        assert!(writes < 1000, "a 4 MiB heap never filled");
    };
    assert!(full.is_full(), "the write that found no room: {full}");
    assert!(writes >= 15, "{writes} writes of 40 pages before the 4 MiB heap was full");
    let (log, heap) = tier.into_regions();
    let (_, found) = DirtyTier::open(log, heap).unwrap();
    assert!(found.unverified.is_empty(), "{:?}", found.unverified);
    let got = recovered_map(&found);
    for (k, p) in &model {
        assert_eq!(got.get(k), Some(p), "page {k:?} of a write that returned");
    }
    // Pages of the refused write may be there too (its first runs were named before the
    // heap ran out), each the page it was given; nothing else.
    for (k, p) in &got {
        assert!(model.get(k) == Some(p) || refused.get(k) == Some(p), "page {k:?}");
    }
}

/// A checkout leaves the objects its pages were in to the puts that follow, which free a few
/// each (not a transaction per 32 objects in the file system's checkpoint); objects nothing
/// names when a tier is opened are found and freed the same way; and a heap a put found
/// full frees them all at the next checkout, as the file system's write-back expects.
#[test]
fn a_checkout_leaves_its_objects_to_later_puts_and_an_open_finds_those_nothing_names() {
    let mut tier = DirtyTier::create(RamRegion::new(LOG), RamRegion::new(HEAP)).unwrap();
    let mut rng = Rng::new(21);
    let page = |rng: &mut Rng| random_pages(rng, 1).remove(0);
    let put =
        |tier: &mut DirtyTier<RamRegion, RamRegion>, key, p: &[u8]| tier.put_page(key, p, crc32c(p), 0..PAGE);
    for i in 0..30u64 {
        put(&mut tier, (1 + i % 3, i), &page(&mut rng)).unwrap();
    }
    assert_eq!((tier.objects(), tier.garbage()), (30, 0));
    tier.checkout().unwrap();
    assert_eq!((tier.pages(), tier.objects(), tier.garbage()), (0, 0, 30), "a checkout frees nothing itself");
    let mut model = Model::new();
    for i in 0..5u64 {
        let p = page(&mut rng);
        put(&mut tier, (7, i), &p).unwrap();
        model.insert((7, i), p);
    }
    assert_eq!((tier.objects(), tier.garbage()), (5, 10), "each put freed four");
    // A crash now: the ten objects nothing names are found at the open.
    let (log, heap) = tier.into_regions();
    let (mut tier, found) = DirtyTier::open(log, heap).unwrap();
    assert_eq!(recovered_map(&found), model);
    assert_eq!((tier.objects(), tier.garbage()), (5, 10));
    for i in 5..8u64 {
        put(&mut tier, (7, i), &page(&mut rng)).unwrap();
    }
    assert_eq!((tier.objects(), tier.garbage()), (8, 0));

    // Full (writes of 63 pages, so that the heap fills before the log): the refused put
    // marks the heap starved, and the next checkout frees at once.
    let mut held = 8u64;
    let full = loop {
        match put_write(&mut tier, (9, held), &random_pages(&mut rng, 63)) {
            Ok(()) => held += 63,
            Err(e) => break e,
        }
        assert!(held < 10_000, "a 4 MiB heap never filled");
    };
    assert!(matches!(full, bitmend_tier::TierError::Heap(_)), "the heap, not the log, is full: {full}");
    tier.checkout().unwrap();
    assert_eq!(tier.garbage(), 0, "the checkout after a full heap freed everything");
    // Once NVMalloc's reuse delay (200 ms) has passed, the room is there again.
    std::thread::sleep(std::time::Duration::from_millis(250));
    let writes = (held - 8) / 63;
    for w in 0..writes {
        put_write(&mut tier, (10, w * 63), &random_pages(&mut rng, 63))
            .unwrap_or_else(|e| panic!("write {w} of {writes} after the checkout: {e}"));
    }
    let (log, heap) = tier.into_regions();
    let (_, found) = DirtyTier::open(log, heap).unwrap();
    assert_eq!(found.pages.len() as u64, writes * 63, "every page put after the checkout");
}
