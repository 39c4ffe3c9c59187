//! Deleting gives space back: leaves (and inner nodes) left under half full merge with a
//! neighbour, so that a store that filled its pool takes new keys, in any order, after half
//! its keys are deleted; and a crash at every fence of merging deletes leaves a committed
//! state.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use bitmend_heap::kv::Kv;
use bitmend_heap::{HeapError, Pool, PoolOptions};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::pmem::{CrashGranularity, CrashRegion, RamRegion};
use bitmend_media::rng::Rng;

mod common;
use common::{assert_committed, kv_contents};

fn opts() -> PoolOptions {
    PoolOptions { reuse_after: Duration::ZERO, ..PoolOptions::default() }
}

/// Puts `next` keys until the pool is full; how many fit.
fn fill(
    kv: &Kv,
    pool: &mut Pool<RamRegion>,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    mut next: impl FnMut() -> Vec<u8>,
) -> usize {
    let mut n = 0;
    loop {
        let k = next();
        let v = vec![n as u8; 100];
        match kv.put(pool, &k, &v) {
            Ok(()) => {
                n += usize::from(model.insert(k, v).is_none());
            }
            Err(HeapError::Full { .. }) => return n,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_full_store_takes_new_keys_after_half_are_deleted() {
    // (which half is deleted, the order of the new keys, the share of the deleted count
    // that must fit again; ascending keys fill the leaves they split: the rightmost split)
    let cases = [
        ("every other", "ascending", 0.7),
        ("every other", "random", 0.8),
        ("the first half", "ascending", 1.2),
        ("the first half", "random", 0.8),
    ];
    for (deleted, order, share) in cases {
        let mut pool = Pool::create(RamRegion::new(2 << 20), opts()).unwrap();
        let kv = Kv::create(&mut pool).unwrap();
        let mut rng = Rng::new(5);
        let mut model = BTreeMap::new();
        let filled = fill(&kv, &mut pool, &mut model, || format!("k{:012}", rng.below(1 << 40)).into_bytes());
        let nodes_full = kv.check(&pool).unwrap().nodes;
        let keys: Vec<Vec<u8>> = model.keys().cloned().collect();
        let gone: Vec<&Vec<u8>> = match deleted {
            "every other" => keys.iter().step_by(2).collect(),
            _ => keys[..keys.len() / 2].iter().collect(),
        };
        for k in &gone {
            assert!(kv.delete(&mut pool, k).unwrap());
            model.remove(*k);
        }
        let st = kv.check(&pool).unwrap();
        assert!(st.nodes * 10 < nodes_full * 8, "{deleted}: {} nodes of {nodes_full} left", st.nodes);
        let mut i = 0u64;
        let added = fill(&kv, &mut pool, &mut model, || {
            i += 1;
            match order {
                "ascending" => format!("z{i:012}").into_bytes(),
                _ => format!("k{:012}", rng.below(1 << 40)).into_bytes(),
            }
        });
        eprintln!("{deleted} of {filled} deleted, then {order} keys: {added} fit again ({} nodes left after the deletes, of {nodes_full})", st.nodes);
        assert!(
            added as f64 >= share * gone.len() as f64,
            "{deleted}, then {order}: {added} of {} fit again",
            gone.len()
        );
        assert!(kv_contents(&pool) == model);
        let (pool, _) = Pool::open(pool.close(), opts()).unwrap();
        let kv = Kv::open(&pool).unwrap();
        assert_eq!(kv.check(&pool).unwrap().entries, model.len() as u64);
        assert!(kv_contents(&pool) == model);
    }
}

/// A store filled to the last byte with keys in random order, copied in key order (as `kv
/// dump` and `kv load` do) into a pool of the same size: every key fits, with room left,
/// because keys that arrive in order fill the leaves they split.
#[test]
fn a_store_copied_in_key_order_fits_a_pool_of_its_size() {
    let mut pool = Pool::create(RamRegion::new(2 << 20), opts()).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    let mut rng = Rng::new(9);
    let mut model = BTreeMap::new();
    let n = fill(&kv, &mut pool, &mut model, || format!("k{:012}", rng.below(1 << 40)).into_bytes());
    let random_nodes = kv.check(&pool).unwrap().nodes;
    let mut copy = Pool::create(RamRegion::new(2 << 20), opts()).unwrap();
    let copy_kv = Kv::create(&mut copy).unwrap();
    for (k, v) in &model {
        copy_kv
            .put(&mut copy, k, v)
            .unwrap_or_else(|e| panic!("{} of {n} keys copied: {e}", copy_kv.len(&copy).unwrap()));
    }
    let sorted_nodes = copy_kv.check(&copy).unwrap().nodes;
    eprintln!("{n} keys: {random_nodes} nodes put in random order, {sorted_nodes} in key order");
    assert!(
        sorted_nodes * 10 < random_nodes * 8,
        "{sorted_nodes} nodes in key order, {random_nodes} in random order"
    );
    assert!(kv_contents(&copy) == model);
}

#[test]
fn deleting_every_key_leaves_one_empty_leaf() {
    let mut pool = Pool::create(RamRegion::new(4 << 20), opts()).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    let keys: Vec<Vec<u8>> = (0..3000u32)
        .map(|i| format!("key{:08}", i.wrapping_mul(2_654_435_761) % 100_000).into_bytes())
        .collect();
    for k in &keys {
        kv.put(&mut pool, k, &[1; 120]).unwrap();
    }
    let allocated = pool.stats().allocated_blocks;
    assert!(kv.check(&pool).unwrap().depth >= 2);
    for k in &keys {
        kv.delete(&mut pool, k).unwrap();
    }
    let st = kv.check(&pool).unwrap();
    assert_eq!((st.entries, st.nodes, st.depth), (0, 1, 1), "the tree shrank to its root leaf");
    pool.checkout().unwrap();
    assert_eq!(
        pool.stats().allocated_blocks,
        2,
        "the header and the root are all that is left of {allocated}"
    );
}

#[test]
fn a_crash_at_every_fence_of_merging_deletes_keeps_the_store_whole() {
    let mut cuts = 0;
    let base_model: BTreeMap<Vec<u8>, Vec<u8>> =
        (0..200u32).map(|i| (format!("k{i:03}").into_bytes(), vec![i as u8; 90])).collect();
    for g in [CrashGranularity::Line, CrashGranularity::Word] {
        let mut pool = Pool::create(CrashRegion::new(4 << 20).with_crash_model(g, 0.5), opts()).unwrap();
        let kv = Kv::create(&mut pool).unwrap();
        for (k, v) in &base_model {
            kv.put(&mut pool, k, v).unwrap();
        }
        let base_nodes = kv.check(&pool).unwrap().nodes;
        assert!(base_nodes >= 4, "leaves to merge");
        let base = pool.into_region();
        let states = RefCell::new(Vec::<BTreeMap<Vec<u8>, Vec<u8>>>::new());
        let c = campaign::run_rebooting(
            &base,
            Schedule::Every,
            2,
            |r| {
                let mut st = states.borrow_mut();
                st.clear();
                let mut model = base_model.clone();
                st.push(model.clone());
                let Ok((mut pool, _)) = Pool::open(&mut *r, opts()) else { return false };
                let Ok(kv) = Kv::open(&pool) else { return false };
                // Deletes that empty leaves from the front: each past the first few merges.
                for i in (0..160u32).step_by(4) {
                    let keys: Vec<Vec<u8>> = (i..i + 4).map(|j| format!("k{j:03}").into_bytes()).collect();
                    let mut next = model.clone();
                    for k in &keys {
                        next.remove(k);
                    }
                    st.push(next.clone());
                    let r = kv.batch(&mut pool, |kv, tx| {
                        keys.iter().try_for_each(|k| kv.delete_in(tx, k).map(|_| ()))
                    });
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
    eprintln!("merge crash campaign: {cuts} crashes at every fence of 40 batches of 4 deletes that merge leaves, line and word loss; every one a committed state");
    assert!(cuts > 200);
}
