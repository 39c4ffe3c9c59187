//! A FUSE mount without a session: /dev/fuse opened and mounted at the mountpoint, so that
//! the descriptor belongs to whoever holds it (the supervisor), not to the process that
//! serves it (a worker, which may die and be replaced).
//!
//! As root the mount is made with mount(2); otherwise by `fusermount3`, which mounts and
//! passes the descriptor back over a socket (`_FUSE_COMMFD`), as libfuse does.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the mount is made with.
pub struct MountRequest<'a> {
    pub mountpoint: &'a Path,
    /// The mount table's source field (`bitmend:` and the image).
    pub fsname: &'a str,
    pub allow_other: bool,
}

/// A mounted FUSE connection: its /dev/fuse descriptor and where it is mounted.
pub struct FuseMount {
    pub dev: OwnedFd,
    mountpoint: PathBuf,
    by_fusermount: bool,
}

impl FuseMount {
    pub fn mount(r: &MountRequest) -> io::Result<FuseMount> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
            let dev = OwnedFd::from(dev);
            mount_sys(r, dev.as_raw_fd())?;
            return Ok(FuseMount { dev, mountpoint: r.mountpoint.to_path_buf(), by_fusermount: false });
        }
        let dev = mount_fusermount(r)?;
        Ok(FuseMount { dev, mountpoint: r.mountpoint.to_path_buf(), by_fusermount: true })
    }

    /// Unmounts (lazily, as `fusermount3 -uz` does: a busy mount goes once the last user
    /// lets go). The connection ends for whoever reads /dev/fuse.
    pub fn unmount(&self) -> io::Result<()> {
        if self.by_fusermount {
            let out = Command::new("fusermount3").arg("-uz").arg(&self.mountpoint).output()?;
            if !out.status.success() {
                return Err(io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()));
            }
            return Ok(());
        }
        let path = cstring(self.mountpoint.as_os_str().as_bytes())?;
        // SAFETY: a NUL-terminated path that lives across the call.
        if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a path"))
}

fn options(r: &MountRequest) -> Vec<String> {
    let mut o = vec![format!("fsname={}", r.fsname), "default_permissions".to_string()];
    if r.allow_other {
        o.push("allow_other".to_string());
    }
    o
}

fn mount_sys(r: &MountRequest, fd: RawFd) -> io::Result<()> {
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = vec![
        format!("fd={fd}"),
        "rootmode=40000".into(),
        format!("user_id={uid}"),
        format!("group_id={gid}"),
    ];
    data.extend(options(r).into_iter().filter(|o| !o.starts_with("fsname=")));
    let source = cstring(r.fsname.as_bytes())?;
    let target = cstring(r.mountpoint.as_os_str().as_bytes())?;
    let fstype = cstring(b"fuse")?;
    let data = cstring(data.join(",").as_bytes())?;
    // SAFETY: every pointer is a NUL-terminated string that lives across the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn mount_fusermount(r: &MountRequest) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let their_fd = theirs.as_raw_fd();
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-o").arg(options(r).join(",")).arg("--").arg(r.mountpoint);
    cmd.env("_FUSE_COMMFD", their_fd.to_string());
    // SAFETY: the closure only calls fcntl, which is async-signal-safe, on a descriptor
    // that stays open until the child has been spawned.
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(their_fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(their_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn()?;
    drop(theirs);
    let got = receive_fd(&ours);
    drop(ours);
    let out = child.wait_with_output()?;
    got.map_err(|e| {
        let said = String::from_utf8_lossy(&out.stderr);
        io::Error::other(format!(
            "fusermount3: {}",
            if said.trim().is_empty() { e.to_string() } else { said.trim().to_string() }
        ))
    })
}

/// The descriptor fusermount3 passes back: one byte of data with SCM_RIGHTS.
fn receive_fd(socket: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // Room for one descriptor's control message, aligned as cmsghdr needs.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: msg points at buffers that live across the call.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break n;
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "fusermount3 passed no descriptor"));
    }
    // SAFETY: CMSG_FIRSTHDR reads the header recvmsg filled in; the data of an SCM_RIGHTS
    // message of this length holds one descriptor, now ours.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "fusermount3 passed no descriptor"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}
