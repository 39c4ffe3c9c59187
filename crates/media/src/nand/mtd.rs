//! A real chip: a Linux MTD character device (`/dev/mtdX`), driven through the MTD ioctls.
//!
//! The kernel's NAND layer moves pages; the rules are still ours. A chip that lets a page be
//! programmed twice (nandsim does, and so do many controllers, with garbage as the result) is
//! held to the same rules as the simulated chips: each block's program position is learnt
//! from the chip the first time the block is programmed (its pages read from the end back to
//! the last one that is not erased), and kept from then on.
//!
//! Two ways to use the spare area, chosen when the chip is opened:
//! - [`OobMode::Raw`]: bitmend owns every spare byte and the kernel's ECC is not used (reads
//!   and programs in `MTD_OPS_RAW`): RCFFS's point, software correction instead of the
//!   controller's one bit per 256 or 512 bytes.
//! - [`OobMode::Ecc`]: the kernel corrects what its ECC can first; bitmend's spare lives in the
//!   free bytes the ECC layout leaves (`MTD_OPS_AUTO_OOB`), so the spare is smaller.
//!
//! What a real chip does not keep, this one cannot give: erase counts live in RAM for the life
//! of the open device (the file system's wear levelling then starts level at every mount).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::{Counters, Geometry, Nand, NandError};

/// How the spare area is used (see the module's comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OobMode {
    /// Every spare byte is bitmend's; the kernel's ECC is bypassed.
    Raw,
    /// The kernel's ECC corrects first; bitmend gets the free spare bytes.
    Ecc,
}

/// What the chip's own ECC reported since the device was opened (ECC mode; in raw mode the
/// kernel corrects nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EccStats {
    /// Bits the kernel's ECC corrected.
    pub corrected: u32,
    /// Reads the kernel's ECC could not correct.
    pub failed: u32,
    /// Blocks the kernel counts bad.
    pub bad_blocks: u32,
}

/// A NAND chip behind `/dev/mtdX`.
pub struct MtdNand {
    file: File,
    path: String,
    geometry: Geometry,
    mode: OobMode,
    /// The chip's whole spare size, whatever `mode` (a raw read or program moves all of it).
    oob_size: u32,
    bad: Vec<bool>,
    /// Per block: the first page that may still be programmed, or `UNSURVEYED`.
    next_index: Vec<u32>,
    erase_counts: Vec<u32>,
    counters: Counters,
}

const UNSURVEYED: u32 = u32::MAX;

// The ioctls of include/uapi/mtd/mtd-abi.h, with the sizes their numbers encode.
#[repr(C)]
#[derive(Default)]
struct MtdInfoUser {
    kind: u8,
    flags: u32,
    size: u32,
    erasesize: u32,
    writesize: u32,
    oobsize: u32,
    padding: u64,
}

#[repr(C)]
struct EraseInfoUser64 {
    start: u64,
    length: u64,
}

/// `struct mtd_write_req`, and the first 48 bytes of `struct mtd_read_req` (the same fields).
#[repr(C)]
struct MtdIoReq {
    start: u64,
    len: u64,
    ooblen: u64,
    usr_data: u64,
    usr_oob: u64,
    mode: u8,
    padding: [u8; 7],
}

/// `struct mtd_read_req` as the kernel has it since 6.1: the request, then its ECC counts.
#[repr(C)]
struct MtdReadReq {
    req: MtdIoReq,
    uncorrectable_errors: u32,
    corrected_bitflips: u32,
    max_bitflips: u32,
}

#[repr(C)]
#[derive(Default)]
struct MtdEccStats {
    corrected: u32,
    failed: u32,
    badblocks: u32,
    bbtblocks: u32,
}

const MTD_OPS_AUTO_OOB: u8 = 1;
const MTD_OPS_RAW: u8 = 2;
const MTD_NANDFLASH: u8 = 4;
const MTD_MLCNANDFLASH: u8 = 8;

/// `_IOC(dir, 'M', nr, size)` as linux/ioctl.h builds it on x86 and arm.
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | ((b'M' as u64) << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const MEMGETINFO: u64 = ioc(IOC_READ, 1, size_of::<MtdInfoUser>());
const MEMGETBADBLOCK: u64 = ioc(IOC_WRITE, 11, size_of::<i64>());
const MEMSETBADBLOCK: u64 = ioc(IOC_WRITE, 12, size_of::<i64>());
const ECCGETSTATS: u64 = ioc(IOC_READ, 18, size_of::<MtdEccStats>());
const MEMERASE64: u64 = ioc(IOC_WRITE, 20, size_of::<EraseInfoUser64>());
const MEMWRITE: u64 = ioc(IOC_READ | IOC_WRITE, 24, size_of::<MtdIoReq>());
const MEMREAD: u64 = ioc(IOC_READ | IOC_WRITE, 26, size_of::<MtdReadReq>());

/// One ioctl on the device: Ok(the call's return value) or the OS error.
fn ioctl<T>(file: &File, request: u64, arg: &mut T) -> std::io::Result<i32> {
    // SAFETY: `arg` is a live, exclusively borrowed value of the type whose size `request`
    // encodes (each request above is built from `size_of` of the type passed with it), so
    // the kernel reads and writes only inside it; the descriptor is open for the borrow.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), request as libc::c_ulong, arg as *mut T) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Whether `path` is a character device (an MTD chip is one; an image file is not).
pub fn is_char_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

impl MtdNand {
    /// Opens `/dev/mtdX` read-write, with the spare used as `mode` says.
    pub fn open(path: &Path, mode: OobMode) -> Result<MtdNand, NandError> {
        let name = path.display().to_string();
        let io = |source| NandError::Io { context: name.clone(), source };
        if !is_char_device(path) {
            return Err(NandError::NotAnImage { path: name, why: "not an MTD character device".into() });
        }
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(io)?;
        super::file::lock(&file, &name)?;
        let mut info = MtdInfoUser::default();
        if let Err(e) = ioctl(&file, MEMGETINFO, &mut info) {
            return Err(match e.raw_os_error() {
                Some(libc::ENOTTY) | Some(libc::EINVAL) => NandError::NotAnImage {
                    path: name,
                    why: "a character device that is not an MTD chip".into(),
                },
                _ => io(e),
            });
        }
        if info.kind != MTD_NANDFLASH && info.kind != MTD_MLCNANDFLASH {
            return Err(NandError::NotAnImage {
                path: name,
                why: format!(
                    "MTD type {} is not NAND flash (NOR and RAM devices have no spare area)",
                    info.kind
                ),
            });
        }
        let size = device_size(path).unwrap_or(info.size as u64);
        let spare = match mode {
            OobMode::Raw => info.oobsize,
            OobMode::Ecc => sysfs_u64(path, "oobavail").map_or(0, |v| v as u32),
        };
        let geometry = Geometry::with_size(info.writesize, spare, info.erasesize as u64, size)?;
        let blocks = geometry.blocks as usize;
        let mut chip = MtdNand {
            file,
            path: name.clone(),
            geometry,
            mode,
            oob_size: info.oobsize,
            bad: vec![false; blocks],
            next_index: vec![UNSURVEYED; blocks],
            erase_counts: vec![0; blocks],
            counters: Counters::default(),
        };
        for b in 0..geometry.blocks {
            let mut at = chip.block_start(b) as i64;
            chip.bad[b as usize] = ioctl(&chip.file, MEMGETBADBLOCK, &mut at).map_err(io)? > 0;
        }
        Ok(chip)
    }

    /// How the spare is used.
    pub fn oob_mode(&self) -> OobMode {
        self.mode
    }

    /// What the kernel's ECC has reported since the device was opened.
    pub fn ecc_stats(&self) -> Result<EccStats, NandError> {
        let mut s = MtdEccStats::default();
        ioctl(&self.file, ECCGETSTATS, &mut s).map_err(|e| self.io("ECCGETSTATS", e))?;
        Ok(EccStats { corrected: s.corrected, failed: s.failed, bad_blocks: s.badblocks })
    }

    fn io(&self, what: &str, source: std::io::Error) -> NandError {
        NandError::Io { context: format!("{}: {what}", self.path), source }
    }

    fn block_start(&self, block: u32) -> u64 {
        block as u64 * self.geometry.pages_per_block as u64 * self.geometry.page_size as u64
    }

    fn page_start(&self, page: u32) -> u64 {
        page as u64 * self.geometry.page_size as u64
    }

    fn ops_mode(&self) -> u8 {
        match self.mode {
            OobMode::Raw => MTD_OPS_RAW,
            OobMode::Ecc => MTD_OPS_AUTO_OOB,
        }
    }

    /// One MEMREAD of `page`: data and/or spare. An uncorrectable ECC error (EBADMSG) still
    /// returns the bytes as read, which the caller's signatures judge; corrected bit flips
    /// (EUCLEAN) are a success.
    fn read_raw(
        &mut self,
        page: u32,
        data: Option<&mut [u8]>,
        spare: Option<&mut [u8]>,
    ) -> Result<(), NandError> {
        let (dp, dl) = data.map_or((0, 0), |d| (d.as_mut_ptr() as u64, d.len()));
        let (sp, sl) = spare.map_or((0, 0), |s| (s.as_mut_ptr() as u64, s.len()));
        let mut req = MtdReadReq {
            req: MtdIoReq {
                start: self.page_start(page),
                len: dl as u64,
                ooblen: sl as u64,
                usr_data: dp,
                usr_oob: sp,
                mode: self.ops_mode(),
                padding: [0; 7],
            },
            uncorrectable_errors: 0,
            corrected_bitflips: 0,
            max_bitflips: 0,
        };
        match ioctl(&self.file, MEMREAD, &mut req) {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EUCLEAN) | Some(libc::EBADMSG)) => Ok(()),
            Err(e) => Err(self.io(&format!("read of page {page}"), e)),
        }
    }

    /// The first page of `block` from which every page reads erased (data and whole spare).
    fn survey(&mut self, block: u32) -> Result<u32, NandError> {
        let g = self.geometry;
        let mut data = vec![0u8; g.page_size as usize];
        let mut spare = vec![0u8; self.oob_size as usize];
        let first = g.first_page(block);
        for index in (0..g.pages_per_block).rev() {
            self.read_raw_all(first + index, &mut data, &mut spare)?;
            if data.iter().chain(&spare).any(|&b| b != 0xFF) {
                return Ok(index + 1);
            }
        }
        Ok(0)
    }

    /// Reads a page's data and whole spare raw, whatever the mode (the survey must see the
    /// ECC bytes too: a page with only its ECC written is not erased).
    fn read_raw_all(&mut self, page: u32, data: &mut [u8], spare: &mut [u8]) -> Result<(), NandError> {
        let mode = self.mode;
        self.mode = OobMode::Raw;
        let r = self.read_raw(page, Some(data), Some(spare));
        self.mode = mode;
        r
    }
}

/// `/sys/class/mtd/mtdX/<field>`, for what MEMGETINFO cannot say (a size past 4 GiB, the
/// spare bytes the ECC leaves free).
fn sysfs_u64(path: &Path, field: &str) -> Option<u64> {
    let dev = std::fs::canonicalize(path).ok()?;
    let name = dev.file_name()?.to_str()?;
    let text = std::fs::read_to_string(format!("/sys/class/mtd/{name}/{field}")).ok()?;
    text.trim().parse().ok()
}

fn device_size(path: &Path) -> Option<u64> {
    sysfs_u64(path, "size")
}

impl Nand for MtdNand {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(
        &mut self,
        page: u32,
        data: Option<&mut [u8]>,
        spare: Option<&mut [u8]>,
    ) -> Result<(), NandError> {
        let bytes = self.geometry.check_buffers(page, data.as_deref(), spare.as_deref())?;
        if data.is_none() && spare.is_none() {
            return Ok(());
        }
        self.read_raw(page, data, spare)?;
        self.counters.reads += 1;
        self.counters.bytes_read += bytes as u64;
        Ok(())
    }

    fn program(&mut self, page: u32, data: &[u8], spare: &[u8]) -> Result<(), NandError> {
        let g = self.geometry;
        g.check_buffers(page, Some(data), Some(spare))?;
        let block = g.block_of(page);
        let index = g.index_in_block(page);
        if self.bad[block as usize] {
            return Err(NandError::BadBlock { block });
        }
        if self.next_index[block as usize] == UNSURVEYED {
            self.next_index[block as usize] = self.survey(block)?;
        }
        let next = self.next_index[block as usize];
        if index < next {
            return Err(NandError::NotProgrammable { page, block, next_index: next });
        }
        let oob = spare;
        let mut req = MtdIoReq {
            start: self.page_start(page),
            len: data.len() as u64,
            ooblen: oob.len() as u64,
            usr_data: data.as_ptr() as u64,
            usr_oob: oob.as_ptr() as u64,
            mode: self.ops_mode(),
            padding: [0; 7],
        };
        // The page is spent whether or not the program succeeds: it is never programmed again
        // before an erase.
        self.next_index[block as usize] = index + 1;
        self.counters.programs += 1;
        self.counters.bytes_programmed += (data.len() + oob.len()) as u64;
        match ioctl(&self.file, MEMWRITE, &mut req) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Err(NandError::ProgramFailed { page }),
            Err(e) => Err(self.io(&format!("program of page {page}"), e)),
        }
    }

    fn erase(&mut self, block: u32) -> Result<(), NandError> {
        let g = self.geometry;
        g.check_block(block)?;
        if self.bad[block as usize] {
            return Err(NandError::BadBlock { block });
        }
        let mut req = EraseInfoUser64 { start: self.block_start(block), length: g.block_size() };
        self.counters.erases += 1;
        self.counters.bytes_erased += g.pages_per_block as u64 * g.raw_page_size() as u64;
        self.erase_counts[block as usize] += 1;
        match ioctl(&self.file, MEMERASE64, &mut req) {
            Ok(_) => {
                self.next_index[block as usize] = 0;
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                self.mark_bad(block)?;
                Err(NandError::EraseFailed { block })
            }
            Err(e) => Err(self.io(&format!("erase of block {block}"), e)),
        }
    }

    fn mark_bad(&mut self, block: u32) -> Result<(), NandError> {
        self.geometry.check_block(block)?;
        let mut at = self.block_start(block) as i64;
        ioctl(&self.file, MEMSETBADBLOCK, &mut at)
            .map_err(|e| self.io(&format!("marking block {block} bad"), e))?;
        self.bad[block as usize] = true;
        Ok(())
    }

    fn is_bad(&self, block: u32) -> Result<bool, NandError> {
        self.bad
            .get(block as usize)
            .copied()
            .ok_or(NandError::BlockRange { block, blocks: self.geometry.blocks })
    }

    fn erase_count(&self, block: u32) -> Result<u32, NandError> {
        self.erase_counts
            .get(block as usize)
            .copied()
            .ok_or(NandError::BlockRange { block, blocks: self.geometry.blocks })
    }

    fn counters(&self) -> Counters {
        self.counters
    }

    fn sync(&mut self) -> Result<(), NandError> {
        // Every MTD operation is done when its ioctl returns.
        Ok(())
    }
}
