//! The quick scrub pass (`Fs::scrub_quick`, `bitmend scrub --quick`): parity checked against
//! data from the signatures in the spares alone. It reads no data area, and it catches parity
//! that disagrees with its data even when every page matches its own signature, which the
//! page-by-page pass cannot see.

mod common;

use bitmend_code::sig::Signer;
use bitmend_flashfs::Ino;
use bitmend_flashfs::{Fs, FsOptions, Kind, PageAddr, PageHealth, Spare, ROOT};
use bitmend_media::nand::{Nand, RamNand, RawAccess};
use bitmend_media::rng::Rng;
use common::{cfg, chip};

const PAGE: usize = 2048;

/// Twelve incompressible 40 KiB files: about 240 data pages, several sealed segments.
fn filled() -> (Fs<RamNand>, Vec<(Ino, Vec<u8>)>) {
    let mut fs = Fs::format(chip(64), cfg(), FsOptions::default()).unwrap();
    let mut rng = Rng::new(5);
    let mut files = Vec::new();
    for i in 0..12 {
        let mut body = vec![0u8; 40 << 10];
        rng.fill(&mut body);
        let ino = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &body).unwrap();
        files.push((ino, body));
    }
    fs.sync().unwrap();
    assert!(fs.store().used_segments().len() >= 4, "the workload fills several segments");
    (fs, files)
}

/// The first page of physical segment `phys` whose spare says `kind`.
fn page_of_kind(fs: &mut Fs<RamNand>, phys: u32, kind: Kind) -> u32 {
    let pages = fs.store().nand().geometry().pages();
    let mut raw = vec![0u8; fs.store().nand().geometry().raw_page_size()];
    (0..pages)
        .find(|&p| {
            fs.store().segment_of(PageAddr(p)) == Some(phys) && {
                fs.store_mut().nand_mut().raw_read(p, &mut raw).unwrap();
                Spare::decode(&raw[PAGE..], p).is_some_and(|s| s.kind == kind)
            }
        })
        .unwrap_or_else(|| panic!("segment {phys} has a {kind:?} page"))
}

/// Changes a byte of page `p` and signs and binds its spare again, as a parity program that
/// computed the wrong bytes would leave it: the page matches its own signature.
fn rewrite_consistently_wrong(fs: &mut Fs<RamNand>, p: u32) {
    let nand = fs.store_mut().nand_mut();
    let mut raw = vec![0u8; nand.geometry().raw_page_size()];
    nand.raw_read(p, &mut raw).unwrap();
    let mut spare = Spare::decode(&raw[PAGE..], p).unwrap();
    raw[100] ^= 0x5a;
    spare.sig = Signer::<4>::new().sign(&raw[..PAGE]);
    spare.encode(&mut raw[PAGE..], Some(p));
    nand.raw_write(p, 0, &raw).unwrap();
}

#[test]
fn a_clean_file_system_passes_reading_spares_only() {
    let (mut fs, _) = filled();
    let before = fs.store().nand().counters();
    let r = fs.scrub_quick().unwrap();
    let c = fs.store().nand().counters() - before;
    assert_eq!(r.segments_checked, fs.store().used_segments().len() as u64);
    assert!(r.signatures.groups_checked > 10, "{r:?}");
    assert!(r.signatures.stripes_checked >= 3 * 16, "three sealed segments at least: {r:?}");
    assert_eq!((r.signatures.groups_mismatched, r.signatures.stripes_mismatched), (0, 0));
    assert!(r.segments_mismatched.is_empty());
    // Not one data area read: every byte read was a spare.
    let spare = fs.store().nand().geometry().spare_size as u64;
    assert_eq!(c.reads, r.signatures.spares_read);
    assert_eq!(c.bytes_read, r.signatures.spares_read * spare);
    assert_eq!(c.programs, 0, "a clean pass writes nothing");
}

#[test]
fn parity_that_disagrees_with_its_data_is_caught_and_the_segment_healed() {
    let (mut fs, files) = filled();
    let used = fs.store().used_segments();
    let (group_seg, stripe_seg) = (used[0], used[1]);
    // Fault 1: a group parity page of the oldest segment. Fault 2: a segment parity page of
    // the next one.
    let gp = page_of_kind(&mut fs, group_seg.physical, Kind::GroupParity);
    let sp = page_of_kind(&mut fs, stripe_seg.physical, Kind::SegmentParity);
    rewrite_consistently_wrong(&mut fs, gp);
    rewrite_consistently_wrong(&mut fs, sp);
    let injected = 2;

    // The page-by-page check sees nothing: each page matches its own signature.
    for (logical, page) in [(group_seg.logical, gp), (stripe_seg.logical, sp)] {
        let pages = fs.store_mut().scrub_segment_pages(logical).unwrap();
        let health = pages.iter().find(|(a, _)| a.0 == page).map(|(_, h)| *h);
        assert_eq!(health, Some(PageHealth::Sound), "page {page}");
    }

    let r = fs.scrub_quick().unwrap();
    // The wrong group parity page breaks its group and, being in a data block, its stripe.
    assert_eq!(r.signatures.groups_mismatched, 1, "{r:?}");
    assert_eq!(r.signatures.stripes_mismatched, 2, "{r:?}");
    assert_eq!(
        r.segments_mismatched,
        vec![group_seg.physical, stripe_seg.physical],
        "{injected} faults, {r:?}"
    );
    assert_eq!(r.segments_healed, 2, "{r:?}");

    // Every byte of every file, and a second pass finds nothing.
    for (ino, body) in &files {
        assert_eq!(&fs.read(*ino, 0, body.len()).unwrap(), body);
    }
    let again = fs.scrub_quick().unwrap();
    assert!(again.segments_mismatched.is_empty(), "{again:?}");
    assert!(fs.check(true).clean());
    let nand = fs.unmount().unwrap();
    let (mut fs, _) = Fs::open(nand, FsOptions::default()).unwrap();
    for (ino, body) in &files {
        assert_eq!(&fs.read(*ino, 0, body.len()).unwrap(), body);
    }
}

#[test]
fn a_page_whose_spare_does_not_decode_is_left_to_the_full_pass() {
    let (mut fs, files) = filled();
    let phys = fs.store().used_segments()[0].physical;
    let gp = page_of_kind(&mut fs, phys, Kind::GroupParity);
    // One fault: the first data page of that group loses its spare (not its data).
    let nand = fs.store_mut().nand_mut();
    let mut raw = vec![0u8; nand.geometry().raw_page_size()];
    nand.raw_read(gp, &mut raw).unwrap();
    let s = Spare::decode(&raw[PAGE..], gp).unwrap();
    let first = gp - (gp % 16) + s.group_first as u32;
    nand.raw_write(first, PAGE, &[0u8; 64]).unwrap();

    let r = fs.scrub_quick().unwrap();
    assert!(r.signatures.unverifiable >= 2, "its group and its stripe: {r:?}");
    assert!(r.segments_mismatched.is_empty(), "an unreadable spare is not a mismatch: {r:?}");
    // The full pass reads the page and finds its data intact.
    let full = fs.scrub().unwrap();
    assert_eq!(full.unreadable_pages, 0);
    for (ino, body) in &files {
        assert_eq!(&fs.read(*ino, 0, body.len()).unwrap(), body);
    }
}
