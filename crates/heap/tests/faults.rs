//! Wild writes, as a stray store or a worn cell leaves them: into block headers (detected at
//! open, reported with the check that failed, the block quarantined, never handed out again,
//! its object an error rather than other bytes), into the journal (rebuilt from its parity,
//! so a rollback, at open or in the process, still finds the old bytes), and into tree
//! nodes (an error for every read and write, never a panic or other bytes).

use std::time::Duration;

use bitmend_heap::{HeaderFault, HeapError, Pool, PoolOptions, Ptr};
use bitmend_media::pmem::{CrashPoint, CrashRegion, Region};

fn opts() -> PoolOptions {
    PoolOptions { reuse_after: Duration::ZERO, ..PoolOptions::default() }
}

/// A pool whose root holds `n` pointers to objects of 200 bytes, object i filled with i.
fn objects(n: usize) -> (Pool<CrashRegion>, Vec<Ptr>) {
    let mut pool = Pool::create(CrashRegion::new(4 << 20), opts()).unwrap();
    let ptrs = pool
        .tx(|tx| {
            let root = tx.alloc(8 * n as u64)?;
            let mut ptrs = Vec::new();
            for i in 0..n {
                let p = tx.alloc(200)?;
                tx.write(p, 0, &[i as u8; 200])?;
                tx.write(root, 8 * i as u64, &p.0.to_le_bytes())?;
                ptrs.push(p);
            }
            let slot = tx.root_slot();
            tx.set(slot, root)?;
            Ok(ptrs)
        })
        .unwrap();
    pool.checkout().unwrap();
    (pool, ptrs)
}

#[test]
fn wild_writes_into_block_headers_are_reported_and_never_reused() {
    let (pool, ptrs) = objects(50);
    let mut region = pool.into_region();
    let header = |p: Ptr| (p.0 - 16) as usize;
    // Three faults: a flipped bit, another block's header copied over this one's (which
    // fails its checks: a version 4 header's location is in them), zeros.
    let b = region.bytes()[header(ptrs[3]) + 5] ^ 0x10;
    region.corrupt(header(ptrs[3]) + 5, &[b]).unwrap();
    let copy = region.bytes()[header(ptrs[8])..header(ptrs[8]) + 16].to_vec();
    region.corrupt(header(ptrs[9]), &copy).unwrap();
    region.corrupt(header(ptrs[20]), &[0; 16]).unwrap();
    let injected = 3;
    let (mut pool, report) = Pool::open(region, opts()).unwrap();
    let found: Vec<(u64, HeaderFault)> = report.bad_headers.iter().map(|b| (b.at, b.fault)).collect();
    assert_eq!(
        found,
        vec![
            (header(ptrs[3]) as u64, HeaderFault::Checksum),
            (header(ptrs[9]) as u64, HeaderFault::Checksum),
            (header(ptrs[20]) as u64, HeaderFault::Checksum),
        ],
        "{injected} faults injected"
    );
    // Their objects read as an error, never as other bytes; every other object is whole.
    for (i, &p) in ptrs.iter().enumerate() {
        match pool.read(p, 0, 200) {
            Ok(b) => assert!(b.iter().all(|&x| x == i as u8), "object {i}"),
            Err(HeapError::NotAllocated { .. }) => assert!([3, 9, 20].contains(&i), "object {i}"),
            Err(e) => panic!("object {i}: {e}"),
        }
    }
    // Never handed out again: 2,000 allocations of the same class later.
    let bad = [ptrs[3], ptrs[9], ptrs[20]];
    for _ in 0..20 {
        let got = pool.tx(|tx| (0..100).map(|_| tx.alloc(200)).collect::<Result<Vec<_>, _>>()).unwrap();
        assert!(got.iter().all(|p| !bad.contains(p)), "a quarantined block was handed out");
    }
    assert_eq!(pool.stats().quarantined_blocks, 3);
}

#[test]
fn a_wild_write_into_the_journal_is_rebuilt_so_a_rollback_finds_the_old_bytes() {
    let (pool, ptrs) = objects(4);
    let base = pool.into_region();
    // How many fences the overwrite takes, and where its records go in the journal.
    let (fences, records) = {
        let (mut pool, _) = Pool::open(base.clone(), opts()).unwrap();
        let cfg = pool.journal().config();
        let tail = pool.journal().tail().0;
        let per_seg = cfg.k as u64 * cfg.chunk_size as u64;
        let range =
            pool.journal().chunk_range(tail / per_seg, ((tail % per_seg) / cfg.chunk_size as u64) as usize);
        let at = range.start + (tail % cfg.chunk_size as u64) as usize;
        let f0 = pool.region().fences();
        pool.tx(|tx| tx.write(ptrs[1], 0, &[0xAB; 100])).unwrap();
        (pool.region().fences() - f0, at)
    };
    let mut repaired = 0;
    // A cut at each fence of the overwrite, the journal's record bytes then damaged.
    for cut in 0..fences {
        let (mut pool, _) = Pool::open(base.clone(), opts()).unwrap();
        let f = pool.region().fences();
        pool.region_mut().arm_crash(CrashPoint::Fence(f + cut));
        let _ = pool.tx(|tx| tx.write(ptrs[1], 0, &[0xAB; 100]));
        let mut region = pool.into_region();
        region.crash(cut);
        region.corrupt(records, &[0x5A; 24]).unwrap();
        let (pool, report) = Pool::open(region, opts()).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        repaired += report.journal_repairs + report.journal.records_rebuilt_from_parity;
        let obj = pool.read(ptrs[1], 0, 100).unwrap();
        assert!(
            obj.iter().all(|&b| b == 1) || obj.iter().all(|&b| b == 0xAB),
            "cut {cut}: the object is neither its old bytes nor its new ones"
        );
    }
    assert!(repaired > 0, "no cut found the damaged records to rebuild ({fences} cuts)");
    eprintln!("journal wild writes: {fences} cuts, 24 bytes damaged each time; {repaired} records or chunks rebuilt from parity; 0 wrong objects");
}

/// A region that damages `len` bytes at `at` (durably, as a stray store or a failing cell
/// would) when the next fence is called after it is armed.
struct DamageAtFence {
    inner: CrashRegion,
    armed: Option<(usize, usize)>,
}

impl Region for DamageAtFence {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn bytes(&self) -> &[u8] {
        self.inner.bytes()
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), bitmend_media::pmem::RegionError> {
        self.inner.write(offset, data)
    }
    fn update(
        &mut self,
        offset: usize,
        len: usize,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), bitmend_media::pmem::RegionError> {
        self.inner.update(offset, len, f)
    }
    fn flush(&mut self, offset: usize, len: usize) -> Result<(), bitmend_media::pmem::RegionError> {
        self.inner.flush(offset, len)
    }
    fn fence(&mut self) -> Result<(), bitmend_media::pmem::RegionError> {
        self.inner.fence()?;
        if let Some((at, len)) = self.armed.take() {
            let flipped: Vec<u8> = self.inner.bytes()[at..at + len].iter().map(|b| !b).collect();
            self.inner.corrupt(at, &flipped)?;
        }
        Ok(())
    }
    fn line_writes(&self) -> &[u32] {
        self.inner.line_writes()
    }
    fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), bitmend_media::pmem::RegionError> {
        self.inner.corrupt(offset, data)
    }
}

#[test]
fn a_failed_transaction_rolls_back_from_its_undo_record_even_when_a_wild_write_hit_it() {
    // A transaction that fails undoes its writes in this process from its undo records, read
    // back from the journal (they are not kept in DRAM). A wild write into the record between
    // its fence and the rollback is rebuilt from the journal's parity: the object gets its
    // old bytes back, never other ones. 8 spots of the record damaged, 16 bytes each.
    // The same with an undo record of two ranges (a write of several: a put's index and
    // count), whose ranges both come back.
    let mut restored = 0;
    for several in [false, true] {
        for spot in 0..8usize {
            let (pool, ptrs) = objects(4);
            let mut region = DamageAtFence { inner: pool.into_region(), armed: None };
            let (mut pool, _) = Pool::open(&mut region, opts()).unwrap();
            let cfg = pool.journal().config();
            let tail = pool.journal().tail().0;
            let per_seg = cfg.k as u64 * cfg.chunk_size as u64;
            let chunk = pool
                .journal()
                .chunk_range(tail / per_seg, ((tail % per_seg) / cfg.chunk_size as u64) as usize);
            // The undo record goes at the tail: its header, the kind and id, then the ranges
            // (150 old bytes in all).
            let record = chunk.start + (tail % cfg.chunk_size as u64) as usize;
            pool.region_mut().armed = Some((record + 24 + spot * 16, 16));
            let r = pool.tx(|tx| {
                match several {
                    false => tx.write(ptrs[2], 10, &[0xEE; 150])?,
                    true => tx.write_several(&[(ptrs[2], 10, &[0xEE; 75]), (ptrs[3], 100, &[0xDD; 75])])?,
                }
                Err::<(), _>(HeapError::Full { len: 0 })
            });
            let at = format!("spot {spot}, several {several}");
            assert!(matches!(r, Err(HeapError::Full { .. })), "{at}: {r:?}");
            assert!(pool.region().armed.is_none(), "{at}: the damage was done");
            assert_eq!(pool.read(ptrs[2], 0, 200).unwrap(), &[2u8; 200], "{at}: the old bytes are back");
            assert_eq!(pool.read(ptrs[3], 0, 200).unwrap(), &[3u8; 200], "{at}: the old bytes are back");
            // The damage was found and the record's chunk rebuilt, not read past.
            assert_eq!(pool.journal().stats().repaired_data_chunks, 1, "{at}");
            restored += 1;
        }
    }
    eprintln!(
        "rollbacks from a damaged undo record (of one range, of two): {restored} of 16, 16 bytes damaged each time, all rebuilt"
    );
    assert_eq!(restored, 16);
}

#[test]
fn a_damaged_tree_node_is_an_error_for_reads_and_writes_never_a_panic_or_wrong_bytes() {
    use bitmend_heap::kv::Kv;
    // Two levels: an inner root over leaves. Its count, then a leaf's, set past what the
    // node holds (a wild write of two bytes): the node no longer reads as one.
    for target in ["inner root", "leaf"] {
        let mut pool = Pool::create(CrashRegion::new(4 << 20), opts()).unwrap();
        let kv = Kv::create(&mut pool).unwrap();
        for i in 0..200u32 {
            kv.put(&mut pool, format!("key{i:04}").as_bytes(), &[i as u8; 100]).unwrap();
        }
        let header = pool.root();
        let root = Ptr(u64::from_le_bytes(pool.read(header, 8, 8).unwrap().try_into().unwrap()));
        assert_eq!(pool.read(root, 0, 1).unwrap()[0], 4, "the root is a (slotted) inner node");
        let node = match target {
            "inner root" => root,
            _ => Ptr(u64::from_le_bytes(pool.read(root, 8, 8).unwrap().try_into().unwrap())),
        };
        pool.region_mut().corrupt(node.0 as usize + 2, &[0xFF, 0x7F]).unwrap();
        let corrupt = |r: Result<_, HeapError>| matches!(r, Err(HeapError::Corrupt { .. }));
        assert!(corrupt(kv.get(&pool, b"key0000").map(|_| ())), "{target}: get");
        assert!(corrupt(kv.put(&mut pool, b"key0000", b"new")), "{target}: put");
        assert!(kv.check(&pool).is_err(), "{target}: check names the damage");
        // A version 4 store counts its leaves: its length reads the damaged node too.
        assert!(corrupt(kv.len(&pool).map(|_| ())), "{target}: len");
    }
}
