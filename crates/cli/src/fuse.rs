//! The FUSE adapter: kernel requests to the flash file system's operations, nothing more.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::ops::{Deref, DerefMut};
use std::sync::MutexGuard;

use bitmend_flashfs::{Attr, Falloc, FileType, Fs, Ino, SetAttr, XattrMode, ROOT};
use bitmend_media::nand::FileNand;
use fuser::{
    FileAttr, Filesystem, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};

use crate::scrubber::{lock, Mounted, Shared, CONTROL_INO, CONTROL_NAME};

const TTL: Duration = Duration::from_secs(1);

/// FUSE_HANDLE_KILLPRIV_V2 (protocol 7.33, Linux 5.11; fuser 0.15 knows the protocol to 7.31):
/// the file system clears set-user-ID, set-group-ID and file capabilities itself on a write,
/// a truncate or a change of owner. Without it the kernel asks for `security.capability`
/// before every write, to see whether there is one to remove: a second round trip per
/// write (4,006 requests for 2,000 random 4 KiB writes). With it the kernel also marks the
/// mount SB_NOSEC.
const FUSE_HANDLE_KILLPRIV_V2: u32 = 1 << 28;
/// In a write's flags: the writer lacks CAP_FSETID, privileges go (KILLPRIV_V2 only).
const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// The mounted file system, shared with the scrubber thread.
pub struct FuseFs {
    pub shared: Shared,
    /// Open files with FOPEN_DIRECT_IO: the kernel keeps no copy, every read comes to the
    /// daemon's checked cache (`mount --direct-io`).
    pub direct_io: bool,
    /// The kernel's writeback cache (`mount --writeback-cache`).
    pub writeback_cache: bool,
    /// FUSE_HANDLE_KILLPRIV_V2 was agreed at init: privileges are ours to drop.
    pub drops_privileges: bool,
    /// The NVRAM tier's file, removed once a clean unmount has emptied it.
    pub nvram: Option<std::path::PathBuf>,
}

/// The file system, locked for one request.
struct Locked<'a>(MutexGuard<'a, Mounted>);

impl Deref for Locked<'_> {
    type Target = Fs<FileNand>;
    fn deref(&self) -> &Fs<FileNand> {
        self.0.fs.as_ref().expect("mounted")
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Fs<FileNand> {
        self.0.fs.as_mut().expect("mounted")
    }
}

/// Whether `name` in `parent` is the control file, which no operation may create, remove or
/// rename.
fn is_control(parent: u64, name: &OsStr) -> bool {
    parent == ROOT.0 && name.as_bytes() == CONTROL_NAME
}

/// The control file's attributes: a regular file owned as the root directory is, as long as
/// the status it reads.
fn control_attr(len: usize, owner: (u32, u32)) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: CONTROL_INO,
        size: len as u64,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind: fuser::FileType::RegularFile,
        perm: 0o644,
        nlink: 1,
        uid: owner.0,
        gid: owner.1,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// Answers a getxattr or listxattr: the size asked for with `size` 0, the bytes if they fit,
/// else ERANGE.
fn xattr_reply(reply: ReplyXattr, size: u32, bytes: &[u8]) {
    if size == 0 {
        reply.size(bytes.len() as u32);
    } else if bytes.len() <= size as usize {
        reply.data(bytes);
    } else {
        reply.error(libc::ERANGE);
    }
}

fn time((s, ns): (i64, u32)) -> SystemTime {
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, ns)
    } else {
        UNIX_EPOCH - Duration::new(s.unsigned_abs(), 0) + Duration::new(0, ns)
    }
}

fn stamp(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        // Before 1970: whole seconds down, nanoseconds up from there (as `time` reads them
        // back), so -1 ns is (-1, 999,999,999), not -1 s.
        Err(e) => {
            let d = e.duration();
            match d.subsec_nanos() {
                0 => (-(d.as_secs() as i64), 0),
                ns => (-(d.as_secs() as i64) - 1, 1_000_000_000 - ns),
            }
        }
    }
}

fn kind(k: FileType) -> fuser::FileType {
    match k {
        FileType::File => fuser::FileType::RegularFile,
        FileType::Dir => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
    }
}

fn attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

impl FuseFs {
    /// How files are opened: direct I/O if asked; otherwise the kernel keeps its cached pages
    /// across opens (FOPEN_KEEP_CACHE), since every change reaches the file system through
    /// this mount and so through that same cache: the data cannot have changed behind it.
    fn open_flags(&self) -> u32 {
        if self.direct_io {
            fuser::consts::FOPEN_DIRECT_IO
        } else {
            fuser::consts::FOPEN_KEEP_CACHE
        }
    }

    fn fs(&mut self) -> Locked<'_> {
        Locked(lock(&self.shared))
    }

    fn control(&self) -> FileAttr {
        let m = lock(&self.shared);
        let owner = m.fs.as_ref().and_then(|fs| fs.getattr(ROOT).ok()).map_or((0, 0), |a| (a.uid, a.gid));
        control_attr(m.status().len(), owner)
    }
}

/// Refuses an operation on the control file's name.
macro_rules! not_control {
    ($reply:expr, $parent:expr, $name:expr, $errno:expr) => {
        if is_control($parent, $name) {
            return $reply.error($errno);
        }
    };
}

macro_rules! try_reply {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(e.errno()),
        }
    };
}

impl Filesystem for FuseFs {
    /// Requests of up to 1 MiB (fuser asks for the kernel's largest, FUSE_MAX_PAGES), the
    /// writeback cache if the mount asked for it, and privileges dropped by us.
    fn init(&mut self, _req: &Request<'_>, config: &mut fuser::KernelConfig) -> Result<(), libc::c_int> {
        if self.writeback_cache {
            config.add_capabilities(fuser::consts::FUSE_WRITEBACK_CACHE).map_err(|_| libc::ENOSYS)?;
        }
        // An older kernel does not offer it, and goes on asking for security.capability.
        self.drops_privileges = config.add_capabilities(FUSE_HANDLE_KILLPRIV_V2).is_ok();
        Ok(())
    }

    fn destroy(&mut self) {
        let fs = lock(&self.shared).fs.take();
        if let Some(fs) = fs {
            match fs.unmount() {
                // Everything on flash, the tier checked out: its file holds nothing.
                Ok(_) => {
                    if let Some(p) = &self.nvram {
                        let _ = std::fs::remove_file(p);
                    }
                }
                Err(e) => eprintln!("bitmend: unmount: {e}"),
            }
        }
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if is_control(parent, name) {
            return reply.entry(&Duration::ZERO, &self.control(), 0);
        }
        let a = try_reply!(reply, self.fs().lookup(Ino(parent), name.as_bytes()));
        reply.entry(&TTL, &attr(&a), 0);
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino == CONTROL_INO {
            return reply.attr(&Duration::ZERO, &self.control());
        }
        let a = try_reply!(reply, self.fs().getattr(Ino(ino)));
        reply.attr(&TTL, &attr(&a));
    }

    fn setattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if ino == CONTROL_INO {
            // `echo start > .bitmend-scrub` truncates first: nothing to truncate.
            return reply.attr(&Duration::ZERO, &self.control());
        }
        let t = |x: Option<TimeOrNow>| {
            x.map(|x| match x {
                TimeOrNow::Now => stamp(SystemTime::now()),
                TimeOrNow::SpecificTime(t) => stamp(t),
            })
        };
        let set = SetAttr {
            perm: mode.map(|m| m as u16 & 0o7777),
            uid,
            gid,
            size,
            atime: t(atime),
            mtime: t(mtime),
        };
        let a = try_reply!(reply, self.fs().setattr(Ino(ino), set));
        // With KILLPRIV_V2 the kernel leaves this to us: a change of owner always drops an
        // executable's privileges; a truncate does unless the caller has CAP_FSETID, which
        // fuser 0.15 does not pass on (FATTR_KILL_SUIDGID): root is taken to have it.
        let owner = uid.is_some() || gid.is_some();
        let truncated = size.is_some() && req.uid() != 0;
        if self.drops_privileges && a.kind != FileType::Dir && (owner || truncated) {
            try_reply!(reply, self.fs().drop_privileges(Ino(ino)));
            let a = try_reply!(reply, self.fs().getattr(Ino(ino)));
            return reply.attr(&TTL, &attr(&a));
        }
        reply.attr(&TTL, &attr(&a));
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        let t = try_reply!(reply, self.fs().readlink(Ino(ino)));
        reply.data(&t);
    }

    fn mknod(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        not_control!(reply, parent, name, libc::EEXIST);
        let k = match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::File,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            _ => return reply.error(libc::EINVAL),
        };
        let perm = (mode & !umask & 0o7777) as u16;
        let a = try_reply!(
            reply,
            self.fs().mknod(Ino(parent), name.as_bytes(), k, perm, rdev, (req.uid(), req.gid()))
        );
        reply.entry(&TTL, &attr(&a), 0);
    }

    fn mkdir(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        not_control!(reply, parent, name, libc::EEXIST);
        let perm = (mode & !umask & 0o7777) as u16;
        let a = try_reply!(reply, self.fs().mkdir(Ino(parent), name.as_bytes(), perm, req.uid(), req.gid()));
        reply.entry(&TTL, &attr(&a), 0);
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        not_control!(reply, parent, name, libc::EPERM);
        try_reply!(reply, self.fs().unlink(Ino(parent), name.as_bytes()));
        reply.ok();
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        not_control!(reply, parent, name, libc::ENOTDIR);
        try_reply!(reply, self.fs().rmdir(Ino(parent), name.as_bytes()));
        reply.ok();
    }

    fn symlink(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        not_control!(reply, parent, link_name, libc::EEXIST);
        let a = try_reply!(
            reply,
            self.fs().symlink(
                Ino(parent),
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
                req.uid(),
                req.gid()
            )
        );
        reply.entry(&TTL, &attr(&a), 0);
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        not_control!(reply, parent, name, libc::EPERM);
        not_control!(reply, newparent, newname, libc::EPERM);
        if flags & libc::RENAME_EXCHANGE != 0 {
            return reply.error(libc::EINVAL);
        }
        if flags & libc::RENAME_NOREPLACE != 0 && self.fs().lookup(Ino(newparent), newname.as_bytes()).is_ok()
        {
            return reply.error(libc::EEXIST);
        }
        try_reply!(reply, self.fs().rename(Ino(parent), name.as_bytes(), Ino(newparent), newname.as_bytes()));
        reply.ok();
    }

    fn link(&mut self, _req: &Request<'_>, ino: u64, newparent: u64, newname: &OsStr, reply: ReplyEntry) {
        not_control!(reply, newparent, newname, libc::EEXIST);
        let a = try_reply!(reply, self.fs().link(Ino(ino), Ino(newparent), newname.as_bytes()));
        reply.entry(&TTL, &attr(&a), 0);
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if ino == CONTROL_INO {
            // Direct I/O: every read asks again, so the status is never a cached one.
            return reply.opened(0, fuser::consts::FOPEN_DIRECT_IO);
        }
        try_reply!(reply, self.fs().open_file(Ino(ino)));
        reply.opened(0, self.open_flags());
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if ino == CONTROL_INO {
            return reply.ok();
        }
        self.fs().release_file(Ino(ino));
        reply.ok();
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        if ino == CONTROL_INO {
            let status = lock(&self.shared).status().into_bytes();
            let from = (offset.max(0) as usize).min(status.len());
            let to = (from + size as usize).min(status.len());
            return reply.data(&status[from..to]);
        }
        let data = try_reply!(reply, self.fs().read(Ino(ino), offset.max(0) as u64, size as usize));
        reply.data(&data);
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        if ino == CONTROL_INO {
            return match data.trim_ascii() {
                b"start" => {
                    lock(&self.shared).request();
                    reply.written(data.len() as u32)
                }
                // `bitmend scrub --quick`: the write returns once the pass is done.
                b"quick" => {
                    try_reply!(reply, lock(&self.shared).run_quick());
                    reply.written(data.len() as u32)
                }
                // `bitmend sync`: the write returns once everything is durable.
                b"sync" => {
                    try_reply!(reply, self.fs().sync());
                    reply.written(data.len() as u32)
                }
                // `flip INO PAGE BIT`: a memory error in a cached page (tests, the demo).
                // ENODATA if the page is not in the daemon's memory.
                command => match lock(&self.shared).flip(command) {
                    Some(bitmend_flashfs::Cached::No) => reply.error(libc::ENODATA),
                    Some(_) => reply.written(data.len() as u32),
                    None => reply.error(libc::EINVAL),
                },
            };
        }
        if write_flags & FUSE_WRITE_KILL_SUIDGID != 0 {
            try_reply!(reply, self.fs().drop_privileges(Ino(ino)));
        }
        let n = try_reply!(reply, self.fs().write(Ino(ino), offset.max(0) as u64, data));
        reply.written(n as u32);
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock_owner: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        if ino == CONTROL_INO {
            return reply.ok();
        }
        try_reply!(reply, self.fs().fsync(Ino(ino)));
        reply.ok();
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        try_reply!(reply, self.fs().fsync(Ino(ino)));
        reply.ok();
    }

    fn setxattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if ino == CONTROL_INO {
            return reply.error(libc::EPERM);
        }
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(libc::EINVAL),
        };
        try_reply!(reply, self.fs().setxattr(Ino(ino), name.as_bytes(), value, mode));
        reply.ok();
    }

    fn getxattr(&mut self, _req: &Request<'_>, ino: u64, name: &OsStr, size: u32, reply: ReplyXattr) {
        if ino == CONTROL_INO {
            return reply.error(libc::ENODATA);
        }
        let value = try_reply!(reply, self.fs().getxattr(Ino(ino), name.as_bytes()));
        xattr_reply(reply, size, &value);
    }

    fn listxattr(&mut self, _req: &Request<'_>, ino: u64, size: u32, reply: ReplyXattr) {
        if ino == CONTROL_INO {
            return xattr_reply(reply, size, &[]);
        }
        let names = try_reply!(reply, self.fs().listxattr(Ino(ino)));
        // Each name followed by a NUL, as listxattr(2) returns them.
        let list: Vec<u8> = names
            .into_iter()
            .flat_map(|mut n| {
                n.push(0);
                n
            })
            .collect();
        xattr_reply(reply, size, &list);
    }

    fn removexattr(&mut self, _req: &Request<'_>, ino: u64, name: &OsStr, reply: ReplyEmpty) {
        if ino == CONTROL_INO {
            return reply.error(libc::ENODATA);
        }
        try_reply!(reply, self.fs().removexattr(Ino(ino), name.as_bytes()));
        reply.ok();
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let (Ok(off), Ok(len)) = (u64::try_from(offset), u64::try_from(length)) else {
            return reply.error(libc::EINVAL);
        };
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let how = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => Falloc::Reserve { keep_size },
            // Linux accepts a punch only with KEEP_SIZE.
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Falloc::PunchHole,
            libc::FALLOC_FL_ZERO_RANGE => Falloc::ZeroRange { keep_size },
            _ => return reply.error(libc::EOPNOTSUPP),
        };
        if ino == CONTROL_INO {
            return reply.error(libc::ENODEV);
        }
        try_reply!(reply, self.fs().fallocate(Ino(ino), off, len, how));
        reply.ok();
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        try_reply!(reply, self.fs().readdir(Ino(ino)));
        reply.opened(0, 0);
    }

    fn readdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory) {
        let entries = try_reply!(reply, self.fs().readdir(Ino(ino)));
        let dots = [
            (ino, fuser::FileType::Directory, b".".to_vec()),
            (ino, fuser::FileType::Directory, b"..".to_vec()),
        ];
        let all = dots.into_iter().chain(entries.into_iter().map(|e| (e.ino.0, kind(e.kind), e.name)));
        for (i, (child, k, name)) in all.enumerate().skip(offset.max(0) as usize) {
            if reply.add(child, i as i64 + 1, k, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let fs = self.fs();
        let (total, free) = fs.statfs();
        let files = fs.inode_count() as u64;
        reply.statfs(total / 4096, free / 4096, free / 4096, files + 1_000_000, 1_000_000, 4096, 255, 4096);
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        not_control!(reply, parent, name, libc::EEXIST);
        let perm = (mode & !umask & 0o7777) as u16;
        let a = try_reply!(reply, self.fs().create(Ino(parent), name.as_bytes(), perm, req.uid(), req.gid()));
        try_reply!(reply, self.fs().open_file(a.ino));
        reply.created(&TTL, &attr(&a), 0, 0, self.open_flags());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_before_1970_keep_their_nanoseconds() {
        for t in [
            UNIX_EPOCH - Duration::from_nanos(1),
            UNIX_EPOCH - Duration::new(5, 250_000_000),
            UNIX_EPOCH - Duration::from_secs(86_400),
            UNIX_EPOCH + Duration::new(3, 7),
        ] {
            assert_eq!(time(stamp(t)), t, "{t:?}");
        }
        assert_eq!(stamp(UNIX_EPOCH - Duration::from_nanos(1)), (-1, 999_999_999));
    }
}
