//! `bitmend bench heap`, the allocation trace (NVMalloc's): 10,000 live objects of 10 B to
//! 4 KiB, then operations that are half allocations and half frees of random live objects,
//! the same trace for every contender:
//! - the heap, two ways: `alloc_into` a slot of a root array and `free_from` it (atomic, no
//!   journal record: the block's header is linked to the slot), and each operation a
//!   transaction that allocates a block and sets the slot (or frees one and clears it);
//!   either way a crash leaks nothing;
//! - PMDK: `pmemobj_alloc` into a slot of its root object, `pmemobj_free` of one (its
//!   allocations are linked atomically too);
//! - glibc malloc on DRAM, for scale (not persistent).
//!
//! Wear: writes per 64-byte line during the trace, ours from the region's counters, PMDK's
//! from its calls into libpmem (interposed, see `bitmend_anchors::pmem_count`).

use std::path::PathBuf;
use std::time::Instant;

use bitmend_anchors::{pmdk, pmem_count};
use bitmend_heap::{Pool, PoolOptions, Ptr};
use bitmend_media::pmem::{MmapRegion, Region};
use bitmend_media::rng::Rng;

use crate::harness::{median, shm_region, LineCounts, Options, Row};

/// Objects live when the trace starts.
const LIVE: usize = 10_000;
/// Slots of the root arrays: room for the live count to wander.
const SLOTS: usize = 4 * LIVE;

#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc { slot: usize, size: usize },
    Free { slot: usize },
}

/// The trace: `LIVE` allocations, then `ops` operations, each an allocation (10 B..4 KiB)
/// or a free of a random live object with equal odds.
fn trace(ops: usize) -> (Vec<Op>, Vec<Op>) {
    let mut rng = Rng::new(0x5EED);
    let mut free: Vec<usize> = (0..SLOTS).rev().collect();
    let mut live: Vec<usize> = Vec::new();
    let alloc = |rng: &mut Rng, free: &mut Vec<usize>, live: &mut Vec<usize>| {
        let slot = free.pop().expect("a free slot");
        live.push(slot);
        Op::Alloc { slot, size: 10 + rng.below(4096 - 10 + 1) as usize }
    };
    let setup = (0..LIVE).map(|_| alloc(&mut rng, &mut free, &mut live)).collect();
    let mut run = Vec::with_capacity(ops);
    for _ in 0..ops {
        if rng.below(2) == 0 && !free.is_empty() || live.is_empty() {
            run.push(alloc(&mut rng, &mut free, &mut live));
        } else {
            let slot = live.swap_remove(rng.below(live.len() as u64) as usize);
            free.push(slot);
            run.push(Op::Free { slot });
        }
    }
    (setup, run)
}

fn shm(what: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/bitmend-bench-alloc-{what}-{}", std::process::id()))
}

/// The heap side: a pool with a root array of `SLOTS` pointer slots.
struct Heap {
    pool: Pool<MmapRegion>,
    root: Ptr,
    path: PathBuf,
}

impl Heap {
    fn new(len: usize, lines: LineCounts) -> Heap {
        let path = shm("heap");
        let mut pool = Pool::create(shm_region(&path, len, lines), PoolOptions::default()).expect("pool");
        let root = pool
            .tx(|tx| {
                let root = tx.alloc(8 * SLOTS as u64)?;
                tx.write(root, 0, &vec![0; 8 * SLOTS])?;
                let slot = tx.root_slot();
                tx.set(slot, root)?;
                Ok(root)
            })
            .expect("root array");
        Heap { pool, root, path }
    }

    /// The operation as PMDK's atomic calls make it: into the slot, from the slot.
    fn apply(&mut self, op: Op) {
        let slot = |pool: &Pool<MmapRegion>, s: usize| pool.slot(self.root, 8 * s as u64).expect("a slot");
        match op {
            Op::Alloc { slot: s, size } => self.pool.alloc_into(slot(&self.pool, s), size as u64).map(|_| ()),
            Op::Free { slot: s } => self.pool.free_from(slot(&self.pool, s)),
        }
        .expect("heap operation");
    }

    /// The operation as a transaction.
    fn apply_tx(&mut self, op: Op) {
        let root = self.root;
        self.pool
            .tx(|tx| match op {
                Op::Alloc { slot, size } => {
                    let p = tx.alloc(size as u64)?;
                    let s = tx.slot(root, 8 * slot as u64)?;
                    tx.set(s, p)
                }
                Op::Free { slot } => {
                    let s = tx.slot(root, 8 * slot as u64)?;
                    let p = tx.get(s);
                    tx.free(p)?;
                    tx.set(s, Ptr::NULL)
                }
            })
            .expect("heap operation");
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn pmdk_apply(p: &mut pmdk::Pool, op: Op) {
    match op {
        Op::Alloc { slot, size } => p.alloc_into(slot, size),
        Op::Free { slot } => p.free_slot(slot),
    }
    .expect("pmdk operation");
}

/// glibc malloc and free through Rust's system allocator (capacity only: nothing touched).
fn malloc_run(setup: &[Op], run: &[Op]) -> f64 {
    let mut slots: Vec<Option<Vec<u8>>> = (0..SLOTS).map(|_| None).collect();
    let mut apply = |op: Op| match op {
        Op::Alloc { slot, size } => slots[slot] = Some(crate::harness::keep(Vec::with_capacity(size))),
        Op::Free { slot } => slots[slot] = None,
    };
    setup.iter().for_each(|&op| apply(op));
    let t = Instant::now();
    run.iter().for_each(|&op| apply(op));
    t.elapsed().as_secs_f64() * 1e9 / run.len() as f64
}

/// Writes per line made during `f`: the counters after minus before, lines written only.
fn line_writes_during(before: &[u32], after: &[u32]) -> Vec<u32> {
    after.iter().zip(before).map(|(a, b)| a - b).filter(|&d| d > 0).collect()
}

/// Shares of written lines by writes per line: bucket i holds lines written 2^i to 2^(i+1)-1
/// times.
fn buckets(lines: &[u32]) -> Vec<u64> {
    let mut h = vec![0u64; 1 + lines.iter().map(|&c| c.ilog2() as usize).max().unwrap_or(0)];
    for &c in lines {
        h[c.ilog2() as usize] += 1;
    }
    h
}

/// What one contender's run measured.
#[derive(Default)]
struct Measured {
    ns: Vec<f64>,
    /// Ours: as transactions.
    tx_ns: Vec<f64>,
    lines: Vec<u32>,
}

/// Which of the heap's ways a run takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Atomic,
    Transactions,
}

/// Runs the trace on each contender, `runs` times, and emits the rows.
pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let (ops, runs) = if opts.quick { (20_000, 1) } else { (200_000, 3) };
    let (setup, trace) = trace(ops);
    let (mut ours, mut anchor, mut malloc) = (Measured::default(), Measured::default(), Vec::new());
    for _ in 0..runs {
        ours.ns.push(heap_run(&setup, &trace, opts, LineCounts::Timed, Way::Atomic).0);
        ours.tx_ns.push(heap_run(&setup, &trace, opts, LineCounts::Timed, Way::Transactions).0);
        let path = shm("pmdk");
        let _ = std::fs::remove_file(&path);
        if let Some(Ok(mut p)) = pmdk::Pool::create(&path, 1 << 30, 16 * SLOTS) {
            setup.iter().for_each(|&op| pmdk_apply(&mut p, op));
            let t = Instant::now();
            trace.iter().for_each(|&op| pmdk_apply(&mut p, op));
            anchor.ns.push(t.elapsed().as_secs_f64() * 1e9 / ops as f64);
        }
        if anchor.lines.is_empty() {
            anchor.lines = pmdk_counted(&setup, &trace);
        }
        malloc.push(malloc_run(&setup, &trace));
    }
    ours.lines = heap_run(&setup, &trace, opts, LineCounts::Counted, Way::Atomic).1;
    emit_rows(ops, &mut ours, &mut anchor, &mut malloc, emit);
}

/// Ns per operation of the trace on the heap, and the line writes it made (counted runs).
fn heap_run(setup: &[Op], trace: &[Op], opts: &Options, lines: LineCounts, way: Way) -> (f64, Vec<u32>) {
    // Every block freed during the trace cools for 0.2 s: the pool holds them all.
    let mut heap = Heap::new(if opts.quick { 256 << 20 } else { 1 << 30 }, lines);
    let apply = match way {
        Way::Atomic => Heap::apply,
        Way::Transactions => Heap::apply_tx,
    };
    setup.iter().for_each(|&op| apply(&mut heap, op));
    // The setup's last transaction vouches for its bytes until the journal moves on.
    heap.pool.checkout().expect("checkout");
    let before = heap.pool.region().line_writes().to_vec();
    let t = Instant::now();
    trace.iter().for_each(|&op| apply(&mut heap, op));
    let ns = t.elapsed().as_secs_f64() * 1e9 / trace.len() as f64;
    (ns, line_writes_during(&before, heap.pool.region().line_writes()))
}

/// PMDK's line writes over the trace, in a pool of its own (counting costs time: the timed
/// runs do not count). Empty when PMDK is not linked or its calls are not interposed.
fn pmdk_counted(setup: &[Op], trace: &[Op]) -> Vec<u32> {
    let path = shm("pmdk-counted");
    let _ = std::fs::remove_file(&path);
    let Some(Ok(mut p)) = pmdk::Pool::create(&path, 1 << 30, 16 * SLOTS) else { return Vec::new() };
    setup.iter().for_each(|&op| pmdk_apply(&mut p, op));
    let (base, len) = p.mapping();
    pmem_count::watch(base, len);
    trace.iter().for_each(|&op| pmdk_apply(&mut p, op));
    let lines = pmem_count::take();
    if pmem_count::interposed() {
        lines
    } else {
        Vec::new()
    }
}

fn emit_rows(
    ops: usize,
    ours: &mut Measured,
    anchor: &mut Measured,
    malloc: &mut [f64],
    emit: &mut dyn FnMut(Row),
) {
    let pmdk_ns = (!anchor.ns.is_empty()).then(|| median(&mut anchor.ns));
    let ns = median(&mut ours.ns);
    let case = "alloc trace: ns per alloc_into or free_from a slot";
    emit(Row::latency(format!("{case} vs pmdk"), ns, "pmemobj_alloc/free", pmdk_ns).in_bench("heap"));
    let tx_ns = median(&mut ours.tx_ns);
    emit(
        Row::latency(
            "alloc trace: ns per transaction allocating and setting a slot (or freeing and clearing)".into(),
            tx_ns,
            "pmemobj_alloc/free",
            pmdk_ns,
        )
        .in_bench("heap"),
    );
    emit(
        Row::latency(format!("{case} vs malloc"), ns, "glibc malloc (DRAM)", Some(median(malloc)))
            .in_bench("heap"),
    );
    let counted = !anchor.lines.is_empty();
    let per_op = |lines: &[u32]| lines.iter().map(|&c| c as f64).sum::<f64>() / ops as f64;
    let hottest = |lines: &[u32]| lines.iter().copied().max().unwrap_or(0) as f64;
    let pmdk_lines = counted.then(|| per_op(&anchor.lines));
    emit(
        Row::count(
            "alloc trace: line writes per alloc_into or free_from",
            per_op(&ours.lines),
            "pmdk",
            pmdk_lines,
        )
        .in_bench("heap"),
    );
    let pmdk_hot = counted.then(|| hottest(&anchor.lines));
    emit(
        Row::count("alloc trace: writes to the hottest line", hottest(&ours.lines), "pmdk", pmdk_hot)
            .in_bench("heap"),
    );
    let (a, b) = (buckets(&ours.lines), buckets(&anchor.lines));
    let (sa, sb) = (ours.lines.len().max(1) as f64, anchor.lines.len().max(1) as f64);
    for i in 0..a.len().max(b.len()) {
        let share = |h: &[u64], total: f64| 100.0 * h.get(i).copied().unwrap_or(0) as f64 / total;
        let case =
            format!("alloc trace: % of written lines written {}..{} times", 1u64 << i, (2u64 << i) - 1);
        emit(Row::shown(case, share(&a, sa), "pmdk", counted.then(|| share(&b, sb)), "%").in_bench("heap"));
    }
}
