//! The FUSE adapter: kernel requests to the flash file system's operations, nothing more.

use std::ffi::OsStr;
use std::ops::{Deref, DerefMut};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::MutexGuard;

use crate::flash::Flash;
use bitmend_flashfs::{Attr, Falloc, FileType, Fs, FsError, Ino, PreparedWrite, SetAttr, XattrMode, ROOT};
use bitmend_media::nand::DataReader;
use fuser::{
    Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::scrubber::{lock, Mounted, Shared, CONTROL_INO, CONTROL_NAME};

const TTL: Duration = Duration::from_secs(1);

/// FUSE_HANDLE_KILLPRIV_V2 (protocol 7.33, Linux 5.11): the file system clears set-user-ID, set-group-ID and file capabilities itself on a write,
/// a truncate or a change of owner. Without it the kernel asks for `security.capability`
/// before every write, to see whether there is one to remove: a second round trip per
/// write (4,006 requests for 2,000 random 4 KiB writes). With it the kernel also marks the
/// mount SB_NOSEC.
const KILLPRIV_V2: InitFlags = InitFlags::FUSE_HANDLE_KILLPRIV_V2;

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
    /// Wakes the write-back thread when a write leaves dirty data past the limit.
    pub write_back: crate::write_back::Waker,
    /// The mount has an NVRAM tier, which holds every change durably before its request is
    /// answered: fsync has nothing to wait for, so it answers without the file system's lock
    /// (which write-back holds most of the time under a stream of writes).
    pub durable_on_answer: bool,
    /// Reads flash pages without the file system's lock (`Fs::plan_read`); None: every read
    /// goes through the lock (a chip that offers no reader).
    pub reader: Option<DataReader>,
    /// Serving a supervisor over a socket: the largest message it carries, which caps the
    /// requests and replies agreed at init.
    pub largest_message: Option<usize>,
    /// Serving a supervisor: each namespace operation is recorded in the tier with its
    /// request, and `done_before` holds the requests a recovery found done by a worker that
    /// died before answering them (they come again from the supervisor's journal, and are
    /// answered from the state, not done twice: docs/DESIGN.md, "The supervisor").
    pub tags_requests: bool,
    pub done_before: std::collections::HashSet<u64>,
}

/// Writes the file system out and lets go of the image, once the session is over (not in
/// `destroy`: see `fscmd::mount`). The scrubber and the committer stop when they find it gone.
pub fn write_out(shared: &Shared, nvram: Option<&std::path::Path>) {
    let fs = lock(shared).fs.take();
    if let Some(fs) = fs {
        crate::fault_points::at_write_out();
        match fs.unmount() {
            // Everything on flash, the tier checked out: its file holds nothing.
            Ok(chip) => {
                // Before the image is let go: `bitmend umount` takes a tier file still there
                // once the image is free for a write-out that did not finish.
                if let Some(p) = nvram {
                    let _ = std::fs::remove_file(p);
                }
                drop(chip);
            }
            Err(e) => eprintln!("bitmend: unmount: {e}"),
        }
    }
}

/// The file system, locked for one request.
struct Locked<'a>(MutexGuard<'a, Mounted>);

impl Deref for Locked<'_> {
    type Target = Fs<Flash>;
    fn deref(&self) -> &Fs<Flash> {
        self.0.fs.as_ref().expect("mounted")
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Fs<Flash> {
        self.0.fs.as_mut().expect("mounted")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if let Some(fs) = self.0.fs.as_mut() {
            fs.set_request(None);
            // Between requests: the namespace back within its cache.
            fs.shed_namespace();
        }
    }
}

/// The errno a failed operation answers.
fn errno_of(e: &bitmend_flashfs::FsError) -> Errno {
    let in_memory =
        matches!(e, bitmend_flashfs::FsError::Corrupt(bitmend_flashfs::Corruption::InMemory { .. }));
    crate::worker::stop_if_memory_failed(e, in_memory);
    Errno::from_i32(e.errno())
}

/// Whether `name` in `parent` is the control file, which no operation may create, remove or
/// rename.
fn is_control(parent: INodeNo, name: &OsStr) -> bool {
    parent.0 == ROOT.0 && name.as_bytes() == CONTROL_NAME
}

/// The control file's attributes: a regular file owned as the root directory is, as long as
/// the status it reads.
fn control_attr(len: usize, owner: (u32, u32)) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(CONTROL_INO),
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
        reply.error(Errno::ERANGE);
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
        ino: INodeNo(a.ino.0),
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
    fn open_flags(&self) -> FopenFlags {
        if self.direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        }
    }

    fn fs(&self) -> Locked<'_> {
        Locked(lock(&self.shared))
    }

    /// The file system locked for a request that changes the namespace: under a supervisor,
    /// its nodes are recorded with the request.
    fn fs_for(&self, req: &Request) -> Locked<'_> {
        let mut l = self.fs();
        if self.tags_requests {
            l.set_request(Some(req.unique().0));
        }
        l
    }

    /// Whether a worker before this one did `req` (recorded in the tier with its nodes).
    fn done_before(&self, req: &Request) -> bool {
        self.done_before.contains(&req.unique().0)
    }

    /// The answer to a request that made `name` in `parent`, done before: the entry as it is.
    fn entry_done_before(&self, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.fs().lookup(Ino(parent.0), name.as_bytes());
        match found {
            Ok(a) => reply.entry(&TTL, &self.file_attr(&a), Generation(0)),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    /// The attributes the kernel gets: `st_blocks` is what the file stores (holes are not
    /// blocks), not its size.
    fn file_attr(&self, a: &Attr) -> FileAttr {
        FileAttr { blocks: self.fs().stored_blocks(a.ino), ..attr(a) }
    }

    /// A read planned under the lock, its flash pages read and checked without it, and
    /// finished under it only for pages whose check failed (docs/DESIGN.md, "Reads without
    /// the lock"). With --direct-io the kernel keeps no copy, so the pages read go into the
    /// daemon's cache, as a read under the lock puts them.
    fn read_unlocked(
        &self,
        reader: &DataReader,
        ino: Ino,
        offset: u64,
        size: usize,
    ) -> Result<Vec<u8>, FsError> {
        let mut plan = self.fs().plan_read(ino, offset, size)?;
        if plan.pending() == 0 {
            return Ok(plan.into_bytes().unwrap_or_default());
        }
        if self.direct_io {
            plan.keep_checked();
        }
        plan.read_unlocked(reader);
        if self.direct_io {
            self.fs().cache_checked(&mut plan);
        }
        match plan.into_bytes() {
            Ok(bytes) => Ok(bytes),
            Err(rest) => self.fs().finish_read(rest),
        }
    }

    fn control(&self) -> FileAttr {
        let mut m = lock(&self.shared);
        let owner = m.fs.as_mut().and_then(|fs| fs.getattr(ROOT).ok()).map_or((0, 0), |a| (a.uid, a.gid));
        control_attr(m.status().len(), owner)
    }
}

/// Refuses an operation on the control file's name.
macro_rules! not_control {
    ($reply:expr, $parent:expr, $name:expr, $errno:expr) => {
        if is_control($parent, $name) {
            return $reply.error(Errno::from_i32($errno));
        }
    };
}

macro_rules! try_reply {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(errno_of(&e)),
        }
    };
}

impl Filesystem for FuseFs {
    /// Requests of up to 1 MiB (fuser asks for the kernel's largest, FUSE_MAX_PAGES), the
    /// writeback cache if the mount asked for it, and privileges dropped by us.
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        if self.writeback_cache {
            config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .map_err(|_| std::io::Error::other("the kernel offers no writeback cache"))?;
        }
        // An older kernel does not offer it, and goes on asking for security.capability.
        self.drops_privileges = config.add_capabilities(KILLPRIV_V2).is_ok();
        if let Some(largest) = self.largest_message {
            // Whole pages, below the largest message less a header.
            let cap = (largest.saturating_sub(4096) / 4096 * 4096).clamp(4096, 1 << 20) as u32;
            let _ = config.set_max_write(cap);
            if let Err(most) = config.set_max_readahead(cap) {
                let _ = config.set_max_readahead(most);
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        crate::fault_points::at("lookup", &self.shared);
        if is_control(parent, name) {
            return reply.entry(&Duration::ZERO, &self.control(), Generation(0));
        }
        let a = try_reply!(reply, self.fs().lookup(Ino(parent.0), name.as_bytes()));
        reply.entry(&TTL, &self.file_attr(&a), Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        crate::fault_points::at("getattr", &self.shared);
        if ino.0 == CONTROL_INO {
            return reply.attr(&Duration::ZERO, &self.control());
        }
        let a = try_reply!(reply, self.fs().getattr(Ino(ino.0)));
        reply.attr(&TTL, &self.file_attr(&a));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        crate::fault_points::at("setattr", &self.shared);
        if ino.0 == CONTROL_INO {
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
        let a = try_reply!(reply, self.fs().setattr(Ino(ino.0), set));
        // With KILLPRIV_V2 the kernel leaves this to us: a change of owner always drops an
        // executable's privileges; a truncate does unless the caller has CAP_FSETID, which
        // fuser does not pass on (FATTR_KILL_SUIDGID): root is taken to have it.
        let owner = uid.is_some() || gid.is_some();
        let truncated = size.is_some() && req.uid() != 0;
        if self.drops_privileges && a.kind != FileType::Dir && (owner || truncated) {
            try_reply!(reply, self.fs().drop_privileges(Ino(ino.0)));
            let a = try_reply!(reply, self.fs().getattr(Ino(ino.0)));
            return reply.attr(&TTL, &self.file_attr(&a));
        }
        reply.attr(&TTL, &self.file_attr(&a));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let t = try_reply!(reply, self.fs().readlink(Ino(ino.0)));
        reply.data(&t);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        crate::fault_points::at("mknod", &self.shared);
        not_control!(reply, parent, name, libc::EEXIST);
        let k = match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::File,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            _ => return reply.error(Errno::EINVAL),
        };
        if self.done_before(req) {
            return self.entry_done_before(parent, name, reply);
        }
        let perm = (mode & !umask & 0o7777) as u16;
        let a = try_reply!(
            reply,
            self.fs_for(req).mknod(Ino(parent.0), name.as_bytes(), k, perm, rdev, (req.uid(), req.gid()))
        );
        reply.entry(&TTL, &self.file_attr(&a), Generation(0));
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        crate::fault_points::at("mkdir", &self.shared);
        not_control!(reply, parent, name, libc::EEXIST);
        if self.done_before(req) {
            return self.entry_done_before(parent, name, reply);
        }
        let perm = (mode & !umask & 0o7777) as u16;
        let a = try_reply!(
            reply,
            self.fs_for(req).mkdir(Ino(parent.0), name.as_bytes(), perm, req.uid(), req.gid())
        );
        reply.entry(&TTL, &self.file_attr(&a), Generation(0));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        crate::fault_points::at("unlink", &self.shared);
        not_control!(reply, parent, name, libc::EPERM);
        if self.done_before(req) {
            return reply.ok();
        }
        try_reply!(reply, self.fs_for(req).unlink(Ino(parent.0), name.as_bytes()));
        reply.ok();
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        crate::fault_points::at("rmdir", &self.shared);
        not_control!(reply, parent, name, libc::ENOTDIR);
        if self.done_before(req) {
            return reply.ok();
        }
        try_reply!(reply, self.fs_for(req).rmdir(Ino(parent.0), name.as_bytes()));
        reply.ok();
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        crate::fault_points::at("symlink", &self.shared);
        not_control!(reply, parent, link_name, libc::EEXIST);
        if self.done_before(req) {
            return self.entry_done_before(parent, link_name, reply);
        }
        let a = try_reply!(
            reply,
            self.fs_for(req).symlink(
                Ino(parent.0),
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
                req.uid(),
                req.gid()
            )
        );
        reply.entry(&TTL, &self.file_attr(&a), Generation(0));
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        crate::fault_points::at("rename", &self.shared);
        not_control!(reply, parent, name, libc::EPERM);
        not_control!(reply, newparent, newname, libc::EPERM);
        if self.done_before(req) {
            return reply.ok();
        }
        // Exchange and whiteout (an overlayfs upper layer's) are not supported: refused, never
        // done as a plain rename.
        if flags.bits() & !RenameFlags::RENAME_NOREPLACE.bits() != 0 {
            return reply.error(Errno::EINVAL);
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE)
            && self.fs().lookup(Ino(newparent.0), newname.as_bytes()).is_ok()
        {
            return reply.error(Errno::EEXIST);
        }
        try_reply!(
            reply,
            self.fs_for(req).rename(Ino(parent.0), name.as_bytes(), Ino(newparent.0), newname.as_bytes())
        );
        reply.ok();
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        crate::fault_points::at("link", &self.shared);
        not_control!(reply, newparent, newname, libc::EEXIST);
        if self.done_before(req) {
            return self.entry_done_before(newparent, newname, reply);
        }
        let a = try_reply!(reply, self.fs_for(req).link(Ino(ino.0), Ino(newparent.0), newname.as_bytes()));
        reply.entry(&TTL, &self.file_attr(&a), Generation(0));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        crate::fault_points::at("open", &self.shared);
        if ino.0 == CONTROL_INO {
            // Direct I/O: every read asks again, so the status is never a cached one.
            return reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        }
        try_reply!(reply, self.fs().open_file(Ino(ino.0)));
        reply.opened(FileHandle(0), self.open_flags());
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        crate::fault_points::at("release", &self.shared);
        if ino.0 == CONTROL_INO {
            return reply.ok();
        }
        self.fs().release_file(Ino(ino.0));
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        crate::fault_points::at("read", &self.shared);
        if ino.0 == CONTROL_INO {
            let status = lock(&self.shared).status().into_bytes();
            let from = usize::try_from(offset).unwrap_or(usize::MAX).min(status.len());
            let to = (from + size as usize).min(status.len());
            return reply.data(&status[from..to]);
        }
        let data = match &self.reader {
            Some(reader) => try_reply!(reply, self.read_unlocked(reader, Ino(ino.0), offset, size as usize)),
            None => try_reply!(reply, self.fs().read(Ino(ino.0), offset, size as usize)),
        };
        reply.data(&data);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        crate::fault_points::at("write", &self.shared);
        if ino.0 == CONTROL_INO {
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
                // `flip-inode INO BIT`: a memory error in an inode, in a test build only
                // (`--features fault-points`).
                command if cfg!(feature = "fault-points") && command.starts_with(b"flip-inode ") => {
                    match lock(&self.shared).flip_inode(command) {
                        Some(true) => reply.written(data.len() as u32),
                        Some(false) => reply.error(Errno::ENOENT),
                        None => reply.error(Errno::EINVAL),
                    }
                }
                // `flip INO PAGE BIT`: a memory error in a cached page (tests, the demo).
                // ENODATA if the page is not in the daemon's memory.
                command => match lock(&self.shared).flip(command) {
                    Some(bitmend_flashfs::Cached::No) => reply.error(Errno::ENODATA),
                    Some(_) => reply.written(data.len() as u32),
                    None => reply.error(Errno::EINVAL),
                },
            };
        }
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            try_reply!(reply, self.fs().drop_privileges(Ino(ino.0)));
        }
        // Whole pages are copied and checksummed before the lock, and put in the NVRAM tier
        // after it (the tier's own lock, taken under the file system's, keeps the order).
        let prepared = PreparedWrite::new(offset, data);
        let (n, due, tier) = {
            let mut fs = self.fs();
            self.write_back.wait_for_room(&mut fs.0);
            let (n, tier) = try_reply!(reply, fs.write_staged(Ino(ino.0), prepared));
            (n, fs.write_back_due() || fs.clean_due(), tier)
        };
        if let Some(tier) = tier {
            if let Err(e) = tier.finish(data) {
                // Full: synced to flash instead; failed: an error. Either under the lock.
                try_reply!(reply, self.fs().tier_outcome(Err(e)));
            }
        }
        reply.written(n as u32);
        if due {
            self.write_back.wake();
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        crate::fault_points::at("fsync", &self.shared);
        if ino.0 == CONTROL_INO || self.durable_on_answer {
            return reply.ok();
        }
        try_reply!(reply, self.fs().fsync(Ino(ino.0)));
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        if self.durable_on_answer {
            return reply.ok();
        }
        try_reply!(reply, self.fs().fsync(Ino(ino.0)));
        reply.ok();
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if ino.0 == CONTROL_INO {
            return reply.error(Errno::EPERM);
        }
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        if self.done_before(req) {
            return reply.ok();
        }
        try_reply!(reply, self.fs_for(req).setxattr(Ino(ino.0), name.as_bytes(), value, mode));
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if ino.0 == CONTROL_INO {
            return reply.error(Errno::ENODATA);
        }
        let value = try_reply!(reply, self.fs().getxattr(Ino(ino.0), name.as_bytes()));
        xattr_reply(reply, size, &value);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if ino.0 == CONTROL_INO {
            return xattr_reply(reply, size, &[]);
        }
        let names = try_reply!(reply, self.fs().listxattr(Ino(ino.0)));
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

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if ino.0 == CONTROL_INO {
            return reply.error(Errno::ENODATA);
        }
        if self.done_before(req) {
            return reply.ok();
        }
        try_reply!(reply, self.fs_for(req).removexattr(Ino(ino.0), name.as_bytes()));
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // What fallocate(2) takes as signed: past i64::MAX it was negative.
        if i64::try_from(offset).is_err() || i64::try_from(length).is_err() {
            return reply.error(Errno::EINVAL);
        }
        let (off, len) = (offset, length);
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let how = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => Falloc::Reserve { keep_size },
            // Linux accepts a punch only with KEEP_SIZE.
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Falloc::PunchHole,
            libc::FALLOC_FL_ZERO_RANGE => Falloc::ZeroRange { keep_size },
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        if ino.0 == CONTROL_INO {
            return reply.error(Errno::ENODEV);
        }
        try_reply!(reply, self.fs().fallocate(Ino(ino.0), off, len, how));
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        try_reply!(reply, self.fs().readdir(Ino(ino.0)));
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        crate::fault_points::at("readdir", &self.shared);
        let entries = try_reply!(reply, self.fs().readdir(Ino(ino.0)));
        let dots = [
            (ino, fuser::FileType::Directory, b".".to_vec()),
            (ino, fuser::FileType::Directory, b"..".to_vec()),
        ];
        let all =
            dots.into_iter().chain(entries.into_iter().map(|e| (INodeNo(e.ino.0), kind(e.kind), e.name)));
        for (i, (child, k, name)) in all.enumerate().skip(usize::try_from(offset).unwrap_or(usize::MAX)) {
            if reply.add(child, i as u64 + 1, k, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let fs = self.fs();
        let (total, free) = fs.statfs();
        let (files, ffree) = (fs.inode_count() as u64, fs.free_inodes());
        reply.statfs(total / 4096, free / 4096, free / 4096, files + ffree, ffree, 4096, 255, 4096);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        crate::fault_points::at("create", &self.shared);
        not_control!(reply, parent, name, libc::EEXIST);
        let perm = (mode & !umask & 0o7777) as u16;
        let a = if self.done_before(req) {
            try_reply!(reply, self.fs().lookup(Ino(parent.0), name.as_bytes()))
        } else {
            try_reply!(
                reply,
                self.fs_for(req).create(Ino(parent.0), name.as_bytes(), perm, req.uid(), req.gid())
            )
        };
        try_reply!(reply, self.fs().open_file(a.ino));
        reply.created(&TTL, &self.file_attr(&a), Generation(0), FileHandle(0), self.open_flags());
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
