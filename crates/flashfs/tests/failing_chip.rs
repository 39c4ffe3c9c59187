//! A chip that fails programs and erases while the file system runs with its cleaner: every
//! byte survives, blocks that failed are retired (marked bad) and never written again.

use std::collections::HashSet;

use bitmend_flashfs::Ino;
use bitmend_flashfs::{Compression, Fs, FsConfig, FsOptions, ROOT};
use bitmend_media::nand::{FaultyNand, Geometry, Nand, NandFault, RamNand, Timing};
use bitmend_media::rng::Rng;

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

#[test]
fn program_and_erase_failures_retire_blocks_and_lose_nothing() {
    let seeds: u64 = std::env::var("BITMEND_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let (mut programs, mut erases, mut retired) = (0, 0, 0);
    for seed in 0..seeds {
        let (p, e, r) = run(seed);
        programs += p;
        erases += e;
        retired += r;
    }
    eprintln!("failing chip: {programs} program and {erases} erase failures injected over {seeds} seeds; {retired} blocks retired");
    assert!(programs > 0 && erases > 0, "no failures injected");
}

/// Returns the program and erase failures injected and the blocks retired.
fn run(seed: u64) -> (usize, usize, u64) {
    let g = Geometry::new(2048, 64, 16, 130).unwrap();
    let mut nand = FaultyNand::new(RamNand::new(g).unwrap().with_timing(Timing::NONE), seed);
    nand.set_program_fail_rate(0.002);
    nand.set_erase_fail_rate(0.01);
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 };
    // A 2-chunk index window: map nodes are read back, and moved, on a failing chip too.
    let opts = FsOptions {
        compression: Compression::None,
        dirty_limit: 64 << 10,
        index_chunks: 2,
        ..FsOptions::default()
    };
    let mut fs = Fs::format(nand, cfg, opts).unwrap();
    let mut files: Vec<(Ino, Vec<u8>)> = Vec::new();
    for i in 0..6u64 {
        let f = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        files.push((f.ino, Vec::new()));
    }
    // 150 rounds of rewriting two files: about 5 MB through a 2 MB chip, so the cleaner
    // releases (and erases) segments all along.
    for round in 0..150u64 {
        for k in 0..2 {
            let (ino, data) = &mut files[((round * 2 + k) % 6) as usize];
            *data = content(round * 10 + k, 16_000);
            fs.write(*ino, 0, data).unwrap();
        }
        fs.sync().unwrap();
    }
    for (ino, data) in &files {
        assert_eq!(&fs.read(*ino, 0, 20_000).unwrap(), data, "inode {ino}");
    }
    assert!(fs.check(true).clean());
    let st = fs.store().stats();
    let faults = fs.store().nand().faults().to_vec();
    let failed_programs: HashSet<u32> = faults
        .iter()
        .filter_map(
            |f| if let NandFault::ProgramFailed { page } = f { Some(g.block_of(*page)) } else { None },
        )
        .collect();
    let failed_erases = faults.iter().filter(|f| matches!(f, NandFault::EraseFailed { .. })).count();
    let cleaned = fs.stats().segments_cleaned;
    assert!(cleaned > 10, "{:?}", fs.stats());
    // Every block that failed a program and whose segment was released since is bad now.
    let in_use: HashSet<u32> = {
        let per = cfg.blocks_per_segment;
        fs.store()
            .used_segments()
            .iter()
            .flat_map(|u| (0..per).map(move |b| 2 + u.physical * per + b))
            .collect()
    };
    // (Blocks 0 and 1 hold the superblock, outside every segment.)
    for &b in failed_programs.iter().filter(|&&b| b >= 2 && !in_use.contains(&b)) {
        assert!(fs.store().nand().is_bad(b).unwrap(), "block {b} failed a program, was released, is not bad");
    }
    assert!(st.blocks_retired >= st.erase_failures, "{st:?}");

    // And after a remount, every byte again.
    let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts).unwrap();
    for (ino, data) in &files {
        assert_eq!(&fs.read(*ino, 0, 20_000).unwrap(), data, "inode {ino} after remount");
    }
    assert!(fs.check(true).clean());
    eprintln!(
        "failing chip, seed {seed}: {} program failures in {} blocks, {failed_erases} erase failures; {} blocks retired, {} segments cleaned; every byte of 6 files read back, before and after remount",
        st.program_failures,
        failed_programs.len(),
        st.blocks_retired,
        cleaned
    );
    (st.program_failures as usize, failed_erases, st.blocks_retired)
}
