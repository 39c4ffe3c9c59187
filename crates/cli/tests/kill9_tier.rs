//! The Loris claim, through the mount: with the NVRAM tier (the default), a `kill -9` of the
//! daemon at a random moment of a write-heavy workload loses nothing whose system call
//! returned, fsync or not. Each round mounts, runs random writes, truncates, renames,
//! creates and unlinks from another thread, kills the daemon after a random delay, and the
//! next mount must show every acknowledged operation, byte for byte, and the one in flight
//! done or not. The state carries over from round to round. The commit interval is an hour,
//! so nothing reaches flash but by the dirty limit: the tier is what keeps it.
//!
//! Rounds: `KILL9_ROUNDS` (default 24, as CI runs it; the campaigns in docs/DESIGN.md, "Rules the
//! campaigns hold", ran hundreds).

mod common;

use std::sync::{Arc, Mutex};

use common::workload::*;
use common::*;

/// `got` is `before` or `after`, or for a write in flight, each byte old or new (and the
/// size between).
fn matches(got: &Model, before: &Model, after: &Model, write: bool) -> bool {
    if got == before || got == after {
        return true;
    }
    write
        && got.keys().eq(before.keys())
        && got.iter().all(|(k, g)| {
            let (b, a) = (&before[k], &after[k]);
            // The kernel may split one write into several requests: a write in flight may
            // be cut between them, its size anywhere from the old to the new.
            (b.len().min(a.len())..=b.len().max(a.len())).contains(&g.len())
                && g.iter()
                    .enumerate()
                    .all(|(i, x)| b.get(i) == Some(x) || a.get(i) == Some(x) || (i >= b.len() && *x == 0))
        })
}

/// What differs, for a failure's message: per file, the sizes and the first wrong byte.
fn differences(got: &Model, before: &Model, after: &Model) -> String {
    let names: std::collections::BTreeSet<&String> =
        got.keys().chain(before.keys()).chain(after.keys()).collect();
    let mut out = String::new();
    for n in names {
        let (g, b, a) = (got.get(n), before.get(n), after.get(n));
        if g == b || g == a {
            continue;
        }
        let len = |x: Option<&Vec<u8>>| x.map_or(-1, |v| v.len() as i64);
        let first = g.zip(b).and_then(|(g, b)| g.iter().zip(b.iter()).position(|(x, y)| x != y));
        let wrong = g
            .iter()
            .flat_map(|g| g.iter())
            .zip(b.iter().flat_map(|b| b.iter()))
            .filter(|(x, y)| x != y)
            .count();
        let around = |v: Option<&Vec<u8>>| first.and_then(|i| v.map(|v| v[i..(i + 8).min(v.len())].to_vec()));
        out += &format!(
            "\n  {n}: got {} bytes, acknowledged {}, with the one in flight {}; first byte unlike the \
             acknowledged: {first:?} ({wrong} bytes unlike; got {:?}, acknowledged {:?})",
            len(g),
            len(b),
            len(a),
            around(g),
            around(b)
        );
    }
    out
}

struct Acked {
    model: Model,
    in_flight: Option<(Model, bool)>,
    ops: u64,
}

#[test]
fn a_kill_9_loses_nothing_that_returned() {
    if !fuse_available() {
        return;
    }
    let rounds: u32 = std::env::var("KILL9_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(24);
    let (dir, img, mnt) = scratch("kill9-tier");
    let nvram = dir.join("tier.nvram").to_str().unwrap().to_string();
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let opts = ["--commit-interval", "1h", "--nvram", nvram.as_str()];
    let mut model = Model::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut ops, mut in_flight_seen) = (0u64, 0u32);
    for round in 0..rounds {
        let pid = mount(&img, &mnt, &opts);
        let got = tree(&mnt);
        assert!(got == model, "round {round}: after the remount, the tree is not what was acknowledged");
        let acked = Arc::new(Mutex::new(Acked { model: model.clone(), in_flight: None, ops: 0 }));
        let worker = {
            let (acked, mnt, seed) = (acked.clone(), mnt.clone(), rng.next());
            std::thread::spawn(move || {
                let mut rng = Rng(seed | 1);
                loop {
                    let before = acked.lock().unwrap().model.clone();
                    // The operation and its record under one lock: the kill comes from the
                    // main thread, which takes the lock only to read the result.
                    let (r, after, write) = step(&mnt, &before, &mut rng);
                    let mut a = acked.lock().unwrap();
                    if r.is_err() {
                        a.in_flight = Some((after, write));
                        return;
                    }
                    a.model = after;
                    a.ops += 1;
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50 + rng.below(400)));
        let killed = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
        assert!(killed.success());
        // The worker's open file would keep the dead mount from being cleared.
        worker.join().unwrap();
        clear_dead_mount(pid, &mnt);
        let a = acked.lock().unwrap();
        ops += a.ops;
        // What the kill left, kept until the next round (to look into a failure).
        for (from, to) in [(&img, "killed.img"), (&nvram, "killed.nvram")] {
            let _ = std::fs::copy(from, dir.join(to));
        }
        // Remount, and settle the operation in flight: done or not, both are right.
        mount(&img, &mnt, &opts);
        let got = tree(&mnt);
        let (after, write) = a.in_flight.clone().unwrap_or((a.model.clone(), false));
        assert!(
            matches(&got, &a.model, &after, write),
            "round {round}: {} operations acknowledged; the tree holds neither them nor them with the one in flight: {}",
            a.ops,
            differences(&got, &a.model, &after)
        );
        in_flight_seen += u32::from(got != a.model);
        model = got;
        umount(&mnt);
    }
    eprintln!(
        "kill -9: {rounds} rounds, {ops} acknowledged operations, every one found after the remount \
         ({in_flight_seen} rounds found the operation in flight done)"
    );
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_file(&nvram);
}
