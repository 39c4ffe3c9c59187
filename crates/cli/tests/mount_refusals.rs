//! `bitmend mount` reports only a mount it made: a mountpoint already in use, an image in
//! use, a file that is not an image, each refused with exit status 3 and nothing mounted or
//! unmounted; a mountpoint left dead by a killed daemon is cleared and mounted again. And
//! the edges of the other commands' exit statuses: mkfs over an existing file (3), a
//! closed stdout (the command ends as any Unix tool, never a panic).

mod common;

use std::process::Command;

use common::{bitmend, fuse_available, mount, scratch, umount};

fn code(out: &std::process::Output) -> Option<i32> {
    out.status.code()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn a_mount_that_did_not_happen_is_never_reported() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("refusals");
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let junk = dir.join("junk.img").to_str().unwrap().to_string();
    std::fs::write(&junk, bitmend_code::testdata::pattern(7, 1 << 20)).unwrap();
    let nvram = dir.join("tier").to_str().unwrap().to_string();
    let pid = mount(&img, &mnt, &["--nvram", &nvram, "--nvram-size", "8M"]);
    std::fs::write(format!("{mnt}/kept"), b"the first mount's").unwrap();

    // Another image on the same mountpoint: refused before anything starts.
    let out = bitmend(&["mount", &junk, &mnt, "--nvram", "none"]);
    assert_eq!(code(&out), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("already a mount point"), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "said: {}", String::from_utf8_lossy(&out.stdout));
    // The same image again, on its own mountpoint, and elsewhere.
    let out = bitmend(&["mount", &img, &mnt, "--nvram", &nvram, "--nvram-size", "8M"]);
    assert_eq!(code(&out), Some(3), "{}", stderr(&out));
    let elsewhere = dir.join("m2").to_str().unwrap().to_string();
    let out = bitmend(&["mount", &img, &elsewhere, "--nvram", "none"]);
    assert_eq!(code(&out), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("mounted at"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    // Not an image, on a free mountpoint: the daemon's refusal and status, nothing mounted.
    let out = bitmend(&["mount", &junk, &elsewhere, "--nvram", "none"]);
    assert_eq!(code(&out), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("not a bitmend NAND image"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!table.contains(&elsewhere), "{elsewhere} was mounted");
    // The first mount is untouched.
    assert_eq!(std::fs::read(format!("{mnt}/kept")).unwrap(), b"the first mount's");

    // A closed stdout: no panic (exit 101), whether the write came before the close or not.
    let script =
        format!("'{}' stat '{mnt}' --json | true; echo ${{PIPESTATUS[0]}}", env!("CARGO_BIN_EXE_bitmend"));
    let out = Command::new("bash").arg("-c").arg(&script).output().unwrap();
    let status = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(status == "0" || status == "141", "exit {status}: {}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));

    // A daemon killed: its dead mountpoint is cleared by the next mount, which serves.
    let s = Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    assert!(s.success());
    wait_gone(pid);
    let out = bitmend(&["mount", &img, &mnt, "--nvram", &nvram, "--nvram-size", "8M"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("unmounted the dead mount"), "{}", stderr(&out));
    assert_eq!(std::fs::read(format!("{mnt}/kept")).unwrap(), b"the first mount's");
    umount(&mnt);

    // mkfs over an existing file: refused, 3, the file as it was.
    let before = std::fs::read(&junk).unwrap();
    let out = bitmend(&["mkfs", &junk, "--size", "8MiB"]);
    assert_eq!(code(&out), Some(3), "{}", stderr(&out));
    assert_eq!(std::fs::read(&junk).unwrap(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits for the killed daemon `pid` to be gone (its mount left behind, dead).
fn wait_gone(pid: u32) {
    let t = std::time::Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}/task")).exists() && t.elapsed().as_secs() < 10 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z ") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The image's lock goes with the last of its threads.
    std::thread::sleep(std::time::Duration::from_millis(200));
}
