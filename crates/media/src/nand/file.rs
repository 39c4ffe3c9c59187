//! A NAND chip kept in an image file (layout in docs/FORMAT.md, "NAND image").
//!
//! The image describes itself (geometry and format version in a checksummed header), keeps
//! each block's erase count, bad mark and program position in a block table, and every page's
//! data and spare bytes after it. Reopening after the process exits gives the same chip.
//! Version 2 stores the cells complemented, so that a new image is a sparse file made in an
//! instant (`image_cells.rs`); version 1 images are read and written as they are.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::chip::{chip_backend, Cells, Chip};
use super::image_cells::{decode_entry, encode_entry, ImageCells, ImageLayout, BLOCK_ENTRY_SIZE};
use super::{BlockState, Geometry, NandError, Timing};

/// The on-media version of the NAND image layout this build makes (it reads version 1 too).
pub const IMAGE_VERSION: u32 = 2;

/// Version 1: cells stored as they are, the whole image written at creation.
const IMAGE_VERSION_PLAIN: u32 = 1;

pub(crate) const MAGIC: [u8; 8] = *b"BMNDIMG\0";
pub(crate) const HEADER_SIZE: u64 = 4096;

// Header fields, by offset (FORMAT.md, "NAND image header").
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_HEADER_SIZE: usize = 12;
const OFF_PAGE_SIZE: usize = 16;
const OFF_SPARE_SIZE: usize = 20;
const OFF_PAGES_PER_BLOCK: usize = 24;
const OFF_BLOCKS: usize = 28;
const OFF_DATA_OFFSET: usize = 32;
const OFF_CRC: usize = HEADER_SIZE as usize - 4;

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> NandError {
    let context = context.into();
    move |source| NandError::Io { context, source }
}

/// As [`io`], but the context is only built on an error: for the per-page paths, where
/// formatting it on every call cost more than the copy.
/// Where page 0 starts: after the header and the block table, 4 KiB aligned.
pub(crate) fn data_offset(g: &Geometry) -> u64 {
    let table = g.blocks as u64 * BLOCK_ENTRY_SIZE;
    HEADER_SIZE + table.div_ceil(4096) * 4096
}

fn image_len(g: &Geometry) -> u64 {
    data_offset(g) + g.pages() as u64 * g.raw_page_size() as u64
}

/// Bytes an unprivileged writer may still use on the file system holding `path`.
fn host_free(path: &Path) -> Result<u64, NandError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let p = dir.display().to_string();
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| io(&p)(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // SAFETY: statvfs is a plain C struct of integers, for which all zeros is a value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is NUL-terminated and outlives the call; statvfs writes only into `st`.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io(format!("{p}: statvfs"))(std::io::Error::last_os_error()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

fn encode_header(g: &Geometry) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_SIZE as usize];
    h[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC);
    let put = |h: &mut [u8], off: usize, v: u32| h[off..off + 4].copy_from_slice(&v.to_le_bytes());
    put(&mut h, OFF_VERSION, IMAGE_VERSION);
    put(&mut h, OFF_HEADER_SIZE, HEADER_SIZE as u32);
    put(&mut h, OFF_PAGE_SIZE, g.page_size);
    put(&mut h, OFF_SPARE_SIZE, g.spare_size);
    put(&mut h, OFF_PAGES_PER_BLOCK, g.pages_per_block);
    put(&mut h, OFF_BLOCKS, g.blocks);
    h[OFF_DATA_OFFSET..OFF_DATA_OFFSET + 8].copy_from_slice(&data_offset(g).to_le_bytes());
    let crc = bitmend_code::crc::crc32c(&h[..OFF_CRC]);
    put(&mut h, OFF_CRC, crc);
    h
}

fn decode_header(path: &str, h: &[u8]) -> Result<(Geometry, u32), NandError> {
    let not = |why: &str| NandError::NotAnImage { path: path.to_string(), why: why.to_string() };
    if h[OFF_MAGIC..OFF_MAGIC + 8] != MAGIC {
        return Err(not("no image magic at offset 0"));
    }
    let get = |off: usize| u32::from_le_bytes(h[off..off + 4].try_into().unwrap());
    if get(OFF_CRC) != bitmend_code::crc::crc32c(&h[..OFF_CRC]) {
        return Err(not("header checksum mismatch: the header is damaged"));
    }
    let version = get(OFF_VERSION);
    if version != IMAGE_VERSION && version != IMAGE_VERSION_PLAIN {
        return Err(NandError::Version { path: path.to_string(), found: version, supported: IMAGE_VERSION });
    }
    if get(OFF_HEADER_SIZE) as u64 != HEADER_SIZE {
        return Err(not("unexpected header size"));
    }
    let g = Geometry {
        page_size: get(OFF_PAGE_SIZE),
        spare_size: get(OFF_SPARE_SIZE),
        pages_per_block: get(OFF_PAGES_PER_BLOCK),
        blocks: get(OFF_BLOCKS),
    };
    g.validate().map_err(|e| not(&format!("header geometry: {e}")))?;
    let stored = u64::from_le_bytes(h[OFF_DATA_OFFSET..OFF_DATA_OFFSET + 8].try_into().unwrap());
    if stored != data_offset(&g) {
        return Err(not("data offset does not match the geometry"));
    }
    Ok((g, version))
}

/// Whether `path` is a regular file that starts as a bitmend NAND image does (its magic),
/// whether or not the rest of it is sound: what `mkfs --force` may replace.
pub fn is_image_file(path: impl AsRef<Path>) -> bool {
    let mut magic = [0u8; MAGIC.len()];
    std::fs::metadata(path.as_ref()).is_ok_and(|m| m.is_file())
        && File::open(path.as_ref()).is_ok_and(|f| f.read_exact_at(&mut magic, 0).is_ok())
        && magic == MAGIC
}

/// A NAND chip in an image file, locked for exclusive use while open.
pub struct FileNand {
    pub(crate) chip: Chip<ImageCells>,
}

pub(crate) fn lock(file: &File, path: &str) -> Result<(), NandError> {
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(NandError::Locked { path: path.to_string() });
        }
        return Err(io(format!("{path}: lock"))(e));
    }
    Ok(())
}

/// The cells of an image of `version`, mapped; `fresh`: just made.
fn cells(file: File, path: String, g: &Geometry, version: u32, fresh: bool) -> Result<ImageCells, NandError> {
    let layout = ImageLayout {
        table: HEADER_SIZE,
        base: data_offset(g),
        block_bytes: g.pages_per_block as u64 * g.raw_page_size() as u64,
        blocks: g.blocks,
        complemented: version >= 2,
    };
    ImageCells::new(file, path, image_len(g), layout, fresh)
}

impl FileNand {
    /// Creates a new image at `path` (which must not exist), fully erased, with the host's
    /// space for all of it reserved now (`fallocate`): no later program can find the host
    /// full. Refused if the host has not the room. The reserved bytes read as zeros, which
    /// a version 2 image stores for erased cells; on tmpfs this also takes the page
    /// allocation out of the write path (a sixth of a fresh mount's 1 MiB write rate). A
    /// host file system without `fallocate` leaves the file sparse, as
    /// [`create_thin`](Self::create_thin) does.
    pub fn create(path: impl AsRef<Path>, geometry: Geometry) -> Result<FileNand, NandError> {
        let len = image_len(&geometry);
        let mut nand = FileNand::create_with(path.as_ref(), geometry, len)?;
        let reserved = nand.chip.cells.reserve_all();
        if let Err(e) = reserved {
            drop(nand);
            let _ = std::fs::remove_file(path.as_ref());
            return Err(e);
        }
        Ok(nand)
    }

    /// As [`create`](Self::create), but only room for the header, the block table and one
    /// block is asked of the host (thin provisioning: an image larger than the disk, for
    /// scale tests). A host that fills later fails the program that needed the room, with an
    /// I/O error.
    pub fn create_thin(path: impl AsRef<Path>, geometry: Geometry) -> Result<FileNand, NandError> {
        let block_bytes = geometry.pages_per_block as u64 * geometry.raw_page_size() as u64;
        FileNand::create_with(path.as_ref(), geometry, data_offset(&geometry) + block_bytes)
    }

    fn create_with(path: &Path, geometry: Geometry, need: u64) -> Result<FileNand, NandError> {
        geometry.validate()?;
        let p = path.display().to_string();
        let free = host_free(path)?;
        if need > free {
            return Err(NandError::HostFull { path: p, need, free });
        }
        let mut file =
            OpenOptions::new().read(true).write(true).create_new(true).open(path).map_err(io(&p))?;
        lock(&file, &p)?;
        file.write_all(&encode_header(&geometry)).map_err(io(format!("{p}: write header")))?;
        let blocks = vec![BlockState::default(); geometry.blocks as usize];
        let table: Vec<u8> = blocks.iter().flat_map(encode_entry).collect();
        file.write_all_at(&table, HEADER_SIZE).map_err(io(format!("{p}: write block table")))?;
        // Zeros past the table: erased cells, stored complemented (version 2).
        file.set_len(image_len(&geometry)).map_err(io(format!("{p}: size")))?;
        file.sync_all().map_err(io(format!("{p}: sync")))?;
        let cells = cells(file, p, &geometry, IMAGE_VERSION, true)?;
        Ok(FileNand { chip: Chip::new(geometry, cells, blocks) })
    }

    /// Opens an existing image; its header gives the geometry.
    pub fn open(path: impl AsRef<Path>) -> Result<FileNand, NandError> {
        let p = path.as_ref().display().to_string();
        let file = OpenOptions::new().read(true).write(true).open(path.as_ref()).map_err(io(&p))?;
        lock(&file, &p)?;
        let len = file.metadata().map_err(io(&p))?.len();
        if len < HEADER_SIZE {
            return Err(NandError::NotAnImage { path: p, why: format!("only {len} bytes long") });
        }
        let mut h = vec![0u8; HEADER_SIZE as usize];
        file.read_exact_at(&mut h, 0).map_err(io(format!("{p}: read header")))?;
        let (geometry, version) = decode_header(&p, &h)?;
        if len < image_len(&geometry) {
            return Err(NandError::NotAnImage {
                path: p,
                why: format!("truncated: {len} bytes, the geometry needs {}", image_len(&geometry)),
            });
        }
        let mut table = vec![0u8; geometry.blocks as usize * BLOCK_ENTRY_SIZE as usize];
        file.read_exact_at(&mut table, HEADER_SIZE).map_err(io(format!("{p}: read block table")))?;
        let blocks: Vec<BlockState> = table.chunks(BLOCK_ENTRY_SIZE as usize).map(decode_entry).collect();
        if let Some((b, s)) = blocks.iter().enumerate().find(|(_, s)| s.next_index > geometry.pages_per_block)
        {
            return Err(NandError::NotAnImage {
                path: p,
                why: format!("block table entry {b} is damaged (program position {})", s.next_index),
            });
        }
        let cells = cells(file, p, &geometry, version, false)?;
        Ok(FileNand { chip: Chip::new(geometry, cells, blocks) })
    }

    /// Sets the timing model (the default is [`Timing::TYPICAL`]).
    pub fn with_timing(mut self, timing: Timing) -> FileNand {
        self.chip.timing = timing;
        self
    }
}

chip_backend!(FileNand);
