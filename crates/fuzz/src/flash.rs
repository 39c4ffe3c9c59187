//! The flash file system: the image's spares and pages, superblock copies, the anchor log,
//! checkpoints, namespace groups and map nodes, the nodes written after the checkpoint that
//! a mount replays, segment parity.

use std::collections::HashSet;
use std::sync::OnceLock;

use bitmend_flashfs::{Compression, FileType, Fs, FsConfig, FsOptions, Ino, XattrMode, ROOT};
use bitmend_media::nand::{Geometry, Nand, RamNand, RawAccess, Timing};

use crate::patches::apply;

/// Bytes a target reads from one file at most: a damaged size must not make it ask for
/// more memory than the chip holds.
const READ_MAX: u64 = 4 << 20;

fn opts() -> FsOptions {
    FsOptions { compression: Compression::Lz4, dirty_limit: 64 << 10, ..FsOptions::default() }
}

/// A 3 MiB chip holding a checkpointed tree (files in each codec, a directory of 60, a hard
/// link, symlinks, extended attributes) and nodes written after the checkpoint.
fn base() -> &'static RamNand {
    static BASE: OnceLock<RamNand> = OnceLock::new();
    BASE.get_or_init(|| {
        let nand = RamNand::new(Geometry::new(2048, 64, 8, 96).expect("a geometry")).expect("a chip");
        let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 3 };
        let mut fs = Fs::format(nand.with_timing(Timing::NONE), cfg, opts()).expect("a file system");
        let docs = fs.mkdir(ROOT, b"docs", 0o755, 0, 0).expect("mkdir");
        for (i, len) in [20_000usize, 9_000, 300, 0].into_iter().enumerate() {
            let f = fs.create(docs.ino, format!("f{i}").as_bytes(), 0o644, 0, 0).expect("create");
            let text: Vec<u8> = b"parity signature segment ".iter().cycle().take(len).copied().collect();
            fs.write(f.ino, 0, &text).expect("write");
        }
        let raw = fs.create(ROOT, b"raw.bin", 0o600, 1000, 1000).expect("create");
        let noise: Vec<u8> = (0..12_345u64).map(|b| (b.wrapping_mul(2_654_435_761) >> 7) as u8).collect();
        fs.write(raw.ino, 0, &noise).expect("write");
        fs.link(raw.ino, ROOT, b"hard").expect("link");
        fs.symlink(ROOT, b"sym", b"docs/f0", 0, 0).expect("symlink");
        fs.setxattr(raw.ino, b"user.origin", b"fuzz", XattrMode::Create).expect("xattr");
        let many = fs.mkdir(ROOT, b"many", 0o755, 0, 0).expect("mkdir");
        for i in 0..60u32 {
            fs.create(many.ino, format!("n{i:03}").as_bytes(), 0o644, 0, 0).expect("create");
        }
        let nand = fs.unmount().expect("unmount");
        // Nodes after the checkpoint, which a mount replays.
        let (mut fs, _) = Fs::open(nand, opts()).expect("mount");
        let late = fs.create(ROOT, b"late", 0o644, 0, 0).expect("create");
        fs.write(late.ino, 0, &[7u8; 5000]).expect("write");
        fs.sync().expect("sync");
        fs.into_nand()
    })
}

/// Mounts the damaged chip, walks and reads every file, checks it, writes, unmounts and
/// mounts again; whether it mounted.
pub fn flash_image(data: &[u8]) -> bool {
    let mut nand = base().clone();
    let g = nand.geometry();
    let page_len = g.raw_page_size() as u64;
    apply(data, g.pages() as u64 * page_len, |at, b| {
        // A patch stays within its page (the rest of it is dropped).
        let (page, offset) = (at / page_len, at % page_len);
        let n = b.len().min((page_len - offset) as usize);
        nand.raw_write(page as u32, offset as usize, &b[..n]).expect("a patch within the chip");
    });
    let Ok((mut fs, _)) = Fs::open(nand, opts()) else { return false };
    walk(&mut fs, ROOT, &mut HashSet::new());
    let _ = fs.check(true);
    if let Ok(f) = fs.create(ROOT, b"after", 0o644, 0, 0) {
        let _ = fs.write(f.ino, 0, b"after the damage");
    }
    let _ = fs.sync();
    if let Ok((mut fs, _)) = fs.unmount().and_then(|nand| Fs::open(nand, opts())) {
        walk(&mut fs, ROOT, &mut HashSet::new());
    }
    true
}

/// Every entry under `dir`, each directory once (damage may make a cycle).
fn walk<N: Nand>(fs: &mut Fs<N>, dir: Ino, seen: &mut HashSet<Ino>) {
    if !seen.insert(dir) {
        return;
    }
    let Ok(entries) = fs.readdir(dir) else { return };
    for e in entries {
        let _ = fs.lookup(dir, &e.name);
        let Ok(attr) = fs.getattr(e.ino) else { continue };
        match e.kind {
            FileType::Dir => walk(fs, e.ino, seen),
            FileType::Symlink => {
                let _ = fs.readlink(e.ino);
            }
            _ => {
                let _ = fs.listxattr(e.ino);
                let mut off = 0;
                while off < attr.size.min(READ_MAX) {
                    if fs.read(e.ino, off, 64 << 10).is_err() {
                        break;
                    }
                    off += 64 << 10;
                }
            }
        }
    }
}
