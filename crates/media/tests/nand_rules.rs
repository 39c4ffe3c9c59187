//! The chip's rules, on every backend: each test fails on a backend that is lax about its rule.
//!
//! With `BITMEND_MTD=/dev/mtdX` (a chip whose contents may be lost, such as nandsim's), the
//! rules that need no access beneath them run on that real chip too, in raw spare mode and in
//! ECC mode (`scripts/vm/` runs them so).

use std::sync::Mutex;

use bitmend_media::nand::{
    FileNand, Geometry, MtdNand, Nand, NandError, OobMode, RamNand, RawAccess, Timing,
};

fn small() -> Geometry {
    Geometry::new(512, 16, 8, 16).unwrap()
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("bitmend-media-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

/// Runs `check` on a RAM chip and on a file chip of the same geometry.
fn on_every_simulated_backend(name: &str, check: impl Fn(&mut dyn NandRaw)) {
    let mut ram = RamNand::new(small()).unwrap();
    check(&mut ram);
    let path = temp_path(name);
    let mut file = FileNand::create(&path, small()).unwrap();
    check(&mut file);
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

/// One test at a time on the real chip: the tests share it.
static MTD: Mutex<()> = Mutex::new(());

/// Runs `check` on the simulated chips and, when `BITMEND_MTD` names one, on the real chip in
/// both spare modes, its first 8 good blocks erased first (the checks use those).
fn on_every_backend(name: &str, check: impl Fn(&mut dyn Nand)) {
    on_every_simulated_backend(name, |n| check(n));
    on_real_chip(check);
}

/// Runs `check` on the chip `BITMEND_MTD` names, if any, as [`on_every_backend`] says.
fn on_real_chip(check: impl Fn(&mut dyn Nand)) {
    let Some(dev) = std::env::var_os("BITMEND_MTD") else { return };
    let _one = MTD.lock().unwrap_or_else(|e| e.into_inner());
    for mode in [OobMode::Raw, OobMode::Ecc] {
        let mut chip = MtdNand::open(dev.as_ref(), mode).unwrap();
        for b in 0..8 {
            if !chip.is_bad(b).unwrap() {
                chip.erase(b).unwrap();
            }
        }
        // The device is locked while open: let it go before the check opens it afresh.
        drop(chip);
        let mut fresh = MtdNand::open(dev.as_ref(), mode).unwrap();
        check(&mut fresh);
    }
}

trait NandRaw: Nand + RawAccess {}
impl<T: Nand + RawAccess> NandRaw for T {}

fn page(g: &Geometry, seed: u8) -> (Vec<u8>, Vec<u8>) {
    let d = (0..g.page_size).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    let s = (0..g.spare_size).map(|i| (i as u8) ^ seed).collect();
    (d, s)
}

fn read(n: &mut (impl Nand + ?Sized), p: u32) -> (Vec<u8>, Vec<u8>) {
    let g = n.geometry();
    let mut d = vec![0; g.page_size as usize];
    let mut s = vec![0; g.spare_size as usize];
    n.read_page(p, &mut d, &mut s).unwrap();
    (d, s)
}

#[test]
fn fresh_chip_reads_all_ones() {
    on_every_backend("ones", |n| {
        let g = n.geometry();
        for p in [0, 7, g.pages() - 1] {
            let (d, s) = read(n, p);
            assert!(d.iter().chain(&s).all(|&b| b == 0xFF), "page {p}");
        }
    });
}

#[test]
fn program_then_read_back_data_and_spare_separately() {
    on_every_backend("roundtrip", |n| {
        let g = n.geometry();
        let (d, s) = page(&g, 5);
        n.program(9, &d, &s).unwrap();
        assert_eq!(read(n, 9), (d.clone(), s.clone()));
        let mut only_d = vec![0; g.page_size as usize];
        n.read_data(9, &mut only_d).unwrap();
        assert_eq!(only_d, d);
        let mut only_s = vec![0; g.spare_size as usize];
        n.read_spare(9, &mut only_s).unwrap();
        assert_eq!(only_s, s);
        // Neighbours untouched.
        assert!(read(n, 8).0.iter().all(|&b| b == 0xFF));
        assert!(read(n, 10).0.iter().all(|&b| b == 0xFF));
    });
}

#[test]
fn a_page_is_programmed_once_per_erase() {
    on_every_backend("once", |n| {
        let g = n.geometry();
        let (d, s) = page(&g, 1);
        n.program(3, &d, &s).unwrap();
        // Even programming the same bytes again is refused, and so is an all-ones program.
        let e = n.program(3, &d, &s).unwrap_err();
        assert!(matches!(e, NandError::NotProgrammable { page: 3, block: 0, next_index: 4 }), "{e}");
        let ones = vec![0xFF; g.page_size as usize];
        let ones_s = vec![0xFF; g.spare_size as usize];
        assert!(n.program(3, &ones, &ones_s).is_err());
        assert_eq!(read(n, 3), (d, s), "a refused program must not change the page");
        // After an erase the page takes a program again.
        n.erase(0).unwrap();
        let (d2, s2) = page(&g, 2);
        n.program(3, &d2, &s2).unwrap();
        assert_eq!(read(n, 3), (d2, s2));
    });
}

#[test]
fn pages_are_programmed_in_ascending_order_within_a_block() {
    on_every_backend("order", |n| {
        let g = n.geometry();
        let (d, s) = page(&g, 3);
        let b1 = g.first_page(1);
        n.program(b1 + 4, &d, &s).unwrap(); // skipping ahead is allowed
        for back in [b1, b1 + 3, b1 + 4] {
            let e = n.program(back, &d, &s).unwrap_err();
            assert!(matches!(e, NandError::NotProgrammable { .. }), "page {back}: {e}");
        }
        n.program(b1 + 5, &d, &s).unwrap();
        // Another block has its own order.
        n.program(g.first_page(2), &d, &s).unwrap();
        // The skipped pages stay erased.
        assert!(read(n, b1 + 2).0.iter().all(|&b| b == 0xFF));
    });
}

#[test]
fn erase_sets_every_bit_of_the_block_and_only_that_block() {
    on_every_backend("erase", |n| {
        let g = n.geometry();
        let (d, s) = page(&g, 4);
        for p in 0..2 * g.pages_per_block {
            n.program(p, &d, &s).unwrap();
        }
        n.erase(0).unwrap();
        for p in 0..g.pages_per_block {
            let (rd, rs) = read(n, p);
            assert!(rd.iter().chain(&rs).all(|&b| b == 0xFF), "page {p} not erased");
        }
        for p in g.pages_per_block..2 * g.pages_per_block {
            assert_eq!(read(n, p), (d.clone(), s.clone()), "page {p} of the next block changed");
        }
        assert_eq!(n.erase_count(0).unwrap(), 1);
        assert_eq!(n.erase_count(1).unwrap(), 0);
    });
}

#[test]
fn programming_only_clears_bits() {
    on_every_simulated_backend("and", |n| {
        let g = n.geometry();
        // A cell stuck at 0 in an erased page (written beneath the rules, as a fault would).
        n.raw_write(20, 0, &[0x0F]).unwrap();
        let ones = vec![0xFF; g.page_size as usize];
        let mut d = ones.clone();
        d[1] = 0x3C;
        n.program(20, &d, &vec![0xFF; g.spare_size as usize]).unwrap();
        let (rd, _) = read(n, 20);
        assert_eq!(rd[0], 0x0F, "a program of 1s cannot set a cleared bit");
        assert_eq!(rd[1], 0x3C);
    });
}

/// A program skips reading the old cells of a page known erased (the block surveyed once);
/// what a raw write clears after the survey, or before an image is opened again, is still
/// kept by the next program over it.
#[test]
fn programming_only_clears_bits_after_the_block_was_surveyed_and_after_a_reopen() {
    on_every_simulated_backend("and-surveyed", |n| {
        let g = n.geometry();
        let (d, s) = page(&g, 7);
        // Page 24 (block 3) surveyed erased by the program of page 24 ...
        n.program(24, &d, &s).unwrap();
        // ... then a fault clears bits of page 26, above the program pointer.
        n.raw_write(26, 2, &[0x0F]).unwrap();
        n.program(25, &d, &s).unwrap();
        let ones = vec![0xFF; g.page_size as usize];
        n.program(26, &ones, &vec![0xFF; g.spare_size as usize]).unwrap();
        assert_eq!(read(n, 25), (d.clone(), s.clone()), "a page known erased is programmed as given");
        assert_eq!(read(n, 26).0[2], 0x0F, "a program of 1s cannot set a bit cleared after the survey");
        // An erase makes every page known erased again.
        n.erase(3).unwrap();
        n.program(24, &d, &s).unwrap();
        assert_eq!(read(n, 24), (d.clone(), s.clone()));
    });
    let path = temp_path("and-reopened");
    let g = small();
    let mut file = FileNand::create(&path, g).unwrap();
    file.raw_write(41, 0, &[0x33]).unwrap();
    drop(file);
    let mut file = FileNand::open(&path).unwrap();
    let (d, s) = page(&g, 9);
    file.program(40, &d, &s).unwrap();
    file.program(41, &vec![0xFF; g.page_size as usize], &vec![0xFF; g.spare_size as usize]).unwrap();
    assert_eq!(read(&mut file, 41).0[0], 0x33, "cleared before the reopen, kept by a program after it");
    assert_eq!(read(&mut file, 40), (d, s));
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn bad_blocks_refuse_program_and_erase_but_read() {
    on_every_simulated_backend("bad", |n| {
        let g = n.geometry();
        let (d, s) = page(&g, 6);
        n.program(g.first_page(5), &d, &s).unwrap();
        assert!(!n.is_bad(5).unwrap());
        n.mark_bad(5).unwrap();
        assert!(n.is_bad(5).unwrap());
        assert!(matches!(n.erase(5), Err(NandError::BadBlock { block: 5 })));
        assert!(matches!(n.program(g.first_page(5) + 1, &d, &s), Err(NandError::BadBlock { block: 5 })));
        assert_eq!(read(n, g.first_page(5)), (d, s));
        assert!(!n.is_bad(4).unwrap());
    });
}

/// On a real chip, marking a block bad erases it and writes the chip's own marker (the
/// kernel's `nand_block_markbad`), so its pages do not read back; the rest of the rule holds.
#[test]
fn bad_blocks_on_a_real_chip_refuse_program_and_erase() {
    on_real_chip(|n| {
        let g = n.geometry();
        let (d, s) = page(&g, 6);
        let block = (0..8).rev().find(|&b| !n.is_bad(b).unwrap()).expect("a good block among the first 8");
        n.program(g.first_page(block), &d, &s).unwrap();
        n.mark_bad(block).unwrap();
        assert!(n.is_bad(block).unwrap());
        assert!(matches!(n.erase(block), Err(NandError::BadBlock { .. })));
        assert!(matches!(n.program(g.first_page(block) + 1, &d, &s), Err(NandError::BadBlock { .. })));
    });
}

#[test]
fn out_of_range_and_wrong_buffers_are_errors() {
    on_every_backend("range", |n| {
        let g = n.geometry();
        let (d, s) = page(&g, 7);
        assert!(matches!(n.program(g.pages(), &d, &s), Err(NandError::PageRange { .. })));
        assert!(matches!(n.erase(g.blocks), Err(NandError::BlockRange { .. })));
        assert!(matches!(n.program(0, &d[1..], &s), Err(NandError::BufferSize { .. })));
        assert!(matches!(n.program(0, &d, &s[1..]), Err(NandError::BufferSize { .. })));
        let mut short = vec![0; 10];
        assert!(matches!(n.read_data(0, &mut short), Err(NandError::BufferSize { .. })));
        assert!(n.is_bad(g.blocks).is_err());
        // None of this moved the chip: page 0 still takes its one program.
        n.program(0, &d, &s).unwrap();
    });
}

#[test]
fn counters_and_modelled_time() {
    let g = small();
    let mut n = RamNand::new(g).unwrap().with_timing(Timing::TYPICAL);
    let (d, s) = page(&g, 8);
    n.program(0, &d, &s).unwrap();
    n.program(1, &d, &s).unwrap();
    let mut buf = vec![0; g.page_size as usize];
    n.read_data(0, &mut buf).unwrap();
    n.erase(3).unwrap();
    let c = n.counters();
    let raw = g.raw_page_size() as u64;
    assert_eq!((c.reads, c.programs, c.erases), (1, 2, 1));
    assert_eq!(c.bytes_programmed, 2 * raw);
    assert_eq!(c.bytes_read, g.page_size as u64);
    assert_eq!(c.bytes_erased, g.pages_per_block as u64 * raw);
    let expect = 2 * (200_000 + (raw as f64 * 25.0) as u64) + (25_000 + g.page_size as u64 * 25) + 2_000_000;
    assert_eq!(c.device_ns, expect);
    let none = RamNand::new(g).unwrap().with_timing(Timing::NONE);
    assert_eq!(none.counters().device_ns, 0);
}
