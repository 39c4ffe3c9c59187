//! Every engine this CPU runs gives the scalar engine's bytes on the same inputs.

mod common;

use bitmend_code::gf::{self, Engine, Scalar};
use common::Rng;
use proptest::prelude::*;

fn simd_engines() -> Vec<&'static dyn Engine> {
    gf::available().into_iter().filter(|e| e.name() != "scalar").collect()
}

/// One dot product on every engine, from the same unaligned slices of the same buffers.
fn check_dot(seed: u64, k: usize, m: usize, len: usize, skew: usize, accumulate: bool) {
    let mut rng = Rng::new(seed);
    let coeffs = rng.bytes(k * m);
    let bufs: Vec<Vec<u8>> = (0..k).map(|_| rng.bytes(len + 64)).collect();
    let srcs: Vec<&[u8]> = bufs.iter().enumerate().map(|(i, b)| &b[(skew + i) % 64..][..len]).collect();
    let start = rng.bytes(len);
    let run = |e: &dyn Engine| -> Vec<Vec<u8>> {
        let mut outs: Vec<Vec<u8>> = (0..m).map(|_| vec![0u8; len + 64]).collect();
        let mut views: Vec<&mut [u8]> =
            outs.iter_mut().enumerate().map(|(j, o)| &mut o[(skew * 3 + j) % 64..][..len]).collect();
        for v in &mut views {
            v.copy_from_slice(&start);
        }
        e.dot_prod(&coeffs, &srcs, &mut views, accumulate);
        views.iter().map(|v| v.to_vec()).collect()
    };
    let want = run(&Scalar);
    // The scalar engine itself against the definition, on a few bytes.
    for (j, out) in want.iter().enumerate() {
        for x in [0, len / 2, len.saturating_sub(1)].into_iter().filter(|&x| x < len) {
            let mut v = if accumulate { start[x] } else { 0 };
            for (i, s) in srcs.iter().enumerate() {
                v ^= gf::mul(coeffs[j * k + i], s[x]);
            }
            assert_eq!(out[x], v);
        }
    }
    for e in simd_engines() {
        assert_eq!(run(e), want, "engine {} k={k} m={m} len={len} skew={skew}", e.name());
    }
}

#[test]
fn dot_products_agree_on_awkward_lengths() {
    let mut seed = 1;
    for len in (0..200).chain([255, 256, 257, 1023, 4096, 4097, 65_536 + 33]) {
        for (k, m) in [(1, 1), (3, 2), (10, 4), (2, 6), (5, 9)] {
            seed += 1;
            check_dot(seed, k, m, len, seed as usize % 64, seed % 2 == 0);
        }
    }
}

#[test]
fn mul_acc_zero_and_one() {
    for e in gf::available() {
        let src: Vec<u8> = (0..1000).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0x5Au8; 1000];
        e.mul_acc(0, &src, &mut dst);
        assert!(dst.iter().all(|&b| b == 0x5A), "{}: 0 * src changed dst", e.name());
        e.mul_acc(1, &src, &mut dst);
        assert!(dst.iter().zip(&src).all(|(&d, &s)| d == s ^ 0x5A), "{}", e.name());
    }
}

/// One parity update on every engine: the same parity ranges, at unaligned offsets.
fn check_update(seed: u64, m: usize, len: usize, at: usize) {
    let mut rng = Rng::new(seed);
    let coeffs = rng.bytes(m);
    let (old, new) = (rng.bytes(len), rng.bytes(len));
    let start: Vec<Vec<u8>> = (0..m).map(|_| rng.bytes(at + len + 7)).collect();
    let run = |e: &dyn Engine| -> Vec<Vec<u8>> {
        let mut parity = start.clone();
        let mut views: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        e.update_parity(&coeffs, &old, &new, &mut views, at);
        parity
    };
    let want = run(&Scalar);
    // The scalar engine against the definition; bytes outside the range untouched.
    for (j, p) in want.iter().enumerate() {
        for (x, (&got, &was)) in p.iter().zip(&start[j]).enumerate() {
            let v = if (at..at + len).contains(&x) {
                was ^ gf::mul(coeffs[j], old[x - at] ^ new[x - at])
            } else {
                was
            };
            assert_eq!(got, v, "scalar m={m} len={len} at={at} byte {x}");
        }
    }
    for e in simd_engines() {
        assert_eq!(run(e), want, "engine {} m={m} len={len} at={at}", e.name());
    }
}

#[test]
fn parity_updates_agree_on_awkward_ranges() {
    let mut seed = 500;
    for len in (0..140).chain([255, 256, 257, 300, 1000]) {
        for (m, at) in [(1, 0), (2, 3), (4, 61), (5, 64), (9, 127)] {
            seed += 1;
            check_update(seed, m, len, at);
        }
    }
}

fn check_horner(seed: u64, groups: usize, n: usize) {
    let mut rng = Rng::new(seed);
    let data = rng.bytes(groups * 64);
    let steps: Vec<gf::WordMul> = (0..n)
        .map(|_| [rng.next_u64() as u8, rng.next_u64() as u8, rng.next_u64() as u8, rng.next_u64() as u8])
        .collect();
    let init: Vec<gf::Lanes> = (0..n).map(|_| rng.bytes(64).try_into().unwrap()).collect();
    let mut want = init.clone();
    Scalar.sig_horner(&data, &steps, &mut want);
    for e in simd_engines() {
        let mut got = init.clone();
        e.sig_horner(&data, &steps, &mut got);
        assert_eq!(got, want, "engine {} groups={groups} n={n}", e.name());
    }
}

#[test]
fn signature_folds_agree() {
    let mut rng = Rng::new(77);
    for n in 1..=4 {
        for _ in 0..50 {
            let accs: Vec<gf::Lanes> = (0..n).map(|_| rng.bytes(64).try_into().unwrap()).collect();
            let halves: Vec<[gf::WordMul; 5]> = (0..n)
                .map(|_| std::array::from_fn(|_| std::array::from_fn(|_| rng.next_u64() as u8)))
                .collect();
            let mut want = vec![0u16; n];
            Scalar.sig_fold(&accs, &halves, &mut want);
            for e in simd_engines() {
                let mut got = vec![0u16; n];
                e.sig_fold(&accs, &halves, &mut got);
                assert_eq!(got, want, "engine {} n={n}", e.name());
            }
        }
    }
}

/// Horner and the fold in one call, with the tables an engine prepared once (and without
/// them), against the scalar engine's two steps.
#[test]
fn prepared_signatures_agree() {
    let mut rng = Rng::new(91);
    for n in 1..=6 {
        for groups in [0, 1, 2, 3, 7, 64] {
            let data = rng.bytes(groups * 64);
            let steps: Vec<gf::WordMul> =
                (0..n).map(|_| std::array::from_fn(|_| rng.next_u64() as u8)).collect();
            let halves: Vec<[gf::WordMul; 5]> = (0..n)
                .map(|_| std::array::from_fn(|_| std::array::from_fn(|_| rng.next_u64() as u8)))
                .collect();
            let init: Vec<gf::Lanes> = (0..n).map(|_| rng.bytes(64).try_into().unwrap()).collect();
            let mut accs = init.clone();
            let mut want = vec![0u16; n];
            Scalar.sig_horner(&data, &steps, &mut accs);
            Scalar.sig_fold(&accs, &halves, &mut want);
            for e in gf::available() {
                let prepared = e.sig_prepare(&steps, &halves);
                for tables in [&prepared[..], &[]] {
                    let mut accs = init.clone();
                    let mut got = vec![0u16; n];
                    e.sig_sign(tables, &data, &steps, &halves, &mut accs, &mut got);
                    assert_eq!(
                        got,
                        want,
                        "engine {} n={n} groups={groups} tables={}",
                        e.name(),
                        tables.len()
                    );
                }
            }
        }
    }
}

#[test]
fn signature_kernels_agree() {
    let mut seed = 100;
    for groups in [0, 1, 2, 3, 7, 64, 1024] {
        for n in 1..=6 {
            seed += 1;
            check_horner(seed, groups, n);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn dot_products_agree_on_random_shapes(
        seed in any::<u64>(),
        k in 1usize..12,
        m in 1usize..7,
        len in 0usize..100 * 1024,
        skew in 0usize..64,
        accumulate in any::<bool>(),
    ) {
        check_dot(seed, k, m, len, skew, accumulate);
    }

    #[test]
    fn signature_kernels_agree_on_random_input(seed in any::<u64>(), groups in 0usize..200, n in 1usize..5) {
        check_horner(seed, groups, n);
    }
}

#[test]
fn the_cpu_features_give_the_engines() {
    let names: Vec<&str> = gf::available().iter().map(|e| e.name()).collect();
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(names.contains(&"avx2"), is_x86_feature_detected!("avx2"));
        assert_eq!(
            names.contains(&"avx512"),
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
        );
        assert_eq!(names.contains(&"ssse3"), is_x86_feature_detected!("ssse3"));
        assert_eq!(
            names.contains(&"gfni"),
            is_x86_feature_detected!("gfni") && is_x86_feature_detected!("avx512bw")
        );
    }
    assert_eq!(names[0], "scalar");
    eprintln!("engines: {names:?}, chosen: {}", gf::engine().name());
}
