//! Faults in persistent memory: wild writes from errant code, and bit flips in the medium.

use std::ops::Range;

use super::{Region, RegionError};
use crate::rng::Rng;

/// One injected fault, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionFault {
    /// Random bytes stored (and persisted) at `offset..offset + len`, as a stray pointer does.
    WildWrite { offset: usize, len: usize },
    /// Bits flipped in the medium, as bit offsets from the start of the region.
    BitFlips { bits: Vec<u64> },
}

/// Injects faults into regions, deterministically from a seed, and records them.
#[derive(Clone, Debug)]
pub struct RegionFaults {
    rng: Rng,
    log: Vec<RegionFault>,
}

impl RegionFaults {
    pub fn new(seed: u64) -> RegionFaults {
        RegionFaults { rng: Rng::new(seed), log: Vec::new() }
    }

    /// Every fault injected so far.
    pub fn faults(&self) -> &[RegionFault] {
        &self.log
    }

    /// The random stream (so a caller can draw its own choices from the same seed).
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// A wild write of `len` random bytes at `offset`: stored, then persisted, because an
    /// errant store reaches the medium sooner or later. Every byte differs from what was
    /// there, so the damage is never accidentally harmless.
    pub fn wild_write_at<R: Region + ?Sized>(
        &mut self,
        region: &mut R,
        offset: usize,
        len: usize,
    ) -> Result<RegionFault, RegionError> {
        super::check_range(offset, len, region.len())?;
        let mut bytes = region.bytes()[offset..offset + len].to_vec();
        for b in &mut bytes {
            *b ^= 1 + self.rng.below(255) as u8;
        }
        region.write(offset, &bytes)?;
        region.persist(offset, len)?;
        let f = RegionFault::WildWrite { offset, len };
        self.log.push(f.clone());
        Ok(f)
    }

    /// A wild write of 1..=`max_len` bytes at a random place within `range`.
    pub fn wild_write<R: Region + ?Sized>(
        &mut self,
        region: &mut R,
        range: Range<usize>,
        max_len: usize,
    ) -> Result<RegionFault, RegionError> {
        super::check_range(range.start, range.len(), region.len())?;
        if range.is_empty() || max_len == 0 {
            return Err(RegionError::Range { offset: range.start, len: 0, size: region.len() });
        }
        let len = 1 + self.rng.below(max_len.min(range.len()) as u64) as usize;
        let offset = range.start + self.rng.below((range.len() - len + 1) as u64) as usize;
        self.wild_write_at(region, offset, len)
    }

    /// Flips `n` distinct random bits of the medium within `range`.
    pub fn flip_bits<R: Region + ?Sized>(
        &mut self,
        region: &mut R,
        range: Range<usize>,
        n: usize,
    ) -> Result<Vec<u64>, RegionError> {
        super::check_range(range.start, range.len(), region.len())?;
        let span = range.len() as u64 * 8;
        let n = n.min(span as usize);
        let bits: Vec<u64> =
            self.rng.distinct(n, span).into_iter().map(|b| range.start as u64 * 8 + b).collect();
        self.apply_flips(region, &bits)?;
        Ok(bits)
    }

    /// Flips each bit within `range` with probability `rate` (media decay over a period).
    /// Returns the bits flipped.
    pub fn decay<R: Region + ?Sized>(
        &mut self,
        region: &mut R,
        range: Range<usize>,
        rate: f64,
    ) -> Result<Vec<u64>, RegionError> {
        super::check_range(range.start, range.len(), region.len())?;
        let span = range.len() as u64 * 8;
        let mut bits = Vec::new();
        let mut pos = self.rng.geometric_skip(rate);
        while pos < span {
            bits.push(range.start as u64 * 8 + pos);
            pos = pos.saturating_add(1).saturating_add(self.rng.geometric_skip(rate));
        }
        self.apply_flips(region, &bits)?;
        Ok(bits)
    }

    fn apply_flips<R: Region + ?Sized>(&mut self, region: &mut R, bits: &[u64]) -> Result<(), RegionError> {
        if bits.is_empty() {
            return Ok(());
        }
        for &bit in bits {
            let off = (bit / 8) as usize;
            let b = region.bytes()[off] ^ (1 << (bit % 8));
            region.corrupt(off, &[b])?;
        }
        self.log.push(RegionFault::BitFlips { bits: bits.to_vec() });
        Ok(())
    }
}
