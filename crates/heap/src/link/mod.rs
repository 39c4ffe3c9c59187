//! Allocation into a pointer slot, and freeing from one, without the journal (version 4
//! pools): PMDK's `pmemobj_alloc` and `pmemobj_free` with a destination pointer, at NVMalloc's
//! price of one header line, plus the slot's line.
//!
//! An allocation writes the block's header *linked* (state, length, and the slot's offset),
//! fences, then writes the slot and fences. Recovery counts a linked block allocated exactly
//! when its slot points at it: a crash before the slot is durable leaves the block free and
//! the slot as it was. Freeing a block that is still linked writes the slot alone (null): the
//! header, linked to a slot that no longer points at it, then says free.
//!
//! A crash can tear a header between its two words (each an aligned 8-byte store, never torn
//! itself). Each word carries its own check, so a torn header reads, and as one of the two
//! states: a new word 0 with the old word 1 is linked to the block's old slot, which no longer
//! points at it (it was free); an old word 0 with the new word 1 is the old state (free, or
//! linked to a slot the new allocation has not written yet). Either way the block is free, as
//! it must be before the slot is written.
//!
//! The link must stay true while the block is allocated. Whatever writes the slot, or frees or
//! moves the object that holds it, first unlinks the block ([`Pool::unlink_within`]): its
//! header's word 0 rewritten allocated, one atomic store. Every transaction write, free and
//! pointer-logged write does this, before the fence that precedes its writes in place.

pub(crate) mod table;

use bitmend_media::pmem::Region;

use crate::alloc::{Plan, Ptr};
use crate::pool::Pool;
use crate::tx::Slot;
use crate::HeapError;

impl<R: Region> Pool<R> {
    /// Allocates a block of at least `len` payload bytes and points `slot` at it, atomically
    /// (a crash leaves the slot as it was, and the block free, or both done); the slot's old
    /// value is overwritten, not freed. Two header and slot lines and two fences, no journal
    /// record, where the pool's headers can link (version 4) and the block is a run's; else
    /// one transaction does the same.
    pub fn alloc_into(&mut self, slot: Slot, len: u64) -> Result<Ptr, HeapError> {
        let r = self.alloc_into_unsealed(slot, len);
        self.log.region_mut().seal()?;
        r
    }

    fn alloc_into_unsealed(&mut self, slot: Slot, len: u64) -> Result<Ptr, HeapError> {
        // Not in a pool that heals: a crash can tear the linked header's store so that it
        // reads as the free header it was, and nothing would then name the block for
        // recovery to recompute its page's parity and signature. A transaction names it.
        let linkable = !self.heals() && self.alloc.links(len) && slot.at / 8 <= u32::MAX as u64;
        let plan = match linkable {
            true => Some(self.plan(len)?),
            false => None,
        };
        let Some(Plan::Block(p)) = plan else {
            // A run to format first (its format is journaled) or a span: a transaction.
            if let Some(plan) = plan {
                self.alloc.unplan(plan);
            }
            return self.tx_healing(|tx| {
                let p = tx.alloc(len)?;
                tx.set(slot, p)?;
                Ok(p)
            });
        };
        let p = self.alloc.realize(self.log.region_mut(), Plan::Block(p))?;
        if let Err(e) = self.link(slot, p, len) {
            self.alloc.unpick(p);
            return Err(e);
        }
        self.links.insert(&self.alloc, slot.at, p);
        Ok(p)
    }

    /// The durable part of [`alloc_into`](Self::alloc_into): the header linked, then the slot.
    fn link(&mut self, slot: Slot, p: Ptr, len: u64) -> Result<(), HeapError> {
        // A block still linked to the slot is about to lose it: unlinked, fenced with the
        // new header.
        self.unlink_within(slot.at, slot.at + 8)?;
        self.keep_vouched(slot.at, slot.at + 8)?;
        self.keep_vouched(p.header(), p.0)?;
        let region = self.log.region_mut();
        self.alloc.mark_linked(region, p, len, slot.at)?;
        region.fence()?;
        region.write(slot.at as usize, &p.0.to_le_bytes())?;
        region.flush(slot.at as usize, 8)?;
        region.fence()?;
        Ok(())
    }

    /// Frees the object `slot` points at and nulls the slot, atomically (nothing, for a null
    /// slot). A block [`alloc_into`](Self::alloc_into) linked to this slot costs the slot's
    /// line and one fence; any other, one transaction.
    pub fn free_from(&mut self, slot: Slot) -> Result<(), HeapError> {
        let r = self.free_from_unsealed(slot);
        self.log.region_mut().seal()?;
        r
    }

    fn free_from_unsealed(&mut self, slot: Slot) -> Result<(), HeapError> {
        // The slot decides what is freed: in a pool that heals, its line is checked first
        // and rebuilt if damaged (a slot that reads null would free nothing, silently).
        if let Err(HeapError::Damaged { at, len, .. }) = self.check_tx_read(slot.at, 8) {
            self.verify(at, len)?;
        }
        let p = self.get(slot);
        if p == Ptr::NULL {
            return Ok(());
        }
        let linked =
            self.links.get(slot.at) == Some(p) && self.alloc.names_link(self.log.region(), p, slot.at);
        // The block's capacity, not its length: no header read (slots lie within lengths).
        let end = p.0 + self.alloc.capacity(p).unwrap_or(0);
        if !linked || (p.0..end).contains(&slot.at) {
            // The slot read again inside, checked: a damaged pointer must not free a block.
            return self.tx_healing(|tx| {
                let p = tx.get_checked(slot)?;
                if p != Ptr::NULL {
                    tx.free(p)?;
                }
                tx.set(slot, Ptr::NULL)
            });
        }
        // Blocks linked to slots inside the object lose them when it is reused: unlinked,
        // fenced with the slot.
        self.unlink_within(p.0, end)?;
        self.keep_vouched(slot.at, slot.at + 8)?;
        let region = self.log.region_mut();
        region.write(slot.at as usize, &0u64.to_le_bytes())?;
        region.flush(slot.at as usize, 8)?;
        region.fence()?;
        self.links.take(&self.alloc, slot.at);
        self.alloc.release(p)
    }

    /// Before a write outside a transaction to `[start, end)`: if the journal's last record is
    /// a checksummed commit that vouches for those bytes, the journal is checked out first
    /// (its fence made the commit's writes durable, and a changed byte would make recovery
    /// take the commit for torn and roll it back).
    fn keep_vouched(&mut self, start: u64, end: u64) -> Result<(), HeapError> {
        if self.vouched.iter().any(|&(at, len)| at < end && start < at + len as u64) {
            self.checkout()?;
        }
        Ok(())
    }

    /// Unlinks every block linked to a slot in `[start, end)` (its header's word 0 written
    /// allocated, flushed, not fenced: the caller fences before the slot changes). Returns
    /// whether it wrote any.
    pub(crate) fn unlink_within(&mut self, start: u64, end: u64) -> Result<bool, HeapError> {
        let mut wrote = false;
        let found = match end.saturating_sub(start) {
            // One slot (the common case: a slot about to be written), without a search.
            8 if start.is_multiple_of(8) => self.links.take(&self.alloc, start).map(|p| vec![(start, p)]),
            _ => Some(self.links.take_within(&self.alloc, start, end)),
        };
        for (slot, p) in found.unwrap_or_default() {
            // An entry can be stale (the block freed by a transaction, or linked elsewhere
            // since): only a header that still names this slot is rewritten.
            if self.alloc.is_linked_to(self.log.region(), p, slot) {
                self.keep_vouched(p.header(), p.header() + 8)?;
                self.alloc.unlink(self.log.region_mut(), p)?;
                wrote = true;
            }
        }
        Ok(wrote)
    }

    /// Blocks linked to their slots (for tests and `stat`).
    pub fn linked_blocks(&self) -> usize {
        self.links.len()
    }
}
