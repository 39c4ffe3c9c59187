//! `bitmend bench flashfs`: the flash file system on a RAM NAND chip with RCFFS's geometry
//! (128 MiB, 2 KiB pages, 64 B spare, 128 KiB blocks) and a typical chip's timing. Every
//! figure is modelled device time from the media layer's timing model unless it says CPU.
//!
//! The page store and the file system are measured against the raw chip's own limit (what
//! programming or reading the same data pages with no file system at all would take) and the
//! RCFFS paper's figures; the file system against littlefs (the littlefs2 crate, see
//! [`crate::littlefs`]) replaying the same operations on the same simulated chip.
//!
//! littlefs is configured as its authors advise for NAND: one littlefs block per erase block
//! (128 KiB), a page as read and program unit. Its costs here are its design's on large
//! blocks, not a misconfiguration: a metadata pair is a log that is scanned from its start on
//! every fetch (up to 64 page reads), each file takes at least one whole block, and a write in
//! the middle of a file rewrites the file from there to its end (its CTZ skip list points
//! backwards). The rows on pages read and flash programmed show where the time goes.

use std::time::Instant;

use bitmend_flashfs::{FsConfig, PageAddr, PageStore};
use bitmend_media::nand::{Counters, FaultyNand, Geometry, Nand, RamNand, Timing};
use bitmend_media::rng::Rng;

use crate::harness::{flashfs_row, Better, Options, Row};

fn mb_per_s(bytes: u64, ns: u64) -> f64 {
    bytes as f64 * 1e3 / ns.max(1) as f64
}

/// The raw chip's time to write one page with no file system: program it (data and spare
/// transferred) and its share of the block's erase.
fn raw_write_page_ns(g: Geometry, t: Timing) -> f64 {
    t.program_ns as f64
        + g.raw_page_size() as f64 * t.transfer_ns_per_byte
        + t.erase_ns as f64 / g.pages_per_block as f64
}

/// Runs every case, calling `emit` with each row as soon as it is measured.
pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let g = Geometry::RCFFS;
    let t = Timing::TYPICAL;
    let ps = g.page_size as u64;
    let pages: u64 = if opts.quick { 1024 } else { 8192 }; // 2 or 16 MiB
    let cfg = FsConfig::default();
    let mut rng = Rng::new(1);
    let mut data = vec![0u8; ps as usize];

    // Sequential write, then read, of `pages` pages.
    let mut store = PageStore::format(RamNand::new(g).expect("geometry"), cfg).expect("format");
    let before = store.nand().counters();
    let cpu = Instant::now();
    let mut addrs = Vec::with_capacity(pages as usize);
    for _ in 0..pages {
        rng.fill(&mut data);
        addrs.push(store.append(&data).expect("append"));
    }
    store.sync().expect("sync");
    let cpu_ns = cpu.elapsed().as_nanos() as f64;
    let w = store.nand().counters() - before;
    let raw_write_ns = raw_write_page_ns(g, t);
    let raw_write = ps as f64 * 1e3 / raw_write_ns;
    let size = format!("{} MiB", (pages * ps) >> 20);
    emit(flashfs_row(
        format!("page store sequential write {size} (p=1, s=1)"),
        mb_per_s(pages * ps, w.device_ns),
        "raw chip",
        raw_write,
        "MB/s",
        Better::Higher,
    ));
    emit(flashfs_row(
        format!("page store write amplification {size}"),
        w.bytes_programmed as f64 / (pages * ps) as f64,
        "raw chip (data+spare)",
        g.raw_page_size() as f64 / ps as f64,
        "x",
        Better::Lower,
    ));
    emit(flashfs_row(
        format!("page store write CPU per page {size}"),
        cpu_ns / pages as f64,
        "chip program time",
        t.program_ns as f64,
        "ns",
        Better::Lower,
    ));

    let before = store.nand().counters();
    let cpu = Instant::now();
    for a in &addrs {
        store.read(*a, &mut data).expect("read");
    }
    let cpu_ns = cpu.elapsed().as_nanos() as f64;
    let r = store.nand().counters() - before;
    let raw_read = ps as f64 * 1e3 / (t.read_ns as f64 + g.raw_page_size() as f64 * t.transfer_ns_per_byte);
    emit(flashfs_row(
        format!("page store sequential read {size} (verified)"),
        mb_per_s(pages * ps, r.device_ns),
        "raw chip",
        raw_read,
        "MB/s",
        Better::Higher,
    ));
    emit(flashfs_row(
        format!("page store read CPU per page {size} (signature check)"),
        cpu_ns / pages as f64,
        "chip read time",
        t.read_ns as f64,
        "ns",
        Better::Lower,
    ));

    // Sync cost: pages written per sync when syncing after every page.
    let mut store = PageStore::format(RamNand::new(g).expect("geometry"), cfg).expect("format");
    let before = store.nand().counters();
    let n = 512;
    for _ in 0..n {
        store.append(&data).expect("append");
        store.sync().expect("sync");
    }
    let c = store.nand().counters() - before;
    emit(flashfs_row(
        "page store append+sync, device time per synced page".into(),
        c.device_ns as f64 / n as f64 / 1e3,
        "raw chip program",
        raw_write_ns / 1e3,
        "us",
        Better::Lower,
    ));

    repair(opts, emit);
    mount(opts, emit);
    crate::scale::scale(opts, emit);
    crate::namespace::run(opts, emit);
    run_fs(opts, emit);
    crate::near_full::run(opts, emit);
    postmark(opts, emit);
    codecs(opts, emit);
}

/// Time to rebuild one page from its group and from its segment (CPU, and modelled device
/// time of the reads the repair needs). The seed: 24.7 ms and 57 ms.
fn repair(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let g = Geometry::RCFFS;
    let nand = FaultyNand::new(RamNand::new(g).expect("geometry"), 7);
    let mut store = PageStore::format(nand, FsConfig::default()).expect("format");
    let mut data = vec![0u8; g.page_size as usize];
    let mut rng = Rng::new(2);
    // Two sealed segments' worth of pages.
    let n = 2 * 15 * 63;
    let addrs: Vec<PageAddr> = (0..n)
        .map(|_| {
            rng.fill(&mut data);
            store.append(&data).expect("append")
        })
        .collect();
    store.sync().expect("sync");
    let samples = if opts.quick { 3 } else { 9 };
    for (how, per_case) in [("group", 1usize), ("segment", 2usize)] {
        let mut cpu = Vec::new();
        let mut dev = Vec::new();
        for s in 0..samples {
            // A distinct block and page index each sample (a read repairs without rewriting, so
            // damage must not pile up in one group or one stripe); the group case in the first
            // segment, the segment case in the second.
            let segment = if how == "group" { 0 } else { 15 * 63 };
            let base = segment + s * 63 + 2 * s;
            for d in 0..per_case {
                store.nand_mut().lose_page(addrs[base + d].0).expect("inject");
            }
            let before: Counters = store.nand().counters();
            let t = Instant::now();
            store.read(addrs[base], &mut data).expect("repair");
            cpu.push(t.elapsed().as_nanos() as f64 / 1e6);
            dev.push((store.nand().counters() - before).device_ns as f64 / 1e6);
        }
        cpu.sort_by(|a, b| a.total_cmp(b));
        dev.sort_by(|a, b| a.total_cmp(b));
        let seed = if how == "group" { 24.7 } else { 57.0 };
        emit(flashfs_row(
            format!("repair one page from {how} parity, CPU"),
            cpu[cpu.len() / 2],
            "RCFFS paper",
            seed,
            "ms",
            Better::Lower,
        ));
        emit(flashfs_row(
            format!("repair one page from {how} parity, device reads"),
            dev[dev.len() / 2],
            "RCFFS paper",
            seed,
            "ms",
            Better::Lower,
        ));
    }
}

/// Mount time of the file system until the first write can proceed (modelled device time
/// plus CPU) at 128 MiB and 1 GiB, holding the same files (a 16 MiB file and 200 small ones),
/// after a clean unmount and after a power cut in the middle of synced 4 KiB overwrites. The
/// seed: under 40 ms, whatever the chip's size.
fn mount(opts: &Options, emit: &mut dyn FnMut(Row)) {
    use bitmend_flashfs::{Compression, Fs, FsOptions, ROOT};
    let sizes: &[(u32, &str)] = &[(1024, "128 MiB"), (8192, "1 GiB")];
    let fsopts = FsOptions { compression: Compression::Lz4, dirty_limit: 1 << 20, ..FsOptions::default() };
    let big = if opts.quick { 2 << 20 } else { 16 << 20 };
    let mut rng = Rng::new(5);
    for &(blocks, name) in sizes {
        let g = Geometry::new(2048, 64, 64, blocks).expect("geometry");
        let nand = FaultyNand::new(RamNand::new(g).expect("geometry"), 3);
        let mut fs = Fs::format(nand, FsConfig::default(), fsopts).expect("mkfs");
        let mut data = vec![0u8; big];
        rng.fill(&mut data);
        let f = fs.create(ROOT, b"big", 0o644, 0, 0).expect("create");
        fs.write(f.ino, 0, &data).expect("write");
        for i in 0..200 {
            let s = fs.create(ROOT, format!("small{i}").as_bytes(), 0o644, 0, 0).expect("create");
            fs.write(s.ino, 0, &data[i * 5000..(i + 1) * 5000]).expect("write");
        }
        let nand = fs.unmount().expect("unmount");
        let timed = |nand: FaultyNand<RamNand>| {
            let before = nand.counters();
            let t = Instant::now();
            let (fs, report) = Fs::open(nand, fsopts).expect("mount");
            let cpu = t.elapsed().as_secs_f64() * 1e3;
            let c = fs.store().nand().counters() - before;
            (fs, report, c.device_ns as f64 / 1e6 + cpu, c.reads)
        };
        let (mut fs, report, ms, reads) = timed(nand);
        assert!(!report.store.scanned, "mounted by the anchor chain");
        emit(flashfs_row(
            format!("mount {name} clean, device + CPU"),
            ms,
            "RCFFS paper",
            40.0,
            "ms",
            Better::Lower,
        ));
        emit(flashfs_row(
            format!("mount {name} clean: pages read"),
            reads as f64,
            "pages readable in 40 ms",
            40.0 / 0.078,
            "pages",
            Better::Lower,
        ));
        // Synced overwrites, with a power cut a few thousand operations in.
        let page = vec![0x77u8; 4096];
        let ops = fs.store().nand().ops();
        fs.store_mut().nand_mut().cut_power_at(ops + 2000 + rng.below(1000));
        let mut i = 0u64;
        while fs.write(f.ino, (i * 7919 * 4096) % big as u64, &page).and_then(|_| fs.fsync(f.ino)).is_ok() {
            i += 1;
        }
        let mut nand = fs.into_nand();
        nand.power_on();
        let (_, report, ms, reads) = timed(nand);
        assert!(!report.store.scanned, "mounted by the anchor chain");
        emit(flashfs_row(
            format!("mount {name} after a power cut, device + CPU"),
            ms,
            "RCFFS paper",
            40.0,
            "ms",
            Better::Lower,
        ));
        emit(flashfs_row(
            format!("mount {name} after a power cut: pages read"),
            reads as f64,
            "pages readable in 40 ms",
            40.0 / 0.078,
            "pages",
            Better::Lower,
        ));
    }
}

/// The file system itself, on the RCFFS chip: the seed's small-file test, a large file
/// written and read, random overwrites with fsync, and mount time. The anchor is the raw
/// chip doing only the data's own page programs and reads.
pub fn run_fs(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let mut rng = Rng::new(9);
    fs_small_files(opts, &mut rng, emit);
    let (fs, mb, page) = fs_one_file(opts, &mut rng, emit);
    fs_mount_times(fs, mb, &page, emit);
}

/// The chip's typical device times per page program and page read, transfer included.
fn page_times() -> (f64, f64) {
    let (g, t) = (Geometry::RCFFS, Timing::TYPICAL);
    let transfer = g.raw_page_size() as f64 * t.transfer_ns_per_byte;
    (t.program_ns as f64 + transfer, t.read_ns as f64 + transfer)
}

fn fs_options() -> bitmend_flashfs::FsOptions {
    use bitmend_flashfs::{Compression, FsOptions};
    FsOptions { compression: Compression::Lz4, dirty_limit: 1 << 20, ..FsOptions::default() }
}

/// The seed's small-file test: 1000 copies of a 5 KiB incompressible file in one directory.
fn fs_small_files(opts: &Options, rng: &mut Rng, emit: &mut dyn FnMut(Row)) {
    use bitmend_flashfs::{Fs, ROOT};
    let g = Geometry::RCFFS;
    let (prog_page_ns, _) = page_times();
    let fsopts = fs_options();
    let files = if opts.quick { 200 } else { 1000 };
    let mut fs = Fs::format(RamNand::new(g).expect("geometry"), FsConfig::default(), fsopts).expect("mkfs");
    let mut five = vec![0u8; 5120];
    rng.fill(&mut five);
    let before = fs.store().nand().counters();
    let cpu = Instant::now();
    for i in 0..files {
        let f = fs.create(ROOT, format!("copy{i}").as_bytes(), 0o644, 0, 0).expect("create");
        fs.write(f.ino, 0, &five).expect("write");
    }
    fs.sync().expect("sync");
    let cpu_ms = cpu.elapsed().as_secs_f64() * 1e3 / files as f64;
    let c = fs.store().nand().counters() - before;
    let raw_ms = 3.0 * prog_page_ns / 1e6; // 5 KiB = 3 pages of data, nothing else
    emit(flashfs_row(
        format!("{files} x 5 KiB files: device time per file"),
        c.device_ns as f64 / 1e6 / files as f64,
        "raw chip (3 data pages)",
        raw_ms,
        "ms",
        Better::Lower,
    ));
    let lfs = crate::littlefs::small_files(files, &five);
    emit(flashfs_row(
        format!("{files} x 5 KiB files: device time per file, synced at end"),
        c.device_ns as f64 / 1e6 / files as f64,
        "littlefs (commit per close)",
        lfs.chip.device_ns as f64 / 1e6 / files as f64,
        "ms",
        Better::Lower,
    ));
    emit(flashfs_row(
        format!("{files} x 5 KiB files: pages read per file"),
        c.reads as f64 / files as f64,
        "littlefs",
        lfs.chip.reads as f64 / files as f64,
        "pages",
        Better::Lower,
    ));
    emit(flashfs_row(
        format!("{files} x 5 KiB files: CPU per file"),
        cpu_ms,
        "raw chip (3 data pages)",
        raw_ms,
        "ms",
        Better::Lower,
    ));
    emit(flashfs_row(
        format!("{files} x 5 KiB files: flash used"),
        c.bytes_programmed as f64 / 1024.0,
        "file bytes",
        (files * 5120) as f64 / 1024.0,
        "KiB",
        Better::Lower,
    ));
}

/// A large file written sequentially, read back, overwritten at random with fsync and read
/// at random, on bitmend and on littlefs. Returns the file system, the file's MiB and the
/// last page written (for the mount tests).
fn fs_one_file(
    opts: &Options,
    rng: &mut Rng,
    emit: &mut dyn FnMut(Row),
) -> (bitmend_flashfs::Fs<RamNand>, usize, Vec<u8>) {
    use bitmend_flashfs::{Compression, Fs, FsOptions, ROOT};
    let (g, t) = (Geometry::RCFFS, Timing::TYPICAL);
    let (prog_page_ns, read_page_ns) = page_times();
    let fsopts = fs_options();
    // A 16 MiB file (2 in quick mode) written sequentially, synced, read back.
    let mb: usize = if opts.quick { 2 } else { 16 };
    // No clean page cache: the file fits the default one, so after the sequential read every
    // random read would be a hit, and these rows are of the flash (as littlefs's are).
    let mut fs = Fs::format(
        RamNand::new(g).expect("geometry"),
        FsConfig::default(),
        FsOptions { compression: Compression::None, cache_pages: 0, ..fsopts },
    )
    .expect("mkfs");
    let f = fs.create(ROOT, b"big", 0o644, 0, 0).expect("create");
    let mut pieces = Vec::with_capacity(mb);
    let before = fs.store().nand().counters();
    for i in 0..mb {
        let mut chunk = vec![0u8; 1 << 20];
        rng.fill(&mut chunk);
        fs.write(f.ino, (i << 20) as u64, &chunk).expect("write");
        pieces.push(chunk);
    }
    fs.sync().expect("sync");
    let w = fs.store().nand().counters() - before;
    let bytes = (mb << 20) as u64;
    let raw_write = g.page_size as f64 * 1e3 / raw_write_page_ns(g, t);
    emit(flashfs_row(
        format!("sequential write {mb} MiB file + sync"),
        mb_per_s(bytes, w.device_ns),
        "raw chip",
        raw_write,
        "MB/s",
        Better::Higher,
    ));
    let before = fs.store().nand().counters();
    for i in 0..mb {
        fs.read(f.ino, (i << 20) as u64, 1 << 20).expect("read");
    }
    let r = fs.store().nand().counters() - before;
    emit(flashfs_row(
        format!("sequential read {mb} MiB file (verified)"),
        mb_per_s(bytes, r.device_ns),
        "raw chip",
        g.page_size as f64 * 1e3 / read_page_ns,
        "MB/s",
        Better::Higher,
    ));

    // Random 4 KiB overwrites, each followed by fsync.
    let n = if opts.quick { 50 } else { 300 };
    let before = fs.store().nand().counters();
    let mut page = vec![0u8; 4096];
    let mut overwrites = Vec::with_capacity(n);
    for _ in 0..n {
        rng.fill(&mut page);
        let at = rng.below(bytes / 4096) * 4096;
        fs.write(f.ino, at, &page).expect("overwrite");
        fs.fsync(f.ino).expect("fsync");
        overwrites.push((at, page.clone()));
    }
    let o = fs.store().nand().counters() - before;
    emit(flashfs_row(
        "random 4 KiB overwrite + fsync".into(),
        n as f64 * 1e9 / o.device_ns as f64,
        "raw chip (2 page programs)",
        1e9 / (2.0 * prog_page_ns),
        "ops/s",
        Better::Higher,
    ));
    emit(flashfs_row(
        "random 4 KiB overwrite + fsync: write amplification".into(),
        o.bytes_programmed as f64 / (n as f64 * 4096.0),
        "raw chip (data+spare)",
        g.raw_page_size() as f64 / g.page_size as f64,
        "x",
        Better::Lower,
    ));

    // Random 4 KiB reads at page-aligned offsets of the same file, every page verified.
    let before = fs.store().nand().counters();
    let cpu = Instant::now();
    let mut reads = Vec::with_capacity(n);
    for _ in 0..n {
        let at = rng.below(bytes / 4096) * 4096;
        fs.read(f.ino, at, 4096).expect("read");
        reads.push(at);
    }
    let cpu_us = cpu.elapsed().as_secs_f64() * 1e6 / n as f64;
    let rr = fs.store().nand().counters() - before;
    random_read_rows(n as f64 * 1e9 / rr.device_ns.max(1) as f64, cpu_us, emit);

    let ours = OneFile { mb, n, write: w, read: r, overwrite: o, random_read: rr };
    vs_littlefs(&ours, (&pieces, &overwrites, &reads), emit);
    (fs, mb, page)
}

/// The random-read rows: operations per second of device time, and CPU per read, beside the
/// raw chip's two page reads.
fn random_read_rows(ops_per_s: f64, cpu_us: f64, emit: &mut dyn FnMut(Row)) {
    let (_, read_page_ns) = page_times();
    emit(flashfs_row(
        "random 4 KiB read (verified, uncached)".into(),
        ops_per_s,
        "raw chip (2 page reads)",
        1e9 / (2.0 * read_page_ns),
        "ops/s",
        Better::Higher,
    ));
    emit(flashfs_row(
        "random 4 KiB read, uncached: CPU per read".into(),
        cpu_us,
        "raw chip (2 page reads)",
        2.0 * read_page_ns / 1e3,
        "us",
        Better::Lower,
    ));
}

/// What bitmend's device did in [`fs_one_file`]: the file's MiB, the random operations, and
/// the counters of each phase.
struct OneFile {
    mb: usize,
    n: usize,
    write: Counters,
    read: Counters,
    overwrite: Counters,
    random_read: Counters,
}

/// The same file, overwrites and reads replayed on littlefs, beside bitmend's figures.
type Workload<'a> = (&'a [Vec<u8>], &'a [(u64, Vec<u8>)], &'a [u64]);

fn vs_littlefs(ours: &OneFile, (pieces, overwrites, reads): Workload, emit: &mut dyn FnMut(Row)) {
    let OneFile { mb, n, write: w, read: r, overwrite: o, random_read: rr } = ours;
    let (mb, n, bytes) = (*mb, *n, (*mb << 20) as u64);
    let lfs = crate::littlefs::one_file(pieces, overwrites, reads);
    let vs_lfs = |case: &str, ours: f64, theirs: f64| {
        flashfs_row(format!("{case} vs littlefs"), ours, "littlefs", theirs, "MB/s", Better::Higher)
    };
    emit(vs_lfs(
        &format!("sequential write {mb} MiB file + sync"),
        mb_per_s(bytes, w.device_ns),
        mb_per_s(bytes, lfs.write.chip.device_ns),
    ));
    emit(vs_lfs(
        &format!("sequential read {mb} MiB file"),
        mb_per_s(bytes, r.device_ns),
        mb_per_s(bytes, lfs.read.chip.device_ns),
    ));
    let ops = |c: &Counters| n as f64 * 1e9 / c.device_ns.max(1) as f64;
    emit(Row { unit: "ops/s", ..vs_lfs("random 4 KiB overwrite + fsync", ops(o), ops(&lfs.overwrite.chip)) });
    emit(Row { unit: "ops/s", ..vs_lfs("random 4 KiB read", ops(rr), ops(&lfs.random_read.chip)) });
    emit(flashfs_row(
        "random 4 KiB overwrite + fsync: flash programmed per op".into(),
        o.bytes_programmed as f64 / n as f64 / 1024.0,
        "littlefs",
        lfs.overwrite.chip.bytes_programmed as f64 / n as f64 / 1024.0,
        "KiB",
        Better::Lower,
    ));
}

/// Mount after a clean unmount, and after a power cut, of the file system just used.
fn fs_mount_times(fs: bitmend_flashfs::Fs<RamNand>, mb: usize, page: &[u8], emit: &mut dyn FnMut(Row)) {
    use bitmend_flashfs::{Fs, ROOT};
    let fsopts = fs_options();
    let bytes = (mb << 20) as u64;
    let nand = fs.unmount().expect("unmount");
    let before = nand.counters();
    let t0 = Instant::now();
    let (fs, _) = Fs::open(nand, fsopts).expect("mount");
    let ms =
        (fs.store().nand().counters() - before).device_ns as f64 / 1e6 + t0.elapsed().as_secs_f64() * 1e3;
    emit(flashfs_row(
        format!("mount after clean unmount ({mb} MiB file), device + CPU"),
        ms,
        "RCFFS paper",
        40.0,
        "ms",
        Better::Lower,
    ));
    let mut nand = FaultyNand::new(fs.into_nand(), 1);
    let ops = nand.ops();
    nand.cut_power_at(ops + 40);
    let (mut fs, _) = Fs::open(nand, fsopts).expect("mount");
    let big = fs.lookup(ROOT, b"big").expect("file").ino;
    let mut i = 0u64;
    while fs.write(big, i * 4096 % bytes, page).and_then(|_| fs.fsync(big)).is_ok() {
        i += 1;
    }
    let mut nand = fs.into_nand();
    nand.power_on();
    let before = nand.counters();
    let t0 = Instant::now();
    let (fs, _) = Fs::open(nand, fsopts).expect("mount after cut");
    let ms =
        (fs.store().nand().counters() - before).device_ns as f64 / 1e6 + t0.elapsed().as_secs_f64() * 1e3;
    emit(flashfs_row(
        format!("mount after a power cut ({mb} MiB file), device + CPU"),
        ms,
        "RCFFS paper",
        40.0,
        "ms",
        Better::Lower,
    ));
}

/// PostMark-style (see [`crate::postmark`]): the same operations replayed on bitmend, once
/// with write-back buffering (synced at the end) and once synced after every transaction, and
/// on littlefs, which commits at every file close. Transactions per second of device time.
pub fn postmark(opts: &Options, emit: &mut dyn FnMut(Row)) {
    use bitmend_flashfs::{Compression, Fs, FsOptions};
    // 500 files at most: littlefs gives every file of more than a few hundred bytes a whole
    // 128 KiB block, and runs out of the chip's 1024 blocks near 1000 files.
    let (files, txns) = if opts.quick { (200, 2000) } else { (500, 15000) };
    let w = crate::postmark::workload(files, txns, 11);
    let mut body = vec![0u8; crate::postmark::MAX_FILE];
    Rng::new(12).fill(&mut body);
    let lfs = crate::littlefs::postmark(&w.pool, &w.txns, &body);
    if let Err(e) = &lfs {
        eprintln!("\n{e}");
    }
    let lfs = lfs.ok();
    let lfs_value = |f: &dyn Fn(&crate::littlefs::Cost) -> f64| lfs.as_ref().map(f);
    let lfs_name =
        |name: &str| if lfs.is_some() { name.to_string() } else { format!("{name}: out of space") };
    for sync_each in [false, true] {
        let fsopts =
            FsOptions { compression: Compression::Lz4, dirty_limit: 1 << 20, ..FsOptions::default() };
        let mut fs =
            Fs::format(RamNand::new(Geometry::RCFFS).expect("geometry"), FsConfig::default(), fsopts)
                .expect("mkfs");
        let mut inos = crate::postmark::Inos::new();
        let mut run =
            |fs: &mut Fs<RamNand>, op: &crate::postmark::Op| crate::postmark::apply(fs, &mut inos, op, &body);
        w.pool.iter().for_each(|op| run(&mut fs, op));
        fs.sync().expect("sync");
        let before = fs.store().nand().counters();
        let cpu = Instant::now();
        for op in &w.txns {
            run(&mut fs, op);
            // A transaction ends after its second operation (or its only one).
            if sync_each && !matches!(op, crate::postmark::Op::Create(..) | crate::postmark::Op::Delete(..)) {
                fs.sync().expect("sync");
            }
        }
        fs.sync().expect("sync");
        let c = fs.store().nand().counters() - before;
        let cpu_s = cpu.elapsed().as_secs_f64();
        w.finish.iter().for_each(|op| run(&mut fs, op));
        let how = if sync_each { "sync every transaction" } else { "write-back, sync at end" };
        let rows = [
            (
                "device time",
                txns as f64 * 1e9 / c.device_ns.max(1) as f64,
                "littlefs (commit per close)",
                lfs_value(&|l| txns as f64 * 1e9 / l.chip.device_ns.max(1) as f64),
                "txn/s",
                Better::Higher,
            ),
            (
                "pages read per txn",
                c.reads as f64 / txns as f64,
                "littlefs",
                lfs_value(&|l| l.chip.reads as f64 / txns as f64),
                "pages",
                Better::Lower,
            ),
            (
                "CPU",
                txns as f64 / cpu_s,
                "littlefs CPU",
                lfs_value(&|l| txns as f64 * 1e9 / l.cpu_ns.max(1) as f64),
                "txn/s",
                Better::Higher,
            ),
        ];
        for (what, ours, anchor, anchor_value, unit, better) in rows {
            emit(Row {
                bench: "flashfs",
                case: format!("PostMark-style {files} files / {txns} txns, {how}: {what}"),
                ours,
                anchor: lfs_name(anchor),
                anchor_value,
                unit,
                better,
            });
        }
    }
}

/// `len` bytes of words drawn from a small vocabulary, a line break every twelve or so: text
/// that compresses about as source code does.
fn word_text(len: usize, rng: &mut Rng) -> Vec<u8> {
    const WORDS: &str = "the segment erase block page parity signature of and a to in flash write read log \
                         is that data for chip when it node index with clean as on file mount repair";
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut text = Vec::with_capacity(len + 16);
    while text.len() < len {
        text.extend_from_slice(words[rng.below(words.len() as u64) as usize].as_bytes());
        text.push(if rng.below(12) == 0 { b'\n' } else { b' ' });
    }
    text.truncate(len);
    text
}

/// Text-like data (words drawn from a small vocabulary) written through each codec: what
/// flash the file takes, and what the compression costs or saves in write time.
pub fn codecs(opts: &Options, emit: &mut dyn FnMut(Row)) {
    use bitmend_flashfs::{Compression, Fs, FsOptions, ROOT};
    let g = Geometry::RCFFS;
    let t = Timing::TYPICAL;
    let raw_write = g.page_size as f64 * 1e3 / raw_write_page_ns(g, t);
    let mb: usize = if opts.quick { 1 } else { 8 };
    let mut rng = Rng::new(13);
    let text = word_text(mb << 20, &mut rng);
    let read_page_ns = t.read_ns as f64 + g.raw_page_size() as f64 * t.transfer_ns_per_byte;
    let nodes = bitmend_flashfs::DEFAULT_NODE_PAGES;
    for (name, compression, node_pages) in [
        ("none", Compression::None, nodes),
        ("lz4", Compression::Lz4, nodes),
        ("lz4, a page per node", Compression::Lz4, 1),
        ("zstd", Compression::Zstd, nodes),
    ] {
        // No clean page cache: the read rows are of reads from flash (with one, the read-back
        // below leaves every page cached and the device time of the random reads is nil).
        let fsopts = FsOptions {
            compression,
            dirty_limit: 1 << 20,
            node_pages,
            cache_pages: 0,
            ..FsOptions::default()
        };
        let mut fs =
            Fs::format(RamNand::new(g).expect("geometry"), FsConfig::default(), fsopts).expect("mkfs");
        let f = fs.create(ROOT, b"text", 0o644, 0, 0).expect("create");
        let before = fs.store().nand().counters();
        let cpu = Instant::now();
        for (i, piece) in text.chunks(1 << 20).enumerate() {
            fs.write(f.ino, (i << 20) as u64, piece).expect("write");
        }
        fs.sync().expect("sync");
        let cpu_ns = cpu.elapsed().as_nanos() as u64;
        let c = fs.store().nand().counters() - before;
        let back = fs.read(f.ino, 0, text.len()).expect("read");
        assert!(back == text, "{name}: the text read back differs");
        emit(flashfs_row(
            format!("{mb} MiB text, {name}: flash programmed"),
            c.bytes_programmed as f64 / 1024.0,
            "file bytes",
            text.len() as f64 / 1024.0,
            "KiB",
            Better::Lower,
        ));
        emit(flashfs_row(
            format!("{mb} MiB text, {name}: write + sync, device time"),
            mb_per_s(text.len() as u64, c.device_ns),
            "raw chip",
            raw_write,
            "MB/s",
            Better::Higher,
        ));
        emit(flashfs_row(
            format!("{mb} MiB text, {name}: write + sync, CPU"),
            mb_per_s(text.len() as u64, cpu_ns),
            "raw chip",
            raw_write,
            "MB/s",
            Better::Higher,
        ));
        // Random 4 KiB reads: a page of a node of several decompresses the whole node and
        // reads every flash page under it.
        let n = if opts.quick { 200 } else { 2000 };
        let before = fs.store().nand().counters();
        let cpu = Instant::now();
        for _ in 0..n {
            let at = rng.below(text.len() as u64 / 4096) * 4096;
            fs.read(f.ino, at, 4096).expect("read");
        }
        let cpu_us = cpu.elapsed().as_secs_f64() * 1e6 / n as f64;
        let rr = fs.store().nand().counters() - before;
        emit(flashfs_row(
            format!("{mb} MiB text, {name}: random 4 KiB read, uncached, device time"),
            n as f64 * 1e9 / rr.device_ns.max(1) as f64,
            "raw chip (2 page reads)",
            1e9 / (2.0 * read_page_ns),
            "ops/s",
            Better::Higher,
        ));
        emit(flashfs_row(
            format!("{mb} MiB text, {name}: random 4 KiB read, uncached, CPU"),
            cpu_us,
            "raw chip (2 page reads)",
            2.0 * read_page_ns / 1e3,
            "us",
            Better::Lower,
        ));
    }
}
