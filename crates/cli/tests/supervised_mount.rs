//! Loris's transparent recovery, through the mount: with `--supervise`, the worker that
//! serves the mount is killed with SIGKILL at random moments of a write-heavy workload
//! (creates, unlinks, truncates, renames, writes), and the workload must never see an
//! error: every operation returns as if nothing happened, and the tree is at every moment
//! what the operations that returned say, byte for byte. Beside it, a file unlinked while
//! open is written and read back through its descriptor the whole time. After the last kill: unmount,
//! fsck clean, and a plain mount shows the same tree.
//!
//! Kills: `SUPERVISE_KILLS` (default 12, as CI runs it).

mod common;

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::workload::*;
use common::*;

/// The worker: the supervisor's child.
fn worker_of(supervisor: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children")).ok()?;
    children.split_whitespace().filter_map(|p| p.parse().ok()).next()
}

/// How many restarts the supervisor's log reports.
fn restarts(log: &str) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().matches("took over").count()
}

struct Told {
    model: Model,
    error: Option<String>,
    ops: u64,
}

/// Writes and reads back a file unlinked while open until `stop`: the writes it checked,
/// or the first error or wrong byte.
fn hold_an_unlinked_file(mnt: &str, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Result<u64, String>> {
    let path = format!("{mnt}/.held");
    std::thread::spawn(move || {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| e.to_string())?;
        std::fs::remove_file(&path).map_err(|e| e.to_string())?;
        let (mut model, mut rng, mut writes) = (Vec::new(), Rng(0xD1B5_4A32_D192_ED03), 0u64);
        while !stop.load(Ordering::Relaxed) {
            let (off, len) = (rng.below(60_000) as usize, 1 + rng.below(9_000) as usize);
            let data = noise(rng.next(), len);
            f.write_all_at(&data, off as u64).map_err(|e| format!("write {writes}: {e}"))?;
            model.resize(model.len().max(off + len), 0);
            model[off..off + len].copy_from_slice(&data);
            let mut got = vec![0u8; model.len()];
            f.read_exact_at(&mut got, 0).map_err(|e| format!("read after write {writes}: {e}"))?;
            if got != model {
                return Err(format!("after write {writes}: the bytes read back are not those written"));
            }
            writes += 1;
        }
        Ok(writes)
    })
}

#[test]
fn a_killed_worker_is_never_noticed() {
    if !fuse_available() {
        return;
    }
    let kills: usize = std::env::var("SUPERVISE_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(12);
    let (dir, img, mnt) = scratch("supervised");
    let nvram = dir.join("tier.nvram").to_str().unwrap().to_string();
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let (supervisor, log) = mount_supervised(&img, &mnt, &nvram);

    let told = Arc::new(Mutex::new(Told { model: Model::new(), error: None, ops: 0 }));
    let stop = Arc::new(AtomicBool::new(false));
    let workload = {
        let (told, stop, mnt) = (told.clone(), stop.clone(), mnt.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(0x2545_F491_4F6C_DD1D);
            while !stop.load(Ordering::Relaxed) {
                let before = told.lock().unwrap().model.clone();
                let (r, after, _) = step(&mnt, &before, &mut rng);
                let mut t = told.lock().unwrap();
                if let Err(e) = r {
                    t.error = Some(format!("operation {} failed: {e}", t.ops));
                    return;
                }
                t.model = after;
                t.ops += 1;
            }
        })
    };
    let holder = hold_an_unlinked_file(&mnt, stop.clone());
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for k in 0..kills {
        std::thread::sleep(Duration::from_millis(20 + rng.below(250)));
        let worker = worker_of(supervisor).expect("the supervisor has a worker");
        let killed = std::process::Command::new("kill").arg("-9").arg(worker.to_string()).status().unwrap();
        assert!(killed.success());
        // The next kill once the new worker serves.
        let t = Instant::now();
        while restarts(&log) <= k {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "no new worker after kill {k}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            assert!(told.lock().unwrap().error.is_none(), "{:?}", told.lock().unwrap().error);
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    stop.store(true, Ordering::Relaxed);
    workload.join().unwrap();
    let held = holder.join().unwrap();
    assert!(held.as_ref().is_ok_and(|&n| n > 0), "the file unlinked while open: {held:?}");
    let t = told.lock().unwrap();
    assert!(t.error.is_none(), "after {} kills: {}", kills, t.error.as_deref().unwrap_or(""));
    assert!(tree(&mnt) == t.model, "the tree is not what {} operations that returned said", t.ops);
    // `bitmend stat` through the mount counts every restart.
    let stat = bitmend(&["stat", &mnt, "--json"]);
    let said = String::from_utf8_lossy(&stat.stdout);
    assert!(said.contains(&format!("\"supervisor_restarts\": {kills},")), "{said}");
    umount(&mnt);
    fsck_clean(&img, "after the kills");
    mount(&img, &mnt, &["--nvram", &nvram]);
    assert!(tree(&mnt) == t.model, "after a plain remount, the tree is not what was acknowledged");
    umount(&mnt);
    eprintln!(
        "supervised mount: {kills} workers killed, {} operations and {} writes to a file unlinked while open, \
         none failed, every byte as told",
        t.ops,
        held.unwrap()
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Mounts `img` supervised over the tier `nvram`: (supervisor pid, its log).
fn mount_supervised(img: &str, mnt: &str, nvram: &str) -> (u32, String) {
    let out = bitmend(&["mount", img, mnt, "--supervise", "--commit-interval", "1h", "--nvram", nvram]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let pid =
        said.split("(pid ").nth(1).and_then(|s| s.split(',').next()).and_then(|s| s.parse().ok()).unwrap();
    let log = said.split("log ").nth(1).and_then(|s| s.split(')').next()).unwrap().to_string();
    (pid, log)
}

fn wait_gone(pid: u32) {
    let t = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
    {
        assert!(t.elapsed() < Duration::from_secs(60), "process {pid} did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A page of the tier damaged while the worker runs, then the worker killed: the new worker
/// finds it fails its check, and the mount is stopped with a message naming it, never
/// served without the bytes the programs on it wrote.
#[test]
fn a_tier_that_fails_its_check_after_a_crash_stops_the_mount() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("supervised-halt");
    let nvram = dir.join("tier.nvram").to_str().unwrap().to_string();
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let (supervisor, log) = mount_supervised(&img, &mnt, &nvram);
    let data = noise(77, 64 << 10);
    std::fs::write(format!("{mnt}/f"), &data).unwrap();
    // One byte of the file's first page, where the tier's slot holds it.
    let mut tier = std::fs::read(&nvram).unwrap();
    let at = tier.windows(64).position(|w| w == &data[..64]).expect("the page in the tier");
    tier[at + 10] ^= 0x40;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&nvram)
        .unwrap()
        .write_all_at(&tier[at + 10..at + 11], (at + 10) as u64)
        .unwrap();
    let worker = worker_of(supervisor).unwrap();
    assert!(std::process::Command::new("kill").arg("-9").arg(worker.to_string()).status().unwrap().success());
    wait_gone(supervisor);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("NOT recovered: inode") && said.contains("the mount is stopped"), "{said}");
    clear_dead_mount(supervisor, &mnt);
    let _ = std::fs::remove_dir_all(dir);
}

/// `kill -9` of the supervisor itself ends the mount, as a kill of an unsupervised daemon
/// does; the next mount has every write that returned.
#[test]
fn a_killed_supervisor_ends_the_mount_and_loses_nothing() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("supervised-killed");
    let nvram = dir.join("tier.nvram").to_str().unwrap().to_string();
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let (supervisor, _) = mount_supervised(&img, &mnt, &nvram);
    let mut model = Model::new();
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    for _ in 0..200 {
        let (r, after, _) = step(&mnt, &model, &mut rng);
        r.unwrap();
        model = after;
    }
    let worker = worker_of(supervisor).unwrap();
    kill_9(supervisor, &mnt);
    wait_gone(worker);
    mount(&img, &mnt, &["--nvram", &nvram]);
    assert!(tree(&mnt) == model, "after the supervisor's kill, the tree is not what 200 operations said");
    umount(&mnt);
    fsck_clean(&img, "after the supervisor's kill");
    let _ = std::fs::remove_dir_all(dir);
}

/// Loris's transparent recovery from a memory error: a bit of a dirty page flipped in the
/// worker's memory (the control file's `flip`), then the page read. The read's check finds
/// it, the worker stops, a new one recovers the page from the tier, and the read, replayed,
/// returns the bytes written: no error, no wrong byte.
#[test]
fn a_dirty_page_flipped_in_memory_is_healed_from_the_tier() {
    if !fuse_available() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let (dir, img, mnt) = scratch("supervised-flip");
    let nvram = dir.join("tier.nvram").to_str().unwrap().to_string();
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let out = bitmend(&[
        "mount",
        &img,
        &mnt,
        "--supervise",
        "--direct-io",
        "--verify",
        "every",
        "--commit-interval",
        "1h",
        "--nvram",
        &nvram,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = noise(5, 40_000);
    let path = format!("{mnt}/f");
    let control = format!("{mnt}/.bitmend-scrub");
    for (page, bit) in [(1u64, 777usize), (3, 20_000)] {
        // Written again each time: a new worker's recovery puts what it recovered on flash,
        // and a page there is clean (a flipped clean page is read again from flash).
        std::fs::write(&path, &data).unwrap();
        let ino = std::fs::metadata(&path).unwrap().ino();
        std::fs::write(&control, format!("flip {ino} {page} {bit}\n")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data, "page {page} read back after its bit {bit} flipped");
    }
    let stat = bitmend(&["stat", &mnt, "--json"]);
    let said = String::from_utf8_lossy(&stat.stdout);
    // Healed in place from the tier's copy: no worker had to die for it.
    assert!(said.contains("\"supervisor_restarts\": 0,"), "{said}");
    assert!(said.contains("\"cache_dirty_healed\": 2,"), "{said}");
    umount(&mnt);
    fsck_clean(&img, "after the flips");
    let _ = std::fs::remove_dir_all(dir);
}

/// PRIMS's on-line check under the supervisor: an inode's owner flipped in the worker's
/// memory (a memory error no CRC covers) is found by the background check comparing the
/// namespace with flash, the worker is replaced, and the new one serves the inode as flash
/// holds it. (`flip-inode` is a test build's: `--features fault-points`.)
#[cfg(feature = "fault-points")]
#[test]
fn an_inode_flipped_in_memory_is_found_and_the_worker_replaced() {
    if !fuse_available() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let (dir, img, mnt) = scratch("supervised-state");
    let nvram = dir.join("tier.nvram").to_str().unwrap().to_string();
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    // Files whose groups a checkpoint (the unmount's) has written: settled, as the check
    // needs them.
    mount(&img, &mnt, &["--nvram", &nvram]);
    std::fs::create_dir(format!("{mnt}/d")).unwrap();
    for i in 0..200 {
        std::fs::write(format!("{mnt}/d/f{i}"), i.to_string()).unwrap();
    }
    umount(&mnt);
    let out =
        bitmend(&["mount", &img, &mnt, "--supervise", "--state-check-rate", "100000", "--nvram", &nvram]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let path = format!("{mnt}/d/f77");
    let (ino, uid) = {
        let m = std::fs::metadata(&path).unwrap();
        (m.ino(), m.uid())
    };
    std::fs::write(format!("{mnt}/.bitmend-scrub"), format!("flip-inode {ino} 3\n")).unwrap();
    let t = Instant::now();
    loop {
        let said = String::from_utf8_lossy(&bitmend(&["stat", &mnt, "--json"]).stdout).to_string();
        if said.contains("\"supervisor_restarts\": 1,") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the flip was never found: {said}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(std::fs::metadata(&path).unwrap().uid(), uid, "the owner as flash holds it");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "77");
    umount(&mnt);
    fsck_clean(&img, "after the worker was replaced");
    let _ = std::fs::remove_dir_all(dir);
}

/// A worker that dies while it writes out at the unmount: a new one recovers the tier and
/// writes it out, and `bitmend umount` succeeds. One that dies every time: `bitmend umount`
/// fails, naming the tier that still holds the writes, and the next mount applies them.
/// (The abort at the write-out is a test build's: `--features fault-points`.)
#[cfg(feature = "fault-points")]
#[test]
fn a_worker_dying_as_it_writes_out_is_replaced_or_named() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("supervised-write-out");
    let nvram = dir.join("tier.nvram").to_str().unwrap().to_string();
    let aborts = dir.join("aborts");
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let mount_aborting = |n: u32| {
        std::fs::write(&aborts, n.to_string()).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bitmend"))
            .args(["mount", &img, &mnt, "--supervise", "--commit-interval", "1h", "--nvram", &nvram])
            .env("BITMEND_FAULT_WRITE_OUT", &aborts)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let files: Vec<(String, Vec<u8>)> =
        (0..2u64).map(|i| (format!("{mnt}/f{i}"), noise(40 + i, 100_000 + i as usize))).collect();
    // One abort: the second worker writes out.
    mount_aborting(1);
    std::fs::write(&files[0].0, &files[0].1).unwrap();
    umount(&mnt);
    assert_eq!(std::fs::read_to_string(&aborts).unwrap(), "0", "the abort did not fire");
    assert!(!std::path::Path::new(&nvram).exists(), "written out, the tier file is gone");
    fsck_clean(&img, "after a write-out that a second worker finished");
    // Every worker aborts: the unmount says so, and the tier keeps the write.
    mount_aborting(1000);
    std::fs::write(&files[1].0, &files[1].1).unwrap();
    let out = bitmend(&["umount", &mnt]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("did not finish writing out") && said.contains(&nvram),
        "{said}"
    );
    let left: u32 = std::fs::read_to_string(&aborts).unwrap().trim().parse().unwrap();
    assert_eq!(1000 - left, 6, "one write-out and five more tries");
    mount(&img, &mnt, &["--nvram", &nvram]);
    for (path, data) in &files {
        assert!(std::fs::read(path).unwrap() == *data, "{path} after the write-outs");
    }
    umount(&mnt);
    fsck_clean(&img, "after the next mount applied the tier");
    let _ = std::fs::remove_dir_all(dir);
}
