//! The supervisor: the process that owns a mount, so that the mount outlives the worker
//! that serves it (Loris section V.D; docs/DESIGN.md, "The supervisor").
//!
//! It holds the /dev/fuse descriptor and relays each request to the worker over a socket
//! that keeps message boundaries (SOCK_SEQPACKET), recording it first in its journal; a
//! reply retires the request and goes to the kernel. When the worker dies, a new one is
//! started: it recovers the file system and its NVRAM tier as a mount does, is given the
//! kernel's original FUSE_INIT (whose reply is dropped: the kernel saw one), and is sent
//! every request still in the journal. The supervisor reads no request past its header and
//! does no file-system work, so it has little that can fail.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::fuse_mount::FuseMount;

/// Opcodes the supervisor must know: the handshake, and the requests no reply answers
/// (which are therefore never journaled).
const FUSE_FORGET: u32 = 2;
const FUSE_OPEN: u32 = 14;
const FUSE_RELEASE: u32 = 18;
const FUSE_CREATE: u32 = 35;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_NOTIFY_REPLY: u32 = 41;
const FUSE_BATCH_FORGET: u32 = 42;
/// fuse_in_header: len u32, opcode u32, unique u64, ...; fuse_out_header: len u32, error
/// i32, unique u64.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// The largest request or reply: the kernel's largest write (256 pages) and its header.
const MAX_MESSAGE: usize = (1 << 20) + 4096;
/// How many times a request is sent to a new worker before it is answered with EIO: a
/// request that kills every worker it reaches must not take the mount with it.
pub const MAX_TRIES: u32 = 3;
/// Workers that die before serving, or crash with requests sent to them and none answered,
/// in a row, before the supervisor gives up.
const MAX_FRUITLESS_STARTS: u32 = 5;
/// Workers SIGKILLed before they served, in a row, before the supervisor gives up (each
/// start after such a death waits longer, up to [`MAX_KILLED_WAIT`]).
const MAX_KILLED_STARTS: u32 = 50;
/// The longest wait before a start after workers were killed before serving: a program waits
/// through each, but a killer faster than a start on a loaded machine finds no worker to
/// kill while it lasts (docs/PERFORMANCE.md, "The supervisor", has the runs that chose it).
const MAX_KILLED_WAIT: Duration = Duration::from_secs(1);

/// How a worker died, as the supervisor judges its restarts.
#[derive(Clone, Copy, Debug)]
struct Death {
    /// It had taken the mount's FUSE_INIT.
    served: bool,
    /// By SIGKILL: from outside (an operator, the OOM killer), not of its own doing.
    killed: bool,
    /// Replies relayed so far, by any worker.
    answered: u64,
    /// Requests sent to it were waiting for answers.
    had_work: bool,
}

/// The restarts in a row that came to nothing.
#[derive(Default, Debug)]
struct Starts {
    fruitless: u32,
    killed_starting: u32,
    answered_before: u64,
}

impl Starts {
    /// After a worker's death: how long to wait before the next start, or why to stop.
    /// Fruitless: it died before it served, or by its own doing (a panic, an abort, a failed
    /// check) with requests sent to it and none answered. A worker killed from outside says
    /// nothing of whether workers can serve (on a loaded machine a killer can be faster
    /// than a start, or than a restart's first answer), and a request that gets every
    /// worker killed is answered EIO after MAX_TRIES anyway; killed before serving again and
    /// again, the starts slow down, and the mount stops after MAX_KILLED_STARTS.
    fn after(&mut self, d: Death) -> Result<Duration, String> {
        let answered = std::mem::replace(&mut self.answered_before, d.answered) < d.answered;
        if d.served && (d.killed || answered || !d.had_work) {
            (self.fruitless, self.killed_starting) = (0, 0);
            return Ok(Duration::ZERO);
        }
        if d.killed && !d.served {
            self.killed_starting += 1;
            if self.killed_starting > MAX_KILLED_STARTS {
                return Err(format!(
                    "{MAX_KILLED_STARTS} workers in a row were killed (SIGKILL) before they served"
                ));
            }
            return Ok(Duration::from_millis(10 << self.killed_starting.min(7)).min(MAX_KILLED_WAIT));
        }
        self.fruitless += 1;
        if self.fruitless > MAX_FRUITLESS_STARTS {
            return Err(format!(
                "{MAX_FRUITLESS_STARTS} workers in a row died before they served, or crashed with requests and no answer"
            ));
        }
        Ok(Duration::ZERO)
    }
}

/// A request recorded before the worker sees it.
struct Pending {
    bytes: Vec<u8>,
    opcode: u32,
    nodeid: u64,
    since: Instant,
    /// How many workers it was sent to.
    tries: u32,
    /// It waited across a restart (its wait counts toward the longest stall).
    replayed: bool,
}

/// What the supervisor counts (printed in its log, and at the end).
#[derive(Default)]
pub struct Counters {
    pub restarts: AtomicU64,
    pub replayed: AtomicU64,
    pub refused: AtomicU64,
    /// The longest a replayed request waited for its answer, in microseconds.
    pub longest_stall_us: AtomicU64,
    pub answered: AtomicU64,
}

pub struct Relay {
    dev: OwnedFd,
    /// The supervisor's end of the current worker's socket. Held while sending, so that a
    /// restart's replay and a new request never interleave.
    link: Mutex<Arc<OwnedFd>>,
    journal: Mutex<HashMap<u64, Pending>>,
    /// The kernel's FUSE_INIT, given again to every new worker.
    init: Mutex<Option<Vec<u8>>>,
    /// Open file handles per inode, as the answers to opens, creates and releases say: a
    /// new worker is told them (an unlinked file stays while the kernel holds it open).
    open: Mutex<HashMap<u64, u32>>,
    ended: AtomicBool,
    counters: Counters,
    /// The counters as the workers read them (`bitmend stat MOUNTPOINT`): a memory file
    /// every worker inherits.
    status: File,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn answered_by_reply(opcode: u32) -> bool {
    !matches!(opcode, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT | FUSE_NOTIFY_REPLY)
}

/// A socket pair that keeps message boundaries, with send buffers large enough for the
/// largest message when the system allows (root may exceed net.core.wmem_max).
fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into the array it is given.
    if unsafe {
        libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr())
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are owned by nobody else.
    let pair = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    for fd in [&pair.0, &pair.1] {
        let size: libc::c_int = (4 * MAX_MESSAGE) as libc::c_int;
        for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
            // SAFETY: setsockopt reads an int from a pointer valid for its size.
            let rc = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                break;
            }
        }
    }
    Ok(pair)
}

/// The largest message a socket can send (the worker caps its requests and replies by it).
pub fn largest_message(fd: RawFd) -> usize {
    let mut size: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes an int into a pointer valid for the length given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&mut size as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return 0;
    }
    // The kernel refuses a datagram longer than the buffer less 32 bytes.
    (size as usize).saturating_sub(64)
}

fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        // ENOENT: the request was interrupted before we read it (FUSE's "try again").
        if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::ENOENT)) {
            return Err(e);
        }
    }
}

fn send_message(fd: RawFd, b: &[u8]) -> io::Result<()> {
    // SAFETY: b is valid for reads of its length; MSG_NOSIGNAL: a dead worker is an error,
    // not a signal.
    let n = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn write_dev(fd: RawFd, b: &[u8]) {
    // SAFETY: b is valid for reads of its length. A reply the kernel no longer waits for
    // (ENOENT: interrupted, or the mount is gone) is dropped.
    let _ = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
}

impl Relay {
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Kernel to worker: each request journaled, then sent. Ends when the mount is gone.
    fn requests(&self) {
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let n = match read_fd(self.dev.as_raw_fd(), &mut buf) {
                Ok(n) if n >= IN_HEADER => n,
                Ok(_) => continue,
                Err(_) => return, // ENODEV: unmounted
            };
            let msg = &buf[..n];
            let (opcode, unique) = (u32_at(msg, 4), u64_at(msg, 8));
            if opcode == FUSE_INIT {
                *self.init.lock().expect("init") = Some(msg.to_vec());
            }
            let link = self.link.lock().expect("link");
            let journaled = answered_by_reply(opcode);
            if journaled {
                let nodeid = u64_at(msg, 16);
                let p = Pending {
                    bytes: msg.to_vec(),
                    opcode,
                    nodeid,
                    since: Instant::now(),
                    tries: 0,
                    replayed: false,
                };
                self.journal.lock().expect("journal").insert(unique, p);
            }
            // A dead worker: the request waits in the journal for the next one.
            if send_message(link.as_raw_fd(), msg).is_ok() && journaled {
                if let Some(p) = self.journal.lock().expect("journal").get_mut(&unique) {
                    p.tries += 1;
                }
            }
        }
    }

    /// Worker to kernel: each reply retires its request. Ends when the worker's end closes.
    fn replies(&self, link: Arc<OwnedFd>) {
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let n = match read_fd(link.as_raw_fd(), &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if n < OUT_HEADER {
                continue;
            }
            let unique = u64_at(&buf, 8);
            if unique == 0 {
                write_dev(self.dev.as_raw_fd(), &buf[..n]); // a notification
                continue;
            }
            // A second answer (the request was replayed after the first was sent) is dropped:
            // the kernel hears one answer per request.
            let Some(p) = self.journal.lock().expect("journal").remove(&unique) else { continue };
            if p.replayed {
                let waited = p.since.elapsed().as_micros() as u64;
                self.counters.longest_stall_us.fetch_max(waited, Ordering::Relaxed);
                self.publish();
            }
            self.counters.answered.fetch_add(1, Ordering::Relaxed);
            if u32_at(&buf, 4) == 0 {
                self.note_handles(&p, &buf[..n]);
            }
            write_dev(self.dev.as_raw_fd(), &buf[..n]);
        }
    }

    /// Writes the counters where the workers read them: restarts, replayed, refused, the
    /// longest stall in microseconds (u64 each, little-endian).
    fn publish(&self) {
        let c = &self.counters;
        let mut b = Vec::with_capacity(32);
        for v in [&c.restarts, &c.replayed, &c.refused, &c.longest_stall_us] {
            b.extend_from_slice(&v.load(Ordering::Relaxed).to_le_bytes());
        }
        let _ = self.status.write_all_at(&b, 0);
    }

    /// The open handles an answered open, create or release leaves.
    fn note_handles(&self, p: &Pending, reply: &[u8]) {
        let mut open = self.open.lock().expect("open");
        match p.opcode {
            FUSE_OPEN => *open.entry(p.nodeid).or_insert(0) += 1,
            // fuse_entry_out starts with the new inode's nodeid.
            FUSE_CREATE if reply.len() >= OUT_HEADER + 8 => {
                *open.entry(u64_at(reply, OUT_HEADER)).or_insert(0) += 1
            }
            FUSE_RELEASE => {
                if let Some(n) = open.get_mut(&p.nodeid) {
                    *n -= 1;
                    if *n == 0 {
                        open.remove(&p.nodeid);
                    }
                }
            }
            _ => {}
        }
    }

    /// `--serve-open`'s argument: the open handles per inode.
    fn held_open(&self) -> String {
        let open = self.open.lock().expect("open");
        open.iter().map(|(ino, n)| format!("{ino}:{n}")).collect::<Vec<_>>().join(",")
    }

    /// An EIO answer for a request no worker survives.
    fn refuse(&self, unique: u64) {
        let mut b = Vec::with_capacity(OUT_HEADER);
        b.extend_from_slice(&(OUT_HEADER as u32).to_le_bytes());
        b.extend_from_slice(&(-libc::EIO).to_le_bytes());
        b.extend_from_slice(&unique.to_le_bytes());
        write_dev(self.dev.as_raw_fd(), &b);
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
    }
}

/// A file in memory, closed on exec unless passed on.
fn status_file() -> io::Result<File> {
    // SAFETY: memfd_create with a NUL-terminated name returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"bitmend-supervisor".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just made and is owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    f.write_all_at(&[0u8; 32], 0)?;
    Ok(f)
}

/// A running worker, the threads carrying its replies, and the last line it said (its
/// messages pass through the supervisor's own).
struct Worker {
    child: Child,
    replies: Vec<JoinHandle<()>>,
    link: Arc<OwnedFd>,
    said: Arc<Mutex<String>>,
    /// It took the mount's FUSE_INIT and serves (false: it died, or was killed, first).
    ready: bool,
}

/// Why the supervisor stopped the mount, and the exit status to end with.
pub struct Stopped {
    pub why: String,
    pub code: u8,
}

fn stopped(why: impl Into<String>) -> Stopped {
    Stopped { why: why.into(), code: 1 }
}

/// Passes the worker's messages on, keeping the last.
fn relay_messages(from: std::process::ChildStderr) -> Arc<Mutex<String>> {
    use std::io::BufRead;
    let said = Arc::new(Mutex::new(String::new()));
    let last = said.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(from).lines().map_while(Result::ok) {
            eprintln!("{line}");
            *last.lock().expect("said") = line;
        }
    });
    said
}

/// How to start a worker: this program again, with the mount's arguments and the socket.
pub struct WorkerCommand {
    pub args: Vec<std::ffi::OsString>,
    pub threads: usize,
}

fn spawn_worker(relay: &Arc<Relay>, how: &WorkerCommand) -> io::Result<Worker> {
    let (ours, theirs) = socket_pair()?;
    let their_fd = theirs.as_raw_fd();
    let status_fd = relay.status.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(&how.args).arg("--serve-fd").arg(their_fd.to_string());
    cmd.arg("--serve-status-fd").arg(status_fd.to_string());
    let again = relay.init.lock().expect("init").is_some();
    if again {
        cmd.arg("--serve-again").arg("--serve-open").arg(relay.held_open());
    }
    // SAFETY: the closure only calls fcntl, async-signal-safe, on a descriptor that stays
    // open until the child has been spawned.
    unsafe {
        cmd.pre_exec(move || {
            for fd in [their_fd, status_fd] {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.stderr(std::process::Stdio::piped()).spawn()?;
    let said = relay_messages(child.stderr.take().expect("piped"));
    drop(theirs);
    let link = Arc::new(ours);
    // A restarted worker is given the kernel's handshake again; its answer is not the
    // kernel's to hear. One that dies first (or refuses it, and is killed) is a crash like
    // any other: the caller starts another.
    if let Some(init) = relay.init.lock().expect("init").clone() {
        let mut buf = vec![0u8; 4096];
        let answered = send_message(link.as_raw_fd(), &init)
            .and_then(|()| read_fd(link.as_raw_fd(), &mut buf))
            .is_ok_and(|n| n >= OUT_HEADER && u32_at(&buf, 4) == 0);
        if !answered {
            let _ = child.kill();
            return Ok(Worker { child, replies: Vec::new(), link, said, ready: false });
        }
    }
    let replies = (0..how.threads.max(1))
        .map(|_| {
            let (r, l) = (relay.clone(), link.clone());
            std::thread::spawn(move || r.replies(l))
        })
        .collect();
    Ok(Worker { child, replies, link, said, ready: true })
}

/// Sends the journal, oldest first, to the worker behind `link` (held by the caller);
/// a request sent to MAX_TRIES workers is answered with EIO instead.
fn replay(relay: &Relay, link: &OwnedFd) -> usize {
    // Taken out under the journal's lock and sent after it: a send may wait for the worker
    // to read, and the worker for its replies to be taken, which needs the lock.
    let mut out = Vec::new();
    {
        let mut journal = relay.journal.lock().expect("journal");
        let mut uniques: Vec<u64> = journal.keys().copied().collect();
        uniques.sort_unstable();
        for u in uniques {
            let p = journal.get_mut(&u).expect("listed");
            if p.tries >= MAX_TRIES {
                journal.remove(&u);
                relay.refuse(u);
                continue;
            }
            p.replayed = true;
            out.push((u, p.bytes.clone()));
        }
    }
    let mut sent = 0;
    for (u, m) in &out {
        // A try counts once the worker has it: one that died before does not count.
        if send_message(link.as_raw_fd(), m).is_ok() {
            if let Some(p) = relay.journal.lock().expect("journal").get_mut(u) {
                p.tries += 1;
            }
            sent += 1;
        }
    }
    relay.counters.replayed.fetch_add(sent as u64, Ordering::Relaxed);
    sent
}

/// Why a worker ended, as the supervisor acts on it.
enum Ended {
    /// Exited 0 after its connection closed: the mount is over.
    Done,
    /// Killed by a signal or a panic (exit status 101): start another.
    Crashed(String),
    /// Exited with an error of its own (its recovery refused the image or the tier): the
    /// supervisor stops the mount rather than guess.
    Failed(i32),
}

fn ended(status: std::process::ExitStatus) -> Ended {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => Ended::Done,
        (Some(101), _) => Ended::Crashed("panicked".into()),
        (Some(crate::worker::MEMORY_FAILED), _) => {
            Ended::Crashed("stopped: its memory failed a check".into())
        }
        (Some(c), _) => Ended::Failed(c),
        (None, Some(s)) => Ended::Crashed(format!("killed by signal {s}")),
        (None, None) => Ended::Crashed("ended".into()),
    }
}

/// After `worker` died of `how_` (its exit `status`) while serving: starts the next, which
/// answers the requests the journal holds, or says why the mount must stop.
fn take_over(
    relay: &Arc<Relay>,
    how: &WorkerCommand,
    starts: &mut Starts,
    worker: &mut Worker,
    (status, how_): (std::process::ExitStatus, &str),
) -> Result<(), Stopped> {
    let began = Instant::now();
    let death = Death {
        served: worker.ready,
        killed: std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGKILL),
        answered: relay.counters.answered.load(Ordering::Relaxed),
        had_work: relay.journal.lock().expect("journal").values().any(|p| p.tries > 0),
    };
    std::thread::sleep(starts.after(death).map_err(stopped)?);
    relay.counters.restarts.fetch_add(1, Ordering::Relaxed);
    *worker = spawn_worker(relay, how).map_err(|e| stopped(format!("restarting the worker: {e}")))?;
    let mut link = relay.link.lock().expect("link");
    *link = worker.link.clone();
    if !worker.ready {
        // Died before it served: the journal waits for the next one.
        eprintln!(
            "bitmend: the worker {how_}; a new one (pid {}) did not answer the handshake ({} ms)",
            worker.child.id(),
            began.elapsed().as_millis()
        );
        return Ok(());
    }
    let sent = replay(relay, &link);
    drop(link);
    relay.publish();
    eprintln!(
        "bitmend: the worker {how_}; a new one (pid {}) took over in {} ms, {sent} requests replayed",
        worker.child.id(),
        began.elapsed().as_millis()
    );
    Ok(())
}

/// Serves `mount` until it is unmounted (or `stop` is set, which unmounts it): starts the
/// first worker, relays, restarts workers that crash. Returns the counters, or why the
/// mount was stopped.
pub fn supervise(mount: FuseMount, how: WorkerCommand, stop: &AtomicBool) -> Result<Arc<Relay>, Stopped> {
    let relay = Arc::new(Relay {
        dev: mount.dev.try_clone().map_err(|e| stopped(format!("/dev/fuse: {e}")))?,
        link: Mutex::new(Arc::new(socket_pair().map_err(|e| stopped(e.to_string()))?.0)),
        journal: Mutex::new(HashMap::new()),
        init: Mutex::new(None),
        open: Mutex::new(HashMap::new()),
        status: status_file().map_err(|e| stopped(format!("a memory file for the counters: {e}")))?,
        ended: AtomicBool::new(false),
        counters: Counters::default(),
    });
    let mut worker = spawn_worker(&relay, &how).map_err(|e| stopped(format!("starting the worker: {e}")))?;
    *relay.link.lock().expect("link") = worker.link.clone();
    let readers: Vec<JoinHandle<()>> = (0..how.threads.max(1))
        .map(|_| {
            let r = relay.clone();
            std::thread::spawn(move || r.requests())
        })
        .collect();
    let mut starts = Starts::default();
    let mut writing_out = 0;
    let mut unmounted = false;
    let outcome = loop {
        if stop.load(Ordering::SeqCst) && !unmounted {
            unmounted = true;
            if let Err(e) = mount.unmount() {
                eprintln!("bitmend: unmount: {e}");
            }
        }
        if readers.iter().all(|r| r.is_finished()) && !relay.ended.swap(true, Ordering::SeqCst) {
            // The mount is gone: the worker's connection ends, it writes out and exits.
            // SAFETY: shutdown on a descriptor we own.
            unsafe { libc::shutdown(worker.link.as_raw_fd(), libc::SHUT_RDWR) };
        }
        let status = match worker.child.try_wait() {
            Ok(Some(s)) => s,
            Ok(None) => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => break Err(stopped(format!("waiting for the worker: {e}"))),
        };
        for r in worker.replies.drain(..) {
            let _ = r.join(); // the dead worker's last answers reach the kernel first
        }
        match ended(status) {
            Ended::Done if relay.ended.load(Ordering::SeqCst) => break Ok(()),
            Ended::Done => break Err(stopped("the worker ended while the mount was in use")),
            Ended::Failed(code) => {
                // Its own words: why its recovery refused the image or the tier.
                let said = worker.said.lock().expect("said").clone();
                let why = said.strip_prefix("bitmend: ").unwrap_or(&said).to_string();
                break Err(Stopped { why, code: u8::try_from(code).unwrap_or(1) });
            }
            Ended::Crashed(how_) if relay.ended.load(Ordering::SeqCst) => {
                // The tier holds every acknowledged write: a new worker recovers it and writes
                // it out. One that cannot, again and again, leaves it to the next mount.
                writing_out += 1;
                if writing_out > MAX_FRUITLESS_STARTS {
                    break Err(stopped(format!(
                        "the worker {how_} while writing out, {writing_out} times in a row; the NVRAM \
                         tier keeps every acknowledged write, and the next mount applies them"
                    )));
                }
                eprintln!("bitmend: the worker {how_} while writing out; a new one writes out from the tier");
                worker = match spawn_worker(&relay, &how) {
                    Ok(w) => w,
                    Err(e) => break Err(stopped(format!("restarting the worker to write out: {e}"))),
                };
                // It answers the handshake, finds its connection ended, writes out and exits.
                // SAFETY: shutdown on a descriptor we own.
                unsafe { libc::shutdown(worker.link.as_raw_fd(), libc::SHUT_RDWR) };
            }
            Ended::Crashed(how_) => {
                if let Err(e) = take_over(&relay, &how, &mut starts, &mut worker, (status, &how_)) {
                    break Err(e);
                }
            }
        }
    };
    if outcome.is_err() {
        if !unmounted {
            let _ = mount.unmount();
        }
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        // The readers are not waited for: a program still holding a file keeps the lazily
        // unmounted connection, and its requests are ended (ENOTCONN) when this process
        // exits with the last /dev/fuse descriptor.
        return outcome.map(|_| relay);
    }
    for r in readers {
        let _ = r.join();
    }
    outcome.map(|_| relay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn death(served: bool, killed: bool, answered: u64, had_work: bool) -> Death {
        Death { served, killed, answered, had_work }
    }

    #[test]
    fn restarts_stop_only_when_workers_cannot_serve() {
        // Crashing on requests and answering none: the sixth in a row stops the mount.
        let mut s = Starts::default();
        for _ in 0..MAX_FRUITLESS_STARTS {
            assert_eq!(s.after(death(true, false, 0, true)), Ok(Duration::ZERO));
        }
        assert!(s.after(death(true, false, 0, true)).unwrap_err().contains("crashed with requests"));
        // An answer between resets the count; so does a death with nothing to answer.
        let mut s = Starts::default();
        for i in 0..3 * MAX_FRUITLESS_STARTS as u64 {
            assert!(s.after(death(true, false, i / 2, i % 3 != 0)).is_ok(), "death {i}");
        }
        // Killed from outside while serving, however often, with work waiting: never stops.
        let mut s = Starts::default();
        for _ in 0..1000 {
            assert_eq!(s.after(death(true, true, 0, true)), Ok(Duration::ZERO));
        }
        // Killed before serving: each start waits longer, up to MAX_KILLED_WAIT, then it stops.
        let mut s = Starts::default();
        let waits: Vec<Duration> =
            (0..MAX_KILLED_STARTS).map(|_| s.after(death(false, true, 0, true)).unwrap()).collect();
        assert!(waits.windows(2).all(|w| w[0] <= w[1]) && waits[0] > Duration::ZERO);
        assert_eq!(*waits.last().unwrap(), MAX_KILLED_WAIT);
        assert!(s
            .after(death(false, true, 0, true))
            .unwrap_err()
            .contains("killed (SIGKILL) before they served"));
        // Dying of its own doing before serving is fruitless at once.
        let mut s = Starts::default();
        for _ in 0..MAX_FRUITLESS_STARTS {
            s.after(death(false, false, 0, false)).unwrap();
        }
        assert!(s.after(death(false, false, 0, false)).is_err());
    }
}
