//! The edges of issue 15, point 5, through the mount: symlink targets of 4,095 bytes,
//! extended attributes as tools set them (setxattr(2) and its flags, sizes, ERANGE), and
//! fallocate(2) and posix_fallocate(3), which before fell back to writing zeros until the chip
//! was full.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;

use common::*;

fn c(path: &str) -> CString {
    CString::new(std::path::Path::new(path).as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn setxattr(path: &str, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let (p, n) = (c(path), CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

fn getxattr(path: &str, name: &str, size: usize) -> Result<Vec<u8>, i32> {
    let (p, n) = (c(path), CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(if size == 0 { 0 } else { r as usize });
    if size == 0 {
        buf.resize(r as usize, 0);
    }
    Ok(buf)
}

fn listxattr(path: &str) -> Vec<String> {
    let p = c(path);
    let mut buf = vec![0u8; 4096];
    // SAFETY: a valid NUL-terminated string and a buffer of the length given.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "listxattr: {}", errno());
    buf[..r as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into())
        .collect()
}

#[test]
fn long_symlinks_xattrs_and_fallocate_through_the_mount() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("edges");
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let pid = mount(&img, &mnt, &[]);

    // Symlinks: 4,095 bytes (PATH_MAX - 1) work; the kernel refuses 4,096 itself.
    let target: String = (0..4095).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    std::os::unix::fs::symlink(&target, format!("{mnt}/long")).unwrap();
    assert_eq!(std::fs::read_link(format!("{mnt}/long")).unwrap().as_os_str().len(), 4095);
    let too_long = format!("{target}x");
    assert!(std::os::unix::fs::symlink(&too_long, format!("{mnt}/longer")).is_err());

    // Extended attributes.
    let f = format!("{mnt}/f");
    std::fs::write(&f, b"hello").unwrap();
    setxattr(&f, "user.mime_type", b"text/plain", 0).unwrap();
    setxattr(&f, "user.empty", b"", 0).unwrap();
    assert_eq!(getxattr(&f, "user.mime_type", 0).unwrap().len(), 10, "size query");
    assert_eq!(getxattr(&f, "user.mime_type", 64).unwrap(), b"text/plain");
    assert_eq!(getxattr(&f, "user.mime_type", 4), Err(libc::ERANGE));
    assert_eq!(getxattr(&f, "user.missing", 64), Err(libc::ENODATA));
    assert_eq!(setxattr(&f, "user.mime_type", b"x", libc::XATTR_CREATE), Err(libc::EEXIST));
    assert_eq!(setxattr(&f, "user.missing", b"x", libc::XATTR_REPLACE), Err(libc::ENODATA));
    assert_eq!(setxattr(&f, "user.huge", &vec![7u8; 8000], 0), Err(libc::E2BIG));
    assert_eq!(listxattr(&f), ["user.empty", "user.mime_type"]);
    let d = format!("{mnt}/d");
    std::fs::create_dir(&d).unwrap();
    setxattr(&d, "user.on_a_dir", &[1, 2, 3], 0).unwrap();
    // SAFETY: valid NUL-terminated strings.
    assert_eq!(unsafe { libc::removexattr(c(&f).as_ptr(), c("user.empty").as_ptr()) }, 0);
    assert_eq!(listxattr(&f), ["user.mime_type"]);

    // fallocate: mode 0 grows the file and holds the space; KEEP_SIZE holds it only; more
    // than is free fails at once with ENOSPC and leaves the file as it was (glibc's
    // fallback would have written zeros until the chip was full).
    let g = format!("{mnt}/g");
    let file =
        std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&g).unwrap();
    let free = |m: &str| {
        // SAFETY: statvfs is plain integers, for which all zeros is a valid value.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: the path is NUL-terminated and lives through the call; `s` is writable.
        assert_eq!(unsafe { libc::statvfs(c(m).as_ptr(), &mut s) }, 0);
        s.f_bavail * s.f_frsize
    };
    let before = free(&mnt);
    // SAFETY: a file descriptor this test owns.
    assert_eq!(unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 4 << 20) }, 0, "errno {}", errno());
    assert_eq!(file.metadata().unwrap().len(), 4 << 20);
    assert!(before - free(&mnt) >= 4 << 20, "{before} free before, {} after", free(&mnt));
    // SAFETY: as above.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, 1 << 40) };
    assert_eq!((r, file.metadata().unwrap().len()), (libc::ENOSPC, 4 << 20));
    // Data, then a hole punched in it: zeros there, the size kept.
    let body: Vec<u8> = (0..4 << 20).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    drop(file);
    std::fs::write(&g, &body).unwrap();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&g).unwrap();
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fallocate(file.as_raw_fd(), mode, 1000, 1 << 20) }, 0, "errno {}", errno());
    let mut want = body.clone();
    want[1000..1000 + (1 << 20)].fill(0);
    assert!(std::fs::read(&g).unwrap() == want, "after the punch");
    // Modes bitmend does not do are refused as such.
    // SAFETY: as above.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096) };
    assert_eq!((r, errno()), (-1, libc::EOPNOTSUPP));
    drop(file);

    // `bitmend stat MOUNTPOINT` answers through the daemon (before, "Is a directory").
    let out = bitmend(&["stat", &mnt, "--json"]);
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{json}{}", String::from_utf8_lossy(&out.stderr));
    for key in [
        "\"mountpoint\"",
        "\"inodes\": 5",
        "\"bytes_free\"",
        "\"file_data_bytes\"",
        "\"lifetime_scrub_passes\"",
    ] {
        assert!(json.contains(key), "{key} in {json}");
    }
    let out = bitmend(&["stat", &mnt]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("5 inodes"));
    // fsck of the mountpoint says what it is and what to do instead.
    let out = bitmend(&["fsck", &mnt]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("a mounted bitmend file system") && said.contains(&img),
        "{said}"
    );

    // All of it durable through `bitmend sync` and a kill -9.
    assert!(bitmend(&["sync", &mnt]).status.success());
    kill_9(pid, &mnt);
    fsck_clean(&img, "after kill -9");
    mount(&img, &mnt, &[]);
    assert_eq!(std::fs::read_link(format!("{mnt}/long")).unwrap().as_os_str().as_bytes(), target.as_bytes());
    assert_eq!(getxattr(&f, "user.mime_type", 64).unwrap(), b"text/plain");
    assert_eq!(getxattr(&d, "user.on_a_dir", 64).unwrap(), [1, 2, 3]);
    assert!(std::fs::read(&g).unwrap() == want, "after a remount");
    umount(&mnt);
    fsck_clean(&img, "after umount");
    let _ = std::fs::remove_dir_all(dir);
}

/// The mount drops an executable's privileges itself (FUSE_HANDLE_KILLPRIV_V2, where the
/// kernel offers it): a write or truncate by an unprivileged user clears set-user-ID and
/// set-group-ID (with group execute), a change of owner does too, and root's write keeps
/// them. Needs root (to write as another user); skipped otherwise.
#[test]
fn unprivileged_writes_truncates_and_chown_drop_setuid_and_setgid() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let root =
        std::process::Command::new("id").arg("-u").output().map(|o| o.stdout == b"0\n").unwrap_or(false);
    if !fuse_available() || !root {
        eprintln!("needs root and FUSE: skipped");
        return;
    }
    let (dir, img, mnt) = scratch("killpriv");
    assert!(bitmend(&["mkfs", &img, "--size", "16MiB"]).status.success());
    mount(&img, &mnt, &["--allow-other"]);
    let f = std::path::Path::new(&mnt).join("x");
    std::fs::write(&f, b"#!/bin/sh\n").unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let set = |m: u32| std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();
    let as_nobody = |cmd: &str| {
        let s = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(&mnt)
            .uid(65534)
            .gid(65534)
            .status();
        assert!(s.unwrap().success(), "{cmd}");
    };
    set(0o6777);
    let mut w = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
    std::io::Write::write_all(&mut w, b"# root\n").unwrap();
    drop(w);
    assert_eq!(mode(&f), 0o6777, "root's write keeps the bits");
    as_nobody("echo '# nobody' >> x");
    assert_eq!(mode(&f), 0o0777, "an unprivileged write clears both");
    set(0o6767);
    as_nobody("echo '# nobody' >> x");
    assert_eq!(mode(&f), 0o2767, "set-group-ID without group execute stays");
    set(0o4777);
    as_nobody("truncate -s 3 x");
    assert_eq!((mode(&f), std::fs::metadata(&f).unwrap().len()), (0o0777, 3), "truncate");
    set(0o4755);
    std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
    assert_eq!(mode(&f), 0o0755, "chown clears set-user-ID");
    umount(&mnt);
    fsck_clean(&img, "after the privilege drops");
    std::fs::remove_dir_all(&dir).unwrap();
}
