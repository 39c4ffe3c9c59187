//! What the mount tests share: running the binary, the FUSE check, the daemon's pid.

#![allow(dead_code)] // each test file uses its own part

pub mod workload;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn bitmend(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitmend")).args(args).output().expect("runs")
}

/// Whether FUSE can be used here; where CI says it must be, its absence fails the test.
pub fn fuse_available() -> bool {
    if Path::new("/dev/fuse").exists() {
        return true;
    }
    assert!(std::env::var_os("BITMEND_REQUIRE_FUSE").is_none(), "FUSE required but /dev/fuse is missing");
    eprintln!("no /dev/fuse: skipped");
    false
}

/// A fresh directory for one test, with the image and mountpoint paths in it.
pub fn scratch(name: &str) -> (PathBuf, String, String) {
    let dir = std::env::temp_dir().join(format!("bitmend-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("fs.img").to_str().unwrap().to_string();
    let mnt = dir.join("mnt").to_str().unwrap().to_string();
    (dir, img, mnt)
}

/// Mounts with `extra` options; returns the daemon's pid (from what `mount` prints).
pub fn mount(img: &str, mnt: &str, extra: &[&str]) -> u32 {
    let mut args = vec!["mount", img, mnt];
    args.extend_from_slice(extra);
    let out = bitmend(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    said.split("(pid ").nth(1).and_then(|s| s.split(',').next()).and_then(|s| s.parse().ok()).expect("pid")
}

/// Kills the daemon as a crash would, and clears the dead mount.
pub fn kill_9(pid: u32, mnt: &str) {
    let s = Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    assert!(s.success());
    clear_dead_mount(pid, mnt);
}

/// Waits for the killed daemon `pid` to be gone and clears its mount (which fails while a
/// file on it is still open).
pub fn clear_dead_mount(pid: u32, mnt: &str) {
    // The kernel lets go of the image once the daemon is gone; the mount stays until cleared.
    // Every thread, not the first alone: it can be a zombie while another still tears the
    // mappings down, holding the image's lock.
    let t = std::time::Instant::now();
    let alive = || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
        tasks.into_iter().any(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            !stat.is_empty() && !stat.contains(") Z ") && !stat.contains(") X ")
        })
    };
    while alive() && t.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = Command::new("fusermount3").arg("-u").arg(mnt).status();
}

/// `bitmend umount`, which returns once the image is free.
pub fn umount(mnt: &str) {
    let out = bitmend(&["umount", mnt]);
    assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
}

/// fsck of the unmounted image must say clean.
pub fn fsck_clean(img: &str, when: &str) {
    let out = bitmend(&["fsck", img, "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("\"clean\": true"),
        "{when}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `len` pseudo-random bytes from `seed`: file contents that do not compress (the code
/// crate's xorshift64 pattern, its seed spread first so that nearby seeds differ at once).
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    bitmend_code::testdata::pattern(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), len)
}
