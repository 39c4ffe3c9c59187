//! The checked cache through the mount: with --direct-io every read reaches the daemon, a bit
//! flipped in a cached clean page (through the control file) is caught and the page read
//! again from flash, and a flip in a dirty page fails the read with EIO and never reaches
//! flash under a valid CRC.

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
    // Dirty: page 3 rewritten, then flipped before any sync. A read fails (EIO); the other
    // pages read right.
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xEE; 100], 3 * 4096 + 10).unwrap();
    drop(f);
    flip(&mnt, ino, 3, 5).unwrap();
    let err = std::fs::read(&file).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let mut head = vec![0u8; 3 * 4096];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(&file).unwrap(), &mut head, 0).unwrap();
    assert_eq!(head, want[..3 * 4096]);
    assert_eq!(number(&status(&mnt), "cache_dirty_caught"), 1);
    // A page not in memory: nothing to flip.
    assert_eq!(flip(&mnt, ino, 500, 1).unwrap_err().raw_os_error(), Some(libc::ENODATA));
    assert_eq!(flip(&mnt, ino, 1, 99_999_999).unwrap_err().raw_os_error(), Some(libc::EINVAL));
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
