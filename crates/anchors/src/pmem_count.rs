//! Counting PMDK's persistent line writes: libpmemobj calls libpmem's `pmem_flush`,
//! `pmem_persist`, `pmem_memcpy`, `pmem_memmove` and `pmem_memset` through its dynamic symbol
//! table, so a `bitmend` binary that exports these names (its build script asks the linker
//! to) is called instead. Each wrapper counts the 64-byte lines of its range that lie in the
//! watched mapping, then calls the real function (found with `dlsym(RTLD_NEXT)`): PMDK runs
//! as it would, with its own copy and flush code.
//!
//! A binary that does not export them (the anchors' own tests) never reaches these, and
//! [`interposed`] says so.

use std::collections::HashMap;
use std::os::raw::{c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

const LINE: usize = 64;
#[cfg_attr(not(has_pmemobj), allow(dead_code))]
/// libpmem.h's PMEM_F_MEM_NOFLUSH: a copy left in the cache, written back by a later
/// `pmem_flush` (counted there).
const NOFLUSH: c_uint = 1 << 5;

static WATCH_BASE: AtomicUsize = AtomicUsize::new(0);
static WATCH_LEN: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);
static CALLED: AtomicBool = AtomicBool::new(false);
static COUNTS: Mutex<Option<HashMap<usize, u32>>> = Mutex::new(None);

/// Starts counting the line writes libpmem makes into `[base, base + len)`, from zero.
pub fn watch(base: usize, len: usize) {
    *COUNTS.lock().unwrap_or_else(|e| e.into_inner()) = Some(HashMap::new());
    WATCH_BASE.store(base, Ordering::SeqCst);
    WATCH_LEN.store(len, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
}

/// Stops counting; returns the writes per line (lines never written left out).
pub fn take() -> Vec<u32> {
    COUNTING.store(false, Ordering::SeqCst);
    let counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
    counts.into_values().collect()
}

/// Whether libpmemobj's calls have reached these wrappers (the binary exports them).
pub fn interposed() -> bool {
    CALLED.load(Ordering::SeqCst)
}

#[cfg_attr(not(has_pmemobj), allow(dead_code))]
fn count(addr: *const c_void, len: usize) {
    CALLED.store(true, Ordering::Relaxed);
    if !COUNTING.load(Ordering::Relaxed) || len == 0 {
        return;
    }
    let (base, watched) = (WATCH_BASE.load(Ordering::Relaxed), WATCH_LEN.load(Ordering::Relaxed));
    let start = (addr as usize).max(base);
    let end = (addr as usize + len).min(base + watched);
    if start >= end {
        return;
    }
    let mut guard = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(counts) = guard.as_mut() {
        for line in (start - base) / LINE..=(end - 1 - base) / LINE {
            *counts.entry(line).or_insert(0) += 1;
        }
    }
}

/// The wrappers, linked only with libpmemobj (whose libpmem they forward to).
#[cfg(has_pmemobj)]
mod wrappers {
    use super::*;
    use std::os::raw::c_int;
    use std::sync::OnceLock;

    type FlushFn = unsafe extern "C" fn(*const c_void, usize);
    type CopyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_uint) -> *mut c_void;
    type SetFn = unsafe extern "C" fn(*mut c_void, c_int, usize, c_uint) -> *mut c_void;

    /// libpmem's own function `name`, the next definition after this binary's.
    fn real<T: Copy + 'static>(cell: &'static OnceLock<usize>, name: &'static [u8]) -> T {
        let at = *cell.get_or_init(|| {
            // SAFETY: `name` is NUL-terminated; dlsym has no other preconditions.
            let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
            assert!(!p.is_null(), "libpmem's {} not found", String::from_utf8_lossy(&name[..name.len() - 1]));
            p as usize
        });
        // SAFETY: `at` is the address of libpmem's function of type T (the signatures above are
        // libpmem.h's), and T is a function pointer type of the same size as usize.
        unsafe { std::mem::transmute_copy::<usize, T>(&at) }
    }

    /// A wrapper that counts the lines of `(addr, len)` when `$counted` says so, then calls
    /// libpmem's function of the same name with the same arguments.
    macro_rules! interpose {
        ($name:ident, $ty:ty, ($($arg:ident: $t:ty),*) -> $ret:ty, $counted:expr, $addr:ident, $len:ident) => {
            /// # Safety
            /// libpmem's contract for this function: its ranges are mapped, the source
            /// readable, the destination writable.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $t),*) -> $ret {
                static REAL: OnceLock<usize> = OnceLock::new();
                count($addr as *const c_void, if $counted { $len } else { 0 });
                // SAFETY: forwarding the caller's arguments to the real function.
                unsafe { real::<$ty>(&REAL, concat!(stringify!($name), "\0").as_bytes())($($arg),*) }
            }
        };
    }

    interpose!(pmem_flush, FlushFn, (addr: *const c_void, len: usize) -> (), true, addr, len);
    interpose!(pmem_persist, FlushFn, (addr: *const c_void, len: usize) -> (), true, addr, len);
    interpose!(
        pmem_memcpy, CopyFn,
        (dest: *mut c_void, src: *const c_void, len: usize, flags: c_uint) -> *mut c_void,
        flags & NOFLUSH == 0, dest, len
    );
    interpose!(
        pmem_memmove, CopyFn,
        (dest: *mut c_void, src: *const c_void, len: usize, flags: c_uint) -> *mut c_void,
        flags & NOFLUSH == 0, dest, len
    );
    interpose!(
        pmem_memset, SetFn,
        (dest: *mut c_void, c: c_int, len: usize, flags: c_uint) -> *mut c_void,
        flags & NOFLUSH == 0, dest, len
    );
}
