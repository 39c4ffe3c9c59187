//! `bitmend media` and `bitmend inject` on real image files: the damage the command reports is
//! the damage in the image, and bad input gets a clear error and a failing exit code.

use std::process::{Command, Output};

use bitmend_media::nand::{FileNand, Nand, RawAccess};

fn bitmend(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitmend")).args(args).output().expect("runs")
}

fn temp_path(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("bitmend-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p.display().to_string()
}

fn create(path: &str) {
    let out = bitmend(&[
        "media", "create", path, "--size", "256KiB", "--page", "512", "--spare", "16", "--block", "4KiB",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn raw_page(path: &str, page: u32) -> Vec<u8> {
    let mut n = FileNand::open(path).unwrap();
    let mut r = vec![0; n.geometry().raw_page_size()];
    n.raw_read(page, &mut r).unwrap();
    r
}

#[test]
fn inject_flip_reports_exactly_the_bits_it_flipped() {
    let path = temp_path("flip.img");
    create(&path);
    {
        let mut n = FileNand::open(&path).unwrap();
        assert_eq!(n.geometry().blocks, 64);
        let d: Vec<u8> = (0..512).map(|i| i as u8).collect();
        n.program(17, &d, &[0x11; 16]).unwrap();
    }
    let before = raw_page(&path, 17);
    let out = bitmend(&["inject", &path, "flip", "--page", "17", "--bits", "40", "--seed", "9", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8(out.stdout).unwrap();
    assert!(line.contains("\"fault\": \"bit-flips\"") && line.contains("\"page\": 17"), "{line}");
    let list = &line[line.find("\"bits\": [").unwrap() + 9..line.rfind(']').unwrap()];
    let mut reported: Vec<u32> = list.split(", ").map(|b| b.parse().unwrap()).collect();
    reported.sort();
    let after = raw_page(&path, 17);
    let mut actual = Vec::new();
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        for bit in 0..8 {
            if (a ^ b) >> bit & 1 == 1 {
                actual.push(i as u32 * 8 + bit);
            }
        }
    }
    assert_eq!(actual.len(), 40);
    assert_eq!(reported, actual);

    // Without --page, a random programmed page is chosen (page 17 is the only one).
    let out = bitmend(&["inject", &path, "lose", "--seed", "3"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("page 17 (block 2) replaced with garbage"));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn inject_bad_then_info_lists_it() {
    let path = temp_path("bad.img");
    create(&path);
    assert!(bitmend(&["inject", &path, "bad", "--block", "5"]).status.success());
    let out = bitmend(&["media", "info", &path, "--json"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("\"bad_blocks\": [5]"), "{text}");
    assert!(text.contains("\"blocks\": 64"), "{text}");
    let out = bitmend(&["media", "info", &path]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("bad blocks    1 (5)"), "{text}");
    assert!(FileNand::open(&path).unwrap().is_bad(5).unwrap());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn clear_errors_for_missing_files_non_images_and_bad_arguments() {
    // Each with its exit code: 3 the target cannot be used, 2 a bad value.
    let cases: Vec<(Vec<String>, &str, i32)> = vec![
        (vec!["media".into(), "info".into(), temp_path("absent.img")], "No such file", 3),
        (vec!["media".into(), "info".into(), "/proc/self/status".into()], "not a bitmend NAND image", 3),
        (
            vec!["media".into(), "create".into(), temp_path("odd.img"), "--size".into(), "1000".into()],
            "whole number",
            2,
        ),
        (
            vec!["media".into(), "create".into(), temp_path("odd2.img"), "--page".into(), "3KiB".into()],
            "power of two",
            2,
        ),
    ];
    for (args, want, code) in cases {
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let out = bitmend(&a);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let empty = temp_path("empty.img");
    create(&empty);
    let out = bitmend(&["inject", &empty, "flip"]);
    assert_eq!(out.status.code(), Some(3), "nothing to damage in the image");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no programmed page"));
    let out = bitmend(&["inject", &empty, "bad", "--block", "64"]);
    assert_eq!(out.status.code(), Some(2), "a block past the chip is a bad value");
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    std::fs::remove_file(&empty).unwrap();
}

#[test]
fn the_demo_corrects_every_fault_it_injects() {
    let out = bitmend(&["demo", "--seed", "7"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("flipped bits in page"), "{text}");
    assert!(text.contains("replaced with garbage"), "{text}");
    assert!(text.contains("power cut"), "{text}");
    assert!(text.contains("verified every byte of the 180 files"), "{text}");
    assert!(text.contains("every fault corrected, nothing lost"), "{text}");
    // Memory errors in the cache: the clean one caught and read again, the dirty one refused.
    assert!(text.contains("8. memory errors: a bit flipped in a cached clean page was caught"), "{text}");
    // The heap part: three damaged pages in different stripes, found, rebuilt, every key back.
    assert!(text.contains("11. check: 3 damaged pages found, 3 rebuildable"), "{text}");
    assert!(text.contains("all 5000 keys read back; every damaged page rebuilt"), "{text}");
}

#[test]
fn mkfs_records_the_compression_and_stat_reports_it() {
    for codec in ["zstd", "none", "lz4"] {
        let img = temp_path(&format!("codec-{codec}.img"));
        let out = bitmend(&["mkfs", &img, "--size", "16MiB", "--compress", codec]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let out = bitmend(&["stat", &img, "--json"]);
        let json = String::from_utf8_lossy(&out.stdout);
        assert!(json.contains(&format!("\"compression\": \"{codec}\"")), "{json}");
    }
    let out = bitmend(&["mkfs", &temp_path("codec-bad.img"), "--compress", "gzip"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("gzip"));
}

#[test]
fn stat_says_a_version_2_image_was_scanned_once_then_followed_by_its_anchor() {
    let img = temp_path("v2-upgrade.img");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../flashfs/tests/golden/fs-v2.img"), &img).unwrap();
    let mut methods = Vec::new();
    let mut chunks = Vec::new();
    for _ in 0..2 {
        let out = bitmend(&["stat", &img, "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json = String::from_utf8_lossy(&out.stdout).to_string();
        // Version 2 listed every page in its checkpoint; the upgrade wrote the files' index
        // as map nodes, found again by the second mount.
        let n = json.split("\"index_chunks\": ").nth(1).and_then(|r| r.split(',').next()).unwrap_or("");
        chunks.push(n.parse::<u64>().unwrap_or_else(|_| panic!("{json}")));
        methods.push(if json.contains("\"mounted_by\": \"scan\"") {
            "scan"
        } else if json.contains("\"mounted_by\": \"anchor\"") {
            "anchor"
        } else {
            panic!("{json}")
        });
    }
    assert_eq!(methods, ["scan", "anchor"]);
    assert!(chunks[0] >= 3 && chunks[0] == chunks[1], "index chunks {chunks:?}");
    let text = String::from_utf8_lossy(&bitmend(&["stat", &img]).stdout).to_string();
    assert!(text.contains("by the anchor log and a chain of 1 segment"), "{text}");
}

/// An image larger than the host's free space is refused before anything is written (it
/// used to fill the host disk and leave a half-written image behind); sizes take TiB.
#[test]
fn mkfs_refuses_an_image_the_host_has_no_room_for() {
    let img = temp_path("huge.img");
    let _ = std::fs::remove_file(&img);
    let df = Command::new("df").args(["-B1", "--output=avail"]).arg(std::env::temp_dir()).output().unwrap();
    let free: u64 =
        String::from_utf8_lossy(&df.stdout).lines().nth(1).and_then(|l| l.trim().parse().ok()).unwrap();
    if free > 7 << 40 {
        eprintln!("the host has 7 TiB free: nothing to refuse, skipped");
        return;
    }
    let out = bitmend(&["mkfs", &img, "--size", "7TiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the image needs 7") && err.contains("GiB free"), "{err}");
    assert!(!std::path::Path::new(&img).exists(), "the refused image was left behind");
    // Thin, a 64 GiB image is made at once on any host, and mounts as a file system.
    let out = bitmend(&["mkfs", &img, "--size", "64GiB", "--thin"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = bitmend(&["stat", &img, "--json"]);
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && json.contains("\"mount_ram_bytes\": "), "{json}");
    std::fs::remove_file(&img).unwrap();
}

/// The exit codes `bitmend --help` lists, each from the failure it names: 2 a bad value, 3 a
/// target that is not a bitmend image, 4 problems fsck could not repair, 0 a clean check.
#[test]
fn exit_codes_tell_a_bad_value_a_wrong_target_and_damage_apart() {
    let img = temp_path("codes.img");
    let out = bitmend(&["demo", "--image", &img]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(bitmend(&["fsck", &img]).status.code(), Some(0));

    let mnt = temp_path("codes-mnt");
    let out = bitmend(&["mount", &img, &mnt, "--scrub-every", "5x"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("5x"));

    for target in ["/proc/self/status".to_string(), temp_path("absent.img")] {
        let out = bitmend(&["fsck", &target]);
        assert_eq!(out.status.code(), Some(3), "{target}: {}", String::from_utf8_lossy(&out.stderr));
    }

    // 40 pages with 2000 flipped bits each (seed 7): more than parity repairs in some group.
    let out = bitmend(&["inject", &img, "flip", "--pages", "40", "--bits", "2000", "--seed", "7"]);
    assert!(out.status.success());
    let out = bitmend(&["fsck", &img]);
    assert_eq!(out.status.code(), Some(4), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOT clean"));
    std::fs::remove_file(&img).unwrap();
}
