//! A truncate that shrinks a file to the middle of a page, with other dirty data to write
//! back, cut by a power loss at every flash operation it makes: the file is found whole at
//! its old size or cut at its new one, never at the old size with the cut page's zeros in
//! it (a state that never existed, over synced bytes). After it grows again, the bytes past
//! the cut read as zeros.

mod common;

use bitmend_flashfs::{Compression, Fs, FsError, SetAttr, ROOT};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::nand::{FaultyNand, NandError};

const OLD: usize = 300_000;
const NEW: u64 = 150_000;

#[test]
fn a_truncate_cut_by_power_loss_is_whole_or_absent() {
    let opts = || bitmend_flashfs::FsOptions { dirty_limit: 8 << 20, ..common::opts(Compression::Lz4) };
    let mut fs = Fs::format(common::faulty_chip(256, 3), common::cfg(), opts()).unwrap();
    let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(ROOT, b"b", 0o644, 0, 0).unwrap().ino;
    let data = common_noise(1, OLD);
    fs.write(a, 0, &data).unwrap();
    fs.sync().unwrap();
    let base = fs.unmount().unwrap();
    let work = |chip: &mut FaultyNand<_>| {
        let mut fs = match Fs::open(chip, opts()) {
            Ok((fs, _)) => fs,
            Err(FsError::Nand(NandError::PowerLost)) => return false,
            Err(e) => panic!("{e}"),
        };
        let run = (|| {
            fs.write(b, 0, &common_noise(2, 3 << 20))?;
            fs.setattr(a, SetAttr { size: Some(NEW), ..Default::default() })?;
            fs.sync()
        })();
        match run {
            Ok(()) => true,
            Err(FsError::Nand(NandError::PowerLost)) => false,
            Err(e) => panic!("{e}"),
        }
    };
    let (mut whole, mut cut) = (0, 0);
    let c = campaign::run(&base, Schedule::EveryKth(2), work, |nand, op| {
        let (mut fs, _) = Fs::open(nand, opts()).unwrap_or_else(|e| panic!("cut {op}: mount: {e}"));
        let size = fs.getattr(a).unwrap().size;
        let got = fs.read(a, 0, OLD).unwrap();
        match size {
            s if s == OLD as u64 => {
                assert!(got == data, "cut {op}: the old size, but not the old bytes");
                whole += 1;
            }
            NEW => {
                assert!(got == data[..NEW as usize], "cut {op}: the new size, but not the old bytes");
                // Grown again, the bytes past the cut are zeros.
                fs.setattr(a, SetAttr { size: Some(NEW + 8192), ..Default::default() }).unwrap();
                let tail = fs.read(a, NEW, 8192).unwrap();
                assert!(tail.iter().all(|&x| x == 0), "cut {op}: old bytes past the cut came back");
                cut += 1;
            }
            s => panic!("cut {op}: size {s}"),
        }
        assert!(fs.check(true).clean(), "cut {op}");
    });
    eprintln!("truncate cut: {c:?}: {whole} whole at the old size, {cut} cut at the new");
    assert!(c.cuts > 100 && whole > 0 && cut > 0, "{c:?}, {whole} {cut}");
}

fn common_noise(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    bitmend_media::rng::Rng::new(seed).fill(&mut v);
    v
}
