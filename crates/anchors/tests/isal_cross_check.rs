//! bitmend's code against ISA-L on the same inputs: the Cauchy matrix, parity bytes, the update
//! path, matrix inversion and CRC-32C. Skips (saying so) when ISA-L is not linked, unless
//! BITMEND_REQUIRE_ANCHORS is set, as CI sets it.

use bitmend_anchors::isal::{self, Kernel, Tables};
use bitmend_code::testdata::pattern as bytes;
use bitmend_code::{crc, gf, rs};

fn isal_or_skip() -> bool {
    if isal::available() {
        return true;
    }
    assert!(std::env::var_os("BITMEND_REQUIRE_ANCHORS").is_none(), "ISA-L required but not linked");
    eprintln!("ISA-L not linked: cross-check skipped");
    false
}

#[test]
fn matrix_and_parity_are_isal_byte_for_byte() {
    if !isal_or_skip() {
        return;
    }
    for (k, m) in [(1, 1), (4, 2), (8, 1), (8, 4), (10, 4), (17, 3), (100, 20), (200, 55)] {
        assert_eq!(rs::matrix::cauchy(k, m), isal::cauchy_matrix(k, m).unwrap(), "k={k} m={m}");
        for len in [1usize, 31, 64, 100, 1000, 4096, 4096 + 17, 65536] {
            let data: Vec<Vec<u8>> = (0..k).map(|i| bytes((i * 1000 + len) as u64, len)).collect();
            let d: Vec<&[u8]> = data.iter().map(|x| x.as_slice()).collect();
            let mut ours = vec![vec![0u8; len]; m];
            let mut theirs = vec![vec![0u8; len]; m];
            for e in gf::available() {
                let codec = rs::Codec::with_engine(k, m, e).unwrap();
                let mut o: Vec<&mut [u8]> = ours.iter_mut().map(|x| x.as_mut_slice()).collect();
                codec.encode(&d, &mut o).unwrap();
                let mut t = Tables::new(k, m, &isal::cauchy_matrix(k, m).unwrap()[k * k..]).unwrap();
                let mut o: Vec<&mut [u8]> = theirs.iter_mut().map(|x| x.as_mut_slice()).collect();
                t.encode(Kernel::Dispatch, &d, &mut o);
                assert_eq!(ours, theirs, "k={k} m={m} len={len} engine={}", e.name());
            }
        }
    }
}

#[test]
fn update_and_inverse_agree_with_isal() {
    if !isal_or_skip() {
        return;
    }
    let (k, m, len) = (10, 4, 4096);
    let codec = rs::Codec::new(k, m).unwrap();
    let data: Vec<Vec<u8>> = (0..k).map(|i| bytes(i as u64 + 9, len)).collect();
    let d: Vec<&[u8]> = data.iter().map(|x| x.as_slice()).collect();
    let mut ours = vec![vec![0u8; len]; m];
    let mut o: Vec<&mut [u8]> = ours.iter_mut().map(|x| x.as_mut_slice()).collect();
    codec.encode(&d, &mut o).unwrap();
    // ISA-L builds the same parity one data chunk at a time with its update path.
    let mut t = Tables::new(k, m, &rs::matrix::cauchy(k, m)[k * k..]).unwrap();
    let mut theirs = vec![vec![0u8; len]; m];
    for (i, chunk) in data.iter().enumerate() {
        let mut o: Vec<&mut [u8]> = theirs.iter_mut().map(|x| x.as_mut_slice()).collect();
        t.update(i, chunk, &mut o);
    }
    assert_eq!(ours, theirs);
    let a = rs::matrix::cauchy(6, 6);
    let sub = &a[6 * 6..];
    assert_eq!(rs::matrix::invert(sub, 6), isal::invert(sub, 6));
}

#[test]
fn crc32c_agrees_with_isal() {
    if !isal_or_skip() {
        return;
    }
    for len in (0..300).chain([4095, 4096, 4097, 1 << 20]) {
        let d = bytes(len as u64, len);
        let want = crc::crc32c(&d);
        assert_eq!(isal::crc32c(Kernel::Dispatch, &d), Some(want), "len {len}");
        assert_eq!(isal::crc32c(Kernel::Avx2, &d), Some(want), "len {len}");
    }
}
