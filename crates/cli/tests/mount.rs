//! The FUSE mount end to end: mkfs, mount, ordinary file operations through the kernel,
//! a second mount refused, unmount, fsck clean, remount and read back.

use std::path::Path;
use std::process::{Command, Output};

fn bitmend(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitmend")).args(args).output().expect("runs")
}

fn unmount(mnt: &Path) {
    let s = Command::new("fusermount3").arg("-u").arg(mnt).status().expect("fusermount3 runs");
    assert!(s.success());
    // The daemon writes everything out after the kernel lets go; wait for the lock.
    std::thread::sleep(std::time::Duration::from_millis(300));
}

#[test]
fn mount_use_unmount_check() {
    if !Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("BITMEND_REQUIRE_FUSE").is_none(), "FUSE required but /dev/fuse is missing");
        eprintln!("no /dev/fuse: skipped");
        return;
    }
    let dir = std::env::temp_dir().join(format!("bitmend-mount-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("fs.img");
    let mnt = dir.join("mnt");
    let (img_s, mnt_s) = (img.to_str().unwrap(), mnt.to_str().unwrap());
    let out = bitmend(&["mkfs", img_s, "--size", "16MiB"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = bitmend(&["mount", img_s, mnt_s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let big: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(mnt.join("big.bin"), &big).unwrap();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::write(mnt.join("dir/small.txt"), b"hello, flash").unwrap();
    std::fs::rename(mnt.join("dir/small.txt"), mnt.join("dir/renamed.txt")).unwrap();
    std::os::unix::fs::symlink("dir/renamed.txt", mnt.join("link")).unwrap();
    assert_eq!(std::fs::read(mnt.join("link")).unwrap(), b"hello, flash");
    assert_eq!(std::fs::read(mnt.join("big.bin")).unwrap(), big);
    let mut names: Vec<String> =
        std::fs::read_dir(&mnt).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["big.bin", "dir", "link"]);

    // A second mount of the same image is refused, not corrupted.
    let out = bitmend(&["mount", img_s, dir.join("mnt2").to_str().unwrap()]);
    assert!(!out.status.success());
    unmount(&mnt);

    let out = bitmend(&["fsck", img_s, "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("\"clean\": true"), "{text}");

    let out = bitmend(&["mount", img_s, mnt_s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(mnt.join("big.bin")).unwrap(), big, "after remount");
    assert_eq!(std::fs::read(mnt.join("dir/renamed.txt")).unwrap(), b"hello, flash");
    unmount(&mnt);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn kill_9_of_the_daemon_keeps_every_fsynced_file() {
    use std::io::Write;
    if !Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("BITMEND_REQUIRE_FUSE").is_none(), "FUSE required but /dev/fuse is missing");
        return;
    }
    let dir = std::env::temp_dir().join(format!("bitmend-kill-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("fs.img");
    let mnt = dir.join("mnt");
    let (img_s, mnt_s) = (img.to_str().unwrap(), mnt.to_str().unwrap());
    assert!(bitmend(&["mkfs", img_s, "--size", "16MiB"]).status.success());
    let out = bitmend(&["mount", img_s, mnt_s]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let pid: u32 = said
        .split("(pid ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .expect("pid");
    // Files written and fsynced; then more written without fsync; then the daemon dies.
    let mut synced = Vec::new();
    for i in 0..20u32 {
        let body: Vec<u8> = (0..(3000 + i * 700)).map(|b| (b * 7 + i) as u8).collect();
        let mut f = std::fs::File::create(mnt.join(format!("synced{i}"))).unwrap();
        f.write_all(&body).unwrap();
        f.sync_all().unwrap();
        synced.push(body);
    }
    for i in 0..20u32 {
        std::fs::write(mnt.join(format!("unsynced{i}")), vec![i as u8; 5000]).unwrap();
    }
    let s = Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    assert!(s.success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    let out = bitmend(&["fsck", img_s, "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"clean\": true"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(bitmend(&["mount", img_s, mnt_s]).status.success());
    for (i, body) in synced.iter().enumerate() {
        assert_eq!(&std::fs::read(mnt.join(format!("synced{i}"))).unwrap(), body, "fsynced file {i}");
    }
    unmount(&mnt);
    std::fs::remove_dir_all(&dir).unwrap();
}
