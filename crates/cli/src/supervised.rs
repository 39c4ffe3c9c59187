//! `bitmend mount --supervise`: the supervisor's side of the command line (the relay itself
//! is `supervisor`), and the worker's session over the supervisor's socket.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::CliError;
use crate::fuse_mount::{FuseMount, MountRequest};
use crate::supervisor::{supervise, WorkerCommand};

/// Mounts at `mountpoint`, then supervises workers until the mount is gone. `stop` is set
/// on SIGINT or SIGTERM (the caller catches them), which unmount.
pub fn run(
    mountpoint: &Path,
    config: &fuser::Config,
    threads: usize,
    stop: &AtomicBool,
) -> Result<(), CliError> {
    let fsname = config
        .mount_options
        .iter()
        .find_map(|o| match o {
            fuser::MountOption::FSName(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let allow_other = config.acl == fuser::SessionACL::All;
    let mount = FuseMount::mount(&MountRequest { mountpoint, fsname: &fsname, allow_other })
        .map_err(|e| format!("{}: mount: {e}", mountpoint.display()))?;
    // The worker is this command again, in the foreground, serving the supervisor's socket.
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let how = WorkerCommand { args, threads };
    let relay = supervise(mount, how, stop).map_err(|s| CliError::Child {
        code: s.code,
        why: format!("{}: the mount was stopped: {}", mountpoint.display(), s.why),
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
