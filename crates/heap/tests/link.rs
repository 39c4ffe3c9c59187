//! Allocation into a slot and freeing from one without the journal (`Pool::alloc_into`,
//! `Pool::free_from`): atomic through crashes at every fence and at random stores, with line
//! and word loss, mixed with transactions that write, move and free linked objects (which
//! must unlink them first); their line costs; wild writes into linked headers.

use std::cell::RefCell;
use std::time::Duration;

use bitmend_heap::{HeaderFault, HeapError, Pool, PoolOptions, Ptr};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::pmem::{CrashGranularity, CrashRegion, Region};
use bitmend_media::rng::Rng;

mod common;

fn opts() -> PoolOptions {
    PoolOptions { reuse_after: Duration::ZERO, ..PoolOptions::default() }
}

const SLOTS: u64 = 12;
const OPS: u64 = 70;

/// A slot's object: its length, and the byte filling it (`None`: allocated, not yet written).
type Model = Vec<Option<(usize, Option<u8>)>>;

#[derive(Default)]
struct Progress {
    done: Vec<Model>,
    next: Option<Model>,
}

/// A pool whose root is an array of `SLOTS` null pointer slots.
fn base(granularity: CrashGranularity) -> CrashRegion {
    let region = CrashRegion::new(3 << 20).with_crash_model(granularity, 0.5);
    let mut pool = Pool::create(region, opts()).unwrap();
    pool.tx(|tx| {
        let r = tx.alloc(SLOTS * 8)?;
        tx.write(r, 0, &[0; (SLOTS * 8) as usize])?;
        let slot = tx.root_slot();
        tx.set(slot, r)
    })
    .unwrap();
    pool.into_region()
}

/// One step of the workload, drawn from the model before it.
#[derive(Clone, Copy, Debug)]
enum Step {
    AllocInto {
        s: usize,
        len: usize,
    },
    /// The first write of a linked object: data-logged into it.
    Fill {
        s: usize,
        len: usize,
        fill: u8,
    },
    FreeFrom {
        s: usize,
    },
    /// A transaction moves the pointer to an empty slot and nulls this one (the object must
    /// lose its link first, or a crash would free it).
    Move {
        s: usize,
        t: usize,
    },
    /// A transaction frees the object (its header rewritten free at the commit).
    TxFree {
        s: usize,
    },
    /// Overwritten whole through the slot: pointer-logged into a new block.
    Replace {
        s: usize,
        len: usize,
        fill: u8,
    },
}

fn draw(model: &Model, rng: &mut Rng, i: u64) -> Step {
    let s = rng.below(SLOTS) as usize;
    let empty: Vec<usize> = (0..SLOTS as usize).filter(|&t| model[t].is_none()).collect();
    let fill = (i as u8).wrapping_mul(29).wrapping_add(3);
    let choice = rng.below(5);
    match model[s] {
        None => Step::AllocInto { s, len: 1 + rng.below(3000) as usize },
        Some((len, None)) if choice == 0 => Step::Fill { s, len, fill },
        Some(_) if choice <= 1 => Step::FreeFrom { s },
        Some(_) if choice == 2 && !empty.is_empty() => {
            Step::Move { s, t: empty[rng.below(empty.len() as u64) as usize] }
        }
        Some(_) if choice == 3 => Step::TxFree { s },
        Some((len, _)) => Step::Replace { s, len, fill },
    }
}

fn after(model: &Model, step: Step) -> Model {
    let mut m = model.clone();
    match step {
        Step::AllocInto { s, len } => m[s] = Some((len, None)),
        Step::Fill { s, len, fill } | Step::Replace { s, len, fill } => m[s] = Some((len, Some(fill))),
        Step::FreeFrom { s } | Step::TxFree { s } => m[s] = None,
        Step::Move { s, t } => {
            m[t] = m[s];
            m[s] = None;
        }
    }
    m
}

fn apply<R: Region>(pool: &mut Pool<R>, step: Step) -> Result<(), HeapError> {
    let root = pool.root();
    let slot = |pool: &Pool<R>, s: usize| pool.slot(root, 8 * s as u64);
    match step {
        Step::AllocInto { s, len } => pool.alloc_into(slot(pool, s)?, len as u64).map(|_| ()),
        Step::Fill { s, len, fill } => {
            let p = pool.get(slot(pool, s)?);
            pool.tx(|tx| tx.write(p, 0, &vec![fill; len]))
        }
        Step::FreeFrom { s } => pool.free_from(slot(pool, s)?),
        Step::Move { s, t } => {
            let (from, to) = (slot(pool, s)?, slot(pool, t)?);
            pool.tx(|tx| {
                let p = tx.get(from);
                tx.set(to, p)?;
                tx.set(from, Ptr::NULL)
            })
        }
        Step::TxFree { s } => {
            let from = slot(pool, s)?;
            pool.tx(|tx| {
                let p = tx.get(from);
                tx.free(p)?;
                tx.set(from, Ptr::NULL)
            })
        }
        Step::Replace { s, len, fill } => {
            let from = slot(pool, s)?;
            pool.tx(|tx| tx.write_through(from, 0, &vec![fill; len]).map(|_| ()))
        }
    }
}

fn workload(region: &mut CrashRegion, progress: &mut Progress) -> bool {
    *progress = Progress::default();
    let Ok((mut pool, _)) = Pool::open(&mut *region, opts()) else { return false };
    let mut model: Model = vec![None; SLOTS as usize];
    let mut rng = Rng::new(77);
    for i in 0..OPS {
        let step = draw(&model, &mut rng, i);
        let next = after(&model, step);
        progress.next = Some(next.clone());
        if apply(&mut pool, step).is_err() {
            return false;
        }
        model = next;
        progress.done.push(model.clone());
    }
    progress.next = None;
    true
}

/// Whether the pool's root slots hold objects as `model` says: null where it has none, else
/// an allocated object of its length, filled with its byte where it has one.
fn holds(pool: &Pool<CrashRegion>, model: &Model) -> bool {
    let root = pool.root();
    model.iter().enumerate().all(|(s, want)| {
        let p = pool.get(pool.slot(root, 8 * s as u64).unwrap());
        match *want {
            None => p == Ptr::NULL,
            Some((len, fill)) => {
                pool.size_of(p).ok() == Some(len as u64)
                    && fill.is_none_or(|f| pool.read(p, 0, len as u64).unwrap().iter().all(|&b| b == f))
            }
        }
    })
}

/// After a crash: the pool opens with no bad header, holds the objects of the last finished
/// step or of the one in flight, every allocated block is the root or a slot's object, and
/// new allocations never take a live block. Returns whether the step in flight was kept.
fn check_recovered(r: CrashRegion, p: &Progress, at: &str) -> bool {
    let (mut pool, report) = Pool::open(r, opts()).unwrap_or_else(|e| panic!("{at}: {e}"));
    assert!(report.bad_headers.is_empty(), "{at}: {:?}", report.bad_headers);
    let empty: Model = vec![None; SLOTS as usize];
    let before = p.done.last().unwrap_or(&empty);
    let after = p.next.as_ref().unwrap_or(before);
    let kept = after != before && holds(&pool, after);
    assert!(kept || holds(&pool, before), "{at}: {} steps finished; neither before nor after", p.done.len());
    let got = if kept { after } else { before };
    // Every allocated block is the root or a slot's object: no leak, none twice.
    let root = pool.root();
    let ptrs: Vec<Ptr> = (0..SLOTS).map(|s| pool.get(pool.slot(root, 8 * s).unwrap())).collect();
    let mut reachable: Vec<Ptr> = ptrs.iter().copied().filter(|&p| p != Ptr::NULL).chain([root]).collect();
    reachable.sort();
    assert_eq!(
        pool.allocated(),
        reachable,
        "{at}: allocated blocks; {report:?}; before {before:?} after {after:?}"
    );
    let spare = (0..SLOTS as usize).find(|&s| got[s].is_none());
    if let Some(s) = spare {
        let slot = pool.slot(root, 8 * s as u64).unwrap();
        for _ in 0..8 {
            let q = pool.alloc_into(slot, 100).unwrap_or_else(|e| panic!("{at}: {e}"));
            assert!(!ptrs.contains(&q) && q != root, "{at}: a live block handed out again");
            pool.free_from(slot).unwrap();
        }
    }
    kept
}

#[test]
fn a_crash_at_every_fence_leaves_each_allocation_and_free_done_or_not() {
    let (mut reboots, mut kept) = (0, 0);
    for g in [CrashGranularity::Line, CrashGranularity::Word] {
        let progress = RefCell::new(Progress::default());
        let c = campaign::run_rebooting(
            &base(g),
            Schedule::Every,
            2,
            |r| workload(r, &mut progress.borrow_mut()),
            |r, fence| kept += check_recovered(r, &progress.borrow(), &format!("{g:?} fence {fence}")) as u64,
        );
        assert!(c.ops >= OPS, "{c:?}");
        reboots += c.cuts;
    }
    eprintln!("linked allocations: {reboots} crashes, two at every fence, line and word loss, {OPS} steps (alloc_into, free_from, and transactions that write, move, free and replace linked objects); {kept} steps in flight found done; none half done");
    assert!(reboots > 300, "{reboots}");
    assert!(kept > 0);
}

#[test]
fn crashes_at_random_stores_tear_headers_and_recovery_repeats() {
    let mut rng = Rng::new(4242);
    let (mut crashes, mut during_recovery) = (0, 0);
    for g in [CrashGranularity::Line, CrashGranularity::Word] {
        let cuts = common::crash_count("LINK_CRASHES", 60);
        let (c, d) = common::at_random_stores(&base(g), &mut rng, cuts, opts, workload, |r, p: &Progress| {
            check_recovered(r, p, &format!("{g:?} random store"));
        });
        crashes += c;
        during_recovery += d;
    }
    eprintln!("linked allocations: {crashes} crashes at random stores, {during_recovery} more during recovery; none half done");
}

/// An allocation into a slot writes its header's line and the slot's; a free of a linked
/// block the slot's line alone. Nothing of the journal.
#[test]
fn an_allocation_into_a_slot_writes_two_lines_and_a_free_from_it_one() {
    let (mut pool, _) = Pool::open(base(CrashGranularity::Line), opts()).unwrap();
    let root = pool.root();
    let slot = pool.slot(root, 0).unwrap();
    // The first allocation of a class formats a run (journaled): not counted.
    pool.alloc_into(slot, 200).unwrap();
    pool.free_from(slot).unwrap();
    // (And the transaction's commit vouches for the slot: checked out, or the next write of
    // the slot would check out first.)
    pool.checkout().unwrap();
    let lines = |pool: &Pool<CrashRegion>| pool.region().line_writes().iter().map(|&c| c as u64).sum::<u64>();
    let (l0, f0, j0) = (lines(&pool), pool.region().fences(), pool.journal_use().0);
    let p = pool.alloc_into(slot, 200).unwrap();
    let (l1, f1) = (lines(&pool), pool.region().fences());
    pool.free_from(slot).unwrap();
    let (l2, f2) = (lines(&pool), pool.region().fences());
    assert_eq!((l1 - l0, f1 - f0), (2, 2), "alloc_into: the header and the slot");
    assert_eq!((l2 - l1, f2 - f1), (1, 1), "free_from: the slot");
    assert!(pool.size_of(p).is_err(), "freed");
    assert_eq!(pool.journal_use().0, j0, "nothing journaled");
}

/// A moved pointer keeps its object: the transaction that moves it unlinks it first, so the
/// old slot, null or pointing elsewhere, no longer decides. Across a reopen.
#[test]
fn a_pointer_moved_by_a_transaction_keeps_its_object_across_a_reopen() {
    let (mut pool, _) = Pool::open(base(CrashGranularity::Line), opts()).unwrap();
    let root = pool.root();
    let (a, b) = (pool.slot(root, 0).unwrap(), pool.slot(root, 8).unwrap());
    // The first allocation of the class formats its run, in a transaction (not linked).
    pool.alloc_into(a, 500).unwrap();
    pool.free_from(a).unwrap();
    let p = pool.alloc_into(a, 500).unwrap();
    pool.tx(|tx| tx.write(p, 0, &[9; 500])).unwrap();
    assert_eq!(pool.linked_blocks(), 1);
    pool.tx(|tx| {
        tx.set(b, p)?;
        tx.set(a, Ptr::NULL)
    })
    .unwrap();
    assert_eq!(pool.linked_blocks(), 0, "moving the pointer unlinked it");
    // Another allocation into the old slot, then a reopen: both objects live.
    let q = pool.alloc_into(a, 500).unwrap();
    let (pool, report) = Pool::open(pool.into_region(), opts()).unwrap();
    assert_eq!(report.links_freed, 0);
    assert_eq!(pool.read(p, 0, 500).unwrap(), &[9; 500][..]);
    assert_eq!(pool.size_of(q).unwrap(), 500);
    assert_eq!(pool.stats().allocated_blocks, 3);
    assert_eq!(pool.linked_blocks(), 1, "q, still linked to its slot");
}

/// Wild writes into linked headers: a damaged word 0 or word 1 (the link) fails its check,
/// is reported and quarantined; never read as another state, never handed out.
#[test]
fn wild_writes_into_linked_headers_are_reported_and_never_reused() {
    let (mut pool, _) = Pool::open(base(CrashGranularity::Line), opts()).unwrap();
    let root = pool.root();
    let ptrs: Vec<Ptr> =
        (0..SLOTS).map(|s| pool.alloc_into(pool.slot(root, 8 * s).unwrap(), 300).unwrap()).collect();
    let mut region = pool.into_region();
    let mut rng = Rng::new(5);
    let hit = [1usize, 4, 7, 10];
    for (n, &i) in hit.iter().enumerate() {
        // Bytes of word 0 for the first two, of word 1 (the link, the count, its check) after.
        let at = (ptrs[i].0 - 16) as usize + if n < 2 { rng.below(8) } else { 8 + rng.below(8) } as usize;
        let b = region.bytes()[at] ^ (1 << rng.below(8));
        region.corrupt(at, &[b]).unwrap();
    }
    let injected = hit.len();
    let (mut pool, report) = Pool::open(region, opts()).unwrap();
    let found: Vec<(u64, HeaderFault)> = report.bad_headers.iter().map(|b| (b.at, b.fault)).collect();
    let want: Vec<(u64, HeaderFault)> =
        hit.iter().map(|&i| (ptrs[i].0 - 16, HeaderFault::Checksum)).collect();
    assert_eq!(found, want, "{injected} faults injected");
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(pool.size_of(p).is_ok(), !hit.contains(&i), "object {i}");
    }
    let spare = pool.slot(root, 0).unwrap();
    pool.tx(|tx| tx.set(spare, Ptr::NULL)).unwrap();
    for _ in 0..500 {
        let q = pool.alloc_into(spare, 300).unwrap();
        assert!(!ptrs.contains(&q), "a quarantined or live block was handed out");
        pool.free_from(spare).unwrap();
    }
}

/// An object holding a linked slot, freed while another slot points at the linked block
/// too: the free unlinks the block, so reusing the object's bytes cannot free it.
#[test]
fn freeing_an_object_unlinks_the_blocks_linked_to_slots_inside_it() {
    let (mut pool, _) = Pool::open(base(CrashGranularity::Line), opts()).unwrap();
    let root = pool.root();
    let slot = |pool: &Pool<CrashRegion>, s: u64| pool.slot(root, 8 * s).unwrap();
    // Runs for both classes formatted first (transactions), so that what follows is linked.
    for len in [256, 100] {
        pool.alloc_into(slot(&pool, 5), len).unwrap();
        pool.free_from(slot(&pool, 5)).unwrap();
    }
    let holder = pool.alloc_into(slot(&pool, 0), 256).unwrap();
    pool.tx(|tx| tx.write(holder, 0, &[0; 256])).unwrap();
    let inner = pool.slot(holder, 64).unwrap();
    let b = pool.alloc_into(inner, 100).unwrap();
    pool.tx(|tx| tx.write(b, 0, &[0xBB; 100])).unwrap();
    // A second pointer to b, written by a transaction that leaves the inner slot alone.
    let second = slot(&pool, 1);
    pool.tx(|tx| tx.set(second, b)).unwrap();
    assert_eq!(pool.linked_blocks(), 2);
    pool.free_from(slot(&pool, 0)).unwrap();
    assert_eq!(pool.linked_blocks(), 0, "the holder freed, b unlinked");
    // The holder's bytes reused: blocks of its class taken until it comes back, each
    // overwritten (the old inner slot with them).
    let taken = pool
        .tx(|tx| {
            let mut taken = Vec::new();
            while !taken.contains(&holder) {
                let q = tx.alloc(256)?;
                tx.write(q, 0, &[0x77; 256])?;
                taken.push(q);
            }
            Ok(taken)
        })
        .unwrap();
    let (pool, report) = Pool::open(pool.into_region(), opts()).unwrap();
    assert_eq!(
        report.links_freed, 1,
        "the 100-byte block freed from slot 5 (the root array had made its class's run)"
    );
    assert_eq!(pool.read(b, 0, 100).unwrap(), &[0xBB; 100][..]);
    let mut live: Vec<Ptr> = taken.into_iter().chain([root, b]).collect();
    live.sort();
    assert_eq!(pool.allocated(), live);
}

/// A full pool: `alloc_into` says so, leaves the slot as it was and writes nothing; every
/// object allocated before reads back after a reopen, and freeing one makes room again.
#[test]
fn a_full_pool_refuses_an_allocation_into_a_slot_and_keeps_everything_else() {
    let (mut pool, _) = Pool::open(base(CrashGranularity::Line), opts()).unwrap();
    let root = pool.root();
    let spare = pool.slot(root, 8 * (SLOTS - 1)).unwrap();
    // Objects chained through their first 8 bytes (each the next one's slot), until full.
    let mut slot = pool.slot(root, 0).unwrap();
    let mut objects = Vec::new();
    let full = loop {
        match pool.alloc_into(slot, 4000) {
            Ok(p) => {
                let fill = objects.len() as u8;
                pool.tx(|tx| tx.write(p, 0, &[0; 8]).and_then(|_| tx.write(p, 8, &[fill; 3992]))).unwrap();
                objects.push(p);
                slot = pool.slot(p, 0).unwrap();
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(full, HeapError::Full { .. }), "{full}");
    assert!(objects.len() > 100, "{} objects", objects.len());
    let before = pool.region().bytes().to_vec();
    assert!(matches!(pool.alloc_into(spare, 4000), Err(HeapError::Full { .. })));
    assert_eq!(pool.region().bytes(), &before[..], "a refused allocation writes nothing");
    assert_eq!(pool.get(spare), Ptr::NULL);
    pool.free_from(spare).unwrap(); // a null slot: nothing to free
    let (mut pool, report) = Pool::open(pool.into_region(), opts()).unwrap();
    assert!(report.bad_headers.is_empty());
    for (i, &p) in objects.iter().enumerate() {
        assert_eq!(pool.read(p, 8, 3992).unwrap(), &[i as u8; 3992][..], "object {i}");
    }
    // The last object freed from its slot (the one before it): room for one more.
    let last_slot = match objects.len() {
        1 => pool.slot(root, 0).unwrap(),
        n => pool.slot(objects[n - 2], 0).unwrap(),
    };
    pool.free_from(last_slot).unwrap();
    pool.alloc_into(spare, 4000).unwrap();
}

/// Wild writes into linked headers while the pool is open, then frees from their slots
/// (which read the state and link without their checks): a damaged link sends the free
/// through a transaction, which rewrites the header free; a damaged check with the link
/// intact frees from the slot, and the next open reports that header and quarantines its
/// block. Never a panic, never a block handed out twice.
#[test]
fn freeing_from_a_slot_whose_header_a_wild_write_hit() {
    let (mut pool, _) = Pool::open(base(CrashGranularity::Line), opts()).unwrap();
    let root = pool.root();
    let slot = |pool: &Pool<CrashRegion>, s: u64| pool.slot(root, 8 * s).unwrap();
    // The class's run formatted first (a transaction), so that what follows is linked.
    pool.alloc_into(slot(&pool, 0), 300).unwrap();
    pool.free_from(slot(&pool, 0)).unwrap();
    let a = pool.alloc_into(slot(&pool, 1), 300).unwrap();
    let b = pool.alloc_into(slot(&pool, 2), 300).unwrap();
    assert_eq!(pool.linked_blocks(), 2);
    let injected = 2;
    // a: a bit of its link (byte 8); b: a bit of word 1's check (byte 14).
    for (p, at) in [(a, 8), (b, 14)] {
        let h = (p.0 - 16) as usize + at;
        let x = pool.region().bytes()[h] ^ 0x04;
        pool.region_mut().corrupt(h, &[x]).unwrap();
    }
    pool.free_from(slot(&pool, 1)).unwrap();
    pool.free_from(slot(&pool, 2)).unwrap();
    assert!(pool.size_of(a).is_err() && pool.size_of(b).is_err());
    let (mut pool, report) = Pool::open(pool.into_region(), opts()).unwrap();
    let bad: Vec<u64> = report.bad_headers.iter().map(|h| h.at).collect();
    assert_eq!(bad, vec![b.0 - 16], "{injected} faults injected: a's header was rewritten free");
    for _ in 0..300 {
        let q = pool.alloc_into(slot(&pool, 3), 300).unwrap();
        assert_ne!(q, b, "a quarantined block handed out");
        pool.free_from(slot(&pool, 3)).unwrap();
    }
}
