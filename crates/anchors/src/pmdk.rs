//! PMDK's libpmemobj: undo-logged transactions on a persistent-memory pool, the system a
//! developer would otherwise use for data that must survive crashes in persistent memory.
//!
//! Only what the benchmarks need: a pool with a root object, and a transaction that snapshots
//! a range (`pmemobj_tx_add_range_direct`) and overwrites it. Run with `PMEM_IS_PMEM_FORCE=1`
//! on a tmpfs pool so that PMDK flushes cache lines rather than calling msync, as it would on
//! real persistent memory.

use std::path::Path;

#[cfg(has_pmemobj)]
mod ffi {
    use std::os::raw::{c_char, c_int, c_void};

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct PmemOid {
        pub pool_uuid_lo: u64,
        pub off: u64,
    }

    extern "C" {
        pub fn pmemobj_create(
            path: *const c_char,
            layout: *const c_char,
            size: usize,
            mode: u32,
        ) -> *mut c_void;
        pub fn pmemobj_close(pop: *mut c_void);
        pub fn pmemobj_root(pop: *mut c_void, size: usize) -> PmemOid;
        pub fn pmemobj_direct(oid: PmemOid) -> *mut c_void;
        pub fn pmemobj_errormsg() -> *const c_char;
        pub fn pmemobj_tx_begin(pop: *mut c_void, env: *mut c_void, ...) -> c_int;
        pub fn pmemobj_tx_add_range_direct(ptr: *const c_void, size: usize) -> c_int;
        pub fn pmemobj_tx_commit();
        pub fn pmemobj_tx_end() -> c_int;
        pub fn pmemobj_alloc(
            pop: *mut c_void,
            oidp: *mut PmemOid,
            size: usize,
            type_num: u64,
            constructor: *const c_void,
            arg: *mut c_void,
        ) -> c_int;
        pub fn pmemobj_free(oidp: *mut PmemOid);
    }

    /// `enum pobj_tx_param`'s TX_PARAM_NONE, which ends pmemobj_tx_begin's variadic list.
    pub const TX_PARAM_NONE: c_int = 0;

    pub fn last_error() -> String {
        // SAFETY: pmemobj_errormsg returns a pointer to a thread-local NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(pmemobj_errormsg()) }.to_string_lossy().into_owned()
    }
}

/// Whether this build linked libpmemobj.
pub const fn available() -> bool {
    cfg!(has_pmemobj)
}

/// A libpmemobj pool with a root object of a fixed size; removed when dropped.
pub struct Pool {
    #[cfg(has_pmemobj)]
    pop: *mut std::os::raw::c_void,
    #[cfg(has_pmemobj)]
    root: *mut u8,
    root_len: usize,
    pool_len: usize,
    path: std::path::PathBuf,
}

impl Pool {
    /// Creates a pool file at `path` (which must not exist) of `pool_len` bytes with a zeroed
    /// root object of `root_len` bytes. `None` when libpmemobj is not linked.
    pub fn create(path: &Path, pool_len: usize, root_len: usize) -> Option<Result<Pool, String>> {
        #[cfg(has_pmemobj)]
        {
            use std::ffi::CString;
            let cpath = match CString::new(path.as_os_str().as_encoded_bytes()) {
                Ok(c) => c,
                Err(_) => return Some(Err("pool path contains a NUL byte".into())),
            };
            let layout = CString::new("bitmend-bench").expect("no NUL");
            // SAFETY: valid NUL-terminated strings; libpmemobj creates and maps the file.
            let pop = unsafe { ffi::pmemobj_create(cpath.as_ptr(), layout.as_ptr(), pool_len, 0o600) };
            if pop.is_null() {
                return Some(Err(format!("pmemobj_create {}: {}", path.display(), ffi::last_error())));
            }
            // SAFETY: pop is a live pool; pmemobj_root allocates (zeroed) or returns the root.
            let oid = unsafe { ffi::pmemobj_root(pop, root_len) };
            // SAFETY: oid comes from this pool.
            let root = unsafe { ffi::pmemobj_direct(oid) } as *mut u8;
            if root.is_null() {
                // SAFETY: closing the pool we opened.
                unsafe { ffi::pmemobj_close(pop) };
                let _ = std::fs::remove_file(path);
                return Some(Err(format!("pmemobj_root: {}", ffi::last_error())));
            }
            Some(Ok(Pool { pop, root, root_len, pool_len, path: path.to_path_buf() }))
        }
        #[cfg(not(has_pmemobj))]
        {
            let _ = (path, pool_len, root_len);
            None
        }
    }

    /// One transaction: snapshot `[off, off + data.len())` of the root object into the undo
    /// log, copy `data` there, commit (PMDK persists the range and retires the log).
    pub fn tx_write(&mut self, off: usize, data: &[u8]) -> Result<(), String> {
        if off.checked_add(data.len()).is_none_or(|e| e > self.root_len) {
            return Err(format!("range {off}+{} outside the {}-byte root", data.len(), self.root_len));
        }
        #[cfg(has_pmemobj)]
        {
            // SAFETY: a transaction on our pool, on this thread, with no jmp_buf (errors come
            // back as return codes); the range lies within the root object, checked above;
            // the copy's source and destination do not overlap (data is a Rust slice outside
            // the pool mapping or a distinct range of it).
            unsafe {
                if ffi::pmemobj_tx_begin(self.pop, std::ptr::null_mut(), ffi::TX_PARAM_NONE) != 0 {
                    let e = ffi::last_error();
                    ffi::pmemobj_tx_end();
                    return Err(format!("pmemobj_tx_begin: {e}"));
                }
                let dst = self.root.add(off);
                if ffi::pmemobj_tx_add_range_direct(dst as *const _, data.len()) != 0 {
                    let e = ffi::last_error();
                    ffi::pmemobj_tx_end();
                    return Err(format!("pmemobj_tx_add_range_direct: {e}"));
                }
                std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
                ffi::pmemobj_tx_commit();
                if ffi::pmemobj_tx_end() != 0 {
                    return Err(format!("pmemobj_tx_end: {}", ffi::last_error()));
                }
            }
            Ok(())
        }
        #[cfg(not(has_pmemobj))]
        {
            Err("libpmemobj is not linked".into())
        }
    }

    /// Allocates `size` bytes with `pmemobj_alloc`, its handle stored atomically in slot
    /// `slot` of the root object (an array of 16-byte object ids): PMDK's redo-logged
    /// allocation, linked in one operation.
    pub fn alloc_into(&mut self, slot: usize, size: usize) -> Result<(), String> {
        self.check_slot(slot)?;
        #[cfg(has_pmemobj)]
        {
            // SAFETY: the slot lies within the root object (checked), 16-byte aligned in the
            // pool (the root is); no constructor.
            let r = unsafe {
                let oidp = self.root.add(slot * 16) as *mut ffi::PmemOid;
                ffi::pmemobj_alloc(self.pop, oidp, size, 1, std::ptr::null(), std::ptr::null_mut())
            };
            if r != 0 {
                return Err(format!("pmemobj_alloc: {}", ffi::last_error()));
            }
            Ok(())
        }
        #[cfg(not(has_pmemobj))]
        {
            let _ = size;
            Err("libpmemobj is not linked".into())
        }
    }

    /// Frees the object slot `slot` holds with `pmemobj_free`, which zeroes the slot.
    pub fn free_slot(&mut self, slot: usize) -> Result<(), String> {
        self.check_slot(slot)?;
        #[cfg(has_pmemobj)]
        {
            // SAFETY: the slot lies within the root object and holds an id this pool's
            // pmemobj_alloc stored, or zero (pmemobj_free does nothing then).
            unsafe { ffi::pmemobj_free(self.root.add(slot * 16) as *mut ffi::PmemOid) };
            Ok(())
        }
        #[cfg(not(has_pmemobj))]
        {
            Err("libpmemobj is not linked".into())
        }
    }

    fn check_slot(&self, slot: usize) -> Result<(), String> {
        if slot.checked_mul(16).is_none_or(|at| at + 16 > self.root_len) {
            return Err(format!("slot {slot} outside the {}-byte root", self.root_len));
        }
        Ok(())
    }

    /// Where the pool is mapped, and its length (for counting writes to its lines).
    pub fn mapping(&self) -> (usize, usize) {
        #[cfg(has_pmemobj)]
        {
            (self.pop as usize, self.pool_len)
        }
        #[cfg(not(has_pmemobj))]
        {
            (0, self.pool_len)
        }
    }

    /// The root object's bytes.
    pub fn root(&self) -> &[u8] {
        #[cfg(has_pmemobj)]
        {
            // SAFETY: root..root+root_len is the root object inside our live mapping.
            unsafe { std::slice::from_raw_parts(self.root, self.root_len) }
        }
        #[cfg(not(has_pmemobj))]
        {
            &[]
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        #[cfg(has_pmemobj)]
        // SAFETY: closing the pool we created; no slice of it outlives self.
        unsafe {
            ffi::pmemobj_close(self.pop)
        };
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(has_btree_map)]
mod btree_ffi {
    use super::ffi::PmemOid;
    use std::os::raw::{c_int, c_void};

    extern "C" {
        pub fn bitmend_btree_create(pop: *mut c_void, slot: *mut PmemOid) -> c_int;
        pub fn bitmend_btree_insert(
            pop: *mut c_void,
            map: PmemOid,
            key: u64,
            data: *const c_void,
            len: usize,
        ) -> c_int;
        pub fn bitmend_btree_get(pop: *mut c_void, map: PmemOid, key: u64) -> *const c_void;
    }
}

/// PMDK's example B-tree (`btree_map`, order 8) in a pool's root object: each insert one
/// transaction that allocates the value object, copies the value in and links it.
pub struct BTreeMap {
    pool: Pool,
}

/// Whether this build compiled PMDK's example B-tree.
pub const fn btree_available() -> bool {
    cfg!(has_btree_map)
}

impl BTreeMap {
    /// A new map in a new pool at `path`. `None` when the example was not compiled in.
    pub fn create(path: &Path, pool_len: usize) -> Option<Result<BTreeMap, String>> {
        #[cfg(has_btree_map)]
        {
            let pool = match Pool::create(path, pool_len, 16)? {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            // SAFETY: the root object is 16 bytes in this pool: room for the map's id.
            let r = unsafe { btree_ffi::bitmend_btree_create(pool.pop, pool.root as *mut ffi::PmemOid) };
            if r != 0 {
                return Some(Err(format!("btree_map_create: {}", ffi::last_error())));
            }
            Some(Ok(BTreeMap { pool }))
        }
        #[cfg(not(has_btree_map))]
        {
            let _ = (path, pool_len);
            None
        }
    }

    #[cfg(has_btree_map)]
    fn map(&self) -> ffi::PmemOid {
        // SAFETY: the root object holds the map's id, written by btree_map_create.
        unsafe { std::ptr::read(self.pool.root as *const ffi::PmemOid) }
    }

    /// Inserts `key` with a copy of `value` (one transaction).
    pub fn insert(&mut self, key: u64, value: &[u8]) -> Result<(), String> {
        #[cfg(has_btree_map)]
        {
            // SAFETY: a live pool and map; the value is read for `value.len()` bytes.
            let r = unsafe {
                btree_ffi::bitmend_btree_insert(
                    self.pool.pop,
                    self.map(),
                    key,
                    value.as_ptr().cast(),
                    value.len(),
                )
            };
            if r != 0 {
                return Err(format!("btree_map_insert_new: {}", ffi::last_error()));
            }
            Ok(())
        }
        #[cfg(not(has_btree_map))]
        {
            let _ = (key, value);
            Err("PMDK's btree_map is not compiled in".into())
        }
    }

    /// The first `len` bytes of `key`'s value.
    pub fn get(&self, key: u64, len: usize) -> Option<&[u8]> {
        #[cfg(has_btree_map)]
        {
            // SAFETY: a live pool and map; a value object of this map holds at least the
            // `len` bytes its insert copied (the caller's length).
            unsafe {
                let p = btree_ffi::bitmend_btree_get(self.pool.pop, self.map(), key);
                (!p.is_null()).then(|| std::slice::from_raw_parts(p as *const u8, len))
            }
        }
        #[cfg(not(has_btree_map))]
        {
            let _ = (key, len);
            None
        }
    }

    /// Where the pool is mapped, and its length.
    pub fn mapping(&self) -> (usize, usize) {
        self.pool.mapping()
    }
}
