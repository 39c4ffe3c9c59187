//! ISA-L (Intel Intelligent Storage Acceleration Library): erasure code and CRC-32C, in two
//! builds side by side:
//! - **ISA-L 2.31**, bundled by the `isal-sys` crate and linked statically (built from source
//!   with nasm): it has AVX-512+GFNI and AVX2+GFNI erasure-code kernels;
//! - **Debian's ISA-L 2.30** (`libisal2`), which has none: loaded at run time with `dlopen`,
//!   `RTLD_LOCAL | RTLD_DEEPBIND`, so that its symbols (the same names as the static
//!   library's) stay its own and its internal calls bind to itself.
//!
//! `ec_encode_data` and `crc32_iscsi` dispatch at run time to the best kernel for the CPU;
//! the `_avx2` entry points pin the AVX2 kernel (what ISA-L runs on AVX2-only CPUs).

use std::ffi::CStr;
use std::os::raw::{c_int, c_uchar, c_uint, c_void};
use std::sync::OnceLock;

type Cauchy = unsafe extern "C" fn(*mut c_uchar, c_int, c_int);
type Invert = unsafe extern "C" fn(*mut c_uchar, *mut c_uchar, c_int) -> c_int;
type InitTables = unsafe extern "C" fn(c_int, c_int, *mut c_uchar, *mut c_uchar);
type Encode = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_uchar, *mut *mut c_uchar, *mut *mut c_uchar);
type Update = unsafe extern "C" fn(c_int, c_int, c_int, c_int, *mut c_uchar, *mut c_uchar, *mut *mut c_uchar);
type Crc = unsafe extern "C" fn(*mut c_uchar, c_int, c_uint) -> c_uint;

/// ISA-L 2.31's symbols, from the static library `isal-sys` builds (its bindings cover
/// igzip only; these are the prototypes of isa-l/include/erasure_code.h and crc.h).
mod bundled {
    use super::*;
    use isal_sys as _;
    extern "C" {
        pub fn gf_gen_cauchy1_matrix(a: *mut c_uchar, m: c_int, k: c_int);
        pub fn gf_invert_matrix(inp: *mut c_uchar, out: *mut c_uchar, n: c_int) -> c_int;
        pub fn ec_init_tables(k: c_int, rows: c_int, a: *mut c_uchar, gftbls: *mut c_uchar);
        /// The tables of the kernels without GFNI (`ec_init_tables` makes GFNI tables on a
        /// GFNI CPU, which the AVX2 kernel cannot read).
        pub fn ec_init_tables_base(k: c_int, rows: c_int, a: *mut c_uchar, gftbls: *mut c_uchar);
        pub fn ec_encode_data(
            len: c_int,
            k: c_int,
            rows: c_int,
            gftbls: *mut c_uchar,
            data: *mut *mut c_uchar,
            coding: *mut *mut c_uchar,
        );
        pub fn ec_encode_data_avx2(
            len: c_int,
            k: c_int,
            rows: c_int,
            gftbls: *mut c_uchar,
            data: *mut *mut c_uchar,
            coding: *mut *mut c_uchar,
        );
        pub fn ec_encode_data_update(
            len: c_int,
            k: c_int,
            rows: c_int,
            vec_i: c_int,
            gftbls: *mut c_uchar,
            data: *mut c_uchar,
            coding: *mut *mut c_uchar,
        );
        pub fn crc32_iscsi(buf: *mut c_uchar, len: c_int, init: c_uint) -> c_uint;
        pub fn crc32_iscsi_01(buf: *mut c_uchar, len: c_int, init: c_uint) -> c_uint;
    }
}

/// One build's entry points.
#[derive(Clone, Copy)]
struct Fns {
    cauchy: Cauchy,
    invert: Invert,
    init_tables: InitTables,
    /// Tables for the kernels without GFNI.
    init_tables_plain: InitTables,
    encode: Encode,
    encode_avx2: Encode,
    update: Update,
    crc: Crc,
    crc_01: Crc,
}

/// Which ISA-L.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// Debian's libisal 2.30, loaded at run time.
    Debian,
    /// ISA-L 2.31 from the isal-sys crate, linked statically.
    Bundled,
}

/// Which of ISA-L's kernels to call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// ISA-L's own run-time choice (the best for this CPU).
    Dispatch,
    /// The AVX2 (erasure code) or SSE4.2 three-way (CRC) kernel: what AVX2-only CPUs run.
    Avx2,
}

/// One ISA-L build, ready to call.
#[derive(Clone, Copy)]
pub struct Isal {
    pub build: Build,
    fns: Fns,
}

fn load_debian() -> Option<Fns> {
    let flags = libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND;
    // SAFETY: dlopen of a NUL-terminated constant name; the handle is never closed, so the
    // pointers taken from it stay valid for the process's life.
    let h = unsafe { libc::dlopen(c"libisal.so.2".as_ptr(), flags) };
    if h.is_null() {
        return None;
    }
    let sym = |name: &CStr| -> Option<*mut c_void> {
        // SAFETY: dlsym on a live handle with a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    // SAFETY: (each transmute) the symbol is ISA-L's function of that name, whose C prototype
    // (isa-l/erasure_code.h, crc.h; unchanged from 2.30 to 2.31) is the pointer type given.
    unsafe {
        Some(Fns {
            cauchy: std::mem::transmute::<*mut c_void, Cauchy>(sym(c"gf_gen_cauchy1_matrix")?),
            invert: std::mem::transmute::<*mut c_void, Invert>(sym(c"gf_invert_matrix")?),
            init_tables: std::mem::transmute::<*mut c_void, InitTables>(sym(c"ec_init_tables")?),
            // 2.30 has no GFNI tables: one kind for every kernel.
            init_tables_plain: std::mem::transmute::<*mut c_void, InitTables>(sym(c"ec_init_tables")?),
            encode: std::mem::transmute::<*mut c_void, Encode>(sym(c"ec_encode_data")?),
            encode_avx2: std::mem::transmute::<*mut c_void, Encode>(sym(c"ec_encode_data_avx2")?),
            update: std::mem::transmute::<*mut c_void, Update>(sym(c"ec_encode_data_update")?),
            crc: std::mem::transmute::<*mut c_void, Crc>(sym(c"crc32_iscsi")?),
            crc_01: std::mem::transmute::<*mut c_void, Crc>(sym(c"crc32_iscsi_01")?),
        })
    }
}

impl Isal {
    /// Debian's ISA-L 2.30, if `libisal.so.2` is installed (Debian: libisal2).
    pub fn debian() -> Option<Isal> {
        static FNS: OnceLock<Option<Fns>> = OnceLock::new();
        FNS.get_or_init(load_debian).map(|fns| Isal { build: Build::Debian, fns })
    }

    /// ISA-L 2.31, linked into every build of this crate.
    pub fn bundled() -> Isal {
        use bundled::*;
        let fns = Fns {
            cauchy: gf_gen_cauchy1_matrix,
            invert: gf_invert_matrix,
            init_tables: ec_init_tables,
            init_tables_plain: ec_init_tables_base,
            encode: ec_encode_data,
            encode_avx2: ec_encode_data_avx2,
            update: ec_encode_data_update,
            crc: crc32_iscsi,
            crc_01: crc32_iscsi_01,
        };
        Isal { build: Build::Bundled, fns }
    }

    /// Every build there is here: the bundled one, then Debian's if installed.
    pub fn all() -> Vec<Isal> {
        std::iter::once(Isal::bundled()).chain(Isal::debian()).collect()
    }

    /// "isa-l 2.31" or "isa-l 2.30".
    pub fn name(&self) -> &'static str {
        match self.build {
            Build::Bundled => "isa-l 2.31",
            Build::Debian => "isa-l 2.30",
        }
    }

    /// The erasure-code kernel family `kernel` runs on this CPU, as ISA-L's dispatcher
    /// picks it (2.31: AVX-512+GFNI, then AVX2+GFNI, then AVX-512, AVX2; 2.30: no GFNI).
    pub fn ec_family(&self, kernel: Kernel) -> &'static str {
        let f = cpu();
        match (kernel, self.build) {
            (Kernel::Avx2, _) => "avx2",
            (Kernel::Dispatch, Build::Bundled) if f.avx512 && f.gfni => "avx512+gfni",
            (Kernel::Dispatch, Build::Bundled) if f.avx2 && f.gfni && !f.avx512 => "avx2+gfni",
            (Kernel::Dispatch, _) if f.avx512 => "avx512",
            (Kernel::Dispatch, _) if f.avx2 => "avx2",
            (Kernel::Dispatch, _) => "sse",
        }
    }

    /// The CRC-32C kernel family `kernel` runs on this CPU (both builds: the AVX-512
    /// VPCLMULQDQ folding kernel where there is one, else PCLMULQDQ; `Avx2`: the SSE4.2
    /// crc32-instruction three-way kernel).
    pub fn crc_family(&self, kernel: Kernel) -> &'static str {
        let f = cpu();
        match kernel {
            Kernel::Avx2 => "sse4.2",
            Kernel::Dispatch if f.avx512 && f.vpclmulqdq => "avx512+vpclmulqdq",
            Kernel::Dispatch => "pclmulqdq",
        }
    }

    /// `gf_gen_cauchy1_matrix(a, k + m, k)`: the (k + m) x k encoding matrix.
    pub fn cauchy_matrix(&self, k: usize, m: usize) -> Vec<u8> {
        let mut a = vec![0u8; (k + m) * k];
        // SAFETY: `a` holds (k + m) * k bytes, what ISA-L writes.
        unsafe { (self.fns.cauchy)(a.as_mut_ptr(), (k + m) as i32, k as i32) };
        a
    }

    /// `gf_invert_matrix`: the inverse of the n x n matrix, or `None` if singular.
    pub fn invert(&self, a: &[u8], n: usize) -> Option<Vec<u8>> {
        assert_eq!(a.len(), n * n);
        let mut inp = a.to_vec();
        let mut out = vec![0u8; n * n];
        // SAFETY: both buffers hold n * n bytes.
        let rc = unsafe { (self.fns.invert)(inp.as_mut_ptr(), out.as_mut_ptr(), n as i32) };
        (rc == 0).then_some(out)
    }

    /// Expanded multiplication tables of this build for the row-major `rows` x `k` matrix
    /// `coeffs`, for `kernel` (`ec_init_tables`: 2.31 makes GFNI tables on a GFNI CPU for its
    /// dispatched kernels, plain ones for the AVX2 kernel).
    pub fn tables(&self, k: usize, rows: usize, coeffs: &[u8], kernel: Kernel) -> Tables {
        assert_eq!(coeffs.len(), k * rows);
        let mut c = coeffs.to_vec();
        let mut t = vec![0u8; 32 * k * rows];
        let (init, encode) = match kernel {
            Kernel::Dispatch => (self.fns.init_tables, self.fns.encode),
            Kernel::Avx2 => (self.fns.init_tables_plain, self.fns.encode_avx2),
        };
        // SAFETY: ISA-L writes at most 32 bytes per coefficient into `t`.
        unsafe { init(k as i32, rows as i32, c.as_mut_ptr(), t.as_mut_ptr()) };
        Tables { encode, update: self.fns.update, kernel, k, rows, t }
    }

    /// Standard CRC-32C of `data` through `crc32_iscsi` (initial value and final XOR all ones).
    pub fn crc32c(&self, kernel: Kernel, data: &[u8]) -> u32 {
        let f = match kernel {
            Kernel::Dispatch => self.fns.crc,
            Kernel::Avx2 => self.fns.crc_01,
        };
        // SAFETY: ISA-L reads `len` bytes of `data`.
        !unsafe { f(data.as_ptr() as *mut u8, data.len() as i32, !0) }
    }
}

struct Cpu {
    avx2: bool,
    avx512: bool,
    gfni: bool,
    vpclmulqdq: bool,
}

fn cpu() -> Cpu {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        // ISA-L's AVX-512 check asks for F, DQ, CD, BW and VL together.
        let avx512 =
            has!("avx512f") && has!("avx512dq") && has!("avx512cd") && has!("avx512bw") && has!("avx512vl");
        Cpu { avx2: has!("avx2"), avx512, gfni: has!("gfni"), vpclmulqdq: has!("vpclmulqdq") }
    }
    #[cfg(not(target_arch = "x86_64"))]
    Cpu { avx2: false, avx512: false, gfni: false, vpclmulqdq: false }
}

/// Expanded multiplication tables of one build, for one kernel.
#[derive(Clone)]
pub struct Tables {
    encode: Encode,
    update: Update,
    kernel: Kernel,
    k: usize,
    rows: usize,
    t: Vec<u8>,
}

impl Tables {
    /// The expanded tables' bytes (their layout is the build's and the kernel's).
    pub fn raw(&self) -> &[u8] {
        &self.t
    }

    /// `ec_encode_data` (or the kernel the tables were made for): `outs[j] = sum_i
    /// coeffs[j][i] * data[i]`.
    pub fn encode(&mut self, data: &[&[u8]], outs: &mut [&mut [u8]]) {
        assert_eq!(data.len(), self.k);
        assert_eq!(outs.len(), self.rows);
        let len = data[0].len();
        assert!(data.iter().all(|d| d.len() == len) && outs.iter().all(|o| o.len() == len));
        let mut d: Vec<*mut u8> = data.iter().map(|d| d.as_ptr() as *mut u8).collect();
        let mut o: Vec<*mut u8> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        // SAFETY: k data pointers and `rows` output pointers of `len` bytes each; ISA-L only
        // reads the data buffers.
        unsafe {
            (self.encode)(
                len as i32,
                self.k as i32,
                self.rows as i32,
                self.t.as_mut_ptr(),
                d.as_mut_ptr(),
                o.as_mut_ptr(),
            )
        };
    }

    /// `ec_encode_data_update`: folds data chunk `index`'s `src` into the outputs
    /// (ISA-L's update path: outs[j] ^= coeffs[j][index] * src).
    pub fn update(&mut self, index: usize, src: &[u8], outs: &mut [&mut [u8]]) {
        assert_eq!(outs.len(), self.rows);
        assert!(outs.iter().all(|o| o.len() == src.len()));
        assert_eq!(self.kernel, Kernel::Dispatch, "the update path takes the dispatched tables");
        let mut o: Vec<*mut u8> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        // SAFETY: `rows` outputs of src.len() bytes; ISA-L only reads `src`.
        unsafe {
            (self.update)(
                src.len() as i32,
                self.k as i32,
                self.rows as i32,
                index as i32,
                self.t.as_mut_ptr(),
                src.as_ptr() as *mut u8,
                o.as_mut_ptr(),
            )
        };
    }
}
