//! What a command does with a path that is not an image file: `mkfs --force` replaces only a
//! bitmend image, a block device is refused saying where the raw pages are, a character
//! device that is not an MTD chip is refused and left alone, and options that only make sense
//! for an image file are refused for a device. (A real MTD chip: scripts/vm/quick.sh.)

mod common;

use common::{bitmend, scratch};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn mkfs_force_never_replaces_a_file_that_is_not_a_bitmend_image() {
    let (dir, img, _) = scratch("force-not-image");
    let precious: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(&img, &precious).unwrap();
    let out = bitmend(&["mkfs", &img, "--size", "16MiB", "--force"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("not a bitmend NAND image"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&img).unwrap(), precious, "the file is untouched");
    // A bitmend image is replaced, as before.
    std::fs::remove_file(&img).unwrap();
    assert!(bitmend(&["mkfs", &img, "--size", "16MiB"]).status.success());
    assert!(bitmend(&["mkfs", &img, "--size", "8MiB", "--force"]).status.success());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_character_device_that_is_not_an_mtd_chip_is_refused_and_left_alone() {
    for args in [
        vec!["mkfs", "/dev/null", "--force"],
        vec!["fsck", "/dev/null"],
        vec!["media", "info", "/dev/null"],
        vec!["stat", "/dev/null"],
    ] {
        let out = bitmend(&args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("not an MTD chip"), "{args:?}: {}", stderr(&out));
    }
    let meta = std::fs::metadata("/dev/null").unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&meta.file_type()), "/dev/null is still a device");
}

#[test]
fn a_block_device_is_refused_saying_where_the_raw_pages_are() {
    let (dir, _, _) = scratch("block-device");
    let node = dir.join("blk");
    let c = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
    // SAFETY: mknod of a path we own; a block node for loop0, never opened.
    let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(7, 0)) } == 0;
    if !made {
        eprintln!("mknod needs root: skipped");
        return;
    }
    let out = bitmend(&["mkfs", node.to_str().unwrap(), "--force"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("MTD character device"), "{}", stderr(&out));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn oob_is_for_devices_only() {
    let (dir, img, _) = scratch("oob-image");
    let out = bitmend(&["mkfs", &img, "--oob", "ecc"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!std::path::Path::new(&img).exists(), "nothing is made");
    std::fs::remove_dir_all(dir).unwrap();
}
