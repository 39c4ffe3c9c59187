//! The golden tier, checked in and read by this build: `tier-v1-log.bin` (the dirty state
//! store) and `tier-v1-heap.bin` (the slots), written by the ignored test below with the
//! records of FORMAT.md section 10: pages in new slots, a change in place, a larger change
//! into a new slot, a drop, and a checkout with pages before and after it. A change to any
//! persistent byte of the tier breaks this test, and FORMAT.md section 10 must say why.

use bitmend_code::crc::crc32c;
use bitmend_media::pmem::{RamRegion, Region};
use bitmend_tier::{DirtyTier, PagePut, PAGE};

const LOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tier-v1-log.bin");
const HEAP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tier-v1-heap.bin");

fn page(fill: u8) -> Vec<u8> {
    (0..PAGE).map(|i| fill ^ (i % 251) as u8).collect()
}

/// The pages the golden tier holds, as (ino, index) and bytes.
fn expected() -> Vec<((u64, u64), Vec<u8>)> {
    let mut a = page(0xA0);
    a[100..110].copy_from_slice(b"in place!!");
    vec![((1, 0), a), ((1, 1), page(0xB0)), ((2, 0), page(0xC1)), ((4, 7), page(0xE0))]
}

#[test]
#[ignore = "writes the golden tier; run once per format version"]
fn write_golden_tier() {
    let mut tier = DirtyTier::create(RamRegion::new(128 << 10), RamRegion::new(1 << 20)).unwrap();
    let put = |tier: &mut DirtyTier<RamRegion, RamRegion>, key, p: &[u8], changed| {
        tier.put_page(key, p, crc32c(p), changed).unwrap();
    };
    // Before the checkout: gone after it.
    put(&mut tier, (9, 9), &page(0x99), 0..PAGE);
    tier.checkout().unwrap();
    put(&mut tier, (1, 0), &page(0xA0), 0..PAGE);
    put(&mut tier, (1, 1), &page(0xB0), 0..PAGE);
    put(&mut tier, (2, 0), &page(0xC0), 0..PAGE);
    put(&mut tier, (3, 5), &page(0xD0), 0..PAGE);
    let want = expected();
    put(&mut tier, (1, 0), &want[0].1, 100..110);
    put(&mut tier, (2, 0), &page(0xC1), 0..PAGE);
    tier.drop_pages(3, 0).unwrap();
    put(&mut tier, (4, 7), &page(0xE0), 0..PAGE);
    let (log, heap) = tier.into_regions();
    std::fs::write(LOG, log.bytes()).unwrap();
    std::fs::write(HEAP, heap.bytes()).unwrap();
}

#[test]
fn the_golden_tier_reads_back_and_a_flipped_slot_is_named() {
    let (log, heap) = (std::fs::read(LOG).unwrap(), std::fs::read(HEAP).unwrap());
    let (_, found) =
        DirtyTier::open(RamRegion::from_bytes(log.clone()), RamRegion::from_bytes(heap.clone())).unwrap();
    let got: Vec<((u64, u64), Vec<u8>)> =
        found.pages.iter().map(|p| ((p.ino, p.index), p.bytes.clone())).collect();
    assert_eq!(got, expected());
    assert_eq!((found.unverified.len(), found.lost_chunks.len(), found.foreign_records), (0, 0, 0));
    // Records after the checkout's trim: six page records (five new slots and one page moved
    // to a new slot) and a drop; the change in place appends none.
    assert_eq!(found.records, 7);
    // A bit flipped in page (1, 1)'s slot: named, never applied; the rest still come back.
    let mut heap = heap;
    let at = heap.windows(64).position(|w| w == &page(0xB0)[..64]).expect("the slot of page (1, 1)");
    heap[at + 2000] ^= 0x08;
    let (_, found) = DirtyTier::open(RamRegion::from_bytes(log), RamRegion::from_bytes(heap)).unwrap();
    assert_eq!(found.unverified, vec![(1, 1)]);
    assert_eq!(found.pages.len(), 3);
}

const LOG2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tier-v2-log.bin");
const HEAP2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tier-v2-heap.bin");
/// The owner the version 2 golden tier is bound to, and the nodes records it holds (the tier
/// does not read them: any bytes do).
const OWNER: u64 = 0x00C0_FFEE_0000_0002;
const NODES: [&[u8]; 2] = [b"an operation's nodes", b"a second operation"];

#[test]
#[ignore = "writes the golden tier; run once per format version"]
fn write_golden_tier_v2() {
    let mut tier = DirtyTier::create_for(RamRegion::new(128 << 10), RamRegion::new(1 << 20), OWNER).unwrap();
    for (i, fill) in [0x10u8, 0x11, 0x12, 0x13].into_iter().enumerate() {
        let p = page(fill);
        tier.put_page((6, i as u64), &p, crc32c(&p), 0..PAGE).unwrap();
    }
    tier.put_nodes(NODES[0]).unwrap();
    // Pages 1 and 2 punched out; 0 and 3 stay.
    tier.drop_range(6, 1..3).unwrap();
    tier.put_nodes(NODES[1]).unwrap();
    let (log, heap) = tier.into_regions();
    std::fs::write(LOG2, log.bytes()).unwrap();
    std::fs::write(HEAP2, heap.bytes()).unwrap();
}

#[test]
fn the_golden_tier_v2_reads_back_with_its_owner_nodes_and_hole() {
    let (log, heap) = (std::fs::read(LOG2).unwrap(), std::fs::read(HEAP2).unwrap());
    let (tier, found) = DirtyTier::open(RamRegion::from_bytes(log), RamRegion::from_bytes(heap)).unwrap();
    assert_eq!(found.owner, Some(OWNER));
    assert_eq!(tier.owner(), OWNER);
    assert_eq!(found.nodes, NODES.iter().map(|n| n.to_vec()).collect::<Vec<_>>());
    let got: Vec<((u64, u64), Vec<u8>)> =
        found.pages.iter().map(|p| ((p.ino, p.index), p.bytes.clone())).collect();
    assert_eq!(got, vec![((6, 0), page(0x10)), ((6, 3), page(0x13))]);
    assert_eq!((found.unverified.len(), found.lost_chunks.len(), found.foreign_records), (0, 0, 0));
    // The owner, four page records, two nodes records and the drop range.
    assert_eq!(found.records, 8);
}

const LOG3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tier-v3-log.bin");
const HEAP3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tier-v3-heap.bin");

/// The pages of the version 3 golden tier (a 128 KiB log, a 2 MiB heap: each size of run
/// object takes a heap run of 256 KiB of its own): 20 pages of inode 6 written at once (run objects
/// of 15, 3, 1 and 1 pages), page 2 then changed in place, pages 5 to 8 punched out, and page
/// 16 written again alone (a run of its own, leaving its first run for pages 15 and 17).
fn expected_v3() -> Vec<((u64, u64), Vec<u8>)> {
    (0..20u64)
        .filter(|i| !(5..9).contains(i))
        .map(|i| {
            let mut p = page(0x30 + i as u8);
            if i == 2 {
                p[4000..4010].copy_from_slice(b"run change");
            }
            if i == 16 {
                p = page(0x66);
            }
            ((6, i), p)
        })
        .collect()
}

#[test]
#[ignore = "writes the golden tier; run once per format version"]
fn write_golden_tier_v3() {
    let mut tier = DirtyTier::create_for(RamRegion::new(128 << 10), RamRegion::new(2 << 20), OWNER).unwrap();
    let first: Vec<Vec<u8>> = (0..20u64).map(|i| page(0x30 + i as u8)).collect();
    let puts: Vec<PagePut<'_>> = first
        .iter()
        .enumerate()
        .map(|(i, p)| PagePut { key: (6, i as u64), page: p, crc: crc32c(p), changed: 0..PAGE })
        .collect();
    tier.put_pages(&puts).unwrap();
    let want = expected_v3();
    tier.put_page((6, 2), &want[2].1, crc32c(&want[2].1), 4000..4010).unwrap();
    tier.drop_range(6, 5..9).unwrap();
    tier.put_page((6, 16), &page(0x66), crc32c(&page(0x66)), 0..PAGE).unwrap();
    assert_eq!(tier.stats().runs, 5);
    let (log, heap) = tier.into_regions();
    std::fs::write(LOG3, log.bytes()).unwrap();
    std::fs::write(HEAP3, heap.bytes()).unwrap();
}

#[test]
fn the_golden_tier_v3_reads_back_its_runs() {
    let (log, heap) = (std::fs::read(LOG3).unwrap(), std::fs::read(HEAP3).unwrap());
    let (tier, found) =
        DirtyTier::open(RamRegion::from_bytes(log.clone()), RamRegion::from_bytes(heap.clone())).unwrap();
    assert_eq!(found.owner, Some(OWNER));
    let got: Vec<((u64, u64), Vec<u8>)> =
        found.pages.iter().map(|p| ((p.ino, p.index), p.bytes.clone())).collect();
    assert_eq!(got, expected_v3());
    assert_eq!((found.unverified.len(), found.lost_chunks.len(), found.foreign_records), (0, 0, 0));
    // The owner, four run records, the drop range and page 16's run; the change in place
    // appends none.
    assert_eq!(found.records, 7);
    // The 15-page run (pages 0 to 4 and 9 to 14 left), the 3-page run (15 and 17 left), the
    // runs of pages 18 and 19, and page 16's own.
    assert_eq!(tier.objects(), 5);
    // A bit flipped in page 11 (inside the 15-page run): that page alone is named.
    let mut heap = heap;
    let at = heap.windows(64).position(|w| w == &page(0x30 + 11)[..64]).expect("page 11's slot");
    heap[at + 100] ^= 0x02;
    let (_, found) = DirtyTier::open(RamRegion::from_bytes(log), RamRegion::from_bytes(heap)).unwrap();
    assert_eq!(found.unverified, vec![(6, 11)]);
    assert_eq!(found.pages.len(), expected_v3().len() - 1);
}

const LOG4: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tier-v4-log.bin");
const HEAP4: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tier-v4-heap.bin");

/// The version 4 golden tier: a request nodes record, a checkout, the requests record a
/// file system writes after it (naming the request just checked out and an earlier one),
/// then a second request's nodes and a plain nodes record. The heap holds no page.
#[test]
#[ignore = "writes the golden tier; run once per format version"]
fn write_golden_tier_v4() {
    let mut tier = DirtyTier::create_for(RamRegion::new(128 << 10), RamRegion::new(512_000), OWNER).unwrap();
    tier.put_request_nodes(0x10, b"checked out").unwrap();
    tier.checkout().unwrap();
    tier.put_requests(&[0x0C, 0x10]).unwrap();
    tier.put_request_nodes(0x12, NODES[0]).unwrap();
    tier.put_nodes(NODES[1]).unwrap();
    let (log, heap) = tier.into_regions();
    std::fs::write(LOG4, log.bytes()).unwrap();
    std::fs::write(HEAP4, heap.bytes()).unwrap();
}

#[test]
fn the_golden_tier_v4_reads_back_the_requests_it_holds_done() {
    let (log, heap) = (std::fs::read(LOG4).unwrap(), std::fs::read(HEAP4).unwrap());
    let (_, found) = DirtyTier::open(RamRegion::from_bytes(log), RamRegion::from_bytes(heap)).unwrap();
    assert_eq!(found.owner, Some(OWNER));
    // The checkout forgot request 0x10's nodes, not the news that it was done.
    assert_eq!(found.nodes, NODES.iter().map(|n| n.to_vec()).collect::<Vec<_>>());
    assert_eq!(found.requests, vec![0x0C, 0x10, 0x12]);
    assert_eq!((found.unverified.len(), found.lost_chunks.len(), found.foreign_records), (0, 0, 0));
    // After the trim: the owner, the requests record and the two nodes records.
    assert_eq!(found.records, 4);
}
