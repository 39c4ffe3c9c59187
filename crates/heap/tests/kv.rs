//! The key-value store against a `BTreeMap`: random puts (small, inline and out-of-line
//! values), overwrites and deletes, scans and prefix scans, across reopenings and crashes.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use bitmend_heap::kv::{Kv, INLINE_MAX};
use bitmend_heap::{HeapError, Pool, PoolOptions};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::pmem::{CrashGranularity, CrashRegion};
use bitmend_media::rng::Rng;

mod common;
use common::assert_committed;

fn opts() -> PoolOptions {
    PoolOptions { reuse_after: Duration::ZERO, ..PoolOptions::default() }
}

fn key(rng: &mut Rng, space: u64) -> Vec<u8> {
    format!("k{:05}", rng.below(space)).into_bytes()
}

fn value(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(10) {
        0 => INLINE_MAX + 1 + rng.below(9000) as usize,
        1 => 0,
        _ => 1 + rng.below(200) as usize,
    };
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

fn assert_same(kv: &Kv, pool: &Pool<CrashRegion>, model: &BTreeMap<Vec<u8>, Vec<u8>>, when: &str) {
    let mut got = Vec::new();
    kv.scan(pool, None, None, &mut |k, v| {
        got.push((k.to_vec(), v));
        true
    })
    .unwrap();
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(got == want, "{when}: the store holds {} entries, the model {}", got.len(), want.len());
    let st = kv.check(pool).unwrap_or_else(|e| panic!("{when}: {e}"));
    assert_eq!(st.entries, model.len() as u64, "{when}");
    // A store of a version 4 pool keeps no count: its length is its leaves' counts.
    assert_eq!(kv.len(pool).unwrap(), model.len() as u64, "{when}: len");
}

#[test]
fn random_operations_match_a_btreemap_across_reopenings() {
    let mut pool = Pool::create(CrashRegion::new(24 << 20), opts()).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    let mut model = BTreeMap::new();
    let mut rng = Rng::new(11);
    for round in 0..6 {
        for _ in 0..1500 {
            let k = key(&mut rng, 2500);
            match rng.below(4) {
                0 => {
                    let had = kv.delete(&mut pool, &k).unwrap();
                    assert_eq!(had, model.remove(&k).is_some());
                }
                _ => {
                    let v = value(&mut rng);
                    kv.put(&mut pool, &k, &v).unwrap();
                    model.insert(k, v);
                }
            }
        }
        let probe = key(&mut rng, 2500);
        assert_eq!(kv.get(&pool, &probe).unwrap(), model.get(&probe).cloned());
        // A range and a prefix scan.
        let (a, b) = (b"k00100".to_vec(), b"k00900".to_vec());
        let mut range = Vec::new();
        kv.scan(&pool, Some(&a), Some(&b), &mut |k, _| {
            range.push(k.to_vec());
            true
        })
        .unwrap();
        let want: Vec<Vec<u8>> = model.range(a.clone()..b.clone()).map(|(k, _)| k.clone()).collect();
        assert_eq!(range, want, "round {round}: range scan");
        let mut pre = Vec::new();
        kv.scan_prefix(&pool, b"k012", &mut |k, _| {
            pre.push(k.to_vec());
            true
        })
        .unwrap();
        assert_eq!(pre, model.keys().filter(|k| k.starts_with(b"k012")).cloned().collect::<Vec<_>>());
        // Minimal logging: less than redo logging of the same writes would log.
        let b = pool.log_bytes();
        assert!(b.undo + b.pointer < b.redo_equivalent, "round {round}: {b:?}");
        eprintln!(
            "round {round}: journal {} undo + {} pointer bytes against {} for redo logging",
            b.undo, b.pointer, b.redo_equivalent
        );
        // Reopen (as after a clean stop: nothing pending).
        let region = pool.into_region();
        let (p, report) = Pool::open(region, opts()).unwrap();
        assert!(report.bad_headers.is_empty());
        pool = p;
        let kv2 = Kv::open(&pool).unwrap();
        assert_same(&kv2, &pool, &model, &format!("round {round}"));
    }
    let st = kv.check(&pool).unwrap();
    assert!(st.depth >= 2, "the tree grew: {st:?}");
}

#[test]
fn values_up_to_a_mebibyte_read_back_byte_for_byte() {
    let mut pool = Pool::create(CrashRegion::new(16 << 20), opts()).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    let mut rng = Rng::new(3);
    let mut values = Vec::new();
    // Across run boundaries: a span's later runs are all payload.
    for len in [INLINE_MAX + 1, 70_000, 262_000, 600_000, 1 << 20] {
        let mut v = vec![0u8; len];
        rng.fill(&mut v);
        kv.put(&mut pool, format!("v{len}").as_bytes(), &v).unwrap();
        assert!(kv.get(&pool, format!("v{len}").as_bytes()).unwrap().as_ref() == Some(&v), "{len} bytes");
        values.push((len, v));
    }
    // Reopened with the journal not yet checked out: recovery finishes the formats it
    // records and must not touch a byte of payload.
    let (pool, _) = Pool::open(pool.into_region(), opts()).unwrap();
    let kv = Kv::open(&pool).unwrap();
    assert_eq!(kv.check(&pool).unwrap().value_blocks, 5);
    for (len, v) in values {
        assert!(
            kv.get(&pool, format!("v{len}").as_bytes()).unwrap() == Some(v),
            "{len} bytes after reopening"
        );
    }
}

#[test]
fn over_the_limits_is_an_error_and_changes_nothing() {
    let mut pool = Pool::create(CrashRegion::new(8 << 20), opts()).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    kv.put(&mut pool, b"a", b"1").unwrap();
    assert!(matches!(
        kv.put(&mut pool, &[7; 1025], b"x"),
        Err(HeapError::KeyTooLong { len: 1025, max: 1024 })
    ));
    assert!(matches!(kv.put(&mut pool, b"b", &vec![0; (1 << 20) + 1]), Err(HeapError::TooLarge { .. })));
    // A full pool: the transaction fails whole.
    let mut n = 0;
    let err = loop {
        match kv.put(&mut pool, format!("big{n}").as_bytes(), &vec![9; 200_000]) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, HeapError::Full { .. }), "{err}");
    assert_eq!(kv.len(&pool).unwrap(), n + 1);
    assert_eq!(kv.get(&pool, format!("big{n}").as_bytes()).unwrap(), None);
    kv.check(&pool).unwrap();
    // Deleting gives the room back.
    assert!(kv.delete(&mut pool, b"big0").unwrap());
    pool.checkout().unwrap();
    kv.put(&mut pool, b"again", &vec![1; 200_000]).unwrap();
}

/// A batch that fails after puts that spliced entries into leaves (their header, index and
/// count logged in one record of several ranges) is rolled back in the process: every key
/// reads as before, and the store passes its check.
#[test]
fn a_failed_batch_rolls_back_its_spliced_puts() {
    let mut pool = Pool::create(CrashRegion::new(8 << 20), opts()).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    for i in 0..300u32 {
        kv.put(&mut pool, format!("k{i:04}").as_bytes(), &[i as u8; 60]).unwrap();
    }
    let root =
        bitmend_heap::Ptr(u64::from_le_bytes(pool.read(pool.root(), 8, 8).unwrap().try_into().unwrap()));
    let len = pool.size_of(root).unwrap();
    let before = pool.read(root, 0, len).unwrap().to_vec();
    let r = kv.batch(&mut pool, |kv, tx| {
        for i in 0..40u32 {
            kv.put_in(tx, format!("k{:04}", i * 7 + 3).as_bytes(), b"new value")?;
            kv.put_in(tx, format!("n{i:04}").as_bytes(), &[1; 30])?;
        }
        kv.delete_in(tx, b"k0100")?;
        kv.put_in(tx, &[0; 2000], b"a key over the limit")
    });
    assert!(matches!(r, Err(HeapError::KeyTooLong { .. })));
    for i in 0..300u32 {
        assert_eq!(kv.get(&pool, format!("k{i:04}").as_bytes()).unwrap(), Some(vec![i as u8; 60]), "k{i:04}");
    }
    assert_eq!(kv.get(&pool, b"n0001").unwrap(), None);
    assert_eq!(kv.check(&pool).unwrap().entries, 300);
    // The root's header and index are byte for byte as they were (logged ranges); its gap
    // may hold the entry of a split that was rolled back, which nothing points to.
    let now = pool.read(root, 0, len).unwrap();
    let index_end = 16 + 6 * u16::from_le_bytes([before[2], before[3]]) as usize;
    assert!(now[..index_end] == before[..index_end], "the root's header and index are restored");
    assert!(before[0] == 4 && index_end > 16, "the root is an inner node with children");
}

#[test]
fn a_crash_at_every_fence_of_a_batch_keeps_the_store_whole() {
    let mut cuts = 0;
    for g in [CrashGranularity::Line, CrashGranularity::Word] {
        let mut pool = Pool::create(CrashRegion::new(4 << 20).with_crash_model(g, 0.5), opts()).unwrap();
        let kv = Kv::create(&mut pool).unwrap();
        // Enough entries that a put splits leaves and the root.
        for i in 0..120u32 {
            kv.put(&mut pool, format!("k{i:03}").as_bytes(), &[i as u8; 90]).unwrap();
        }
        let depth = kv.check(&pool).unwrap().depth;
        assert!(depth >= 2, "the base tree has inner nodes");
        let base = pool.into_region();
        let states = RefCell::new(Vec::<BTreeMap<Vec<u8>, Vec<u8>>>::new());
        let c = campaign::run_rebooting(
            &base,
            Schedule::Every,
            2,
            |r| {
                let mut st = states.borrow_mut();
                st.clear();
                let mut model: BTreeMap<Vec<u8>, Vec<u8>> =
                    (0..120u32).map(|i| (format!("k{i:03}").into_bytes(), vec![i as u8; 90])).collect();
                st.push(model.clone());
                let Ok((mut pool, _)) = Pool::open(&mut *r, opts()) else { return false };
                let Ok(kv) = Kv::open(&pool) else { return false };
                for step in 0..24u32 {
                    let k = format!("k{:03}", (step * 37) % 150).into_bytes();
                    let v = vec![step as u8 + 100; if step % 3 == 0 { 700 } else { 120 }];
                    let mut next = model.clone();
                    if step % 4 == 3 {
                        next.remove(&k);
                    } else {
                        next.insert(k.clone(), v.clone());
                    }
                    st.push(next.clone());
                    let r = if step % 4 == 3 {
                        kv.delete(&mut pool, &k).map(|_| ())
                    } else {
                        kv.put(&mut pool, &k, &v)
                    };
                    if r.is_err() {
                        return false;
                    }
                    model = next;
                    st.push(model.clone());
                }
                true
            },
            |r, fence| assert_committed(r, opts(), &states.borrow(), &format!("{g:?} fence {fence}")),
        );
        cuts += c.cuts;
    }
    eprintln!("kv crash campaign: {cuts} crashes at every fence of 24 puts and deletes (splits, compactions, values in and out of line) on a 2-level tree, line and word loss; every one a committed state");
    assert!(cuts > 200);
}
