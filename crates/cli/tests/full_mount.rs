//! A full chip through the FUSE mount: `cp`-like writes until ENOSPC, every acknowledged
//! byte read back (and after a remount), every refusal an ENOSPC; then `rm`, truncation and
//! rename work on the full chip, everything is deleted and the chip filled again with small
//! files, with a clean fsck at each step.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

fn bitmend(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitmend")).args(args).output().expect("runs")
}

/// Unmounts and waits until the daemon has let go of the image (fsck runs clean).
fn unmount_and_check(mnt: &Path, img: &str, when: &str) {
    let s = Command::new("fusermount3").arg("-u").arg(mnt).status().expect("fusermount3 runs");
    assert!(s.success());
    let t = std::time::Instant::now();
    loop {
        let out = bitmend(&["fsck", img, "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() {
            assert!(text.contains("\"clean\": true"), "{when}: {text}");
            return;
        }
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(said.contains("in use") || said.contains("mounted"), "{when}: {said}");
        assert!(t.elapsed().as_secs() < 30, "{when}: the daemon did not let go of the image");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Writes `body` into a new file in 128 KiB writes, then fsyncs; returns the bytes
/// acknowledged (all of them unless a write was refused, which must be ENOSPC).
fn write_until_full(path: &Path, body: &[u8]) -> Option<usize> {
    let mut f = match std::fs::File::create(path) {
        Ok(f) => f,
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc_enospc()), "create {}: {e}", path.display());
            return None;
        }
    };
    let mut kept = 0;
    for chunk in body.chunks(128 << 10) {
        match f.write(chunk) {
            Ok(n) => kept += n,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc_enospc()), "write {}: {e}", path.display());
                break;
            }
        }
        if kept % (128 << 10) != 0 {
            break;
        }
    }
    f.sync_all().unwrap_or_else(|e| panic!("fsync {} with {kept} bytes acknowledged: {e}", path.display()));
    Some(kept)
}

/// Files `{prefix}{i}` of `len` random bytes until one is refused: what each acknowledged.
fn fill(mnt: &Path, prefix: &str, seed: u64, len: usize) -> Vec<(String, Vec<u8>)> {
    let mut stored = Vec::new();
    for i in 0.. {
        let body = common::noise(seed + i, len);
        let name = format!("{prefix}{i}");
        let Some(kept) = write_until_full(&mnt.join(&name), &body) else { break };
        stored.push((name, body[..kept].to_vec()));
        if kept < body.len() {
            break;
        }
    }
    stored
}

fn libc_enospc() -> i32 {
    28
}

#[test]
fn a_full_chip_through_the_mount() {
    if !Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("BITMEND_REQUIRE_FUSE").is_none(), "FUSE required but /dev/fuse is missing");
        eprintln!("no /dev/fuse: skipped");
        return;
    }
    let dir = std::env::temp_dir().join(format!("bitmend-full-mount-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("fs.img");
    let mnt = dir.join("mnt");
    let (img_s, mnt_s) = (img.to_str().unwrap(), mnt.to_str().unwrap());
    assert!(bitmend(&["mkfs", img_s, "--size", "32MiB"]).status.success());
    assert!(bitmend(&["mount", img_s, mnt_s]).status.success());

    // Big files of random data until one is refused.
    let mut stored = fill(&mnt, "big", 0, 4 << 20);
    assert!(stored.len() >= 3, "{} files", stored.len());
    let check = |stored: &[(String, Vec<u8>)], when: &str| {
        for (name, body) in stored {
            assert!(std::fs::read(mnt.join(name)).unwrap() == *body, "{name} differs {when}");
        }
    };
    check(&stored, "when full");
    // A full chip still truncates, renames and removes.
    std::fs::File::create(mnt.join(&stored[0].0)).unwrap();
    stored[0].1.clear();
    std::fs::rename(mnt.join(&stored[1].0), mnt.join("renamed")).unwrap();
    stored[1].0 = "renamed".into();
    unmount_and_check(&mnt, img_s, "full");
    assert!(bitmend(&["mount", img_s, mnt_s]).status.success());
    check(&stored, "after remount");
    for (name, _) in &stored {
        std::fs::remove_file(mnt.join(name)).unwrap();
    }
    // Small files until full, then all read back.
    let small = fill(&mnt, "s", 1000, 4096);
    assert!(small.len() > 1000, "{} small files", small.len());
    check(&small, "small files, full");
    unmount_and_check(&mnt, img_s, "full of small files");
    assert!(bitmend(&["mount", img_s, mnt_s]).status.success());
    check(&small, "small files, remounted");
    unmount_and_check(&mnt, img_s, "end");
    eprintln!(
        "full through the mount: {} big files, then {} small files, each fill refused with ENOSPC, every acknowledged byte read back, fsck clean",
        stored.len(),
        small.len()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `mkfs --force` refuses an image that is mounted, as every other command does: replacing it
/// would destroy the live file system, fsync'd data included.
#[test]
fn mkfs_force_refuses_a_mounted_image() {
    if !common::fuse_available() {
        return;
    }
    let (dir, img, mnt_s) = common::scratch("mkfs-force");
    let (img_s, mnt_s) = (img.as_str(), mnt_s.as_str());
    let mnt = Path::new(mnt_s);
    assert!(bitmend(&["mkfs", img_s, "--size", "16MiB"]).status.success());
    assert!(bitmend(&["mount", img_s, mnt_s]).status.success());
    let mut f = std::fs::File::create(mnt.join("kept")).unwrap();
    f.write_all(b"fsync'd before the mkfs").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let out = bitmend(&["mkfs", img_s, "--size", "16MiB", "--force"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("mounted at"), "{said}");
    assert_eq!(std::fs::read(mnt.join("kept")).unwrap(), b"fsync'd before the mkfs");
    unmount_and_check(mnt, img_s, "after the refused mkfs");
    // Unmounted, --force replaces it.
    assert!(bitmend(&["mkfs", img_s, "--size", "16MiB", "--force"]).status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}
