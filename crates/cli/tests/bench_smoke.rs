//! `bitmend bench code --quick --json` runs, and every row carries the agreed fields with a
//! consistent ratio. (A smoke test of the plumbing, not a timing: figures are not asserted.)

#![cfg(feature = "bench")]

use std::process::Command;

fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let key = format!("\"{name}\": ");
    let start = line.find(&key).unwrap_or_else(|| panic!("no {name} in {line}")) + key.len();
    let rest = &line[start..];
    let end = rest.find([',', '}']).expect("field ends");
    rest[..end].trim()
}

#[test]
fn bench_code_quick_json_rows_are_complete() {
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["bench", "code", "--quick", "--json", "--samples", "1"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 20, "only {} rows", lines.len());
    for l in &lines {
        assert!(l.starts_with('{') && l.ends_with('}'), "{l}");
        assert_eq!(field(l, "bench"), "\"code\"");
        let ours: f64 = field(l, "ours").parse().unwrap();
        assert!(ours > 0.0, "{l}");
        let unit = field(l, "unit");
        assert!(unit == "\"GB/s\"" || unit == "\"ns\"", "{l}");
        let (a, r) = (field(l, "anchor_value"), field(l, "ratio"));
        if a != "null" {
            let (a, r): (f64, f64) = (a.parse().unwrap(), r.parse().unwrap());
            let want = if unit == "\"ns\"" { a / ours } else { ours / a };
            assert!((r - want).abs() <= 1e-3 * want.max(1.0), "ratio {r} != {want} in {l}");
        }
    }
    for case in [
        "rs-encode k=10 m=4 64KiB",
        "rs-reconstruct",
        "rs-update 64B m=4",
        "signature 32-bit 4KiB",
        "crc32c 4KiB",
        "combine",
        "crc32c of each 64B line of 4KiB",
    ] {
        assert!(lines.iter().any(|l| l.contains(case)), "no row for {case}");
    }
}

#[test]
fn bad_arguments_fail_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["bench", "code", "--samples", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--samples must be at least 1"));
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend")).args(["bench", "nothing"]).output().unwrap();
    assert!(!out.status.success());
}

#[test]
fn bench_nvlog_quick_json_has_every_contender() {
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["bench", "nvlog", "--quick", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5 * 3 * 3, "5 workloads x m=1,2,4 x 3 anchors");
    for l in &lines {
        assert_eq!(field(l, "bench"), "\"nvlog\"");
        assert_eq!(field(l, "unit"), "\"ns\"");
        let ours: f64 = field(l, "ours").parse().unwrap();
        assert!(ours > 0.0, "{l}");
    }
    for anchor in ["mprotect pair", "pmdk tx", "store+clwb+sfence"] {
        assert!(lines.iter().any(|l| l.contains(anchor)), "no {anchor} row");
    }
    assert!(lines.iter().any(|l| l.contains("append m=4 10..100B vs mprotect")));
}

#[test]
fn bench_heap_quick_json_rows_beside_pmdk_and_the_floor() {
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["bench", "heap", "--quick", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let overwrites = lines.iter().filter(|l| l.contains("tx overwrite") && !l.contains("healing")).count();
    assert_eq!(
        overwrites,
        5 * 6,
        "5 sizes x (data and pointer logging vs pmdk, vs two floors, log bytes of each)"
    );
    // The healing rows: each size at m = 2 against no stripes (both loggings, and the
    // data-logged one's parity floor), ours against that floor, and the cache line counters
    // (lines and fences per tx for three writes).
    let healing = |what: &str| lines.iter().filter(|l| l.contains("healing") && l.contains(what)).count();
    assert_eq!(healing("vs no stripes"), 5 * 3);
    let floors: Vec<&&str> =
        lines.iter().filter(|l| l.contains("parity stores alone) vs no stripes")).collect();
    assert_eq!(floors.len(), 5, "each data-logged size's parity floor");
    for l in floors {
        // The floor is the transaction with no stripes plus the parity stores: never below it.
        let (floor, none): (f64, f64) =
            (field(l, "ours").parse().unwrap(), field(l, "anchor_value").parse().unwrap());
        assert!(floor > none, "{l}");
    }
    assert_eq!(healing("(data logging), healing k 8 m 2 vs its floor"), 5);
    assert_eq!(healing("per tx, counters"), 3 * 2);
    for m in [1, 2, 4] {
        let case = format!("inserts, healing k 8 m {m} vs");
        assert_eq!(
            lines.iter().filter(|l| l.contains(&case)).count(),
            2,
            "B+tree at m = {m} vs pmdk and unprotected"
        );
    }
    // ER and LC at a tick, whose targets the floor decides, print their floor beside them.
    for (strategy, rows) in
        [("ER (every read)", 4), ("LC (last check a tick ago)", 4), ("LU (last use a tick ago)", 2)]
    {
        let n = lines.iter().filter(|l| l.contains("Zipf get") && l.contains(strategy)).count();
        assert_eq!(
            n, rows,
            "{strategy}: against none, lines checked per get (and the floor vs none, ours vs it)"
        );
    }
    let floors = lines.iter().filter(|l| l.contains("Zipf get") && l.contains("vs its floor")).count();
    assert_eq!(floors, 2, "ER and LC against their floors");
    for l in &lines {
        assert_eq!(field(l, "bench"), "\"heap\"");
        let ours: f64 = field(l, "ours").parse().unwrap();
        assert!(ours > 0.0 || l.contains("% of written lines"), "{l}");
    }
    assert!(lines
        .iter()
        .any(|l| l.contains("tx overwrite 16384B, all of its object (pointer logging) vs pmdk")));
    for case in ["store+clwb+sfence", "undo floor", "redo logging"] {
        assert!(lines.iter().any(|l| l.contains(case)), "no {case} row");
    }
    // The allocation trace, beside PMDK and malloc, with line-write counts and histogram.
    for case in [
        "alloc_into or free_from a slot vs pmdk",
        "per transaction allocating and setting a slot",
        "vs malloc",
        "line writes per alloc_into or free_from",
        "hottest line",
        "% of written lines written 1..1",
    ] {
        assert!(
            lines.iter().any(|l| l.contains("alloc trace") && l.contains(case)),
            "no alloc trace {case} row"
        );
    }
    for case in [
        "B+tree insert, random 8 B keys",
        "B+tree inserts: % of written lines",
        "B+tree inserts: writes to the hottest",
    ] {
        assert!(lines.iter().any(|l| l.contains(case)), "no {case} row");
    }
}

#[test]
fn bench_flashfs_quick_json_rows() {
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["bench", "flashfs", "--quick", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for case in [
        "sequential write",
        "sequential read",
        "append+sync",
        "repair one page from group",
        "repair one page from segment",
        "mount 128 MiB",
        "random 4 KiB overwrite + fsync vs littlefs",
        "PostMark-style",
    ] {
        assert!(lines.iter().any(|l| l.contains(case)), "no row for {case}");
    }
    for l in &lines {
        assert_eq!(field(l, "bench"), "\"flashfs\"");
        let ours: f64 = field(l, "ours").parse().unwrap();
        // Zero is a measurement too: the small files need no page read, and 300 creates at
        // 95% full empty 0 to 6 segments (checkpoints hold times, so their sizes, and where
        // the cleaner's turn falls, move from run to run).
        // And memory a mount takes beyond an empty image's may be under the page that RSS
        // counts in.
        let counts =
            l.contains("pages read") || l.contains("segments cleaned") || l.contains("over an empty");
        assert!(ours >= 0.0 && (ours > 0.0 || counts), "{l}");
        if l.contains("\"anchor\": \"littlefs") {
            let theirs: f64 = field(l, "anchor_value").parse().unwrap();
            assert!(theirs > 0.0, "littlefs measured nothing: {l}");
        }
        // Reads of the flash cannot outrun the chip's own page reads by much (compression
        // reads fewer pages, not a hundred times fewer): a row that does measured a cache.
        if l.contains("\"anchor\": \"raw chip (2 page reads)\"") && l.contains("\"unit\": \"ops/s\"") {
            let chip: f64 = field(l, "anchor_value").parse().unwrap();
            assert!(ours < 4.0 * chip, "faster than the chip can read: {l}");
        }
    }
}

#[test]
fn bench_corpus_quick_json_rows_beside_ubifs() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../flashfs/src");
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["bench", "corpus", "--quick", "--json", "--corpus", dir])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    // Written with the fast compressor, then moved by the cleaner at the high level.
    let (written, cleaned): (f64, f64) =
        (field(lines[0], "ours").parse().unwrap(), field(lines[1], "ours").parse().unwrap());
    assert!(lines[0].contains("as written") && lines[1].contains("after the cleaner"), "{text}");
    assert!(cleaned < written, "the cleaner's level saved nothing: {text}");
    for l in &lines {
        assert_eq!(field(l, "bench"), "\"corpus\"");
        assert!(l.contains("lz4"), "{l}");
        let ours: f64 = field(l, "ours").parse().unwrap();
        assert!(ours > 0.0, "{l}");
        if std::process::Command::new("mkfs.ubifs").arg("--version").output().is_ok() {
            let theirs: f64 = field(l, "anchor_value").parse().unwrap();
            assert!(theirs > 0.0, "mkfs.ubifs made no image: {l}");
        }
    }
    // A corpus that is not there is a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["bench", "corpus", "--quick", "--corpus", "/nonexistent/corpus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/corpus"));
}

#[test]
fn bench_cache_quick_rows_for_every_strategy_and_every_flip_caught_under_er() {
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["bench", "cache", "--quick", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for strategy in [
        "ER (every read)",
        "LC (last check a tick ago)",
        "LC (last check 1 s ago)",
        "LU (last use a tick ago)",
    ] {
        let timed = lines.iter().filter(|l| l.contains(strategy) && l.contains("per op vs none")).count();
        assert_eq!(timed, 2, "{strategy}: PostMark and the file server against no read check");
        let flips = lines.iter().filter(|l| l.contains(strategy) && l.contains("caught before use")).count();
        assert_eq!(flips, 1, "{strategy}: the memory-error row");
    }
    for l in &lines {
        assert_eq!(field(l, "bench"), "\"cache\"");
    }
    // Every read checked: no flip reaches the application.
    let er = lines.iter().find(|l| l.contains("ER (every read): caught before use")).expect("the ER row");
    assert_eq!(field(er, "ours").parse::<f64>().unwrap(), 100.0, "{er}");
    // The NVRAM tier: no device time on the fsync path, less flash written than without it.
    let tier = |what: &str| {
        let l = lines.iter().find(|l| l.contains("overwrites + fsync") && l.contains(what)).expect(what);
        (field(l, "ours").parse::<f64>().unwrap(), field(l, "anchor_value").parse::<f64>().unwrap())
    };
    let (ours, without) = tier("device time on the fsync path");
    assert_eq!(ours, 0.0, "with the tier an fsync programs nothing");
    assert!(without > 100.0, "without it an fsync programs the flash: {without} us");
    let (ours, without) = tier("write amplification");
    assert!(ours < without, "write amplification with the tier {ours}, without {without}");
}

/// `bench stall --quick`: one supervised crash and one plain remount, each timed; the rows
/// say what the tier held, and the stall is beside the remount and the 200 ms target.
#[test]
fn bench_stall_quick_json_rows_are_complete() {
    if !std::path::Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("BITMEND_REQUIRE_FUSE").is_none(), "FUSE required but /dev/fuse is missing");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["bench", "stall", "--quick", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for (l, anchor) in lines.iter().zip(["\"unsupervised: kill -9 then remount\"", "\"target\""]) {
        assert_eq!(field(l, "bench"), "\"stall\"");
        assert_eq!(field(l, "unit"), "\"ms\"");
        assert_eq!(field(l, "anchor"), anchor, "{l}");
        let (ours, a, r): (f64, f64, f64) = (
            field(l, "ours").parse().unwrap(),
            field(l, "anchor_value").parse().unwrap(),
            field(l, "ratio").parse().unwrap(),
        );
        assert!(ours > 0.0 && a > 0.0 && (r - a / ours).abs() < 1e-3 * r, "{l}");
    }
    assert!(lines[0].contains("tier ") && lines[0].contains(" pages"), "{}", lines[0]);
}
