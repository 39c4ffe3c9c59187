//! bitmend's code against ISA-L on the same inputs: the Cauchy matrix, parity bytes (every
//! engine of ours, ISA-L's dispatched and AVX2 kernels), the update path, matrix inversion and
//! CRC-32C. Against both builds: ISA-L 2.31 (always linked) and Debian's 2.30, which is
//! skipped (saying so) when not installed, unless BITMEND_REQUIRE_ANCHORS is set, as CI sets it.

use bitmend_anchors::isal::{Isal, Kernel};
use bitmend_code::testdata::pattern as bytes;
use bitmend_code::{crc, gf, rs};

/// Every ISA-L build here, Debian's required where CI says so.
fn builds() -> Vec<Isal> {
    let all = Isal::all();
    if all.len() < 2 {
        assert!(
            std::env::var_os("BITMEND_REQUIRE_ANCHORS").is_none(),
            "Debian's ISA-L required but not loadable"
        );
        eprintln!("Debian's ISA-L (libisal.so.2) not installed: checked against 2.31 only");
    }
    all
}

#[test]
fn matrix_and_parity_are_isal_byte_for_byte() {
    for isal in builds() {
        for (k, m) in [(1, 1), (4, 2), (8, 1), (8, 4), (10, 4), (17, 3), (100, 20), (200, 55)] {
            let matrix = isal.cauchy_matrix(k, m);
            assert_eq!(rs::matrix::cauchy(k, m), matrix, "{} k={k} m={m}", isal.name());
            let mut tables: Vec<_> =
                [Kernel::Dispatch, Kernel::Avx2].map(|kn| isal.tables(k, m, &matrix[k * k..], kn)).into();
            for len in [1usize, 31, 64, 100, 1000, 4096, 4096 + 17, 65536] {
                let data: Vec<Vec<u8>> = (0..k).map(|i| bytes((i * 1000 + len) as u64, len)).collect();
                let d: Vec<&[u8]> = data.iter().map(|x| x.as_slice()).collect();
                let mut ours = vec![vec![0u8; len]; m];
                let mut theirs = vec![vec![0u8; len]; m];
                for e in gf::available() {
                    let codec = rs::Codec::with_engine(k, m, e).unwrap();
                    let mut o: Vec<&mut [u8]> = ours.iter_mut().map(|x| x.as_mut_slice()).collect();
                    codec.encode(&d, &mut o).unwrap();
                    for t in &mut tables {
                        theirs.iter_mut().for_each(|x| x.fill(0xEE));
                        let mut o: Vec<&mut [u8]> = theirs.iter_mut().map(|x| x.as_mut_slice()).collect();
                        t.encode(&d, &mut o);
                        assert_eq!(ours, theirs, "{} k={k} m={m} len={len} engine={}", isal.name(), e.name());
                    }
                }
            }
        }
    }
}

#[test]
fn update_and_inverse_agree_with_isal() {
    for isal in builds() {
        let (k, m, len) = (10, 4, 4096);
        let codec = rs::Codec::new(k, m).unwrap();
        let data: Vec<Vec<u8>> = (0..k).map(|i| bytes(i as u64 + 9, len)).collect();
        let d: Vec<&[u8]> = data.iter().map(|x| x.as_slice()).collect();
        let mut ours = vec![vec![0u8; len]; m];
        let mut o: Vec<&mut [u8]> = ours.iter_mut().map(|x| x.as_mut_slice()).collect();
        codec.encode(&d, &mut o).unwrap();
        // ISA-L builds the same parity one data chunk at a time with its update path.
        let mut t = isal.tables(k, m, &rs::matrix::cauchy(k, m)[k * k..], Kernel::Dispatch);
        let mut theirs = vec![vec![0u8; len]; m];
        for (i, chunk) in data.iter().enumerate() {
            let mut o: Vec<&mut [u8]> = theirs.iter_mut().map(|x| x.as_mut_slice()).collect();
            t.update(i, chunk, &mut o);
        }
        assert_eq!(ours, theirs, "{}", isal.name());
        let a = rs::matrix::cauchy(6, 6);
        let sub = &a[6 * 6..];
        assert_eq!(rs::matrix::invert(sub, 6), isal.invert(sub, 6), "{}", isal.name());
    }
}

#[test]
fn crc32c_agrees_with_isal() {
    for isal in builds() {
        for len in (0..300).chain([4095, 4096, 4097, 1 << 20]) {
            let d = bytes(len as u64, len);
            let want = crc::crc32c(&d);
            assert_eq!(isal.crc32c(Kernel::Dispatch, &d), want, "{} len {len}", isal.name());
            assert_eq!(isal.crc32c(Kernel::Avx2, &d), want, "{} len {len}", isal.name());
        }
    }
}

/// The two builds are two libraries, not one seen twice: on a GFNI CPU 2.31's dispatched
/// tables are GFNI affine matrices and 2.30's the classic 32-byte tables, so they differ.
#[test]
fn the_two_builds_are_apart() {
    let all = builds();
    let (Some(new), Some(old)) = (all.first(), all.get(1)) else { return };
    assert_eq!((new.name(), old.name()), ("isa-l 2.31", "isa-l 2.30"));
    if !std::arch::is_x86_feature_detected!("gfni") || !std::arch::is_x86_feature_detected!("avx2") {
        eprintln!("no GFNI here: the tables are alike");
        return;
    }
    let coeffs = rs::matrix::cauchy(4, 2)[16..].to_vec();
    let raw = |isal: &Isal| format!("{:?}", isal.tables(4, 2, &coeffs, Kernel::Dispatch).raw());
    assert_ne!(raw(new), raw(old), "2.31 made the tables 2.30 makes: the same library twice?");
    assert_ne!(new.ec_family(Kernel::Dispatch), old.ec_family(Kernel::Dispatch));
}
