//! The cells of a NAND image file, reached through a shared mapping of the whole file: a
//! page read or program is a copy, not a system call, and the block table is updated in
//! place (FORMAT.md, "NAND image").
//!
//! In a version 2 image every stored byte is the complement of the cell's, so that a hole
//! in the file reads as erased cells: an image is made sparse in an instant whatever its
//! size. Writing through a mapping into a hole the host has no room for would kill the
//! process (SIGBUS), so a block's range is reserved (`fallocate`) before its first write: a
//! full host is an I/O error on that program, as a `pwrite` would have reported it. An image
//! takes the host's space as its blocks are first programmed and keeps it.

use std::fs::File;
use std::os::unix::io::AsRawFd;

use super::chip::Cells;
use super::{BlockState, NandError};

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

// SAFETY: the mapping is owned by one `ImageCells`, used through `&mut self` only.
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
        // x86-64's page; where pages are larger the range is misaligned, the call fails with
        // EINVAL, and the pages fault in as before.
        const PAGE: usize = 4096;
        let from = start / PAGE * PAGE;
        let to = (start + len).next_multiple_of(PAGE).min(self.len);
        if from >= to {
            return;
        }
        // SAFETY: a page-aligned range inside this mapping (from < to <= len).
        unsafe { crate::host_space::populate_write(self.ptr.add(from), to - from) };
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
        Ok(ImageCells { file, path, map, layout, space, host_reserved })
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
            return Err(io_at(&self.path, format!("reserve space for block {block}"))(
                std::io::Error::last_os_error(),
            ));
        }
        self.space[block] = Space::Reserved;
        self.map.populate(start as usize, len as usize);
        Ok(())
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
        let at = (self.layout.table + block as u64 * super::file::BLOCK_ENTRY_SIZE) as usize;
        self.map.bytes()[at..at + super::file::BLOCK_ENTRY_SIZE as usize]
            .copy_from_slice(&super::file::encode_entry(state));
        Ok(())
    }

    fn sync(&mut self) -> Result<(), NandError> {
        let path = self.path.clone();
        self.map.flush().map_err(io_at(&path, "sync".into()))
    }
}
