//! `bitmend bench cache`: Loris's Table VI. What checking cached pages against their CRCs
//! costs: PostMark and a file-server-like mix, replayed on the flash file system with each
//! read strategy (every read, the last check a tick or a second ago, the last use a tick
//! ago), as run time against no read checks. No read checks still means Loris's baseline:
//! the cache holds every page's CRC, and dirty pages get theirs at the write.
//!
//! The chip is modelled with no timing, so the run time is the file system's CPU alone. That
//! is the worst case for the checks: on a real chip, device time dilutes them.
//! Beside each ratio: the share of page reads that computed a CRC (Loris's O%).

use std::time::{Duration, Instant};

use bitmend_flashfs::{Compression, Fs, FsConfig, FsOptions, Verify, TICK};
use bitmend_media::nand::{Geometry, RamNand, Timing};
use bitmend_media::rng::Rng;

use crate::harness::{median, Options, Row};
use crate::postmark::{self, Live, Op, Workload};

/// The largest file of the file-server mix, and so its body.
const SERVER_FILE: usize = 256 << 10;

/// A file-server-like mix (after filebench's fileserver): a pool of files of 16 to 256 KiB,
/// then operations that read a whole file (40%), append 16 KiB (30%), create a file (15%) or
/// delete one (15%).
fn fileserver(files: usize, ops: usize, seed: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let mut live = Live::default();
    let size = |rng: &mut Rng| (16 << 10) + rng.below((SERVER_FILE - (16 << 10)) as u64 / 2) as usize;
    let pool = (0..files).map(|_| live.create(size(&mut rng))).collect();
    let mut txns = Vec::with_capacity(ops);
    for _ in 0..ops {
        let roll = rng.below(100);
        let op = match roll {
            _ if live.ids.is_empty() || (70..85).contains(&roll) => {
                let len = size(&mut rng);
                live.create(len)
            }
            85.. if live.ids.len() > files / 2 => live.delete(&mut rng),
            40..70 => Op::Append(live.pick(&mut rng), 16 << 10),
            _ => Op::Read(live.pick(&mut rng)),
        };
        txns.push(op);
    }
    let finish = live.ids.into_iter().map(Op::Delete).collect();
    Workload { pool, txns, finish, transactions: ops }
}

/// One replay of `w` under `verify`: the run time of its transactions, and the share of page
/// reads that were checked.
fn replay(w: &Workload, body: &[u8], verify: Verify) -> (Duration, f64) {
    let opts =
        FsOptions { compression: Compression::Lz4, dirty_limit: 1 << 20, verify, ..FsOptions::default() };
    let nand = RamNand::new(Geometry::RCFFS).expect("geometry").with_timing(Timing::NONE);
    let mut fs = Fs::format(nand, FsConfig::default(), opts).expect("mkfs");
    let mut inos = postmark::Inos::new();
    w.pool.iter().for_each(|op| postmark::apply(&mut fs, &mut inos, op, body));
    fs.sync().expect("sync");
    let (before, _) = fs.cache_stats();
    let t = Instant::now();
    w.txns.iter().for_each(|op| postmark::apply(&mut fs, &mut inos, op, body));
    fs.sync().expect("sync");
    let took = t.elapsed();
    let (after, _) = fs.cache_stats();
    let reads = (after.reads - before.reads).max(1);
    (took, (after.checks - before.checks) as f64 * 100.0 / reads as f64)
}

/// The strategies of Table VI, the first the baseline the rest are measured against.
fn strategies() -> [(&'static str, Verify); 5] {
    [
        ("none", Verify::Background),
        ("ER (every read)", Verify::Every),
        ("LC (last check a tick ago)", Verify::AfterCheck(TICK)),
        ("LC (last check 1 s ago)", Verify::AfterCheck(Duration::from_secs(1))),
        ("LU (last use a tick ago)", Verify::AfterUse(TICK)),
    ]
}

pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let runs = if opts.quick { 1 } else { 5 };
    let (pm_files, pm_txns, fs_files, fs_ops) =
        if opts.quick { (200, 2_000, 20, 300) } else { (500, 20_000, 60, 3_000) };
    let mut body = vec![0u8; SERVER_FILE];
    // Half text, half noise, as the flash bench's files: some compress, some do not.
    Rng::new(12).fill(&mut body);
    for (i, c) in body.chunks_mut(4096).enumerate().filter(|(i, _)| i % 2 == 0) {
        c.iter_mut().enumerate().for_each(|(j, b)| *b = b"server log line "[(i + j) % 16]);
    }
    let workloads = [
        (format!("PostMark {pm_files} files / {pm_txns} txns"), postmark::workload(pm_files, pm_txns, 11)),
        (format!("file server {fs_files} files / {fs_ops} ops"), fileserver(fs_files, fs_ops, 13)),
    ];
    flip_rows(opts, &workloads[0], &body, emit);
    for (name, w) in &workloads {
        let modes = strategies();
        let mut times = vec![Vec::new(); modes.len()];
        let mut checked = vec![0.0; modes.len()];
        // Interleaved, so that a noisy moment on the machine falls on every strategy alike.
        for _ in 0..runs {
            for (i, (_, verify)) in modes.iter().enumerate() {
                let (t, share) = replay(w, &body, *verify);
                times[i].push(t.as_secs_f64() * 1e9 / w.transactions as f64);
                checked[i] = share;
            }
        }
        let none = median(&mut times[0]);
        for (i, (mode, _)) in modes.iter().enumerate().skip(1) {
            let ns = median(&mut times[i]);
            emit(
                Row::latency(
                    format!("{name}, read check {mode}: per op vs none"),
                    ns,
                    "no read check",
                    Some(none),
                )
                .in_bench("cache"),
            );
            emit(
                Row::shown(
                    format!("{name}, read check {mode}: page reads checked"),
                    checked[i],
                    "none",
                    Some(0.0),
                    "%",
                )
                .in_bench("cache"),
            );
        }
    }
}

/// Loris's Tables IV and V: bits flipped in cached pages during PostMark, the share each
/// strategy catches before the application reads them (see [`crate::cache_flips`]).
fn flip_rows(opts: &Options, (name, w): &(String, Workload), body: &[u8], emit: &mut dyn FnMut(Row)) {
    let every = if opts.quick { 5 } else { 10 };
    let outcomes: Vec<_> = strategies()
        .iter()
        .map(|(mode, v)| (*mode, crate::cache_flips::campaign(w, body, *v, every, 21)))
        .collect();
    let none = outcomes[0].1.protection();
    let case = format!("{name}, a bit flipped in a cached page every {every} ops");
    for (mode, o) in &outcomes {
        assert_eq!(o.wrong_from_flash, 0, "{mode}: a flipped page came back from flash as good");
        emit(
            Row::shown(
                format!("{case}, read check {mode}: caught before use"),
                o.protection(),
                "none",
                Some(none),
                "%",
            )
            .in_bench("cache"),
        );
        emit(
            Row::shown(
                format!("{case}, read check {mode}: flips injected / caught / read / discarded"),
                o.injected as f64,
                &format!("{} / {} / {}", o.detected, o.propagated, o.discarded),
                None,
                "flips",
            )
            .in_bench("cache"),
        );
    }
}
