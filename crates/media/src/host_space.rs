//! The host's side of a file mapped as a medium: reserving its space, so that a store into a
//! hole of a full file system is an error at reservation and not a SIGBUS, and mapping its
//! pages in ahead of their first store, one call instead of a page fault per page.

use std::fs::File;
use std::os::unix::io::AsRawFd;

/// Reserves the host's space for `[offset, offset + len)` of `file` (`fallocate`). A file
/// system without `fallocate` (EOPNOTSUPP, ENOSYS) leaves the range as it was: `Ok(false)`.
pub(crate) fn reserve(file: &File, offset: u64, len: u64) -> std::io::Result<bool> {
    // SAFETY: fallocate on a descriptor the caller owns; no memory is passed.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, offset as libc::off_t, len as libc::off_t) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => Ok(false),
        _ => Err(e),
    }
}

/// Linux's value (uapi mman-common.h, 5.14 and later); the libc crate does not name it yet.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Maps every page of `[ptr, ptr + len)` writable now, without changing a byte; on tmpfs this
/// is also where a reserved page is zeroed. Returns false where the kernel cannot (before
/// 5.14, or a range not page-aligned): the pages then fault in at their first store, as
/// before. Best effort either way: nothing depends on it but speed.
///
/// # Safety
/// `[ptr, ptr + len)` lies inside one live shared mapping of the caller's, page-aligned at
/// `ptr`.
pub(crate) unsafe fn populate_write(ptr: *mut u8, len: usize) -> bool {
    // SAFETY: advice on a range of the caller's mapping (its contract); the call reads and
    // writes no byte beyond what a store would fault in.
    unsafe { libc::madvise(ptr.cast(), len, MADV_POPULATE_WRITE) == 0 }
}
