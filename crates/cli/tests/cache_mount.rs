//! The checked cache through the mount: with --direct-io every read reaches the daemon, a bit
//! flipped in a cached clean page (through the control file) is caught and the page read
//! again from flash, a flip in a dirty page is healed from the NVRAM tier's copy (on a read
//! or at write-back), and without the tier fails the read with EIO and never reaches flash
//! under a valid CRC.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{bitmend, fuse_available, mount, scratch, umount};

fn status(mnt: &str) -> String {
    std::fs::read_to_string(Path::new(mnt).join(".bitmend-scrub")).unwrap()
}

fn number(json: &str, key: &str) -> u64 {
    let at =
        json.find(&format!("\"{key}\": ")).unwrap_or_else(|| panic!("no {key} in {json}")) + key.len() + 4;
    json[at..].split([',', '}']).next().unwrap().trim().parse().unwrap()
}

fn flip(mnt: &str, ino: u64, page: u64, bit: u64) -> std::io::Result<()> {
    std::fs::write(Path::new(mnt).join(".bitmend-scrub"), format!("flip {ino} {page} {bit}\n"))
}

fn data() -> Vec<u8> {
    (0..64 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

#[test]
fn flips_in_the_daemons_cache_are_caught_clean_and_dirty() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("cache-mount");
    assert!(bitmend(&["mkfs", &img, "--size", "16MiB"]).status.success());
    // Write-back only at sync: a page written stays dirty in the daemon until then.
    let flags = ["--direct-io", "--verify", "every", "--commit-interval", "0", "--cache-check-rate", "0"];
    mount(&img, &mnt, &flags);
    let file = Path::new(&mnt).join("f");
    let want = data();
    std::fs::write(&file, &want).unwrap();
    let ino = std::fs::metadata(&file).unwrap().ino();
    assert!(bitmend(&["sync", &mnt]).status.success());
    assert_eq!(std::fs::read(&file).unwrap(), want, "read once: cached clean");
    // Clean: 16 flips, one per page, each caught by the next read, every byte right.
    for page in 0..16 {
        flip(&mnt, ino, page, 1000 + page * 37).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), want, "after the flip in page {page}");
    }
    assert_eq!(number(&status(&mnt), "cache_clean_caught"), 16, "16 flips injected");
    // Dirty, with the NVRAM tier: page 3 rewritten, then flipped before any sync. The read
    // finds it failing its CRC and heals it from the tier's copy; so does write-back, for a
    // flip in page 5 that no read saw first.
    let mut want = want;
    rewrite(&file, 3 * 4096 + 10, &[0xEE; 100], &mut want);
    flip(&mnt, ino, 3, 5).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), want, "the flipped dirty page, healed");
    rewrite(&file, 5 * 4096 + 7, &[0xDD; 50], &mut want);
    flip(&mnt, ino, 5, 4321).unwrap();
    assert!(bitmend(&["sync", &mnt]).status.success());
    assert_eq!(std::fs::read(&file).unwrap(), want, "the flipped dirty page, healed at write-back");
    assert_eq!(number(&status(&mnt), "cache_dirty_healed"), 2, "2 flips injected in dirty pages");
    assert_eq!(number(&status(&mnt), "cache_dirty_caught"), 0);
    // A page not in memory: nothing to flip.
    assert_eq!(flip(&mnt, ino, 500, 1).unwrap_err().raw_os_error(), Some(libc::ENODATA));
    assert_eq!(flip(&mnt, ino, 1, 99_999_999).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    umount(&mnt);

    // Without the tier there is no copy to heal from: the read fails (EIO), the other pages
    // read right, and flash gets the page under the CRC of what was written.
    mount(&img, &mnt, &[&flags[..], &["--nvram", "none"]].concat());
    assert_eq!(std::fs::read(&file).unwrap(), want, "healed pages reached flash right");
    rewrite(&file, 3 * 4096 + 10, &[0xCC; 100], &mut want);
    flip(&mnt, ino, 3, 5).unwrap();
    let err = std::fs::read(&file).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let mut head = vec![0u8; 3 * 4096];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(&file).unwrap(), &mut head, 0).unwrap();
    assert_eq!(head, want[..3 * 4096]);
    assert_eq!(number(&status(&mnt), "cache_dirty_caught"), 1);
    umount(&mnt);
    // After the remount the flipped page is still refused (flash holds it under the CRC of
    // what was written), and the rest reads back.
    mount(&img, &mnt, &["--direct-io"]);
    let mut page = vec![0u8; 4096];
    let file = std::fs::File::open(Path::new(&mnt).join("f")).unwrap();
    let err = std::os::unix::fs::FileExt::read_exact_at(&file, &mut page, 3 * 4096).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    for p in (0..16).filter(|&p| p != 3) {
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut page, p * 4096).unwrap();
        assert_eq!(page, want[p as usize * 4096..][..4096], "page {p} after the remount");
    }
    drop(file);
    umount(&mnt);
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes `bytes` at `at` of `file`, and into `want`.
fn rewrite(file: &Path, at: usize, bytes: &[u8], want: &mut [u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, bytes, at as u64).unwrap();
    want[at..at + bytes.len()].copy_from_slice(bytes);
}
