//! `bitmend bench cache`, the NVRAM tier's rows: synced random 4 KiB overwrites of a file,
//! with the tier (the mount's default: a 256 MiB file on /dev/shm, persisted by cache-line
//! write-back) against without it, on the modelled RCFFS chip with typical timing. Without
//! the tier each fsync writes to flash and closes a parity group early; with it, fsync
//! returns once the tier holds the change, and flash is written at the dirty limit in whole
//! groups.
//!
//! Reported: the CPU time of an fsync (median), the device time on the fsync path, the
//! synced overwrites per second of device time (the final write-back included), and the
//! flash write amplification. And the tier's own cost for a 1 MiB write (what a request
//! pays before its answer through the mount), beside streaming the same MiB into the same
//! kind of region and fencing once: the floor any durable copy pays.

use std::time::Instant;

use bitmend_flashfs::{Compression, Fs, FsConfig, FsOptions, ROOT};
use bitmend_media::nand::{Geometry, Nand, RamNand, Timing};
use bitmend_media::pmem::{MmapRegion, Persistence, RamRegion, Region};
use bitmend_media::rng::Rng;
use bitmend_tier::{DirtyTier, PagePut};

use crate::harness::{median, shm_region, Better, LineCounts, Options, Row};

/// What one run of synced overwrites measured.
struct Synced {
    fsync_cpu_ns: Vec<f64>,
    write_cpu_ns: Vec<f64>,
    /// Device time spent inside fsync calls, in all.
    fsync_device_ns: u64,
    /// Device time and bytes programmed over the overwrites and the final sync.
    device_ns: u64,
    programmed: u64,
}

/// A file of `mb` MiB written and synced, then `n` random 4 KiB overwrites each followed by
/// fsync, then a sync (what the tier held goes to flash too).
fn overwrites(fs: &mut Fs<RamNand>, mb: usize, n: usize, seed: u64) -> Synced {
    let mut rng = Rng::new(seed);
    let f = fs.create(ROOT, b"big", 0o644, 0, 0).expect("create");
    let mut chunk = vec![0u8; 1 << 20];
    for i in 0..mb {
        rng.fill(&mut chunk);
        fs.write(f.ino, (i << 20) as u64, &chunk).expect("write");
    }
    fs.sync().expect("sync");
    let before = fs.store().nand().counters();
    let mut out = Synced {
        fsync_cpu_ns: Vec::with_capacity(n),
        write_cpu_ns: Vec::with_capacity(n),
        fsync_device_ns: 0,
        device_ns: 0,
        programmed: 0,
    };
    let mut page = vec![0u8; 4096];
    for _ in 0..n {
        rng.fill(&mut page);
        let at = rng.below((mb << 20) as u64 / 4096) * 4096;
        let t = Instant::now();
        fs.write(f.ino, at, &page).expect("overwrite");
        out.write_cpu_ns.push(t.elapsed().as_nanos() as f64);
        let d = fs.store().nand().counters();
        let t = Instant::now();
        fs.fsync(f.ino).expect("fsync");
        out.fsync_cpu_ns.push(t.elapsed().as_nanos() as f64);
        out.fsync_device_ns += (fs.store().nand().counters() - d).device_ns;
    }
    fs.sync().expect("the final sync");
    let c = fs.store().nand().counters() - before;
    (out.device_ns, out.programmed) = (c.device_ns, c.bytes_programmed);
    out
}

fn fresh_fs() -> Fs<RamNand> {
    let opts = FsOptions { compression: Compression::None, ..FsOptions::default() };
    Fs::format(
        RamNand::new(Geometry::RCFFS).expect("geometry").with_timing(Timing::TYPICAL),
        FsConfig::default(),
        opts,
    )
    .expect("mkfs")
}

/// The tier as the mount makes it: a 256 MiB file on /dev/shm, the log in its first 16 MiB,
/// persisted by cache-line write-back ([`shm_regions`]); else (no /dev/shm) in RAM. Returns
/// where it is.
fn attach_tier(fs: &mut Fs<RamNand>) -> &'static str {
    const SIZE: usize = 256 << 20;
    const LOG: usize = 16 << 20;
    let id = fs.store().fs_id();
    if let Some((log, heap)) = shm_regions(SIZE) {
        fs.attach_dirty_state(Box::new(DirtyTier::create_for(log, heap, id).expect("tier")));
        return "a 256 MiB file on /dev/shm";
    }
    let (log, heap) = (RamRegion::new(LOG), RamRegion::new(SIZE - LOG));
    fs.attach_dirty_state(Box::new(DirtyTier::create_for(log, heap, id).expect("tier")));
    "RAM (no /dev/shm)"
}

fn tier_row(case: &str, ours: f64, anchor: f64, unit: &'static str, better: Better) -> Row {
    Row {
        bench: "cache",
        case: case.into(),
        ours,
        anchor: "no NVRAM tier".into(),
        anchor_value: Some(anchor),
        unit,
        better,
    }
}

/// Regions of a tier in a file on /dev/shm as the mount makes them (`size` bytes, the log in
/// the first 16 MiB, every page touched), or `None` without /dev/shm. The file is removed at
/// once: the mapping keeps it.
fn shm_regions(size: usize) -> Option<(MmapRegion, MmapRegion)> {
    let path = std::path::PathBuf::from(format!("/dev/shm/bitmend-bench-tier-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let (log, heap) = MmapRegion::create_split(&path, size, 16 << 20).ok()?;
    let _ = std::fs::remove_file(&path);
    let p = Persistence::CacheLineFlush;
    let (mut log, mut heap) = (log.with_persistence(p), heap.with_persistence(p));
    log.prefault();
    heap.prefault();
    Some((log, heap))
}

/// A 1 MiB write's 256 pages put in the tier (a checkout after every second write, as the
/// mount's checkpoints come about every 0.5-2 MiB of log), against 256 streaming stores of
/// 4 KiB into a region of the same kind and one fence. Microseconds per write, medians.
fn put_row(opts: &Options) -> Option<Row> {
    let writes = if opts.quick { 64 } else { 512 };
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(0x9E37_79B9) >> 13) as u8).collect();
    let crcs: Vec<u32> = data.chunks(4096).map(bitmend_code::crc::crc32c).collect();
    let (log, heap) = shm_regions(256 << 20)?;
    let mut tier = DirtyTier::create(log, heap).expect("tier");
    let mut put = Vec::with_capacity(writes);
    for w in 0..writes as u64 {
        let pages: Vec<PagePut<'_>> = (0..256)
            .map(|i| PagePut {
                key: (7, (w % 32) * 256 + i as u64),
                page: &data[i * 4096..(i + 1) * 4096],
                crc: crcs[i],
                changed: 0..4096,
            })
            .collect();
        let t = Instant::now();
        tier.put_pages(&pages).expect("put");
        put.push(t.elapsed().as_nanos() as f64 / 1e3);
        if w % 2 == 1 {
            tier.checkout().expect("checkout");
        }
    }
    drop(tier);
    let path = std::path::PathBuf::from(format!("/dev/shm/bitmend-bench-floor-{}", std::process::id()));
    let mut region = shm_region(&path, 64 << 20, LineCounts::Timed);
    let _ = std::fs::remove_file(&path);
    let mut floor = Vec::with_capacity(writes);
    for w in 0..writes {
        let at = 4096 + (w % 32) * (1 << 20);
        let t = Instant::now();
        for (i, page) in data.chunks(4096).enumerate() {
            region.write_streaming(at + i * 4096, page).expect("stream");
        }
        region.fence().expect("fence");
        floor.push(t.elapsed().as_nanos() as f64 / 1e3);
    }
    Some(Row {
        bench: "cache",
        case: "NVRAM tier: a 1 MiB write's 256 pages put (run objects, a checkout every 2 MiB)".into(),
        ours: median(&mut put),
        anchor: "1 MiB streamed into the region, one fence".into(),
        anchor_value: Some(median(&mut floor)),
        unit: "us",
        better: Better::Lower,
    })
}

pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    if let Some(row) = put_row(opts) {
        emit(row);
    }
    let (mb, n) = if opts.quick { (4, 300) } else { (16, 3_000) };
    let plain = overwrites(&mut fresh_fs(), mb, n, 21);
    let mut fs = fresh_fs();
    let place = attach_tier(&mut fs);
    let tiered = overwrites(&mut fs, mb, n, 21);
    drop(fs);
    let (mut a, mut b) = (plain, tiered);
    let case =
        |what: &str| format!("{n} random 4 KiB overwrites + fsync ({mb} MiB file; tier in {place}): {what}");
    emit(tier_row(
        &case("fsync CPU, median"),
        median(&mut b.fsync_cpu_ns) / 1e3,
        median(&mut a.fsync_cpu_ns) / 1e3,
        "us",
        Better::Lower,
    ));
    // The work fsync no longer does moved into the write: the pair is what a synced write
    // costs.
    let pair =
        |s: &Synced| s.write_cpu_ns.iter().zip(&s.fsync_cpu_ns).map(|(w, f)| w + f).collect::<Vec<f64>>();
    emit(tier_row(
        &case("write + fsync CPU, median"),
        median(&mut pair(&b)) / 1e3,
        median(&mut pair(&a)) / 1e3,
        "us",
        Better::Lower,
    ));
    emit(Row {
        better: Better::Neither,
        ..tier_row(
            &case("device time on the fsync path, per fsync"),
            b.fsync_device_ns as f64 / n as f64 / 1e3,
            a.fsync_device_ns as f64 / n as f64 / 1e3,
            "us",
            Better::Lower,
        )
    });
    emit(tier_row(
        &case("synced overwrites per second of device time (final write-back included)"),
        n as f64 * 1e9 / b.device_ns.max(1) as f64,
        n as f64 * 1e9 / a.device_ns.max(1) as f64,
        "ops/s",
        Better::Higher,
    ));
    emit(tier_row(
        &case("flash write amplification"),
        b.programmed as f64 / (n as f64 * 4096.0),
        a.programmed as f64 / (n as f64 * 4096.0),
        "x",
        Better::Lower,
    ));
}
