//! Wild writes, as a stray store or a worn cell leaves them: into block headers (detected at
//! open, reported with the check that failed, the block quarantined, never handed out again,
//! its object an error rather than other bytes) and into the journal (rebuilt from its
//! parity, so a rollback still finds the old bytes).

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
    // Three faults: a flipped bit, another block's header copied over this one's, zeros.
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
            (header(ptrs[9]) as u64, HeaderFault::Misplaced),
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
