//! A heap that heals: signatures and parity follow every store, wild writes into up to m
//! pages of a stripe are rebuilt byte for byte, more are reported by page and never read
//! back wrong, and a crash at any store leaves data, parity and signatures consistent.

mod common;

use std::time::Duration;

use bitmend_heap::{HeapError, Pool, PoolOptions, Ptr, ScrubPass, StripeShape};
use bitmend_media::pmem::{CrashGranularity, CrashRegion, RamRegion, Region};
use bitmend_media::rng::Rng;

fn opts(k: u8, m: u8) -> PoolOptions {
    PoolOptions { reuse_after: Duration::ZERO, stripes: Some(StripeShape { k, m }), ..PoolOptions::default() }
}

/// Transactions of every kind, and allocations into and frees from slots: the stores the
/// protection must follow. Returns the root.
fn busy<R: Region>(pool: &mut Pool<R>, rng: &mut Rng, txs: usize) -> Result<Ptr, HeapError> {
    let root = pool.tx(|tx| {
        let r = tx.alloc(64 * 8)?;
        tx.write(r, 0, &[0; 64 * 8])?;
        let slot = tx.root_slot();
        tx.set(slot, r)?;
        Ok(r)
    })?;
    for i in 0..txs {
        let s = rng.below(64);
        let slot = pool.slot(root, s * 8)?;
        let len = 1 + rng.below(6000);
        let fill = i as u8;
        match rng.below(4) {
            0 if pool.get(slot) == Ptr::NULL => {
                pool.alloc_into(slot, len)?;
            }
            1 => pool.free_from(slot)?,
            _ => pool.tx(|tx| {
                let cur = tx.get(slot);
                if cur == Ptr::NULL {
                    let p = tx.alloc(len)?;
                    tx.write(p, 0, &vec![fill; len as usize])?;
                    tx.set(slot, p)
                } else {
                    let have = tx.object(cur)?.len();
                    let n = if rng.below(2) == 0 { have / 8 + 1 } else { have };
                    tx.write_through(slot, 0, &vec![fill; n]).map(|_| ())
                }
            })?,
        }
    }
    Ok(root)
}

#[test]
fn parity_and_signatures_follow_every_store_and_survive_reopening() {
    for (k, m) in [(4, 0), (8, 1), (4, 2), (3, 4)] {
        let mut pool = Pool::create(RamRegion::new(6 << 20), opts(k, m)).unwrap();
        assert!(pool.heals() && pool.version() == 8);
        busy(&mut pool, &mut Rng::new(k as u64 * 10 + m as u64), 300).unwrap();
        let full = pool.scrub(ScrubPass::Full).unwrap();
        assert_eq!(
            (full.bad_pages, full.sigs_rewritten, full.checks_rewritten),
            (0, 0, 0),
            "k={k} m={m}: {full:?}"
        );
        assert_eq!(full.stripes_checked, pool.geometry().unwrap().stripes);
        assert_eq!(pool.scrub(ScrubPass::Cheap).unwrap().cheap_mismatches, 0);
        let (mut again, _) = Pool::open(pool.into_region(), opts(1, 0)).unwrap();
        assert_eq!(again.geometry().unwrap().shape, StripeShape { k, m }, "the pool keeps its shape");
        let full = again.scrub(ScrubPass::Full).unwrap();
        assert_eq!(full.bad_pages, 0, "k={k} m={m} after reopening: {full:?}");
    }
}

/// Damages `pages` (offsets of whole pages) with random bytes at random places, each from
/// one byte to the whole page; returns how many bytes changed.
fn damage<R: Region>(pool: &mut Pool<R>, pages: &[u64], rng: &mut Rng) -> usize {
    let mut changed = 0;
    for &at in pages {
        let len = 1 + rng.below(4096) as usize;
        let off = rng.below(4096 - len as u64 + 1);
        let old = pool.region().bytes()[(at + off) as usize..(at + off) as usize + len].to_vec();
        let bad: Vec<u8> = old.iter().map(|b| b ^ (1 + rng.below(255) as u8)).collect();
        pool.region_mut().corrupt((at + off) as usize, &bad).unwrap();
        changed += len;
    }
    changed
}

#[test]
fn wild_writes_into_up_to_m_pages_of_a_stripe_are_rebuilt_byte_for_byte() {
    let mut rng = Rng::new(7);
    let (mut faults, mut pages_hit, mut bytes_hit) = (0, 0, 0);
    for (k, m) in [(8, 1), (4, 2), (6, 4)] {
        let mut pool = Pool::create(RamRegion::new(6 << 20), opts(k, m)).unwrap();
        busy(&mut pool, &mut rng, 200).unwrap();
        let geo = pool.geometry().unwrap();
        let image = pool.region().bytes().to_vec();
        for _ in 0..40 {
            let stripe = rng.below(geo.stripes);
            // Up to m of the stripe's data and parity pages, any mix.
            let mut members: Vec<u64> =
                (0..k as usize).filter_map(|i| geo.member(stripe, i)).map(|p| geo.page_at(p)).collect();
            members.extend((0..m as usize).map(|j| geo.parity_page(stripe, j)));
            let n = 1 + rng.below(m as u64) as usize;
            let mut hit = Vec::new();
            while hit.len() < n {
                let at = members[rng.below(members.len() as u64) as usize];
                if !hit.contains(&at) {
                    hit.push(at);
                }
            }
            bytes_hit += damage(&mut pool, &hit, &mut rng);
            faults += 1;
            pages_hit += hit.len();
            let report = if rng.below(2) == 0 {
                pool.scrub(ScrubPass::Full).unwrap()
            } else {
                // A read of one damaged data page finds it; otherwise the scrub does.
                match hit.iter().find(|&&at| at < geo.parity_at) {
                    Some(&at) => {
                        pool.verify(at, 1).unwrap();
                        pool.scrub(ScrubPass::Full).unwrap()
                    }
                    None => pool.scrub(ScrubPass::Full).unwrap(),
                }
            };
            assert!(report.beyond_repair.is_empty(), "k={k} m={m}: {report:?}");
            assert!(pool.region().bytes() == &image[..], "k={k} m={m}: every byte back after {hit:?}");
        }
        assert_eq!(pool.scrub(ScrubPass::Full).unwrap().bad_pages, 0);
    }
    eprintln!("heal: {faults} wild writes into {pages_hit} pages ({bytes_hit} bytes), 1..m per stripe, m = 1, 2, 4: all rebuilt, every byte read back");
    assert_eq!(faults, 120);
}

/// The live objects under the root's slots: (slot index, object, its bytes).
fn objects<R: Region>(pool: &Pool<R>, root: Ptr) -> Vec<(u64, Ptr, Vec<u8>)> {
    (0..64)
        .filter_map(|s| {
            let p = pool.get(pool.slot(root, s * 8).unwrap());
            (p != Ptr::NULL).then(|| (s, p, pool.object(p).unwrap().to_vec()))
        })
        .collect()
}

#[test]
fn a_wild_write_that_a_store_then_overwrites_is_caught_first_and_never_comes_back() {
    let mut rng = Rng::new(23);
    let (mut faults, mut bytes_hit, mut healed) = (0, 0, 0);
    for (k, m) in [(8, 1), (4, 2), (6, 4)] {
        let mut pool = Pool::create(RamRegion::new(6 << 20), opts(k, m)).unwrap();
        let root = busy(&mut pool, &mut rng, 150).unwrap();
        let mut live = objects(&pool, root);
        for _ in 0..40 {
            let pick = rng.below(live.len() as u64) as usize;
            let (_, p, want) = &mut live[pick];
            // Damage inside the object, then a transaction writes over a range that covers
            // it: the patch must not start from the damaged bytes.
            let len = 1 + rng.below(want.len().min(300) as u64) as usize;
            let off = rng.below((want.len() - len) as u64 + 1) as usize;
            let at = p.0 as usize + off;
            let bad: Vec<u8> = want[off..off + len].iter().map(|b| b ^ (1 + rng.below(255) as u8)).collect();
            pool.region_mut().corrupt(at, &bad).unwrap();
            let (from, to) = (
                off.saturating_sub(rng.below(40) as usize),
                (off + len + rng.below(40) as usize).min(want.len()),
            );
            let new: Vec<u8> = (from..to).map(|_| rng.below(256) as u8).collect();
            let before = pool.heal_stats().pages_repaired;
            pool.tx(|tx| tx.write(*p, from as u64, &new)).unwrap();
            want[from..to].copy_from_slice(&new);
            healed += (pool.heal_stats().pages_repaired - before) as usize;
            faults += 1;
            bytes_hit += len;
            let report = pool.scrub(ScrubPass::Full).unwrap();
            assert_eq!((report.bad_pages, report.beyond_repair.len()), (0, 0), "k={k} m={m}: {report:?}");
        }
        for (s, p, want) in &live {
            assert_eq!(pool.object(*p).unwrap(), &want[..], "k={k} m={m}: slot {s}");
        }
        let (again, _) = Pool::open(pool.into_region(), opts(1, 0)).unwrap();
        for (s, p, want) in &live {
            assert_eq!(again.object(*p).unwrap(), &want[..], "k={k} m={m}: slot {s} after reopening");
        }
    }
    eprintln!("heal: {faults} wild writes ({bytes_hit} bytes) each overwritten by a transaction before any read or scrub (m = 1, 2, 4): {healed} pages rebuilt before the store, every byte of every object as committed, before and after reopening");
    assert_eq!((faults, healed), (120, 120));
}

#[test]
fn more_bad_pages_than_parity_are_named_and_never_read_back() {
    for (k, m) in [(4, 0), (8, 1), (4, 2)] {
        let mut rng = Rng::new(11);
        let mut pool = Pool::create(RamRegion::new(6 << 20), opts(k, m)).unwrap();
        busy(&mut pool, &mut rng, 100).unwrap();
        let geo = pool.geometry().unwrap();
        // The root object's page and m more of its stripe.
        let root = pool.root();
        let p = geo.page_of(root.0).unwrap();
        let (stripe, index) = geo.locate(p);
        let others: Vec<u64> = (0..k as usize)
            .filter(|&i| i != index)
            .filter_map(|i| geo.member(stripe, i))
            .take(m as usize)
            .collect();
        let mut bad = vec![p];
        bad.extend(&others);
        let offsets: Vec<u64> = bad.iter().map(|&q| geo.page_at(q)).collect();
        damage(&mut pool, &offsets, &mut rng);
        let report = pool.scrub(ScrubPass::Full).unwrap();
        // Damage that left a page's signature unchanged is impossible to miss here: every
        // damaged page changed (damage() flips every byte it touches).
        let mut named = report.beyond_repair.clone();
        named.sort_unstable();
        bad.sort_unstable();
        assert_eq!(named, bad, "k={k} m={m}: {report:?}");
        match pool.verify(root.0, 8) {
            Err(HeapError::Damaged { pages, .. }) => assert_eq!(pages, vec![p]),
            other => panic!("k={k} m={m}: a read of a damaged page gave {other:?}"),
        }
        // A page of another stripe still reads.
        let elsewhere = geo.member((stripe + 1) % geo.stripes, 0).unwrap();
        pool.verify(geo.page_at(elsewhere), 4096).unwrap();
    }
}

#[test]
fn a_crash_at_random_stores_leaves_data_parity_and_signatures_consistent() {
    let mut rng = Rng::new(99);
    let cuts = common::crash_count("HEAL_CRASHES", 24);
    let (mut crashes, mut during_recovery, mut checked) = (0, 0, 0);
    for (g, m) in [(CrashGranularity::Line, 1), (CrashGranularity::Word, 2), (CrashGranularity::Line, 4)] {
        let base = Pool::create(CrashRegion::new(4 << 20).with_crash_model(g, 0.5), opts(4, m))
            .unwrap()
            .into_region();
        let work = |r: &mut CrashRegion, _: &mut ()| {
            let Ok((mut pool, _)) = Pool::open(&mut *r, opts(1, 0)) else { return false };
            let mut rng = Rng::new(5);
            busy(&mut pool, &mut rng, 40).is_ok()
        };
        let (c, d) = common::at_random_stores(
            &base,
            &mut rng,
            cuts,
            || opts(1, 0),
            work,
            |r, _| {
                let (mut pool, report) = Pool::open(r, opts(1, 0)).unwrap();
                assert_eq!(
                    (report.lines_mended, &report.pages_left_damaged[..]),
                    (0, &[][..]),
                    "{g:?} m={m}: a torn store taken for damage"
                );
                let full = pool.scrub(ScrubPass::Full).unwrap();
                assert_eq!(
                    (full.bad_pages, full.checks_rewritten),
                    (0, 0),
                    "{g:?} m={m}: after recovery {full:?}"
                );
                checked += 1;
            },
        );
        crashes += c;
        during_recovery += d;
    }
    eprintln!("heal: {crashes} crashes at random stores (m = 1, 2, 4; line and word loss), {during_recovery} more during recovery; {checked} recovered pools scrubbed in full: parity and signatures consistent in all");
}

#[test]
fn a_damaged_signature_table_entry_is_rewritten_and_no_page_changes() {
    let mut rng = Rng::new(13);
    let mut pool = Pool::create(RamRegion::new(6 << 20), opts(4, 1)).unwrap();
    busy(&mut pool, &mut rng, 100).unwrap();
    let geo = pool.geometry().unwrap();
    // The last page, which nothing wrote: recovery recomputes the signatures of pages the
    // journal names, and would rewrite a damaged entry of one of those before any scrub.
    let p = geo.pages - 1;
    let at = geo.sig_at(p) as usize;
    let mut entry = pool.region().bytes()[at..at + 8].to_vec();
    entry[3] ^= 0x40;
    pool.region_mut().corrupt(at, &entry).unwrap();
    // The table is read at open: the damage is in the signatures the pool checks against.
    let (mut pool, _) = Pool::open(pool.into_region(), opts(1, 0)).unwrap();
    let pages = pool.region().bytes()[..geo.sigs_at as usize].to_vec();
    let report = pool.scrub(ScrubPass::Cheap).unwrap();
    assert_eq!(
        (report.cheap_mismatches, report.sigs_rewritten, report.pages_repaired),
        (1, 1, 0),
        "{report:?}"
    );
    assert!(pool.region().bytes()[..geo.sigs_at as usize] == pages[..], "no page was rewritten");
    assert_eq!(pool.scrub(ScrubPass::Full).unwrap().bad_pages, 0);
}

#[test]
fn parity_flushed_line_by_line_is_as_consistent_and_flushes_more() {
    let mut lines = Vec::new();
    for eager in [false, true] {
        let mut pool = Pool::create(RamRegion::new(6 << 20), opts(4, 2)).unwrap();
        pool.set_eager_flush(eager);
        let before = pool.heal_stats();
        busy(&mut pool, &mut Rng::new(3), 200).unwrap();
        let after = pool.heal_stats();
        assert!(after.stores > before.stores && after.fences > before.fences);
        lines.push(after.lines_flushed - before.lines_flushed);
        assert_eq!(pool.scrub(ScrubPass::Full).unwrap().bad_pages, 0, "eager {eager}");
    }
    // Noted once per fence, a line patched twice is flushed once.
    assert!(lines[0] < lines[1], "{lines:?}");
}

#[test]
fn a_region_too_small_for_the_stripes_says_so() {
    let small = RamRegion::new(600 << 10);
    match Pool::create(small, opts(1, 4)) {
        Err(HeapError::RegionTooSmall { needed, .. }) => assert!(needed > 600 << 10),
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(matches!(
        Pool::create(RamRegion::new(4 << 20), opts(4, 5)),
        Err(HeapError::BadShape { k: 4, m: 5 })
    ));
}

#[test]
fn reads_check_their_pages_as_the_strategy_says_and_never_return_damaged_bytes() {
    use bitmend_heap::kv::Kv;
    use bitmend_heap::ReadCheck;
    let mut pool = Pool::create(RamRegion::new(6 << 20), opts(4, 2)).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    let value = |i: u32| format!("value {i} ").repeat(40).into_bytes();
    for i in 0..300u32 {
        kv.put(&mut pool, &i.to_be_bytes(), &value(i)).unwrap();
    }
    let geo = pool.geometry().unwrap();
    let key = 150u32.to_be_bytes();
    // Every copy of key 150's value in the protected pages (the live one, and stale ones in
    // freed blocks), damaged.
    let image = pool.region().bytes().to_vec();
    let (lo, hi) = (geo.base as usize, geo.limit() as usize);
    let copies: Vec<usize> = image[lo..hi]
        .windows(12)
        .enumerate()
        .filter(|(_, w)| w == b"value 150 va")
        .map(|(i, _)| lo + i)
        .collect();
    assert!(!copies.is_empty());
    let mut faults = 0;
    for mode in [ReadCheck::Every, ReadCheck::AfterCheck(Duration::ZERO), ReadCheck::AfterUse(Duration::ZERO)]
    {
        pool.set_read_check(mode);
        for &at in &copies {
            pool.region_mut().corrupt(at, b"WILD").unwrap();
            faults += 1;
        }
        match kv.get(&pool, &key) {
            Err(HeapError::Damaged { pages, .. }) => {
                assert!(copies.iter().any(|&at| geo.page_of(at as u64) == Some(pages[0])))
            }
            other => panic!("{mode:?}: a read of a damaged page gave {other:?}"),
        }
        assert_eq!(kv.get_healing(&mut pool, &key).unwrap(), Some(value(150)), "{mode:?}");
        pool.scrub(ScrubPass::Full).unwrap();
        assert!(pool.region().bytes() == &image[..], "{mode:?}: rebuilt byte for byte");
    }
    // A long interval: a page checked a moment ago is not checked again, so a read costs
    // nothing; a page that waited out the interval is.
    // A get checks the lines its search read (a version 6 pool), not the path's pages.
    pool.set_read_check(ReadCheck::AfterCheck(Duration::from_secs(3600)));
    let checked = |pool: &Pool<RamRegion>| (pool.read_checks(), pool.read_lines_checked());
    let before = checked(&pool);
    for _ in 0..100 {
        kv.get(&pool, &key).unwrap();
    }
    let first = checked(&pool);
    let lines = first.1 - before.1;
    assert_eq!(first.0, before.0, "no page signed");
    assert!(
        (4..=64).contains(&lines),
        "the lines of the path's searches, checked once, not per read: {lines}"
    );
    for _ in 0..100 {
        kv.get(&pool, &key).unwrap();
    }
    assert_eq!(checked(&pool), first, "and not again within the interval");
    // The scrubber alone: reads check nothing.
    pool.set_read_check(ReadCheck::Background);
    kv.get(&pool, &key).unwrap();
    assert_eq!(checked(&pool), first);
    eprintln!("heal: {faults} wild writes under a key, read with ER, LC and LU: refused each time, then rebuilt and read back");
}

/// A put, again after rebuilding what a read check inside it refused.
fn put_healing<R: Region>(pool: &mut Pool<R>, kv: &bitmend_heap::kv::Kv, key: &[u8], value: &[u8]) {
    for _ in 0..8 {
        match kv.put(pool, key, value) {
            Err(HeapError::Damaged { at, len, .. }) => pool.verify(at, len).unwrap(),
            r => return r.unwrap(),
        }
    }
    panic!("a put refused eight times");
}

#[test]
fn bit_flips_during_a_workload_with_the_scrubber_are_corrected_and_nothing_wrong_is_read() {
    use bitmend_heap::kv::Kv;
    use bitmend_heap::ReadCheck;
    use std::collections::BTreeMap;
    let mut rng = Rng::new(31);
    let mut pool = Pool::create(RamRegion::new(8 << 20), opts(8, 2)).unwrap();
    pool.set_read_check(ReadCheck::Every);
    let kv = Kv::create(&mut pool).unwrap();
    let geo = pool.geometry().unwrap();
    // The heap's whole area: data pages, parity, signatures and line checks.
    let (lo, hi) = (geo.base, geo.end());
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let (mut flips, mut gets, mut scrubs, mut repaired) = (0u64, 0u64, 0u64, 0u64);
    let ops = 4000;
    for op in 0..ops {
        // One bit flipped every second operation, anywhere in the area.
        if op % 2 == 0 {
            let at = (lo + rng.below(hi - lo)) as usize;
            let byte = pool.region().bytes()[at] ^ (1 << rng.below(8));
            pool.region_mut().corrupt(at, &[byte]).unwrap();
            flips += 1;
        }
        let key = rng.below(100);
        if rng.below(3) == 0 {
            let got = kv.get_healing(&mut pool, &key.to_be_bytes()).unwrap();
            assert_eq!(got.as_ref(), model.get(&key), "op {op}: key {key}");
            gets += 1;
        } else {
            let value: Vec<u8> = (0..1 + rng.below(600)).map(|_| rng.below(256) as u8).collect();
            put_healing(&mut pool, &kv, &key.to_be_bytes(), &value);
            model.insert(key, value);
        }
        // The scrubber, every 10 operations: 5 flips between passes over the area's 177
        // stripes, so that three in one stripe (beyond m = 2) is unlikely (this seed has none).
        if op % 10 == 9 {
            let r = pool.scrub(ScrubPass::Full).unwrap();
            assert!(r.beyond_repair.is_empty(), "op {op}: {r:?}");
            repaired += r.pages_repaired + r.sigs_rewritten + r.checks_rewritten;
            scrubs += 1;
        }
    }
    let r = pool.scrub(ScrubPass::Full).unwrap();
    assert_eq!(r.bad_pages, 0, "{r:?}");
    for (k, v) in &model {
        assert_eq!(kv.get(&pool, &k.to_be_bytes()).unwrap().as_ref(), Some(v), "key {k}");
    }
    let (mut again, _) = Pool::open(pool.into_region(), opts(1, 0)).unwrap();
    again.set_read_check(ReadCheck::Every);
    for (k, v) in &model {
        assert_eq!(
            kv.get_healing(&mut again, &k.to_be_bytes()).unwrap().as_ref(),
            Some(v),
            "key {k} after reopening"
        );
    }
    eprintln!("heal: {flips} bit flips over the heap's {} KiB (one per 2 operations) during {ops} puts and gets ({gets} gets checked against a model, every read checked), {scrubs} full scrubs: {repaired} pages and table entries rebuilt, none beyond repair, nothing wrong read, before or after reopening", (hi - lo) >> 10);
}

#[test]
fn the_scrubber_thread_rebuilds_flips_while_a_workload_runs() {
    use bitmend_heap::heal::{Scrubber, ScrubberOptions};
    use bitmend_heap::kv::Kv;
    use bitmend_heap::ReadCheck;
    use std::sync::{Arc, Mutex};
    let mut pool = Pool::create(RamRegion::new(6 << 20), opts(8, 2)).unwrap();
    pool.set_read_check(ReadCheck::Every);
    let kv = Kv::create(&mut pool).unwrap();
    for i in 0..200u32 {
        kv.put(&mut pool, &i.to_be_bytes(), &[i as u8; 300]).unwrap();
    }
    let geo = pool.geometry().unwrap();
    let round = geo.pages + geo.stripes * 2;
    let pool = Arc::new(Mutex::new(pool));
    let scrubber = Scrubber::spawn(
        Arc::clone(&pool),
        ScrubberOptions { stripes_per_second: 200_000, pass: ScrubPass::Full },
    );
    let mut rng = Rng::new(41);
    let flips = 20;
    for _ in 0..flips {
        // A flip into a data page, then the workload until the scrubber has been round once.
        let start = {
            let mut p = pool.lock().unwrap();
            let at = (geo.base + rng.below(geo.pages * 4096)) as usize;
            let byte = p.region().bytes()[at] ^ (1 << rng.below(8));
            p.region_mut().corrupt(at, &[byte]).unwrap();
            p.heal_stats().pages_checked
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let mut p = pool.lock().unwrap();
            let i = rng.below(200) as u32;
            assert_eq!(kv.get_healing(&mut p, &i.to_be_bytes()).unwrap(), Some(vec![i as u8; 300]));
            if p.heal_stats().pages_checked >= start + 2 * round {
                break;
            }
            drop(p);
            assert!(std::time::Instant::now() < deadline, "the scrubber makes progress");
            std::thread::yield_now();
        }
    }
    let report = scrubber.stop().unwrap();
    assert!(report.rounds >= flips, "{report:?}");
    assert!(report.total.beyond_repair.is_empty(), "{report:?}");
    let mut p = pool.lock().unwrap();
    let r = p.scrub(ScrubPass::Full).unwrap();
    assert_eq!(r.bad_pages, 0, "every flip rebuilt by the scrubber or a read: {r:?}");
    eprintln!("heal: {flips} bit flips into data pages while gets ran, each followed by a round of the scrubber thread ({} rounds, {} stripes checked, {} pages rebuilt by it): none left", report.rounds, report.total.stripes_checked, report.total.pages_repaired);
}

#[test]
fn damage_made_while_the_pool_was_closed_is_found_not_taken_in() {
    // A block allocated into a slot is linked to it: after a crash, the next open recomputes
    // the signature of its header's page, which would take in damage made while closed.
    let mut pool = Pool::create(RamRegion::new(6 << 20), opts(8, 2)).unwrap();
    let root = busy(&mut pool, &mut Rng::new(47), 150).unwrap();
    let slot = pool.slot(root, 63 * 8).unwrap();
    pool.free_from(slot).unwrap();
    let linked = pool.alloc_into(slot, 300).unwrap();
    pool.tx(|tx| tx.write(linked, 0, &[0x42; 300])).unwrap();
    let live = objects(&pool, root);
    let mut region = pool.close();
    // Into the object's bytes, beside its (intact, linked) header.
    region.corrupt(linked.0 as usize + 100, &[0x3C; 64]).unwrap();
    {
        let (mut pool, report) = Pool::open(&mut region, opts(1, 0)).unwrap();
        assert!(report.was_closed, "{report:?}");
        pool.verify(linked.0, 300).unwrap();
        for (s, p, want) in &live {
            assert_eq!(pool.object(*p).unwrap(), &want[..], "slot {s}");
        }
        assert_eq!(pool.object(linked).unwrap(), &[0x42; 300][..]);
        pool.tx(|tx| tx.write(root, 0, &[7; 8])).unwrap();
        // Dropped, not closed.
    }
    let (_, report) = Pool::open(&mut region, opts(1, 0)).unwrap();
    assert!(!report.was_closed, "a pool dropped without close opens as after a crash");
}

/// Sixty objects of 200 to 3,150 bytes, each allocated and written by a transaction.
fn sixty_objects<R: Region>(pool: &mut Pool<R>) -> Vec<(Ptr, Vec<u8>)> {
    (0..60u8)
        .map(|i| {
            let bytes = vec![i; 200 + 50 * i as usize];
            let p = pool
                .tx(|tx| {
                    let p = tx.alloc(bytes.len() as u64)?;
                    tx.write(p, 0, &bytes)?;
                    Ok(p)
                })
                .unwrap();
            (p, bytes)
        })
        .collect()
}

#[test]
fn a_page_of_block_headers_wiped_is_rebuilt_at_open_and_nothing_is_quarantined() {
    let mut pool = Pool::create(RamRegion::new(6 << 20), opts(8, 2)).unwrap();
    let objects = sixty_objects(&mut pool);
    let geo = pool.geometry().unwrap();
    // The page of the first object's 16-byte header, and every header on it, wiped while the
    // pool is closed, its journal checked out.
    let page = geo.page_at(geo.page_of(objects[0].0 .0 - 16).unwrap());
    pool.checkout().unwrap();
    let mut region = pool.into_region();
    region.corrupt(page as usize, &[0xA5; 4096]).unwrap();
    let (pool, report) = Pool::open(region, opts(1, 0)).unwrap();
    assert_eq!(report.header_pages_rebuilt, 1, "{report:?}");
    assert!(report.bad_headers.is_empty(), "nothing quarantined: {report:?}");
    for (p, want) in &objects {
        assert_eq!(pool.object(*p).unwrap(), &want[..], "object at {:#x}", p.0);
    }
}

#[test]
fn a_page_of_headers_wiped_after_a_crash_is_rebuilt_before_recovery_settles_them() {
    // The same page wiped, but the pool crashed (dropped unclosed): every transaction is in
    // the journal, its records name the blocks on the page, and recovery would otherwise
    // settle their headers from the records and recompute the page's signature over the
    // wiped bytes. The 64 lines are rebuilt from the stripe first.
    let mut region = RamRegion::new(6 << 20);
    let mut pool = Pool::create(&mut region, opts(8, 2)).unwrap();
    let objects = sixty_objects(&mut pool);
    let geo = pool.geometry().unwrap();
    let page = geo.page_at(geo.page_of(objects[0].0 .0 - 16).unwrap());
    drop(pool);
    region.corrupt(page as usize, &[0xA5; 4096]).unwrap();
    let (mut pool, report) = Pool::open(&mut region, opts(1, 0)).unwrap();
    assert_eq!((report.lines_mended, report.committed), (64, 60), "{report:?}");
    assert!(report.bad_headers.is_empty() && report.pages_left_damaged.is_empty(), "{report:?}");
    pool.set_read_check(bitmend_heap::ReadCheck::Every);
    for (p, want) in &objects {
        assert_eq!(pool.object(*p).unwrap(), &want[..], "object at {:#x}", p.0);
    }
    assert_eq!(pool.scrub(ScrubPass::Full).unwrap().bad_pages, 0);
}

#[test]
fn a_full_healing_pool_refuses_honestly_and_keeps_everything_it_acknowledged() {
    use bitmend_heap::kv::Kv;
    let mut pool = Pool::create(RamRegion::new(3 << 20), opts(4, 2)).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    let mut kept = Vec::new();
    let refused = loop {
        let i = kept.len() as u32;
        match kv.put(&mut pool, &i.to_be_bytes(), &vec![i as u8; 3000]) {
            Ok(()) => kept.push(i),
            Err(e) => break e,
        }
    };
    assert!(matches!(refused, HeapError::Full { .. }), "{refused:?}");
    assert!(kept.len() > 100, "{} keys before the pool filled", kept.len());
    let r = pool.scrub(ScrubPass::Full).unwrap();
    assert_eq!((r.bad_pages, r.checks_rewritten), (0, 0), "the refused put left nothing half-patched: {r:?}");
    let (pool, _) = Pool::open(pool.close(), opts(1, 0)).unwrap();
    for &i in &kept {
        assert_eq!(kv.get(&pool, &i.to_be_bytes()).unwrap(), Some(vec![i as u8; 3000]), "key {i}");
    }
}

#[test]
fn a_get_checks_the_lines_its_search_reads_and_never_answers_wrong() {
    use bitmend_heap::kv::Kv;
    use bitmend_heap::ReadCheck;
    let mut pool = Pool::create(RamRegion::new(6 << 20), opts(4, 2)).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    // Keys that share their first 4 bytes: every search compares keys, not just prefixes.
    let key = |i: u32| [&[0u8; 4][..], &i.to_be_bytes()].concat();
    let value = |i: u32| format!("v{i}-").repeat(1 + i as usize % 40).into_bytes();
    for i in 0..300u32 {
        kv.put(&mut pool, &key(i), &value(i)).unwrap();
    }
    pool.set_read_check(ReadCheck::Every);
    let geo = pool.geometry().unwrap();
    let mut rng = Rng::new(31);
    // Where the keys are stored: half the flips land in one (a search compares it).
    let image = pool.region().bytes();
    let (lo, hi) = (geo.base as usize, geo.limit() as usize);
    let keys_at: Vec<usize> = (0..300u32)
        .filter_map(|i| image[lo..hi].windows(8).position(|w| w == key(i)).map(|at| lo + at))
        .collect();
    let (mut wild, mut refused, mut answered) = (0, 0, 0);
    while wild < 300 {
        let (at, bit) = match wild % 2 {
            0 => {
                let k = keys_at[rng.below(keys_at.len() as u64) as usize] + 4 + rng.below(4) as usize;
                ((k & !63) as u64, k % 64)
            }
            _ => ((geo.base + rng.below(geo.limit() - geo.base)) & !63, rng.below(64) as usize),
        };
        let old = pool.region().bytes()[at as usize..at as usize + 64].to_vec();
        if bitmend_code::le::is_zero(&old) {
            continue;
        }
        let mut junk = old.clone();
        junk[bit] ^= 1 << rng.below(8);
        pool.region_mut().corrupt(at as usize, &junk).unwrap();
        wild += 1;
        for i in 0..300u32 {
            // Every other flip under LC with fresh stamps: the first read of a page checks
            // every line it reads there, not only the first part it reads.
            if wild % 4 >= 2 {
                pool.set_read_check(ReadCheck::AfterCheck(Duration::from_secs(3600)));
            }
            match kv.get(&pool, &key(i)) {
                Ok(v) => {
                    assert_eq!(v, Some(value(i)), "line {at:#x} flipped: key {i} answered wrong");
                    answered += 1;
                }
                Err(HeapError::Damaged { .. }) => refused += 1,
                Err(e) => panic!("line {at:#x}: key {i}: {e}"),
            }
        }
        pool.region_mut().corrupt(at as usize, &old).unwrap();
        pool.set_read_check(ReadCheck::Every);
    }
    assert!(refused > 0, "some flips were under a search's lines");
    eprintln!("heal: {wild} single-bit flips, one at a time, each followed by 300 gets checked by ER or by LC with fresh stamps: {refused} refused, {answered} answered right, none wrong");
}

#[test]
fn the_lines_a_read_check_compares_are_noted_and_check_alone_as_the_read_did() {
    use bitmend_heap::kv::Kv;
    use bitmend_heap::ReadCheck;
    let mut pool = Pool::create(RamRegion::new(6 << 20), opts(4, 2)).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    let key = |i: u32| [&b"key-"[..], &i.to_be_bytes()].concat();
    for i in 0..400u32 {
        kv.put(&mut pool, &key(i), &[i as u8; 100]).unwrap();
    }
    let geo = pool.geometry().unwrap();
    // Every place a key's bytes are (its leaf's entry, and stale copies in freed blocks).
    let places = |pool: &Pool<RamRegion>, i: u32| -> Vec<u64> {
        let (lo, hi) = (geo.base as usize, geo.limit() as usize);
        let image = &pool.region().bytes()[lo..hi];
        image.windows(8).enumerate().filter(|(_, w)| *w == key(i)).map(|(at, _)| (lo + at) as u64).collect()
    };
    pool.set_read_check(ReadCheck::Every);
    assert!(pool.take_checked_lines().is_empty(), "nothing is noted until asked");
    pool.note_checked_lines(true);
    for i in (0..400u32).step_by(37) {
        assert_eq!(kv.get(&pool, &key(i)).unwrap(), Some(vec![i as u8; 100]));
        let runs = pool.take_checked_lines();
        assert!(runs.iter().all(|&(a, len)| a % 64 == 0 && len % 64 == 0 && len > 0));
        assert!(runs.iter().all(|&(a, len)| pool.lines_match(a, len)), "sound lines match alone");
        // The search compared the key it found: its line is among those checked.
        let within = |at: u64| runs.iter().any(|&(a, len)| a <= at && at + 8 <= a + len);
        let at = places(&pool, i).into_iter().find(|&at| within(at));
        let at = at.unwrap_or_else(|| panic!("key {i}: no copy of it in the lines checked, {runs:?}"));
        // One bit flipped in the key's line: the bare check and the get both refuse it.
        let line = (at & !63) as usize;
        let old = pool.region().bytes()[line..line + 64].to_vec();
        let mut junk = old.clone();
        junk[(at as usize - line) + 2] ^= 0x10;
        pool.region_mut().corrupt(line, &junk).unwrap();
        assert!(!pool.lines_match(at, 8), "a flipped line fails alone");
        assert!(matches!(kv.get(&pool, &key(i)), Err(HeapError::Damaged { .. })));
        pool.region_mut().corrupt(line, &old).unwrap();
        pool.take_checked_lines();
    }
    // LC within its interval: the second get of a key compares nothing, and notes nothing.
    pool.set_read_check(ReadCheck::AfterCheck(Duration::from_secs(3600)));
    kv.get(&pool, &key(5)).unwrap();
    assert!(!pool.take_checked_lines().is_empty());
    kv.get(&pool, &key(5)).unwrap();
    assert_eq!(pool.take_checked_lines(), vec![], "a page checked within the interval is not again");
    pool.note_checked_lines(false);
    pool.set_read_check(ReadCheck::Every);
    kv.get(&pool, &key(5)).unwrap();
    assert!(pool.take_checked_lines().is_empty(), "noting off");
}
