//! A NAND chip in RAM.

use super::chip::{chip_backend, Cells, Chip};
use super::{BlockState, Geometry, NandError, Timing};

#[derive(Clone)]
pub(crate) struct RamCells {
    bytes: Vec<u8>,
}

impl Cells for RamCells {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), NandError> {
        let o = offset as usize;
        buf.copy_from_slice(&self.bytes[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), NandError> {
        let o = offset as usize;
        self.bytes[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn fill_ones(&mut self, offset: u64, len: u64) -> Result<(), NandError> {
        self.bytes[offset as usize..(offset + len) as usize].fill(0xFF);
        Ok(())
    }
    fn store_state(&mut self, _block: u32, _state: &BlockState) -> Result<(), NandError> {
        Ok(())
    }
    fn sync(&mut self) -> Result<(), NandError> {
        Ok(())
    }
}

/// A NAND chip held in RAM, erased (all ones) when created. Cloning copies the chip (a
/// crash campaign starts every run from the same state).
#[derive(Clone)]
pub struct RamNand {
    pub(crate) chip: Chip<RamCells>,
}

impl RamNand {
    /// A fresh, fully erased chip (erase counts zero, no bad blocks).
    pub fn new(geometry: Geometry) -> Result<RamNand, NandError> {
        geometry.validate()?;
        let len = geometry.pages() as usize * geometry.raw_page_size();
        let cells = RamCells { bytes: vec![0xFF; len] };
        Ok(RamNand {
            chip: Chip::new(geometry, cells, vec![BlockState::default(); geometry.blocks as usize]),
        })
    }

    /// Sets the timing model (the default is [`Timing::TYPICAL`]).
    pub fn with_timing(mut self, timing: Timing) -> RamNand {
        self.chip.timing = timing;
        self
    }
}

chip_backend!(RamNand);
