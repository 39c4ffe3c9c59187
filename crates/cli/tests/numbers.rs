//! The numbers tools read through the mount: `st_blocks` (du, `tar --sparse`, `rsync -S`)
//! counts stored pages, not holes, and falls when a hole is punched; `statfs`'s free inodes
//! come from the free space; `renameat2` with a flag we do not support is refused, never done
//! as a plain rename.

mod common;

use std::ffi::CString;
use std::os::unix::fs::MetadataExt as _;

use common::{fuse_available, mount, noise, scratch, umount};

fn statvfs(path: &str) -> libc::statvfs {
    let c = CString::new(path).unwrap();
    // SAFETY: statvfs is plain data; all zeros is a valid value of it.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a struct the call fills.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s
}

fn blocks(path: &str) -> u64 {
    std::fs::metadata(path).unwrap().blocks()
}

#[test]
fn numbers_tools_read() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("numbers");
    assert!(common::bitmend(&["mkfs", &img, "--size", "64MiB"]).status.success());
    mount(&img, &mnt, &["--nvram", "none"]);

    // A 1 GiB sparse file on a 64 MiB file system stores nothing.
    let sparse = format!("{mnt}/sparse");
    std::fs::File::create(&sparse).unwrap().set_len(1 << 30).unwrap();
    assert_eq!(blocks(&sparse), 0);
    // 2 MiB written: 4,096 sectors; 1 MiB punched out of it: half.
    let data = format!("{mnt}/data");
    std::fs::write(&data, noise(5, 2 << 20)).unwrap();
    assert_eq!(blocks(&data), 4096);
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    use std::os::fd::AsRawFd as _;
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on a descriptor we own.
    assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), mode, 0, 1 << 20) }, 0);
    drop(f);
    assert_eq!((blocks(&data), std::fs::metadata(&data).unwrap().len()), (2048, 2 << 20));

    // Free inodes: from the space, not a constant, and fewer once files and data take it.
    let before = statvfs(&mnt);
    assert_ne!(before.f_ffree, 1_000_000);
    let free_bytes = before.f_bfree * before.f_frsize;
    assert!(before.f_ffree > free_bytes / 1024 && before.f_ffree < free_bytes / 64, "{}", before.f_ffree);
    assert_eq!(before.f_files - before.f_ffree, 3, "root and two files in use");
    std::fs::write(format!("{mnt}/more"), noise(6, 4 << 20)).unwrap();
    common::bitmend(&["sync", &mnt]);
    let after = statvfs(&mnt);
    assert!(after.f_ffree < before.f_ffree, "{} then {}", before.f_ffree, after.f_ffree);

    // RENAME_WHITEOUT (overlayfs) needs CAP_MKNOD before it reaches us; as root it must be
    // refused with EINVAL and leave both names as they were.
    let (a, b) = (format!("{mnt}/a"), format!("{mnt}/b"));
    std::fs::write(&a, b"a").unwrap();
    std::fs::write(&b, b"b").unwrap();
    let (ca, cb) = (CString::new(a.clone()).unwrap(), CString::new(b.clone()).unwrap());
    const RENAME_WHITEOUT: libc::c_uint = 4;
    // SAFETY: NUL-terminated paths, as renameat2(2) takes them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            RENAME_WHITEOUT,
        )
    };
    let errno = std::io::Error::last_os_error().raw_os_error();
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!((r, errno), (-1, Some(libc::EINVAL)));
    } else {
        assert_eq!(r, -1, "refused (EPERM without CAP_MKNOD)");
    }
    assert_eq!((std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap()), (b"a".to_vec(), b"b".to_vec()));

    umount(&mnt);
    common::fsck_clean(&img, "after the numbers");
    let _ = std::fs::remove_dir_all(dir);
}
