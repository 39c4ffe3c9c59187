//! The NAND image file: it reopens as the same chip, and refuses what is not one.

use std::io::{Seek, SeekFrom, Write};

use bitmend_media::nand::{FileNand, Geometry, Nand, NandError, RawAccess};

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("bitmend-image-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

fn small() -> Geometry {
    Geometry::new(1024, 32, 4, 8).unwrap()
}

#[test]
fn reopen_gives_the_same_contents_erase_counts_bad_marks_and_program_positions() {
    let path = temp_path("reopen.img");
    let g = small();
    let d: Vec<u8> = (0..g.page_size).map(|i| (i * 7) as u8).collect();
    let s: Vec<u8> = (0..g.spare_size).map(|i| (i * 3) as u8).collect();
    {
        let mut n = FileNand::create(&path, g).unwrap();
        n.erase(2).unwrap();
        n.erase(2).unwrap();
        n.program(g.first_page(2) + 1, &d, &s).unwrap();
        n.mark_bad(6).unwrap();
        n.sync().unwrap();
    }
    let mut n = FileNand::open(&path).unwrap();
    assert_eq!(n.geometry(), g, "geometry comes from the header");
    assert_eq!(n.erase_count(2).unwrap(), 2);
    assert_eq!(n.erase_count(1).unwrap(), 0);
    assert!(n.is_bad(6).unwrap());
    let mut rd = vec![0; g.page_size as usize];
    let mut rs = vec![0; g.spare_size as usize];
    n.read_page(g.first_page(2) + 1, &mut rd, &mut rs).unwrap();
    assert_eq!((rd, rs), (d.clone(), s.clone()));
    // The program position survived: going back is still refused.
    assert!(matches!(n.program(g.first_page(2), &d, &s), Err(NandError::NotProgrammable { .. })));
    assert_eq!(n.block_state(2).unwrap().next_index, 2);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn an_open_image_is_locked_against_a_second_opener() {
    let path = temp_path("lock.img");
    let n = FileNand::create(&path, small()).unwrap();
    assert!(matches!(FileNand::open(&path), Err(NandError::Locked { .. })));
    drop(n);
    FileNand::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn create_refuses_to_overwrite() {
    let path = temp_path("exists.img");
    std::fs::write(&path, b"precious").unwrap();
    assert!(matches!(FileNand::create(&path, small()), Err(NandError::Io { .. })));
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn missing_file_not_an_image_wrong_version_damaged_and_truncated() {
    let missing = temp_path("missing.img");
    assert!(matches!(FileNand::open(&missing), Err(NandError::Io { .. })));

    let junk = temp_path("junk.img");
    std::fs::write(&junk, vec![0x42u8; 10_000]).unwrap();
    let e = FileNand::open(&junk).unwrap_err();
    assert!(matches!(e, NandError::NotAnImage { .. }), "{e}");
    assert!(e.to_string().contains("not a bitmend NAND image"));

    let tiny = temp_path("tiny.img");
    std::fs::write(&tiny, b"BMND").unwrap();
    assert!(matches!(FileNand::open(&tiny), Err(NandError::NotAnImage { .. })));

    let path = temp_path("versions.img");
    drop(FileNand::create(&path, small()).unwrap());
    let mut header = std::fs::read(&path).unwrap()[..4096].to_vec();
    // A future version, with a valid checksum: a version error, not "damaged".
    header[8..12].copy_from_slice(&3u32.to_le_bytes());
    let crc = bitmend_code::crc::crc32c(&header[..4092]);
    header[4092..].copy_from_slice(&crc.to_le_bytes());
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all(&header).unwrap();
    let e = FileNand::open(&path).unwrap_err();
    assert!(matches!(e, NandError::Version { found: 3, supported: 2, .. }), "{e}");

    // One flipped bit in the geometry: the checksum catches it.
    header[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = bitmend_code::crc::crc32c(&header[..4092]);
    header[4092..].copy_from_slice(&crc.to_le_bytes());
    header[16] ^= 0x04;
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&header).unwrap();
    let e = FileNand::open(&path).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");

    // Truncated data area.
    header[16] ^= 0x04;
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&header).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - 100).unwrap();
    let e = FileNand::open(&path).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    f.set_len(len).unwrap();
    drop(f);
    FileNand::open(&path).unwrap();

    for p in [junk, tiny, path] {
        std::fs::remove_file(p).unwrap();
    }
}

/// The checked-in golden images (docs/FORMAT.md, "NAND image"), one per image version: a
/// 4-block chip with two programmed pages, one erase and one bad block. A change to the
/// layout breaks this test.
#[test]
fn golden_images_read_back() {
    for version in [1, 2] {
        let name = format!("nand-v{version}.img");
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(&name);
        let path = temp_path(&name);
        std::fs::copy(&golden, &path).unwrap();
        let mut n = FileNand::open(&path).unwrap();
        let g = n.geometry();
        assert_eq!(g, Geometry::new(512, 16, 4, 4).unwrap());
        assert_eq!(n.erase_count(1).unwrap(), 1);
        assert!(n.is_bad(3).unwrap());
        assert_eq!(n.block_state(1).unwrap().next_index, 3);
        let mut d = vec![0; 512];
        let mut s = vec![0; 16];
        n.read_page(4, &mut d, &mut s).unwrap();
        assert_eq!(&d[..22], b"bitmend golden image 1", "{name}");
        assert!(d[22..].iter().all(|&b| b == 0));
        assert_eq!(s, (0..16).collect::<Vec<u8>>());
        n.read_page(6, &mut d, &mut s).unwrap();
        assert!(d.iter().all(|&b| b == 0xA5));
        assert!(s.iter().all(|&b| b == 0x5A));
        n.read_page(5, &mut d, &mut s).unwrap();
        assert!(d.iter().chain(&s).all(|&b| b == 0xFF), "{name}: the skipped page stays erased");
        // Still a chip by the rules after the reopen: page 7 programs, page 5 does not.
        n.program(7, &[0x11; 512], &[0x22; 16]).unwrap();
        assert!(n.program(5, &[0; 512], &[0; 16]).is_err());
        n.read_page(7, &mut d, &mut s).unwrap();
        assert!(d.iter().all(|&b| b == 0x11) && s.iter().all(|&b| b == 0x22));
        std::fs::remove_file(&path).unwrap();
    }
    // Version 2 stores the complement: the programmed bytes of page 4 are there inverted.
    let raw =
        std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/nand-v2.img"))
            .unwrap();
    let page4 = 8192 + 4 * 528;
    assert_eq!(raw[page4], !b'b');
    assert_eq!(raw[page4 + 512 + 1], !1u8);
}

/// Writes the golden image of the current version (run with `--ignored` after a deliberate
/// format change, then bump the format version).
#[test]
#[ignore]
fn write_golden_image() {
    let name = format!("tests/golden/nand-v{}.img", bitmend_media::nand::IMAGE_VERSION);
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&golden);
    let mut n = FileNand::create(&golden, Geometry::new(512, 16, 4, 4).unwrap()).unwrap();
    n.erase(1).unwrap();
    let mut d = vec![0u8; 512];
    d[..22].copy_from_slice(b"bitmend golden image 1");
    n.program(4, &d, &(0..16).collect::<Vec<u8>>()).unwrap();
    n.program(6, &[0xA5; 512], &[0x5A; 16]).unwrap();
    n.mark_bad(3).unwrap();
    n.sync().unwrap();
}

/// A new image is a sparse file (made at once, whatever its size) and takes the host's space
/// as blocks are programmed; the pages read the same through all of it, after a reopen, and
/// an erase of a programmed block leaves it erased without taking more.
#[test]
fn a_new_image_is_sparse_and_takes_space_as_blocks_are_programmed() {
    use std::os::unix::fs::MetadataExt;
    let path = temp_path("sparse.img");
    let g = Geometry::new(2048, 64, 64, 8192).unwrap(); // 1 GiB of data
    let allocated = || std::fs::metadata(&path).unwrap().blocks() * 512;
    let mut n = FileNand::create_thin(&path, g).unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() > 1 << 30);
    assert!(allocated() < 1 << 20, "a new image takes {} bytes", allocated());
    let block_bytes = 64 * (2048 + 64) as u64;
    let page = |i: u32| -> Vec<u8> { (0..2048).map(|b| (b as u32 * 7 + i) as u8).collect() };
    for i in 0..64 {
        n.program(5 * 64 + i, &page(i), &[i as u8; 64]).unwrap();
    }
    let used = allocated();
    assert!(used >= block_bytes, "programmed a block, {used} bytes allocated");
    let (mut d, mut s) = (vec![0; 2048], vec![0; 64]);
    n.read_page(5 * 64 + 9, &mut d, &mut s).unwrap();
    assert!(d == page(9) && s == [9; 64]);
    n.read_page(6 * 64, &mut d, &mut s).unwrap();
    assert!(d.iter().chain(&s).all(|&b| b == 0xFF), "a block never written reads erased");
    drop(n);
    let mut n = FileNand::open(&path).unwrap();
    n.read_page(5 * 64 + 63, &mut d, &mut s).unwrap();
    assert!(d == page(63) && s == [63; 64], "after a reopen");
    assert!(n.program(5 * 64 + 10, &page(0), &[0; 64]).is_err(), "program position kept");
    n.erase(5).unwrap();
    n.erase(7).unwrap();
    assert_eq!(allocated(), used, "erases take no space");
    n.read_page(5 * 64 + 9, &mut d, &mut s).unwrap();
    assert!(d.iter().chain(&s).all(|&b| b == 0xFF), "erased");
    n.program(5 * 64, &page(1), &[1; 64]).unwrap();
    n.read_page(5 * 64, &mut d, &mut s).unwrap();
    assert!(d == page(1) && s == [1; 64], "programmed again after the erase");
    drop(n);
    std::fs::remove_file(&path).unwrap();

    // About 8.8 TiB: more than this host has (else skipped). `create` refuses it, naming
    // the need; `create_thin` makes it at once.
    let huge = Geometry::new(65536, 2048, 4096, 32768).unwrap();
    match FileNand::create(&path, huge) {
        Err(NandError::HostFull { need, free, .. }) => assert!(need > free),
        Err(e) => panic!("{e}"),
        Ok(_) => {
            eprintln!("the host has room for 8.8 TiB: skipped");
            std::fs::remove_file(&path).unwrap();
            return;
        }
    }
    assert!(!path.exists(), "a refused image is not made");
    let mut n = FileNand::create_thin(&path, huge).unwrap();
    assert!(allocated() < 4 << 20);
    n.program(7 * 4096, &vec![0x3C; 65536], &vec![0xC3; 2048]).unwrap();
    drop(n);
    std::fs::remove_file(&path).unwrap();
}

/// `create` reserves the host's space for the whole image (no program can find the host
/// full later), and the reserved, never written blocks read erased, before and after a
/// reopen (where the mapping learns which blocks hold data with one `SEEK_DATA` per run of
/// blocks: tmpfs reports reserved, unwritten pages as holes); programs and erases keep
/// the rules there.
#[test]
fn a_made_image_is_reserved_whole_and_reads_erased() {
    made_image_reads_erased(temp_path("thick.img"));
    // Again on tmpfs where there is one: there a reopened image trusts its block count and
    // no block is reserved again, and reserved pages count as holes to SEEK_DATA.
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        made_image_reads_erased(shm.join(format!("bitmend-thick-{}.img", std::process::id())));
    }
}

fn made_image_reads_erased(path: std::path::PathBuf) {
    use std::os::unix::fs::MetadataExt;
    let g = Geometry::new(2048, 64, 64, 256).unwrap(); // 32 MiB of data
    let mut n = FileNand::create(&path, g).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    let supports_fallocate = {
        let probe = temp_path("probe");
        let f = std::fs::File::create(&probe).unwrap();
        // SAFETY: fallocate on a descriptor we own.
        let ok = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, 4096) } == 0;
        std::fs::remove_file(&probe).unwrap();
        ok
    };
    if supports_fallocate {
        assert!(
            meta.blocks() * 512 >= meta.len(),
            "{} of {} bytes reserved",
            meta.blocks() * 512,
            meta.len()
        );
    }
    let page = |i: u32| -> Vec<u8> { (0..2048).map(|b| (b as u32 * 13 + i) as u8).collect() };
    let (mut d, mut s) = (vec![0; 2048], vec![0; 64]);
    let all_erased = |d: &[u8], s: &[u8]| d.iter().chain(s).all(|&b| b == 0xFF);
    for p in [0, 64 * 100 + 3, 64 * 256 - 1] {
        n.read_page(p, &mut d, &mut s).unwrap();
        assert!(all_erased(&d, &s), "page {p} of a new image");
    }
    for i in 0..8 {
        n.program(64 * 200 + i, &page(i), &[i as u8; 64]).unwrap();
    }
    drop(n);
    let mut n = FileNand::open(&path).unwrap();
    // Blocks before, at and after the written one, read in an order that asks about a
    // block past the first data first.
    for p in [64 * 255, 64 * 7 + 1, 64 * 199 + 63, 64 * 201] {
        n.read_page(p, &mut d, &mut s).unwrap();
        assert!(all_erased(&d, &s), "page {p} after a reopen");
    }
    for i in 0..8 {
        n.read_page(64 * 200 + i, &mut d, &mut s).unwrap();
        assert!(d == page(i) && s == [i as u8; 64], "page {i} of block 200 after a reopen");
    }
    n.read_page(64 * 200 + 8, &mut d, &mut s).unwrap();
    assert!(all_erased(&d, &s), "the rest of block 200");
    assert!(n.program(64 * 200 + 3, &page(0), &[0; 64]).is_err(), "program position kept");
    n.program(64 * 9, &page(9), &[9; 64]).unwrap();
    n.erase(200).unwrap();
    n.read_page(64 * 200, &mut d, &mut s).unwrap();
    assert!(all_erased(&d, &s), "block 200 erased");
    n.read_page(64 * 9, &mut d, &mut s).unwrap();
    assert!(d == page(9) && s == [9; 64], "block 9 programmed after the reopen");
    drop(n);
    std::fs::remove_file(&path).unwrap();
}
