//! A region guarded by page protection: every store is wrapped in two `mprotect` calls.
//!
//! This is the alternative PRIMS measures itself against (its Figure 2): the region stays
//! read-only, so a wild write faults; a legitimate store unprotects the pages it touches,
//! writes, and protects them again, paying two page-table changes and a TLB flush.

use super::{check_range, LineCounters, Region, RegionError};

/// An anonymous read-only mapping whose stores go through `mprotect`.
pub struct ProtectedRegion {
    ptr: *mut u8,
    len: usize,
    map_len: usize,
    page: usize,
    counters: LineCounters,
}

// SAFETY: the mapping is owned by this value alone and reached only through &self/&mut self.
unsafe impl Send for ProtectedRegion {}

fn os_error(context: &str) -> RegionError {
    RegionError::Io { context: context.to_string(), source: std::io::Error::last_os_error() }
}

impl ProtectedRegion {
    /// A zeroed, read-only region of `len` bytes.
    pub fn new(len: usize) -> Result<ProtectedRegion, RegionError> {
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let map_len = len.max(1).div_ceil(page) * page;
        // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("mmap"));
        }
        Ok(ProtectedRegion { ptr: ptr as *mut u8, len, map_len, page, counters: LineCounters::new(len) })
    }

    /// Sets the protection of the pages covering `[offset, offset + len)`.
    fn protect(&mut self, offset: usize, len: usize, prot: libc::c_int) -> Result<(), RegionError> {
        let start = offset / self.page * self.page;
        let end = (offset + len).div_ceil(self.page) * self.page;
        // SAFETY: [start, end) lies within our mapping (end <= map_len since offset + len <= len).
        if unsafe { libc::mprotect(self.ptr.add(start) as *mut libc::c_void, end - start, prot) } != 0 {
            return Err(os_error("mprotect"));
        }
        Ok(())
    }

    /// Unprotect, copy, protect: what a guarded store costs.
    fn guarded_copy(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        check_range(offset, data.len(), self.len)?;
        if data.is_empty() {
            return Ok(());
        }
        self.protect(offset, data.len(), libc::PROT_READ | libc::PROT_WRITE)?;
        // SAFETY: the destination lies within our mapping and was just made writable; the
        // source is a distinct slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
        self.protect(offset, data.len(), libc::PROT_READ)
    }
}

impl std::fmt::Debug for ProtectedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectedRegion").field("len", &self.len).finish_non_exhaustive()
    }
}

impl Drop for ProtectedRegion {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping we created; no slice of it outlives self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.map_len) };
    }
}

impl Region for ProtectedRegion {
    fn len(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is our live mapping, always readable.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.guarded_copy(offset, data)?;
        self.counters.touch(offset, data.len());
        Ok(())
    }

    fn update(&mut self, offset: usize, len: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<(), RegionError> {
        check_range(offset, len, self.len)?;
        if len == 0 {
            return Ok(());
        }
        self.protect(offset, len, libc::PROT_READ | libc::PROT_WRITE)?;
        // SAFETY: the range lies within our mapping and was just made writable; &mut self
        // keeps every other view of it away while f runs.
        f(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) });
        self.counters.touch(offset, len);
        self.protect(offset, len, libc::PROT_READ)
    }

    fn flush(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        check_range(offset, len, self.len)
    }

    fn fence(&mut self) -> Result<(), RegionError> {
        Ok(())
    }

    fn line_writes(&self) -> &[u32] {
        self.counters.as_slice()
    }

    fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.guarded_copy(offset, data)
    }
}
