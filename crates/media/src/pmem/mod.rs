//! Byte-addressable persistent memory: the [`Region`] trait and its backends.
//!
//! A region is a mapped byte range. Loads read [`Region::bytes`]; stores go through
//! [`Region::write`] so that a simulation can see them; [`Region::persist`] makes a range
//! durable (write back its cache lines and fence). What was stored but not persisted may or
//! may not survive a crash, line by line, in no order: [`CrashRegion`] simulates exactly that.
//!
//! Backends: [`RamRegion`] (volatile, for tests and as a speed limit), [`MmapRegion`] (a file,
//! or a DAX device, mapped), [`CrashRegion`] (a CPU cache in front of persistent memory, with
//! crashes), [`ProtectedRegion`] (every store wrapped in `mprotect`, the PRIMS anchor).
//! [`RegionFaults`] injects wild writes and bit flips into any of them.

mod crash;
mod faults;
mod guard;
mod mmap;
mod protected;
mod ram;

pub use crash::{CrashGranularity, CrashPoint, CrashRegion, CrashReport};
pub use faults::{RegionFault, RegionFaults};
pub use guard::{GuardStats, Guarded, Reprotect};
pub use mmap::{flush_instruction, maps_direct, on_tmpfs, MmapRegion, Persistence};
pub use protected::ProtectedRegion;
pub use ram::RamRegion;

/// The unit in which CPU caches write back to memory.
pub const LINE: usize = 64;

/// Errors of a persistent-memory region.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("range {offset}+{len} is outside the {size}-byte region")]
    Range { offset: usize, len: usize, size: usize },
    #[error("offset {offset} is not {align}-byte aligned")]
    Misaligned { offset: usize, align: usize },
    /// The simulated machine crashed; nothing more reaches the region until it restarts.
    #[error("the region has lost power")]
    PowerLost,
    /// Bytes a layer above found damaged and could not rebuild (a store into them would
    /// fold the damage into what protects them).
    #[error("bytes {offset}+{len} are damaged beyond repair")]
    Damaged { offset: usize, len: usize },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn check_range(offset: usize, len: usize, size: usize) -> Result<(), RegionError> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(RegionError::Range { offset, len, size });
    }
    Ok(())
}

/// A byte-addressable persistent range.
pub trait Region: Send {
    /// Bytes in the region.
    fn len(&self) -> usize;

    /// What a load sees now (for a simulated cache: including stores not yet persisted).
    fn bytes(&self) -> &[u8];

    /// Stores `data` at `offset`. Not durable until persisted.
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError>;

    /// Read-modify-write of `[offset, offset + len)` in place: `f` sees the current bytes and
    /// changes them; counted as one store. (Parity updates use it: no copy out and back.)
    fn update(&mut self, offset: usize, len: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<(), RegionError>;

    /// Starts writing back every cache line overlapping `[offset, offset + len)`. Nothing is
    /// durable, or ordered, until the next [`fence`](Region::fence).
    fn flush(&mut self, offset: usize, len: usize) -> Result<(), RegionError>;

    /// Waits for every flush so far: when it returns, the flushed lines survive a crash, and
    /// later stores are ordered after them.
    fn fence(&mut self) -> Result<(), RegionError>;

    /// Stores per 64-byte line since the region was opened (saturating), for wear studies;
    /// empty for a region that does not count (an `MmapRegion` counts when asked to).
    fn line_writes(&self) -> &[u32];

    /// Damages the medium: `data` replaces the stored bytes at once, durable, bypassing
    /// caches, protection and counters (what a failing cell or a stray DMA does).
    fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError>;

    /// From now on, pages inside `[start, end)` may be kept read-only between transactions
    /// (a region that can: [`Guarded`]); others ignore it.
    fn guard(&mut self, start: usize, end: usize) -> Result<(), RegionError> {
        let _ = (start, end);
        Ok(())
    }

    /// A transaction is over: the guarded pages it wrote may be protected again.
    fn seal(&mut self) -> Result<(), RegionError> {
        Ok(())
    }

    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`.
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), RegionError> {
        check_range(offset, buf.len(), self.len())?;
        buf.copy_from_slice(&self.bytes()[offset..offset + buf.len()]);
        Ok(())
    }

    /// An aligned 8-byte store: atomic, never torn by a crash.
    fn write_u64(&mut self, offset: usize, value: u64) -> Result<(), RegionError> {
        if !offset.is_multiple_of(8) {
            return Err(RegionError::Misaligned { offset, align: 8 });
        }
        self.write(offset, &value.to_le_bytes())
    }

    /// An aligned 8-byte load.
    fn read_u64(&self, offset: usize) -> Result<u64, RegionError> {
        if !offset.is_multiple_of(8) {
            return Err(RegionError::Misaligned { offset, align: 8 });
        }
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes back the lines of `[offset, offset + len)` and fences: when it returns, those
    /// bytes survive a crash.
    fn persist(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        self.flush(offset, len)?;
        self.fence()
    }

    /// A store that bypasses the cache on its way to the medium (non-temporal): it needs no
    /// flush, and is durable at the next [`fence`](Region::fence). Worth it for bytes the
    /// CPU will not read back soon, whose lines a write-back would otherwise evict or whose
    /// read-for-ownership would miss. The default is a store plus a flush.
    fn write_streaming(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.write(offset, data)?;
        self.flush(offset, data.len())
    }

    /// Stores then persists.
    fn write_persist(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.write(offset, data)?;
        self.persist(offset, data.len())
    }
}

/// A region behind a pointer is a region: boxed (chosen at run time), or borrowed (a log or a
/// heap run on a region it does not own, as the power-cut campaigns run their workload on
/// the harness's copy).
macro_rules! forward_region {
    ($($ty:ty),+) => {$(
        impl<R: Region + ?Sized> Region for $ty {
            fn len(&self) -> usize {
                (**self).len()
            }
            fn bytes(&self) -> &[u8] {
                (**self).bytes()
            }
            fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
                (**self).write(offset, data)
            }
            fn update(&mut self, offset: usize, len: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<(), RegionError> {
                (**self).update(offset, len, f)
            }
            fn flush(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
                (**self).flush(offset, len)
            }
            fn write_streaming(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
                (**self).write_streaming(offset, data)
            }
            fn fence(&mut self) -> Result<(), RegionError> {
                (**self).fence()
            }
            fn line_writes(&self) -> &[u32] {
                (**self).line_writes()
            }
            fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
                (**self).corrupt(offset, data)
            }
        }
    )+};
}

forward_region!(Box<R>, &mut R);

/// Store counts per 64-byte line.
#[derive(Clone, Debug)]
pub(crate) struct LineCounters {
    counts: Vec<u32>,
}

impl LineCounters {
    pub fn new(len: usize) -> LineCounters {
        LineCounters { counts: vec![0; len.div_ceil(LINE)] }
    }

    pub fn touch(&mut self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        for c in &mut self.counts[offset / LINE..=(offset + len - 1) / LINE] {
            *c = c.saturating_add(1);
        }
    }

    /// Touches every page of the counters (see [`MmapRegion::prefault`]).
    pub fn prefault(&mut self, page: usize) {
        let step = (page / std::mem::size_of::<u32>()).max(1);
        for i in (0..self.counts.len()).step_by(step) {
            self.counts[i] = std::hint::black_box(self.counts[i]);
        }
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.counts
    }
}
