//! A chip that fails the way NAND fails, deterministically from a seed.
//!
//! Faults enter through the chip, never through special cases in the layers above. Every
//! fault injected is recorded ([`FaultyNand::faults`]) so that a test can state what it did.
//! Damage to stored bits is written into the wrapped chip's cells (through [`RawAccess`]),
//! so it persists until the block is erased, as retention errors and disturbed cells do.

use std::collections::HashMap;

use super::{BlockState, Counters, Geometry, Nand, NandError, RawAccess};
use crate::rng::Rng;

/// Which bytes of a page a fault may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    Data,
    Spare,
    Both,
}

/// What happens to a block erased more often than its endurance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WearOut {
    /// The erase fails and the block turns bad.
    EraseFails,
    /// The erase succeeds but one more bit of the block is stuck at 0 for good.
    BitsStick,
}

/// An endurance limit per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endurance {
    /// Erases a block survives.
    pub limit: u32,
    pub effect: WearOut,
}

/// One injected fault, as recorded.
#[derive(Clone, Debug, PartialEq)]
pub enum NandFault {
    /// Bits flipped on demand; bit positions count from the first data byte through the spare.
    BitFlips { page: u32, bits: Vec<u32> },
    /// Bits flipped by a read, at the configured rate.
    ReadDisturb { page: u32, bits: Vec<u32> },
    /// A bit stuck at `value`, re-asserted after every program and erase of the page.
    StuckBit { page: u32, bit: u32, value: bool },
    /// A page whose data and spare were replaced by garbage.
    LostPage { page: u32 },
    /// A misdirected write: the data and spare of page `from` landed on page `to` too (a
    /// controller or firmware error in the address), so `to` holds a valid page of elsewhere.
    Misdirected { from: u32, to: u32 },
    /// A program reported as failed; the page holds part of what was programmed.
    ProgramFailed { page: u32 },
    /// An erase reported as failed; the block turned bad.
    EraseFailed { block: u32 },
    /// Power cut during the `op`-th mutating operation (counting from 0).
    PowerCut { op: u64, torn: Torn },
    /// A block past its endurance.
    WornOut { block: u32, erases: u32, effect: WearOut },
}

/// What the operation in flight at a power cut left behind.
#[derive(Clone, Debug, PartialEq)]
pub enum Torn {
    /// A program that cleared `fraction` of the bits it should have cleared (0: it never
    /// started, the page is still erased; 1: it completed but was never acknowledged).
    Program { page: u32, fraction: f64 },
    /// An erase that set `fraction` of the block's bits it should have set.
    Erase { block: u32, fraction: f64 },
}

/// Wraps a chip and injects faults into it.
#[derive(Clone)]
pub struct FaultyNand<N> {
    inner: N,
    rng: Rng,
    faults: Vec<NandFault>,
    ops: u64,
    cut_at: Option<u64>,
    powered: bool,
    read_disturb_rate: f64,
    program_fail_rate: f64,
    erase_fail_rate: f64,
    fail_program: Vec<u32>,
    fail_erase: Vec<u32>,
    stuck: HashMap<u32, Vec<(u32, bool)>>,
    endurance: Option<Endurance>,
}

impl<N: std::fmt::Debug> std::fmt::Debug for FaultyNand<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyNand")
            .field("inner", &self.inner)
            .field("faults", &self.faults.len())
            .field("ops", &self.ops)
            .field("powered", &self.powered)
            .finish_non_exhaustive()
    }
}

impl<N: Nand + RawAccess> FaultyNand<N> {
    /// Wraps `inner`; every random choice follows from `seed`.
    pub fn new(inner: N, seed: u64) -> FaultyNand<N> {
        FaultyNand {
            inner,
            rng: Rng::new(seed),
            faults: Vec::new(),
            ops: 0,
            cut_at: None,
            powered: true,
            read_disturb_rate: 0.0,
            program_fail_rate: 0.0,
            erase_fail_rate: 0.0,
            fail_program: Vec::new(),
            fail_erase: Vec::new(),
            stuck: HashMap::new(),
            endurance: None,
        }
    }

    /// Every fault injected so far, in order.
    pub fn faults(&self) -> &[NandFault] {
        &self.faults
    }

    /// Mutating operations (programs and erases) attempted so far: a workload run once
    /// without faults tells a harness how many power-cut points it has.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    pub fn inner(&self) -> &N {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut N {
        &mut self.inner
    }

    pub fn into_inner(self) -> N {
        self.inner
    }

    fn raw_bits(&self) -> u32 {
        self.inner.geometry().raw_page_size() as u32 * 8
    }

    fn area_bits(&self, area: Area) -> (u32, u32) {
        let g = self.inner.geometry();
        match area {
            Area::Data => (0, g.page_size * 8),
            Area::Spare => (g.page_size * 8, g.spare_size * 8),
            Area::Both => (0, self.raw_bits()),
        }
    }

    fn xor_bits(&mut self, page: u32, bits: &[u32]) -> Result<(), NandError> {
        let mut raw = vec![0u8; self.inner.geometry().raw_page_size()];
        self.inner.raw_read(page, &mut raw)?;
        for &b in bits {
            raw[(b / 8) as usize] ^= 1 << (b % 8);
        }
        self.inner.raw_write(page, 0, &raw)
    }

    /// Flips `n` distinct random bits of `page` (data and spare), as retention loss does.
    pub fn flip_bits(&mut self, page: u32, n: u32) -> Result<Vec<u32>, NandError> {
        self.flip_bits_in(page, n, Area::Both)
    }

    /// Flips `n` distinct random bits of `page` within `area`.
    pub fn flip_bits_in(&mut self, page: u32, n: u32, area: Area) -> Result<Vec<u32>, NandError> {
        self.inner.geometry().check_page(page)?;
        let (start, len) = self.area_bits(area);
        let n = n.min(len);
        let bits: Vec<u32> =
            self.rng.distinct(n as usize, len as u64).into_iter().map(|b| start + b as u32).collect();
        self.xor_bits(page, &bits)?;
        self.faults.push(NandFault::BitFlips { page, bits: bits.clone() });
        Ok(bits)
    }

    /// Replaces the data and spare of `page` with garbage: a page that no longer reads back.
    pub fn lose_page(&mut self, page: u32) -> Result<(), NandError> {
        self.inner.geometry().check_page(page)?;
        let mut garbage = vec![0u8; self.inner.geometry().raw_page_size()];
        self.rng.fill(&mut garbage);
        self.inner.raw_write(page, 0, &garbage)?;
        self.faults.push(NandFault::LostPage { page });
        Ok(())
    }

    /// Copies page `from`, data and spare, over page `to`: a write that reached the wrong
    /// address. Every check of `to` that does not know its own address passes.
    pub fn misdirect(&mut self, from: u32, to: u32) -> Result<(), NandError> {
        let g = self.inner.geometry();
        g.check_page(from)?;
        g.check_page(to)?;
        let mut page = vec![0u8; g.raw_page_size()];
        self.inner.raw_read(from, &mut page)?;
        self.inner.raw_write(to, 0, &page)?;
        self.faults.push(NandFault::Misdirected { from, to });
        Ok(())
    }

    /// Sticks bit `bit` of `page` (counted as in [`NandFault::BitFlips`]) at `value`, now and
    /// after every later program or erase.
    pub fn stick_bit(&mut self, page: u32, bit: u32, value: bool) -> Result<(), NandError> {
        self.inner.geometry().check_page(page)?;
        if bit >= self.raw_bits() {
            return Err(NandError::BufferSize {
                what: "bit position in a page",
                got: bit as usize,
                expected: 0,
            });
        }
        self.stuck.entry(page).or_default().push((bit, value));
        self.faults.push(NandFault::StuckBit { page, bit, value });
        self.assert_stuck(page)
    }

    fn assert_stuck(&mut self, page: u32) -> Result<(), NandError> {
        let Some(bits) = self.stuck.get(&page) else { return Ok(()) };
        let bits = bits.clone();
        let mut raw = vec![0u8; self.inner.geometry().raw_page_size()];
        self.inner.raw_read(page, &mut raw)?;
        for (bit, value) in bits {
            let byte = &mut raw[(bit / 8) as usize];
            if value {
                *byte |= 1 << (bit % 8);
            } else {
                *byte &= !(1 << (bit % 8));
            }
        }
        self.inner.raw_write(page, 0, &raw)
    }

    /// Each bit of a page read flips with probability `rate` (persistently, as read disturb
    /// and retention errors do). 0 turns it off.
    pub fn set_read_disturb(&mut self, rate: f64) {
        self.read_disturb_rate = rate;
    }

    /// Each program fails with probability `rate`, leaving the page partly programmed.
    pub fn set_program_fail_rate(&mut self, rate: f64) {
        self.program_fail_rate = rate;
    }

    /// Each erase fails with probability `rate`, and the block turns bad.
    pub fn set_erase_fail_rate(&mut self, rate: f64) {
        self.erase_fail_rate = rate;
    }

    /// The next program of `page` fails.
    pub fn fail_next_program(&mut self, page: u32) {
        self.fail_program.push(page);
    }

    /// The next erase of `block` fails (and the block turns bad).
    pub fn fail_next_erase(&mut self, block: u32) {
        self.fail_erase.push(block);
    }

    /// Blocks wear out after `endurance.limit` erases.
    pub fn set_endurance(&mut self, endurance: Option<Endurance>) {
        self.endurance = endurance;
    }

    /// Cuts power during mutating operation number `op` (0 is the next one from a fresh
    /// wrapper; counting continues across power cycles). That operation is torn; every
    /// operation after it fails with [`NandError::PowerLost`] until [`power_on`](Self::power_on).
    pub fn cut_power_at(&mut self, op: u64) {
        self.cut_at = Some(op);
    }

    /// Draws every later random choice (how much of a cut operation is torn, ...) from
    /// `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }

    /// Cuts power now, between operations.
    pub fn cut_power_now(&mut self) {
        self.powered = false;
        self.cut_at = None;
    }

    /// Whether the chip has power.
    pub fn powered(&self) -> bool {
        self.powered
    }

    /// Restores power: the chip is as the cut left it.
    pub fn power_on(&mut self) {
        self.powered = true;
        self.cut_at = None;
    }

    fn check_power(&self) -> Result<(), NandError> {
        if self.powered {
            Ok(())
        } else {
            Err(NandError::PowerLost)
        }
    }

    /// Starts a mutating operation: counts it and says whether power dies during it.
    fn begin_op(&mut self) -> Result<bool, NandError> {
        self.check_power()?;
        let op = self.ops;
        self.ops += 1;
        Ok(self.cut_at == Some(op))
    }

    /// A fraction of the work done by an interrupted operation: sometimes none, sometimes
    /// all (finished but never acknowledged), otherwise anything between.
    fn torn_fraction(&mut self) -> f64 {
        match self.rng.below(10) {
            0 => 0.0,
            1 => 1.0,
            _ => self.rng.unit(),
        }
    }

    /// Programs a random `fraction` of the bits `data`/`spare` would clear.
    fn program_partly(
        &mut self,
        page: u32,
        data: &[u8],
        spare: &[u8],
        fraction: f64,
    ) -> Result<(), NandError> {
        if fraction <= 0.0 {
            return Ok(());
        }
        let mut d = data.to_vec();
        let mut s = spare.to_vec();
        if fraction < 1.0 {
            for byte in d.iter_mut().chain(s.iter_mut()) {
                for bit in 0..8 {
                    if !self.rng.chance(fraction) {
                        *byte |= 1 << bit; // this bit never got programmed: stays erased
                    }
                }
            }
            // No bit moved: the page is as erased as before the attempt (as with none of
            // the work done), and may be programmed.
            if d.iter().chain(&s).all(|&b| b == 0xFF) {
                return Ok(());
            }
        }
        self.inner.program(page, &d, &s)?;
        self.assert_stuck(page)
    }

    /// Sets a random `fraction` of the block's bits to 1 (a complete erase at 1).
    fn erase_partly(&mut self, block: u32, fraction: f64) -> Result<(), NandError> {
        if fraction <= 0.0 {
            return Ok(());
        }
        if fraction >= 1.0 {
            return self.inner.erase(block);
        }
        let g = self.inner.geometry();
        let mut raw = vec![0u8; g.raw_page_size()];
        for page in g.first_page(block)..g.first_page(block) + g.pages_per_block {
            self.inner.raw_read(page, &mut raw)?;
            for byte in raw.iter_mut() {
                for bit in 0..8 {
                    if self.rng.chance(fraction) {
                        *byte |= 1 << bit;
                    }
                }
            }
            self.inner.raw_write(page, 0, &raw)?;
        }
        Ok(())
    }

    fn after_erase(&mut self, block: u32) -> Result<(), NandError> {
        let g = self.inner.geometry();
        for page in g.first_page(block)..g.first_page(block) + g.pages_per_block {
            self.assert_stuck(page)?;
        }
        Ok(())
    }

    fn take(list: &mut Vec<u32>, v: u32) -> bool {
        if let Some(i) = list.iter().position(|&x| x == v) {
            list.swap_remove(i);
            true
        } else {
            false
        }
    }
}

impl<N: Nand + RawAccess> Nand for FaultyNand<N> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn read(
        &mut self,
        page: u32,
        data: Option<&mut [u8]>,
        spare: Option<&mut [u8]>,
    ) -> Result<(), NandError> {
        self.check_power()?;
        self.inner.geometry().check_page(page)?;
        if self.read_disturb_rate > 0.0 {
            let total = self.raw_bits() as u64;
            let mut bits = Vec::new();
            let mut pos = self.rng.geometric_skip(self.read_disturb_rate);
            while pos < total {
                bits.push(pos as u32);
                pos = pos.saturating_add(1).saturating_add(self.rng.geometric_skip(self.read_disturb_rate));
            }
            if !bits.is_empty() {
                self.xor_bits(page, &bits)?;
                self.faults.push(NandFault::ReadDisturb { page, bits });
            }
        }
        self.inner.read(page, data, spare)
    }

    fn program(&mut self, page: u32, data: &[u8], spare: &[u8]) -> Result<(), NandError> {
        let cut = self.begin_op()?;
        if cut {
            // Refuse what the chip itself would refuse before any bit moves.
            let g = self.inner.geometry();
            g.check_page(page)?;
            let st = self.inner.block_state(g.block_of(page))?;
            if !st.bad && g.index_in_block(page) >= st.next_index {
                let fraction = self.torn_fraction();
                self.program_partly(page, data, spare, fraction)?;
                self.faults
                    .push(NandFault::PowerCut { op: self.ops - 1, torn: Torn::Program { page, fraction } });
            }
            self.powered = false;
            return Err(NandError::PowerLost);
        }
        let fail = Self::take(&mut self.fail_program, page)
            || (self.program_fail_rate > 0.0 && self.rng.chance(self.program_fail_rate));
        if fail {
            let fraction = 0.05 + 0.9 * self.rng.unit();
            self.program_partly(page, data, spare, fraction)?;
            self.faults.push(NandFault::ProgramFailed { page });
            return Err(NandError::ProgramFailed { page });
        }
        self.inner.program(page, data, spare)?;
        self.assert_stuck(page)
    }

    fn erase(&mut self, block: u32) -> Result<(), NandError> {
        let cut = self.begin_op()?;
        self.inner.geometry().check_block(block)?;
        if self.inner.is_bad(block)? {
            return Err(NandError::BadBlock { block });
        }
        if cut {
            let fraction = self.torn_fraction();
            self.erase_partly(block, fraction)?;
            self.faults.push(NandFault::PowerCut { op: self.ops - 1, torn: Torn::Erase { block, fraction } });
            self.powered = false;
            return Err(NandError::PowerLost);
        }
        let erases = self.inner.erase_count(block)?;
        if let Some(e) = self.endurance.filter(|e| erases >= e.limit) {
            self.faults.push(NandFault::WornOut { block, erases, effect: e.effect });
            match e.effect {
                WearOut::EraseFails => {
                    let f = self.rng.unit();
                    self.erase_partly(block, f)?;
                    self.inner.mark_bad(block)?;
                    return Err(NandError::EraseFailed { block });
                }
                WearOut::BitsStick => {
                    let g = self.inner.geometry();
                    let page = g.first_page(block) + self.rng.below(g.pages_per_block as u64) as u32;
                    let bit = self.rng.below(self.raw_bits() as u64) as u32;
                    self.stuck.entry(page).or_default().push((bit, false));
                    self.faults.push(NandFault::StuckBit { page, bit, value: false });
                }
            }
        }
        let fail = Self::take(&mut self.fail_erase, block)
            || (self.erase_fail_rate > 0.0 && self.rng.chance(self.erase_fail_rate));
        if fail {
            let f = self.rng.unit();
            self.erase_partly(block, f)?;
            self.inner.mark_bad(block)?;
            self.faults.push(NandFault::EraseFailed { block });
            return Err(NandError::EraseFailed { block });
        }
        self.inner.erase(block)?;
        self.after_erase(block)
    }

    fn mark_bad(&mut self, block: u32) -> Result<(), NandError> {
        self.check_power()?;
        self.inner.mark_bad(block)
    }

    fn is_bad(&self, block: u32) -> Result<bool, NandError> {
        self.check_power()?;
        self.inner.is_bad(block)
    }

    fn erase_count(&self, block: u32) -> Result<u32, NandError> {
        self.inner.erase_count(block)
    }

    fn counters(&self) -> Counters {
        self.inner.counters()
    }

    fn sync(&mut self) -> Result<(), NandError> {
        self.check_power()?;
        self.inner.sync()
    }
}

impl<N: Nand + RawAccess> RawAccess for FaultyNand<N> {
    fn raw_read(&mut self, page: u32, buf: &mut [u8]) -> Result<(), NandError> {
        self.inner.raw_read(page, buf)
    }
    fn raw_write(&mut self, page: u32, offset: usize, bytes: &[u8]) -> Result<(), NandError> {
        self.inner.raw_write(page, offset, bytes)
    }
    fn block_state(&self, block: u32) -> Result<BlockState, NandError> {
        self.inner.block_state(block)
    }
}
