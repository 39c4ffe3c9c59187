//! Which slots blocks are linked to (`mod.rs` says what a link is): a table the pool keeps
//! in RAM, rebuilt at open from the headers, that knows nothing of the pool itself.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::alloc::{Allocator, Ptr};

/// The slots blocks are linked to (slot offset to block), and how many linked slots each
/// object holds, so that freeing or moving an object that holds none (nearly all) costs one
/// lookup, not a search.
#[derive(Debug, Default)]
pub(crate) struct Links {
    by_slot: HashMap<u64, Ptr, BuildHasherDefault<OffsetHash>>,
    held: HashMap<Ptr, u32, BuildHasherDefault<OffsetHash>>,
}

impl Links {
    pub fn len(&self) -> usize {
        self.by_slot.len()
    }

    pub fn get(&self, slot: u64) -> Option<Ptr> {
        self.by_slot.get(&slot).copied()
    }

    pub fn insert(&mut self, alloc: &Allocator, slot: u64, p: Ptr) {
        if let Some(old) = self.by_slot.insert(slot, p) {
            debug_assert!(false, "slot {slot} was linked to {old:?}: unlink first");
            return;
        }
        if let Some(h) = alloc.holder_of(slot) {
            *self.held.entry(h).or_default() += 1;
        }
    }

    /// Takes out the link of the slot at `slot`, if it has one.
    pub(super) fn take(&mut self, alloc: &Allocator, slot: u64) -> Option<Ptr> {
        let p = self.by_slot.remove(&slot)?;
        // (A slot's holder never changes: runs keep their class, spans their runs.)
        if let Some(h) = alloc.holder_of(slot) {
            if let Some(n) = self.held.get_mut(&h) {
                *n -= 1;
                if *n == 0 {
                    self.held.remove(&h);
                }
            }
        }
        Some(p)
    }

    /// Takes out the links of slots in `[start, end)`, a range within one object (or the
    /// root slot).
    pub(super) fn take_within(&mut self, alloc: &Allocator, start: u64, end: u64) -> Vec<(u64, Ptr)> {
        if self.by_slot.is_empty() || start >= end {
            return Vec::new();
        }
        let holder = alloc.holder_of(start);
        if holder.is_some_and(|h| !self.held.contains_key(&h)) {
            return Vec::new();
        }
        let first = start.next_multiple_of(8);
        let found: Vec<(u64, Ptr)> = if (end - first) / 8 <= self.by_slot.len() as u64 {
            (first..end).step_by(8).filter_map(|s| self.by_slot.get(&s).map(|&p| (s, p))).collect()
        } else {
            self.by_slot.iter().filter(|(&s, _)| (start..end).contains(&s)).map(|(&s, &p)| (s, p)).collect()
        };
        for &(s, _) in &found {
            self.take(alloc, s);
        }
        found
    }
}

/// A hash of pool offsets (a multiply and a shift): the keys are ours, not an adversary's.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OffsetHash(u64);

impl Hasher for OffsetHash {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}
