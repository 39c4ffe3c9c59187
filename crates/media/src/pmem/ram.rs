//! A region in ordinary RAM: volatile, for tests, and the speed limit in benchmarks.

use super::{check_range, LineCounters, Region, RegionError};

/// A region in RAM, zeroed when created. Persist is a range check and nothing else.
#[derive(Clone, Debug)]
pub struct RamRegion {
    bytes: Vec<u8>,
    counters: LineCounters,
}

impl RamRegion {
    pub fn new(len: usize) -> RamRegion {
        RamRegion { bytes: vec![0; len], counters: LineCounters::new(len) }
    }

    /// A region holding `bytes` (for example a crash image).
    pub fn from_bytes(bytes: Vec<u8>) -> RamRegion {
        let counters = LineCounters::new(bytes.len());
        RamRegion { bytes, counters }
    }
}

impl Region for RamRegion {
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        check_range(offset, data.len(), self.bytes.len())?;
        self.bytes[offset..offset + data.len()].copy_from_slice(data);
        self.counters.touch(offset, data.len());
        Ok(())
    }
    fn update(&mut self, offset: usize, len: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<(), RegionError> {
        check_range(offset, len, self.bytes.len())?;
        f(&mut self.bytes[offset..offset + len]);
        self.counters.touch(offset, len);
        Ok(())
    }
    fn flush(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        check_range(offset, len, self.bytes.len())
    }
    fn fence(&mut self) -> Result<(), RegionError> {
        Ok(())
    }
    fn line_writes(&self) -> &[u32] {
        self.counters.as_slice()
    }
    fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        check_range(offset, data.len(), self.bytes.len())?;
        self.bytes[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
}
