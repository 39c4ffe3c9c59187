//! Loris's experiment (section VI of its paper): faults inside the cache, while a
//! PostMark-like workload runs. Here the worker of a supervised mount meets them: the test
//! build's fault points (`--features fault-points`) make about one request in
//! `WORKER_FAULT_ONE_IN` panic, abort, or flip a bit of a dirty page the worker holds. Each
//! run creates files, then does transactions (a read or an append, then a create or a
//! delete), every byte checked against a model, then reads everything back, unmounts and
//! runs fsck. A run ends one of three ways, reported as Loris reports them: the worker never
//! crashed; it crashed and the workload never noticed; or the mount was stopped because
//! what it would need could not be trusted. A wrong byte handed to the workload fails the
//! test, whatever else happened.
//!
//! Runs: `WORKER_FAULT_RUNS` (default 3, as CI runs it); `WORKER_FAULT_ONE_IN` (default 150).

#![cfg(feature = "fault-points")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::workload::Rng;
use common::*;

/// How a run ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    NoCrash,
    Transparent { restarts: u64 },
    Stopped(String),
}

/// The workload: `files` files of 500 to 10,000 bytes, then `transactions` transactions.
/// An error ends it (the mount stopped, or a request answered EIO after its tries); wrong
/// bytes panic.
fn postmark(mnt: &str, rng: &mut Rng, files: usize, transactions: usize) -> Result<(), String> {
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut next = 0u64;
    let path = |n: u64| format!("{mnt}/pm{n}");
    let mut create = |model: &mut BTreeMap<u64, Vec<u8>>, rng: &mut Rng| -> Result<(), String> {
        let data = noise(rng.next(), 500 + rng.below(9_500) as usize);
        std::fs::write(path(next), &data).map_err(|e| format!("create pm{next}: {e}"))?;
        model.insert(next, data);
        next += 1;
        Ok(())
    };
    for _ in 0..files {
        create(&mut model, rng)?;
    }
    for t in 0..transactions {
        let keys: Vec<u64> = model.keys().copied().collect();
        if let Some(&k) = keys.get(rng.below(keys.len().max(1) as u64) as usize) {
            if rng.below(2) == 0 {
                let got = std::fs::read(path(k)).map_err(|e| format!("transaction {t}: read pm{k}: {e}"))?;
                assert!(got == model[&k], "transaction {t}: pm{k} read back wrong bytes");
            } else {
                use std::io::Write;
                let more = noise(rng.next(), 1 + rng.below(4_000) as usize);
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(path(k))
                    .map_err(|e| format!("open pm{k}: {e}"))?;
                f.write_all(&more).map_err(|e| format!("transaction {t}: append to pm{k}: {e}"))?;
                model.get_mut(&k).unwrap().extend_from_slice(&more);
            }
        }
        if rng.below(2) == 0 || model.is_empty() {
            create(&mut model, rng)?;
        } else {
            let k = *model.keys().nth(rng.below(model.len() as u64) as usize).unwrap();
            std::fs::remove_file(path(k)).map_err(|e| format!("transaction {t}: delete pm{k}: {e}"))?;
            model.remove(&k);
        }
    }
    for (k, data) in &model {
        let got = std::fs::read(path(*k)).map_err(|e| format!("the last read of pm{k}: {e}"))?;
        assert!(&got == data, "pm{k} read back wrong bytes at the end");
    }
    Ok(())
}

fn restarts(mnt: &str) -> u64 {
    let out = bitmend(&["stat", mnt, "--json"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    said.split("\"supervisor_restarts\": ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn one_run(run: u64, one_in: u64) -> Outcome {
    let (dir, img, mnt) = scratch(&format!("worker-faults-{run}"));
    let nvram = dir.join("tier.nvram").to_str().unwrap().to_string();
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bitmend"))
        .args(["mount", &img, &mnt, "--supervise", "--direct-io", "--nvram", &nvram])
        .env("BITMEND_FAULT_POINTS", one_in.to_string())
        .output()
        .unwrap();
    if !out.status.success() {
        // A fault during the first mount's own requests may stop it before it serves.
        let _ = std::fs::remove_dir_all(&dir);
        return Outcome::Stopped(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let supervisor: u32 =
        said.split("(pid ").nth(1).and_then(|s| s.split(',').next()).and_then(|s| s.parse().ok()).unwrap();
    let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B ^ run.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let outcome = match postmark(&mnt, &mut rng, 60, 400) {
        Ok(()) => match restarts(&mnt) {
            0 => Outcome::NoCrash,
            n => Outcome::Transparent { restarts: n },
        },
        Err(e) => Outcome::Stopped(e),
    };
    if matches!(outcome, Outcome::Stopped(_)) {
        kill_9(supervisor, &mnt);
    } else {
        umount(&mnt);
        fsck_clean(&img, &format!("run {run}"));
    }
    std::thread::sleep(Duration::from_millis(10));
    let _ = std::fs::remove_dir_all(dir);
    outcome
}

#[test]
fn faults_inside_the_worker_never_hand_back_a_wrong_byte() {
    if !fuse_available() {
        return;
    }
    let runs: u64 = std::env::var("WORKER_FAULT_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let one_in: u64 = std::env::var("WORKER_FAULT_ONE_IN").ok().and_then(|s| s.parse().ok()).unwrap_or(150);
    let (mut clean, mut transparent, mut restarts, mut stopped) = (0, 0, 0, Vec::new());
    for run in 0..runs {
        match one_run(run, one_in) {
            Outcome::NoCrash => clean += 1,
            Outcome::Transparent { restarts: n } => {
                transparent += 1;
                restarts += n;
            }
            Outcome::Stopped(why) => stopped.push(why),
        }
    }
    eprintln!(
        "worker faults: {runs} runs (one request in {one_in} meets a fault): {clean} without a crash, {transparent} \
         crashed and recovered transparently ({restarts} restarts), {} stopped, 0 wrong bytes",
        stopped.len()
    );
    for why in &stopped {
        eprintln!("  stopped: {why}");
    }
}
