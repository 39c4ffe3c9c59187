//! Both copies of the superblock: a damaged copy (zeroed, random, erased) in either reserved
//! block is found at mount and by scrub, reported, and rewritten from the good one; both
//! copies lost still mount, from the copy every anchor carries; and a power cut at every
//! operation of the rewrite leaves an image that mounts with every file intact.

mod common;

use bitmend_flashfs::Ino;
use bitmend_flashfs::{Compression, Fs, FsOptions, ROOT};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::nand::{FaultyNand, RamNand, RawAccess};
use bitmend_media::rng::Rng;
use common::cfg;

const PAGES_PER_BLOCK: u32 = 16;

fn chip() -> RamNand {
    common::chip(96)
}

fn opts() -> FsOptions {
    common::opts(Compression::Lz4)
}

type Files = Vec<(Ino, Vec<u8>)>;

/// A file system with files and `checkpoints` remounts, each of which anchors a checkpoint
/// (enough of them and the anchor log has moved to block 1 and back).
fn populated(checkpoints: u32) -> (RamNand, Files) {
    let mut fs = Fs::format(chip(), cfg(), opts()).unwrap();
    let mut files = Vec::new();
    for i in 0..checkpoints {
        let f = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        let mut data = vec![0u8; 5_000 + i as usize * 300];
        Rng::new(i as u64).fill(&mut data);
        fs.write(f.ino, 0, &data).unwrap();
        files.push((f.ino, data));
        fs.checkpoint().unwrap();
    }
    (fs.unmount().unwrap(), files)
}

fn check_files(fs: &mut Fs<RamNand>, files: &Files, when: &str) {
    for (ino, data) in files {
        assert_eq!(&fs.read(*ino, 0, data.len()).unwrap(), data, "{when}: inode {ino}");
    }
    assert!(fs.check(true).clean(), "{when}: {:?}", fs.check(true).problems);
}

/// Page 0 of `block` holds a whole superblock (magic, CRC) of the current version.
fn good_copy(nand: &mut RamNand, block: u32) -> bool {
    let mut raw = vec![0u8; 2048 + 64];
    nand.raw_read(block * PAGES_PER_BLOCK, &mut raw).unwrap();
    let crc = bitmend_code::crc::crc32c(&raw[..60]);
    &raw[..8] == b"BMFLASH\0"
        && u32::from_le_bytes(raw[8..12].try_into().unwrap()) == bitmend_flashfs::FS_VERSION
        && raw[60..64] == crc.to_le_bytes()
}

/// Damages page 0 of `block` one of three ways; says which.
fn damage(nand: &mut RamNand, block: u32, how: u32) -> &'static str {
    let page = block * PAGES_PER_BLOCK;
    let mut raw = vec![0u8; 2048 + 64];
    match how {
        0 => {
            raw.fill(0);
            nand.raw_write(page, 0, &raw).unwrap();
            "zeroed"
        }
        1 => {
            Rng::new(page as u64 + 99).fill(&mut raw);
            nand.raw_write(page, 0, &raw).unwrap();
            "random bytes"
        }
        _ => {
            // One byte of the geometry changed (the CRC now fails).
            nand.raw_read(page, &mut raw).unwrap();
            raw[13] ^= 0x40;
            nand.raw_write(page, 0, &raw).unwrap();
            "one byte changed"
        }
    }
}

#[test]
fn a_damaged_copy_in_either_block_is_found_at_mount_and_rewritten() {
    // 3 and 20 checkpoints: the anchor log in block 0, then moved on to block 1, so each
    // block is once the log's own (its copy is rewritten by moving the log out and back)
    // and once the other one.
    for checkpoints in [3, 20] {
        for block in 0..2u32 {
            for how in 0..3 {
                let (mut nand, files) = populated(checkpoints);
                let what = damage(&mut nand, block, how);
                let when = format!("{checkpoints} checkpoints, block {block} {what}");
                assert!(!good_copy(&mut nand, block), "{when}");
                let (mut fs, report) = Fs::open(nand, opts()).unwrap();
                assert_eq!((report.superblocks_damaged, report.superblocks_rewritten), (1, 1), "{when}");
                check_files(&mut fs, &files, &when);
                let mut nand = fs.unmount().unwrap();
                assert!(good_copy(&mut nand, 0) && good_copy(&mut nand, 1), "{when}: both copies good again");
                let (mut fs, report) = Fs::open(nand, opts()).unwrap();
                assert_eq!(report.superblocks_damaged, 0, "{when}: after the rewrite");
                check_files(&mut fs, &files, &format!("{when}, remounted"));
            }
        }
    }
}

#[test]
fn scrub_finds_a_copy_damaged_while_mounted() {
    for block in 0..2u32 {
        let (nand, files) = populated(20);
        let (mut fs, _) = Fs::open(nand, opts()).unwrap();
        damage(fs.store_mut().nand_mut(), block, 0);
        let r = fs.scrub().unwrap();
        assert_eq!((r.superblocks_damaged, r.superblocks_rewritten), (1, 1), "block {block}: {r:?}");
        check_files(&mut fs, &files, &format!("block {block}, after scrub"));
        let r = fs.scrub().unwrap();
        assert_eq!(r.superblocks_damaged, 0, "block {block}: a second pass: {r:?}");
        let mut nand = fs.unmount().unwrap();
        assert!(good_copy(&mut nand, 0) && good_copy(&mut nand, 1));
    }
}

#[test]
fn both_copies_lost_still_mount_from_the_anchors() {
    let (mut nand, files) = populated(20);
    damage(&mut nand, 0, 0);
    damage(&mut nand, 1, 1);
    let (mut fs, report) = Fs::open(nand, opts()).unwrap();
    assert_eq!((report.superblocks_damaged, report.superblocks_rewritten), (2, 2));
    check_files(&mut fs, &files, "both copies lost");
    let mut nand = fs.unmount().unwrap();
    assert!(good_copy(&mut nand, 0) && good_copy(&mut nand, 1));
}

/// The rewrite erases reserved blocks: a power cut at each of its operations, in each
/// block, must leave an image that mounts (from a good copy or an anchor's) with every
/// file, and whose next mount finishes the repair.
#[test]
fn a_power_cut_at_every_step_of_the_rewrite_loses_nothing() {
    let mut cuts = 0;
    for checkpoints in [3, 20] {
        for block in 0..2u32 {
            let (mut nand, files) = populated(checkpoints);
            damage(&mut nand, block, 1);
            let base = FaultyNand::new(nand, 0);
            let mount = |chip: &mut FaultyNand<RamNand>| Fs::open(chip, opts()).is_ok();
            let c = campaign::run(&base, Schedule::Every, mount, |chip, op| {
                let when = format!("{checkpoints} checkpoints, block {block}, cut at op {op}");
                let (mut fs, _) =
                    Fs::open(chip.into_inner(), opts()).unwrap_or_else(|e| panic!("{when}: {e}"));
                check_files(&mut fs, &files, &when);
                let mut after = fs.unmount().unwrap();
                assert!(good_copy(&mut after, 0) && good_copy(&mut after, 1), "{when}");
            });
            cuts += c.cuts;
        }
    }
    assert!(cuts >= 12, "{cuts} power cuts");
    eprintln!("{cuts} power cuts, every file read back after each");
}
