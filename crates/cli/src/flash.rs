//! What a user names as the flash: a NAND image file, or a real chip behind `/dev/mtdX`.
//!
//! Every command that takes "an image" takes either. A character device is driven as an MTD
//! chip (or refused, if it is not one); a block device is refused, because bitmend needs the
//! raw pages and spare areas that only the MTD character device gives; anything else is an
//! image file.

use std::path::Path;

use bitmend_media::nand::{Counters, DataReader, FileNand, Geometry, MtdNand, Nand, NandError, OobMode};

use crate::error::CliError;

/// The chip a command works on.
pub enum Flash {
    Image(FileNand),
    Mtd(MtdNand),
}

/// What a path names, before anything is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashKind {
    /// Nothing there yet (an image a command may create).
    Missing,
    Image,
    Mtd,
}

/// What `path` names; a block device, a directory or anything else that is neither an image
/// file nor a character device is refused, saying why.
pub fn kind(path: &Path) -> Result<FlashKind, CliError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(FlashKind::Missing),
        Err(e) => return Err(CliError::Target(format!("{}: {e}", path.display()))),
    };
    let t = meta.file_type();
    if t.is_char_device() {
        Ok(FlashKind::Mtd)
    } else if t.is_block_device() {
        Err(CliError::Target(format!(
            "{}: a block device; bitmend drives raw NAND through its MTD character device \
             (/dev/mtdN, with its spare areas), not a block device such as /dev/mtdblockN, a \
             UBI volume or a disk",
            path.display()
        )))
    } else if t.is_file() {
        Ok(FlashKind::Image)
    } else if t.is_dir() {
        Err(CliError::Target(format!(
            "{}: a directory, not a NAND image file or an MTD device",
            path.display()
        )))
    } else {
        Err(CliError::Target(format!("{}: not a NAND image file or an MTD device", path.display())))
    }
}

/// Opens the chip `path` names: an image file, or an MTD device with its spare used the way
/// the file system on it was made (raw, unless its superblock records the spare its ECC
/// leaves free).
pub fn open(path: &Path) -> Result<Flash, CliError> {
    match kind(path)? {
        FlashKind::Mtd => {
            let mut raw = MtdNand::open(path, OobMode::Raw)?;
            let recorded = bitmend_flashfs::recorded_geometry(&mut raw);
            if recorded.is_some_and(|g| g.spare_size != raw.geometry().spare_size) {
                drop(raw);
                return Ok(Flash::Mtd(MtdNand::open(path, OobMode::Ecc)?));
            }
            Ok(Flash::Mtd(raw))
        }
        FlashKind::Image | FlashKind::Missing => Ok(Flash::Image(FileNand::open(path)?)),
    }
}

/// Opens an MTD device for `mkfs`, its spare used as `mode` says.
pub fn open_device(path: &Path, mode: OobMode) -> Result<MtdNand, CliError> {
    Ok(MtdNand::open(path, mode)?)
}

impl Flash {
    /// The image file, if this is one (what only an image has: its block table, raw access).
    pub fn image(&self) -> Option<&FileNand> {
        match self {
            Flash::Image(f) => Some(f),
            Flash::Mtd(_) => None,
        }
    }

    fn chip(&self) -> &dyn Nand {
        match self {
            Flash::Image(f) => f,
            Flash::Mtd(m) => m,
        }
    }

    fn chip_mut(&mut self) -> &mut dyn Nand {
        match self {
            Flash::Image(f) => f,
            Flash::Mtd(m) => m,
        }
    }
}

impl Nand for Flash {
    fn geometry(&self) -> Geometry {
        self.chip().geometry()
    }
    fn read(
        &mut self,
        page: u32,
        data: Option<&mut [u8]>,
        spare: Option<&mut [u8]>,
    ) -> Result<(), NandError> {
        self.chip_mut().read(page, data, spare)
    }
    fn program(&mut self, page: u32, data: &[u8], spare: &[u8]) -> Result<(), NandError> {
        self.chip_mut().program(page, data, spare)
    }
    fn erase(&mut self, block: u32) -> Result<(), NandError> {
        self.chip_mut().erase(block)
    }
    fn mark_bad(&mut self, block: u32) -> Result<(), NandError> {
        self.chip_mut().mark_bad(block)
    }
    fn is_bad(&self, block: u32) -> Result<bool, NandError> {
        self.chip().is_bad(block)
    }
    fn erase_count(&self, block: u32) -> Result<u32, NandError> {
        self.chip().erase_count(block)
    }
    fn counters(&self) -> Counters {
        self.chip().counters()
    }
    fn sync(&mut self) -> Result<(), NandError> {
        self.chip_mut().sync()
    }
    fn data_reader(&self) -> Option<DataReader> {
        self.chip().data_reader()
    }
}
