//! `bitmend kv` end to end: a store made, filled, read, scanned, checked; bad input and a
//! full pool answered with clear errors and their exit codes, nothing applied.

use std::process::{Command, Output};

fn bitmend(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitmend")).args(args).output().expect("runs")
}

fn ok(args: &[&str]) -> String {
    let out = bitmend(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Output of a command that exits 4 (problems reported).
fn ok_or_problems(args: &[&str]) -> String {
    let out = bitmend(args);
    assert!(matches!(out.status.code(), Some(0 | 4)), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn temp(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("bitmend-kv-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p.to_str().unwrap().to_string()
}

#[test]
fn a_store_is_made_filled_scanned_and_checked() {
    let pool = temp("a.pool");
    ok(&["kv", "create", &pool, "--size", "8MiB"]);
    ok(&["kv", "put", &pool, "apple", "red"]);
    assert_eq!(ok(&["kv", "get", &pool, "apple"]), "red", "the bytes, no newline added");
    let input = temp("in.tsv");
    let lines: String = (0..2500).map(|i| format!("k{i:05}\tv{i}\n")).collect();
    std::fs::write(&input, lines).unwrap();
    assert!(ok(&["kv", "load", &pool, &input]).contains("2500 entries loaded; the store holds 2501"));
    assert_eq!(
        ok(&["kv", "scan", &pool, "--from", "k01000", "--to", "k01003"]),
        "k01000\tv1000\nk01001\tv1001\nk01002\tv1002\n"
    );
    assert_eq!(ok(&["kv", "scan", &pool, "--prefix", "k0249"]).lines().count(), 10);
    let big = temp("big.bin");
    std::fs::write(&big, vec![b'x'; 300_000]).unwrap();
    ok(&["kv", "put", &pool, "big", "--value-file", &big]);
    assert_eq!(ok(&["kv", "get", &pool, "big"]).len(), 300_000);
    ok(&["kv", "del", &pool, "apple"]);
    assert_eq!(bitmend(&["kv", "get", &pool, "apple"]).status.code(), Some(1));
    let check = ok(&["kv", "check", &pool, "--json"]);
    assert!(check.contains("\"clean\": true") && check.contains("\"entries\": 2501"), "{check}");
    let stat = ok(&["kv", "stat", &pool, "--json"]);
    assert!(stat.contains("\"value_blocks\": 1") && stat.contains("\"wear_histogram\": ["), "{stat}");
    assert!(stat.contains("\"version\": 8, \"stripes\": null"), "{stat}");
}

#[test]
fn bad_input_and_a_full_pool_are_clear_errors_that_change_nothing() {
    let zeros = temp("zeros.pool");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let out = bitmend(&["kv", "get", &zeros, "k"]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a bitmend pool"));
    let pool = temp("small.pool");
    ok(&["kv", "create", &pool, "--size", "2MiB"]);
    let long = "k".repeat(1025);
    assert_eq!(bitmend(&["kv", "put", &pool, &long, "v"]).status.code(), Some(2));
    let big = temp("half.bin");
    std::fs::write(&big, vec![b'y'; 600_000]).unwrap();
    let mut stored = 0;
    let full = loop {
        let out = bitmend(&["kv", "put", &pool, &format!("b{stored}"), "--value-file", &big]);
        if !out.status.success() {
            break out;
        }
        stored += 1;
        assert!(stored < 10, "a 2 MiB pool took {stored} values of 600 KB");
    };
    assert_eq!(full.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&full.stderr).contains("full"),
        "{}",
        String::from_utf8_lossy(&full.stderr)
    );
    assert_eq!(
        bitmend(&["kv", "get", &pool, &format!("b{stored}")]).status.code(),
        Some(1),
        "nothing of it applied"
    );
    assert!(ok(&["kv", "check", &pool]).contains("clean"));
}

#[test]
fn a_healing_store_names_the_keys_on_a_wild_write_and_scrub_rebuilds_them() {
    let pool = temp("heals.pool");
    assert!(ok(&["kv", "create", &pool, "--size", "8MiB", "--stripes", "8+2"]).contains("stripes of 8+2"));
    let input = temp("heals.tsv");
    let lines: String = (0..2000).map(|i| format!("k{i:05}\tvalue-{i}\n")).collect();
    std::fs::write(&input, lines).unwrap();
    ok(&["kv", "load", &pool, &input]);
    assert!(ok(&["kv", "check", &pool, "--json"]).contains("\"clean\": true"));
    let stat = ok(&["kv", "stat", &pool, "--json"]);
    assert!(
        stat.contains("\"version\": 8, \"stripes\": \"8+2\"") && !stat.contains("\"protected_pages\": 0"),
        "{stat}"
    );
    // A wild write over every copy of k01000's value in the file, straight into it (the live
    // entry, and stale copies in freed blocks and dead entry bytes: damage too, to pages
    // the signatures cover).
    let mut bytes = std::fs::read(&pool).unwrap();
    let copies: Vec<usize> =
        bytes.windows(10).enumerate().filter(|(_, w)| w == b"value-1000").map(|(i, _)| i).collect();
    assert!(!copies.is_empty());
    for &at in &copies {
        for b in &mut bytes[at..at + 10] {
            *b ^= 0x5A;
        }
    }
    std::fs::write(&pool, &bytes).unwrap();
    let at = copies[0];
    let out = bitmend(&["kv", "check", &pool, "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(text.contains("\"clean\": false") && text.contains("repairable"), "{text}");
    assert!(text.contains("key \\\"k01000\\\" is on a damaged page"), "{text}");
    let terminal = ok_or_problems(&["kv", "check", &pool]);
    assert!(terminal.lines().count() <= 24, "a terminal gets the first lines: {terminal}");
    // The cheap pass reads only the table: the damage is in a page, so it takes the full one.
    let scrub = ok(&["kv", "scrub", &pool, "--full", "--json"]);
    let repaired = format!("\"pages_repaired\": {}", text.matches("repairable").count());
    assert!(scrub.contains(&repaired) && scrub.contains("\"beyond_repair\": []"), "{scrub}");
    assert_eq!(&std::fs::read(&pool).unwrap()[at..at + 10], b"value-1000", "the page was rebuilt");
    assert!(ok(&["kv", "check", &pool, "--json"]).contains("\"clean\": true"));
    assert_eq!(ok(&["kv", "get", &pool, "k01000"]), "value-1000");
    assert_eq!(ok(&["kv", "scan", &pool]).lines().count(), 2000);
    // bitmend inject learns pools: lost pages and flipped bits, named, then rebuilt.
    let lost = ok(&["inject", &pool, "lose", "--pages", "2", "--seed", "9"]);
    assert_eq!(lost.lines().filter(|l| l.contains("replaced with garbage")).count(), 2, "{lost}");
    let flipped = ok(&["inject", &pool, "flip", "--bits", "5", "--seed", "10", "--json"]);
    assert!(flipped.contains("\"fault\": \"bit-flips\""), "{flipped}");
    assert_eq!(bitmend(&["kv", "check", &pool]).status.code(), Some(4));
    let scrub = ok(&["kv", "scrub", &pool, "--full", "--json"]);
    assert!(scrub.contains("\"beyond_repair\": []") && !scrub.contains("\"pages_repaired\": 0"), "{scrub}");
    assert!(ok(&["kv", "check", &pool, "--json"]).contains("\"clean\": true"));
    assert_eq!(ok(&["kv", "scan", &pool]).lines().count(), 2000);
    // A pool without stripes has nothing to scrub with, and says so.
    let plain = temp("plain.pool");
    ok(&["kv", "create", &plain, "--size", "4MiB"]);
    let out = bitmend(&["kv", "scrub", &plain]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no parity"));
    // A shape outside what a pool can have is refused before anything is made.
    assert_eq!(bitmend(&["kv", "create", &temp("bad.pool"), "--stripes", "8+5"]).status.code(), Some(2));
}

/// A write over repairable damage is kept: the page holding a key's entry wiped (within
/// m), then a put of that key, a load over it and a delete of another key on the page.
/// Each reads the damaged page, is refused by its check, rebuilds it and runs again: the new
/// values read back and the store checks clean (before, the put kept the old value and the
/// leaf held the key twice for good).
#[test]
fn a_write_over_repairable_damage_is_kept() {
    let pool = temp("heal-write.pool");
    ok(&["kv", "create", &pool, "--size", "4MiB", "--stripes", "8+2"]);
    let v = "v".repeat(300);
    for i in 0..20 {
        ok(&["kv", "put", &pool, &format!("k{i:02}"), &format!("{v}{i:02}")]);
    }
    let wipe = || {
        let mut b = std::fs::read(&pool).unwrap();
        let needle = format!("k00{v}");
        let at =
            b.windows(needle.len()).position(|w| w == needle.as_bytes()).expect("the entry") / 4096 * 4096;
        b[at..at + 4096].fill(0);
        std::fs::write(&pool, b).unwrap();
    };
    wipe();
    ok(&["kv", "put", &pool, "k00", "NEW"]);
    assert_eq!(ok(&["kv", "get", &pool, "k00"]).trim_end(), "NEW");
    assert!(ok(&["kv", "check", &pool]).contains("clean"));
    // A batch over the same damage, and a delete.
    let batch = temp("heal-write.tsv");
    std::fs::write(&batch, "k00\tAGAIN\nk01\tONE\n").unwrap();
    ok(&["kv", "put", &pool, "k00", &format!("{v}00")]);
    wipe();
    ok(&["kv", "load", &pool, &batch]);
    wipe();
    ok(&["kv", "del", &pool, "k02"]);
    let listed = ok(&["kv", "scan", &pool]);
    assert!(
        listed.contains("k00\tAGAIN") && listed.contains("k01\tONE") && !listed.contains("k02\t"),
        "{listed}"
    );
    assert_eq!(listed.lines().count(), 19, "{listed}");
    assert!(ok(&["kv", "check", &pool]).contains("clean"));
}

/// `scan` prints only what it checked: a byte flipped inside a value (within m) is found,
/// rebuilt, and the right value printed, every entry once (before, scan printed the flipped
/// value with exit 0 where `get` gave the right one).
#[test]
fn scan_prints_only_checked_bytes() {
    let pool = temp("heal-scan.pool");
    ok(&["kv", "create", &pool, "--size", "4MiB", "--stripes", "8+2"]);
    let v = "w".repeat(200);
    for i in 0..40 {
        ok(&["kv", "put", &pool, &format!("s{i:02}"), &format!("{v}{i:02}")]);
    }
    let want = ok(&["kv", "scan", &pool]);
    assert_eq!(want.lines().count(), 40);
    for (n, key) in ["s05", "s21", "s39"].iter().enumerate() {
        let mut b = std::fs::read(&pool).unwrap();
        let needle = format!("{v}{}", &key[1..]);
        // The last copy is the live one (an earlier one is in a leaf that split).
        let at = b.windows(needle.len()).rposition(|w| w == needle.as_bytes()).expect("the value") + 50 + n;
        b[at] ^= 0x5A;
        std::fs::write(&pool, b).unwrap();
        let out = bitmend(&["kv", "scan", &pool]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), want, "a byte of {key}'s value flipped");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.contains("rebuilt for this read, in memory only"), "{err}");
    }
    // A reader writes nothing: the damage stays in the file until a scrub mends it.
    assert_eq!(bitmend(&["kv", "check", &pool]).status.code(), Some(4));
    ok(&["kv", "scrub", &pool, "--full"]);
    assert!(ok(&["kv", "check", &pool]).contains("clean"));
}

/// What a script relies on: `get` writes the value's bytes exactly (no newline added when
/// stdout is not a terminal), `--limit 0` prints nothing, `--prefix` with `--from`/`--to`
/// takes the keys in both, a key over the limit is named as such (exit 2), a closed stdout
/// ends `get` quietly, and a `create` that fails leaves no file behind.
#[test]
fn the_cli_a_script_relies_on() {
    let pool = temp("script.pool");
    ok(&["kv", "create", &pool, "--size", "4MiB"]);
    for k in ["a1", "a2", "a3", "b1"] {
        ok(&["kv", "put", &pool, k, &format!("v{k}")]);
    }
    assert_eq!(bitmend(&["kv", "get", &pool, "a1"]).stdout, b"va1");
    assert_eq!(ok(&["kv", "scan", &pool, "--limit", "0"]), "");
    assert_eq!(ok(&["kv", "scan", &pool, "--prefix", "a", "--from", "a2"]), "a2\tva2\na3\tva3\n");
    assert_eq!(ok(&["kv", "scan", &pool, "--prefix", "a", "--to", "a2"]), "a1\tva1\n");
    assert_eq!(ok(&["kv", "scan", &pool, "--prefix", "a", "--from", "b"]), "");
    let long = "k".repeat(1025);
    let out = bitmend(&["kv", "put", &pool, &long, "v"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("a key of 1025 bytes") && err.contains("1024"), "{err}");
    let script =
        format!("'{}' kv get '{pool}' a1 | true; echo ${{PIPESTATUS[0]}}", env!("CARGO_BIN_EXE_bitmend"));
    let out = Command::new("bash").arg("-c").arg(&script).output().unwrap();
    // Ended as any Unix tool is by a closed pipe (SIGPIPE, 141) or not at all: never a panic.
    let status = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(status == "0" || status == "141", "exit {status}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    let small = temp("too-small.pool");
    let out = bitmend(&["kv", "create", &small, "--size", "1KiB"]);
    assert!(!out.status.success());
    assert!(!std::path::Path::new(&small).exists(), "a failed create leaves no file");
}

/// `load -` reads standard input; a line without a tab, or bytes that are not UTF-8, stop
/// the load with the line's number and what was loaded before it (exit 2).
#[test]
fn load_reads_stdin_and_names_a_bad_line() {
    use std::io::Write as _;
    let pool = temp("load.pool");
    ok(&["kv", "create", &pool, "--size", "4MiB"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["kv", "load", &pool, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"a\t1\nb\t2\n").unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    assert_eq!(ok(&["kv", "scan", &pool]), "a\t1\nb\t2\n");
    let mut text: Vec<String> = (0..1500).map(|i| format!("k{i:04}\tv{i}")).collect();
    text[1200] = "no tab here".into();
    let bad = temp("bad.tsv");
    std::fs::write(&bad, text.join("\n") + "\n").unwrap();
    let out = bitmend(&["kv", "load", &pool, &bad]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 1201") && err.contains("1000 entries were loaded"), "{err}");
    assert_eq!(
        ok(&["kv", "scan", &pool]).lines().count(),
        1002,
        "the first batch, and nothing of the second"
    );
    let not_utf8 = temp("bad8.tsv");
    std::fs::write(&not_utf8, b"x\t1\n\xff\xfe\t2\n").unwrap();
    let out = bitmend(&["kv", "load", &pool, &not_utf8]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 2") && err.contains("not UTF-8"), "{err}");
}

/// Every command closes the pool, however it ends: a page zeroed after it (here, the run
/// header page of a leaf's run, which the last load touched) is found and rebuilt by the
/// next scrub. Left unclosed (as `stat`, `scan` and `check` left it), the next open
/// recovered it as after a crash and recomputed the parity of the last transaction's
/// ranges over the zeroed page: the damage was taken in and the store lost.
#[test]
fn damage_after_any_command_is_rebuilt() {
    let tsv = temp("closed.tsv");
    let lines: String = (0..300).map(|i| format!("key{i:04}\tvalue-{i}-{}\n", "x".repeat(i % 50))).collect();
    std::fs::write(&tsv, lines).unwrap();
    let commands: [&[&str]; 6] =
        [&["stat"], &["scan"], &["check"], &["get", "no-such-key"], &["del", "no-such-key"], &["scrub"]];
    for (n, command) in commands.iter().enumerate() {
        let pool = temp(&format!("closed-{n}.pool"));
        ok(&["kv", "create", &pool, "--size", "2MiB", "--stripes", "4+2"]);
        ok(&["kv", "load", &pool, &tsv]);
        let want = ok(&["kv", "scan", &pool]);
        let args: Vec<&str> =
            ["kv", command[0], &pool].into_iter().chain(command[1..].iter().copied()).collect();
        let _ = bitmend(&args);
        let mut b = std::fs::read(&pool).unwrap();
        let leaf = b.windows(7).rposition(|w| w == b"key0001").expect("a leaf");
        let run =
            (0..=leaf / 4096).rev().map(|p| p * 4096).find(|&at| &b[at..at + 4] == b"BMRN").expect("its run");
        b[run..run + 4096].fill(0);
        std::fs::write(&pool, b).unwrap();
        let scrub = ok(&["kv", "scrub", &pool, "--full", "--json"]);
        assert!(scrub.contains("\"bad_pages\": 1,"), "after {command:?}: {scrub}");
        assert_eq!(ok(&["kv", "scan", &pool]), want, "after {command:?}");
        assert!(ok(&["kv", "check", &pool]).contains("clean"), "after {command:?}");
    }
}

/// `check` names the keys of a wiped (repairable) leaf page: it reads them from a copy of
/// the pool in memory with the page rebuilt (before, a wiped leaf named none, since its
/// bytes read as zeros), and writes nothing.
#[test]
fn check_names_the_keys_of_a_wiped_leaf() {
    let pool = temp("wiped-leaf.pool");
    ok(&["kv", "create", &pool, "--size", "8MiB", "--stripes", "8+2"]);
    let input = temp("wiped-leaf.tsv");
    let lines: String = (0..2000).map(|i| format!("k{i:05}\tvalue-{i}\n")).collect();
    std::fs::write(&input, lines).unwrap();
    ok(&["kv", "load", &pool, &input]);
    let mut bytes = std::fs::read(&pool).unwrap();
    let live = bytes.windows(16).rposition(|w| w == b"k01000value-1000").expect("the entry");
    let page = live / 4096 * 4096;
    bytes[page..page + 4096].fill(0);
    std::fs::write(&pool, &bytes).unwrap();
    let out = bitmend(&["kv", "check", &pool, "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{text}");
    let named = text.matches("is on a damaged page").count();
    assert!(text.contains("key \\\"k01000\\\" is on a damaged page") && named >= 10, "{named} keys: {text}");
    assert_eq!(std::fs::read(&pool).unwrap()[page..page + 4096], [0u8; 4096], "check wrote nothing there");
    // The tree is counted as a reader finds it, the wiped leaf rebuilt: every entry.
    assert!(text.contains("\"entries\": 2000"), "{text}");
    let stat = ok(&["kv", "stat", &pool, "--json"]);
    assert!(stat.contains("\"entries\": 2000"), "{stat}");
    assert_eq!(ok(&["kv", "count", &pool]), "2000\n");
    assert_eq!(std::fs::read(&pool).unwrap()[page..page + 4096], [0u8; 4096], "readers wrote nothing there");
    ok(&["kv", "scrub", &pool, "--full"]);
    assert_eq!(ok(&["kv", "scan", &pool]).lines().count(), 2000);
}

/// Any bytes in and out: keys and values in hex (tabs, newlines, invalid UTF-8), `--json`
/// that carries them as `key_hex` / `value_hex` and never alters them, a text scan that
/// refuses an entry it cannot carry, `dump` and `load --hex` that copy a store exactly,
/// `count`, a delete by prefix and by range, `--json` on writes, and keys and values from
/// files.
#[test]
fn any_bytes_round_trip_and_ranges_are_counted_and_deleted() {
    let pool = temp("bytes.pool");
    let made = ok(&["kv", "create", &pool, "--size", "4MiB", "--json"]);
    assert!(made.contains("\"size\": 4194304") && made.contains("\"stripes\": null"), "{made}");
    let put = ok(&["kv", "--hex", "put", &pool, "00ff09", "0a0d00", "--json"]);
    assert!(put.contains("\"key_hex\": \"00ff09\"") && put.contains("\"value_bytes\": 3"), "{put}");
    let key_file = temp("key.bin");
    std::fs::write(&key_file, b"k\tab\n").unwrap();
    let value_file = temp("value.bin");
    let all: Vec<u8> = (0..=255).collect();
    std::fs::write(&value_file, &all).unwrap();
    ok(&["kv", "put", &pool, "--key-file", &key_file, "--value-file", &value_file]);
    ok(&["kv", "put", &pool, "--key-file", &key_file, "--value-file", &value_file]);
    for i in 0..30 {
        ok(&["kv", "put", &pool, &format!("p{i:02}"), &format!("v{i}")]);
    }
    assert_eq!(bitmend(&["kv", "get", &pool, "--key-file", &key_file]).stdout, all, "bytes exactly");
    assert_eq!(ok(&["kv", "--hex", "get", &pool, "00ff09"]), "0a0d00\n");
    assert_eq!(
        ok(&["kv", "--hex", "get", &pool, "00ff09", "--json"]),
        "{\"key_hex\": \"00ff09\", \"value_hex\": \"0a0d00\"}\n"
    );
    assert_eq!(ok(&["kv", "get", &pool, "p01", "--json"]), "{\"key\": \"p01\", \"value\": \"v1\"}\n");
    // A text scan refuses the entries a line cannot carry (exit 2), after none wrong.
    let out = bitmend(&["kv", "scan", &pool]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("0x00ff09"));
    let json = ok(&["kv", "scan", &pool, "--json", "--limit", "2"]);
    // UTF-8 bytes as a JSON string (escaped, exact), others in hex.
    assert_eq!(
        json.lines().next().unwrap(),
        "{\"key_hex\": \"00ff09\", \"value\": \"\\u000a\\u000d\\u0000\"}"
    );
    assert!(json.contains("\"key\": \"k\\u0009ab\\u000a\", \"value_hex\": \"000102"), "{json}");
    // dump, then load --hex into a new pool: the same store, byte for byte.
    let dump = ok(&["kv", "dump", &pool]);
    assert_eq!(dump.lines().count(), 32);
    let copy = temp("bytes-copy.pool");
    ok(&["kv", "create", &copy, "--size", "4MiB"]);
    let dump_file = temp("dump.txt");
    std::fs::write(&dump_file, &dump).unwrap();
    let loaded = ok(&["kv", "--hex", "load", &copy, &dump_file, "--json"]);
    assert!(loaded.contains("\"loaded\": 32, \"entries\": 32"), "{loaded}");
    assert_eq!(ok(&["kv", "dump", &copy]), dump);
    assert_eq!(bitmend(&["kv", "get", &copy, "--key-file", &key_file]).stdout, all);
    // Bad hex is named with its line.
    std::fs::write(&dump_file, "6b\t76\nzz\t00\n").unwrap();
    let out = bitmend(&["kv", "--hex", "load", &copy, &dump_file]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2: key \"zz\" is not hex"));
    // count and delete by prefix and by range.
    assert_eq!(ok(&["kv", "count", &pool]), "32\n");
    assert_eq!(ok(&["kv", "count", &pool, "--prefix", "p1"]), "10\n");
    assert_eq!(
        ok(&["kv", "count", &pool, "--from", "p05", "--to", "p10", "--json"]).trim_end(),
        format!("{{\"file\": {pool:?}, \"entries\": 5}}")
    );
    assert!(ok(&["kv", "del", &pool, "--prefix", "p1", "--json"]).contains("\"deleted\": 10"));
    assert!(ok(&["kv", "del", &pool, "--from", "p05", "--to", "p25"]).contains("10 keys deleted"));
    assert_eq!(ok(&["kv", "count", &pool, "--prefix", "p"]), "10\n");
    assert_eq!(bitmend(&["kv", "del", &pool, "p01", "--prefix", "p"]).status.code(), Some(2));
    assert_eq!(bitmend(&["kv", "get", &pool, "p12"]).status.code(), Some(1));
    assert!(ok(&["kv", "check", &pool]).contains("clean"));
}

/// Readers share a pool; a writer waits for them (`--wait`) or is refused at once
/// (`--wait 0`, exit 3); a read-only pool file can be read.
#[test]
fn readers_share_and_a_writer_waits_for_them() {
    use std::io::Read;
    use std::process::Stdio;
    let pool = temp("share.pool");
    ok(&["kv", "create", &pool, "--size", "8MiB"]);
    let input = temp("share.tsv");
    let v = "r".repeat(100);
    std::fs::write(&input, (0..2000).map(|i| format!("k{i:05}\t{v}\n")).collect::<String>()).unwrap();
    ok(&["kv", "load", &pool, &input]);
    // A scan whose output nobody reads yet: it holds the pool, blocked on a full pipe.
    let mut scan = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["kv", "scan", &pool])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(scan.try_wait().unwrap().is_none(), "the scan holds the pool");
    assert_eq!(ok(&["kv", "get", &pool, "k00007", "--wait", "0"]), v, "a second reader at once");
    let refused = bitmend(&["kv", "put", &pool, "new", "x", "--wait", "0"]);
    assert_eq!(refused.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("in use by another process"));
    let mut writer = Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["kv", "put", &pool, "new", "x", "--wait", "60s"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(writer.try_wait().unwrap().is_none(), "the writer waits for the reader");
    let mut out = String::new();
    scan.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(scan.wait().unwrap().success() && out.lines().count() == 2000);
    assert!(writer.wait().unwrap().success(), "the writer went on once the reader was done");
    assert_eq!(ok(&["kv", "get", &pool, "new"]), "x");
    // A read-only file: read, and left as it was.
    let before = std::fs::read(&pool).unwrap();
    let mut perm = std::fs::metadata(&pool).unwrap().permissions();
    perm.set_readonly(true);
    std::fs::set_permissions(&pool, perm).unwrap();
    assert_eq!(ok(&["kv", "count", &pool]), "2001\n");
    assert!(ok(&["kv", "check", &pool]).contains("clean"));
    assert!(std::fs::read(&pool).unwrap() == before, "readers wrote nothing");
}
