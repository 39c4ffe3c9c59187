//! The cells of a NAND image file, reached through a shared mapping of the whole file: a
//! page read or program is a copy, not a system call, and the block table is updated in
//! place (FORMAT.md, "NAND image").
//!
//! In a version 2 image every stored byte is the complement of the cell's, so that a hole
//! in the file reads as erased cells: an image is made sparse in an instant whatever its
//! size. Writing through a mapping into a hole the host has no room for would kill the
//! process (SIGBUS), so a block's range is reserved (`fallocate`) before its first write: a
//! full host is an I/O error on that program, as a `pwrite` would have reported it. An image
//! takes the host's space as its blocks are first programmed and keeps it. On an image whose
//! space is reserved whole, a thread maps the next blocks in while the writer fills one.

use std::fs::File;
use std::os::unix::io::AsRawFd;

use super::chip::Cells;
use super::{BlockState, NandError};

/// Bytes of a block's entry in the image's block table (FORMAT.md, "NAND image header").
pub(crate) const BLOCK_ENTRY_SIZE: u64 = 8;
const FLAG_BAD: u16 = 1;

/// A block's entry: its erase count, the next page to program, whether it is bad.
pub(crate) fn encode_entry(s: &BlockState) -> [u8; BLOCK_ENTRY_SIZE as usize] {
    let mut e = [0u8; 8];
    e[0..4].copy_from_slice(&s.erase_count.to_le_bytes());
    e[4..6].copy_from_slice(&(s.next_index as u16).to_le_bytes());
    e[6..8].copy_from_slice(&(if s.bad { FLAG_BAD } else { 0 }).to_le_bytes());
    e
}

pub(crate) fn decode_entry(e: &[u8]) -> BlockState {
    BlockState {
        erase_count: u32::from_le_bytes(e[0..4].try_into().unwrap()),
        next_index: u16::from_le_bytes(e[4..6].try_into().unwrap()) as u32,
        bad: u16::from_le_bytes(e[6..8].try_into().unwrap()) & FLAG_BAD != 0,
    }
}

/// Whether a block's range of the file is backed by allocated space.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Space {
    /// Not looked at since the image was opened.
    Unknown,
    /// A hole: reads as erased; must be reserved before a write.
    Hole,
    /// Reserved: reads and writes go through the mapping.
    Reserved,
}

/// A shared, writable mapping of a whole file.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by one `ImageCells`, used through `&mut self` only (its
// block-ahead thread gets addresses to `madvise`, never a reference to the bytes).
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize) -> std::io::Result<Mapping> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh shared mapping of `len` bytes of a descriptor we own; the kernel
        // picks the address. The file is at least `len` bytes long (checked by the caller)
        // and locked against other bitmend processes, which would be the ones to shrink it.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr: ptr.cast(), len })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` bytes for as long as `self` lives; `&mut self` makes this
        // the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Maps the pages of `[start, start + len)` now, one call instead of a fault per page at
    /// its first store (a block is 32 to 64 pages). Best effort: a kernel before 5.14 does not
    /// know MADV_POPULATE_WRITE, and the pages then fault in as before.
    fn populate(&mut self, start: usize, len: usize) {
        if let Some((ptr, len)) = self.pages(start, len) {
            // SAFETY: a page-aligned range inside this mapping (`pages`).
            unsafe { crate::host_space::populate_write(ptr, len) };
        }
    }

    /// The whole pages covering `[start, start + len)`, clipped to the mapping: a pointer
    /// inside it and a length, or None if that is empty.
    fn pages(&self, start: usize, len: usize) -> Option<(*mut u8, usize)> {
        // x86-64's page; where pages are larger the range is misaligned, the call fails with
        // EINVAL, and the pages fault in as before.
        const PAGE: usize = 4096;
        let from = start / PAGE * PAGE;
        let to = (start + len).next_multiple_of(PAGE).min(self.len);
        // SAFETY: from < to <= len: the offset stays inside the mapping.
        (from < to).then(|| (unsafe { self.ptr.add(from) }, to - from))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // SAFETY: msync of exactly the range this mapping covers.
        if unsafe { libc::msync(self.ptr.cast(), self.len, libc::MS_SYNC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps the range mapped in `new`; nothing refers to it after drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Where the cells are in the file, and how they are stored.
pub(crate) struct ImageLayout {
    /// Offset of the block table.
    pub table: u64,
    /// Offset of page 0.
    pub base: u64,
    /// Bytes per erase block (pages and spare).
    pub block_bytes: u64,
    pub blocks: u32,
    /// Version 2: each stored byte is the complement of the cell's.
    pub complemented: bool,
}

pub(crate) struct ImageCells {
    /// Declared before `map`: fields drop in order, and its thread must be joined before the
    /// range it populates is unmapped.
    ahead: Ahead,
    file: File,
    path: String,
    map: Mapping,
    layout: ImageLayout,
    space: Vec<Space>,
    /// The host's space for the whole file is allocated (`mkfs`'s
    /// [`reserve_all`](Self::reserve_all), or found so at open): a block's first write needs
    /// its pages mapped in, not another `fallocate` (which on tmpfs walks every page of the
    /// range again: half the cost of a block's first program).
    host_reserved: bool,
    /// Blocks handed to `ahead` to be mapped in before their first program.
    hinted: Vec<bool>,
}

/// How many blocks past the one a first program opens are mapped in ahead of the writer: a
/// log fills blocks one after another. They are handed over in batches, once the next half
/// of the window is not all handed over yet: a message per block (each a wake of the
/// thread, a futex call and often a cross-CPU interrupt) was 2% of the daemon's time under
/// sequential 1 MiB writes.
const AHEAD_BLOCKS: usize = 8;

/// A thread that maps blocks in (allocating and zeroing the host's pages) before the writer
/// reaches them. That work was a fifth of the daemon's time under sequential writes, done in
/// the writer's thread while it held the file system. Only a speed-up: the writer's own
/// stores fault a page in if the thread has not got there yet, and the kernel serialises the
/// two.
#[derive(Default)]
struct Ahead {
    tx: Option<std::sync::mpsc::Sender<(usize, usize)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ahead {
    /// Asks for `[ptr, ptr + len)` to be mapped in; false if the thread could not start.
    fn populate(&mut self, ptr: *mut u8, len: usize) -> bool {
        if self.tx.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<(usize, usize)>();
            let spawned = std::thread::Builder::new().name("bitmend-ahead".into()).spawn(move || {
                for (addr, len) in rx {
                    // SAFETY: a page-aligned range of the image's mapping (`Mapping::pages`
                    // checked it); the mapping outlives this thread, which `Drop` joins
                    // before the mapping (a later field) is unmapped.
                    unsafe { crate::host_space::populate_write(addr as *mut u8, len) };
                }
            });
            let Ok(thread) = spawned else { return false };
            (self.tx, self.thread) = (Some(tx), Some(thread));
        }
        self.tx.as_ref().is_some_and(|tx| tx.send((ptr as usize, len)).is_ok())
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.tx = None; // ends the thread's loop once it has done what it was sent
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether the host's space for all `len` bytes of `file` is allocated, where the answer is
/// exact: on tmpfs, whose block count is the file's pages alone. Elsewhere a file system may
/// count its own metadata (ext4's extent blocks), so a count as large as the file does not
/// prove there is no hole; there a block's `fallocate` is an extent lookup anyway.
fn reserved_whole(file: &File, len: u64) -> std::io::Result<bool> {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on a descriptor we own, into a struct of the right type.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if fs.f_type as i64 != TMPFS_MAGIC {
        return Ok(false);
    }
    Ok(std::os::unix::fs::MetadataExt::blocks(&file.metadata()?) * 512 >= len)
}

fn io_at(path: &str, what: String) -> impl FnOnce(std::io::Error) -> NandError + '_ {
    move |source| NandError::Io { context: format!("{path}: {what}"), source }
}

impl ImageCells {
    /// Maps `file` (at least `len` bytes long) whole. `fresh`: just made, every block a hole.
    pub fn new(
        file: File,
        path: String,
        len: u64,
        layout: ImageLayout,
        fresh: bool,
    ) -> Result<ImageCells, NandError> {
        let map = Mapping::new(&file, len as usize).map_err(io_at(&path, "mmap".into()))?;
        // A version 1 image was written whole when it was made: no holes.
        let first = match (layout.complemented, fresh) {
            (false, _) => Space::Reserved,
            (true, true) => Space::Hole,
            (true, false) => Space::Unknown,
        };
        let space = vec![first; layout.blocks as usize];
        let host_reserved = reserved_whole(&file, len).map_err(io_at(&path, "stat".into()))?;
        let hinted = vec![false; layout.blocks as usize];
        Ok(ImageCells { ahead: Ahead::default(), file, path, map, layout, space, host_reserved, hinted })
    }

    fn block_of(&self, offset: u64) -> usize {
        (offset / self.layout.block_bytes) as usize
    }

    fn block_range(&self, block: usize) -> (i64, i64) {
        ((self.layout.base + block as u64 * self.layout.block_bytes) as i64, self.layout.block_bytes as i64)
    }

    /// Finds out whether `block` holds data, and with the same call every block of unknown
    /// state up to the next data: one `SEEK_DATA` classifies a whole run of holes. Asking
    /// block by block cost a scan to the next data each time, quadratic on an image whose
    /// blocks are reserved but unwritten (tmpfs counts such pages as holes, one at a time).
    fn classify_from(&mut self, block: usize) {
        let (start, _) = self.block_range(block);
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let next = unsafe { libc::lseek(self.file.as_raw_fd(), start, libc::SEEK_DATA) };
        let blocks = self.space.len();
        let first_data = if next >= 0 {
            ((next as u64 - self.layout.base) / self.layout.block_bytes) as usize
        } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
            blocks // no data after `start`
        } else {
            block // SEEK_DATA unsupported: assume data, which only costs a reservation
        };
        let end = first_data.min(blocks);
        for s in &mut self.space[block..end] {
            if *s == Space::Unknown {
                *s = Space::Hole;
            }
        }
        if end < blocks && self.space[end] == Space::Unknown {
            self.space[end] = Space::Reserved;
        }
    }

    /// Reserves the host's space for the whole image (`mkfs` without `--thin`). Every block
    /// stays a hole to this mapping: the reserved bytes read as zeros, and the first program
    /// of a block still maps its pages in with one call ([`reserve`](Self::reserve)). A host
    /// file system without `fallocate` leaves the image sparse.
    pub fn reserve_all(&mut self) -> Result<(), NandError> {
        let len = self.map.len;
        self.host_reserved = crate::host_space::reserve(&self.file, 0, len as u64)
            .map_err(io_at(&self.path, format!("reserve {len} bytes")))?;
        Ok(())
    }

    /// Makes sure `block`'s range has space behind it, so that a write through the mapping
    /// cannot fault.
    fn reserve(&mut self, block: usize) -> Result<(), NandError> {
        if self.space[block] == Space::Reserved {
            return Ok(());
        }
        let (start, len) = self.block_range(block);
        // SAFETY: fallocate on a descriptor we own; no memory is passed.
        if !self.host_reserved && unsafe { libc::fallocate(self.file.as_raw_fd(), 0, start, len) } != 0 {
            let e = std::io::Error::last_os_error();
            // A full disk (or quota) under a thin image is a state, not a failing chip: named
            // as such, so that the file system answers ENOSPC and tries again later.
            if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
                return Err(NandError::HostSpace { path: self.path.clone(), block: block as u32 });
            }
            return Err(io_at(&self.path, format!("reserve space for block {block}"))(e));
        }
        self.space[block] = Space::Reserved;
        if !self.hinted[block] {
            self.map.populate(start as usize, len as usize);
        }
        self.populate_ahead(block);
        Ok(())
    }

    /// Has the blocks after `block` that are still holes mapped in by the `ahead` thread.
    /// Only where the host's space is reserved already: elsewhere a block's `fallocate` must
    /// come first, in the writer, so that a full host fails the program that needs it.
    fn populate_ahead(&mut self, block: usize) {
        if !self.host_reserved {
            return;
        }
        let end = (block + 1 + AHEAD_BLOCKS).min(self.space.len());
        let near = (block + 1 + AHEAD_BLOCKS / 2).min(end);
        if (block + 1..near).all(|b| self.hinted[b] || !self.is_hole(b)) {
            return;
        }
        let todo: Vec<usize> = (block + 1..end).filter(|&b| !self.hinted[b] && self.is_hole(b)).collect();
        let (Some(&first), Some(&last)) = (todo.first(), todo.last()) else { return };
        // One range from the first to the last: blocks between that hold data are mapped in
        // too, which changes no byte of them.
        let (start, _) = self.block_range(first);
        let (last_start, last_len) = self.block_range(last);
        let Some((ptr, len)) = self.map.pages(start as usize, (last_start + last_len - start) as usize)
        else {
            return;
        };
        if self.ahead.populate(ptr, len) {
            for b in todo {
                self.hinted[b] = true;
            }
        }
    }

    /// Whether `block` reads as erased without looking (a hole), finding out once.
    fn is_hole(&mut self, block: usize) -> bool {
        if self.space[block] == Space::Unknown {
            self.classify_from(block);
        }
        self.space[block] == Space::Hole
    }

    fn span(&self, offset: u64, len: usize) -> std::ops::Range<usize> {
        let at = (self.layout.base + offset) as usize;
        debug_assert!(len == 0 || self.block_of(offset) == self.block_of(offset + len as u64 - 1));
        at..at + len
    }
}

impl Cells for ImageCells {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), NandError> {
        if !self.layout.complemented {
            let span = self.span(offset, buf.len());
            buf.copy_from_slice(&self.map.bytes()[span]);
            return Ok(());
        }
        if self.is_hole(self.block_of(offset)) {
            buf.fill(0xFF);
            return Ok(());
        }
        let span = self.span(offset, buf.len());
        buf.iter_mut().zip(&self.map.bytes()[span]).for_each(|(b, s)| *b = !*s);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), NandError> {
        self.reserve(self.block_of(offset))?;
        let span = self.span(offset, data.len());
        let stored = &mut self.map.bytes()[span];
        if self.layout.complemented {
            stored.iter_mut().zip(data).for_each(|(s, d)| *s = !*d);
        } else {
            stored.copy_from_slice(data);
        }
        Ok(())
    }

    fn fill_ones(&mut self, offset: u64, len: u64) -> Result<(), NandError> {
        // Called for one whole block (an erase). A hole is erased already. A reserved block
        // is cleared in place rather than punched back into a hole: it will be programmed
        // again soon, and on tmpfs a punched range costs a page fault and a zeroed page per
        // 4 KiB when it is (a fifth of the daemon's time under sequential writes).
        let block = self.block_of(offset);
        debug_assert_eq!((offset, len), (block as u64 * self.layout.block_bytes, self.layout.block_bytes));
        if self.layout.complemented && self.is_hole(block) {
            return Ok(());
        }
        self.reserve(block)?;
        let span = self.span(offset, len as usize);
        self.map.bytes()[span].fill(if self.layout.complemented { 0 } else { 0xFF });
        Ok(())
    }

    fn store_state(&mut self, block: u32, state: &BlockState) -> Result<(), NandError> {
        let at = (self.layout.table + block as u64 * BLOCK_ENTRY_SIZE) as usize;
        self.map.bytes()[at..at + BLOCK_ENTRY_SIZE as usize].copy_from_slice(&encode_entry(state));
        Ok(())
    }

    fn sync(&mut self) -> Result<(), NandError> {
        let path = self.path.clone();
        self.map.flush().map_err(io_at(&path, "sync".into()))
    }

    fn data_reader(&self, g: super::Geometry) -> Option<super::DataReader> {
        // A new open of the file, not a `dup`: a duplicate would share the image's lock, and
        // a reader kept past the unmount would hold the image locked.
        let file = File::open(format!("/proc/self/fd/{}", self.file.as_raw_fd())).ok()?;
        let layout = super::data_reader::ReaderLayout {
            base: self.layout.base,
            page_size: g.page_size as usize,
            raw_page_size: g.raw_page_size(),
            pages: g.pages(),
            complemented: self.layout.complemented,
        };
        Some(super::DataReader::new(file, &self.path, layout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;
    const BLOCK: usize = 64 * PAGE;

    fn thread_minor_faults() -> i64 {
        // SAFETY: an all-zero rusage is a valid value to be overwritten.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage into a struct of the right type.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        u.ru_minflt
    }

    /// Programs block 0's first page, lets the `ahead` thread finish, then programs all of
    /// block 1: the page faults this thread takes doing so, and the block read back.
    fn faults_programming_the_next_block(name: &str, reserve: bool) -> Option<i64> {
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            return None;
        }
        let path = shm.join(format!("bitmend-{name}-{}.img", std::process::id()));
        let blocks = 8u32;
        let len = (PAGE + blocks as usize * BLOCK) as u64;
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path);
        let file = file.unwrap();
        file.set_len(len).unwrap();
        let layout = ImageLayout {
            table: 0,
            base: PAGE as u64,
            block_bytes: BLOCK as u64,
            blocks,
            complemented: true,
        };
        let mut cells = ImageCells::new(file, path.display().to_string(), len, layout, true).unwrap();
        if reserve {
            cells.reserve_all().unwrap();
        }
        cells.write_at(0, &[7; PAGE]).unwrap();
        cells.ahead = Ahead::default(); // joins the thread: what it was sent is done
        let page = |i: usize| -> Vec<u8> { (0..PAGE).map(|b| (b * 31 + i) as u8).collect() };
        let before = thread_minor_faults();
        for i in 0..BLOCK / PAGE {
            cells.write_at((BLOCK + i * PAGE) as u64, &page(i)).unwrap();
        }
        let faults = thread_minor_faults() - before;
        let mut back = vec![0; PAGE];
        for i in 0..BLOCK / PAGE {
            cells.read_at((BLOCK + i * PAGE) as u64, &mut back).unwrap();
            assert_eq!(back, page(i), "{name}: page {i} of block 1");
        }
        cells.read_at(2 * BLOCK as u64, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0xFF), "{name}: block 2, mapped in ahead, reads erased");
        drop(cells);
        std::fs::remove_file(&path).unwrap();
        Some(faults)
    }

    #[test]
    fn blocks_after_a_first_program_are_mapped_in_ahead_of_the_writer() {
        let pages = (BLOCK / PAGE) as i64;
        // A thin image: each block's first program reserves and maps it in, in the writer.
        let Some(thin) = faults_programming_the_next_block("thin-ahead", false) else { return };
        assert!(thin >= pages, "a thin image's block maps in in the writer: {thin} faults");
        // A reserved one: block 0's program had the next blocks mapped in by the thread.
        let thick = faults_programming_the_next_block("thick-ahead", true).expect("/dev/shm");
        assert!(thick < pages / 8, "block 1 was mapped in ahead: {thick} faults for {pages} pages");
    }
}
