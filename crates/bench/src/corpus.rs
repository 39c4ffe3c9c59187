//! `bitmend bench corpus`: the space a real tree of files takes in the flash file system with
//! each codec, beside the image `mkfs.ubifs` (Debian's mtd-utils) makes of the same tree with
//! the matching compressor. By default the tree is the Python standard library of this
//! machine (`/usr/lib/python3.*`, about 50 MB).
//!
//! Our figure is what the copy occupies once written: the live file data in flash pages
//! (compressed, with the 32-byte fragment headers) plus the final checkpoint (every inode,
//! name and index entry, zstd-compressed), and the same with the parity pages and blocks that
//! protect it (p = 1 per block, s = 1 per segment; UBIFS has none). The flash programmed by the
//! copy (every page, parity and superseded checkpoints too) is reported beside it.

use std::path::{Path, PathBuf};

use bitmend_flashfs::{Compression, Fs, FsConfig, FsOptions, ROOT};
use bitmend_media::nand::{Geometry, Nand, RamNand, Timing};

use crate::harness::{Better, Options, Row};

/// The newest `/usr/lib/python3.N` on this machine.
pub fn default_corpus() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let minor = name.strip_prefix("python3.")?.parse().ok()?;
            Some((minor, e.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|f| f.1)
}

enum Entry {
    Dir(Vec<u8>, Vec<Entry>),
    File(Vec<u8>, Vec<u8>),
    Link(Vec<u8>, Vec<u8>),
}

fn load(dir: &Path, bytes: &mut u64, files: &mut u64) -> std::io::Result<Vec<Entry>> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().as_bytes().to_vec();
        let t = e.file_type()?;
        if t.is_symlink() {
            out.push(Entry::Link(name, std::fs::read_link(e.path())?.as_os_str().as_bytes().to_vec()));
        } else if t.is_dir() {
            out.push(Entry::Dir(name, load(&e.path(), bytes, files)?));
        } else if t.is_file() {
            // Unreadable files (permissions) are left out, as mkfs.ubifs would fail on them.
            if let Ok(data) = std::fs::read(e.path()) {
                *bytes += data.len() as u64;
                *files += 1;
                out.push(Entry::File(name, data));
            }
        }
    }
    Ok(out)
}

fn copy(fs: &mut Fs<RamNand>, parent: bitmend_flashfs::Ino, entries: &[Entry]) -> Result<(), String> {
    let e = |e: bitmend_flashfs::FsError| e.to_string();
    for entry in entries {
        match entry {
            Entry::Dir(name, children) => {
                let d = fs.mkdir(parent, name, 0o755, 0, 0).map_err(e)?;
                copy(fs, d.ino, children)?;
            }
            Entry::File(name, data) => {
                let f = fs.create(parent, name, 0o644, 0, 0).map_err(e)?;
                fs.write(f.ino, 0, data).map_err(e)?;
            }
            Entry::Link(name, target) => {
                fs.symlink(parent, name, target, 0, 0).map_err(e)?;
            }
        }
    }
    Ok(())
}

/// Size of the image `mkfs.ubifs` makes of `dir` with compressor `compr` (on the same
/// geometry: 2 KiB pages, 128 KiB erase blocks), if mkfs.ubifs is installed.
fn ubifs_image(dir: &Path, compr: &str) -> Option<u64> {
    let out = std::env::temp_dir().join(format!("bitmend-corpus-{}-{compr}.ubifs", std::process::id()));
    let status = std::process::Command::new("mkfs.ubifs")
        .args(["-m", "2048", "-e", "126976", "-c", "8192", "-x", compr, "-r"])
        .arg(dir)
        .arg("-o")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    let size = std::fs::metadata(&out).ok().map(|m| m.len());
    let _ = std::fs::remove_file(&out);
    status.success().then_some(size?)
}

/// What a copy occupies: the live data and metadata, the parity's factor over them, and the
/// flash programmed so far.
#[derive(Clone, Copy)]
struct Footprint {
    stored: f64,
    parity: f64,
    programmed: f64,
}

impl Footprint {
    fn of(fs: &Fs<RamNand>) -> Footprint {
        let page = fs.store().nand().geometry().page_size as u64;
        let ckpt = fs.stats().checkpoint_bytes;
        let stored = fs.data_footprint() + fs.index_footprint() + ckpt + 32 * ckpt.div_ceil(page - 32);
        let st = fs.store().stats();
        let programmed = st.data_pages + st.pad_pages + st.group_parity_pages + st.segment_parity_pages;
        Footprint {
            stored: stored as f64,
            parity: programmed as f64 / (st.data_pages + st.pad_pages).max(1) as f64,
            programmed: (programmed * page) as f64,
        }
    }
}

/// Runs the corpus benchmark on `dir`.
pub fn run(opts: &Options, dir: &Path, emit: &mut dyn FnMut(Row)) -> Result<(), String> {
    let (mut bytes, mut files) = (0, 0);
    let tree = load(dir, &mut bytes, &mut files).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mb = |b: f64| b / 1e6;
    let name = format!("{} ({files} files, {:.1} MB)", dir.display(), mb(bytes as f64));
    // mkfs.ubifs compresses with LZO's best level (lzo1x_999). lz4 is written with its fast
    // compressor, then `compact` has the cleaner move everything once, at the high level.
    let codecs: &[(Compression, &str, &str)] = if opts.quick {
        &[(Compression::Lz4, "lz4", "lzo")]
    } else {
        &[
            (Compression::None, "none", "none"),
            (Compression::Lz4, "lz4", "lzo"),
            (Compression::Zstd, "zstd", "zstd"),
        ]
    };
    for &(codec, ours_name, ubifs_name) in codecs {
        // Twice the corpus, and at least the RCFFS chip: room for the copy and the cleaner.
        let blocks = (((2 * bytes) >> 17) as u32 + 64).max(1024).next_power_of_two();
        let g = Geometry::new(2048, 64, 64, blocks).map_err(|e| e.to_string())?;
        let nand = RamNand::new(g).map_err(|e| e.to_string())?.with_timing(Timing::NONE);
        let fsopts = FsOptions { compression: codec, dirty_limit: 1 << 20, ..FsOptions::default() };
        let mut fs = Fs::format(nand, FsConfig::default(), fsopts).map_err(|e| e.to_string())?;
        copy(&mut fs, ROOT, &tree)?;
        fs.checkpoint().map_err(|e| e.to_string())?;
        let copied = Footprint::of(&fs);
        let anchor_name = format!("UBIFS {ubifs_name} image");
        let ubifs = ubifs_image(dir, ubifs_name).map(|b| mb(b as f64));
        let row = |case: String, ours: f64| Row {
            bench: "corpus",
            case,
            ours: mb(ours),
            anchor: if ubifs.is_some() { anchor_name.clone() } else { "mkfs.ubifs not installed".into() },
            anchor_value: ubifs,
            unit: "MB",
            better: Better::Lower,
        };
        let mut end = copied;
        if codec == Compression::Lz4 {
            emit(row(format!("{name}, {ours_name}: stored as written (fast lz4)"), copied.stored));
            fs.compact().map_err(|e| e.to_string())?;
            fs.checkpoint().map_err(|e| e.to_string())?;
            end = Footprint::of(&fs);
            emit(row(
                format!("{name}, {ours_name}: stored after the cleaner (lz4 level {})", fsopts.lz4_level),
                end.stored,
            ));
        } else {
            emit(row(format!("{name}, {ours_name}: data and metadata stored"), end.stored));
        }
        emit(row(format!("{name}, {ours_name}: stored, with parity (p=1, s=1)"), end.stored * end.parity));
        emit(row(format!("{name}, {ours_name}: flash programmed by the copy"), copied.programmed));
    }
    Ok(())
}
