//! The image's data reader (reads from other threads, without the chip): every page reads as
//! the chip reads it, programmed, erased or never written, on a thin and on a reserved image;
//! it follows programs and erases made after it was taken; it does not hold the image's lock;
//! and only an image file offers one.

use bitmend_media::nand::{FaultyNand, FileNand, Geometry, Nand, NandError, RamNand};

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("bitmend-reader-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

fn geometry() -> Geometry {
    Geometry::new(2048, 64, 8, 6).unwrap()
}

fn page_bytes(page: u32, round: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32 * 31 + page * 7 + round as u32 * 101) as u8).collect()
}

/// Every page of the chip, as the chip reads it and as the reader reads it (one call for all).
fn assert_reader_matches_chip(n: &mut FileNand) {
    let g = n.geometry();
    let reader = n.data_reader().expect("an image file offers a reader");
    let (mut all, mut scratch) = (Vec::new(), Vec::new());
    reader.read_data(0, g.pages(), &mut all, &mut scratch).unwrap();
    assert_eq!(all.len(), g.pages() as usize * g.page_size as usize);
    let mut one = vec![0; g.page_size as usize];
    let mut single = Vec::new();
    for p in 0..g.pages() {
        n.read_data(p, &mut one).unwrap();
        let at = p as usize * g.page_size as usize;
        assert_eq!(&all[at..at + one.len()], &one[..], "page {p}, read with the others");
        reader.read_data(p, 1, &mut single, &mut scratch).unwrap();
        assert_eq!(single, one, "page {p}, read alone");
    }
}

fn program_some(n: &mut FileNand, round: u8) {
    let g = n.geometry();
    let spare = vec![0x5A; g.spare_size as usize];
    for block in [0, 2, 5] {
        n.erase(block).unwrap();
        // Part of each block: the rest stays erased.
        for i in 0..(3 + block) {
            let p = g.first_page(block) + i;
            n.program(p, &page_bytes(p, round, g.page_size as usize), &spare).unwrap();
        }
    }
}

#[test]
fn every_page_reads_as_the_chip_reads_it_thin_or_reserved() {
    for (name, thin) in [("thin.img", true), ("reserved.img", false)] {
        let path = temp_path(name);
        let mut n =
            if thin { FileNand::create_thin(&path, geometry()) } else { FileNand::create(&path, geometry()) }
                .unwrap();
        // Fresh: every page erased (a thin image's holes included).
        assert_reader_matches_chip(&mut n);
        let reader = n.data_reader().unwrap();
        program_some(&mut n, 1);
        assert_reader_matches_chip(&mut n);
        // A reader taken before the programs sees them, and sees an erase.
        let (mut got, mut scratch) = (Vec::new(), Vec::new());
        let g = n.geometry();
        let p = g.first_page(2) + 1;
        reader.read_data(p, 1, &mut got, &mut scratch).unwrap();
        assert_eq!(
            got,
            page_bytes(p, 1, g.page_size as usize),
            "{name}: a program made after the reader was taken"
        );
        n.erase(2).unwrap();
        reader.read_data(p, 1, &mut got, &mut scratch).unwrap();
        assert!(got.iter().all(|&b| b == 0xFF), "{name}: an erase made after the reader was taken");
        program_some(&mut n, 2);
        assert_reader_matches_chip(&mut n);
        drop(n);
        // Reopened, the same.
        let mut n = FileNand::open(&path).unwrap();
        assert_reader_matches_chip(&mut n);
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn a_range_past_the_last_page_is_an_error_not_a_short_read() {
    let path = temp_path("range.img");
    let n = FileNand::create(&path, geometry()).unwrap();
    let reader = n.data_reader().unwrap();
    let pages = n.geometry().pages();
    let (mut out, mut scratch) = (Vec::new(), Vec::new());
    assert!(reader.read_data(pages - 2, 2, &mut out, &mut scratch).is_ok());
    for (first, count) in [(pages - 1, 2), (pages, 1), (u32::MAX, 2)] {
        match reader.read_data(first, count, &mut out, &mut scratch) {
            Err(NandError::PageRange { pages: p, .. }) => assert_eq!(p, pages),
            other => panic!("pages {first} + {count}: {other:?}"),
        }
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_reader_kept_after_the_chip_is_closed_does_not_hold_the_image_locked() {
    let path = temp_path("lock.img");
    let n = FileNand::create(&path, geometry()).unwrap();
    let reader = n.data_reader().unwrap();
    drop(n);
    // The image's lock went with the chip: it opens again while the reader lives.
    let again = FileNand::open(&path);
    assert!(again.is_ok(), "the reader kept the image locked: {:?}", again.err());
    let (mut out, mut scratch) = (Vec::new(), Vec::new());
    reader.read_data(0, 1, &mut out, &mut scratch).unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn only_an_image_file_offers_a_reader() {
    let ram = RamNand::new(geometry()).unwrap();
    assert!(ram.data_reader().is_none(), "RAM: reads go through the chip");
    let path = temp_path("faulty.img");
    let faulty = FaultyNand::new(FileNand::create(&path, geometry()).unwrap(), 1);
    assert!(faulty.data_reader().is_none(), "a faulty chip's reads must go through its faults");
    let _ = std::fs::remove_file(&path);
}
