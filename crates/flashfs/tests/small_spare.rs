//! A spare of 38 bytes: what the kernel's ECC leaves free of a 64-byte spare (nandsim with
//! software Hamming keeps bytes 2..39 free), where a chip is used with its ECC on. It holds
//! every field and one successor (FORMAT.md section 7), so every segment names one next
//! segment, and a chain breaks (an anchor says "scan") whenever that one is taken.

use bitmend_flashfs::{Compression, Fs, FsConfig, FsError, FsOptions, SetAttr, ROOT};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::nand::{FaultyNand, Geometry, Nand, RamNand, Timing};

fn chip(blocks: u32) -> RamNand {
    RamNand::new(Geometry::new(2048, 38, 16, blocks).unwrap()).unwrap().with_timing(Timing::NONE)
}

fn opts() -> FsOptions {
    FsOptions { compression: Compression::None, dirty_limit: 64 << 10, ..FsOptions::default() }
}

fn cfg() -> FsConfig {
    FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 }
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(2_654_435_761).wrapping_add(seed * 977) as u8).collect()
}

/// Overwrites of three files, a sync every few; returns each file's last content.
fn churn<N: Nand>(fs: &mut Fs<N>, from: u64, steps: u64) -> Result<Vec<Vec<u8>>, FsError> {
    let mut last = vec![Vec::new(); 3];
    for step in from..from + steps {
        let i = (step % 3) as usize;
        let f = fs.lookup(ROOT, format!("f{i}").as_bytes())?.ino;
        let data = content(step, 3000 + (step as usize * 1777) % 12_000);
        fs.setattr(f, SetAttr { size: Some(0), ..SetAttr::default() })?;
        fs.write(f, 0, &data)?;
        last[i] = data;
        if step % 5 == 4 {
            fs.sync()?;
        }
    }
    fs.sync()?;
    Ok(last)
}

#[test]
fn a_38_byte_spare_takes_the_log_round_the_chip_and_mounts_by_its_chain() {
    let mut fs = Fs::format(chip(34), cfg(), opts()).unwrap();
    for i in 0..3 {
        fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let mut cleaned = 0;
    let mut scanned = 0;
    for round in 0..4 {
        let last = churn(&mut fs, round * 100, 100).unwrap();
        cleaned += fs.stats().segments_cleaned;
        let (mut again, rep) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
        scanned += rep.store.scanned as u32;
        for (i, data) in last.iter().enumerate() {
            let f = again.lookup(ROOT, format!("f{i}").as_bytes()).unwrap().ino;
            assert_eq!(&again.read(f, 0, 20_000).unwrap(), data, "round {round}: f{i}");
        }
        let c = again.check(true);
        assert!(c.clean(), "round {round}: {:?}", c.problems);
        fs = again;
    }
    eprintln!(
        "38-byte spares: {cleaned} segments cleaned over 400 overwrites; {scanned} of 4 mounts scanned"
    );
    assert!(cleaned > 20, "the log went round the chip: {cleaned}");
}

#[test]
fn power_cuts_with_a_38_byte_spare_keep_every_synced_file() {
    let mut base = Fs::format(chip(26), cfg(), opts()).unwrap();
    for i in 0..3 {
        base.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    base.sync().unwrap();
    let base = base.unmount().unwrap();
    let steps = 60;
    // The state after each sync of the uncut run, and the chip operation it ended at.
    let (mut probe, _) = Fs::open(FaultyNand::new(base.clone(), 0), opts()).unwrap();
    let mut synced = Vec::new();
    for k in 0..steps / 5 {
        let last = churn(&mut probe, k * 5, 5).unwrap();
        synced.push((probe.store().nand().ops(), last));
    }
    let work = |chip: &mut FaultyNand<RamNand>| {
        let (mut fs, _) = Fs::open(chip, opts()).expect("the mount writes nothing");
        (0..steps / 5).all(|k| churn(&mut fs, k * 5, 5).is_ok())
    };
    let c = campaign::run(&FaultyNand::new(base, 0), Schedule::EveryKth(3), work, |nand, cut| {
        let (mut fs, _) = Fs::open(nand, opts()).unwrap_or_else(|e| panic!("cut {cut}: mount: {e}"));
        let c = fs.check(true);
        assert!(c.clean(), "cut {cut}: {:?}", c.problems);
        // Every file holds what its last sync before the cut left, or what came after it.
        let Some((_, want)) = synced.iter().rev().find(|(at, _)| *at <= cut) else { return };
        for (i, data) in want.iter().enumerate() {
            let f = fs.lookup(ROOT, format!("f{i}").as_bytes()).unwrap().ino;
            let got = fs.read(f, 0, 20_000).unwrap();
            let later = (0..steps).any(|s| s % 3 == i as u64 && content(s, got.len()) == got);
            assert!(&got == data || later, "cut {cut}: f{i} is neither its synced content nor a later one");
        }
    });
    eprintln!("38-byte spares: {} power cuts, fsck clean and every synced file kept after each", c.cuts);
    assert!(c.cuts > 100);
}
