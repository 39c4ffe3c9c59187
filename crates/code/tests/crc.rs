//! CRC-32C: the kernel against the portable path, combine and update against recomputation.

mod common;

use bitmend_code::crc::{self, combine, crc32c, crc32c_append, update, Shift};
use common::Rng;

#[test]
fn kernel_matches_portable_at_every_length() {
    let mut rng = Rng::new(1);
    let data = rng.bytes(70_000);
    for len in (0..600).chain([
        767, 768, 831, 832, 1023, 1024, 1025, 1087, 1088, 2111, 2112, 1279, 1280, 1535, 1536, 1359, 1360,
        4080, 4095, 4096, 4097, 24_575, 24_576, 24_577, 70_000,
        // Around the folding kernel's side streams: from 16 KiB on, where a round more of them
        // starts (every 608 bytes), and past the lengths whose shifts are kept (32 rounds).
        16_383, 16_384, 16_385, 16_927, 16_928, 16_929, 19_967, 20_000, 20_577, 65_536,
    ]) {
        for skew in [0, 1, 7] {
            let d = &data[skew..skew + len.min(data.len() - skew)];
            assert_eq!(crc::raw(0x1234_5678, d), crc::portable_raw(0x1234_5678, d), "len {len}");
        }
    }
}

/// Each path this CPU runs, on its own, against the portable one: the dispatcher alone would
/// leave the three-stream kernel's long rounds untested on CPUs with the folding kernel.
#[test]
fn every_path_matches_portable() {
    let mut rng = Rng::new(9);
    let data = rng.bytes(100_016);
    let paths = crc::paths();
    assert!(paths.contains(&crc::Path::Portable));
    for &path in &paths {
        for len in (0..700).chain([
            1359, 1360, 4079, 4080, 4096, 16_383, 16_384, 16_928, 24_575, 24_576, 24_577, 30_000, 99_999,
        ]) {
            let d = &data[3..3 + len];
            assert_eq!(
                crc::raw_on(path, 0xDEAD_BEEF, d),
                Some(crc::portable_raw(0xDEAD_BEEF, d)),
                "{path:?} len {len}"
            );
        }
    }
    eprintln!("CRC paths checked: {paths:?}");
}

/// A 4 KiB page has a kernel of its own on CPUs with AVX-512 (`crc/page.rs`: folding with
/// three `crc32` streams beside it): many pages, from many states, against the portable path.
#[test]
fn page_kernel_matches_portable() {
    let mut rng = Rng::new(11);
    for i in 0..256u32 {
        let page = rng.bytes(4096);
        let state = i.wrapping_mul(0x9E37_79B9) ^ 0x5A5A_0F0F;
        assert_eq!(crc::raw(state, &page), crc::portable_raw(state, &page), "page {i}");
    }
    // Damage in any of the three parts (folded, streams, the stream that ends the page).
    let page = rng.bytes(4096);
    for at in [0, 511, 3583, 3584, 3760, 3761, 3928, 4095] {
        let mut bad = page.clone();
        bad[at] ^= 0x10;
        assert_ne!(crc32c(&bad), crc32c(&page), "a flip at {at} changes the CRC");
        assert_eq!(crc32c(&bad), !crc::portable_raw(!0, &bad), "a flip at {at}");
    }
}

#[test]
fn append_is_concatenation() {
    let mut rng = Rng::new(2);
    let d = rng.bytes(10_000);
    for cut in [0, 1, 100, 4096, 9999, 10_000] {
        assert_eq!(crc32c_append(crc32c(&d[..cut]), &d[cut..]), crc32c(&d));
    }
}

#[test]
fn combine_matches_recomputation() {
    let mut rng = Rng::new(3);
    for (la, lb) in [(0, 0), (1, 0), (0, 1), (5, 3), (4096, 4096), (1, 70_001), (123, 1 << 20)] {
        let a = rng.bytes(la);
        let b = rng.bytes(lb);
        let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
        assert_eq!(combine(crc32c(&a), crc32c(&b), lb as u64), crc32c(&whole), "{la}+{lb}");
    }
    // A shift built once applies to any CRC.
    let s = Shift::new(4096);
    let page = rng.bytes(4096);
    let head = rng.bytes(10);
    let whole: Vec<u8> = head.iter().chain(&page).copied().collect();
    assert_eq!(s.apply(crc32c(&head)) ^ crc32c(&page), crc32c(&whole));
}

#[test]
fn partial_overwrite_update_matches_recomputation() {
    let mut rng = Rng::new(4);
    for page_len in [1usize, 64, 4096, 65_536] {
        let mut page = rng.bytes(page_len);
        let mut c = crc32c(&page);
        for _ in 0..100 {
            let n = 1 + rng.below(page_len.min(700));
            let off = rng.below(page_len - n + 1);
            let new = rng.bytes(n);
            let old = page[off..off + n].to_vec();
            page[off..off + n].copy_from_slice(&new);
            c = update(c, page_len, off, &old, &new);
            assert_eq!(c, crc32c(&page), "page {page_len} off {off} n {n}");
        }
    }
}

/// The line kernel against the portable path, a line at a time: every count of lines from
/// none to 13 (the four-line rounds and every remainder), random bytes, and a flip in each
/// line in turn changing that line's CRC alone.
#[test]
fn crc32c_lines_matches_each_line_alone() {
    let mut rng = Rng::new(0x11E5);
    for n in 0..=13usize {
        let mut data = vec![0u8; n * crc::LINE];
        rng.fill(&mut data);
        let mut ours = vec![0u32; n];
        let mut alone = vec![0u32; n];
        crc::crc32c_lines(&data, &mut ours);
        crc::portable_lines(&data, &mut alone);
        assert_eq!(ours, alone, "{n} lines");
        for (i, line) in data.chunks_exact(crc::LINE).enumerate() {
            assert_eq!(ours[i], crc32c(line), "line {i} of {n}");
        }
        for i in 0..n {
            let (at, bit) = (i * crc::LINE + rng.below(crc::LINE), 1u8 << rng.below(8));
            data[at] ^= bit;
            let mut flipped = vec![0u32; n];
            crc::crc32c_lines(&data, &mut flipped);
            for (j, (a, b)) in flipped.iter().zip(&ours).enumerate() {
                assert_eq!(a != b, i == j, "a flip in line {i} of {n}, line {j}");
            }
            data[at] ^= bit;
        }
    }
}
