//! `bitmend bench flashfs`, scale rows: the file system on NAND image files of 128 MiB to
//! 64 GiB (sparse files in the temporary directory, 2 KiB pages, 128 KiB blocks), each
//! holding the same files. Mount time is wall time (the image's pages through the page
//! cache, and CPU): it must stay flat whatever the chip's size. The RAM rows come from a fresh
//! process, `bitmend stat IMAGE --json`, which reports the anonymous memory it gained across
//! its mount (the image's pages are the kernel's page cache, not counted); in a process that
//! freed memory before, the allocator would hand it out again unseen. Run from anything but
//! the `bitmend` binary, the RAM rows are left out.

use std::path::PathBuf;
use std::time::Instant;

use bitmend_flashfs::{Fs, FsConfig, FsOptions, ROOT};
use bitmend_media::nand::{FileNand, Geometry};
use bitmend_media::rng::Rng;

use crate::harness::flashfs_row;
use crate::harness::{Better, Options, Row};

struct Mounted {
    ms: f64,
    /// None: not measured (not run from the `bitmend` binary).
    ram: Option<u64>,
}

/// The memory a fresh `bitmend stat` gains mounting the image at `path`.
pub(crate) fn mount_ram(path: &std::path::Path) -> Option<u64> {
    let text = stat_json(path, &[])?;
    json_number(&text, "mount_ram_bytes")
}

/// What a fresh `bitmend stat IMAGE --json` with `args` prints; `None` when not run from the
/// `bitmend` binary.
pub(crate) fn stat_json(path: &std::path::Path, args: &[&str]) -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    if !exe.file_name()?.to_string_lossy().starts_with("bitmend") {
        return None;
    }
    let out = std::process::Command::new(exe).arg("stat").arg(path).arg("--json").args(args).output().ok()?;
    String::from_utf8(out.stdout).ok()
}

/// The number after `"key": ` in `text`.
pub(crate) fn json_number<T: std::str::FromStr>(text: &str, key: &str) -> Option<T> {
    let at = text.find(&format!("\"{key}\": "))? + key.len() + 4;
    text[at..].split([',', '}']).next()?.trim().parse().ok()
}

/// Makes an image of `blocks` 128 KiB blocks at `path`, writes the files, unmounts, and
/// mounts it again, timed.
fn one_size(path: &PathBuf, blocks: u32) -> Result<Mounted, String> {
    let g = Geometry::new(2048, 64, 64, blocks).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(path);
    let nand = FileNand::create_thin(path, g).map_err(|e| e.to_string())?;
    // Written with no clean-page cache and from a 1 MiB buffer, so that little memory the
    // mount could count is left behind by the writes.
    let opts = FsOptions { cache_pages: 0, ..FsOptions::default() };
    let mut fs = Fs::format(nand, FsConfig::default(), opts).map_err(|e| e.to_string())?;
    let mut rng = Rng::new(3);
    let mut data = vec![0u8; 1 << 20];
    let f = fs.create(ROOT, b"big", 0o644, 0, 0).map_err(|e| e.to_string())?;
    for i in 0..16 {
        rng.fill(&mut data);
        fs.write(f.ino, i << 20, &data).map_err(|e| e.to_string())?;
    }
    for i in 0..200 {
        let s = fs.create(ROOT, format!("small{i}").as_bytes(), 0o644, 0, 0).map_err(|e| e.to_string())?;
        fs.write(s.ino, 0, &data[i * 5000..(i + 1) * 5000]).map_err(|e| e.to_string())?;
    }
    drop(fs.unmount().map_err(|e| e.to_string())?);
    drop(data);
    let opts = FsOptions::default();
    let t = Instant::now();
    let nand = FileNand::open(path).map_err(|e| e.to_string())?;
    let (mut fs, _) = Fs::open(nand, opts).map_err(|e| e.to_string())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    // Mounted for use: the files are there.
    let small = fs.lookup(ROOT, b"small199").map_err(|e| e.to_string())?;
    if small.size != 5000 {
        return Err(format!("small199 is {} bytes after the remount", small.size));
    }
    drop(fs.unmount().map_err(|e| e.to_string())?);
    let ram = mount_ram(path);
    let _ = std::fs::remove_file(path);
    Ok(Mounted { ms, ram })
}

/// Mount time and RAM at 128 MiB, 1 GiB, 16 GiB and 64 GiB (quick: the first and 16 GiB).
pub fn scale(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let sizes: &[(u32, &str, f64)] = if opts.quick {
        &[(1024, "128 MiB", 0.125), (131072, "16 GiB", 16.0)]
    } else {
        &[(1024, "128 MiB", 0.125), (8192, "1 GiB", 1.0), (131072, "16 GiB", 16.0), (524288, "64 GiB", 64.0)]
    };
    let path = std::env::temp_dir().join(format!("bitmend-bench-scale-{}.img", std::process::id()));
    let mut smallest: Option<u64> = None;
    for &(blocks, name, gib) in sizes {
        let m = match one_size(&path, blocks) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("bench flashfs: {name} image in {}: {e}", path.display());
                let _ = std::fs::remove_file(&path);
                return;
            }
        };
        emit(flashfs_row(
            format!("mount {name} image file, wall time"),
            m.ms,
            "RCFFS paper",
            40.0,
            "ms",
            Better::Lower,
        ));
        let Some(ram) = m.ram else { continue };
        let first = *smallest.get_or_insert(ram);
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let case = format!("RAM the mount takes, {name} image");
        emit(flashfs_row(case, mib(ram), "the 128 MiB image's", mib(first), "MiB", Better::Lower));
        let case = format!("RAM the mount takes per GiB of flash, {name} image");
        emit(flashfs_row(
            case,
            mib(ram) / gib,
            "the 128 MiB image's",
            mib(first) / 0.125,
            "MiB",
            Better::Lower,
        ));
    }
}
