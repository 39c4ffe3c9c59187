//! An ordered key-value store in the pool: a B+tree of 4 KiB nodes, each mutation one
//! transaction (or many in a batch). A node changes through its parent's pointer slot, so
//! MinL2R chooses per write: a change of under half the node is data-logged in place, a
//! larger one (a split, a node rewritten) gets a new node and a logged pointer.
//!
//! Values up to [`INLINE_MAX`] bytes live in their leaf; larger ones (up to [`VALUE_MAX`]) in
//! a block of their own that the leaf points to. Deleting leaves a leaf smaller, never merged:
//! an empty leaf stays in the tree until a put lands in it.

use bitmend_code::le::{self, Put, Reader};
use bitmend_media::pmem::Region;

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
/// Bytes a node asks the allocator for (a 4 KiB block).
const NODE: u64 = 4096 - 16;
const LEAF: u8 = 1;
const INNER: u8 = 2;
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

/// A value as a leaf holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Val {
    Inline(Vec<u8>),
    /// In a block of its own: where, and how long.
    Out(Ptr, u32),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Node {
    leaf: bool,
    keys: Vec<Vec<u8>>,
    /// Leaves: one value per key.
    vals: Vec<Val>,
    /// Inner nodes: one child more than keys (child i holds keys below keys[i]).
    kids: Vec<Ptr>,
}

/// Bytes of a node's fixed part (kind, zero, count).
const NODE_HEAD: usize = 4;
/// Where an inner node's child pointers start (8-byte aligned).
const INNER_KIDS: usize = 8;

impl Node {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(NODE as usize);
        v.put_u8(if self.leaf { LEAF } else { INNER });
        v.put_u8(0);
        v.put_u16(self.keys.len() as u16);
        if self.leaf {
            for (k, val) in self.keys.iter().zip(&self.vals) {
                put_entry(&mut v, k, val);
            }
        } else {
            // The child pointers first, 8-byte aligned: each is a slot a write swings whole.
            v.put_u32(0);
            for kid in &self.kids {
                v.put_u64(kid.0);
            }
            for k in &self.keys {
                v.put_u16(k.len() as u16);
                v.put_bytes(k);
            }
        }
        v
    }

    fn decode(b: &[u8]) -> Option<Node> {
        let mut r = Reader::new(b);
        let kind = r.u8()?;
        r.u8()?;
        let n = r.u16()? as usize;
        let mut node = Node { leaf: kind == LEAF, ..Node::default() };
        match kind {
            LEAF => {
                for _ in 0..n {
                    let klen = r.u16()? as usize;
                    let word = r.u32()?;
                    node.keys.push(r.take(klen)?.to_vec());
                    node.vals.push(if word & 1 << 31 == 0 {
                        Val::Inline(r.take(word as usize)?.to_vec())
                    } else {
                        Val::Out(Ptr(r.u64()?), word & !(1 << 31))
                    });
                }
            }
            INNER => {
                r.u32()?;
                for _ in 0..=n {
                    node.kids.push(Ptr(r.u64()?));
                }
                for _ in 0..n {
                    let klen = r.u16()? as usize;
                    node.keys.push(r.take(klen)?.to_vec());
                }
            }
            _ => return None,
        }
        Some(node)
    }

    /// In the encoded inner node `b`: the index of the child whose range holds `key`, and
    /// that child, read in place (descending a tree decodes no inner node: an inner node
    /// holds hundreds of keys, and decoding one into vectors cost more than the rest of an
    /// insert). `None` if `b` is not a whole inner node.
    fn child_for(b: &[u8], key: &[u8]) -> Option<(usize, Ptr)> {
        let mut r = Reader::new(b);
        if r.u8()? != INNER {
            return None;
        }
        r.u8()?;
        let n = r.u16()? as usize;
        let kids = r.take(4 + 8 * (n + 1))?;
        let mut i = 0;
        while i < n {
            let klen = r.u16()? as usize;
            if r.take(klen)? > key {
                break;
            }
            i += 1;
        }
        Some((i, Ptr(le::get_u64(kids, 4 + 8 * i))))
    }

    /// `key` set to `val` in the encoded leaf `b`, spliced in place of decoding it: the new
    /// bytes (unused bytes left off), whether the key is new, and the value it replaced.
    /// `None` if `b` is not a whole leaf.
    fn leaf_with(b: &[u8], key: &[u8], val: &Val) -> Option<(Vec<u8>, bool, Option<Val>)> {
        let mut r = Reader::new(b);
        if r.u8()? != LEAF {
            return None;
        }
        r.u8()?;
        let n = r.u16()? as usize;
        let mut at = NODE_HEAD;
        let (mut pos, mut old) = (None, None);
        for _ in 0..n {
            let start = at;
            let klen = r.u16()? as usize;
            let word = r.u32()?;
            let k = r.take(klen)?;
            let v = if word & 1 << 31 == 0 {
                Val::Inline(r.take(word as usize)?.to_vec())
            } else {
                Val::Out(Ptr(r.u64()?), word & !(1 << 31))
            };
            at = b.len() - r.rest().len();
            if pos.is_none() && k >= key {
                pos = Some((start, if k == key { at } else { start }));
                old = (k == key).then_some(v);
            }
        }
        let (from, to) = pos.unwrap_or((at, at));
        let mut out = Vec::with_capacity(at + 14 + key.len() + val_len(val));
        out.extend_from_slice(&b[..from]);
        put_entry(&mut out, key, val);
        out.extend_from_slice(&b[to..at]);
        let count = n + old.is_none() as usize;
        out[2..4].copy_from_slice(&(count as u16).to_le_bytes());
        Some((out, old.is_none(), old))
    }

    /// Where child `i`'s pointer is in the encoded inner node.
    fn kid_offset(i: usize) -> u64 {
        (INNER_KIDS + 8 * i) as u64
    }
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
    /// Whether its count is sharded (stores of pool format 1's first writers are not).
    sharded: bool,
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
        pool.tx(|tx| {
            let header = tx.alloc(SHARDED_HEADER)?;
            let leaf = tx.alloc(NODE)?;
            tx.write(leaf, 0, &Node { leaf: true, ..Node::default() }.encode())?;
            let mut h = Vec::with_capacity(SHARDED_HEADER as usize);
            h.put_u64(MAGIC);
            h.put_u64(leaf.0);
            h.resize(SHARDED_HEADER as usize, 0);
            tx.write(header, 0, &h)?;
            let root = tx.root_slot();
            tx.set(root, header)?;
            Ok(Kv { header, sharded: true })
        })
    }

    /// The store in `pool`; an error if its root object is not one.
    pub fn open<R: Region>(pool: &Pool<R>) -> Result<Kv, HeapError> {
        let header = pool.root();
        let not = || HeapError::NotAPool { why: "the pool holds no key-value store".into() };
        if header == Ptr::NULL || pool.read(header, 0, 8).map(|b| le::get_u64(b, 0)).ok() != Some(MAGIC) {
            return Err(not());
        }
        Ok(Kv { header, sharded: pool.size_of(header)? >= SHARDED_HEADER })
    }

    fn root<R: Region>(&self, pool: &Pool<R>) -> Result<Ptr, HeapError> {
        Ok(Ptr(le::get_u64(pool.read(self.header, HEADER_ROOT, 8)?, 0)))
    }

    /// Entries in the store.
    pub fn len<R: Region>(&self, pool: &Pool<R>) -> Result<u64, HeapError> {
        let mut n = le::get_u64(pool.read(self.header, HEADER_COUNT, 8)?, 0);
        if self.sharded {
            let shards = pool.read(self.header, 64, SHARDS * 64)?;
            n = (0..SHARDS as usize).fold(n, |n, i| n.wrapping_add(le::get_u64(shards, 64 * i)));
        }
        Ok(n)
    }

    pub fn is_empty<R: Region>(&self, pool: &Pool<R>) -> Result<bool, HeapError> {
        Ok(self.len(pool)? == 0)
    }

    fn node<R: Region>(pool: &Pool<R>, p: Ptr) -> Result<Node, HeapError> {
        Node::decode(pool.read(p, 0, NODE)?).ok_or(not_a_node(p))
    }

    /// The node at `p`, read inside transaction `tx` (its writes included).
    fn node_in<R: Region>(tx: &Tx<R>, p: Ptr) -> Result<Node, HeapError> {
        Node::decode(tx.read(p, 0, NODE)?).ok_or(not_a_node(p))
    }

    /// The value of `key`.
    pub fn get<R: Region>(&self, pool: &Pool<R>, key: &[u8]) -> Result<Option<Vec<u8>>, HeapError> {
        let mut p = self.root(pool)?;
        loop {
            let b = pool.read(p, 0, NODE)?;
            if b[0] == INNER {
                p = Node::child_for(b, key).ok_or(not_a_node(p))?.1;
                continue;
            }
            let n = Kv::node(pool, p)?;
            return match n.keys.binary_search_by(|k| k.as_slice().cmp(key)) {
                Ok(i) => Ok(Some(Kv::value(pool, &n.vals[i])?)),
                Err(_) => Ok(None),
            };
        }
    }

    fn value<R: Region>(pool: &Pool<R>, v: &Val) -> Result<Vec<u8>, HeapError> {
        Ok(match v {
            Val::Inline(b) => b.clone(),
            Val::Out(p, len) => pool.read(*p, 0, *len as u64)?.to_vec(),
        })
    }

    /// Sets `key` to `value`, one transaction.
    pub fn put<R: Region>(&self, pool: &mut Pool<R>, key: &[u8], value: &[u8]) -> Result<(), HeapError> {
        pool.tx(|tx| self.put_in(tx, key, value))
    }

    /// Removes `key`, one transaction; whether it was there.
    pub fn delete<R: Region>(&self, pool: &mut Pool<R>, key: &[u8]) -> Result<bool, HeapError> {
        pool.tx(|tx| self.delete_in(tx, key))
    }

    /// Many puts and deletes, all in one transaction.
    pub fn batch<R: Region, T>(
        &self,
        pool: &mut Pool<R>,
        f: impl FnOnce(&Kv, &mut Tx<R>) -> Result<T, HeapError>,
    ) -> Result<T, HeapError> {
        pool.tx(|tx| f(self, tx))
    }

    /// The path from the root to the leaf for `key`: each inner node's slot and place,
    /// and the leaf's.
    fn descend<R: Region>(&self, tx: &Tx<R>, key: &[u8]) -> Result<(Vec<(Slot, Ptr)>, Leaf), HeapError> {
        let mut slot = tx.slot(self.header, HEADER_ROOT)?;
        let mut path = Vec::new();
        loop {
            let p = tx.get(slot);
            let b = tx.read(p, 0, NODE)?;
            let corrupt = not_a_node(p);
            if b[0] == LEAF {
                return Ok((path, (slot, p)));
            }
            let (i, _) = Node::child_for(b, key).ok_or(corrupt)?;
            let next = tx.slot(p, Node::kid_offset(i))?;
            path.push((slot, p));
            slot = next;
        }
    }

    /// `put` inside transaction `tx`.
    pub fn put_in<R: Region>(&self, tx: &mut Tx<R>, key: &[u8], value: &[u8]) -> Result<(), HeapError> {
        if key.len() > KEY_MAX || value.len() > VALUE_MAX {
            return Err(HeapError::TooLarge {
                len: key.len().max(value.len()) as u64,
                max: VALUE_MAX as u64,
            });
        }
        let (path, (slot, p)) = self.descend(tx, key)?;
        let val = if value.len() <= INLINE_MAX {
            Val::Inline(value.to_vec())
        } else {
            let b = tx.alloc(value.len() as u64)?;
            tx.write(b, 0, value)?;
            Val::Out(b, value.len() as u32)
        };
        // The common case: the entry spliced into the encoded leaf, which still fits.
        let corrupt = not_a_node(p);
        let (bytes, added, old) = Node::leaf_with(tx.read(p, 0, NODE)?, key, &val).ok_or(corrupt)?;
        if bytes.len() as u64 <= NODE {
            if let Some(Val::Out(old, _)) = old {
                tx.free(old)?;
            }
            if added {
                self.add_count(tx, key, 1)?;
            }
            return rewrite(tx, slot, p, &bytes);
        }
        let mut leaf = Kv::node_in(tx, p)?;
        match leaf.keys.binary_search_by(|k| k.as_slice().cmp(key)) {
            Ok(i) => {
                if let Val::Out(old, _) = leaf.vals[i] {
                    tx.free(old)?;
                }
                leaf.vals[i] = val;
            }
            Err(i) => {
                leaf.keys.insert(i, key.to_vec());
                leaf.vals.insert(i, val);
                self.add_count(tx, key, 1)?;
            }
        }
        self.store(tx, path, slot, p, leaf)
    }

    /// Writes `node` back through `slot`, splitting it (and its parents) when it no longer
    /// fits.
    fn store<R: Region>(
        &self,
        tx: &mut Tx<R>,
        mut path: Vec<(Slot, Ptr)>,
        slot: Slot,
        p: Ptr,
        node: Node,
    ) -> Result<(), HeapError> {
        let bytes = node.encode();
        if bytes.len() as u64 <= NODE {
            return rewrite(tx, slot, p, &bytes);
        }
        let (left, sep, right) = split(node);
        let right_at = tx.alloc(NODE)?;
        tx.write(right_at, 0, &right.encode())?;
        rewrite(tx, slot, p, &left.encode())?;
        match path.pop() {
            Some((pslot, pp)) => {
                // Read again: rewriting the child may have swung its pointer in this node.
                let mut parent = Kv::node_in(tx, pp)?;
                let i = parent.keys.partition_point(|k| *k <= sep);
                parent.keys.insert(i, sep);
                parent.kids.insert(i + 1, right_at);
                self.store(tx, path, pslot, pp, parent)
            }
            None => {
                // The root split: a new root over the two halves.
                let left_at = tx.get(slot);
                let root = Node { leaf: false, keys: vec![sep], vals: vec![], kids: vec![left_at, right_at] };
                let at = tx.alloc(NODE)?;
                tx.write(at, 0, &root.encode())?;
                tx.set(slot, at)
            }
        }
    }

    /// Counts `key` in or out (`by` 1 or -1), in its shard.
    fn add_count<R: Region>(&self, tx: &mut Tx<R>, key: &[u8], by: i64) -> Result<(), HeapError> {
        let at = match self.sharded {
            true => 64 + 64 * (bitmend_code::crc::crc32c(key) as u64 % SHARDS),
            false => HEADER_COUNT,
        };
        let n = le::get_u64(tx.read(self.header, at, 8)?, 0);
        tx.write(self.header, at, &n.wrapping_add_signed(by).to_le_bytes())
    }

    /// `delete` inside transaction `tx`.
    pub fn delete_in<R: Region>(&self, tx: &mut Tx<R>, key: &[u8]) -> Result<bool, HeapError> {
        let (_, (slot, p)) = self.descend(tx, key)?;
        let mut leaf = Kv::node_in(tx, p)?;
        let Ok(i) = leaf.keys.binary_search_by(|k| k.as_slice().cmp(key)) else { return Ok(false) };
        leaf.keys.remove(i);
        if let Val::Out(old, _) = leaf.vals.remove(i) {
            tx.free(old)?;
        }
        self.add_count(tx, key, -1)?;
        rewrite(tx, slot, p, &leaf.encode())?;
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
        if st.entries != self.len(pool)? {
            return Err(HeapError::Corrupt { at: self.header.0, what: "the entry count" });
        }
        Ok(st)
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

/// Splits an over-full node in two halves of about equal bytes; returns (left, separator,
/// right): the right half's first key (leaves) or the key moved up (inner nodes).
fn split(n: Node) -> (Node, Vec<u8>, Node) {
    let total = n.encode().len();
    let mut acc = NODE_HEAD;
    let mut at = 0;
    for (i, k) in n.keys.iter().enumerate() {
        acc += k.len() + if n.leaf { 6 + val_len(&n.vals[i]) } else { 10 };
        if acc * 2 >= total {
            at = i.max(1);
            break;
        }
    }
    let at = at.clamp(1, n.keys.len() - 1);
    if n.leaf {
        let (lk, rk) = (n.keys[..at].to_vec(), n.keys[at..].to_vec());
        let (lv, rv) = (n.vals[..at].to_vec(), n.vals[at..].to_vec());
        let sep = rk[0].clone();
        (
            Node { leaf: true, keys: lk, vals: lv, kids: vec![] },
            sep,
            Node { leaf: true, keys: rk, vals: rv, kids: vec![] },
        )
    } else {
        let sep = n.keys[at].clone();
        let left =
            Node { leaf: false, keys: n.keys[..at].to_vec(), vals: vec![], kids: n.kids[..=at].to_vec() };
        let right = Node {
            leaf: false,
            keys: n.keys[at + 1..].to_vec(),
            vals: vec![],
            kids: n.kids[at + 1..].to_vec(),
        };
        (left, sep, right)
    }
}

/// A leaf entry: key length, value length (bit 31: out of line), key, value or its block.
fn put_entry(v: &mut Vec<u8>, k: &[u8], val: &Val) {
    v.put_u16(k.len() as u16);
    match val {
        Val::Inline(b) => {
            v.put_u32(b.len() as u32);
            v.put_bytes(k);
            v.put_bytes(b);
        }
        Val::Out(p, len) => {
            v.put_u32(*len | 1 << 31);
            v.put_bytes(k);
            v.put_u64(p.0);
        }
    }
}

fn val_len(v: &Val) -> usize {
    match v {
        Val::Inline(b) => b.len(),
        Val::Out(..) => 8,
    }
}

/// Writes the bytes of the node at `p` (through `slot`) that differ from `new`: MinL2R picks
/// data or pointer logging by how much of the node that is.
fn rewrite<R: Region>(tx: &mut Tx<R>, slot: Slot, p: Ptr, new: &[u8]) -> Result<(), HeapError> {
    let old = tx.read(p, 0, NODE)?;
    // The node's new bytes are `new`, then zeros to its end.
    let Some(first) = first_difference(old, new) else { return Ok(()) };
    let last = last_difference(old, new).expect("a difference");
    let mut changed = new.get(first..new.len().min(last + 1)).unwrap_or_default().to_vec();
    changed.resize(last + 1 - first, 0);
    tx.write_through(slot, first as u64, &changed)?;
    Ok(())
}

/// The last byte where `old` differs from `new` followed by zeros, found from the end.
fn last_difference(old: &[u8], new: &[u8]) -> Option<usize> {
    let mut end = old.len();
    while end > new.len() && end - new.len() >= 64 && old[end - 64..end] == [0u8; 64] {
        end -= 64;
    }
    if let Some(d) = (new.len().min(end)..end).rev().find(|&k| old[k] != 0) {
        return Some(d);
    }
    let mut end = new.len().min(old.len());
    while end >= 64 && old[end - 64..end] == new[end - 64..end] {
        end -= 64;
    }
    (0..end).rev().find(|&k| old[k] != new[k])
}

/// The first byte where `old` differs from `new` followed by zeros; `None` if it does not.
/// Compared 64 bytes at a time: a byte loop over 4 KiB nodes showed in profiles.
fn first_difference(old: &[u8], new: &[u8]) -> Option<usize> {
    let n = new.len().min(old.len());
    let mut i = 0;
    while i + 64 <= n && old[i..i + 64] == new[i..i + 64] {
        i += 64;
    }
    if let Some(d) = (i..n).find(|&j| old[j] != new[j]) {
        return Some(d);
    }
    let mut j = n;
    while j + 64 <= old.len() && old[j..j + 64] == [0u8; 64] {
        j += 64;
    }
    (j..old.len()).find(|&k| old[k] != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunked searches against a byte loop, on nodes that differ in one run of bytes
    /// anywhere (or nowhere), with the new bytes shorter or longer than the old ones' end.
    #[test]
    fn differences_are_found_as_a_byte_loop_finds_them() {
        let mut rng = bitmend_media::rng::Rng::new(5);
        for _ in 0..2000 {
            let mut old = vec![0u8; 4080];
            let used = rng.below(4081) as usize;
            rng.fill(&mut old[..used]);
            let mut new = old[..rng.below(4081) as usize].to_vec();
            if rng.below(4) > 0 && !new.is_empty() {
                let a = rng.below(new.len() as u64) as usize;
                let b = a + rng.below((new.len() - a) as u64 + 1) as usize;
                rng.fill(&mut new[a..b]);
            }
            let at = |i: usize| new.get(i).copied().unwrap_or(0);
            let want_first = (0..old.len()).find(|&i| old[i] != at(i));
            let want_last = (0..old.len()).rev().find(|&i| old[i] != at(i));
            assert_eq!(first_difference(&old, &new), want_first);
            assert_eq!(last_difference(&old, &new), want_last);
        }
    }

    #[test]
    fn a_spliced_leaf_decodes_as_the_leaf_with_the_entry_set() {
        let keys: Vec<Vec<u8>> = (0..20u8).map(|i| vec![b'k', i * 2]).collect();
        let leaf = Node {
            leaf: true,
            vals: keys.iter().map(|k| Val::Inline(k.repeat(3))).collect(),
            keys,
            kids: vec![],
        };
        let bytes = leaf.encode();
        for (key, val) in [
            (vec![b'k', 7], Val::Inline(b"new".to_vec())),
            (vec![b'k', 8], Val::Out(Ptr(4096), 9000)),
            (vec![b'a'], Val::Inline(vec![])),
            (vec![b'z'], Val::Inline(vec![1; 40])),
        ] {
            let (spliced, added, old) = Node::leaf_with(&bytes, &key, &val).unwrap();
            let mut want = leaf.clone();
            match want.keys.binary_search(&key) {
                Ok(i) => {
                    assert_eq!(old, Some(want.vals[i].clone()));
                    want.vals[i] = val;
                }
                Err(i) => {
                    assert!(added && old.is_none());
                    want.keys.insert(i, key);
                    want.vals.insert(i, val);
                }
            }
            assert_eq!(Node::decode(&spliced), Some(want.clone()));
            assert_eq!(spliced, want.encode());
        }
    }
}
