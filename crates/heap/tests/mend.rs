//! Damage made while a pool is down after a crash (a wild write, worn cells) is rebuilt
//! from the stripes before recovery: recovery's recompute of parity and signatures would
//! otherwise take it in, and a damaged committed write would be rolled back as torn. Damage
//! that cannot be rebuilt reads as damaged, never as its bytes.

use std::time::Duration;

use bitmend_heap::{HeapError, Pool, PoolOptions, Ptr, ReadCheck, ScrubPass, StripeShape};
use bitmend_media::pmem::{RamRegion, Region};
use bitmend_media::rng::Rng;

fn opts(k: u8, m: u8) -> PoolOptions {
    PoolOptions { reuse_after: Duration::ZERO, stripes: Some(StripeShape { k, m }), ..PoolOptions::default() }
}

/// A pool that crashed (dropped without a close) right after its last transaction, which
/// overwrote `written` bytes of `last` at `at`: every transaction is still in its journal.
struct Crashed {
    region: RamRegion,
    objects: Vec<(Ptr, Vec<u8>)>,
    last: Ptr,
    at: u64,
    written: usize,
}

fn crashed(seed: u64, m: u8) -> Crashed {
    let mut region = RamRegion::new(6 << 20);
    let mut rng = Rng::new(seed);
    let mut objects = Vec::new();
    let mut pool = Pool::create(&mut region, opts(8, m)).unwrap();
    for i in 0..120u32 {
        let len = 1500 + rng.below(3000) as usize;
        let bytes: Vec<u8> = (0..len).map(|b| (b as u32 * 7 + i * 13) as u8).collect();
        let p = pool
            .tx(|tx| {
                let p = tx.alloc(len as u64)?;
                tx.write(p, 0, &bytes)?;
                Ok(p)
            })
            .unwrap();
        objects.push((p, bytes));
    }
    let (at, written) = (1000, 300);
    let last = objects[60].0;
    pool.tx(|tx| tx.write(last, at, &[0xEE; 300])).unwrap();
    objects[60].1[at as usize..at as usize + written].fill(0xEE);
    drop(pool);
    Crashed { region, objects, last, at, written }
}

/// Opens the crashed pool and reads every object, checked page by page: each reads back
/// byte for byte, or (only on a page in `may_fail`) fails with the clear error.
fn reopen_and_read(c: &mut Crashed, may_fail: &[u64]) -> bitmend_heap::OpenReport {
    let (mut pool, report) = Pool::open(&mut c.region, opts(1, 0)).unwrap();
    pool.set_read_check(ReadCheck::Every);
    let geo = pool.geometry().unwrap();
    for (p, want) in &c.objects {
        match pool.object(*p) {
            Ok(got) => assert!(got == &want[..], "object {:#x} read back wrong", p.0),
            Err(HeapError::Damaged { pages, .. }) => {
                assert!(pages.iter().all(|q| may_fail.contains(q)), "{:#x}: pages {pages:?}", p.0)
            }
            Err(e) => panic!("{e}"),
        }
    }
    let scrub = pool.scrub(ScrubPass::Full).unwrap();
    let first = geo.page_of(c.objects[0].0 .0).unwrap();
    assert!(
        scrub.beyond_repair.iter().all(|q| may_fail.contains(q)),
        "{scrub:?} (first object page {first})"
    );
    report
}

#[test]
fn damage_beside_the_last_write_is_rebuilt_not_taken_in_by_the_recompute() {
    for m in [1, 2, 4] {
        let mut c = crashed(m as u64, m);
        // A line of the last write's page outside the write: the recompute signs that page.
        let spot = (c.last.0 + c.at + c.written as u64 + 256) & !63;
        c.region.corrupt(spot as usize, &[0x5A; 64]).unwrap();
        let report = reopen_and_read(&mut c, &[]);
        assert_eq!(report.lines_mended, 1, "m {m}: {report:?}");
        assert!(report.pages_left_damaged.is_empty() && !report.torn_commit, "{report:?}");
    }
}

#[test]
fn damage_in_earlier_transactions_blocks_is_rebuilt_before_their_recompute() {
    let mut c = crashed(9, 2);
    let mut rng = Rng::new(90);
    // Lines of objects the journal still names (their transactions were fenced): 40 wild
    // writes of one line each, into different objects.
    let mut spots = Vec::new();
    for (p, bytes) in c.objects.iter().step_by(3).take(40) {
        let spot = (p.0 + 64 + rng.below(bytes.len() as u64 - 192)) & !63;
        spots.push(spot);
    }
    for &spot in &spots {
        let mut junk = [0u8; 64];
        rng.fill(&mut junk);
        c.region.corrupt(spot as usize, &junk).unwrap();
    }
    let report = reopen_and_read(&mut c, &[]);
    assert_eq!(report.lines_mended, spots.len() as u64, "{report:?}");
    eprintln!("mend: {} wild lines in fenced transactions' blocks, all rebuilt at open", spots.len());
}

#[test]
fn damage_to_the_last_commits_own_bytes_does_not_roll_it_back() {
    let mut c = crashed(5, 2);
    // Inside the committed write: its commit record's CRC no longer matches, and recovery
    // would take it for a write the crash tore.
    let spot = (c.last.0 + c.at + 64) & !63;
    c.region.corrupt(spot as usize, &[0x11; 64]).unwrap();
    let report = reopen_and_read(&mut c, &[]);
    assert!(!report.torn_commit, "the acknowledged write was rolled back: {report:?}");
    assert_eq!(report.lines_mended, 1, "{report:?}");
}

#[test]
fn damage_where_the_parity_is_suspect_reads_as_damaged_never_as_its_bytes() {
    let mut c = crashed(7, 1);
    // Another page of the last write's stripe, at the write's offset: the parity there is of
    // unknown age (the crash may have torn its patch), so that line cannot be rebuilt.
    let (page, other) = {
        let (pool, _) = Pool::open(RamRegion::from_bytes(c.region.bytes().to_vec()), opts(1, 0)).unwrap();
        let geo = pool.geometry().unwrap();
        let p = geo.page_of(c.last.0 + c.at).unwrap();
        let (stripe, index) = geo.locate(p);
        let other = (0..8).filter(|&i| i != index).find_map(|i| geo.member(stripe, i)).unwrap();
        (p, (other, geo.page_at(other) + (c.last.0 + c.at - geo.page_at(p))))
    };
    c.region.corrupt((other.1 & !63) as usize, &[0x77; 64]).unwrap();
    let report = reopen_and_read(&mut c, &[other.0]);
    assert_eq!(report.pages_left_damaged, vec![other.0], "page {page}'s stripe: {report:?}");
}
