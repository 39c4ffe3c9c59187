//! Scrubbing a mounted file system: bit flips injected into an unmounted image are found and
//! repaired by a pass requested through `bitmend scrub MOUNTPOINT` while the file system is
//! mounted, every byte reads back, the lifetime counters reach `bitmend stat`, the control file
//! cannot be removed or misused, and scheduled passes run by themselves. The quick pass
//! (`--quick`, spares only) answers the same on the image and through the daemon.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn bitmend(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitmend")).args(args).output().expect("runs")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn unmount(img: &Path, mnt: &Path) {
    let s = Command::new("fusermount3").arg("-u").arg(mnt).status().expect("fusermount3 runs");
    assert!(s.success());
    // The daemon writes everything out after the kernel lets go; wait until it lets go of the image.
    let t = Instant::now();
    while bitmend(&["stat", img.to_str().unwrap()]).status.code() != Some(0) {
        assert!(t.elapsed() < Duration::from_secs(20), "the daemon did not let go of the image");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn number(json: &str, key: &str) -> u64 {
    let at =
        json.find(&format!("\"{key}\": ")).unwrap_or_else(|| panic!("no {key} in {json}")) + key.len() + 4;
    json[at..].split([',', '}']).next().unwrap().trim().parse().unwrap()
}

fn fuse() -> bool {
    if !Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("BITMEND_REQUIRE_FUSE").is_none(), "FUSE required but /dev/fuse is missing");
        eprintln!("no /dev/fuse: skipped");
        return false;
    }
    true
}

fn workdir(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("bitmend-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (dir.join("fs.img"), dir.join("mnt"), dir)
}

#[test]
fn a_pass_on_a_mounted_file_system_repairs_injected_bit_flips() {
    if !fuse() {
        return;
    }
    let (img, mnt, dir) = workdir("scrub-mounted");
    let (i, m) = (img.to_str().unwrap(), mnt.to_str().unwrap());
    ok(bitmend(&["mkfs", i, "--size", "16MiB"]));
    ok(bitmend(&["mount", i, m, "--scrub-every", "0"]));
    // Bytes that do not compress: the damaged pages below must hold file data whatever the
    // compressor's level.
    let files: Vec<Vec<u8>> = (0..5u64)
        .map(|f| {
            // splitmix64's finalizer: a bare Weyl sequence repeats enough for lz4 over 16 KiB.
            (0..200_000u64)
                .map(|b| {
                    let mut z = (b + f * 1_000_003).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                    (z ^ (z >> 31)) as u8
                })
                .collect()
        })
        .collect();
    for (k, data) in files.iter().enumerate() {
        std::fs::write(mnt.join(format!("f{k}")), data).unwrap();
    }
    unmount(&img, &mnt);

    // One page in each of three blocks (64 pages each, data from block 2 on): never two in a
    // group, so that parity can always repair them.
    let damaged = [2 * 64 + 3, 3 * 64 + 10, 5 * 64 + 20];
    for page in damaged {
        ok(bitmend(&["inject", i, "flip", "--page", &page.to_string(), "--bits", "30", "--area", "data"]));
    }
    // The quick pass reads spares only: flips inside data areas are the full pass's to find,
    // and the parity agrees with the signatures the spares hold.
    let quick_image = ok(bitmend(&["scrub", i, "--quick", "--json"]));
    assert!(number(&quick_image, "groups_checked") >= 3, "{quick_image}");
    assert_eq!(number(&quick_image, "segments_mismatched"), 0, "{quick_image}");
    assert_eq!(number(&quick_image, "groups_mismatched") + number(&quick_image, "stripes_mismatched"), 0);
    // With 2 index chunks in RAM for 5 files: the scrub and the reads go back to the maps.
    ok(bitmend(&["mount", i, m, "--scrub-every", "0", "--index-chunks", "2"]));
    // The same pass through the daemon finds the same (and the groups the mount and the
    // unmount after the image's pass wrote since).
    let quick_mounted = ok(bitmend(&["scrub", m, "--quick", "--json"]));
    assert_eq!(number(&quick_mounted, "segments_checked"), number(&quick_image, "segments_checked"));
    assert!(number(&quick_mounted, "groups_checked") >= number(&quick_image, "groups_checked"));
    assert_eq!(number(&quick_mounted, "segments_mismatched"), 0, "{quick_mounted}");
    let control = mnt.join(".bitmend-scrub");
    let names: Vec<String> =
        std::fs::read_dir(&mnt).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(!names.iter().any(|n| n == ".bitmend-scrub"), "the control file is listed: {names:?}");
    assert!(std::fs::remove_file(&control).is_err(), "the control file was removed");
    assert!(std::fs::write(&control, "bogus").is_err(), "a bad command was accepted");

    let report = ok(bitmend(&["scrub", m, "--json"]));
    let repaired = number(&report, "repaired_by_group") + number(&report, "repaired_by_segment");
    assert_eq!(repaired + number(&report, "parity_damaged"), 3, "{report}");
    assert_eq!(number(&report, "unreadable_pages"), 0, "{report}");
    // The damaged segments were rewritten under fresh parity and erased.
    assert!(number(&report, "segments_healed") >= 1, "{report}");
    assert!(number(&report, "pages_checked") > 200, "{report}");
    for (k, data) in files.iter().enumerate() {
        assert_eq!(&std::fs::read(mnt.join(format!("f{k}"))).unwrap(), data, "f{k} after the scrub");
    }
    unmount(&img, &mnt);

    let stat = ok(bitmend(&["stat", i, "--json"]));
    assert_eq!(number(&stat, "lifetime_scrub_passes"), 1, "{stat}");
    let lifetime =
        number(&stat, "lifetime_repaired_by_group") + number(&stat, "lifetime_repaired_by_segment");
    assert_eq!(lifetime, repaired, "{stat}");
    let fsck = ok(bitmend(&["fsck", i, "--json"]));
    assert!(fsck.contains("\"clean\": true"), "{fsck}");
    eprintln!("mounted scrub: 3 pages with 30 flipped bits each; {report}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn scheduled_passes_run_by_themselves() {
    if !fuse() {
        return;
    }
    let (img, mnt, dir) = workdir("scrub-scheduled");
    let (i, m) = (img.to_str().unwrap(), mnt.to_str().unwrap());
    ok(bitmend(&["mkfs", i, "--size", "16MiB"]));
    ok(bitmend(&["mount", i, m, "--scrub-every", "1s", "--scrub-pause-ms", "1"]));
    std::fs::write(mnt.join("a"), vec![7u8; 100_000]).unwrap();
    let t = Instant::now();
    loop {
        let status = std::fs::read_to_string(mnt.join(".bitmend-scrub")).unwrap();
        if number(&status, "pass") >= 2 {
            assert!(number(&status, "lifetime_scrub_passes") >= 1, "{status}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no scheduled pass: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), vec![7u8; 100_000]);
    unmount(&img, &mnt);
    std::fs::remove_dir_all(&dir).unwrap();
}
