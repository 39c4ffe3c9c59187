//! The NVRAM tier: its dirty state store (a PRIMS log of the tier's records) and the heap of
//! slots holding dirty pages, as a crash of the daemon leaves them, mounted over the flash.

use std::collections::HashSet;
use std::sync::OnceLock;

use bitmend_flashfs::{Compression, Fs, FsConfig, FsOptions, ROOT};
use bitmend_media::nand::{Geometry, RamNand, Timing};
use bitmend_media::pmem::{RamRegion, Region};
use bitmend_tier::{crash, mount, DirtyTier, Entry};

use crate::patches::apply;

fn opts() -> FsOptions {
    FsOptions { compression: Compression::Lz4, ..FsOptions::default() }
}

/// The chip and the tier's log and heap after writes the tier held and the flash did not:
/// pages in runs and in place, a truncate, a directory, a rename; then a crash.
fn base() -> &'static (RamNand, RamRegion, RamRegion) {
    static BASE: OnceLock<(RamNand, RamRegion, RamRegion)> = OnceLock::new();
    BASE.get_or_init(|| {
        let chip = RamNand::new(Geometry::new(2048, 64, 16, 64).expect("a geometry")).expect("a chip");
        let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 };
        let fs = Fs::format(chip.with_timing(Timing::NONE), cfg, opts()).expect("a file system");
        let id = fs.store().fs_id();
        let nand = fs.unmount().expect("unmount");
        let tier =
            DirtyTier::create_for(RamRegion::new(256 << 10), RamRegion::new(2 << 20), id).expect("a tier");
        let (log, heap) = tier.into_regions();
        let (mut fs, _, _) = mount(nand, opts(), log, heap).expect("a mount");
        let dir = fs.mkdir(ROOT, b"d", 0o755, 0, 0).expect("mkdir");
        for i in 0..6u64 {
            let f = fs.create(dir.ino, format!("f{i}").as_bytes(), 0o644, 0, 0).expect("create");
            fs.write(f.ino, 0, &vec![i as u8 + 1; 3000 + 7000 * i as usize]).expect("write");
            fs.write(f.ino, 100, b"small change").expect("write");
            fs.fsync(f.ino).expect("fsync");
        }
        let f = fs.lookup(dir.ino, b"f5").expect("lookup");
        let _ = fs.setattr(f.ino, bitmend_flashfs::SetAttr { size: Some(5000), ..Default::default() });
        fs.rename(dir.ino, b"f1", ROOT, b"moved").expect("rename");
        let _ = fs.fsync(f.ino);
        let (nand, regions) = crash::<RamNand, RamRegion, RamRegion>(fs);
        let (log, heap) = regions.expect("the tier's regions");
        // The base must give recovery something to do, or the target fuzzes nothing.
        let (_, _, found) = mount(nand.clone(), opts(), log.clone(), heap.clone()).expect("a mount");
        assert!(found.pages_found > 0 && found.node_records > 0, "{found:?}");
        (nand, log, heap)
    })
}

/// Damages the tier's log (first input byte even) or heap (odd), mounts over it, and walks
/// the tree; whether the mount succeeded.
pub fn tier_image(data: &[u8]) -> bool {
    let (nand, mut log, mut heap) = base().clone();
    let Some((&which, patches)) = data.split_first() else { return mounted(nand, log, heap) };
    let region = if which % 2 == 0 { &mut log } else { &mut heap };
    let len = region.len() as u64;
    apply(patches, len, |at, b| region.corrupt(at as usize, b).expect("a patch within the region"));
    mounted(nand, log, heap)
}

fn mounted(nand: RamNand, log: RamRegion, heap: RamRegion) -> bool {
    let Ok((mut fs, _, _)) = mount(nand, opts(), log, heap) else { return false };
    let mut seen = HashSet::new();
    let mut dirs = vec![ROOT];
    while let Some(d) = dirs.pop() {
        if !seen.insert(d) {
            continue;
        }
        for e in fs.readdir(d).unwrap_or_default() {
            match e.kind {
                bitmend_flashfs::FileType::Dir => dirs.push(e.ino),
                _ => {
                    let size = fs.getattr(e.ino).map_or(0, |a| a.size).min(1 << 20);
                    let _ = fs.read(e.ino, 0, size as usize);
                }
            }
        }
    }
    let _ = fs.check(true);
    true
}

/// A tier record, decoded, must encode back to the same bytes.
pub fn record(b: &[u8]) {
    if let Some(e) = Entry::decode(b) {
        assert_eq!(e.encode(), b, "a tier record");
    }
}
