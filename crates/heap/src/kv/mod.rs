//! An ordered key-value store in the pool: a B+tree of 8 KiB slotted nodes ([`node`]), each
//! mutation one transaction (or many in a batch). A put or a delete that fits in its node's
//! gap writes the entry there without undo and data-logs the node's header and index; a node
//! that must be compacted or split is written whole to a new block, through its parent's
//! pointer slot (MinL2R's pointer logging).
//!
//! Values up to [`INLINE_MAX`] bytes live in their leaf; larger ones (up to [`VALUE_MAX`]) in
//! a block of their own that the leaf points to. A delete that leaves a node less than half
//! full merges it with a neighbour when the two fit in one ([`merge`]).

mod entries;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod merge;
mod node;

use bitmend_code::le::{self, Put};
use bitmend_media::pmem::Region;

use entries::Entries;
use node::{
    child_for, inline_entry, inner_entry, leaf_entry, written_parts, IndexChange, Node, Slotted, Val, NODE,
};

use crate::alloc::Ptr;
use crate::pool::Pool;
use crate::tx::{Slot, Tx};
use crate::HeapError;

/// Longest key.
pub const KEY_MAX: usize = 1024;
/// Longest value.
pub const VALUE_MAX: usize = 1 << 20;
/// Longest value kept in its leaf.
pub const INLINE_MAX: usize = 512;
/// The store's header object: magic, then the root node's slot, then the entry count.
const MAGIC: u64 = 0x564B_444E_454D_5442; // "BTMENDKV"
const HEADER_ROOT: u64 = 8;
const HEADER_COUNT: u64 = 16;
/// A store made by this build counts its entries in 64 shards, each in a line of its own
/// after the header's first line (a key counts in the shard its CRC picks), so that no line
/// is written by every insert: one count written each time was the hottest line of the pool.
const SHARDS: u64 = 64;
/// The header object of a sharded store.
const SHARDED_HEADER: u64 = 64 + SHARDS * 64;
/// The header object of a store that keeps no count (magic and root): its entries are the
/// sum of its leaves' counts. Stores made in version 4 pools are such: a count written by
/// every put and delete cost an eighth of an insert (the count's line, flushed, is a miss the
/// next time), and `len` is rare.
const UNCOUNTED_HEADER: u64 = 16;

/// How a store counts its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Count {
    /// One field (the golden version 1 pool's store).
    One,
    /// 64 shards after the header's first line (stores of pool versions 2 and 3).
    Sharded,
    /// Not kept: the leaves' counts are summed.
    Leaves,
}

/// The error for bytes at `p` that do not read as a tree node.
fn not_a_node(p: Ptr) -> HeapError {
    HeapError::Corrupt { at: p.0, what: "a tree node" }
}

/// A leaf on a path: the slot that points to it, and where it is.
type Leaf = (Slot, Ptr);

/// The store, found from the pool's root slot.
#[derive(Clone, Copy, Debug)]
pub struct Kv {
    header: Ptr,
    count: Count,
}

/// What [`Kv::damaged`] found on damaged bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvDamage {
    /// Keys whose leaf or value is on them, in order.
    pub keys: Vec<Vec<u8>>,
    /// Nodes on them.
    pub nodes: Vec<Ptr>,
}

/// Counts of a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    pub entries: u64,
    pub nodes: u64,
    pub depth: u32,
    pub value_blocks: u64,
}

impl Kv {
    /// Makes an empty store in `pool` (its root object).
    pub fn create<R: Region>(pool: &mut Pool<R>) -> Result<Kv, HeapError> {
        // A version 3 pool may be opened by an older build, which reads a sharded count.
        let (count, len) = match pool.version() {
            ..=3 => (Count::Sharded, SHARDED_HEADER),
            _ => (Count::Leaves, UNCOUNTED_HEADER),
        };
        pool.tx(|tx| {
            let header = tx.alloc(len)?;
            let leaf = tx.alloc(NODE)?;
            // A version 4 pool's store has appended leaves (the splits of this one are too).
            let mut empty = Entries::from_node(&Node { leaf: true, ..Node::default() });
            empty.appended = count == Count::Leaves;
            tx.write(leaf, 0, &empty.encode())?;
            let mut h = Vec::with_capacity(len as usize);
            h.put_u64(MAGIC);
            h.put_u64(leaf.0);
            h.resize(len as usize, 0);
            tx.write(header, 0, &h)?;
            let root = tx.root_slot();
            tx.set(root, header)?;
            Ok(Kv { header, count })
        })
    }

    /// The store in `pool`; an error if its root object is not one.
    pub fn open<R: Region>(pool: &Pool<R>) -> Result<Kv, HeapError> {
        let header = pool.root();
        let not = || HeapError::NotAPool { why: "the pool holds no key-value store".into() };
        if header == Ptr::NULL || pool.read(header, 0, 8).map(|b| le::get_u64(b, 0)).ok() != Some(MAGIC) {
            return Err(not());
        }
        let count = match pool.size_of(header)? {
            SHARDED_HEADER.. => Count::Sharded,
            UNCOUNTED_HEADER => Count::Leaves,
            _ => Count::One,
        };
        Ok(Kv { header, count })
    }

    fn root<R: Region>(&self, pool: &Pool<R>) -> Result<Ptr, HeapError> {
        Ok(Ptr(le::get_u64(pool.read(self.header, HEADER_ROOT, 8)?, 0)))
    }

    /// Entries in the store.
    pub fn len<R: Region>(&self, pool: &Pool<R>) -> Result<u64, HeapError> {
        if self.count == Count::Leaves {
            return self.leaf_counts(pool, self.root(pool)?);
        }
        let mut n = le::get_u64(pool.read(self.header, HEADER_COUNT, 8)?, 0);
        if self.count == Count::Sharded {
            let shards = pool.read(self.header, 64, SHARDS * 64)?;
            n = (0..SHARDS as usize).fold(n, |n, i| n.wrapping_add(le::get_u64(shards, 64 * i)));
        }
        Ok(n)
    }

    /// The sum of the counts of the leaves under the node at `p`.
    fn leaf_counts<R: Region>(&self, pool: &Pool<R>, p: Ptr) -> Result<u64, HeapError> {
        let b = pool.object(p)?;
        match Slotted::parse(b) {
            Some(s) if s.leaf => Ok(s.n as u64),
            Some(s) => (0..=s.n).try_fold(0, |sum, i| {
                let (_, kid) = s.kid(i).ok_or(not_a_node(p))?;
                Ok(sum + self.leaf_counts(pool, kid)?)
            }),
            // A packed node (pool versions 1 and 2, whose stores keep a count): decoded.
            None => {
                let n = Kv::node(pool, p)?;
                match n.leaf {
                    true => Ok(n.keys.len() as u64),
                    false => n.kids.iter().try_fold(0, |sum, &kid| Ok(sum + self.leaf_counts(pool, kid)?)),
                }
            }
        }
    }

    pub fn is_empty<R: Region>(&self, pool: &Pool<R>) -> Result<bool, HeapError> {
        Ok(self.len(pool)? == 0)
    }

    fn node<R: Region>(pool: &Pool<R>, p: Ptr) -> Result<Node, HeapError> {
        Node::decode(pool.object(p)?).ok_or(not_a_node(p))
    }

    /// The value of `key`.
    pub fn get<R: Region>(&self, pool: &Pool<R>, key: &[u8]) -> Result<Option<Vec<u8>>, HeapError> {
        let mut p = self.root(pool)?;
        let mut parts: Vec<(usize, usize)> = Vec::with_capacity(16);
        loop {
            // A slotted node's bytes are checked where the search read them (the header and
            // index, the keys it compared, the entry or child pointer it took), before
            // anything it found is used: a few lines, not the node's pages.
            let b = pool.object_unchecked(p)?;
            // Bytes that do not read as a node: damage, if the node's lines say so.
            let bad = || pool.check_read(p.0, b.len() as u64).err().unwrap_or(not_a_node(p));
            if let Some(s) = Slotted::parse(b) {
                parts.clear();
                parts.push((0, s.index_end()));
                if !s.leaf {
                    let (_, kid) = s.kid_seen(key, &mut |at, len| parts.push((at, len))).ok_or_else(bad)?;
                    pool.check_parts(p, &parts)?;
                    p = kid;
                    continue;
                }
                let found = s.search_seen(key, &mut |at, len| parts.push((at, len))).ok_or_else(bad)?;
                let Ok(i) = found else {
                    pool.check_parts(p, &parts)?;
                    return Ok(None);
                };
                parts.push(s.span(i).ok_or_else(bad)?);
                pool.check_parts(p, &parts)?;
                return Ok(Some(Kv::value(pool, &s.leaf_entry(i).ok_or_else(bad)?.1)?));
            }
            let b = pool.object(p)?;
            if let Some((_, kid)) = child_for(b, key) {
                p = kid;
                continue;
            }
            // A packed leaf (pool versions 1 and 2), or damage.
            let n = Kv::node(pool, p)?;
            if !n.leaf {
                return Err(not_a_node(p));
            }
            return match n.keys.binary_search_by(|k| k.as_slice().cmp(key)) {
                Ok(i) => Ok(Some(Kv::value(pool, &n.vals[i])?)),
                Err(_) => Ok(None),
            };
        }
    }

    /// [`Kv::get`], rebuilding what a read check refuses: a damaged page is rebuilt from its
    /// stripe ([`Pool::verify`]) and the read taken again; beyond repair, the error names
    /// the pages.
    pub fn get_healing<R: Region>(
        &self,
        pool: &mut Pool<R>,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, HeapError> {
        // Each round rebuilds at least one page or fails: a read crosses a few pages.
        for _ in 0..8 {
            match self.get(pool, key) {
                Err(HeapError::Damaged { at, len, .. }) => pool.verify(at, len)?,
                r => return r,
            }
        }
        self.get(pool, key)
    }

    fn value<R: Region>(pool: &Pool<R>, v: &Val) -> Result<Vec<u8>, HeapError> {
        Ok(match v {
            Val::Inline(b) => b.clone(),
            Val::Out(p, len) => pool.read(*p, 0, *len as u64)?.to_vec(),
        })
    }

    /// Sets `key` to `value`, one transaction (healing what it reads: [`Pool::tx_healing`]).
    pub fn put<R: Region>(&self, pool: &mut Pool<R>, key: &[u8], value: &[u8]) -> Result<(), HeapError> {
        pool.tx_healing(|tx| self.put_in(tx, key, value))
    }

    /// Removes `key`, one transaction; whether it was there.
    pub fn delete<R: Region>(&self, pool: &mut Pool<R>, key: &[u8]) -> Result<bool, HeapError> {
        pool.tx_healing(|tx| self.delete_in(tx, key))
    }

    /// Many puts and deletes, all in one transaction (run again after a rebuild when what it
    /// read was damaged: `f` may be called more than once, each time from the start).
    pub fn batch<R: Region, T>(
        &self,
        pool: &mut Pool<R>,
        mut f: impl FnMut(&Kv, &mut Tx<R>) -> Result<T, HeapError>,
    ) -> Result<T, HeapError> {
        pool.tx_healing(|tx| f(self, tx))
    }

    /// The path from the root to the leaf for `key`: each inner node's slot and place,
    /// and the leaf's.
    fn descend<R: Region>(&self, tx: &Tx<R>, key: &[u8]) -> Result<(Vec<(Slot, Ptr)>, Leaf), HeapError> {
        let mut path = Vec::new();
        let leaf = self.leaf_for(tx, key, |step| path.push(step))?;
        Ok((path, leaf))
    }

    /// The leaf for `key`, each inner node on the way handed to `step` with its slot.
    fn leaf_for<R: Region>(
        &self,
        tx: &Tx<R>,
        key: &[u8],
        mut step: impl FnMut((Slot, Ptr)),
    ) -> Result<Leaf, HeapError> {
        let mut slot = tx.slot(self.header, HEADER_ROOT)?;
        let mut parts: Vec<(usize, usize)> = Vec::with_capacity(16);
        loop {
            let p = tx.get_checked(slot)?;
            // A slotted inner node: the lines its search read are checked, as a get's are. A
            // slotted leaf is not checked here: each caller checks what it reads of it (its
            // header among them, so a kind byte damaged into "leaf" is caught there). Checking
            // it whole here cost a third of a healing insert.
            let at = match Slotted::parse(tx.object_unchecked(p)?) {
                Some(s) if s.leaf => return Ok((slot, p)),
                Some(s) => {
                    let bad = || tx.object(p).err().unwrap_or(not_a_node(p));
                    parts.clear();
                    parts.push((0, s.index_end()));
                    let (at, _) = s.kid_seen(key, &mut |at, len| parts.push((at, len))).ok_or_else(bad)?;
                    tx.check_parts(p, &parts)?;
                    at
                }
                None => match child_for(tx.object(p)?, key) {
                    Some((at, _)) => at,
                    None => return Ok((slot, p)),
                },
            };
            let next = tx.slot(p, at as u64)?;
            step((slot, p));
            slot = next;
        }
    }

    /// `put` inside transaction `tx`.
    pub fn put_in<R: Region>(&self, tx: &mut Tx<R>, key: &[u8], value: &[u8]) -> Result<(), HeapError> {
        if key.len() > KEY_MAX {
            return Err(HeapError::KeyTooLong { len: key.len() as u64, max: KEY_MAX as u64 });
        }
        if value.len() > VALUE_MAX {
            return Err(HeapError::TooLarge { len: value.len() as u64, max: VALUE_MAX as u64 });
        }
        // The path is kept only when the leaf must be repacked (one put in dozens).
        let (_, p) = self.leaf_for(tx, key, |_| {})?;
        let entry = if value.len() <= INLINE_MAX {
            inline_entry(key, value)
        } else {
            let b = tx.alloc(value.len() as u64)?;
            tx.write(b, 0, value)?;
            leaf_entry(key, &Val::Out(b, value.len() as u32))
        };
        // The common case: the entry fits in the leaf's gap. What the search read (the
        // header and index, the keys it compared, the entry it replaces) is checked before
        // anything is written from it.
        if let Some(s) = Slotted::parse(tx.object_unchecked(p)?).filter(|s| s.leaf) {
            let corrupt = || tx.object(p).err().unwrap_or(not_a_node(p));
            let mut parts = vec![(0, s.index_end())];
            let found = s.search_seen(key, &mut |at, len| parts.push((at, len))).ok_or_else(corrupt)?;
            if let Ok(i) = found {
                parts.push(s.span(i).ok_or_else(corrupt)?);
            }
            tx.check_parts(p, &parts)?;
            // The entry it replaces: its length, and its value's block.
            let old = match found {
                Ok(i) => Some((s.span(i).ok_or_else(corrupt)?.1, s.value_block(i).ok_or_else(corrupt)?)),
                Err(_) => None,
            };
            let i = found.unwrap_or_else(|i| i);
            if let Some(splice) = s.splice(i, key, entry.len(), old.map(|o| o.0)) {
                tx.write_unused(p, splice.entry_at, &entry)?;
                let by = if old.is_none() { 1 } else { 0 };
                self.change_index(tx, p, &splice.index, Some((key, by)))?;
                if let Some((_, Some(b))) = old {
                    tx.free(b)?;
                }
                return Ok(());
            }
        }
        let (path, leaf) = self.descend(tx, key)?;
        self.put_repacked(tx, (path, leaf), key, &entry)
    }

    /// A put into a leaf whose gap is too small, or a packed leaf: the leaf is written whole
    /// (compacted, or split).
    fn put_repacked<R: Region>(
        &self,
        tx: &mut Tx<R>,
        (path, (slot, p)): (Vec<(Slot, Ptr)>, Leaf),
        key: &[u8],
        entry: &[u8],
    ) -> Result<(), HeapError> {
        let mut leaf = Kv::entries_in(tx, p, true)?;
        let at_end = match leaf.search(key) {
            Ok(i) => {
                if let Val::Out(old, _) = leaf.val(i) {
                    tx.free(old)?;
                }
                leaf.replace(i, entry);
                false
            }
            Err(i) => {
                leaf.insert(i, key, entry);
                self.add_count(tx, key, 1)?;
                i + 1 == leaf.len() && Kv::rightmost(tx, &path, key)?
            }
        };
        self.store(tx, path, slot, leaf, at_end)
    }

    /// Whether `key` lies past every separator on `path`: its leaf is the tree's last.
    fn rightmost<R: Region>(tx: &Tx<R>, path: &[(Slot, Ptr)], key: &[u8]) -> Result<bool, HeapError> {
        for &(_, p) in path {
            match Slotted::parse(tx.object(p)?).filter(|s| !s.leaf) {
                Some(s) if s.n == 0 => {}
                Some(s) if s.key(s.n - 1).ok_or(not_a_node(p))? <= key => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The entries of the node at `p`, read inside `tx`; an error if it is not a node of the
    /// kind `leaf` says.
    fn entries_in<R: Region>(tx: &Tx<R>, p: Ptr, leaf: bool) -> Result<Entries, HeapError> {
        Entries::of(tx.object(p)?).filter(|e| e.leaf == leaf).ok_or(not_a_node(p))
    }

    /// Writes `node` whole through `slot` (to a new block: pointer logging), splitting it,
    /// and its parents, when it no longer fits (`at_end`: its last entry was just added, on
    /// the tree's right edge, and the split leaves the rest together).
    fn store<R: Region>(
        &self,
        tx: &mut Tx<R>,
        mut path: Vec<(Slot, Ptr)>,
        slot: Slot,
        node: Entries,
        at_end: bool,
    ) -> Result<(), HeapError> {
        if node.fits() {
            tx.rewrite(slot, &written_parts(&node.encode()))?;
            return Ok(());
        }
        let (left, sep, right) =
            at_end.then(|| node.split_off_last()).flatten().unwrap_or_else(|| node.split());
        let right_at = tx.alloc(NODE)?;
        let [(a, head), (b, tail)] = written_parts(&right);
        tx.write_several(&[(right_at, a, head), (right_at, b, tail)])?;
        tx.rewrite(slot, &written_parts(&left))?;
        match path.pop() {
            Some((pslot, pp)) => self.insert_child(tx, path, pslot, pp, sep, right_at),
            None => {
                // The root split: a new root over the two halves.
                let left_at = tx.get_checked(slot)?;
                let root = Node { leaf: false, keys: vec![sep], vals: vec![], kids: vec![left_at, right_at] };
                let at = tx.alloc(NODE)?;
                tx.write(at, 0, &root.encode())?;
                tx.set(slot, at)
            }
        }
    }

    /// Adds child `kid`, holding the keys from `sep` on, to the inner node at `p` (through
    /// `slot`, on `path`).
    fn insert_child<R: Region>(
        &self,
        tx: &mut Tx<R>,
        path: Vec<(Slot, Ptr)>,
        slot: Slot,
        p: Ptr,
        sep: Vec<u8>,
        kid: Ptr,
    ) -> Result<(), HeapError> {
        let entry = inner_entry(&sep, kid);
        if let Some(s) = Slotted::parse(tx.object(p)?).filter(|s| !s.leaf) {
            let Err(i) = s.search(&sep).ok_or(not_a_node(p))? else { return Err(not_a_node(p)) };
            if let Some(splice) = s.splice(i, &sep, entry.len(), None) {
                tx.write_unused(p, splice.entry_at, &entry)?;
                return self.change_index(tx, p, &splice.index, None);
            }
        }
        let mut parent = Kv::entries_in(tx, p, false)?;
        let Err(i) = parent.search(&sep) else { return Err(not_a_node(p)) };
        parent.insert(i, &sep, &entry);
        let at_end = i + 1 == parent.len() && Kv::rightmost(tx, &path, &sep)?;
        self.store(tx, path, slot, parent, at_end)
    }

    /// Writes a node's header and index as `change` says, and counts `key` in or out (`by`
    /// 1 or -1; 0 or `None`, neither), the ranges logged together.
    fn change_index<R: Region>(
        &self,
        tx: &mut Tx<R>,
        p: Ptr,
        change: &IndexChange,
        count: Option<(&[u8], i64)>,
    ) -> Result<(), HeapError> {
        let [(h, header), (t, tail)] = change.ranges();
        match count.filter(|c| c.1 != 0 && self.count != Count::Leaves) {
            Some((key, by)) => {
                let (at, n) = self.count_after(tx, key, by)?;
                tx.write_several(&[(p, h, header), (p, t, tail), (self.header, at, &n)])
            }
            None => tx.write_several(&[(p, h, header), (p, t, tail)]),
        }
    }

    /// Where `key`'s count is in the store's header, and its bytes once it changes by `by`.
    fn count_after<R: Region>(&self, tx: &Tx<R>, key: &[u8], by: i64) -> Result<(u64, [u8; 8]), HeapError> {
        let at = match self.count {
            Count::Sharded => 64 + 64 * (bitmend_code::crc::crc32c(key) as u64 % SHARDS),
            _ => HEADER_COUNT,
        };
        let n = le::get_u64(tx.read(self.header, at, 8)?, 0);
        Ok((at, n.wrapping_add_signed(by).to_le_bytes()))
    }

    /// Counts `key` in or out (`by` 1 or -1), in its shard.
    fn add_count<R: Region>(&self, tx: &mut Tx<R>, key: &[u8], by: i64) -> Result<(), HeapError> {
        if self.count == Count::Leaves {
            return Ok(());
        }
        let (at, n) = self.count_after(tx, key, by)?;
        tx.write(self.header, at, &n)
    }

    /// `delete` inside transaction `tx`.
    pub fn delete_in<R: Region>(&self, tx: &mut Tx<R>, key: &[u8]) -> Result<bool, HeapError> {
        let (path, (slot, p)) = self.descend(tx, key)?;
        if let Some(s) = Slotted::parse(tx.object(p)?).filter(|s| s.leaf) {
            let Ok(i) = s.search(key).ok_or(not_a_node(p))? else { return Ok(false) };
            let (_, val, len) = s.leaf_entry(i).ok_or(not_a_node(p))?;
            let change = s.remove(i, len);
            self.change_index(tx, p, &change, Some((key, -1)))?;
            if let Val::Out(old, _) = val {
                tx.free(old)?;
            }
            self.merge_up(tx, path, p, key)?;
            return Ok(true);
        }
        // A packed leaf: written back slotted.
        let mut leaf = Kv::entries_in(tx, p, true)?;
        let Ok(i) = leaf.search(key) else { return Ok(false) };
        if let Val::Out(old, _) = leaf.val(i) {
            tx.free(old)?;
        }
        leaf.remove(i);
        self.add_count(tx, key, -1)?;
        self.store(tx, path, slot, leaf, false)?;
        Ok(true)
    }

    /// Every entry with `from <= key < to` (either bound open), in key order, until `f`
    /// returns false.
    pub fn scan<R: Region>(
        &self,
        pool: &Pool<R>,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        f: &mut dyn FnMut(&[u8], Vec<u8>) -> bool,
    ) -> Result<(), HeapError> {
        let root = self.root(pool)?;
        self.walk(pool, root, from, to, f).map(|_| ())
    }

    fn walk<R: Region>(
        &self,
        pool: &Pool<R>,
        p: Ptr,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        f: &mut dyn FnMut(&[u8], Vec<u8>) -> bool,
    ) -> Result<bool, HeapError> {
        let n = Kv::node(pool, p)?;
        if n.leaf {
            for (k, v) in n.keys.iter().zip(&n.vals) {
                if from.is_some_and(|a| k.as_slice() < a) {
                    continue;
                }
                if to.is_some_and(|b| k.as_slice() >= b) {
                    return Ok(false);
                }
                if !f(k, Kv::value(pool, v)?) {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        let first = from.map_or(0, |a| n.keys.partition_point(|k| k.as_slice() <= a));
        for (i, &kid) in n.kids.iter().enumerate().skip(first) {
            if i > 0 && to.is_some_and(|b| n.keys[i - 1].as_slice() >= b) {
                return Ok(false);
            }
            if !self.walk(pool, kid, from, to, f)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// [`Kv::scan`] that returns only checked bytes and heals what its checks refuse: with
    /// the read strategy `Every` set by the caller, each node and value is checked before
    /// `f` sees it; a damaged page is rebuilt from its stripe and the scan goes on after the
    /// last key handed out (never twice, never one left out). Beyond repair, the error
    /// names the pages, after the entries before them.
    pub fn scan_healing<R: Region>(
        &self,
        pool: &mut Pool<R>,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        f: &mut dyn FnMut(&[u8], Vec<u8>) -> bool,
    ) -> Result<(), HeapError> {
        let mut after: Option<Vec<u8>> = None;
        for _ in 0..32 {
            let mut last: Option<Vec<u8>> = None;
            let start = after.clone().or_else(|| from.map(<[u8]>::to_vec));
            let r = self.scan(pool, start.as_deref(), to, &mut |k, v| {
                if after.as_deref() == Some(k) {
                    return true;
                }
                last = Some(k.to_vec());
                f(k, v)
            });
            match r {
                Err(HeapError::Damaged { at, len, .. }) => {
                    pool.verify(at, len)?;
                    after = last.or(after);
                }
                r => return r,
            }
        }
        Err(HeapError::Corrupt { at: self.header.0, what: "a scan that kept meeting damage" })
    }

    /// Every entry whose key starts with `prefix`.
    pub fn scan_prefix<R: Region>(
        &self,
        pool: &Pool<R>,
        prefix: &[u8],
        f: &mut dyn FnMut(&[u8], Vec<u8>) -> bool,
    ) -> Result<(), HeapError> {
        self.scan(pool, Some(prefix), None, &mut |k, v| k.starts_with(prefix) && f(k, v))
    }

    /// Checks every tree invariant (keys ordered within and between nodes, one depth for
    /// every leaf, every pointer an allocated block) and counts.
    pub fn check<R: Region>(&self, pool: &Pool<R>) -> Result<KvStats, HeapError> {
        let mut st = KvStats::default();
        let root = self.root(pool)?;
        let mut leaf_depth = None;
        self.check_node(pool, root, None, None, 1, &mut leaf_depth, &mut st)?;
        st.depth = leaf_depth.unwrap_or(0);
        // A store that keeps no count has nothing to compare: its length is this walk's.
        if self.count != Count::Leaves && st.entries != self.len(pool)? {
            return Err(HeapError::Corrupt { at: self.header.0, what: "the entry count" });
        }
        Ok(st)
    }

    /// What lies on damaged bytes (`ranges`, offset and length each: the pages a check found
    /// bad): the keys whose leaf or value block overlaps them, and the nodes that do (a
    /// damaged node's keys may not read; an inner one's subtree may be cut off).
    pub fn damaged<R: Region>(&self, pool: &Pool<R>, ranges: &[(u64, u64)]) -> Result<KvDamage, HeapError> {
        let overlaps = |at: u64, len: u64| ranges.iter().any(|&(a, n)| at < a + n && a < at + len.max(1));
        let hit = |p: Ptr| overlaps(p.0, pool.size_of(p).unwrap_or(0));
        let mut found = KvDamage::default();
        let mut stack = vec![self.root(pool)?];
        while let Some(p) = stack.pop() {
            let on_damage = hit(p);
            if on_damage {
                found.nodes.push(p);
            }
            let Ok(b) = pool.object(p) else { continue };
            let Some(n) = Node::decode(b) else { continue };
            if !n.leaf {
                stack.extend(n.kids.iter().copied());
                continue;
            }
            // A slotted leaf whose header and index are sound names only the entries on the
            // damage; any other leaf on it, all its keys.
            let index_end = written_parts(b)[0].1.len() as u64;
            match Slotted::parse(b).filter(|_| on_damage && !overlaps(p.0, index_end)) {
                Some(s) => {
                    for i in 0..s.n {
                        let (Some(key), Some((at, len)), Some(block)) =
                            (s.key(i), s.span(i), s.value_block(i))
                        else {
                            continue;
                        };
                        if overlaps(p.0 + at as u64, len as u64) || block.is_some_and(hit) {
                            found.keys.push(key.to_vec());
                        }
                    }
                }
                None => {
                    for (k, v) in n.keys.iter().zip(&n.vals) {
                        if on_damage || matches!(v, Val::Out(b, _) if hit(*b)) {
                            found.keys.push(k.clone());
                        }
                    }
                }
            }
        }
        found.keys.sort_unstable();
        Ok(found)
    }

    #[allow(clippy::too_many_arguments)]
    fn check_node<R: Region>(
        &self,
        pool: &Pool<R>,
        p: Ptr,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        depth: u32,
        leaf_depth: &mut Option<u32>,
        st: &mut KvStats,
    ) -> Result<(), HeapError> {
        let bad = |what| HeapError::Corrupt { at: p.0, what };
        let n = Kv::node(pool, p)?;
        st.nodes += 1;
        if n.keys.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad("keys out of order in a node"));
        }
        if n.keys.first().is_some_and(|k| low.is_some_and(|l| k.as_slice() < l))
            || n.keys.last().is_some_and(|k| high.is_some_and(|h| k.as_slice() >= h))
        {
            return Err(bad("a key outside its parent's range"));
        }
        if n.leaf {
            if *leaf_depth.get_or_insert(depth) != depth {
                return Err(bad("leaves at different depths"));
            }
            st.entries += n.keys.len() as u64;
            for v in &n.vals {
                if let Val::Out(b, len) = v {
                    if pool.size_of(*b).is_ok_and(|cap| cap < *len as u64) || pool.size_of(*b).is_err() {
                        return Err(bad("a value pointer to no allocated block"));
                    }
                    st.value_blocks += 1;
                }
            }
            return Ok(());
        }
        for (i, &kid) in n.kids.iter().enumerate() {
            let lo = if i == 0 { low } else { Some(n.keys[i - 1].as_slice()) };
            let hi = if i == n.keys.len() { high } else { Some(n.keys[i].as_slice()) };
            self.check_node(pool, kid, lo, hi, depth + 1, leaf_depth, st)?;
        }
        Ok(())
    }
}
