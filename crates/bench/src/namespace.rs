//! `bitmend bench flashfs`, namespace rows: images holding 1,000, 100,000 and (outside quick
//! mode) 1,000,000 empty files, a thousand to a directory, on sparse NAND image files in the
//! temporary directory (2 KiB pages, 128 KiB blocks). Each is mounted afresh and timed (wall
//! time: the image's pages through the page cache, and CPU), and on that cold mount create,
//! stat (lookup and getattr), readdir of a 1,000-entry directory and unlink are timed in random
//! directories, each against its cost with 1,000 files. A mount reads the group table only and
//! each operation the groups it needs: the figures must not grow with the files. The RAM rows
//! come from a fresh `bitmend stat IMAGE --json --walk` (see `scale.rs`): the mount's, and the
//! most a walk of every file took beyond it with the default namespace cache.

use std::path::Path;
use std::time::Instant;

use bitmend_flashfs::{Fs, FsConfig, FsOptions, ROOT};
use bitmend_media::nand::{FileNand, Geometry};
use bitmend_media::rng::Rng;

use crate::harness::flashfs_row;
use crate::harness::{Better, Options, Row};

const PER_DIR: u64 = 1000;
/// What a mount may take over an empty image's, whatever the files.
const BOUND_MIB: f64 = 32.0;
/// Operations of each kind timed on a cold mount.
const OPS: u64 = 400;
/// Mounts timed per image (the median is its figure).
const MOUNTS: usize = 5;

/// What one image measured.
#[derive(Clone, Copy)]
struct Costs {
    mount_ms: f64,
    /// Microseconds per operation (create, stat, readdir, unlink) on the cold mount, and
    /// again once the groups they need are read.
    cold_us: [f64; 4],
    warm_us: [f64; 4],
    ram: Option<u64>,
    /// What `bitmend stat --walk` took beyond the mount (every directory read, every file's
    /// attributes, the namespace within its default cache) and how long it took.
    walk_ram: Option<u64>,
    walk_ms: Option<f64>,
}

const OP_NAMES: [&str; 4] = ["create", "stat (lookup + getattr)", "readdir of 1,000 entries", "unlink"];

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Formats an image of `blocks` blocks at `path` holding `files` empty files.
fn build(path: &Path, blocks: u32, files: u64) -> Result<(), String> {
    let g = Geometry::new(2048, 64, 64, blocks).map_err(err)?;
    let _ = std::fs::remove_file(path);
    let nand = FileNand::create_thin(path, g).map_err(err)?;
    let opts = FsOptions { cache_pages: 0, ..FsOptions::default() };
    let mut fs = Fs::format(nand, FsConfig::default(), opts).map_err(err)?;
    for d in 0..files.div_ceil(PER_DIR) {
        let dir = fs.mkdir(ROOT, format!("d{d}").as_bytes(), 0o755, 0, 0).map_err(err)?.ino;
        for i in 0..PER_DIR.min(files - d * PER_DIR) {
            fs.create(dir, format!("file-{i:06}").as_bytes(), 0o644, 0, 0).map_err(err)?;
        }
    }
    drop(fs.unmount().map_err(err)?);
    Ok(())
}

/// Mounts the image at `path` cold and times it, then the operations twice: on the cold
/// mount (the groups they need read first) and a second time (what the first read still in
/// memory; the directories it missed read now).
fn measure(path: &Path, files: u64) -> Result<Costs, String> {
    // The mount's time is the median of 5 (one mount of a few ms is at the mercy of a shared
    // machine); the operations run on the last, cold for them, as nothing changed.
    let mut mounts = Vec::new();
    let mut fs = None;
    for _ in 0..MOUNTS {
        drop(fs.take());
        let t = Instant::now();
        let (mounted, _) = Fs::open(FileNand::open(path).map_err(err)?, FsOptions::default()).map_err(err)?;
        mounts.push(t.elapsed().as_secs_f64() * 1e3);
        fs = Some(mounted);
    }
    let mut fs = fs.expect("mounted");
    let mount_ms = crate::harness::median(&mut mounts);
    if files == 0 {
        return Ok(Costs {
            mount_ms,
            cold_us: [0.0; 4],
            warm_us: [0.0; 4],
            ram: None,
            walk_ram: None,
            walk_ms: None,
        });
    }
    let cold_us = ops(&mut fs, files, 0)?;
    let warm_us = ops(&mut fs, files, 1)?;
    drop(fs.unmount().map_err(err)?);
    Ok(Costs { mount_ms, cold_us, warm_us, ram: None, walk_ram: None, walk_ms: None })
}

/// Microseconds per create, stat, readdir and unlink in random directories; `pass` names
/// what it creates and unlinks apart from another pass's. The namespace's cache lets groups
/// go between operations, as the mount does after each request.
fn ops(fs: &mut Fs<FileNand>, files: u64, pass: u64) -> Result<[f64; 4], String> {
    let (dirs, per_dir) = (files.div_ceil(PER_DIR).max(1), PER_DIR.min(files));
    let mut rng = Rng::new(11 + pass);
    let dir = |fs: &mut Fs<FileNand>, rng: &mut Rng| {
        fs.shed_namespace();
        let name = format!("d{}", rng.below(dirs));
        fs.lookup(ROOT, name.as_bytes()).map(|a| a.ino).map_err(err)
    };
    let mut us = [0.0; 4];
    let t = Instant::now();
    for k in 0..OPS {
        let d = dir(fs, &mut rng)?;
        fs.create(d, format!("new-{pass}-{k}").as_bytes(), 0o644, 0, 0).map_err(err)?;
    }
    us[0] = t.elapsed().as_secs_f64() * 1e6 / OPS as f64;
    let t = Instant::now();
    for _ in 0..OPS {
        let d = dir(fs, &mut rng)?;
        // From the upper half of the names: those the unlinks below leave.
        let name = format!("file-{:06}", per_dir / 2 + rng.below(per_dir / 2));
        let a = fs.lookup(d, name.as_bytes()).map_err(err)?;
        fs.getattr(a.ino).map_err(err)?;
    }
    us[1] = t.elapsed().as_secs_f64() * 1e6 / OPS as f64;
    let t = Instant::now();
    for _ in 0..OPS / 8 {
        let d = dir(fs, &mut rng)?;
        let n = fs.readdir(d).map_err(err)?.len() as u64;
        if n < per_dir / 2 {
            return Err(format!("readdir found {n} entries"));
        }
    }
    us[2] = t.elapsed().as_secs_f64() * 1e6 / (OPS / 8) as f64;
    let t = Instant::now();
    for k in 0..OPS {
        let d = dir(fs, &mut rng)?;
        // Names from the lower half, each pass its own: most exist (a few were taken
        // before in the same directory, and answer ENOENT).
        let name = format!("file-{:06}", (pass * OPS + k) % (per_dir / 2));
        let _ = fs.unlink(d, name.as_bytes());
    }
    us[3] = t.elapsed().as_secs_f64() * 1e6 / OPS as f64;
    Ok(us)
}

fn one(path: &Path, blocks: u32, files: u64) -> Result<Costs, String> {
    build(path, blocks, files)?;
    // The RAM first: `measure` changes the image.
    let stat = crate::scale::stat_json(path, &["--walk"]);
    let number = |key| stat.as_deref().and_then(|t| crate::scale::json_number::<u64>(t, key));
    let (ram, walk_ram) = (number("mount_ram_bytes"), number("walk_ram_bytes"));
    let walk_ms = stat.as_deref().and_then(|t| crate::scale::json_number::<f64>(t, "walk_ms"));
    let mut c = measure(path, files)?;
    (c.ram, c.walk_ram, c.walk_ms) = (ram, walk_ram, walk_ms);
    Ok(c)
}

/// Namespace rows at 1,000 and 100,000 files (and 1,000,000 outside quick mode), each beside
/// the image with 1,000 (and the mount beside an empty image's).
pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let sizes: &[(u64, u32)] = if opts.quick {
        &[(1_000, 2048), (100_000, 4096)]
    } else {
        &[(1_000, 2048), (100_000, 4096), (1_000_000, 16384)]
    };
    let path = std::env::temp_dir().join(format!("bitmend-bench-namespace-{}.img", std::process::id()));
    let empty = match one(&path, 2048, 0) {
        Ok(c) => c,
        Err(e) => return eprintln!("bench flashfs: namespace, empty image: {e}"),
    };
    let mut base: Option<Costs> = None;
    for &(files, blocks) in sizes {
        let c = match one(&path, blocks, files) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("bench flashfs: namespace, {files} files: {e}");
                break;
            }
        };
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let n = files.to_string();
        let case = format!("mount with {n} files, wall time");
        emit(flashfs_row(case, c.mount_ms, "an empty image's", empty.mount_ms, "ms", Better::Lower));
        if let (Some(ram), Some(zero)) = (c.ram, empty.ram) {
            let case = format!("RAM the mount takes with {n} files, over an empty image's");
            let over = mib(ram.saturating_sub(zero));
            emit(flashfs_row(case, over, "the bound", BOUND_MIB, "MiB", Better::Lower));
        }
        if let Some(walk) = c.walk_ram {
            let case = format!("RAM a walk of every file takes beyond the mount, {n} files");
            emit(flashfs_row(case, mib(walk), "the bound", BOUND_MIB, "MiB", Better::Lower));
        }
        if let Some(ms) = c.walk_ms {
            let case = format!("walk of every file (readdir + getattr), {n} files, per file");
            let per = ms * 1e3 / files as f64;
            let at_1000 = base.and_then(|b| b.walk_ms).map_or(per, |b| b * 1e3 / 1000.0);
            emit(flashfs_row(case, per, "with 1,000 files", at_1000, "us", Better::Lower));
        }
        let first = *base.get_or_insert(c);
        for (k, name) in OP_NAMES.iter().enumerate() {
            let case = format!("{name} with {n} files, cold mount, wall time");
            emit(flashfs_row(case, c.cold_us[k], "with 1,000 files", first.cold_us[k], "us", Better::Lower));
            let case = format!("{name} with {n} files, second pass, wall time");
            emit(flashfs_row(case, c.warm_us[k], "with 1,000 files", first.warm_us[k], "us", Better::Lower));
        }
    }
    let _ = std::fs::remove_file(&path);
}
