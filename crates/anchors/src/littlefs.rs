//! littlefs, through the `littlefs2` crate (which builds littlefs's own C sources), running on
//! the same simulated NAND chip as bitmend's flash file system, so that both are charged by
//! one timing model and held to the same media rules: a page is programmed once per erase,
//! in order. littlefs is what an embedded developer would otherwise pick for raw flash.
//!
//! littlefs addresses the chip as blocks of bytes; one littlefs block is one erase block and
//! its read and program unit is one page (NAND reads and programs whole pages). It keeps no
//! data in the spare area, which it leaves erased, and relies on the chip's ECC for bit
//! errors, which is what bitmend does without.

use std::cell::RefCell;
use std::rc::Rc;

use bitmend_media::nand::{Geometry, Nand, NandError};
use littlefs2::consts::{U16, U2048};
use littlefs2::driver::Storage;
use littlefs2::io::{Error, Result};

pub use littlefs2::fs::{Allocation, Filesystem};
pub use littlefs2::io::{Error as LfsError, Result as LfsResult, SeekFrom};
pub use littlefs2::path::PathBuf;

/// The only geometry the storage is compiled for (littlefs2 takes it as constants): RCFFS's
/// chip, 128 MiB of 2 KiB pages in 128 KiB erase blocks.
pub const GEOMETRY: Geometry = Geometry::RCFFS;

/// A NAND chip seen by littlefs. The chip is shared so that the caller can read its counters
/// while littlefs holds the storage.
pub struct NandStorage<N: Nand> {
    nand: Rc<RefCell<N>>,
    spare: Vec<u8>,
    /// The first chip error littlefs saw (littlefs itself only reports "I/O error").
    pub last_error: Option<NandError>,
}

impl<N: Nand> NandStorage<N> {
    /// Wraps `nand`, which must have [`GEOMETRY`]; returns the storage and a handle on the chip.
    pub fn new(nand: N) -> std::result::Result<(Self, Rc<RefCell<N>>), String> {
        let g = nand.geometry();
        if g != GEOMETRY {
            return Err(format!("littlefs anchor is built for {GEOMETRY}, not {g}"));
        }
        let nand = Rc::new(RefCell::new(nand));
        let spare = vec![0xFF; g.spare_size as usize];
        Ok((NandStorage { nand: nand.clone(), spare, last_error: None }, nand))
    }

    fn fail(&mut self, e: NandError) -> Error {
        self.last_error.get_or_insert(e);
        Error::IO
    }
}

const PAGE: usize = GEOMETRY.page_size as usize;
const BLOCK: usize = PAGE * GEOMETRY.pages_per_block as usize;

impl<N: Nand> Storage for NandStorage<N> {
    const READ_SIZE: usize = PAGE;
    const WRITE_SIZE: usize = PAGE;
    const BLOCK_SIZE: usize = BLOCK;
    const BLOCK_COUNT: usize = GEOMETRY.blocks as usize;
    // littlefs's recommended range is 100-1000; it moves metadata after this many erases.
    const BLOCK_CYCLES: isize = 500;
    type CACHE_SIZE = U2048;
    // 16 x 8 bytes of lookahead bitmap: 1024 blocks, the whole chip, in one scan.
    type LOOKAHEAD_SIZE = U16;

    fn read(&mut self, off: usize, buf: &mut [u8]) -> Result<usize> {
        for (i, page) in buf.chunks_mut(PAGE).enumerate() {
            let r = self.nand.borrow_mut().read_data((off / PAGE + i) as u32, page);
            r.map_err(|e| self.fail(e))?;
        }
        Ok(buf.len())
    }

    fn write(&mut self, off: usize, data: &[u8]) -> Result<usize> {
        for (i, page) in data.chunks(PAGE).enumerate() {
            let r = self.nand.borrow_mut().program((off / PAGE + i) as u32, page, &self.spare);
            r.map_err(|e| self.fail(e))?;
        }
        Ok(data.len())
    }

    fn erase(&mut self, off: usize, len: usize) -> Result<usize> {
        for b in off / BLOCK..(off + len) / BLOCK {
            let r = self.nand.borrow_mut().erase(b as u32);
            r.map_err(|e| self.fail(e))?;
        }
        Ok(len)
    }
}

/// A path littlefs accepts, from a Rust string (names here are short ASCII).
pub fn path(s: &str) -> PathBuf {
    PathBuf::try_from(s).expect("a path littlefs accepts")
}
