//! The file system outlives its first erase blocks: a destroyed reserved block (its pages
//! read erased while the chip counts them programmed, as when an image's bytes are zeroed),
//! both reserved blocks, and with them the far copies at the chip's end. Each mount says
//! which superblock copy it used and rewrites every lost one; a power cut at every step of
//! that recovery loses no file.

mod common;

use bitmend_flashfs::FormatError;
use bitmend_flashfs::{Compression, Fs, FsError, FsOptions, Ino, SuperblockCopy, ROOT};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::nand::{FaultyNand, RamNand, RawAccess};
use bitmend_media::rng::Rng;
use common::cfg;

const PAGES_PER_BLOCK: u32 = 16;
const BLOCKS: u32 = 96;
/// Segments of 4 blocks after the 2 reserved ones, 2 blocks kept at the end: (96 - 4) / 4 =
/// 23 segments, so blocks 94 and 95 hold the far copies.
const FAR: [u32; 2] = [95, 94];

type Files = Vec<(Ino, Vec<u8>)>;

fn opts() -> FsOptions {
    common::opts(Compression::Lz4)
}

/// A file system with files and `checkpoints` remounts (enough of them and the anchor log
/// has moved from block 0 to block 1).
fn populated(checkpoints: u32) -> (RamNand, Files) {
    let mut fs = Fs::format(common::chip(BLOCKS), cfg(), opts()).unwrap();
    let mut files = Vec::new();
    for i in 0..checkpoints {
        let f = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        let mut data = vec![0u8; 7_000 + i as usize * 500];
        Rng::new(i as u64 + 40).fill(&mut data);
        fs.write(f.ino, 0, &data).unwrap();
        files.push((f.ino, data));
        fs.checkpoint().unwrap();
    }
    (fs.unmount().unwrap(), files)
}

/// Every page of `block` reads erased, data and spare, while the chip still counts it
/// programmed: it must be erased before anything is written there again.
fn destroy(nand: &mut RamNand, block: u32) {
    for i in 0..PAGES_PER_BLOCK {
        nand.raw_write(block * PAGES_PER_BLOCK + i, 0, &[0xFF; 2048 + 64]).unwrap();
    }
}

fn check_files<N: bitmend_media::nand::Nand>(fs: &mut Fs<N>, files: &Files, when: &str) {
    for (ino, data) in files {
        assert_eq!(&fs.read(*ino, 0, data.len()).unwrap(), data, "{when}: inode {ino}");
    }
    let check = fs.check(true);
    assert!(check.clean(), "{when}: {:?}", check.problems);
}

/// Page 0 of `block` is a whole superblock of this version (magic, version, CRC).
fn good_copy(nand: &mut RamNand, block: u32) -> bool {
    let mut raw = vec![0u8; 2048 + 64];
    nand.raw_read(block * PAGES_PER_BLOCK, &mut raw).unwrap();
    &raw[..8] == b"BMFLASH\0"
        && u32::from_le_bytes(raw[8..12].try_into().unwrap()) == bitmend_flashfs::FS_VERSION
        && raw[60..64] == bitmend_code::crc::crc32c(&raw[..60]).to_le_bytes()
}

fn every_copy_good(nand: &mut RamNand, when: &str) {
    for b in [0, 1, FAR[0], FAR[1]] {
        assert!(good_copy(nand, b), "{when}: the copy in block {b}");
    }
}

/// Mounts after the damage, checks every file, unmounts, checks every copy rewritten, and
/// mounts again from the first reserved block, by the anchor log.
fn recovers(nand: RamNand, files: &Files, from: SuperblockCopy, damaged: u64, when: &str) {
    let (mut fs, report) = Fs::open(nand, opts()).unwrap_or_else(|e| panic!("{when}: {e}"));
    assert_eq!(report.store.superblock, Some(from), "{when}");
    assert_eq!((report.superblocks_damaged, report.superblocks_rewritten), (damaged, damaged), "{when}");
    check_files(&mut fs, files, when);
    let mut nand = fs.unmount().unwrap();
    every_copy_good(&mut nand, when);
    let (mut fs, report) = Fs::open(nand, opts()).unwrap();
    assert_eq!(report.store.superblock, Some(SuperblockCopy::Reserved { block: 0 }), "{when}, remounted");
    assert_eq!(report.superblocks_damaged, 0, "{when}, remounted");
    assert!(!report.store.scanned, "{when}: the next mount follows the anchor log");
    check_files(&mut fs, files, &format!("{when}, remounted"));
}

#[test]
fn a_new_file_system_has_far_copies() {
    let (mut nand, _) = populated(1);
    every_copy_good(&mut nand, "after mkfs");
}

#[test]
fn a_destroyed_first_block_still_mounts() {
    // 3 checkpoints: the anchor log is in block 0; 40: it has moved on to block 1.
    for checkpoints in [3, 40] {
        let (mut nand, files) = populated(checkpoints);
        destroy(&mut nand, 0);
        let when = format!("{checkpoints} checkpoints, block 0 destroyed");
        recovers(nand, &files, SuperblockCopy::Reserved { block: 1 }, 1, &when);
    }
}

#[test]
fn destroyed_reserved_blocks_mount_from_a_far_copy() {
    for checkpoints in [3, 40] {
        let (mut nand, files) = populated(checkpoints);
        destroy(&mut nand, 0);
        destroy(&mut nand, 1);
        let when = format!("{checkpoints} checkpoints, blocks 0 and 1 destroyed");
        recovers(nand, &files, SuperblockCopy::Far { block: FAR[0] }, 2, &when);
    }
}

#[test]
fn every_copy_lost_mounts_from_a_segment_header() {
    for checkpoints in [3, 40] {
        let (mut nand, files) = populated(checkpoints);
        for b in [0, 1, FAR[0], FAR[1]] {
            destroy(&mut nand, b);
        }
        let when = format!("{checkpoints} checkpoints, reserved and far blocks destroyed");
        let (fs, report) = Fs::open(nand.clone(), opts()).unwrap();
        let Some(SuperblockCopy::SegmentHeader { page }) = report.store.superblock else {
            panic!("{when}: {:?}", report.store.superblock)
        };
        drop(fs);
        recovers(nand, &files, SuperblockCopy::SegmentHeader { page }, 4, &when);
    }
}

#[test]
fn with_no_copy_anywhere_the_image_is_refused_and_says_why() {
    let (mut nand, _) = populated(3);
    for b in 0..BLOCKS {
        destroy(&mut nand, b);
    }
    match Fs::open(nand, opts()) {
        Err(FsError::Format(FormatError::NotAFs { why })) => {
            assert!(why.contains("no readable superblock") && why.contains("segment"), "{why}")
        }
        other => panic!("{:?}", other.map(|(_, r)| r)),
    }
}

#[test]
fn scrub_rewrites_a_far_copy_damaged_while_mounted() {
    let (nand, files) = populated(3);
    let (mut fs, _) = Fs::open(nand, opts()).unwrap();
    destroy(fs.store_mut().nand_mut(), FAR[1]);
    let r = fs.scrub().unwrap();
    assert_eq!((r.superblocks_damaged, r.superblocks_rewritten), (1, 1), "{r:?}");
    check_files(&mut fs, &files, "after scrub");
    let mut nand = fs.unmount().unwrap();
    every_copy_good(&mut nand, "after scrub");
}

/// The recovery mount erases and writes reserved and far blocks: a power cut at each of its
/// flash operations must leave an image that mounts with every file, and whose next mount
/// has every copy back.
#[test]
fn a_power_cut_at_every_step_of_the_recovery_loses_nothing() {
    let mut cuts = 0;
    for destroyed in [&[0u32, 1][..], &[0, 1, FAR[0], FAR[1]]] {
        let (mut nand, files) = populated(3);
        for &b in destroyed {
            destroy(&mut nand, b);
        }
        let base = FaultyNand::new(nand, 0);
        let mount = |chip: &mut FaultyNand<RamNand>| Fs::open(chip, opts()).is_ok();
        let c = campaign::run(&base, Schedule::Every, mount, |chip, op| {
            let when = format!("blocks {destroyed:?} destroyed, cut at op {op}");
            let (mut fs, _) = Fs::open(chip.into_inner(), opts()).unwrap_or_else(|e| panic!("{when}: {e}"));
            check_files(&mut fs, &files, &when);
            let mut after = fs.unmount().unwrap();
            every_copy_good(&mut after, &when);
        });
        cuts += c.cuts;
    }
    assert!(cuts >= 10, "{cuts} power cuts");
    eprintln!("{cuts} power cuts, every file read back after each");
}
