//! `bitmend mount --supervise`: the supervisor's side of the command line (the relay itself
//! is `supervisor`), and the worker's session over the supervisor's socket.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::CliError;
use crate::fscmd::MountArgs;
use crate::fuse_mount::{FuseMount, MountRequest};
use crate::supervisor::{supervise, WorkerCommand};

/// Mounts, then supervises workers until the mount is gone. `stop` is set on SIGINT or
/// SIGTERM, which unmount.
pub fn run(a: &MountArgs, config: &fuser::Config, stop: &AtomicBool) -> Result<(), CliError> {
    if crate::nvram::chosen(&a.nvram, &a.image)?.is_none() {
        return Err(CliError::Usage(
            "--supervise needs the NVRAM tier (a new worker recovers from it): drop --nvram none".into(),
        ));
    }
    let fsname = config
        .mount_options
        .iter()
        .find_map(|o| match o {
            fuser::MountOption::FSName(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let mount = FuseMount::mount(&MountRequest {
        mountpoint: &a.mountpoint,
        fsname: &fsname,
        allow_other: a.allow_other,
    })
    .map_err(|e| format!("{}: mount: {e}", a.mountpoint.display()))?;
    crate::fscmd::catch_stop_signals(true);
    // The worker is this command again, in the foreground, serving the supervisor's socket.
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let how = WorkerCommand { args, threads: a.threads as usize };
    let relay = supervise(mount, how, stop).map_err(|s| CliError::Child {
        code: s.code,
        why: format!("{}: the mount was stopped: {}", a.mountpoint.display(), s.why),
    })?;
    let c = relay.counters();
    eprintln!(
        "bitmend: supervisor: {} restarts, {} requests replayed, {} refused, longest stall {} ms",
        c.restarts.load(Ordering::Relaxed),
        c.replayed.load(Ordering::Relaxed),
        c.refused.load(Ordering::Relaxed),
        c.longest_stall_us.load(Ordering::Relaxed) / 1000
    );
    Ok(())
}

/// The supervisor's counters, for a worker's status (`--serve-status-fd`).
static STATUS: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();

/// What a worker does differently: it reads the supervisor's counters from the memory file
/// inherited as `status_fd`; a page whose memory fails its check stops it, for a new one to
/// recover from the tier; and a panic in any thread ends it, to the same effect (a thread
/// lost, with the file system's lock poisoned, would serve on half-dead).
pub fn become_worker(status_fd: Option<i32>) {
    if let Some(fd) = status_fd {
        // SAFETY: the descriptor was inherited from the supervisor for this process alone.
        let _ = STATUS.set(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }));
    }
    crate::fuse::RESTART_ON_MEMORY_ERROR.store(true, Ordering::Relaxed);
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        std::process::exit(101);
    }));
}

/// The supervisor's counters as JSON fields to add to the status (empty when the mount is
/// not supervised).
pub fn status_json() -> String {
    use std::os::unix::fs::FileExt;
    let Some(f) = STATUS.get() else { return String::new() };
    let mut b = [0u8; 32];
    if f.read_exact_at(&mut b, 0).is_err() {
        return String::new();
    }
    let v = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    format!(
        ", \"supervisor_restarts\": {}, \"supervisor_replayed\": {}, \"supervisor_refused\": {}, \"supervisor_longest_stall_us\": {}",
        v(0),
        v(1),
        v(2),
        v(3)
    )
}

/// Inodes open on a connection, with their handles (`--serve-open INO:HANDLES,...`).
#[derive(Clone, Debug, Default)]
pub struct Held(pub Vec<(u64, u32)>);

pub fn parse_held(s: &str) -> Result<Held, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (ino, n) = p.split_once(':').ok_or_else(|| format!("{p}: not INO:HANDLES"))?;
            Ok((ino.parse().map_err(|e| format!("{ino}: {e}"))?, n.parse().map_err(|e| format!("{n}: {e}"))?))
        })
        .collect::<Result<Vec<_>, String>>()
        .map(Held)
}

/// The worker's FUSE session on the supervisor's socket: fuser reads one request per read,
/// which the socket's message boundaries keep.
pub fn serve(
    fs: crate::fuse::FuseFs,
    fd: i32,
    mut config: fuser::Config,
) -> std::io::Result<fuser::BackgroundSession> {
    // A socket cannot be cloned as a /dev/fuse descriptor: the threads share it.
    config.clone_fd = false;
    // SAFETY: the descriptor was inherited from the supervisor for this process alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let acl = config.acl;
    fuser::Session::from_fd(fs, fd, acl, config)?.spawn()
}
