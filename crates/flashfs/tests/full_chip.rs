//! A full chip is a normal state: every write the file system acknowledges is kept, every one
//! it cannot keep is refused with `NoSpace` (ENOSPC), nothing stored before is put at risk,
//! and deleting, truncating, renaming and unmounting work at 100% full and give space back.

use std::collections::BTreeMap;

use bitmend_flashfs::{Compression, Fs, FsConfig, FsError, FsOptions, SetAttr, ROOT};
use bitmend_media::nand::{Geometry, RamNand, Timing};
use bitmend_media::rng::Rng;

/// A chip of `mib` MiB with RCFFS's pages and blocks.
fn chip(mib: u32) -> RamNand {
    RamNand::new(Geometry::new(2048, 64, 64, mib * 8).unwrap()).unwrap().with_timing(Timing::NONE)
}

fn opts() -> FsOptions {
    FsOptions { compression: Compression::Lz4, ..FsOptions::default() }
}

/// File contents: random (incompressible) or text that compresses about 3:1.
fn content(seed: u64, len: usize, compressible: bool) -> Vec<u8> {
    let mut r = Rng::new(seed);
    if !compressible {
        return (0..len).map(|_| r.next_u64() as u8).collect();
    }
    let words: [&[u8]; 8] =
        [b"segment ", b"parity ", b"erase ", b"block ", b"signature ", b"page ", b"flash ", b"\n"];
    let mut v = Vec::with_capacity(len + 16);
    while v.len() < len {
        v.extend_from_slice(words[r.below(8) as usize]);
        if r.below(16) == 0 {
            v.extend_from_slice(format!("{} ", r.next_u64()).as_bytes());
        }
    }
    v.truncate(len);
    v
}

/// What a fill round stored: file name to the bytes acknowledged for it.
type Stored = BTreeMap<String, Vec<u8>>;

struct Fill {
    file_size: usize,
    compressible: bool,
    seed: u64,
}

/// Writes files of `file_size` bytes in 64 KiB writes, each file fsync'd, until a write or a
/// create is refused. Returns what was acknowledged, and how many refusals were seen.
/// Every refusal must be `NoSpace`; every file acknowledged by its fsync must read back.
fn fill<N: bitmend_media::nand::Nand>(fs: &mut Fs<N>, f: &Fill, stored: &mut Stored) -> u64 {
    let mut refused = 0;
    for i in 0.. {
        let name = format!("s{}-{i}", f.seed);
        let ino = match fs.create(ROOT, name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => a.ino,
            Err(FsError::NoSpace) => return refused + 1,
            Err(e) => panic!("create {name}: {e}"),
        };
        let data = content(f.seed * 1_000_003 + i, f.file_size, f.compressible);
        let mut kept = 0;
        for chunk in data.chunks(64 << 10) {
            match fs.write(ino, kept as u64, chunk) {
                Ok(n) => {
                    assert_eq!(n, chunk.len());
                    kept += n;
                }
                Err(FsError::NoSpace) => {
                    refused += 1;
                    break;
                }
                Err(e) => panic!("write {name} at {kept}: {e}"),
            }
        }
        // What write acknowledged must be storable: fsync may not refuse it.
        fs.fsync(ino).unwrap_or_else(|e| panic!("fsync {name} with {kept} bytes acknowledged: {e}"));
        stored.insert(name.clone(), data[..kept].to_vec());
        if kept < data.len() {
            return refused;
        }
    }
    unreachable!()
}

fn verify<N: bitmend_media::nand::Nand>(fs: &mut Fs<N>, stored: &Stored, when: &str) {
    for (name, data) in stored {
        let a = fs.lookup(ROOT, name.as_bytes()).unwrap_or_else(|e| panic!("{when}: {name}: {e}"));
        assert_eq!(a.size, data.len() as u64, "{when}: {name}");
        let got = fs.read(a.ino, 0, data.len()).unwrap_or_else(|e| panic!("{when}: read {name}: {e}"));
        assert!(got == *data, "{when}: {name} differs");
    }
    let c = fs.check(true);
    assert!(c.clean(), "{when}: {:?}", c.problems);
}

/// Fills to the end, checks, remounts, checks, deletes everything, fills again.
fn fill_delete_fill(cfg: FsConfig, mib: u32, file_size: usize, compressible: bool) {
    let mut fs = Fs::format(chip(mib), cfg, opts()).unwrap();
    let (total, free0) = fs.statfs();
    for round in 0..2u64 {
        let mut stored = Stored::new();
        let refused = fill(&mut fs, &Fill { file_size, compressible, seed: round }, &mut stored);
        assert!(refused > 0);
        let bytes: usize = stored.values().map(|v| v.len()).sum();
        let (_, free) = fs.statfs();
        eprintln!(
            "round {round}: {} files, {bytes} bytes acknowledged of {total} ({free} free reported), p={} s={}",
            stored.len(),
            cfg.parity_pages,
            cfg.parity_blocks
        );
        verify(&mut fs, &stored, "full");
        // Full is full: a small create or write is refused, not acknowledged and dropped.
        // Metadata operations that free space work.
        let victim = stored.keys().next().unwrap().clone();
        let ino = fs.lookup(ROOT, victim.as_bytes()).unwrap().ino;
        fs.setattr(ino, SetAttr { size: Some(0), ..SetAttr::default() }).expect("truncate on a full chip");
        stored.insert(victim.clone(), Vec::new());
        fs.rename(ROOT, victim.as_bytes(), ROOT, b"renamed").expect("rename on a full chip");
        let data = stored.remove(&victim).unwrap();
        stored.insert("renamed".into(), data);
        fs.sync().unwrap();
        let nand = fs.unmount().expect("unmount on a full chip");
        fs = Fs::open(nand, opts()).expect("mount of a full chip").0;
        verify(&mut fs, &stored, "remounted");
        for name in stored.keys() {
            fs.unlink(ROOT, name.as_bytes()).unwrap_or_else(|e| panic!("unlink {name} on a full chip: {e}"));
        }
        fs.sync().unwrap();
        let (_, free) = fs.statfs();
        assert!(free + free0 / 50 >= free0, "everything deleted: {free} free of {free0} at first");
        let nand = fs.unmount().unwrap();
        fs = Fs::open(nand, opts()).unwrap().0;
        verify(&mut fs, &Stored::new(), "emptied");
    }
}

#[test]
fn a_full_chip_of_random_data_in_big_files() {
    fill_delete_fill(FsConfig::default(), 32, 4 << 20, false);
}

#[test]
fn a_full_chip_of_text_in_big_files() {
    fill_delete_fill(FsConfig::default(), 32, 4 << 20, true);
}

#[test]
fn a_full_chip_of_small_files() {
    fill_delete_fill(FsConfig::default(), 16, 4096, false);
}

#[test]
fn a_full_chip_of_small_text_files() {
    fill_delete_fill(FsConfig::default(), 16, 3000, true);
}

#[test]
fn a_full_chip_with_two_parity_pages_and_blocks() {
    let cfg = FsConfig { parity_pages: 2, parity_blocks: 2, ..FsConfig::default() };
    fill_delete_fill(cfg, 32, 1 << 20, false);
    fill_delete_fill(cfg, 16, 4096, true);
}

#[test]
fn a_refused_write_leaves_the_synced_file_before_it_intact() {
    // The case a user hit: a file of the free space less 2 MiB, fsync'd, then 4 MiB more
    // refused with ENOSPC; the first file lost a page.
    let mut fs = Fs::format(chip(64), FsConfig::default(), opts()).unwrap();
    let (_, free) = fs.statfs();
    let first = content(1, (free - (2 << 20)) as usize / 4096 * 4096, false);
    let a = fs.create(ROOT, b"first", 0o644, 0, 0).unwrap().ino;
    for (i, chunk) in first.chunks(128 << 10).enumerate() {
        fs.write(a, (i * (128 << 10)) as u64, chunk).unwrap();
    }
    fs.fsync(a).unwrap();
    let b = fs.create(ROOT, b"second", 0o644, 0, 0).unwrap().ino;
    let second = content(2, 4 << 20, false);
    let mut kept = 0;
    for chunk in second.chunks(128 << 10) {
        match fs.write(b, kept as u64, chunk) {
            Ok(n) => kept += n,
            Err(FsError::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(kept < second.len(), "4 MiB into 2 MiB of room");
    fs.fsync(b).unwrap();
    let stored: Stored =
        [("first".to_string(), first), ("second".to_string(), second[..kept].to_vec())].into();
    verify(&mut fs, &stored, "after the refusal");
    let mut fs = Fs::open(fs.unmount().unwrap(), opts()).unwrap().0;
    verify(&mut fs, &stored, "remounted");
}
