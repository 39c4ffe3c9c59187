//! Damage within the redundancy never costs a write. A pool with stripes of 8+2 is damaged
//! first (one byte flipped, a page of zeros, or two whole pages of one stripe: m = 2), on
//! each page in use in turn, and then a mutation runs over it: a put of a new key, a put
//! over a key, a delete, a batch load, forty deletes that merge leaves, a data-logged write,
//! a pointer-logged write, an allocation into a slot, a free. The mutation succeeds (what it read was checked, and
//! rebuilt when it failed), and the store equals a model after it, after a full scrub, and
//! after reopening. In CI one page in `HEAL_CAMPAIGN_STRIDE` (default 5) is damaged;
//! `HEAL_CAMPAIGN_STRIDE=1` damages every page in use.

use std::collections::BTreeMap;
use std::time::Duration;

use bitmend_heap::kv::Kv;
use bitmend_heap::{HeapError, Pool, PoolOptions, Ptr, ReadCheck, ScrubPass, Slot, StripeShape};
use bitmend_media::pmem::{RamRegion, Region};
use bitmend_media::rng::Rng;

fn opts() -> PoolOptions {
    PoolOptions {
        reuse_after: Duration::ZERO,
        stripes: Some(StripeShape { k: 8, m: 2 }),
        ..PoolOptions::default()
    }
}

fn stride() -> usize {
    std::env::var("HEAL_CAMPAIGN_STRIDE").ok().and_then(|s| s.parse().ok()).unwrap_or(5)
}

/// Runs `f`, rebuilding what a read check refuses, as a careful reader does.
fn healing<T>(pool: &mut Pool<RamRegion>, f: impl Fn(&Pool<RamRegion>) -> Result<T, HeapError>) -> T {
    for _ in 0..32 {
        match f(pool) {
            Err(HeapError::Damaged { at, len, .. }) => pool.verify(at, len).unwrap(),
            r => return r.unwrap(),
        }
    }
    panic!("still damaged after 32 rebuilds")
}

#[derive(Clone, Copy, Debug)]
enum Damage {
    OneByte,
    ZeroPage,
    TwoPagesOfAStripe,
}

/// Damages the page at `at` (and, for the third kind, another data page of its stripe).
fn damage(pool: &mut Pool<RamRegion>, at: u64, how: Damage, rng: &mut Rng) {
    let geo = pool.geometry().unwrap();
    let mut pages = vec![at];
    if let Damage::TwoPagesOfAStripe = how {
        let (stripe, index) = geo.locate(geo.page_of(at).unwrap());
        let other = (0..8).filter(|&i| i != index).find_map(|i| geo.member(stripe, i));
        pages.extend(other.map(|p| geo.page_at(p)));
    }
    for at in pages {
        let bad = match how {
            Damage::OneByte => {
                let off = rng.below(4096);
                let b = pool.region().bytes()[(at + off) as usize];
                pool.region_mut().corrupt((at + off) as usize, &[b ^ (1 + rng.below(255) as u8)]).unwrap();
                continue;
            }
            _ => vec![0u8; 4096],
        };
        pool.region_mut().corrupt(at as usize, &bad).unwrap();
    }
}

/// The data pages that hold something (those a mutation may read).
fn pages_in_use(pool: &Pool<RamRegion>) -> Vec<u64> {
    let geo = pool.geometry().unwrap();
    let bytes = pool.region().bytes();
    (0..geo.pages)
        .map(|p| geo.page_at(p))
        .filter(|&at| bytes[at as usize..at as usize + 4096].iter().any(|&b| b != 0))
        .collect()
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn value(i: u64, rng: &mut Rng) -> Vec<u8> {
    // Inline values and values in blocks of their own.
    let mut v =
        vec![
            0u8;
            if i.is_multiple_of(3) { 1500 + rng.below(3000) as usize } else { 20 + rng.below(200) as usize }
        ];
    rng.fill(&mut v);
    v
}

fn kv_pool() -> (Pool<RamRegion>, Kv, Model) {
    let mut pool = Pool::create(RamRegion::new(4 << 20), opts()).unwrap();
    let kv = Kv::create(&mut pool).unwrap();
    let mut model = Model::new();
    let mut rng = Rng::new(1);
    for i in 0..120u64 {
        let (k, v) = (format!("key{i:04}").into_bytes(), value(i, &mut rng));
        kv.put(&mut pool, &k, &v).unwrap();
        model.insert(k, v);
    }
    (pool, kv, model)
}

fn kv_contents(pool: &mut Pool<RamRegion>, kv: &Kv) -> Model {
    healing(pool, |p| {
        let mut m = Model::new();
        kv.scan(p, None, None, &mut |k, v| {
            m.insert(k.to_vec(), v);
            true
        })?;
        Ok(m)
    })
}

#[derive(Clone, Copy, Debug)]
enum KvMutation {
    PutNew,
    PutOver,
    Delete,
    Batch,
    /// Forty neighbours deleted in one transaction: leaves fall under half full and merge.
    DeleteMerging,
}

fn mutate_kv(pool: &mut Pool<RamRegion>, kv: &Kv, model: &mut Model, how: KvMutation, target: u64) {
    let key = |i: u64| format!("key{:04}", i % 120).into_bytes();
    let mut rng = Rng::new(target);
    match how {
        KvMutation::PutNew => {
            let (k, v) = (format!("new{target:04}").into_bytes(), value(target, &mut rng));
            kv.put(pool, &k, &v).unwrap();
            model.insert(k, v);
        }
        KvMutation::PutOver => {
            let (k, v) = (key(target), value(target + 1, &mut rng));
            kv.put(pool, &k, &v).unwrap();
            model.insert(k, v);
        }
        KvMutation::Delete => {
            assert!(kv.delete(pool, &key(target)).unwrap(), "the key was there");
            model.remove(&key(target));
        }
        KvMutation::Batch => {
            let batch: Vec<(Vec<u8>, Vec<u8>)> =
                (0..20).map(|i| (key(target + i * 7), value(target + i, &mut rng))).collect();
            kv.batch(pool, |kv, tx| batch.iter().try_for_each(|(k, v)| kv.put_in(tx, k, v))).unwrap();
            model.extend(batch);
        }
        KvMutation::DeleteMerging => {
            let keys: Vec<Vec<u8>> = (0..40).map(|i| key(target + i)).collect();
            kv.batch(pool, |kv, tx| keys.iter().try_for_each(|k| kv.delete_in(tx, k).map(|_| ()))).unwrap();
            for k in &keys {
                model.remove(k);
            }
        }
    }
}

/// Raw objects under 32 root slots: the model is each slot's object bytes.
type Objects = Vec<Option<Vec<u8>>>;

fn raw_pool() -> (Pool<RamRegion>, Ptr, Objects) {
    let mut pool = Pool::create(RamRegion::new(4 << 20), opts()).unwrap();
    let root = pool
        .tx(|tx| {
            let r = tx.alloc(32 * 8)?;
            tx.write(r, 0, &[0; 32 * 8])?;
            let slot = tx.root_slot();
            tx.set(slot, r)?;
            Ok(r)
        })
        .unwrap();
    let mut objects = vec![None; 32];
    let mut rng = Rng::new(2);
    for (s, o) in objects.iter_mut().enumerate().take(24) {
        let mut v = vec![0u8; 100 + rng.below(9000) as usize];
        rng.fill(&mut v);
        let slot = pool.slot(root, s as u64 * 8).unwrap();
        pool.tx(|tx| {
            let p = tx.alloc(v.len() as u64)?;
            tx.write(p, 0, &v)?;
            tx.set(slot, p)
        })
        .unwrap();
        *o = Some(v);
    }
    (pool, root, objects)
}

fn raw_contents(pool: &mut Pool<RamRegion>, root: Ptr) -> Objects {
    (0..32u64)
        .map(|s| {
            healing(pool, |p| {
                let slot = p.slot(root, s * 8)?;
                let obj = p.get(slot);
                if obj == Ptr::NULL {
                    return Ok(None);
                }
                Ok(Some(p.object(obj)?.to_vec()))
            })
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum RawMutation {
    DataLogged,
    PointerLogged,
    Alloc,
    Free,
}

/// `slots`: the root's slots, found before the damage (a slot is a place, not a read).
fn mutate_raw(
    pool: &mut Pool<RamRegion>,
    slots: &[Slot],
    objects: &mut Objects,
    how: RawMutation,
    target: u64,
) {
    let mut rng = Rng::new(target + 99);
    let full = |objects: &Objects, want: bool| {
        let s = (target % 32) as usize;
        (0..32).map(|i| (s + i) % 32).find(|&i| objects[i].is_some() == want).unwrap()
    };
    match how {
        RawMutation::DataLogged | RawMutation::PointerLogged => {
            let s = full(objects, true);
            let slot = slots[s];
            let obj = objects[s].as_mut().unwrap();
            let (off, len) = match how {
                RawMutation::DataLogged => {
                    (rng.below(obj.len() as u64 / 2) as usize, 1 + rng.below(48) as usize)
                }
                _ => (0, obj.len()),
            };
            let mut data = vec![0u8; len];
            rng.fill(&mut data);
            pool.tx_healing(|tx| {
                let p = tx.get_checked(slot)?;
                match how {
                    RawMutation::DataLogged => tx.write(p, off as u64, &data),
                    _ => tx.write_through(slot, off as u64, &data).map(|_| ()),
                }
            })
            .unwrap();
            obj[off..off + len].copy_from_slice(&data);
        }
        RawMutation::Alloc => {
            let s = full(objects, false);
            let slot = slots[s];
            let len = 64 + rng.below(5000);
            let p = pool.alloc_into(slot, len).unwrap();
            objects[s] = Some(pool.object(p).unwrap().to_vec());
        }
        RawMutation::Free => {
            let s = full(objects, true);
            let slot = slots[s];
            pool.free_from(slot).unwrap();
            objects[s] = None;
        }
    }
}

/// Scrubs, then reopens: what `same` finds must hold after each.
fn scrub_and_reopen(mut pool: Pool<RamRegion>, mut same: impl FnMut(&mut Pool<RamRegion>, &str)) {
    same(&mut pool, "after the mutation");
    let r = pool.scrub(ScrubPass::Full).unwrap();
    assert!(r.beyond_repair.is_empty(), "{r:?}");
    same(&mut pool, "after a full scrub");
    let (mut pool, _) = Pool::open(pool.into_region(), opts()).unwrap();
    pool.set_read_check(ReadCheck::Every);
    same(&mut pool, "after reopening");
}

#[test]
fn kv_mutations_over_damage_within_m_lose_nothing() {
    let (base, kv, model) = kv_pool();
    let pages = pages_in_use(&base);
    let (mut runs, mut rng) = (0, Rng::new(3));
    for (n, &at) in pages.iter().enumerate().filter(|(n, _)| n % stride() == 0) {
        for how in [Damage::OneByte, Damage::ZeroPage, Damage::TwoPagesOfAStripe] {
            for m in [
                KvMutation::PutNew,
                KvMutation::PutOver,
                KvMutation::Delete,
                KvMutation::Batch,
                KvMutation::DeleteMerging,
            ] {
                let mut pool =
                    Pool::open(RamRegion::from_bytes(base.region().bytes().to_vec()), opts()).unwrap().0;
                let mut want = model.clone();
                damage(&mut pool, at, how, &mut rng);
                mutate_kv(&mut pool, &kv, &mut want, m, n as u64);
                pool.set_read_check(ReadCheck::Every);
                scrub_and_reopen(pool, |pool, when| {
                    assert!(kv_contents(pool, &kv) == want, "page {at:#x} {how:?}, {m:?}, {when}");
                });
                runs += 1;
            }
        }
    }
    eprintln!(
        "{runs} key-value mutations, each over damage within m (one byte, a zeroed page, two pages of a stripe) on one of {} pages in use: the store equals the model after each, after a scrub, after reopening",
        pages.len()
    );
    assert!(runs >= 100, "{runs}");
}

#[test]
fn raw_mutations_over_damage_within_m_lose_nothing() {
    let (base, root, objects) = raw_pool();
    let slots: Vec<Slot> = (0..32).map(|s| base.slot(root, s * 8).unwrap()).collect();
    let pages = pages_in_use(&base);
    let (mut runs, mut rng) = (0, Rng::new(4));
    for (n, &at) in pages.iter().enumerate().filter(|(n, _)| n % stride() == 0) {
        for how in [Damage::OneByte, Damage::ZeroPage, Damage::TwoPagesOfAStripe] {
            for m in
                [RawMutation::DataLogged, RawMutation::PointerLogged, RawMutation::Alloc, RawMutation::Free]
            {
                let mut pool =
                    Pool::open(RamRegion::from_bytes(base.region().bytes().to_vec()), opts()).unwrap().0;
                let mut want = objects.clone();
                damage(&mut pool, at, how, &mut rng);
                mutate_raw(&mut pool, &slots, &mut want, m, n as u64);
                pool.set_read_check(ReadCheck::Every);
                scrub_and_reopen(pool, |pool, when| {
                    let got = raw_contents(pool, root);
                    for s in 0..32 {
                        // A new allocation's bytes are whatever the block held: only its
                        // presence and length are the model's.
                        if matches!(m, RawMutation::Alloc)
                            && got[s].as_ref().map(|v| v.len()) == want[s].as_ref().map(|v| v.len())
                        {
                            continue;
                        }
                        assert!(got[s] == want[s], "page {at:#x} (#{n}) {how:?}, {m:?}, {when}: slot {s}");
                    }
                });
                runs += 1;
            }
        }
    }
    eprintln!(
        "{runs} raw mutations (data-logged, pointer-logged, alloc into a slot, free from one), each over damage within m on one of {} pages in use: every object equals the model after each, after a scrub, after reopening",
        pages.len()
    );
    assert!(runs >= 100, "{runs}");
}
