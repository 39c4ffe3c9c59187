//! `bitmend demo`: the flash file system, then the heap (`demo_heap.rs`), meeting the faults
//! they were built for, narrated.

use crate::error::CliError;
use std::collections::BTreeMap;
use std::path::PathBuf;

use bitmend_flashfs::Corruption;
use bitmend_flashfs::{Cached, Fs, FsConfig, FsError, FsOptions, Verify, LOGICAL_PAGE, ROOT};
use bitmend_media::nand::{FaultyNand, FileNand, Geometry, NandError, NandFault};
use bitmend_media::rng::Rng;
use clap::Args;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where to put the image (default: a temporary file, removed at the end).
    #[arg(long)]
    image: Option<PathBuf>,
    /// Seed for the files and the faults.
    #[arg(long, default_value_t = 2026)]
    seed: u64,
}

fn text(r: &mut Rng, len: usize) -> Vec<u8> {
    const WORDS: [&str; 8] =
        ["flash ", "parity ", "signature ", "segment ", "page ", "block ", "repair ", "log "];
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        v.extend_from_slice(WORDS[r.below(8) as usize].as_bytes());
    }
    v.truncate(len);
    v
}

pub fn run(a: &DemoArgs) -> Result<(), CliError> {
    let temp = a.image.is_none();
    let path = a
        .image
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("bitmend-demo-{}.img", std::process::id())));
    let _ = std::fs::remove_file(&path);
    let g = Geometry::new(2048, 64, 64, 256)?;
    let opts = FsOptions::default();
    let mut r = Rng::new(a.seed);

    println!("1. mkfs: {} ({g}), 1 parity page per group, 1 parity block per segment", path.display());
    let mut fs = Fs::format(FileNand::create(&path, g)?, FsConfig::default(), opts)?;
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for d in 0..6 {
        let dir = fs.mkdir(ROOT, format!("dir{d}").as_bytes(), 0o755, 0, 0)?;
        for f in 0..30 {
            let len = 200 + r.below(12_000) as usize;
            let body = text(&mut r, len);
            let ino = fs.create(dir.ino, format!("file{f}.txt").as_bytes(), 0o644, 0, 0)?.ino;
            fs.write(ino, 0, &body)?;
            files.insert(format!("dir{d}/file{f}.txt"), body);
        }
        eprint!("\r   writing: {}/180 files", (d + 1) * 30);
    }
    eprintln!();
    let nand = fs.unmount()?;
    let (logical, stored) = {
        let (fs, _) = Fs::open(nand, opts)?;
        let s = fs.data_space();
        drop(fs);
        s
    };
    println!(
        "2. wrote {} files, {} KiB of file data in {} KiB of nodes (lz4), synced and unmounted",
        files.len(),
        logical >> 10,
        stored >> 10
    );

    // Faults, through the chip.
    let mut nand = FaultyNand::new(FileNand::open(&path)?, a.seed);
    inject_faults(&mut nand, g, opts)?;

    // A power cut in the middle of more writing.
    let written_after = cut_power_while_writing(&mut nand, opts, &mut r)?;

    let (mut fs, rep) = Fs::open(&mut nand, opts)?;
    println!(
        "5. remounted: {} pages replayed{}, {} page(s) with unreadable spares (torn or damaged), {} repaired on the way",
        rep.pages,
        if rep.from_checkpoint { " from a checkpoint" } else { "" },
        rep.store.torn_pages,
        rep.pages_repaired
    );
    let check = fs.check(true);
    let st = fs.store().stats();
    println!(
        "6. scrub and fsck: {} flash pages repaired from block parity, {} from segment parity, {} logical pages rewritten; {} problems, {} unreadable",
        st.repaired_by_group,
        st.repaired_by_segment,
        check.repaired_pages,
        check.problems.len(),
        check.unreadable_pages
    );
    let ok = verify(&mut fs, &files)?;
    println!("7. verified every byte of the {ok} files written before the faults; {written_after} files synced after them");
    memory_errors(&mut fs, &files)?;
    fs.unmount()?;
    if temp {
        let _ = std::fs::remove_file(&path);
    }
    if !check.clean() {
        return Err(format!("not clean: {:?}", check.problems).into());
    }
    println!("   result: every fault corrected, nothing lost");
    let pool = path.with_extension("pool");
    crate::demo_heap::run(&pool, a.seed)
}

/// Memory errors in the pages the file system holds (Loris): a bit flipped in a cached clean
/// page, caught by the next read and read again from flash; one flipped in a dirty page,
/// which fails the read rather than return it.
fn memory_errors<N: bitmend_media::nand::Nand>(
    fs: &mut Fs<N>,
    files: &BTreeMap<String, Vec<u8>>,
) -> Result<(), CliError> {
    fs.set_verify(Verify::Every);
    let dir = fs.lookup(ROOT, b"dir0")?.ino;
    let clean = fs.lookup(dir, b"file0.txt")?.ino;
    let want = &files["dir0/file0.txt"];
    fs.read(clean, 0, want.len())?;
    if fs.flip_cached(clean, 0, 1234) != Cached::Clean || fs.read(clean, 0, want.len())? != *want {
        return Err("a flipped clean page was not caught".into());
    }
    // A file of at least a page, whose first page is written whole (a partial write would
    // keep the flip: its CRC is updated by the change alone).
    let (name, want_dirty) = files
        .iter()
        .find(|(n, b)| n.starts_with("dir0/") && b.len() >= LOGICAL_PAGE)
        .ok_or("no file of a page or more")?;
    let dirty = fs.lookup(dir, &name.as_bytes()["dir0/".len()..])?.ino;
    fs.write(dirty, 0, &want_dirty[..LOGICAL_PAGE])?;
    fs.flip_cached(dirty, 0, 77);
    let refused =
        matches!(fs.read(dirty, 0, LOGICAL_PAGE), Err(FsError::Corrupt(Corruption::InMemory { .. })));
    // The application writes the page again, whole: sound again, the image stays clean.
    fs.write(dirty, 0, &want_dirty[..LOGICAL_PAGE])?;
    let (stats, _) = fs.cache_stats();
    if !refused || stats.clean_caught != 1 || stats.dirty_caught != 1 {
        return Err(format!("memory errors not caught as they should be: {stats:?}").into());
    }
    println!(
        "8. memory errors: a bit flipped in a cached clean page was caught by the next read and the page read again from flash (every byte right); one flipped in a dirty page failed the read (EIO) instead of returning it"
    );
    Ok(())
}

/// One damaged page per erase block (one lost, five with 1 to 4000 flipped bits), so that
/// each is within the configured redundancy.
fn inject_faults(nand: &mut FaultyNand<FileNand>, g: Geometry, opts: FsOptions) -> Result<(), CliError> {
    let (store_pages, _) = {
        let (mut fs, _) = Fs::open(&mut *nand, opts)?;
        let pages = fs.store_mut().log_pages(0, None)?;
        (pages, ())
    };
    let mut by_block: BTreeMap<u32, u32> = BTreeMap::new();
    for p in &store_pages {
        by_block.entry(g.block_of(p.0)).or_insert(p.0 + 3);
    }
    let targets: Vec<u32> = by_block.values().copied().take(6).collect();
    for (i, &p) in targets.iter().enumerate() {
        if i == 0 {
            nand.lose_page(p)?;
        } else {
            nand.flip_bits(p, [1, 10, 100, 1000, 4000][i - 1])?;
        }
    }
    for f in nand.faults() {
        match f {
            NandFault::BitFlips { page, bits } => {
                println!("3. injected: {} flipped bits in page {page}", bits.len())
            }
            NandFault::LostPage { page } => println!("3. injected: page {page} replaced with garbage"),
            _ => {}
        }
    }
    Ok(())
}

/// Writes more files, each synced, until the power cut set a few operations ahead stops
/// them; returns how many were synced before it.
fn cut_power_while_writing(
    nand: &mut FaultyNand<FileNand>,
    opts: FsOptions,
    r: &mut Rng,
) -> Result<u32, CliError> {
    let ops = nand.ops();
    nand.cut_power_at(ops + 25);
    let mut fs = Fs::open(&mut *nand, opts)?.0;
    let mut written_after = 0;
    let cut = loop {
        let ino = match fs.create(ROOT, format!("late{written_after}").as_bytes(), 0o644, 0, 0) {
            Ok(a) => a.ino,
            Err(err) => break err,
        };
        if let Err(err) = fs.write(ino, 0, &text(r, 6000)).and_then(|_| fs.sync()) {
            break err;
        }
        written_after += 1;
    };
    drop(fs);
    let torn = nand.faults().iter().find_map(|f| match f {
        NandFault::PowerCut { op, torn } => Some(format!("operation {op}, {torn:?}")),
        _ => None,
    });
    println!("4. power cut while writing more files ({}): {}", torn.unwrap_or_default(), cut);
    assert!(matches!(cut, FsError::Nand(NandError::PowerLost)), "the cut is what stopped the writes");
    nand.power_on();
    Ok(written_after)
}

/// Every byte of every file, against what was written; an error at the first difference.
fn verify<N: bitmend_media::nand::Nand>(
    fs: &mut Fs<N>,
    files: &BTreeMap<String, Vec<u8>>,
) -> Result<usize, CliError> {
    let mut ok = 0;
    for (name, body) in files {
        let (d, f) = name.split_once('/').expect("dir/file");
        let dir = fs.lookup(ROOT, d.as_bytes())?;
        let ino = fs.lookup(dir.ino, f.as_bytes())?.ino;
        let got = fs.read(ino, 0, body.len() + 1)?;
        if &got != body {
            return Err(format!("{name}: WRONG BYTES").into());
        }
        ok += 1;
    }
    Ok(ok)
}
