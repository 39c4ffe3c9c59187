//! Raw NAND flash: the [`Nand`] trait, its backends and its fault injector.
//!
//! Every backend enforces the chip's rules, because a file system that breaks them on a
//! simulator corrupts data on a real chip:
//! - a page is programmed at most once between erases of its block;
//! - pages within a block are programmed in ascending order (skipping is allowed, going back
//!   is not);
//! - erase sets every bit of the block (data and spare) to 1, and programming can only clear
//!   bits (the stored value is the old value AND the programmed one);
//! - a block marked bad refuses program and erase.
//!
//! Backends: [`RamNand`], [`FileNand`] (an image file that reopens with its contents and
//! erase counts). [`FaultyNand`] wraps either and fails the way chips fail. A backend for
//! Linux MTD character devices would implement the same trait (a place is left for it: the
//! trait asks nothing an `ioctl(MEMERASE)` / `pread` / `pwrite` device cannot do).

mod chip;
pub(crate) mod data_reader;
mod faulty;
mod file;
mod geometry;
mod image_cells;
mod mtd;
mod ram;

pub use data_reader::DataReader;
pub use faulty::{Area, Endurance, FaultyNand, NandFault, Torn, WearOut};
pub use file::{is_image_file, FileNand, IMAGE_VERSION};
pub use geometry::Geometry;
pub use mtd::{is_char_device, EccStats, MtdNand, OobMode};
pub use ram::RamNand;

/// Errors of a NAND chip: the caller's mistakes (range, rule violations) and the medium's
/// failures (bad block, failed program or erase, power loss) are distinct variants.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum NandError {
    #[error("invalid geometry: {why}")]
    Geometry { why: String },
    #[error("page {page} does not exist (the chip has {pages} pages)")]
    PageRange { page: u32, pages: u32 },
    #[error("erase block {block} does not exist (the chip has {blocks})")]
    BlockRange { block: u32, blocks: u32 },
    #[error("buffer of {got} bytes for a {expected}-byte {what}")]
    BufferSize { what: &'static str, got: usize, expected: usize },
    /// Programming a page already programmed (or skipped over) since its block's erase.
    #[error(
        "page {page} cannot be programmed: block {block} was programmed up to page {next_index} \
         (a page is programmed once per erase, in ascending order)"
    )]
    NotProgrammable { page: u32, block: u32, next_index: u32 },
    #[error("erase block {block} is bad")]
    BadBlock { block: u32 },
    /// The chip reported a program failure; the page holds whatever it got.
    #[error("program of page {page} failed")]
    ProgramFailed { page: u32 },
    /// The chip reported an erase failure; the block is now bad.
    #[error("erase of block {block} failed; the block is now marked bad")]
    EraseFailed { block: u32 },
    /// Power was cut; every operation fails until power comes back.
    #[error("the device has lost power")]
    PowerLost,
    #[error("{path}: not a bitmend NAND image ({why})")]
    NotAnImage { path: String, why: String },
    #[error("{path}: NAND image format version {found}, this build reads version {supported}")]
    Version { path: String, found: u32, supported: u32 },
    /// The host file system has too little room for the image (checked before it is made).
    #[error("{path}: the image needs {:.1} GiB, the host file system has {:.1} GiB free", gib(*need), gib(*free))]
    HostFull { path: String, need: u64, free: u64 },
    /// The host file system under a thin image (`create_thin`) refused a block its space:
    /// the chip has room, the disk does not. The program that needed it did not happen.
    #[error("{path}: the host file system is full (no room for block {block} of the image)")]
    HostSpace { path: String, block: u32 },
    #[error("{path}: image is in use by another process")]
    Locked { path: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// What a chip's timing datasheet gives; used to model device time beside CPU time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// Page read (array to register), ns.
    pub read_ns: u64,
    /// Page program, ns.
    pub program_ns: u64,
    /// Block erase, ns.
    pub erase_ns: u64,
    /// Bus transfer per byte, ns.
    pub transfer_ns_per_byte: f64,
}

impl Timing {
    /// A typical SLC/MLC chip: tR 25 us, tPROG 200 us, tBERS 2 ms, 25 ns per byte.
    pub const TYPICAL: Timing =
        Timing { read_ns: 25_000, program_ns: 200_000, erase_ns: 2_000_000, transfer_ns_per_byte: 25.0 };
    /// No modelled time.
    pub const NONE: Timing = Timing { read_ns: 0, program_ns: 0, erase_ns: 0, transfer_ns_per_byte: 0.0 };

    fn transfer(&self, bytes: usize) -> u64 {
        (bytes as f64 * self.transfer_ns_per_byte) as u64
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing::TYPICAL
    }
}

/// Operation and byte counters since the chip was opened, and the modelled device time.
/// Write amplification is `bytes_programmed` over the bytes the user asked to write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub reads: u64,
    pub programs: u64,
    pub erases: u64,
    pub bytes_read: u64,
    pub bytes_programmed: u64,
    pub bytes_erased: u64,
    /// What a chip with the configured [`Timing`] would have spent, in ns.
    pub device_ns: u64,
}

impl std::ops::Sub for Counters {
    type Output = Counters;
    fn sub(self, o: Counters) -> Counters {
        Counters {
            reads: self.reads - o.reads,
            programs: self.programs - o.programs,
            erases: self.erases - o.erases,
            bytes_read: self.bytes_read - o.bytes_read,
            bytes_programmed: self.bytes_programmed - o.bytes_programmed,
            bytes_erased: self.bytes_erased - o.bytes_erased,
            device_ns: self.device_ns - o.device_ns,
        }
    }
}

/// A raw NAND chip. Reads take `&mut self`: they move counters, and on a faulty chip they
/// disturb cells.
pub trait Nand: Send {
    /// The chip's shape.
    fn geometry(&self) -> Geometry;

    /// Reads the data area and/or the spare area of `page` (each buffer exactly its area's
    /// size). An erased page reads as all ones.
    fn read(&mut self, page: u32, data: Option<&mut [u8]>, spare: Option<&mut [u8]>)
        -> Result<(), NandError>;

    /// Programs `page` with `data` (a full page) and `spare` (the full spare area).
    fn program(&mut self, page: u32, data: &[u8], spare: &[u8]) -> Result<(), NandError>;

    /// Erases `block`: every bit of its pages and spare areas becomes 1.
    fn erase(&mut self, block: u32) -> Result<(), NandError>;

    /// Marks `block` bad, permanently.
    fn mark_bad(&mut self, block: u32) -> Result<(), NandError>;

    /// Whether `block` is marked bad.
    fn is_bad(&self, block: u32) -> Result<bool, NandError>;

    /// How many times `block` has been erased over the chip's life.
    fn erase_count(&self, block: u32) -> Result<u32, NandError>;

    /// Counters since the chip was opened.
    fn counters(&self) -> Counters;

    /// Makes everything done so far durable (a no-op for chips that are durable per operation).
    fn sync(&mut self) -> Result<(), NandError>;

    /// A reader of page data that needs neither `&mut self` nor the caller's lock, for reads
    /// checked end to end by the caller ([`DataReader`]); None where the chip cannot offer
    /// one, or where a read must go through the chip (fault injection, timing).
    fn data_reader(&self) -> Option<DataReader> {
        None
    }

    /// Reads data and spare together.
    fn read_page(&mut self, page: u32, data: &mut [u8], spare: &mut [u8]) -> Result<(), NandError> {
        self.read(page, Some(data), Some(spare))
    }

    /// Reads the data area only.
    fn read_data(&mut self, page: u32, data: &mut [u8]) -> Result<(), NandError> {
        self.read(page, Some(data), None)
    }

    /// Reads the spare area only (cheap on a real chip: a short transfer).
    fn read_spare(&mut self, page: u32, spare: &mut [u8]) -> Result<(), NandError> {
        self.read(page, None, Some(spare))
    }
}

/// The state a chip keeps per erase block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockState {
    /// Erases over the chip's life.
    pub erase_count: u32,
    /// The index of the first page in the block that may still be programmed.
    pub next_index: u32,
    /// Marked bad.
    pub bad: bool,
}

/// Access beneath the chip's rules, for fault injection and inspection only: this is how a
/// retention error or a worn cell changes stored bits without a program. Upper layers never
/// use it; the injectors of this crate do.
pub trait RawAccess {
    /// The stored bytes of `page`: data then spare (`Geometry::raw_page_size` bytes).
    fn raw_read(&mut self, page: u32, buf: &mut [u8]) -> Result<(), NandError>;
    /// Overwrites stored bytes of `page` at `offset` (data then spare), with no rule checked
    /// and nothing counted.
    fn raw_write(&mut self, page: u32, offset: usize, bytes: &[u8]) -> Result<(), NandError>;
    /// The state of `block`.
    fn block_state(&self, block: u32) -> Result<BlockState, NandError>;
}

/// Forwards every `Nand` method through a pointer type.
macro_rules! forward_nand {
    ($($ptr:ty),*) => {$(
        impl<N: Nand + ?Sized> Nand for $ptr {
            fn geometry(&self) -> Geometry {
                (**self).geometry()
            }
            fn read(&mut self, page: u32, data: Option<&mut [u8]>, spare: Option<&mut [u8]>) -> Result<(), NandError> {
                (**self).read(page, data, spare)
            }
            fn program(&mut self, page: u32, data: &[u8], spare: &[u8]) -> Result<(), NandError> {
                (**self).program(page, data, spare)
            }
            fn erase(&mut self, block: u32) -> Result<(), NandError> {
                (**self).erase(block)
            }
            fn mark_bad(&mut self, block: u32) -> Result<(), NandError> {
                (**self).mark_bad(block)
            }
            fn is_bad(&self, block: u32) -> Result<bool, NandError> {
                (**self).is_bad(block)
            }
            fn erase_count(&self, block: u32) -> Result<u32, NandError> {
                (**self).erase_count(block)
            }
            fn counters(&self) -> Counters {
                (**self).counters()
            }
            fn sync(&mut self) -> Result<(), NandError> {
                (**self).sync()
            }
            fn data_reader(&self) -> Option<DataReader> {
                (**self).data_reader()
            }
        }
    )*};
}

// A reference to a chip is a chip (a file system can borrow a `FaultyNand` that a test keeps
// for injecting), and so is a box.
forward_nand!(&mut N, Box<N>);
