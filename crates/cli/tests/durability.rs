//! What `sync`, `fsync` and the commit interval guarantee, through the mount: the daemon is
//! killed with `kill -9` (as a crash would stop it) and everything it acknowledged as
//! durable must be there after a remount, every byte.

mod common;

use common::*;

/// A tree of files of different sizes and contents, written without fsync.
fn write_tree(mnt: &str, round: u32) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    std::fs::create_dir_all(format!("{mnt}/d{round}")).unwrap();
    for i in 0..24u32 {
        let len = (i as usize * 9_173 + round as usize * 311) % 200_000;
        let body: Vec<u8> =
            (0..len).map(|b| ((b as u32).wrapping_mul(2_654_435_761 + i) >> 11) as u8).collect();
        let name = format!("{mnt}/d{round}/f{i}");
        std::fs::write(&name, &body).unwrap();
        files.push((name, body));
    }
    // A rename and a removal: metadata must be committed too.
    std::fs::rename(format!("{mnt}/d{round}/f0"), format!("{mnt}/d{round}/renamed")).unwrap();
    files[0].0 = format!("{mnt}/d{round}/renamed");
    std::fs::remove_file(&files[1].0).unwrap();
    files.remove(1);
    files
}

fn check_tree(files: &[(String, Vec<u8>)], round: u32, mnt: &str, when: &str) {
    for (name, body) in files {
        let got = std::fs::read(name).unwrap_or_else(|e| panic!("{when}: {name}: {e}"));
        assert!(&got == body, "{when}: {name}: {} bytes read, {} written", got.len(), body.len());
    }
    assert!(!std::path::Path::new(&format!("{mnt}/d{round}/f0")).exists(), "{when}: renamed away");
    assert!(!std::path::Path::new(&format!("{mnt}/d{round}/f1")).exists(), "{when}: removed");
}

#[test]
fn every_change_is_committed_within_the_commit_interval() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("interval");
    assert!(bitmend(&["mkfs", &img, "--size", "16MiB"]).status.success());
    // Two rounds of: write without any sync, wait past the interval, kill -9, remount.
    let mut kept: Vec<Vec<(String, Vec<u8>)>> = Vec::new();
    for round in 0..2u32 {
        let pid = mount(&img, &mnt, &["--commit-interval", "1s"]);
        for (r, files) in kept.iter().enumerate() {
            check_tree(files, r as u32, &mnt, &format!("round {round}, before writing"));
        }
        let files = write_tree(&mnt, round);
        std::thread::sleep(std::time::Duration::from_millis(2_500));
        kill_9(pid, &mnt);
        fsck_clean(&img, &format!("round {round}, after kill -9"));
        kept.push(files);
    }
    mount(&img, &mnt, &[]);
    for (r, files) in kept.iter().enumerate() {
        check_tree(files, r as u32, &mnt, "after the last kill -9");
    }
    umount(&mnt);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bitmend_sync_makes_everything_durable() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("sync");
    assert!(bitmend(&["mkfs", &img, "--size", "16MiB"]).status.success());
    // No commit interval: only the sync can have made the tree durable.
    let pid = mount(&img, &mnt, &["--commit-interval", "0"]);
    let files = write_tree(&mnt, 0);
    let out = bitmend(&["sync", &mnt]);
    assert!(out.status.success(), "sync: {}", String::from_utf8_lossy(&out.stderr));
    kill_9(pid, &mnt);
    fsck_clean(&img, "after sync and kill -9");
    mount(&img, &mnt, &[]);
    check_tree(&files, 0, &mnt, "after sync and kill -9");
    // What sync refuses: a path that is not a bitmend mount.
    let out = bitmend(&["sync", dir.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not a mountpoint"));
    umount(&mnt);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_image_is_free_once_umount_returns() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("umount");
    assert!(bitmend(&["mkfs", &img, "--size", "16MiB"]).status.success());
    for round in 0..4u32 {
        mount(&img, &mnt, &[]);
        let files = write_tree(&mnt, round);
        umount(&mnt);
        // Right after: no retry, no sleep.
        fsck_clean(&img, &format!("round {round}, right after umount"));
        mount(&img, &mnt, &[]);
        check_tree(&files, round, &mnt, &format!("round {round}, after remount"));
        umount(&mnt);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
