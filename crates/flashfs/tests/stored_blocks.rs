//! The numbers tools read: `st_blocks` counts the pages a file stores (not its holes), the
//! same whether its index is in RAM, on the flash, or still dirty; `statfs`'s free inodes
//! follow the free space.

mod common;

use bitmend_flashfs::{Compression, Falloc, Fs, FsOptions, Ino, ROOT};
use common::{cfg, chip};

/// 512-byte sectors in a 4 KiB logical page.
const PAGE: u64 = 8;

fn opts(index_chunks: usize) -> FsOptions {
    FsOptions { index_chunks, ..common::opts(Compression::Lz4) }
}

fn remount(fs: Fs<bitmend_media::nand::RamNand>, index_chunks: usize) -> Fs<bitmend_media::nand::RamNand> {
    Fs::open(fs.unmount().unwrap(), opts(index_chunks)).unwrap().0
}

fn blocks(fs: &mut Fs<bitmend_media::nand::RamNand>, ino: Ino) -> u64 {
    fs.stored_blocks(ino)
}

#[test]
fn st_blocks_counts_stored_pages_not_holes() {
    let mut fs = Fs::format(chip(256), cfg(), opts(1024)).unwrap();
    let f = fs.create(ROOT, b"sparse", 0o644, 0, 0).unwrap().ino;
    assert_eq!(blocks(&mut fs, f), 0, "empty");
    fs.setattr(f, bitmend_flashfs::SetAttr { size: Some(1 << 30), ..Default::default() }).unwrap();
    assert_eq!(blocks(&mut fs, f), 0, "1 GiB of hole");
    // Ten pages written, one byte far out: 11 pages, dirty (not yet on the flash).
    fs.write(f, 0, &vec![7u8; 10 * 4096]).unwrap();
    fs.write(f, 100 << 20, b"x").unwrap();
    assert_eq!(blocks(&mut fs, f), 11 * PAGE, "dirty");
    fs.sync().unwrap();
    assert_eq!(blocks(&mut fs, f), 11 * PAGE, "on the flash, index in RAM");
    // Chunk maps out of RAM (a window of one chunk): counted from the maps' summaries.
    let mut fs = remount(fs, 1);
    assert_eq!(blocks(&mut fs, f), 11 * PAGE, "index on the flash");
    // Punching pages 2..5 whole and half of page 6: 4 pages fewer (page 6 keeps data).
    fs.fallocate(f, 2 * 4096, 4 * 4096 + 2048, Falloc::PunchHole).unwrap();
    assert_eq!(blocks(&mut fs, f), 7 * PAGE, "after the punch");
    assert_eq!(fs.read(f, 6 * 4096, 4096).unwrap()[2048..], vec![7u8; 2048][..]);
    let mut fs = remount(fs, 1);
    assert_eq!(blocks(&mut fs, f), 7 * PAGE, "after the punch, remounted");
    // A truncate to mid-page drops the pages past the end; the new last page (a hole, here)
    // is written cut, so it is stored: pages 0, 1 and 3.
    fs.setattr(f, bitmend_flashfs::SetAttr { size: Some(3 * 4096 + 1), ..Default::default() }).unwrap();
    assert_eq!(blocks(&mut fs, f), 3 * PAGE, "after the truncate");
    let mut fs = remount(fs, 1024);
    assert_eq!(blocks(&mut fs, f), 3 * PAGE, "after the truncate, remounted");
}

#[test]
fn free_inodes_follow_the_free_space() {
    let mut fs = Fs::format(chip(256), cfg(), opts(1024)).unwrap();
    let (_, free) = fs.statfs();
    let ffree = fs.free_inodes();
    // Between 64 and 1,024 bytes of flash a file: a count from the space, not a constant.
    assert!(ffree > free / 1024 && ffree < free / 64, "{ffree} free inodes in {free} bytes");
    for i in 0..300 {
        fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let f = fs.create(ROOT, b"big", 0o644, 0, 0).unwrap().ino;
    let mut data = vec![0u8; 1 << 20];
    bitmend_media::rng::Rng::new(3).fill(&mut data);
    fs.write(f, 0, &data).unwrap();
    fs.sync().unwrap();
    let after = fs.free_inodes();
    assert!(after < ffree - 300, "{ffree} then {after} after 301 files and 1 MiB");
    assert_eq!(fs.inode_count(), 302);
}
