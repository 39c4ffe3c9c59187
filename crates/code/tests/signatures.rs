//! Algebraic signatures: linearity, commuting with the Reed–Solomon parity, guaranteed
//! detection of small changes (including the 255-byte-period attack on GF(2^8) signatures),
//! random multi-bit errors, and the incremental update.

mod common;

use bitmend_code::gf::{self, mul};
use bitmend_code::rs::Codec;
use bitmend_code::sig::{gf16, sign_reference, Sig32, Sig64, Signature, Signer, MAX_LEN};
use common::Rng;

#[test]
fn fast_path_matches_the_definition_on_every_engine() {
    let mut rng = Rng::new(1);
    for e in gf::available() {
        let s2 = Signer::<2>::with_engine(e);
        let s4 = Signer::<4>::with_engine(e);
        for len in [0, 1, 31, 32, 33, 63, 64, 65, 100, 255, 256, 1000, 2048, 4096, 4099] {
            let d = rng.bytes(len);
            assert_eq!(s2.sign(&d), sign_reference::<2>(&d), "{} len {len}", e.name());
            assert_eq!(s4.sign(&d), sign_reference::<4>(&d), "{} len {len}", e.name());
        }
    }
}

#[test]
fn linear_over_gf256() {
    let mut rng = Rng::new(2);
    let s = Signer::<4>::new();
    for len in [1, 64, 100, 4096] {
        let a = rng.bytes(len);
        let b = rng.bytes(len);
        let x: Vec<u8> = a.iter().zip(&b).map(|(p, q)| p ^ q).collect();
        assert_eq!(s.sign(&x), s.sign(&a).xor(s.sign(&b)));
        for c in [0u8, 1, 2, 0x53, 0xFF] {
            let ca: Vec<u8> = a.iter().map(|&v| mul(c, v)).collect();
            assert_eq!(s.sign(&ca), s.sign(&a).scale(c), "c={c}");
        }
    }
    assert_eq!(s.sign(&[0u8; 4096]), Sig64::ZERO);
}

/// The nvlog signs a closing chunk only up to its last record: the zeros after it must not
/// change the signature, whatever the lengths (a broken implementation that weighted words
/// from the end of the chunk, or padded wrongly, would fail).
#[test]
fn zeros_at_the_end_leave_the_signature_unchanged_on_every_engine() {
    let mut rng = Rng::new(9);
    for e in gf::available() {
        let s = Signer::<4>::with_engine(e);
        for len in [0, 1, 63, 64, 65, 4160, 16448] {
            let d = rng.bytes(len);
            for zeros in [1, 31, 64, 100, 16384] {
                let mut padded = d.clone();
                padded.resize(len + zeros, 0);
                assert_eq!(s.sign(&padded), s.sign(&d), "{} len {len} + {zeros} zeros", e.name());
            }
        }
    }
}

#[test]
fn parity_signatures_are_combinations_of_data_signatures() {
    let mut rng = Rng::new(3);
    let s = Signer::<4>::new();
    for _ in 0..30 {
        let k = 1 + rng.below(12);
        let m = 1 + rng.below(5);
        let len = 1 + rng.below(8192);
        let codec = Codec::new(k, m).unwrap();
        let data: Vec<Vec<u8>> = (0..k).map(|_| rng.bytes(len)).collect();
        let mut parity = vec![vec![0u8; len]; m];
        let d: Vec<&[u8]> = data.iter().map(|x| x.as_slice()).collect();
        let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|x| x.as_mut_slice()).collect();
        codec.encode(&d, &mut p).unwrap();
        let sigs: Vec<Sig64> = data.iter().map(|x| s.sign(x)).collect();
        for (j, par) in parity.iter().enumerate() {
            assert_eq!(s.sign(par), Signature::combine(codec.parity_row(j), &sigs), "k={k} m={m} len={len}");
        }
        // And a corrupted data chunk breaks the agreement.
        let mut bad = data[0].clone();
        bad[len / 2] ^= 0x10;
        let mut sigs_bad = sigs.clone();
        sigs_bad[0] = s.sign(&bad);
        assert_ne!(s.sign(&parity[0]), Signature::combine(codec.parity_row(0), &sigs_bad));
    }
}

/// Changes of up to N bytes are always detected: exhaustive over pairs of positions in a
/// short chunk, and the equal-errors-255-apart pattern that defeats GF(2^8) signatures.
#[test]
fn small_changes_are_always_detected() {
    let s2 = Signer::<2>::new();
    let s4 = Signer::<4>::new();
    let base = vec![0u8; 700];
    let sig = s2.sign(&base);
    for i in 0..700 {
        for j in i + 1..700 {
            let mut d = base.clone();
            d[i] = 0x5A;
            d[j] = 0xC3;
            assert_ne!(s2.sign(&d), sig, "bytes {i} and {j}");
        }
    }
    // Equal errors 255 bytes apart, and 65535 words apart's shorter cousins, over 64 KiB.
    let len = 64 * 1024;
    let zero = vec![0u8; len];
    for gap in [255usize, 510, 765, 4080, 32 * 255] {
        for start in [0usize, 1, 31, 32, 1000] {
            for e in [1u8, 0x80, 0xFF] {
                let mut d = zero.clone();
                d[start] = e;
                d[start + gap] = e;
                assert_ne!(s2.sign(&d), Sig32::ZERO, "gap {gap} start {start}");
                let mut d4 = d.clone();
                d4[start + 2 * gap] = e;
                d4[start + 3 * gap] = e;
                assert_ne!(s4.sign(&d4), Sig64::ZERO, "4 errors gap {gap}");
            }
        }
    }
    // The largest chunk with the guarantee: the first and last byte positions.
    let mut d = vec![0u8; MAX_LEN];
    d[0] = 7;
    d[MAX_LEN - 1] = 7;
    assert_ne!(s2.sign(&d), Sig32::ZERO);
}

/// A GF(2^8) signature (sum d_i 2^i) misses equal errors 255 bytes apart; ours must not.
#[test]
fn the_gf256_signature_would_have_missed_it() {
    let mut d = vec![0u8; 600];
    d[3] = 9;
    d[3 + 255] = 9;
    let naive = d.iter().enumerate().fold(0u8, |a, (i, &b)| a ^ mul(b, gf::pow(2, i as u32)));
    assert_eq!(naive, 0, "the GF(2^8) construction cancels");
    assert_ne!(Signer::<2>::new().sign(&d), Sig32::ZERO);
}

#[test]
fn random_multibit_errors_are_detected() {
    let mut rng = Rng::new(4);
    let s = Signer::<2>::new();
    let mut trials = 0;
    for flips in [1usize, 2, 3, 8, 17, 100, 500, 1000] {
        for _ in 0..200 {
            let d = rng.bytes(2048);
            let sig = s.sign(&d);
            let mut bad = d.clone();
            for _ in 0..flips {
                let bit = rng.below(2048 * 8);
                bad[bit / 8] ^= 1 << (bit % 8);
            }
            if bad != d {
                assert_ne!(s.sign(&bad), sig, "{flips} flips undetected");
                trials += 1;
            }
        }
    }
    assert!(trials > 1500);
}

#[test]
fn incremental_update_equals_resigning() {
    let mut rng = Rng::new(5);
    for e in gf::available() {
        let s = Signer::<4>::with_engine(e);
        for len in [64usize, 100, 2048, 4096, 65536] {
            let mut d = rng.bytes(len);
            let mut sig = s.sign(&d);
            for _ in 0..40 {
                let cap = if rng.below(3) == 0 { 9000 } else { 100 };
                let n = 1 + rng.below(len.min(cap));
                let off = rng.below(len - n + 1);
                let new = rng.bytes(n);
                let old = d[off..off + n].to_vec();
                d[off..off + n].copy_from_slice(&new);
                sig = s.update(sig, off, &old, &new);
            }
            assert_eq!(sig, s.sign(&d), "{} len {len}", e.name());
        }
    }
}

#[test]
fn storage_forms_round_trip() {
    let s = Signer::<4>::new().sign(b"bitmend");
    assert_eq!(Sig64::from_u64(s.to_u64()), s);
    assert_eq!(Sig64::from_bytes(&s.to_bytes()), Some(s));
    assert_eq!(Sig64::from_bytes(&[1, 2, 3]), None);
    let t = Signer::<2>::new().sign(b"bitmend");
    assert_eq!(Sig32::from_u32(t.to_u32()), t);
    // The tower constant and alpha are part of the format: pin them.
    assert_eq!(gf16::T, 0x20);
    assert_eq!(gf16::alpha(), 0x0104);
}
