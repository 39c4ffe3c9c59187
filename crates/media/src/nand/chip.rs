//! The chip's rules, written once over any store of cells (RAM or an image file).

use super::geometry::check_len;
use super::{BlockState, Counters, Geometry, NandError, Timing};

/// Where a chip keeps its bits and its per-block state. Page `p` occupies
/// `[p * raw_page_size, (p + 1) * raw_page_size)`: data, then spare.
pub(crate) trait Cells: Send {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), NandError>;
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), NandError>;
    /// Sets `len` bytes at `offset` to 0xFF.
    fn fill_ones(&mut self, offset: u64, len: u64) -> Result<(), NandError>;
    /// Records the state of one block (durably, for a file).
    fn store_state(&mut self, block: u32, state: &BlockState) -> Result<(), NandError>;
    fn sync(&mut self) -> Result<(), NandError>;
    /// A reader of the pages' data for other threads (image files only).
    fn data_reader(&self, _g: Geometry) -> Option<super::DataReader> {
        None
    }
}

/// A chip: geometry, timing, cells and per-block state, with the rules enforced.
#[derive(Clone)]
pub(crate) struct Chip<C> {
    pub geometry: Geometry,
    pub timing: Timing,
    pub cells: C,
    pub blocks: Vec<BlockState>,
    pub counters: Counters,
    scratch: Vec<u8>,
    /// Per block: the index of the first page from which every page is known to hold only
    /// ones, or [`UNSURVEYED`]. A program there needs no read of the old cells (programming
    /// only clears bits, and nothing is cleared yet): one system call less per page of an
    /// image file.
    erased_from: Vec<u32>,
}

/// Not known which pages of the block are erased (after an open, or a raw write).
const UNSURVEYED: u32 = u32::MAX;

impl<C: Cells> Chip<C> {
    pub fn new(geometry: Geometry, cells: C, blocks: Vec<BlockState>) -> Chip<C> {
        debug_assert_eq!(blocks.len(), geometry.blocks as usize);
        Chip {
            geometry,
            timing: Timing::default(),
            cells,
            blocks,
            counters: Counters::default(),
            scratch: vec![0; geometry.raw_page_size()],
            erased_from: vec![UNSURVEYED; geometry.blocks as usize],
        }
    }

    /// Whether page `index` of `block` holds only ones, surveying the block's pages from
    /// `index` on in one read if that is not known yet.
    fn known_erased(&mut self, block: u32, index: u32) -> Result<bool, NandError> {
        if self.erased_from[block as usize] == UNSURVEYED {
            let g = self.geometry;
            let raw = g.raw_page_size();
            let mut rest = vec![0u8; (g.pages_per_block - index) as usize * raw];
            self.cells.read_at(self.page_offset(g.first_page(block) + index), &mut rest)?;
            let last_written = rest.chunks(raw).rposition(|p| p.iter().any(|&b| b != 0xFF));
            self.erased_from[block as usize] = index + last_written.map_or(0, |i| i as u32 + 1);
        }
        Ok(index >= self.erased_from[block as usize])
    }

    fn page_offset(&self, page: u32) -> u64 {
        page as u64 * self.geometry.raw_page_size() as u64
    }

    pub fn read(
        &mut self,
        page: u32,
        data: Option<&mut [u8]>,
        spare: Option<&mut [u8]>,
    ) -> Result<(), NandError> {
        let g = self.geometry;
        let bytes = g.check_buffers(page, data.as_deref(), spare.as_deref())?;
        let off = self.page_offset(page);
        // Straight into the caller's buffers: the cells are memory (an image is mapped), so
        // data and spare read apart cost no more than one read and a copy out of it.
        if let Some(d) = data {
            self.cells.read_at(off, d)?;
        }
        if let Some(s) = spare {
            self.cells.read_at(off + g.page_size as u64, s)?;
        }
        self.counters.reads += 1;
        self.counters.bytes_read += bytes as u64;
        self.counters.device_ns += self.timing.read_ns + self.timing.transfer(bytes);
        Ok(())
    }

    pub fn program(&mut self, page: u32, data: &[u8], spare: &[u8]) -> Result<(), NandError> {
        let g = self.geometry;
        g.check_buffers(page, Some(data), Some(spare))?;
        let block = g.block_of(page);
        let index = g.index_in_block(page);
        let state = self.blocks[block as usize];
        if state.bad {
            return Err(NandError::BadBlock { block });
        }
        if index < state.next_index {
            return Err(NandError::NotProgrammable { page, block, next_index: state.next_index });
        }
        // Programming only clears bits: the cell keeps old AND new (old is all ones on a page
        // known erased: no need to read it).
        let off = self.page_offset(page);
        let erased = self.known_erased(block, index)?;
        let mut cells = std::mem::take(&mut self.scratch);
        let result = if erased {
            // All ones AND the new bits are the new bits: written as they are, no copy.
            self.cells.write_at(off, data).and_then(|()| self.cells.write_at(off + g.page_size as u64, spare))
        } else {
            self.cells.read_at(off, &mut cells).and_then(|()| {
                let (cd, cs) = cells.split_at_mut(g.page_size as usize);
                cd.iter_mut().zip(data).for_each(|(c, d)| *c &= d);
                cs.iter_mut().zip(spare).for_each(|(c, s)| *c &= s);
                self.cells.write_at(off, &cells)
            })
        };
        self.scratch = cells;
        let known = &mut self.erased_from[block as usize];
        if result.is_err() {
            // A write that failed part way may have cleared bits of the page.
            *known = UNSURVEYED;
        } else if *known != UNSURVEYED {
            *known = (*known).max(index + 1);
        }
        result?;
        let state = &mut self.blocks[block as usize];
        state.next_index = index + 1;
        let state = *state;
        self.cells.store_state(block, &state)?;
        let bytes = (data.len() + spare.len()) as u64;
        self.counters.programs += 1;
        self.counters.bytes_programmed += bytes;
        self.counters.device_ns += self.timing.program_ns + self.timing.transfer(bytes as usize);
        Ok(())
    }

    pub fn erase(&mut self, block: u32) -> Result<(), NandError> {
        let g = self.geometry;
        g.check_block(block)?;
        if self.blocks[block as usize].bad {
            return Err(NandError::BadBlock { block });
        }
        let len = g.pages_per_block as u64 * g.raw_page_size() as u64;
        self.cells.fill_ones(self.page_offset(g.first_page(block)), len)?;
        self.erased_from[block as usize] = 0;
        let state = &mut self.blocks[block as usize];
        state.erase_count = state.erase_count.saturating_add(1);
        state.next_index = 0;
        let state = *state;
        self.cells.store_state(block, &state)?;
        self.counters.erases += 1;
        self.counters.bytes_erased += len;
        self.counters.device_ns += self.timing.erase_ns;
        Ok(())
    }

    pub fn mark_bad(&mut self, block: u32) -> Result<(), NandError> {
        self.geometry.check_block(block)?;
        let state = &mut self.blocks[block as usize];
        state.bad = true;
        let state = *state;
        self.cells.store_state(block, &state)
    }

    pub fn block_state(&self, block: u32) -> Result<BlockState, NandError> {
        self.geometry.check_block(block)?;
        Ok(self.blocks[block as usize])
    }

    pub fn raw_read(&mut self, page: u32, buf: &mut [u8]) -> Result<(), NandError> {
        self.geometry.check_page(page)?;
        check_len("raw page", buf.len(), self.geometry.raw_page_size() as u32)?;
        self.cells.read_at(self.page_offset(page), buf)
    }

    pub fn raw_write(&mut self, page: u32, offset: usize, bytes: &[u8]) -> Result<(), NandError> {
        self.geometry.check_page(page)?;
        let raw = self.geometry.raw_page_size();
        if offset.checked_add(bytes.len()).is_none_or(|end| end > raw) {
            return Err(NandError::BufferSize {
                what: "raw write within a page",
                got: offset + bytes.len(),
                expected: raw,
            });
        }
        // Damage, or a torn erase: which pages of the block are erased is known no more.
        self.erased_from[self.geometry.block_of(page) as usize] = UNSURVEYED;
        self.cells.write_at(self.page_offset(page) + offset as u64, bytes)
    }
}

/// Implements [`super::Nand`] and [`super::RawAccess`] for a type holding a `chip: Chip<_>`.
macro_rules! chip_backend {
    ($ty:ty) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty)).field("geometry", &self.chip.geometry).finish_non_exhaustive()
            }
        }

        impl $crate::nand::Nand for $ty {
            fn geometry(&self) -> $crate::nand::Geometry {
                self.chip.geometry
            }
            fn read(
                &mut self,
                page: u32,
                data: Option<&mut [u8]>,
                spare: Option<&mut [u8]>,
            ) -> Result<(), $crate::nand::NandError> {
                self.chip.read(page, data, spare)
            }
            fn program(
                &mut self,
                page: u32,
                data: &[u8],
                spare: &[u8],
            ) -> Result<(), $crate::nand::NandError> {
                self.chip.program(page, data, spare)
            }
            fn erase(&mut self, block: u32) -> Result<(), $crate::nand::NandError> {
                self.chip.erase(block)
            }
            fn mark_bad(&mut self, block: u32) -> Result<(), $crate::nand::NandError> {
                self.chip.mark_bad(block)
            }
            fn is_bad(&self, block: u32) -> Result<bool, $crate::nand::NandError> {
                Ok(self.chip.block_state(block)?.bad)
            }
            fn erase_count(&self, block: u32) -> Result<u32, $crate::nand::NandError> {
                Ok(self.chip.block_state(block)?.erase_count)
            }
            fn counters(&self) -> $crate::nand::Counters {
                self.chip.counters
            }
            fn sync(&mut self) -> Result<(), $crate::nand::NandError> {
                self.chip.cells.sync()
            }
            fn data_reader(&self) -> Option<$crate::nand::DataReader> {
                $crate::nand::chip::Cells::data_reader(&self.chip.cells, self.chip.geometry)
            }
        }

        impl $crate::nand::RawAccess for $ty {
            fn raw_read(&mut self, page: u32, buf: &mut [u8]) -> Result<(), $crate::nand::NandError> {
                self.chip.raw_read(page, buf)
            }
            fn raw_write(
                &mut self,
                page: u32,
                offset: usize,
                bytes: &[u8],
            ) -> Result<(), $crate::nand::NandError> {
                self.chip.raw_write(page, offset, bytes)
            }
            fn block_state(&self, block: u32) -> Result<$crate::nand::BlockState, $crate::nand::NandError> {
                self.chip.block_state(block)
            }
        }
    };
}
pub(crate) use chip_backend;
