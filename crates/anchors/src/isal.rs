//! ISA-L (Intel Intelligent Storage Acceleration Library): erasure code and CRC-32C.
//!
//! `ec_encode_data` and `crc32_iscsi` dispatch at run time to the best kernel for the CPU
//! (AVX-512 on CPUs that have it); the `_avx2` entry points pin the AVX2 kernel, which is what
//! ISA-L runs on AVX2-only CPUs such as AMD Zen 3.

#[cfg(has_isal)]
mod ffi {
    use std::os::raw::{c_int, c_uchar, c_uint};
    extern "C" {
        pub fn gf_gen_cauchy1_matrix(a: *mut c_uchar, m: c_int, k: c_int);
        pub fn gf_invert_matrix(inp: *mut c_uchar, out: *mut c_uchar, n: c_int) -> c_int;
        pub fn ec_init_tables(k: c_int, rows: c_int, a: *mut c_uchar, gftbls: *mut c_uchar);
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

/// Whether this build linked ISA-L.
pub const fn available() -> bool {
    cfg!(has_isal)
}

/// Which of ISA-L's dispatched kernels to call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// ISA-L's own run-time choice (the best for this CPU).
    Dispatch,
    /// The AVX2 (erasure code) or SSE4.2 three-way (CRC) kernel: what AVX2-only CPUs run.
    Avx2,
}

/// `gf_gen_cauchy1_matrix(a, k + m, k)`: the (k + m) x k encoding matrix.
pub fn cauchy_matrix(k: usize, m: usize) -> Option<Vec<u8>> {
    #[cfg(has_isal)]
    {
        let mut a = vec![0u8; (k + m) * k];
        // SAFETY: `a` holds (k + m) * k bytes, what ISA-L writes.
        unsafe { ffi::gf_gen_cauchy1_matrix(a.as_mut_ptr(), (k + m) as i32, k as i32) };
        Some(a)
    }
    #[cfg(not(has_isal))]
    {
        let _ = (k, m);
        None
    }
}

/// `gf_invert_matrix`: the inverse of the n x n matrix, or `None` if singular or no ISA-L.
pub fn invert(a: &[u8], n: usize) -> Option<Vec<u8>> {
    #[cfg(has_isal)]
    {
        assert_eq!(a.len(), n * n);
        let mut inp = a.to_vec();
        let mut out = vec![0u8; n * n];
        // SAFETY: both buffers hold n * n bytes.
        let rc = unsafe { ffi::gf_invert_matrix(inp.as_mut_ptr(), out.as_mut_ptr(), n as i32) };
        (rc == 0).then_some(out)
    }
    #[cfg(not(has_isal))]
    {
        let _ = (a, n);
        None
    }
}

/// Expanded multiplication tables for `rows` x `k` coefficients (`ec_init_tables`).
#[derive(Clone, Debug)]
pub struct Tables {
    k: usize,
    rows: usize,
    #[cfg_attr(not(has_isal), allow(dead_code))]
    t: Vec<u8>,
}

impl Tables {
    /// Tables for the row-major `rows` x `k` matrix `coeffs`.
    pub fn new(k: usize, rows: usize, coeffs: &[u8]) -> Option<Tables> {
        assert_eq!(coeffs.len(), k * rows);
        #[cfg(has_isal)]
        {
            let mut c = coeffs.to_vec();
            let mut t = vec![0u8; 32 * k * rows];
            // SAFETY: ISA-L writes 32 bytes per coefficient into `t`.
            unsafe { ffi::ec_init_tables(k as i32, rows as i32, c.as_mut_ptr(), t.as_mut_ptr()) };
            Some(Tables { k, rows, t })
        }
        #[cfg(not(has_isal))]
        {
            None
        }
    }

    /// `ec_encode_data`: `outs[j] = sum_i coeffs[j][i] * data[i]`.
    pub fn encode(&mut self, kernel: Kernel, data: &[&[u8]], outs: &mut [&mut [u8]]) {
        assert_eq!(data.len(), self.k);
        assert_eq!(outs.len(), self.rows);
        let len = data[0].len();
        assert!(data.iter().all(|d| d.len() == len) && outs.iter().all(|o| o.len() == len));
        #[cfg(has_isal)]
        {
            let mut d: Vec<*mut u8> = data.iter().map(|d| d.as_ptr() as *mut u8).collect();
            let mut o: Vec<*mut u8> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
            let f = match kernel {
                Kernel::Dispatch => ffi::ec_encode_data,
                Kernel::Avx2 => ffi::ec_encode_data_avx2,
            };
            // SAFETY: k data pointers and `rows` output pointers of `len` bytes each; ISA-L
            // only reads the data buffers.
            unsafe {
                f(
                    len as i32,
                    self.k as i32,
                    self.rows as i32,
                    self.t.as_mut_ptr(),
                    d.as_mut_ptr(),
                    o.as_mut_ptr(),
                )
            };
        }
        #[cfg(not(has_isal))]
        let _ = kernel;
    }

    /// `ec_encode_data_update`: folds data chunk `index`'s `delta_src` into the outputs
    /// (ISA-L's update path: outs[j] ^= coeffs[j][index] * src).
    pub fn update(&mut self, index: usize, src: &[u8], outs: &mut [&mut [u8]]) {
        assert_eq!(outs.len(), self.rows);
        assert!(outs.iter().all(|o| o.len() == src.len()));
        #[cfg(has_isal)]
        {
            let mut o: Vec<*mut u8> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
            // SAFETY: `rows` outputs of src.len() bytes; ISA-L only reads `src`.
            unsafe {
                ffi::ec_encode_data_update(
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
        #[cfg(not(has_isal))]
        let _ = index;
    }
}

/// Standard CRC-32C of `data` through `crc32_iscsi` (initial value and final XOR all ones).
pub fn crc32c(kernel: Kernel, data: &[u8]) -> Option<u32> {
    #[cfg(has_isal)]
    {
        let f = match kernel {
            Kernel::Dispatch => ffi::crc32_iscsi,
            Kernel::Avx2 => ffi::crc32_iscsi_01,
        };
        // SAFETY: ISA-L reads `len` bytes of `data`.
        Some(!unsafe { f(data.as_ptr() as *mut u8, data.len() as i32, !0) })
    }
    #[cfg(not(has_isal))]
    {
        let _ = (kernel, data);
        None
    }
}
