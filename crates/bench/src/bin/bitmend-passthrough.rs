//! `bitmend-passthrough DIR MOUNTPOINT`: mounts DIR at MOUNTPOINT through FUSE, doing nothing
//! but forwarding each request to DIR's own file system. With DIR on tmpfs it is the floor of
//! a FUSE file system on this machine: the kernel round trips and copies bitmend's mount pays
//! too, with no storage work behind them. It uses the same FUSE library (fuser), the same
//! session (two request threads, a /dev/fuse descriptor each; `--threads N` to change) and
//! the same mount options as `bitmend mount`, so that `scripts/fuse-perf.sh` compares file
//! system work, not plumbing.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::from_secs(1);

struct Passthrough {
    root_ino: u64,
    /// One lock, held only to look a path or a file up (never across the I/O).
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Inode number (the underlying one; 1 for the root) to path under the source directory.
    paths: HashMap<u64, PathBuf>,
    files: HashMap<u64, Arc<File>>,
    next_fh: u64,
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

macro_rules! try_io {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(errno(&e)),
        }
    };
}

fn time(s: i64, ns: i64) -> SystemTime {
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, ns as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(s.unsigned_abs())
    }
}

impl Passthrough {
    fn ino(&self, m: &fs::Metadata) -> INodeNo {
        INodeNo(if m.ino() == self.root_ino { 1 } else { m.ino() })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn attr(&self, m: &fs::Metadata) -> FileAttr {
        let t = m.file_type();
        let kind = if t.is_dir() {
            FileType::Directory
        } else if t.is_symlink() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        FileAttr {
            ino: self.ino(m),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: time(m.ctime(), m.ctime_nsec()),
            kind,
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, std::io::Error> {
        self.state().paths.get(&ino.0).cloned().ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESTALE))
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, std::io::Error> {
        Ok(self.path(parent)?.join(name))
    }

    /// Stats `path` and remembers it under its inode number.
    fn entry(&self, path: PathBuf) -> Result<FileAttr, std::io::Error> {
        let m = fs::symlink_metadata(&path)?;
        let a = self.attr(&m);
        self.state().paths.insert(a.ino.0, path);
        Ok(a)
    }

    fn keep(&self, f: File) -> FileHandle {
        let mut st = self.state();
        st.next_fh += 1;
        let fh = st.next_fh;
        st.files.insert(fh, Arc::new(f));
        FileHandle(fh)
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, std::io::Error> {
        self.state().files.get(&fh.0).cloned().ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))
    }
}

fn open_options(flags: i32) -> OpenOptions {
    let mut o = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => o.write(true),
        libc::O_RDWR => o.read(true).write(true),
        _ => o.read(true),
    };
    // The kernel handles O_APPEND by sending the right offsets; O_CREAT/O_TRUNC come as
    // create/setattr requests.
    o.custom_flags(
        flags & !(libc::O_ACCMODE | libc::O_APPEND | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL),
    );
    o
}

impl Filesystem for Passthrough {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = try_io!(reply, self.child(parent, name));
        let a = try_io!(reply, self.entry(path));
        reply.entry(&TTL, &a, Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let m = match fh.and_then(|fh| self.file(fh).ok()) {
            Some(f) => try_io!(reply, f.metadata()),
            None => try_io!(reply, self.path(ino).and_then(fs::symlink_metadata)),
        };
        reply.attr(&TTL, &self.attr(&m));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let path = try_io!(reply, self.path(ino));
        if let Some(mode) = mode {
            try_io!(reply, fs::set_permissions(&path, fs::Permissions::from_mode(mode)));
        }
        if let Some(size) = size {
            match fh.and_then(|fh| self.file(fh).ok()) {
                Some(f) => try_io!(reply, f.set_len(size)),
                None => {
                    try_io!(reply, OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(size)))
                }
            }
        }
        if atime.is_some() || mtime.is_some() {
            let t = |t: Option<TimeOrNow>| match t {
                None => None,
                Some(TimeOrNow::Now) => Some(SystemTime::now()),
                Some(TimeOrNow::SpecificTime(t)) => Some(t),
            };
            let f = try_io!(reply, File::open(&path));
            let mut times = fs::FileTimes::new();
            if let Some(a) = t(atime) {
                times = times.set_accessed(a);
            }
            if let Some(m) = t(mtime) {
                times = times.set_modified(m);
            }
            try_io!(reply, f.set_times(times));
        }
        let m = try_io!(reply, fs::symlink_metadata(&path));
        reply.attr(&TTL, &self.attr(&m));
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let path = try_io!(reply, self.child(parent, name));
        try_io!(reply, fs::create_dir(&path));
        try_io!(reply, fs::set_permissions(&path, fs::Permissions::from_mode(mode & !umask)));
        let a = try_io!(reply, self.entry(path));
        reply.entry(&TTL, &a, Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = try_io!(reply, self.child(parent, name));
        try_io!(reply, fs::remove_file(path));
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = try_io!(reply, self.child(parent, name));
        try_io!(reply, fs::remove_dir(path));
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let from = try_io!(reply, self.child(parent, name));
        let to = try_io!(reply, self.child(newparent, newname));
        try_io!(reply, fs::rename(&from, &to));
        // A renamed directory moves its children's paths too: forget them (lookups refill).
        let ino = try_io!(reply, self.entry(to.clone())).ino.0;
        self.state().paths.retain(|&i, p| i == ino || i == 1 || !p.starts_with(&from));
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let path = try_io!(reply, self.path(ino));
        let f = try_io!(reply, open_options(flags.0).open(path));
        let fh = self.keep(f);
        reply.opened(fh, FopenFlags::empty());
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let path = try_io!(reply, self.child(parent, name));
        let mut o = open_options(flags);
        o.create(true).write(true).mode(mode & !umask);
        let f = try_io!(reply, o.open(&path));
        let a = try_io!(reply, self.entry(path));
        let fh = self.keep(f);
        reply.created(&TTL, &a, Generation(0), fh, FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let f = try_io!(reply, self.file(fh));
        let mut buf = vec![0u8; size as usize];
        let mut n = 0;
        while n < buf.len() {
            match f.read_at(&mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let f = try_io!(reply, self.file(fh));
        try_io!(reply, f.write_all_at(data, offset));
        reply.written(data.len() as u32);
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

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.state().files.remove(&fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let f = try_io!(reply, self.file(fh));
        try_io!(reply, if datasync { f.sync_data() } else { f.sync_all() });
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let path = try_io!(reply, self.path(ino));
        let mut all =
            vec![(ino, FileType::Directory, OsString::from(".")), (ino, FileType::Directory, "..".into())];
        for e in try_io!(reply, fs::read_dir(&path)) {
            let e = try_io!(reply, e);
            let m = try_io!(reply, e.metadata());
            let a = self.attr(&m);
            all.push((a.ino, a.kind, e.file_name()));
        }
        for (i, (child, kind, name)) in
            all.iter().enumerate().skip(usize::try_from(offset).unwrap_or(usize::MAX))
        {
            if reply.add(*child, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The source's real figures would take an unsafe statvfs call; fio and PostMark do
        // not ask, so report a fixed 16 GiB free.
        reply.statfs(1 << 22, 1 << 22, 1 << 22, 1 << 20, 1 << 20, 4096, 255, 4096);
    }
}

fn main() {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut threads = 2;
    if args.len() == 4 && args[0] == "--threads" {
        threads = match args[1].to_str().and_then(|t| t.parse().ok()).filter(|&t| (1..=64).contains(&t)) {
            Some(t) => t,
            None => {
                eprintln!("bitmend-passthrough: --threads takes 1 to 64");
                std::process::exit(2);
            }
        };
        args.drain(..2);
    }
    if args.len() != 2 || args[0] == "--help" || args[0] == "-h" {
        eprintln!(
            "usage: bitmend-passthrough [--threads N] DIR MOUNTPOINT  (foreground; unmount with fusermount3 -u)"
        );
        eprintln!("Mounts DIR through FUSE unchanged: the FUSE overhead floor for bitmend's mount.");
        std::process::exit(2);
    }
    let source = Path::new(&args[0]);
    let root = match fs::canonicalize(source).and_then(|p| fs::metadata(&p).map(|m| (p, m))) {
        Ok((p, m)) if m.is_dir() => (p, m),
        Ok(_) => {
            eprintln!("bitmend-passthrough: {} is not a directory", source.display());
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("bitmend-passthrough: {}: {e}", source.display());
            std::process::exit(1);
        }
    };
    let fs = Passthrough {
        root_ino: root.1.ino(),
        state: Mutex::new(State { paths: HashMap::from([(1, root.0.clone())]), ..State::default() }),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("passthrough:{}", root.0.display())),
        MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(threads);
    config.clone_fd = true;
    if let Err(e) = fuser::mount(fs, &args[1], &config) {
        eprintln!("bitmend-passthrough: mount {}: {e}", Path::new(&args[1]).display());
        std::process::exit(1);
    }
}
