//! Small-file churn near full: fsync'd 4 KiB file creation at 95% of the capacity the file
//! system reports, beside the same at 50% (the bound: within 10x). Near full, every
//! new file needs the cleaner to free room, and the cleaner must do bounded work per
//! operation instead of thrashing.
//!
//! The chip is RCFFS's (128 MiB, 2 KiB pages) with its typical timing; device time is modelled
//! by the media layer, CPU is measured. Each operation removes a random file and creates a new
//! one of 4 KiB of random data with fsync, so the fill level stays where it was set.

use std::time::Instant;

use bitmend_flashfs::{Compression, Fs, FsConfig, FsOptions, ROOT};
use bitmend_media::nand::{Geometry, Nand, RamNand, Timing};
use bitmend_media::rng::Rng;

use crate::harness::flashfs_row;
use crate::harness::{Better, Options, Row};

/// Device and CPU time per operation (ms), and segments the cleaner emptied per operation.
struct Churn {
    device_ms: f64,
    cpu_ms: f64,
    cleaned: f64,
}

/// Fills a fresh file system to `fill` of its capacity with fsync'd 4 KiB files, then
/// measures `ops` remove + create + fsync operations.
fn churn(fill: f64, ops: usize, seed: u64) -> Churn {
    let nand = RamNand::new(Geometry::RCFFS).expect("geometry").with_timing(Timing::TYPICAL);
    let opts = FsOptions { compression: Compression::Lz4, ..FsOptions::default() };
    let mut fs = Fs::format(nand, FsConfig::default(), opts).expect("mkfs");
    let mut rng = Rng::new(seed);
    let mut page = vec![0u8; 4096];
    let mut names: Vec<String> = Vec::new();
    let mut create = |fs: &mut Fs<RamNand>, name: String, rng: &mut Rng| {
        rng.fill(&mut page);
        let f = fs.create(ROOT, name.as_bytes(), 0o644, 0, 0).expect("create");
        fs.write(f.ino, 0, &page).expect("write");
        fs.fsync(f.ino).expect("fsync");
        name
    };
    let (total, _) = fs.statfs();
    while fs.statfs().1 as f64 > total as f64 * (1.0 - fill) {
        let name = format!("f{}", names.len());
        names.push(create(&mut fs, name, &mut rng));
    }
    let before = fs.store().nand().counters();
    let cleaned = fs.stats().segments_cleaned;
    let cpu = Instant::now();
    for i in 0..ops {
        let k = rng.below(names.len() as u64) as usize;
        fs.unlink(ROOT, names[k].as_bytes()).expect("unlink");
        names[k] = create(&mut fs, format!("g{i}"), &mut rng);
    }
    let c = fs.store().nand().counters() - before;
    Churn {
        device_ms: c.device_ns as f64 / 1e6 / ops as f64,
        cpu_ms: cpu.elapsed().as_secs_f64() * 1e3 / ops as f64,
        cleaned: (fs.stats().segments_cleaned - cleaned) as f64 / ops as f64,
    }
}

/// The rows: at 95% beside 50%, device time, CPU, and cleaning per operation.
pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let ops = if opts.quick { 300 } else { 3000 };
    let half = churn(0.5, ops, 21);
    let full = churn(0.95, ops, 21);
    let case = |what: &str| format!("4 KiB file create + fsync, 95% full: {what}");
    emit(flashfs_row(
        case("device time per op"),
        full.device_ms,
        "the same at 50% full",
        half.device_ms,
        "ms",
        Better::Lower,
    ));
    emit(flashfs_row(
        case("CPU per op"),
        full.cpu_ms,
        "the same at 50% full",
        half.cpu_ms,
        "ms",
        Better::Lower,
    ));
    emit(flashfs_row(
        case("segments cleaned per op"),
        full.cleaned,
        "the same at 50% full",
        half.cleaned,
        "segments",
        Better::Lower,
    ));
}
