//! Mounted file systems: finding them in the mount table, and the commands that act on one
//! through its daemon (`bitmend sync`, `bitmend umount`).

use crate::error::CliError;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bitmend_media::nand::NandError;
use clap::Args;

use crate::scrubber::CONTROL_NAME;

/// The source a bitmend daemon gives its mount: `bitmend:` and the image's canonical path,
/// so that commands given the image can tell it is mounted.
pub const SOURCE_PREFIX: &str = "bitmend:";

/// One line of the mount table.
#[derive(Debug, PartialEq)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub source: String,
    /// The mount's device, `major:minor` (its `st_dev`, and the name of its backing device
    /// in /sys/class/bdi), as the table gives it: known without a request to the mount.
    pub dev: String,
}

impl MountEntry {
    /// The image of a bitmend mount; `None` for any other file system.
    pub fn image(&self) -> Option<PathBuf> {
        self.source.strip_prefix(SOURCE_PREFIX).map(PathBuf::from)
    }
}

/// The kernel escapes space, tab, newline and backslash in paths as `\ooo`.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal =
            b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/self/mountinfo`: the device is field 3, the mountpoint field 5, the source
/// the second field after the ` - ` separator.
fn parse(info: &str) -> Vec<MountEntry> {
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut fields = left.split_whitespace();
            let dev = fields.nth(2)?.to_string();
            Some(MountEntry {
                mountpoint: PathBuf::from(unescape(fields.nth(1)?)),
                source: unescape(right.split_whitespace().nth(1)?),
                dev,
            })
        })
        .collect()
}

fn table() -> Vec<MountEntry> {
    parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// Where `image` is mounted by a bitmend daemon.
pub fn mounted_at(image: &Path) -> Option<PathBuf> {
    let canon = std::fs::canonicalize(image).ok()?;
    table().into_iter().find(|e| e.image().as_deref() == Some(canon.as_path())).map(|e| e.mountpoint)
}

/// Whether something is mounted at `mountpoint`.
pub fn is_mountpoint(mountpoint: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(mountpoint) else { return false };
    table().iter().any(|e| e.mountpoint == canon)
}

/// Sets the kernel's readahead for the file system mounted at `mountpoint` to `kib` KiB (its
/// backing device's `read_ahead_kb`; 0 leaves it). FUSE starts a mount at 128 KiB whatever
/// the daemon offers at init; a window of one full request (1 MiB) halves the round trips of
/// a sequential reader (docs/PERFORMANCE.md, "The FUSE mount"). Needs root: otherwise the
/// daemon's log says why the window stayed.
pub fn set_readahead(mountpoint: &Path, kib: u32) {
    if kib == 0 {
        return;
    }
    // The device from the mount table, never from a stat of the mountpoint: that is a
    // request to the mount, and a daemon must not wait on its own mount (a worker dying
    // with such a request in flight would wait for it for ever, and its supervisor for it).
    let at = match (mountpoint.parent(), mountpoint.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent).map(|p| p.join(name)),
        _ => Ok(mountpoint.to_path_buf()),
    };
    let set = at.map_err(|e| format!("{}: {e}", mountpoint.display())).and_then(|at| {
        let entry = table().into_iter().rev().find(|e| e.mountpoint == at);
        let dev = entry.map(|e| e.dev).ok_or_else(|| format!("{}: not in the mount table", at.display()))?;
        let knob = format!("/sys/class/bdi/{dev}/read_ahead_kb");
        std::fs::write(&knob, kib.to_string()).map_err(|e| format!("{knob}: {e}"))
    });
    if let Err(e) = set {
        eprintln!("bitmend: readahead left at the kernel's: {e}");
    }
}

/// The bitmend mount at `mountpoint` (the mountpoint itself, not a path inside it), with a
/// message that says what is there instead.
pub fn bitmend_mount(mountpoint: &Path) -> Result<MountEntry, CliError> {
    let canon = std::fs::canonicalize(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    // The last entry wins: it is the one mounted on top.
    let entry = table().into_iter().rev().find(|e| e.mountpoint == canon);
    match entry {
        Some(e) if e.image().is_some() => Ok(e),
        Some(e) => {
            Err(format!("{}: {} is mounted there, not a bitmend file system", mountpoint.display(), e.source)
                .into())
        }
        None => Err(format!("{}: not a mountpoint", mountpoint.display()).into()),
    }
}

/// Whether the mount at `mountpoint` is a bitmend one (its daemon may be dead: the table is
/// read, not the mountpoint).
pub fn bitmend_mount_dead(mountpoint: &Path) -> bool {
    // A dead mount cannot be canonicalized (its root does not answer): its parent can.
    let Some(canon) = mountpoint
        .parent()
        .map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p })
        .and_then(|p| std::fs::canonicalize(p).ok())
        .and_then(|p| mountpoint.file_name().map(|n| p.join(n)))
    else {
        return false;
    };
    table().into_iter().rev().find(|e| e.mountpoint == canon).is_some_and(|e| e.image().is_some())
}

/// Unmounts the mount at `mountpoint` whose daemon is gone (lazily: nothing serves it).
pub fn detach(mountpoint: &Path) -> Result<(), String> {
    let out = Command::new("fusermount3")
        .arg("-uz")
        .arg(mountpoint)
        .output()
        .map_err(|e| format!("fusermount3: {e} (install fuse3)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The control file of the bitmend mount at `mountpoint` (its status, and its commands).
pub fn control_file(mountpoint: &Path) -> PathBuf {
    mountpoint.join(std::str::from_utf8(CONTROL_NAME).expect("ASCII"))
}

#[derive(Args, Debug)]
pub struct SyncArgs {
    /// The mountpoint of a mounted bitmend file system.
    pub mountpoint: PathBuf,
}

/// `bitmend sync MOUNTPOINT`: commits everything the daemon holds and returns once it is
/// durable, or fails with why it is not.
pub fn sync(a: &SyncArgs) -> Result<(), CliError> {
    bitmend_mount(&a.mountpoint)?;
    let dir = std::fs::File::open(&a.mountpoint).map_err(|e| format!("{}: {e}", a.mountpoint.display()))?;
    // First what the kernel may hold for us (nothing today: the mount does not use the
    // kernel's write-back cache), then the daemon's own state, which `syncfs` never reaches.
    // SAFETY: syncfs on a descriptor we own; no memory is passed.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(format!("{}: syncfs: {}", a.mountpoint.display(), std::io::Error::last_os_error()).into());
    }
    let control = control_file(&a.mountpoint);
    std::fs::write(&control, "sync\n")
        .map_err(|e| CliError::Failed(format!("{}: commit failed: {e}", a.mountpoint.display())))
}

#[derive(Args, Debug)]
pub struct UmountArgs {
    /// The mountpoint of a mounted bitmend file system.
    pub mountpoint: PathBuf,
    /// Give up waiting for the daemon after this many seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

/// `bitmend umount MOUNTPOINT`: unmounts, then waits until the daemon has written everything
/// out and let go of the image, so that the next command on the image finds it free.
pub fn umount(a: &UmountArgs) -> Result<(), CliError> {
    let entry = bitmend_mount(&a.mountpoint)?;
    let image = entry.image().expect("a bitmend mount");
    // The tier its daemon writes to, while it can still say: a write-out that finishes
    // removes it.
    let control = control_file(&entry.mountpoint);
    let status = std::fs::read_to_string(control).unwrap_or_default();
    let tier = crate::json::text_field(&status, "tier_path");
    // A supervisor lets go of the image between workers: the write-out is over when it ends.
    let daemon = crate::json::number(&status, "daemon_pid").ok().and_then(Process::of);
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg(&entry.mountpoint)
        .output()
        .map_err(|e| format!("fusermount3: {e} (install fuse3)"))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        return Err(format!("fusermount3 -u {}: {}", entry.mountpoint.display(), said.trim()).into());
    }
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    loop {
        if daemon.as_ref().is_some_and(Process::alive) {
            if Instant::now() >= deadline {
                return Err(
                    format!("unmounted, but the daemon is still writing out after {} s", a.timeout).into()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match crate::flash::open(&image) {
            Ok(_) => return written_out(&image, tier.as_deref()),
            Err(CliError::Nand(NandError::Locked { .. })) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(CliError::Nand(NandError::Locked { .. })) => {
                return Err(format!(
                    "unmounted, but the daemon still holds {} after {} s",
                    image.display(),
                    a.timeout
                )
                .into())
            }
            Err(e) => return Err(format!("unmounted; then {e}").into()),
        }
    }
}

/// A process, told apart from a later one given the same pid by when it started.
struct Process {
    pid: u64,
    started: String,
}

impl Process {
    fn of(pid: u64) -> Option<Process> {
        Some(Process { pid, started: Process::started(pid)? })
    }

    /// Field 22 of /proc/PID/stat (after the name, which may hold anything but a ')'), or
    /// None once it is gone or a zombie.
    fn started(pid: u64) -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
        let state = fields.next()?;
        (state != "Z" && state != "X").then(|| fields.nth(18).map(str::to_string)).flatten()
    }

    fn alive(&self) -> bool {
        Process::started(self.pid).is_some_and(|s| s == self.started)
    }
}

/// After the daemon let go of `image`: a write-out that finished removed its tier file
/// `tier` (before letting go); one still there holds changes that are not on flash.
fn written_out(image: &Path, tier: Option<&str>) -> Result<(), CliError> {
    match tier.map(PathBuf::from).filter(|p| p.exists()) {
        None => Ok(()),
        Some(tier) => Err(CliError::Failed(format!(
            "unmounted, but the daemon did not finish writing out: {} holds changes to {} that are \
             not on its flash yet (every acknowledged write); the next mount applies them",
            tier.display(),
            image.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_table_is_read_with_its_escapes() {
        let info = "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    90 29 0:52 / /tmp/my\\040mount rw,nosuid shared:1 - fuse bitmend:/tmp/a\\040b.img rw\n";
        let t = parse(info);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].mountpoint, PathBuf::from("/mnt1"));
        assert_eq!(t[0].image(), None);
        assert_eq!(t[1].mountpoint, PathBuf::from("/tmp/my mount"));
        assert_eq!(t[1].image(), Some(PathBuf::from("/tmp/a b.img")));
        assert_eq!((t[0].dev.as_str(), t[1].dev.as_str()), ("98:0", "0:52"));
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }
}
