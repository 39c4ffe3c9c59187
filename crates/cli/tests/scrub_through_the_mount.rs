//! The scrub never destroys, through the mount: on a 32 MiB image with a few hundred files,
//! programmed pages are damaged in turn four ways (erased-looking with the next page, garbage,
//! 400 flipped bits, a copy of another page) by writing the image file; each time the image
//! is mounted, every file read, `bitmend scrub MOUNTPOINT` run, every file read again, and
//! after unmounting fsck run. Every file readable before the scrub reads back the bytes
//! written after it, and fsck names exactly the files that do not (damage beyond the
//! redundancy: two pages of one group in the segment still being written). In CI one page in `SCRUB_MOUNT_STRIDE` (default 61) is damaged;
//! `SCRUB_MOUNT_STRIDE=1` damages every programmed page (outside CI: hours).

mod common;

use std::os::unix::fs::FileExt as _;

use common::{bitmend, fuse_available, mount, noise, scratch, umount};

const HEADER: u64 = 8192;
const RAW: u64 = 2048 + 64;

fn raw_at(page: u64) -> u64 {
    HEADER + page * RAW
}

/// Pages whose bytes are not all erased (the file stores bytes complemented: zero is erased).
fn programmed(img: &str) -> Vec<u64> {
    let bytes = std::fs::read(img).unwrap();
    let pages = (bytes.len() as u64 - HEADER) / RAW;
    (0..pages)
        .filter(|&p| bytes[raw_at(p) as usize..(raw_at(p) + RAW) as usize].iter().any(|&b| b != 0))
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Damage {
    ErasedWithNext,
    Garbage,
    Flips,
    CopyOf,
}

fn damage(img: &str, how: Damage, page: u64, pages: &[u64], seed: u64) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(img).unwrap();
    let mut rng = bitmend_media::rng::Rng::new(seed);
    match how {
        Damage::ErasedWithNext => {
            f.write_all_at(&[0u8; 64], raw_at(page) + 2048).unwrap();
            f.write_all_at(&vec![0u8; RAW as usize], raw_at(page + 1)).unwrap();
        }
        Damage::Garbage => {
            let mut b = vec![0u8; RAW as usize];
            rng.fill(&mut b);
            f.write_all_at(&b, raw_at(page)).unwrap();
        }
        Damage::Flips => {
            let mut b = vec![0u8; RAW as usize];
            f.read_exact_at(&mut b, raw_at(page)).unwrap();
            for _ in 0..400 {
                let bit = rng.below(2048 * 8) as usize;
                b[bit / 8] ^= 1 << (bit % 8);
            }
            f.write_all_at(&b, raw_at(page)).unwrap();
        }
        Damage::CopyOf => {
            let other =
                pages[(pages.iter().position(|&p| p == page).unwrap() + pages.len() / 2) % pages.len()];
            let mut b = vec![0u8; RAW as usize];
            f.read_exact_at(&mut b, raw_at(other)).unwrap();
            f.write_all_at(&b, raw_at(page)).unwrap();
        }
    }
}

fn content(i: usize) -> Vec<u8> {
    noise(i as u64, 100 + (i * 7919) % 30_000)
}

/// Which files read back exactly as written.
fn readable(mnt: &str, files: usize) -> Vec<bool> {
    (0..files)
        .map(|i| std::fs::read(format!("{mnt}/d{}/f{i}", i % 8)).is_ok_and(|b| b == content(i)))
        .collect()
}

#[test]
fn scrub_through_the_mount_never_leaves_less_readable() {
    if !fuse_available() {
        return;
    }
    let stride: usize = std::env::var("SCRUB_MOUNT_STRIDE").ok().and_then(|s| s.parse().ok()).unwrap_or(61);
    let (dir, img, mnt) = scratch("scrub-mount");
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let files = 200;
    mount(&img, &mnt, &["--nvram", "none"]);
    for d in 0..8 {
        std::fs::create_dir(format!("{mnt}/d{d}")).unwrap();
    }
    for i in 0..files {
        std::fs::write(format!("{mnt}/d{}/f{i}", i % 8), content(i)).unwrap();
    }
    umount(&mnt);
    let clean = dir.join("clean.img");
    std::fs::copy(&img, &clean).unwrap();
    let pages = programmed(&img);
    let kinds = [Damage::ErasedWithNext, Damage::Garbage, Damage::Flips, Damage::CopyOf];
    let (mut runs, mut lost_before, mut healed) = (0, 0, 0);
    for (n, &page) in pages.iter().enumerate().filter(|(n, _)| n % stride == 0) {
        for (k, &how) in kinds.iter().enumerate() {
            let when = format!("page {page} {how:?}");
            std::fs::copy(&clean, &img).unwrap();
            damage(&img, how, page, &pages, (n * 4 + k) as u64);
            mount(&img, &mnt, &["--nvram", "none"]);
            let before = readable(&mnt, files);
            let out = bitmend(&["scrub", &mnt]);
            assert!(
                matches!(out.status.code(), Some(0 | 4 | 5)),
                "{when}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let after = readable(&mnt, files);
            umount(&mnt);
            for i in 0..files {
                assert!(
                    !before[i] || after[i],
                    "{when}: file {i} was readable before the scrub and not after"
                );
            }
            lost_before += before.iter().filter(|&&r| !r).count();
            healed += before.iter().zip(&after).filter(|(b, a)| !**b && **a).count();
            // What stays unreadable is beyond the redundancy: fsck names exactly those files.
            let out = bitmend(&["fsck", &img, "--json"]);
            assert!(
                matches!(out.status.code(), Some(0 | 4)),
                "{when}: fsck: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let said = String::from_utf8_lossy(&out.stdout);
            let lost: Vec<usize> = (0..files).filter(|&i| !after[i]).collect();
            assert_eq!(
                said.matches("\"path\": ").count(),
                lost.len(),
                "{when}: {said}; unreadable: {lost:?}"
            );
            for i in lost {
                let path = format!("\"path\": \"/d{}/f{i}\"", i % 8);
                assert!(said.contains(&path), "{when}: f{i} is not named: {said}");
            }
            runs += 1;
        }
    }
    eprintln!(
        "{runs} scrubs through the mount ({} programmed pages, every {stride}th damaged four ways): \
         no file readable before a scrub was unreadable after it; {lost_before} file reads failed before a scrub, {healed} of them read after",
        pages.len()
    );
    assert!(runs >= 40, "{runs} scrubs");
    let _ = std::fs::remove_dir_all(dir);
}
