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
    // The mount's readahead is one full request, not FUSE's 128 KiB (root sets it).
    // SAFETY: geteuid reads the process's credentials; it cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(&mnt).unwrap().dev();
        let knob = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
        assert_eq!(std::fs::read_to_string(&knob).unwrap().trim(), "1024", "{knob}");
    }

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
    // Commands that need the image unmounted say where it is mounted.
    let out = bitmend(&["fsck", img_s]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("mounted at") && said.contains("mnt"), "{said}");
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

#[test]
fn several_processes_at_once_then_unmount_and_remount() {
    if !Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("BITMEND_REQUIRE_FUSE").is_none(), "FUSE required but /dev/fuse is missing");
        return;
    }
    let dir = std::env::temp_dir().join(format!("bitmend-load-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("fs.img");
    let mnt = dir.join("mnt");
    let (img_s, mnt_s) = (img.to_str().unwrap(), mnt.to_str().unwrap());
    assert!(bitmend(&["mkfs", img_s, "--size", "32MiB"]).status.success());
    assert!(bitmend(&["mount", img_s, mnt_s]).status.success());

    // Four source trees outside the mount, each copied in by its own `cp` process, while two
    // shell processes create, append to, rename and delete files, and one reads a big file.
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    for p in 0..4u32 {
        let src = dir.join(format!("src{p}"));
        std::fs::create_dir_all(src.join("sub")).unwrap();
        for i in 0..30u32 {
            let body: Vec<u8> =
                (0..(1000 + i * 911 + p * 17)).map(|b| (b.wrapping_mul(31) ^ i ^ (p << 5)) as u8).collect();
            let rel = if i % 3 == 0 { format!("sub/f{i}") } else { format!("f{i}") };
            std::fs::write(src.join(&rel), &body).unwrap();
            expected.push((format!("tree{p}/{rel}"), body));
        }
    }
    let big: Vec<u8> = (0..2_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    std::fs::write(mnt.join("big.bin"), &big).unwrap();
    let mut children = Vec::new();
    for p in 0..4 {
        let src = dir.join(format!("src{p}"));
        children
            .push(Command::new("cp").arg("-r").arg(&src).arg(mnt.join(format!("tree{p}"))).spawn().unwrap());
    }
    for s in 0..2 {
        let script = format!(
            "cd '{mnt_s}' && mkdir shell{s} && for i in $(seq 1 60); do \
             printf 'line %s of %s\\n' $i {s} >> shell{s}/log; \
             printf 'tmp %s' $i > shell{s}/t$i; mv shell{s}/t$i shell{s}/kept$i; \
             if [ $((i % 2)) -eq 0 ]; then rm shell{s}/kept$i; fi; done"
        );
        children.push(Command::new("sh").arg("-c").arg(script).spawn().unwrap());
    }
    let reader = {
        let path = mnt.join("big.bin");
        let big = big.clone();
        std::thread::spawn(move || {
            for _ in 0..5 {
                assert!(std::fs::read(&path).unwrap() == big, "big.bin read under load differs");
            }
        })
    };
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    reader.join().unwrap();

    let shell_files = |s: u32| -> Vec<(String, Vec<u8>)> {
        let mut v = Vec::new();
        let log: String = (1..=60).map(|i| format!("line {i} of {s}\n")).collect();
        v.push((format!("shell{s}/log"), log.into_bytes()));
        for i in (1..=60).filter(|i| i % 2 == 1) {
            v.push((format!("shell{s}/kept{i}"), format!("tmp {i}").into_bytes()));
        }
        v
    };
    expected.extend(shell_files(0));
    expected.extend(shell_files(1));
    expected.push(("big.bin".into(), big));
    let check = |when: &str| {
        for (rel, body) in &expected {
            assert!(&std::fs::read(mnt.join(rel)).unwrap() == body, "{rel} differs {when}");
        }
        for s in 0..2 {
            let n = std::fs::read_dir(mnt.join(format!("shell{s}"))).unwrap().count();
            assert_eq!(n, 31, "shell{s} holds the log and 30 kept files {when}");
        }
    };
    check("before unmount");
    unmount(&mnt);
    let out = bitmend(&["fsck", img_s, "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("\"clean\": true"), "{text}");
    assert!(bitmend(&["mount", img_s, mnt_s]).status.success());
    check("after remount");
    unmount(&mnt);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--lz4-write-level` and `--node-pages` reach the daemon: the same text written at level 12
/// takes less flash than at level 0 (the fast compressor, the default), and in nodes of 4
/// pages (the default) less than a page per node; it reads back the same every way.
#[test]
fn the_lz4_level_reaches_the_mount() {
    if !Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("BITMEND_REQUIRE_FUSE").is_none(), "FUSE required but /dev/fuse is missing");
        eprintln!("no /dev/fuse: skipped");
        return;
    }
    let dir = std::env::temp_dir().join(format!("bitmend-lz4-level-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Text from a small vocabulary in a pseudo-random order: the levels find different matches.
    let words = ["def ", "self", ".value", " = ", "return ", "import ", "(x, y)", "\n    ", "None", "if "];
    let mut x = 12345u64;
    let mut text = Vec::new();
    while text.len() < 400_000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        text.extend_from_slice(words[(x >> 33) as usize % words.len()].as_bytes());
    }
    let mut stored = Vec::new();
    let runs: [&[&str]; 4] =
        [&["--lz4-write-level", "0"], &["--lz4-write-level", "12"], &["--node-pages", "1"], &[]];
    for (run, args) in runs.iter().enumerate() {
        let img = dir.join(format!("fs{run}.img"));
        let mnt = dir.join(format!("mnt{run}"));
        let (img_s, mnt_s) = (img.to_str().unwrap(), mnt.to_str().unwrap());
        assert!(bitmend(&["mkfs", img_s, "--size", "16MiB"]).status.success());
        let out = bitmend(&[&["mount", img_s, mnt_s][..], args].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::write(mnt.join("text.py"), &text).unwrap();
        assert_eq!(std::fs::read(mnt.join("text.py")).unwrap(), text, "{args:?}");
        let s = Command::new("fusermount3").arg("-u").arg(&mnt).status().expect("fusermount3 runs");
        assert!(s.success());
        let t = std::time::Instant::now();
        let json = loop {
            let out = bitmend(&["stat", img_s, "--json"]);
            if out.status.success() {
                break String::from_utf8(out.stdout).unwrap();
            }
            assert!(t.elapsed().as_secs() < 20, "the daemon did not let go of the image");
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let at = json.find("\"stored_bytes\": ").expect("stored_bytes") + 16;
        stored.push(json[at..].split([',', '}']).next().unwrap().trim().parse::<u64>().unwrap());
    }
    assert!(stored[1] < stored[0], "level 12 stored {} bytes, level 0 {}", stored[1], stored[0]);
    assert!(stored[3] < stored[2], "4 pages per node stored {} bytes, 1 page {}", stored[3], stored[2]);
    assert!(!bitmend(&["mount", "x.img", "/tmp/nowhere", "--lz4-level", "13"]).status.success());
    assert!(!bitmend(&["mount", "x.img", "/tmp/nowhere", "--lz4-write-level", "13"]).status.success());
    assert!(!bitmend(&["mount", "x.img", "/tmp/nowhere", "--node-pages", "17"]).status.success());
    assert!(!bitmend(&["mount", "x.img", "/tmp/nowhere", "--node-pages", "0"]).status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}
