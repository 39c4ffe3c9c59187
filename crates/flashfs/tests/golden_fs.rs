//! The checked-in golden file-system image (docs/FORMAT.md, section 8): files in each codec, a
//! directory, a symlink, a hard link, a checkpoint with its health section, and nodes written
//! after the checkpoint that mount must replay. A change to the node format breaks it.

use bitmend_flashfs::Ino;
use bitmend_flashfs::{Compression, Falloc, FileType, Fs, FsConfig, FsOptions, XattrMode, ROOT};
use bitmend_media::nand::{FileNand, Geometry};

/// `fs-v1.img` was written by version 1 (no compression byte); `fs-v2.img` by the current
/// version (writer below).
fn golden_v(version: u32) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/fs-v{version}.img"))
}

fn golden() -> std::path::PathBuf {
    golden_v(bitmend_flashfs::FS_VERSION)
}

fn text(i: u64, len: usize) -> Vec<u8> {
    let words: [&[u8]; 4] = [b"parity ", b"signature ", b"segment ", b"page "];
    words.iter().cycle().skip(i as usize).flat_map(|w| w.iter().copied()).take(len).collect()
}

fn noise(i: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|b| (b.wrapping_mul(2654435761).wrapping_add(i * 97) >> 7) as u8).collect()
}

/// File `i`'s name in the version 8 image's directory of many: every tenth is 255 bytes.
fn many_name(i: u64) -> Vec<u8> {
    let mut n = format!("f{i:03}-").into_bytes();
    n.resize(if i.is_multiple_of(10) { 255 } else { 12 }, b'n');
    n
}

fn opts(c: Compression) -> FsOptions {
    FsOptions { compression: c, dirty_limit: 64 << 10, ..FsOptions::default() }
}

#[test]
fn golden_file_system_reads_back() {
    for version in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] {
        read_back(version);
    }
}

fn read_back(version: u32) {
    let copy = std::env::temp_dir().join(format!("bitmend-fs-golden-{}-v{version}", std::process::id()));
    std::fs::copy(golden_v(version), &copy).unwrap();
    spares_bound_from_version_6(&copy, version);
    let (mut fs, report) = Fs::open(FileNand::open(&copy).unwrap(), opts(Compression::Lz4)).unwrap();
    assert_eq!(report.pages_repaired, 0);
    // Both reserved blocks now carry this version's superblock: an older build, which does
    // not know the map nodes this mount may write, refuses the image. So do the far copies
    // at the chip's end: its last 2 blocks from version 9 (which keeps them out of the
    // segments), before it the one block that segments of 3 leave over on these chips.
    let last = bitmend_media::nand::Nand::geometry(fs.store().nand()).blocks - 1;
    let far: &[u32] = if version >= 9 { &[0, 1, last - 1, last] } else { &[0, 1, last] };
    for &block in far {
        use bitmend_media::nand::Nand as _;
        let nand = fs.store_mut().nand_mut();
        let g = nand.geometry();
        let (mut page, mut spare) = (vec![0u8; g.page_size as usize], vec![0u8; g.spare_size as usize]);
        nand.read_page(g.first_page(block), &mut page, &mut spare).unwrap();
        let v = u32::from_le_bytes(page[8..12].try_into().unwrap());
        assert_eq!(v, bitmend_flashfs::FS_VERSION, "version {version} image, block {block}");
    }
    // Versions before 3 have no anchor log: mounted by a scan, which writes an anchored
    // checkpoint, so the next mount follows the chain.
    assert_eq!(report.store.scanned, version < 3, "version {version}: {report:?}");
    check_contents(fs, version);
    let (fs, report) = Fs::open(FileNand::open(&copy).unwrap(), opts(Compression::Lz4)).unwrap();
    assert!(!report.store.scanned && report.store.chain_length >= 1, "version {version}: {report:?}");
    check_contents(fs, version);
    let _ = std::fs::remove_file(copy);
}

/// From version 9 segments start with a copy of the superblock: the golden images mount from
/// it with the reserved blocks and the far copies destroyed (every page reads erased).
#[test]
fn golden_v9_on_mounts_from_a_segment_header_when_every_other_copy_is_gone() {
    use bitmend_media::nand::RawAccess as _;
    for version in 9..=bitmend_flashfs::FS_VERSION {
        let copy =
            std::env::temp_dir().join(format!("bitmend-fs-golden-header-{}-v{version}", std::process::id()));
        std::fs::copy(golden_v(version), &copy).unwrap();
        let mut nand = FileNand::open(&copy).unwrap();
        for block in [0u32, 1, 94, 95] {
            for i in 0..8 {
                nand.raw_write(block * 8 + i, 0, &[0xFF; 2048 + 64]).unwrap();
            }
        }
        let (fs, report) = Fs::open(nand, opts(Compression::Lz4)).unwrap();
        assert!(
            matches!(report.store.superblock, Some(bitmend_flashfs::SuperblockCopy::SegmentHeader { .. })),
            "version {version}: {report:?}"
        );
        if version == bitmend_flashfs::FS_VERSION {
            // (An older image's copies are all rewritten as this version's by its upgrade.)
            assert_eq!((report.superblocks_damaged, report.superblocks_rewritten), (4, 4));
        }
        check_contents(fs, version);
        let _ = std::fs::remove_file(copy);
    }
}

/// Segment 0's first page (block 2, page 0 = chip page 16): from version 6 its spare's kind
/// byte has bit 7 set and its CRC covers the address, so it reads as no spare anywhere else.
fn spares_bound_from_version_6(image: &std::path::Path, version: u32) {
    use bitmend_flashfs::Spare;
    use bitmend_media::nand::RawAccess as _;
    let mut nand = FileNand::open(image).unwrap();
    let mut raw = vec![0u8; 2048 + 64];
    nand.raw_read(16, &mut raw).unwrap();
    let spare = &raw[2048..];
    assert_eq!(spare[0] & 0x80 != 0, version >= 6, "version {version}: kind byte {:#x}", spare[0]);
    assert!(Spare::decode(spare, 16).is_some(), "version {version}");
    assert_eq!(Spare::decode(spare, 17).is_some(), version < 6, "version {version}: read at page 17");
}

fn check_contents(mut fs: Fs<FileNand>, version: u32) {
    let check = fs.check(true);
    assert!(check.clean(), "version {version}: {:?}", check.problems);
    let get = |fs: &mut Fs<FileNand>, dir: Ino, name: &[u8]| fs.lookup(dir, name).unwrap();
    let docs = get(&mut fs, ROOT, b"docs");
    assert_eq!(docs.kind, FileType::Dir);
    let a = get(&mut fs, docs.ino, b"lz4.txt");
    assert_eq!(fs.read(a.ino, 0, 1 << 20).unwrap(), text(1, 20_000));
    let b = get(&mut fs, docs.ino, b"zstd.txt");
    assert_eq!(fs.read(b.ino, 0, 1 << 20).unwrap(), text(2, 9_000));
    let c = get(&mut fs, ROOT, b"raw.bin");
    assert_eq!((c.perm, c.uid, c.gid), (0o600, 1000, 1000));
    assert_eq!(fs.read(c.ino, 0, 1 << 20).unwrap(), noise(3, 12_345));
    let link = get(&mut fs, ROOT, b"hard");
    assert_eq!((link.ino, link.nlink), (c.ino, 2));
    let sym = get(&mut fs, ROOT, b"sym");
    assert_eq!(fs.readlink(sym.ino).unwrap(), b"docs/lz4.txt");
    // Written after the checkpoint: replayed from the log.
    let late = get(&mut fs, docs.ino, b"after-checkpoint");
    assert_eq!(fs.read(late.ino, 0, 1 << 20).unwrap(), noise(4, 3_000));
    if version >= 7 {
        // A symlink target held as data, extended attributes from the checkpoint and from
        // the log, a hole punched (a page dropped, the edges zeroed).
        let long = get(&mut fs, ROOT, b"long-sym");
        assert_eq!(fs.readlink(long.ino).unwrap(), text(5, 2_000));
        assert_eq!(fs.getxattr(c.ino, b"user.origin").unwrap(), b"golden");
        assert_eq!(fs.getxattr(c.ino, b"security.label").unwrap(), b"s0");
        assert_eq!(fs.getxattr(docs.ino, b"user.late").unwrap(), b"replayed");
        let p = get(&mut fs, ROOT, b"punched");
        let mut want = text(6, 16_384);
        want[3_000..11_000].fill(0);
        assert_eq!(fs.read(p.ino, 0, 1 << 20).unwrap(), want);
    }
    if version >= 8 {
        // Read from the groups the checkpoint names.
        let many = get(&mut fs, ROOT, b"many");
        assert_eq!(fs.readdir(many.ino).unwrap().len(), 300);
        for i in 0..300u64 {
            let f = get(&mut fs, many.ino, &many_name(i));
            assert_eq!(fs.read(f.ino, 0, 1 << 20).unwrap(), text(i, 100 + i as usize), "file {i}");
        }
    }
    let h = fs.health();
    assert_eq!((h.scrub_passes, h.pages_scrubbed > 0), (1, true), "{h:?}");
    assert!(fs.check(true).clean());
    let recorded = if version == 1 { None } else { Some(Compression::Lz4) };
    assert_eq!(fs.recorded_compression(), recorded, "version {version}");
    fs.unmount().unwrap();
}

/// Writes the golden image (run with --ignored after a deliberate format change, and bump
/// the version in FORMAT.md).
#[test]
#[ignore]
fn write_golden_fs() {
    let _ = std::fs::remove_file(golden());
    // Version 8's image is four times version 7's: its 300 more files need the room.
    let nand = FileNand::create(golden(), Geometry::new(2048, 64, 8, 96).unwrap()).unwrap();
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 3 };
    let mut fs = Fs::format(nand, cfg, opts(Compression::Lz4)).unwrap();
    let docs = fs.mkdir(ROOT, b"docs", 0o755, 0, 0).unwrap();
    let a = fs.create(docs.ino, b"lz4.txt", 0o644, 0, 0).unwrap();
    fs.write(a.ino, 0, &text(1, 20_000)).unwrap();
    fs.sync().unwrap();
    // Version 5: pages 0 to 3 in one node.
    assert_eq!(fs.stats().multi_page_nodes, 1);
    let nand = fs.unmount().unwrap();
    let (mut fs, _) = Fs::open(nand, opts(Compression::Zstd)).unwrap();
    let b = fs.create(docs.ino, b"zstd.txt", 0o644, 0, 0).unwrap();
    fs.write(b.ino, 0, &text(2, 9_000)).unwrap();
    fs.sync().unwrap();
    let nand = fs.unmount().unwrap();
    let (mut fs, _) = Fs::open(nand, opts(Compression::None)).unwrap();
    let c = fs.create(ROOT, b"raw.bin", 0o600, 1000, 1000).unwrap();
    fs.write(c.ino, 0, &noise(3, 12_345)).unwrap();
    fs.link(c.ino, ROOT, b"hard").unwrap();
    fs.symlink(ROOT, b"sym", b"docs/lz4.txt", 0, 0).unwrap();
    // Version 7: a long symlink, extended attributes, a punched hole.
    fs.symlink(ROOT, b"long-sym", &text(5, 2_000), 0, 0).unwrap();
    fs.setxattr(c.ino, b"user.origin", b"golden", XattrMode::Create).unwrap();
    fs.setxattr(c.ino, b"security.label", b"s0", XattrMode::Any).unwrap();
    let p = fs.create(ROOT, b"punched", 0o644, 0, 0).unwrap();
    fs.write(p.ino, 0, &text(6, 16_384)).unwrap();
    fs.fallocate(p.ino, 3_000, 8_000, Falloc::PunchHole).unwrap();
    // Version 8: a namespace in several groups (300 files, some with the longest names).
    let many = fs.mkdir(ROOT, b"many", 0o755, 0, 0).unwrap();
    for i in 0..300u64 {
        let f = fs.create(many.ino, &many_name(i), 0o644, 0, 0).unwrap();
        fs.write(f.ino, 0, &text(i, 100 + i as usize)).unwrap();
    }
    fs.scrub().unwrap();
    fs.checkpoint().unwrap();
    let late = fs.create(docs.ino, b"after-checkpoint", 0o644, 0, 0).unwrap();
    fs.write(late.ino, 0, &noise(4, 3_000)).unwrap();
    fs.setxattr(docs.ino, b"user.late", b"replayed", XattrMode::Any).unwrap();
    fs.sync().unwrap();
    assert!(fs.stats().groups >= 4, "{:?}", fs.stats());
    // Not unmounted: the last nodes are found by replay, as after a crash.
    drop(fs);
}

#[test]
fn the_compression_chosen_at_mkfs_is_recorded() {
    use bitmend_media::nand::RamNand;
    for c in [Compression::None, Compression::Lz4, Compression::Zstd] {
        let nand = RamNand::new(Geometry::new(2048, 64, 8, 24).unwrap()).unwrap();
        let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 3 };
        let fs = Fs::format(nand, cfg, opts(c)).unwrap();
        // Opened with another choice: the recorded one is still the one made at mkfs.
        let (fs, _) = Fs::open(fs.unmount().unwrap(), opts(Compression::None)).unwrap();
        assert_eq!(fs.recorded_compression(), Some(c));
    }
    // The version 1 golden image predates the record: none.
    let copy = std::env::temp_dir().join(format!("bitmend-fs-golden-codec-{}", std::process::id()));
    std::fs::copy(golden_v(1), &copy).unwrap();
    let (fs, _) = Fs::open(FileNand::open(&copy).unwrap(), opts(Compression::Lz4)).unwrap();
    assert_eq!(fs.recorded_compression(), None);
    drop(fs);
    let _ = std::fs::remove_file(copy);
}
