//! `bitmend bench stall`: how long a program's request waits while the worker of a
//! supervised mount is killed and replaced, with the NVRAM tier nearly full (the most a new
//! worker has to recover), beside what the same crash costs without the supervisor: the
//! mount dies, and someone unmounts it and mounts again before the program is answered.
//!
//! Each round, on a fresh copy of an image, fills the tier's record log with metadata
//! changes (a chmod each: an inode node in the log) to [`FILL`], or as near as the mount's
//! checkpoints let it (each checks the tier out), puts [`DIRTY_PAGES`] dirty pages in the
//! tier, then kills the
//! daemon's worker with SIGKILL while a probe creates and unlinks a file over and over. The
//! stall is the longest any probe request waited after the kill.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitmend_bench::Row;

use crate::error::CliError;

/// How full the tier's record log is made before each crash.
const FILL: f64 = 0.9;
/// Dirty pages put in the tier after the log is filled: under the mount's dirty limit of
/// 1 MiB, so that no write-back checks the tier out before the crash.
const DIRTY_PAGES: usize = 192;
/// Files whose mode the fill changes.
const FILES: usize = 1000;

/// Whether the daemon runs under its supervisor (ours) or alone (the anchor).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Supervised,
    Alone,
}

/// A scratch image, mountpoint and tier file for one size.
struct Scratch {
    dir: PathBuf,
    img: String,
    mnt: String,
    tier: String,
}

impl Scratch {
    fn new(tag: &str) -> Result<Scratch, CliError> {
        let id = format!("bitmend-stall-{}-{tag}", std::process::id());
        let dir = std::env::temp_dir().join(&id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mnt")).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        let shm = Path::new("/dev/shm");
        let tier = if shm.is_dir() { shm.join(format!("{id}.nvram")) } else { dir.join("tier.nvram") };
        let s = |p: &Path| p.to_string_lossy().into_owned();
        Ok(Scratch { img: s(&dir.join("fs.img")), mnt: s(&dir.join("mnt")), tier: s(&tier), dir })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if crate::mounted::is_mountpoint(Path::new(&self.mnt)) {
            let _ = Command::new("fusermount3").args(["-u", "-z", &self.mnt]).status();
        }
        let _ = std::fs::remove_file(&self.tier);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fail(msg: String) -> CliError {
    CliError::Failed(format!("bench stall: {msg}"))
}

/// Runs this binary with `args`; its stdout, or why it failed.
fn bitmend(args: &[&str]) -> Result<String, CliError> {
    let exe = std::env::current_exe().map_err(|e| fail(format!("this binary: {e}")))?;
    let out = Command::new(exe).args(args).output().map_err(|e| fail(format!("bitmend {}: {e}", args[0])))?;
    if !out.status.success() {
        return Err(fail(format!(
            "bitmend {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Mounts the scratch image: the daemon's (or supervisor's) pid.
fn mount(s: &Scratch, mode: Mode) -> Result<u32, CliError> {
    let mut args = vec!["mount", &s.img, &s.mnt, "--commit-interval", "1h", "--nvram", &s.tier];
    if mode == Mode::Supervised {
        args.push("--supervise");
    }
    let said = bitmend(&args)?;
    said.split("(pid ")
        .nth(1)
        .and_then(|t| t.split([',', ')']).next())
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| fail(format!("no pid in what mount said: {said:?}")))
}

/// The daemon's status, as its control file gives it.
fn status(mnt: &str) -> Result<String, CliError> {
    let control = Path::new(mnt).join(".bitmend-scrub");
    std::fs::read_to_string(&control).map_err(|e| fail(format!("{}: {e}", control.display())))
}

fn number(status: &str, key: &str) -> Result<u64, CliError> {
    crate::json::number(status, key).map_err(fail)
}

/// What the tier held when it was filled: bytes of records, and dirty pages.
#[derive(Clone, Copy, Default)]
struct Held {
    log_used: u64,
    log_size: u64,
    pages: u64,
}

/// Makes the files the fill changes, and `more` empty ones beside them, a thousand a
/// directory: the namespace a checkpoint holds (a larger one makes checkpoints further
/// apart, so that the tier fills before one is due).
fn make_files(mnt: &str, more: usize) -> Result<(), CliError> {
    let mkdir = |d: &Path| std::fs::create_dir_all(d).map_err(|e| fail(format!("{}: {e}", d.display())));
    let dir = Path::new(mnt).join("files");
    mkdir(&dir)?;
    for i in 0..FILES {
        let p = dir.join(format!("f{i}"));
        std::fs::write(&p, b"x").map_err(|e| fail(format!("{}: {e}", p.display())))?;
    }
    for i in 0..more {
        let d = Path::new(mnt).join("more").join(format!("d{}", i / 1000));
        if i % 1000 == 0 {
            mkdir(&d)?;
        }
        let p = d.join(format!("f{}", i % 1000));
        std::fs::File::create(&p).map_err(|e| fail(format!("{}: {e}", p.display())))?;
    }
    Ok(())
}

/// Fills the tier's log with chmods to [`FILL`], or to half of where the mount's
/// checkpoints check it out, then puts [`DIRTY_PAGES`] dirty pages in it.
fn fill(mnt: &str) -> Result<Held, CliError> {
    use std::os::unix::fs::{FileExt, PermissionsExt};
    // A checkpoint checks the tier out (it is then all on flash): with a small namespace one
    // is due long before the log is full, and the fill stops at half of where the last came
    // (the write-back thread writes a due one within a second, so a peak overshoots the
    // point where it came due by up to a second of chmods; the pages written next would
    // wake it).
    // The first checkpoint after a mount comes early (its interval grows with the last
    // checkpoint's size, which the mount does not know): peaks count once two agree.
    let (t, mut n, mut last) = (Instant::now(), 0usize, 0u64);
    let (mut target, mut peak) = (None, None::<u64>);
    loop {
        let st = status(mnt)?;
        let (used, size) = (number(&st, "tier_log_used")?, number(&st, "tier_log_size")?);
        if used < last {
            if peak.is_some_and(|p| last <= p + p / 10) {
                target = Some(target.unwrap_or(u64::MAX).min(last / 2));
            }
            peak = Some(last);
        }
        if used >= target.unwrap_or((FILL * size as f64) as u64) {
            break;
        }
        if t.elapsed() > Duration::from_secs(300) {
            return Err(fail(format!("the tier's log reached only {used} of {size} bytes in 5 minutes")));
        }
        last = used;
        for _ in 0..250 {
            let p = Path::new(mnt).join("files").join(format!("f{}", n % FILES));
            let mode = if (n / FILES).is_multiple_of(2) { 0o600 } else { 0o644 };
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
                .map_err(|e| fail(format!("chmod {}: {e}", p.display())))?;
            n += 1;
        }
    }
    let dirty = Path::new(mnt).join("dirty");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&dirty)
        .map_err(|e| fail(format!("{}: {e}", dirty.display())))?;
    let page: Vec<u8> =
        (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ DIRTY_PAGES as u8).collect();
    for i in 0..DIRTY_PAGES {
        f.write_all_at(&page, (i * 4096) as u64)
            .map_err(|e| fail(format!("write {}: {e}", dirty.display())))?;
    }
    let st = status(mnt)?;
    Ok(Held {
        log_used: number(&st, "tier_log_used")?,
        log_size: number(&st, "tier_log_size")?,
        pages: number(&st, "tier_pages")?,
    })
}

/// Creates and unlinks a file until `stop`: when each request started and ended.
fn probe(
    mnt: &str,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Vec<(Instant, Instant)>, String>> {
    let path = Path::new(mnt).join("probe");
    std::thread::spawn(move || {
        let mut done = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            std::fs::write(&path, b"p").map_err(|e| format!("create {}: {e}", path.display()))?;
            done.push((t, Instant::now()));
            let t = Instant::now();
            std::fs::remove_file(&path).map_err(|e| format!("unlink {}: {e}", path.display()))?;
            done.push((t, Instant::now()));
        }
        Ok(done)
    })
}

fn kill_9(pid: u32) -> Result<(), CliError> {
    // SAFETY: kill(2) with a pid and a signal number; no memory is shared.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } != 0 {
        return Err(fail(format!("kill -9 {pid}: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

/// The worker of supervisor `pid`: its child.
fn worker_of(pid: u32) -> Result<u32, CliError> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .find_map(|p| p.parse().ok())
        .ok_or_else(|| fail(format!("supervisor {pid} has no worker")))
}

/// Waits for every thread of `pid` to be gone (zombies count as gone): the last one to go
/// lets go of the image's lock.
fn wait_gone(pid: u32) {
    let alive = || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
        tasks.into_iter().any(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            !stat.is_empty() && !stat.contains(") Z ") && !stat.contains(") X ")
        })
    };
    let t = Instant::now();
    while alive() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One crash with the tier filled: how long the program waited (ms), and what the tier held.
fn one_crash(s: &Scratch, mode: Mode, pid: u32) -> Result<(f64, Held), CliError> {
    let held = fill(&s.mnt)?;
    match mode {
        Mode::Supervised => {
            let stop = Arc::new(AtomicBool::new(false));
            let prober = probe(&s.mnt, stop.clone());
            std::thread::sleep(Duration::from_millis(100));
            let killed = Instant::now();
            let worker = worker_of(pid)?;
            kill_9(worker)?;
            wait_gone(worker);
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::Relaxed);
            let done = prober.join().map_err(|_| fail("the probe panicked".into()))?;
            let done = done.map_err(|e| fail(format!("supervised mount: the program saw an error: {e}")))?;
            // A request that began before the kill counts from the kill.
            let waits = done.iter().map(|&(start, end)| end.saturating_duration_since(start.max(killed)));
            let stall = waits.max().unwrap_or_default();
            Ok((stall.as_secs_f64() * 1e3, held))
        }
        Mode::Alone => {
            // What someone does by hand today, at machine speed: the dead mount cleared and
            // mounted again, and the program's request made again.
            let killed = Instant::now();
            kill_9(pid)?;
            wait_gone(pid);
            let cleared = Command::new("fusermount3").args(["-u", "-z", &s.mnt]).status();
            if !cleared.is_ok_and(|c| c.success()) {
                return Err(fail(format!("fusermount3 -u -z {} failed", s.mnt)));
            }
            mount(s, Mode::Alone)?;
            let path = Path::new(&s.mnt).join("probe");
            std::fs::write(&path, b"p").map_err(|e| fail(format!("create {}: {e}", path.display())))?;
            let took = killed.elapsed();
            std::fs::remove_file(&path).map_err(|e| fail(format!("unlink {}: {e}", path.display())))?;
            Ok((took.as_secs_f64() * 1e3, held))
        }
    }
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Supervised => "supervised",
            Mode::Alone => "unsupervised",
        }
    }
}

/// An image size and a namespace: `files` more than the [`FILES`] the fill changes.
#[derive(Clone, Copy)]
struct Case {
    mib: u64,
    files: usize,
}

impl Case {
    fn tag(self) -> String {
        format!("{}-{}", self.mib, self.files)
    }
}

/// The image every round of `case` starts from: made, its files made, unmounted.
fn template(case: Case) -> Result<Scratch, CliError> {
    let s = Scratch::new(&format!("{}-template", case.tag()))?;
    bitmend(&["mkfs", &s.img, "--size", &format!("{}MiB", case.mib), "--force"])?;
    mount(&s, Mode::Alone)?;
    make_files(&s.mnt, case.files)?;
    bitmend(&["umount", &s.mnt])?;
    Ok(s)
}

/// `rounds` crashes, each of a copy of `from` under `mode` (on an image the rounds had used,
/// the cleaner's checkpoints would check the tier out early): each stall (ms) and the tier's
/// fill at the first.
fn crashes(from: &Scratch, case: Case, mode: Mode, rounds: usize) -> Result<(Vec<f64>, Held), CliError> {
    let (mut stalls, mut first) = (Vec::new(), None);
    for _ in 0..rounds {
        let s = Scratch::new(&case.tag())?;
        std::fs::copy(&from.img, &s.img).map_err(|e| fail(format!("copy {} to {}: {e}", from.img, s.img)))?;
        let pid = mount(&s, mode)?;
        let (ms, held) = one_crash(&s, mode, pid)?;
        stalls.push(ms);
        first.get_or_insert(held);
        bitmend(&["umount", &s.mnt])?;
        let fsck = bitmend(&["fsck", &s.img, "--json"])?;
        if !fsck.contains("\"clean\": true") {
            return Err(fail(format!(
                "{} mount of {} MiB: fsck after the crash: {fsck}",
                mode.name(),
                case.mib
            )));
        }
    }
    Ok((stalls, first.unwrap_or_default()))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The rows: for each image size and namespace, the median stall beside the median
/// remount, and the longest stall beside the 200 ms target.
pub fn run(quick: bool, samples: usize, json: bool, emit: &mut dyn FnMut(Row)) -> Result<(), CliError> {
    if !Path::new("/dev/fuse").exists() {
        return Err(fail("needs FUSE (/dev/fuse; apt-get install fuse3)".into()));
    }
    let rounds = if quick { 1 } else { samples.clamp(3, 5) };
    if !json {
        eprintln!(
            "bench stall: SIGKILL of the worker with the tier's log filled, medians of {rounds} crashes per case; image in {}, tier in /dev/shm",
            std::env::temp_dir().display()
        );
    }
    let cases: &[Case] = if quick {
        &[Case { mib: 32, files: 0 }]
    } else {
        &[
            Case { mib: 128, files: 0 },
            Case { mib: 128, files: 100_000 },
            Case { mib: 1024, files: 0 },
            Case { mib: 1024, files: 100_000 },
        ]
    };
    for &case in cases {
        let from = template(case)?;
        let (mut ours, held) = crashes(&from, case, Mode::Supervised, rounds)?;
        let (mut anchor, _) = crashes(&from, case, Mode::Alone, rounds)?;
        let longest = ours.iter().copied().fold(0.0, f64::max);
        let what = format!(
            "{} MiB, {} files, tier {} of {} KiB records + {} pages",
            case.mib,
            FILES + case.files,
            held.log_used >> 10,
            held.log_size >> 10,
            held.pages
        );
        let row = |case: String, ours: f64, anchor: &str, value: f64| Row {
            unit: "ms",
            ..Row::latency(case, ours, anchor, Some(value)).in_bench("stall")
        };
        let remount = "unsupervised: kill -9 then remount";
        emit(row(format!("stall, worker restart: {what}"), median(&mut ours), remount, median(&mut anchor)));
        emit(row(format!("longest stall of {rounds}"), longest, "target", 200.0));
    }
    Ok(())
}
