//! A simulated CPU cache in front of persistent memory, with crashes.
//!
//! Stores land in a volatile view. [`Region::flush`] marks the lines it covers for write-back
//! and [`Region::fence`] copies every marked line to the durable image (a flush alone
//! guarantees nothing, as `clwb` without `sfence`). At a crash, every line stored to since it
//! was last written back is either
//! kept (the cache happened to write it back) or lost, by a seeded draw per line: caches
//! write lines back in no guaranteed order (the NVMalloc seed's point), so a protocol that
//! relies on one unpersisted store reaching memory before another is caught here.
//!
//! With [`CrashGranularity::Word`] the draw is per aligned 8-byte word instead, which also
//! tears a multi-word store in flight; both granularities keep the hardware's one promise:
//! an aligned 8-byte store is never torn.

use super::{check_range, LineCounters, Region, RegionError, LINE};
use crate::rng::Rng;

/// The unit a crash keeps or loses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashGranularity {
    /// Whole 64-byte cache lines (how caches write back).
    Line,
    /// Aligned 8-byte words (stricter: also tears stores that span words within a line).
    Word,
}

/// Where an armed crash strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// During fence number `n` (counting from 0; every persist is a flush and a fence): the
    /// earlier fences completed; this one makes nothing durable.
    Fence(u64),
    /// During store number `n` (counting from 0): the store reaches the cache, then power
    /// fails before anything more is persisted.
    Store(u64),
}

/// What a crash did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Units (lines or words) that differed from the durable image at the crash.
    pub dirty: u64,
    /// Of those, written back by the simulated cache.
    pub kept: u64,
    /// Of those, lost.
    pub lost: u64,
}

/// A region behind a simulated write-back cache. See the module documentation.
#[derive(Clone, Debug)]
pub struct CrashRegion {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    dirty: Vec<u64>,
    counters: LineCounters,
    granularity: CrashGranularity,
    keep_probability: f64,
    stores: u64,
    fences: u64,
    pending: Vec<u32>,
    armed: Option<CrashPoint>,
    powered: bool,
}

impl CrashRegion {
    /// A zeroed region; a crash keeps each dirty line with probability 1/2.
    pub fn new(len: usize) -> CrashRegion {
        CrashRegion::from_durable(vec![0; len])
    }

    /// A region whose durable (and visible) contents are `bytes`: a machine booting on them.
    pub fn from_durable(bytes: Vec<u8>) -> CrashRegion {
        let len = bytes.len();
        CrashRegion {
            volatile: bytes.clone(),
            durable: bytes,
            dirty: vec![0; len.div_ceil(LINE).div_ceil(64)],
            counters: LineCounters::new(len),
            granularity: CrashGranularity::Line,
            keep_probability: 0.5,
            stores: 0,
            fences: 0,
            pending: Vec::new(),
            armed: None,
            powered: true,
        }
    }

    /// Sets what a crash keeps or loses, and the probability of keeping each unit.
    pub fn with_crash_model(mut self, granularity: CrashGranularity, keep_probability: f64) -> CrashRegion {
        self.granularity = granularity;
        self.keep_probability = keep_probability;
        self
    }

    /// The bytes that would survive if every unpersisted store were lost.
    pub fn durable(&self) -> &[u8] {
        &self.durable
    }

    /// Stores so far (the numbering of [`CrashPoint::Store`]).
    pub fn stores(&self) -> u64 {
        self.stores
    }

    /// Fences so far (the numbering of [`CrashPoint::Fence`]).
    pub fn fences(&self) -> u64 {
        self.fences
    }

    /// Arms a crash: from that point on every store, flush and fence fails with
    /// [`RegionError::PowerLost`] until [`crash`](Self::crash) reboots the region.
    pub fn arm_crash(&mut self, at: CrashPoint) {
        self.armed = Some(at);
    }

    /// Disarms a crash that has not struck (a campaign that armed one past where the work
    /// ended).
    pub fn disarm(&mut self) {
        self.armed = None;
    }

    /// Whether power has been lost (an armed crash has struck).
    pub fn powered(&self) -> bool {
        self.powered
    }

    /// Lines stored to and not yet persisted.
    pub fn dirty_lines(&self) -> u64 {
        self.dirty.iter().map(|w| w.count_ones() as u64).sum()
    }

    fn is_dirty(&self, line: usize) -> bool {
        self.dirty[line / 64] >> (line % 64) & 1 == 1
    }

    /// The durable image after a crash now, drawn from `seed`, without changing the region.
    pub fn crash_image(&self, seed: u64) -> (Vec<u8>, CrashReport) {
        let mut rng = Rng::new(seed);
        let mut image = self.durable.clone();
        let mut report = CrashReport::default();
        let lines = self.volatile.len().div_ceil(LINE);
        for line in (0..lines).filter(|&l| self.is_dirty(l)) {
            let start = line * LINE;
            let end = (start + LINE).min(self.volatile.len());
            let unit = match self.granularity {
                CrashGranularity::Line => LINE,
                CrashGranularity::Word => 8,
            };
            let mut u = start;
            while u < end {
                let e = (u + unit).min(end);
                if self.volatile[u..e] != image[u..e] {
                    report.dirty += 1;
                    if rng.chance(self.keep_probability) {
                        image[u..e].copy_from_slice(&self.volatile[u..e]);
                        report.kept += 1;
                    } else {
                        report.lost += 1;
                    }
                }
                u = e;
            }
        }
        (image, report)
    }

    /// Crashes and reboots: the region now holds its post-crash durable image (drawn from
    /// `seed`), power is back, no crash is armed, counters of stores and fences go on.
    pub fn crash(&mut self, seed: u64) -> CrashReport {
        let (image, report) = self.crash_image(seed);
        self.durable = image;
        self.volatile.copy_from_slice(&self.durable);
        self.dirty.fill(0);
        self.pending.clear();
        self.armed = None;
        self.powered = true;
        report
    }

    fn check_power(&self) -> Result<(), RegionError> {
        if self.powered {
            Ok(())
        } else {
            Err(RegionError::PowerLost)
        }
    }
}

impl Region for CrashRegion {
    fn len(&self) -> usize {
        self.volatile.len()
    }

    fn bytes(&self) -> &[u8] {
        &self.volatile
    }

    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.update(offset, data.len(), &mut |dst| dst.copy_from_slice(data))
    }

    fn update(&mut self, offset: usize, len: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<(), RegionError> {
        self.check_power()?;
        check_range(offset, len, self.volatile.len())?;
        let n = self.stores;
        self.stores += 1;
        f(&mut self.volatile[offset..offset + len]);
        self.counters.touch(offset, len);
        if len > 0 {
            for line in offset / LINE..=(offset + len - 1) / LINE {
                self.dirty[line / 64] |= 1 << (line % 64);
            }
        }
        if self.armed == Some(CrashPoint::Store(n)) {
            self.powered = false;
            return Err(RegionError::PowerLost);
        }
        Ok(())
    }

    fn flush(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        self.check_power()?;
        check_range(offset, len, self.volatile.len())?;
        if len > 0 {
            for line in offset / LINE..=(offset + len - 1) / LINE {
                if self.is_dirty(line) {
                    self.pending.push(line as u32);
                }
            }
        }
        Ok(())
    }

    fn fence(&mut self) -> Result<(), RegionError> {
        self.check_power()?;
        let n = self.fences;
        self.fences += 1;
        if self.armed == Some(CrashPoint::Fence(n)) {
            self.powered = false;
            return Err(RegionError::PowerLost);
        }
        for line in std::mem::take(&mut self.pending) {
            let line = line as usize;
            if self.is_dirty(line) {
                let s = line * LINE;
                let e = (s + LINE).min(self.volatile.len());
                self.durable[s..e].copy_from_slice(&self.volatile[s..e]);
                self.dirty[line / 64] &= !(1 << (line % 64));
            }
        }
        Ok(())
    }

    fn line_writes(&self) -> &[u32] {
        self.counters.as_slice()
    }

    fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        check_range(offset, data.len(), self.volatile.len())?;
        self.volatile[offset..offset + data.len()].copy_from_slice(data);
        self.durable[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
}
