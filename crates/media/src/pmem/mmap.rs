//! A region mapped from a file or a DAX device.
//!
//! How `persist` makes data durable depends on the mapping:
//! - On a DAX file system or device the mapping is made with `MAP_SYNC`, loads and stores
//!   reach the memory directly, and a cache-line write-back (`clwb`, else `clflushopt`, else
//!   `clflush`) plus `sfence` is the whole persist: a few nanoseconds per line, as on real
//!   persistent memory. [`Persistence::CacheLineFlush`] is then the default.
//! - On an ordinary file the mapping sits in the page cache, and only `msync` puts it on the
//!   disk, a page at a time ([`Persistence::Msync`], the default there). Cache-line flushes
//!   may still be forced: the data then survives a crash of the process (the page cache
//!   keeps it) but not of the machine; benchmarks use this to measure the CPU cost that real
//!   persistent memory would have.

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{check_range, LineCounters, Region, RegionError, LINE};

/// How [`MmapRegion`]'s flush makes a range durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// `msync(MS_SYNC)` of the pages covering the range.
    Msync,
    /// Write back each cache line (`clwb` / `clflushopt` / `clflush`), then `sfence`.
    CacheLineFlush,
    /// Nothing: the mapping is a private copy ([`MmapRegion::open_private`]), whose stores
    /// never reach the file.
    Private,
}

/// How a process holds the file of a mapping: alone (a writer), or beside other readers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    Exclusive,
    Shared,
}

/// A file mapped shared and locked for exclusive use while open, or mapped as a private
/// copy under a shared lock ([`MmapRegion::open_private`]).
pub struct MmapRegion {
    ptr: *mut u8,
    len: usize,
    _file: File,
    dax: bool,
    persistence: Persistence,
    /// Stores per line, when asked for ([`MmapRegion::with_line_counts`]): a sixteenth of
    /// the region in DRAM, and a counter line touched per line stored.
    counters: Option<LineCounters>,
}

// SAFETY: the mapping is owned by this value alone (the file is locked against other users
// of this crate) and is only reached through &self / &mut self, so moving it to another
// thread is as safe as moving a Vec.
unsafe impl Send for MmapRegion {}

fn io(context: String) -> impl FnOnce(std::io::Error) -> RegionError {
    move |source| RegionError::Io { context, source }
}

impl MmapRegion {
    /// Creates a zeroed file of `len` bytes at `path` (which must not exist) and maps it.
    pub fn create(path: impl AsRef<Path>, len: usize) -> Result<MmapRegion, RegionError> {
        let (file, p) = create_file(path.as_ref(), len)?;
        MmapRegion::map(file, p, len)
    }

    /// Maps an existing file, all of it; an error at once if another process holds it.
    pub fn open(path: impl AsRef<Path>) -> Result<MmapRegion, RegionError> {
        MmapRegion::open_waiting(path, Duration::ZERO)
    }

    /// Maps an existing file, all of it, waiting up to `wait` for other processes (readers
    /// or a writer) to let it go.
    pub fn open_waiting(path: impl AsRef<Path>, wait: Duration) -> Result<MmapRegion, RegionError> {
        let p = path.as_ref().display().to_string();
        let file = OpenOptions::new().read(true).write(true).open(path.as_ref()).map_err(io(p.clone()))?;
        let len = file.metadata().map_err(io(p.clone()))?.len() as usize;
        lock(&file, &p, Hold::Exclusive, wait)?;
        MmapRegion::map_window(file, &p, 0, len)
    }

    /// Maps an existing file, all of it, as a private copy for a reader: stores (a
    /// recovery's, a rebuilt page's) land in this process's copy and never in the file,
    /// which may be read-only. Any number of readers hold the file at once; a writer
    /// ([`open_waiting`](Self::open_waiting)) waits for them, and they for it, up to `wait`.
    pub fn open_private(path: impl AsRef<Path>, wait: Duration) -> Result<MmapRegion, RegionError> {
        let p = path.as_ref().display().to_string();
        let file = OpenOptions::new().read(true).open(path.as_ref()).map_err(io(p.clone()))?;
        let len = file.metadata().map_err(io(p.clone()))?.len() as usize;
        lock(&file, &p, Hold::Shared, wait)?;
        if len == 0 {
            return Err(RegionError::Range { offset: 0, len: 0, size: 0 });
        }
        // SAFETY: a fresh private mapping of `len` bytes of a file we hold open; the kernel
        // chooses the address, and copies a page on its first store.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io(format!("{p}: mmap"))(std::io::Error::last_os_error()));
        }
        Ok(MmapRegion {
            ptr: ptr as *mut u8,
            len,
            _file: file,
            dax: false,
            persistence: Persistence::Private,
            counters: None,
        })
    }

    fn map(file: File, path: String, len: usize) -> Result<MmapRegion, RegionError> {
        lock(&file, &path, Hold::Exclusive, Duration::ZERO)?;
        MmapRegion::map_window(file, &path, 0, len)
    }

    /// Creates a zeroed file of `len` bytes at `path` (which must not exist) and maps it as
    /// two regions, `[0, at)` and `[at, len)`, under one lock (`at` a multiple of 4096): two
    /// structures in one file, as the NVRAM tier keeps its log and its heap.
    pub fn create_split(
        path: impl AsRef<Path>,
        len: usize,
        at: usize,
    ) -> Result<(MmapRegion, MmapRegion), RegionError> {
        let (file, p) = create_file(path.as_ref(), len)?;
        MmapRegion::split(file, p, len, at)
    }

    /// Maps an existing file as two regions, `[0, at)` and `[at, its length)` (see
    /// [`create_split`](Self::create_split)).
    pub fn open_split(path: impl AsRef<Path>, at: usize) -> Result<(MmapRegion, MmapRegion), RegionError> {
        let p = path.as_ref().display().to_string();
        let file = OpenOptions::new().read(true).write(true).open(path.as_ref()).map_err(io(p.clone()))?;
        let len = file.metadata().map_err(io(p.clone()))?.len() as usize;
        MmapRegion::split(file, p, len, at)
    }

    fn split(
        file: File,
        path: String,
        len: usize,
        at: usize,
    ) -> Result<(MmapRegion, MmapRegion), RegionError> {
        if at == 0 || at >= len || !at.is_multiple_of(4096) {
            return Err(RegionError::Misaligned { offset: at, align: 4096 });
        }
        lock(&file, &path, Hold::Exclusive, Duration::ZERO)?;
        // The second window holds a duplicate of the descriptor: the lock (on the open file
        // description they share) is held until both are dropped.
        let second = file.try_clone().map_err(io(format!("{path}: dup")))?;
        Ok((
            MmapRegion::map_window(file, &path, 0, at)?,
            MmapRegion::map_window(second, &path, at, len - at)?,
        ))
    }

    /// Maps `len` bytes of `file` from byte `offset` (page-aligned).
    fn map_window(file: File, path: &str, offset: usize, len: usize) -> Result<MmapRegion, RegionError> {
        let fd = file.as_raw_fd();
        if len == 0 {
            return Err(RegionError::Range { offset: 0, len: 0, size: 0 });
        }
        let off = offset as libc::off_t;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh shared mapping of `len` bytes of a file we hold open; the kernel
        // chooses the address. MAP_SYNC is refused (EOPNOTSUPP/EINVAL) unless the file is DAX.
        let mut ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC, fd, off)
        };
        let dax = ptr != libc::MAP_FAILED;
        if !dax {
            // SAFETY: as above, without MAP_SYNC.
            ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, off) };
            if ptr == libc::MAP_FAILED {
                return Err(io(format!("{path}: mmap"))(std::io::Error::last_os_error()));
            }
        }
        Ok(MmapRegion {
            ptr: ptr as *mut u8,
            len,
            _file: file,
            dax,
            persistence: if dax { Persistence::CacheLineFlush } else { Persistence::Msync },
            counters: None,
        })
    }

    /// Forces a persistence method (see the module documentation for what each guarantees).
    pub fn with_persistence(mut self, persistence: Persistence) -> MmapRegion {
        self.persistence = persistence;
        self
    }

    /// Counts stores per 64-byte line ([`Region::line_writes`]), for wear studies; a region
    /// counts nothing unless asked to.
    pub fn with_line_counts(mut self) -> MmapRegion {
        self.counters = Some(LineCounters::new(self.len));
        self
    }

    /// The method `persist` uses.
    pub fn persistence(&self) -> Persistence {
        self.persistence
    }

    /// Maps in every page of the mapping and of the wear counters, without changing a byte
    /// or a count, so that no later store pays a first-touch page fault. On tmpfs a page
    /// reserved by `fallocate` is zeroed at its first touch: the NVRAM tier does this at
    /// mount rather than under the file system's lock in the write path (a third of a fresh
    /// mount's 1 MiB write rate). Benchmarks do it so that no fault lands under the timer.
    pub fn prefault(&mut self) {
        let page = page_size();
        // SAFETY: the whole mapping, page-aligned by mmap.
        if !unsafe { crate::host_space::populate_write(self.ptr, self.len) } {
            let bytes = self.slice_mut();
            for at in (0..bytes.len()).step_by(page) {
                bytes[at] = std::hint::black_box(bytes[at]);
            }
        }
        if let Some(c) = &mut self.counters {
            c.prefault(page);
        }
    }

    /// Whether the mapping is direct-access (MAP_SYNC accepted).
    pub fn is_dax(&self) -> bool {
        self.dax
    }

    fn slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr..ptr+len is our live mapping, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl std::fmt::Debug for MmapRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmapRegion").field("len", &self.len).finish_non_exhaustive()
    }
}

impl Drop for MmapRegion {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping we created; no slice of it outlives self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

impl Region for MmapRegion {
    fn len(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is our live mapping; writers need &mut self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        check_range(offset, data.len(), self.len)?;
        self.slice_mut()[offset..offset + data.len()].copy_from_slice(data);
        if let Some(c) = &mut self.counters {
            c.touch(offset, data.len());
        }
        Ok(())
    }

    fn update(&mut self, offset: usize, len: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<(), RegionError> {
        check_range(offset, len, self.len)?;
        f(&mut self.slice_mut()[offset..offset + len]);
        if let Some(c) = &mut self.counters {
            c.touch(offset, len);
        }
        Ok(())
    }

    fn write_streaming(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        check_range(offset, data.len(), self.len)?;
        if self.persistence != Persistence::CacheLineFlush || !cfg!(target_arch = "x86_64") {
            self.write(offset, data)?;
            return self.flush(offset, data.len());
        }
        // Unaligned head and tail bytes: ordinary stores, flushed; the 8-byte-aligned body:
        // non-temporal stores, which need no flush.
        let start = self.ptr as usize + offset;
        let head = (start.next_multiple_of(8) - start).min(data.len());
        let body = (data.len() - head) & !7;
        let (h, rest) = data.split_at(head);
        let (b, t) = rest.split_at(body);
        if !h.is_empty() {
            self.slice_mut()[offset..offset + head].copy_from_slice(h);
            self.flush(offset, head)?;
        }
        flush::stream(self.ptr, offset + head, b);
        if !t.is_empty() {
            let at = offset + head + body;
            self.slice_mut()[at..at + t.len()].copy_from_slice(t);
            self.flush(at, t.len())?;
        }
        if let Some(c) = &mut self.counters {
            c.touch(offset, data.len());
        }
        Ok(())
    }

    fn flush(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        check_range(offset, len, self.len)?;
        if len == 0 {
            return Ok(());
        }
        match self.persistence {
            Persistence::Msync => {
                let page = page_size();
                let start = offset / page * page;
                // SAFETY: the range lies within our mapping; start is page-aligned.
                let r = unsafe {
                    libc::msync(self.ptr.add(start) as *mut libc::c_void, offset + len - start, libc::MS_SYNC)
                };
                if r != 0 {
                    return Err(io("msync".into())(std::io::Error::last_os_error()));
                }
            }
            Persistence::CacheLineFlush => {
                let first = (self.ptr as usize + offset) / LINE * LINE;
                let end = self.ptr as usize + offset + len;
                let mut line = first;
                while line < end {
                    flush::line(line as *const u8);
                    line += LINE;
                }
            }
            Persistence::Private => {}
        }
        Ok(())
    }

    fn fence(&mut self) -> Result<(), RegionError> {
        flush::fence();
        Ok(())
    }

    fn line_writes(&self) -> &[u32] {
        self.counters.as_ref().map_or(&[], |c| c.as_slice())
    }

    fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        check_range(offset, data.len(), self.len)?;
        self.slice_mut()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
}

/// A new zeroed file of `len` bytes at `path` (which must not exist), and its name for
/// errors.
fn create_file(path: &Path, len: usize) -> Result<(File, String), RegionError> {
    let p = path.display().to_string();
    let file =
        OpenOptions::new().read(true).write(true).create_new(true).open(path).map_err(io(p.clone()))?;
    file.set_len(len as u64).map_err(io(format!("{p}: size")))?;
    // Every byte reserved now: a store into a hole of a full file system (a full /dev/shm)
    // would be a SIGBUS in the middle of a write, not an error. A file system without
    // fallocate keeps the file sparse.
    if let Err(e) = crate::host_space::reserve(&file, 0, len as u64) {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(io(format!("{p}: reserving {len} bytes"))(e));
    }
    Ok((file, p))
}

/// Locks `file` as `hold` says (exclusive: no other mount or reader of it), trying again
/// until `wait` has passed.
fn lock(file: &File, path: &str, hold: Hold, wait: Duration) -> Result<(), RegionError> {
    let how = match hold {
        Hold::Exclusive => libc::LOCK_EX,
        Hold::Shared => libc::LOCK_SH,
    };
    let start = Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(io(format!("{path}: lock"))(e));
        }
        if start.elapsed() >= wait {
            let waited = if wait.is_zero() { String::new() } else { format!(" (waited {wait:?})") };
            return Err(io(format!("{path}: in use by another process{waited}"))(e));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `file` lies on a tmpfs (shared memory: a process crash keeps what was stored, a
/// power cut keeps nothing, and msync does nothing but cost a system call).
pub fn on_tmpfs(path: impl AsRef<Path>) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_ref().as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs into a zeroed struct we own, with a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type == libc::TMPFS_MAGIC
}

/// Whether a writer's mapping of `path` is direct access: the kernel grants MAP_SYNC (a
/// DAX file system over persistent memory), so a persist is a cache-line write-back and a
/// fence, not an msync. Asked with a read-only mapping of the file's first page, so that a
/// reader can say how writers persist without taking the file.
pub fn maps_direct(path: impl AsRef<Path>) -> bool {
    let Ok(file) = File::open(path.as_ref()) else { return false };
    let len = page_size();
    // SAFETY: a fresh read-only shared mapping of one page of a file we hold open, unmapped
    // at once; MAP_SYNC is refused (EOPNOTSUPP/EINVAL) unless the file is DAX.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the mapping made above, of `len` bytes.
    unsafe { libc::munmap(ptr, len) };
    true
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Cache-line write-back, with the best instruction the CPU has.
mod flush {
    #[cfg(target_arch = "x86_64")]
    pub mod x86 {
        use std::sync::OnceLock;

        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Insn {
            Clwb,
            Clflushopt,
            Clflush,
        }

        pub fn insn() -> Insn {
            static INSN: OnceLock<Insn> = OnceLock::new();
            *INSN.get_or_init(|| {
                // CPUID leaf 7, sub-leaf 0: EBX bit 24 is CLWB, bit 23 CLFLUSHOPT.
                #[allow(unused_unsafe)]
                // SAFETY: CPUID is available on every x86_64 CPU.
                let ebx = unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.ebx;
                if ebx >> 24 & 1 == 1 {
                    Insn::Clwb
                } else if ebx >> 23 & 1 == 1 {
                    Insn::Clflushopt
                } else {
                    Insn::Clflush
                }
            })
        }

        pub fn line(p: *const u8) {
            // SAFETY: the callers pass addresses inside their own live mapping; the
            // instructions only write the line back and need no alignment. CLWB and
            // CLFLUSHOPT run only when CPUID says the CPU has them.
            unsafe {
                match insn() {
                    Insn::Clwb => std::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags)),
                    Insn::Clflushopt => {
                        std::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    Insn::Clflush => std::arch::x86_64::_mm_clflush(p),
                }
            }
        }

        pub fn fence() {
            // SAFETY: SFENCE has no preconditions on x86_64 (SSE is baseline).
            unsafe { std::arch::x86_64::_mm_sfence() }
        }

        /// Non-temporal stores of `words` (a multiple of 8 bytes) at `base + offset`, which
        /// must be 8-byte aligned: 16-byte stores (MOVNTDQ) where the address is 16-byte
        /// aligned, 8-byte ones (MOVNTI) for an odd word at either end. Both are SSE2,
        /// baseline on x86_64; a quarter of the instructions of MOVNTI alone.
        pub fn stream(base: *mut u8, offset: usize, words: &[u8]) {
            let at = base as usize + offset;
            let lead = if at.is_multiple_of(16) { 0 } else { 8.min(words.len()) };
            let (head, rest) = words.split_at(lead);
            let (body, tail) = rest.split_at(rest.len() & !15);
            stream_words(base, offset, head);
            for (i, v) in body.chunks_exact(16).enumerate() {
                use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
                // SAFETY: the caller checked that offset + words.len() lies within the mapping
                // at `base`; base + offset + lead is 16-byte aligned (lead makes it so), as
                // MOVNTDQ needs; the unaligned load reads the 16 bytes of `v`.
                unsafe {
                    let dst = base.add(offset + lead + 16 * i) as *mut __m128i;
                    _mm_stream_si128(dst, _mm_loadu_si128(v.as_ptr() as *const __m128i));
                }
            }
            stream_words(base, offset + lead + body.len(), tail);
        }

        /// MOVNTI of each 8-byte word of `words` at `base + offset` (8-byte aligned).
        fn stream_words(base: *mut u8, offset: usize, words: &[u8]) {
            for (i, w) in words.chunks_exact(8).enumerate() {
                let v = i64::from_le_bytes(w.try_into().expect("8 bytes"));
                // SAFETY: the caller checked that offset + words.len() lies within the
                // mapping at `base` and that base + offset is 8-byte aligned; MOVNTI is SSE2,
                // baseline on x86_64.
                unsafe { std::arch::x86_64::_mm_stream_si64(base.add(offset + 8 * i).cast(), v) };
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub use x86::{fence, insn, line, stream};

    #[cfg(not(target_arch = "x86_64"))]
    pub fn line(_p: *const u8) {}

    #[cfg(not(target_arch = "x86_64"))]
    pub fn stream(_base: *mut u8, _offset: usize, _words: &[u8]) {
        unreachable!("streaming stores are used on x86_64 only")
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn fence() {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// The write-back instruction `persist` uses on this CPU (for reports).
pub fn flush_instruction() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        match flush::insn() {
            flush::x86::Insn::Clwb => "clwb",
            flush::x86::Insn::Clflushopt => "clflushopt",
            flush::x86::Insn::Clflush => "clflush",
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "none"
    }
}
