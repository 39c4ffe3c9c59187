//! Mount by the anchor log and the successor chain (docs/DESIGN.md, "mount"): the pages read
//! do not grow with the chip, the anchor log survives wrapping between the two reserved
//! blocks, and a stale or missing anchor is never trusted.

mod common;

use bitmend_flashfs::{Compression, Fs, FsOptions, MountReport, ROOT};
use bitmend_media::nand::{Nand, RamNand};
use common::{cfg, chip};

fn opts() -> FsOptions {
    FsOptions { compression: Compression::None, dirty_limit: 32 << 10, ..FsOptions::default() }
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(0x9E37)) as u8 >> 1).collect()
}

/// The same workload on a chip of `blocks` blocks; returns the mount's report and the chip
/// reads it made, after a clean unmount or after dropping the file system (a crash after
/// the last sync).
fn mount_after_workload(blocks: u32, clean: bool) -> (MountReport, u64) {
    let mut fs = Fs::format(chip(blocks), cfg(), opts()).unwrap();
    for i in 0..12u64 {
        let f = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.write(f.ino, 0, &content(i, 9_000)).unwrap();
        fs.sync().unwrap();
    }
    let nand = if clean { fs.unmount().unwrap() } else { fs.into_nand() };
    let before = nand.counters().reads;
    let (mut fs, rep) = Fs::open(nand, opts()).unwrap();
    let reads = fs.store().nand().counters().reads - before;
    for i in 0..12u64 {
        let f = fs.lookup(ROOT, format!("f{i}").as_bytes()).unwrap();
        assert_eq!(fs.read(f.ino, 0, 20_000).unwrap(), content(i, 9_000), "{blocks} blocks, f{i}");
    }
    (rep, reads)
}

#[test]
fn mount_reads_the_same_pages_on_a_chip_64_times_larger() {
    for clean in [true, false] {
        let (small, small_reads) = mount_after_workload(128, clean);
        let (large, large_reads) = mount_after_workload(8192, clean);
        eprintln!(
            "mount ({}): {small_reads} chip reads at 128 blocks ({} segments), {large_reads} at 8,192 ({}); chain of {} segments, {} anchor pages, {} spares",
            if clean { "clean" } else { "after a crash" },
            (128 - 4) / 4,
            (8192 - 4) / 4,
            large.store.chain_length,
            large.store.anchor_pages_read,
            large.store.spares_read,
        );
        for rep in [&small, &large] {
            assert!(!rep.store.scanned && rep.store.chain_length >= 1, "{rep:?}");
        }
        // The anchor log is read the same way whatever the chip's size; nothing else differs.
        assert!(large_reads <= small_reads + 2, "{small_reads} reads at 128 blocks, {large_reads} at 8,192");
        // A scan would read one spare per segment: 2,047 at 8,192 blocks. (The rest of the
        // reads after a crash are the replay of the log written since the checkpoint.)
        let store_reads = large.store.spares_read + large.store.anchor_pages_read as u64;
        assert!(store_reads < 100, "{large:?}");
    }
}

#[test]
fn the_anchor_log_wraps_between_the_reserved_blocks() {
    // 16 pages per reserved block: 15 anchors each. 50 mount cycles wrap it three times.
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"log", 0o644, 0, 0).unwrap().ino;
    let mut want = Vec::new();
    for cycle in 0..50u64 {
        let more = content(cycle, 700);
        fs.write(f, want.len() as u64, &more).unwrap();
        want.extend_from_slice(&more);
        let (again, rep) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
        fs = again;
        assert!(!rep.store.scanned, "cycle {cycle}: {rep:?}");
        // The log's end is found from each block's end (a damaged page inside it must not
        // end it early): at most a spare per page of the two blocks, and a few pages more.
        assert!(rep.store.anchor_pages_read <= 2 * 16 + 4, "cycle {cycle}: {rep:?}");
        assert_eq!(fs.read(f, 0, 1 << 20).unwrap(), want, "cycle {cycle}");
    }
    // Both reserved blocks still begin with a superblock.
    let nand = fs.unmount().unwrap();
    for b in 0..2 {
        let mut page = vec![0u8; 2048];
        let mut spare = vec![0u8; 64];
        let mut n = nand.clone();
        n.read_page(b * 16, &mut page, &mut spare).unwrap();
        assert_eq!(&page[..8], b"BMFLASH\0", "reserved block {b}");
    }
}

#[test]
fn a_lost_anchor_log_falls_back_to_a_scan() {
    // Wipe the anchor log (erase both reserved blocks' anchors by rewriting the chip
    // without them): mount must fall back to a scan, and say so, and lose nothing.
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &content(5, 30_000)).unwrap();
    let mut nand = fs.unmount().unwrap();
    // Keep each reserved block's superblock, drop its anchors.
    let g = nand.geometry();
    for b in 0..2 {
        let mut sb = vec![0u8; 2048];
        let mut spare = vec![0u8; 64];
        nand.read_page(b * 16, &mut sb, &mut spare).unwrap();
        nand.erase(b).unwrap();
        nand.program(g.first_page(b), &sb, &spare).unwrap();
    }
    let (mut fs, rep) = Fs::open(nand, opts()).unwrap();
    assert!(rep.store.scanned, "{rep:?}");
    assert_eq!(fs.read(f, 0, 1 << 20).unwrap(), content(5, 30_000));
    // The scan wrote an anchored checkpoint: the next mount follows the chain.
    let (mut fs, rep) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
    assert!(!rep.store.scanned, "{rep:?}");
    assert_eq!(fs.read(f, 0, 1 << 20).unwrap(), content(5, 30_000));
}

/// One step of the anchor-log workload: rewrite a file, then a checkpoint (and its anchor).
fn anchor_step<N: Nand>(fs: &mut Fs<N>, i: u64) -> Result<(), bitmend_flashfs::FsError> {
    let name = format!("f{}", i % 3);
    let ino = match fs.lookup(ROOT, name.as_bytes()) {
        Ok(a) => a.ino,
        Err(_) => fs.create(ROOT, name.as_bytes(), 0o644, 0, 0)?.ino,
    };
    let data = content(i, 2_000 + 300 * (i as usize % 7));
    fs.setattr(ino, bitmend_flashfs::SetAttr { size: Some(0), ..Default::default() })?;
    fs.write(ino, 0, &data)?;
    fs.checkpoint()
}

fn files<N: Nand>(fs: &mut Fs<N>) -> Vec<Option<Vec<u8>>> {
    (0..3)
        .map(|k| {
            let a = fs.lookup(ROOT, format!("f{k}").as_bytes()).ok()?;
            fs.read(a.ino, 0, 1 << 20).ok()
        })
        .collect()
}

/// Whether `got` is a state an interrupted rewrite (truncate to zero, then write) from `old`
/// to `new` may leave.
fn between(got: &Option<Vec<u8>>, old: &Option<Vec<u8>>, new: &Option<Vec<u8>>) -> bool {
    if got == old || got == new {
        return true;
    }
    let Some(g) = got else { return false };
    let empty = Vec::new();
    let (o, n) = (old.as_ref().unwrap_or(&empty), new.as_ref().unwrap_or(&empty));
    if g.is_empty() {
        return true;
    }
    (g.len() == o.len() || g.len() == n.len())
        && g.chunks(4096).enumerate().all(|(i, c)| {
            let page = |v: &Vec<u8>| {
                let mut p =
                    v.get(i * 4096..).unwrap_or(&[]).iter().take(c.len()).copied().collect::<Vec<u8>>();
                p.resize(c.len(), 0);
                p
            };
            c == page(o).as_slice() || c == page(n).as_slice() || c.iter().all(|&b| b == 0)
        })
}

#[test]
fn power_cuts_while_the_anchor_log_wraps() {
    use bitmend_media::campaign::{self, Schedule};
    use bitmend_media::nand::FaultyNand;
    // 16 pages per reserved block: 15 anchors each; 36 checkpoints wrap the log twice.
    let steps = 36;
    let base = Fs::format(chip(64), cfg(), opts()).unwrap().unmount().unwrap();
    let (mut probe, _) = Fs::open(FaultyNand::new(base.clone(), 0), opts()).unwrap();
    let mut states = vec![files(&mut probe)];
    let mut marks = Vec::new();
    for i in 0..steps {
        anchor_step(&mut probe, i).unwrap();
        states.push(files(&mut probe));
        marks.push(probe.store().nand().ops());
    }
    let erases_of_reserved =
        probe.store().nand().erase_count(0).unwrap() + probe.store().nand().erase_count(1).unwrap();
    assert!(erases_of_reserved >= 4, "the log wrapped: {erases_of_reserved} erases of the reserved blocks");
    let work = |chip: &mut FaultyNand<RamNand>| {
        let (mut fs, _) = Fs::open(chip, opts()).expect("the mount writes nothing");
        (0..steps).all(|i| anchor_step(&mut fs, i).is_ok())
    };
    let c = campaign::run(&FaultyNand::new(base.clone(), 0), Schedule::Every, work, |nand, cut| {
        let done = marks.iter().filter(|&&m| m <= cut).count() as u64;
        let (mut fs, rep) = Fs::open(nand, opts()).unwrap_or_else(|e| panic!("cut {cut}: mount: {e}"));
        assert!(!rep.store.scanned, "cut {cut}: {rep:?}");
        assert!(fs.check(true).clean(), "cut {cut}");
        // Each file as of the last completed checkpoint, or as the interrupted step left it:
        // created, truncated, or with each logical page old or new.
        let got = files(&mut fs);
        let (old, new) = (&states[done as usize], &states[(done as usize + 1).min(steps as usize)]);
        for k in 0..3 {
            if k as u64 == done % 3 {
                assert!(between(&got[k], &old[k], &new[k]), "cut {cut} (step {done}): f{k}");
            } else {
                assert!(got[k] == old[k], "cut {cut} (step {done}): f{k}, untouched, changed");
            }
        }
        // And it goes on: another checkpoint, a remount by the chain.
        anchor_step(&mut fs, 100 + done).unwrap();
        let want = files(&mut fs);
        let (mut fs, rep) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
        assert!(!rep.store.scanned, "cut {cut}: second mount {rep:?}");
        assert_eq!(files(&mut fs), want, "cut {cut}: second mount");
    });
    let ops = c.cuts;
    eprintln!("anchor log: {ops} cut points over {steps} checkpoints (the log wrapped, {erases_of_reserved} erases of the reserved blocks); every mount by the chain, fsck clean, every checkpointed state intact");
}
