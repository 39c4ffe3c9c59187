//! Reed–Solomon: MDS for every erasure pattern, `update` equals re-encoding, shapes checked.

mod common;

use bitmend_code::gf;
use bitmend_code::rs::{CodeError, Codec};
use common::Rng;

fn stripe(rng: &mut Rng, codec: &Codec, len: usize) -> Vec<Vec<u8>> {
    let (k, m) = (codec.k(), codec.m());
    let mut chunks: Vec<Vec<u8>> = (0..k).map(|_| rng.bytes(len)).collect();
    chunks.extend((0..m).map(|_| vec![0u8; len]));
    let (data, parity) = chunks.split_at_mut(k);
    let data: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
    codec.encode(&data, &mut parity).unwrap();
    chunks
}

/// All subsets of 0..n of size exactly s, as index lists.
fn subsets(n: usize, s: usize) -> Vec<Vec<usize>> {
    (0u32..1 << n)
        .filter(|b| b.count_ones() as usize == s)
        .map(|b| (0..n).filter(|i| b & (1 << i) != 0).collect())
        .collect()
}

#[test]
fn every_erasure_pattern_is_recovered_for_small_shapes() {
    let mut rng = Rng::new(7);
    let mut patterns = 0;
    for n in 1..=8 {
        for k in 1..=n {
            let m = n - k;
            for e in gf::available() {
                let codec = Codec::with_engine(k, m, e).unwrap();
                let good = stripe(&mut rng, &codec, 77);
                for s in 0..=m {
                    for erased in subsets(n, s) {
                        let mut chunks = good.clone();
                        for &i in &erased {
                            rng.fill(&mut chunks[i]);
                        }
                        let mut views: Vec<&mut [u8]> = chunks.iter_mut().map(|c| c.as_mut_slice()).collect();
                        codec.reconstruct(&mut views, &erased).unwrap();
                        assert_eq!(chunks, good, "k={k} m={m} erased={erased:?} engine={}", e.name());
                        patterns += 1;
                    }
                }
                if m < n {
                    let erased: Vec<usize> = (0..=m).collect();
                    let mut chunks = good.clone();
                    let mut views: Vec<&mut [u8]> = chunks.iter_mut().map(|c| c.as_mut_slice()).collect();
                    assert_eq!(
                        codec.reconstruct(&mut views, &erased),
                        Err(CodeError::TooManyErasures { erased: m + 1, m })
                    );
                }
            }
        }
    }
    assert!(patterns > 1000, "only {patterns} patterns checked");
}

#[test]
fn large_shapes_recover_random_patterns() {
    let mut rng = Rng::new(11);
    for (k, m) in [(10, 4), (200, 55), (1, 254), (254, 1), (32, 32)] {
        let codec = Codec::new(k, m).unwrap();
        let good = stripe(&mut rng, &codec, 100);
        for _ in 0..5 {
            let mut idx: Vec<usize> = (0..k + m).collect();
            for i in 0..idx.len() {
                let j = i + rng.below(idx.len() - i);
                idx.swap(i, j);
            }
            let erased = &idx[..m];
            let mut chunks = good.clone();
            for &i in erased {
                chunks[i].fill(0xEE);
            }
            let mut views: Vec<&mut [u8]> = chunks.iter_mut().map(|c| c.as_mut_slice()).collect();
            codec.reconstruct(&mut views, erased).unwrap();
            assert_eq!(chunks, good, "k={k} m={m}");
        }
    }
}

#[test]
fn update_equals_reencoding() {
    let mut rng = Rng::new(5);
    for e in gf::available() {
        for (k, m) in [(4, 1), (4, 2), (10, 4), (3, 7), (5, 0)] {
            let codec = Codec::with_engine(k, m, e).unwrap();
            let len = 3000;
            let mut chunks = stripe(&mut rng, &codec, len);
            for _ in 0..50 {
                let index = rng.below(k);
                let cap = if rng.below(2) == 0 { 100 } else { 2000 };
                let n = 1 + rng.below(cap);
                let off = rng.below(len - n + 1);
                let new = rng.bytes(n);
                let old = chunks[index][off..off + n].to_vec();
                chunks[index][off..off + n].copy_from_slice(&new);
                let (_, parity) = chunks.split_at_mut(k);
                let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
                codec.update(index, off, &old, &new, &mut parity).unwrap();
            }
            let data: Vec<Vec<u8>> = chunks[..k].to_vec();
            let fresh = {
                let mut c = data.clone();
                c.extend((0..m).map(|_| vec![0u8; len]));
                let (d, p) = c.split_at_mut(k);
                let d: Vec<&[u8]> = d.iter().map(|x| x.as_slice()).collect();
                let mut p: Vec<&mut [u8]> = p.iter_mut().map(|x| x.as_mut_slice()).collect();
                codec.encode(&d, &mut p).unwrap();
                c
            };
            assert_eq!(chunks, fresh, "k={k} m={m} engine={}", e.name());
        }
    }
}

#[test]
fn bad_shapes_and_arguments_are_errors() {
    assert_eq!(Codec::new(0, 1).unwrap_err(), CodeError::Shape { k: 0, m: 1 });
    assert_eq!(Codec::new(200, 56).unwrap_err(), CodeError::Shape { k: 200, m: 56 });
    assert!(Codec::new(255, 0).is_ok());
    let codec = Codec::new(2, 2).unwrap();
    let a = [1u8; 8];
    let b = [2u8; 7];
    let mut p0 = [0u8; 8];
    let mut p1 = [0u8; 8];
    assert!(matches!(codec.encode(&[&a, &b], &mut [&mut p0, &mut p1]), Err(CodeError::ChunkLen { .. })));
    assert!(matches!(codec.encode(&[&a], &mut [&mut p0, &mut p1]), Err(CodeError::ChunkCount { .. })));
    let mut c: Vec<Vec<u8>> = vec![vec![0; 8]; 4];
    let mut v: Vec<&mut [u8]> = c.iter_mut().map(|x| x.as_mut_slice()).collect();
    assert!(matches!(codec.reconstruct(&mut v, &[1, 1]), Err(CodeError::ErasureIndex { .. })));
    assert!(matches!(codec.reconstruct(&mut v, &[4]), Err(CodeError::ErasureIndex { .. })));
    let mut p: Vec<&mut [u8]> = c[2..].iter_mut().map(|x| x.as_mut_slice()).collect();
    assert!(matches!(codec.update(2, 0, &[1], &[2], &mut p), Err(CodeError::DataIndex { .. })));
    assert!(matches!(codec.update(0, 7, &[1, 2], &[2, 3], &mut p), Err(CodeError::Range { .. })));
    assert!(matches!(codec.update(0, usize::MAX, &[1], &[2], &mut p), Err(CodeError::Range { .. })));
}
