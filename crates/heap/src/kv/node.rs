//! The store's nodes as bytes (FORMAT.md section 9). A node is slotted: after an 8-byte
//! header, an index in key order grows up (each entry's offset and its key's first 4 bytes,
//! so that a search reads the index's few lines and not a line per entry it probes), and the
//! entries grow down from the node's end. A put writes its entry into the gap between the two, where no
//! committed state has bytes, so it needs no undo; only the header and the index are
//! data-logged, a few dozen bytes. (A packed node, with its entries in key order, shifted half
//! its bytes on an insert, and that copy cost more than the rest of the insert.)
//!
//! The packed nodes of pool versions 1 and 2 (kinds 1 and 2) are read, and written back
//! slotted when they change.

use std::cmp::Ordering;

use bitmend_code::le::{self, Put, Reader};

use crate::alloc::Ptr;

/// Bytes of the nodes this build makes (an 8 KiB block). A node is the whole object it is
/// in: the 4080-byte nodes of older pools read as they are.
pub(super) const NODE: u64 = 8192 - 16;
/// The longest node a 16-bit offset reaches into.
const MAX_NODE: usize = u16::MAX as usize;
const PACKED_LEAF: u8 = 1;
const PACKED_INNER: u8 = 2;
pub(super) const LEAF: u8 = 3;
pub(super) const INNER: u8 = 4;
/// A leaf whose index is in the order its entries were put, not in key order (stores of
/// version 4 pools): a put appends its slot, so it logs the header and that one slot, not
/// the index from the new key's place on; a search reads the index through.
pub(super) const LEAF_APPENDED: u8 = 5;
/// A slotted node's header: u8 kind, u8 zero, u16 count, u16 low (where the entry area
/// starts), u16 dead (bytes of the entry area no index entry points into).
pub(super) const HEAD: usize = 8;
/// Where the header's changing fields start (count, low, dead).
const HEADER_FIELDS: usize = 2;
/// An inner node's first child pointer (the keys below its first key), after the header;
/// also where a packed inner node's child pointers start.
pub(super) const FIRST_KID: usize = 8;
/// A leaf entry's fixed part: u16 key length, u32 value length (bit 31: out of line).
pub(super) const LEAF_ENTRY: usize = 6;
/// An inner entry's fixed part: u64 child (the keys from this entry's key on), u16 key length.
const INNER_ENTRY: usize = 10;
const OUT_OF_LINE: u32 = 1 << 31;
/// An index entry: u16 the entry's offset, then the key's first 4 bytes (zero after a
/// shorter key), big-endian, so that they order as the keys do (a tie reads the keys).
pub(super) const SLOT: usize = 6;

/// The first 4 bytes of `key`, zero-padded, as a number that orders as the keys do.
pub(super) fn prefix(key: &[u8]) -> u32 {
    let mut p = [0u8; 4];
    let n = key.len().min(4);
    p[..n].copy_from_slice(&key[..n]);
    u32::from_be_bytes(p)
}

/// A value as a leaf holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Val {
    Inline(Vec<u8>),
    /// In a block of its own: where, and how long.
    Out(Ptr, u32),
}

/// A node decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Node {
    pub leaf: bool,
    pub keys: Vec<Vec<u8>>,
    /// Leaves: one value per key.
    pub vals: Vec<Val>,
    /// Inner nodes: one child more than keys (child i holds keys below keys[i]).
    pub kids: Vec<Ptr>,
}

/// A leaf entry's bytes.
pub(super) fn leaf_entry(key: &[u8], val: &Val) -> Vec<u8> {
    match val {
        Val::Inline(b) => inline_entry(key, b),
        Val::Out(p, len) => {
            let mut v = Vec::with_capacity(LEAF_ENTRY + key.len() + 8);
            v.put_u16(key.len() as u16);
            v.put_u32(*len | OUT_OF_LINE);
            v.put_bytes(key);
            v.put_u64(p.0);
            v
        }
    }
}

/// The bytes of a leaf entry that holds `value` inline.
pub(super) fn inline_entry(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(LEAF_ENTRY + key.len() + value.len());
    v.put_u16(key.len() as u16);
    v.put_u32(value.len() as u32);
    v.put_bytes(key);
    v.put_bytes(value);
    v
}

/// The leaf entry at the start of `e`, as it is stored: key, value length word, and the
/// value or its block's pointer; `None` if `e` is too short for it. The one parser of the
/// entry format (both node formats share it).
fn raw_leaf_entry(e: &[u8]) -> Option<(&[u8], u32, &[u8])> {
    let mut r = Reader::new(e);
    let klen = r.u16()? as usize;
    let word = r.u32()?;
    let key = r.take(klen)?;
    let stored = r.take(if word & OUT_OF_LINE == 0 { word as usize } else { 8 })?;
    Some((key, word, stored))
}

/// The value a stored leaf entry holds.
fn val_of(word: u32, stored: &[u8]) -> Val {
    match word & OUT_OF_LINE {
        0 => Val::Inline(stored.to_vec()),
        _ => Val::Out(Ptr(le::get_u64(stored, 0)), word & !OUT_OF_LINE),
    }
}

/// The value of the leaf entry `e`; `None` if `e` is too short for it.
pub(super) fn leaf_val(e: &[u8]) -> Option<Val> {
    raw_leaf_entry(e).map(|(_, word, stored)| val_of(word, stored))
}

/// An inner entry's bytes, padded to 8 so that every child pointer is an aligned slot.
pub(super) fn inner_entry(key: &[u8], kid: Ptr) -> Vec<u8> {
    let mut v = Vec::with_capacity(inner_entry_len(key.len()));
    v.put_u64(kid.0);
    v.put_u16(key.len() as u16);
    v.put_bytes(key);
    v.resize(inner_entry_len(key.len()), 0);
    v
}

fn inner_entry_len(klen: usize) -> usize {
    (INNER_ENTRY + klen).next_multiple_of(8)
}

/// Whether a node of `len` bytes can be written slotted (every node is, once it changes):
/// room for an inner node's header, offsets that fit the index's 16 bits, and a whole number
/// of 8-byte words (an inner node's entries are aligned to them from its end; every node
/// block's length is).
pub(super) fn slotted_len(len: usize) -> bool {
    (index_at(false)..=MAX_NODE).contains(&len) && len.is_multiple_of(8)
}

fn index_at(leaf: bool) -> usize {
    if leaf {
        HEAD
    } else {
        FIRST_KID + 8
    }
}

impl Node {
    /// The node in `b`, in either format; `None` if `b` is not a whole, consistent node.
    pub fn decode(b: &[u8]) -> Option<Node> {
        match *b.first()? {
            PACKED_LEAF | PACKED_INNER => decode_packed(b),
            _ => {
                let s = Slotted::parse(b)?;
                if !s.consistent() {
                    return None;
                }
                let mut node = Node { leaf: s.leaf, ..Node::default() };
                if !s.leaf {
                    node.kids.push(s.kid(0)?.1);
                }
                for i in 0..s.n {
                    if s.leaf {
                        let (k, v, _) = s.leaf_entry(i)?;
                        node.keys.push(k.to_vec());
                        node.vals.push(v);
                    } else {
                        node.keys.push(s.key(i)?.to_vec());
                        node.kids.push(s.kid(i + 1)?.1);
                    }
                }
                if !s.ordered {
                    let mut pairs: Vec<(Vec<u8>, Val)> = node.keys.into_iter().zip(node.vals).collect();
                    pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                    (node.keys, node.vals) = pairs.into_iter().unzip();
                }
                Some(node)
            }
        }
    }
}

/// Bytes before a packed node's first leaf entry: kind, zero, count.
const PACKED_HEAD: usize = 4;

/// A node of pool versions 1 and 2: kind, zero, count, then a leaf's entries in key order,
/// or an inner node's u32 zero, count + 1 child pointers and count keys.
fn decode_packed(b: &[u8]) -> Option<Node> {
    let mut r = Reader::new(b);
    let kind = r.u8()?;
    r.u8()?;
    let n = r.u16()? as usize;
    let mut node = Node { leaf: kind == PACKED_LEAF, ..Node::default() };
    if node.leaf {
        let mut at = PACKED_HEAD;
        for _ in 0..n {
            let (key, word, stored) = raw_leaf_entry(b.get(at..)?)?;
            node.keys.push(key.to_vec());
            node.vals.push(val_of(word, stored));
            at += LEAF_ENTRY + key.len() + stored.len();
        }
    } else {
        r.u32()?;
        for _ in 0..=n {
            node.kids.push(Ptr(r.u64()?));
        }
        for _ in 0..n {
            let klen = r.u16()? as usize;
            node.keys.push(r.take(klen)?.to_vec());
        }
    }
    // Keys in order, none twice, as a slotted node's must be (it is written back slotted).
    node.keys.windows(2).all(|w| w[0] < w[1]).then_some(node)
}

/// In the encoded inner node `b`: where the pointer to the child whose range holds `key` is
/// (an offset in the node), and that child, read in place. `None` if `b` is not an inner
/// node or is damaged.
pub(super) fn child_for(b: &[u8], key: &[u8]) -> Option<(usize, Ptr)> {
    if *b.first()? == PACKED_INNER {
        return packed_child_for(b, key);
    }
    let s = Slotted::parse(b).filter(|s| !s.leaf)?;
    // Child j holds the keys from key j - 1 on.
    let i = match s.search(key)? {
        Ok(j) => j + 1,
        Err(j) => j,
    };
    s.kid(i)
}

fn packed_child_for(b: &[u8], key: &[u8]) -> Option<(usize, Ptr)> {
    let mut r = Reader::new(b);
    r.take(2)?;
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
    let at = FIRST_KID + 8 * i;
    Some((at, Ptr(le::get_u64(kids, at - 4))))
}

/// Loads one byte of every line of `b`, so that the misses overlap: a binary search's probes
/// depend on each other and would miss one line at a time.
fn touch(b: &[u8]) {
    let mut x = 0u8;
    for line in b.chunks(64) {
        x ^= line[0];
    }
    std::hint::black_box(x);
}

/// The parts of an encoded node worth writing: the header and index, and the entry area.
/// The gap between them holds anything (FORMAT.md), so a node written to a new block skips
/// it: half a freshly split node's bytes, and their parity.
pub(super) fn written_parts(b: &[u8]) -> [(u64, &[u8]); 2] {
    match Slotted::parse(b) {
        Some(s) => [(0, &b[..s.index_end()]), (s.low as u64, &b[s.low..])],
        None => [(0, b), (b.len() as u64, &[])],
    }
}

/// A slotted node, read in place. Every accessor checks what it reads against the node's
/// bounds, so damaged bytes read as `None`, never as a panic.
pub(super) struct Slotted<'a> {
    b: &'a [u8],
    /// The node's length: where the entry area ends.
    end: usize,
    pub leaf: bool,
    /// Whether the index is in key order (every kind but [`LEAF_APPENDED`]).
    pub ordered: bool,
    pub n: usize,
    low: usize,
    dead: usize,
}

/// A change to a slotted node that fits in its gap: the entry goes at `entry_at` (bytes no
/// committed state uses, written without undo), and `index` says what becomes of the
/// header and the index (data-logged).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Splice {
    pub entry_at: u64,
    pub index: IndexChange,
}

/// New bytes for a slotted node's header fields (count, low, dead) and for its index from
/// slot `from` on: the two ranges a put or a delete data-logs (the slots before `from` do not
/// change, and are not logged again).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct IndexChange {
    header: [u8; 6],
    tail_at: u64,
    tail: Vec<u8>,
}

impl IndexChange {
    /// The ranges to write: (offset in the node, bytes); the tail may be empty.
    pub fn ranges(&self) -> [(u64, &[u8]); 2] {
        [(HEADER_FIELDS as u64, &self.header), (self.tail_at, &self.tail)]
    }
}

impl<'a> Slotted<'a> {
    /// `b` as a slotted node, if its kind is one and its header is in bounds.
    pub fn parse(b: &'a [u8]) -> Option<Slotted<'a>> {
        let (leaf, ordered) = match *b.first()? {
            LEAF => (true, true),
            INNER => (false, true),
            LEAF_APPENDED => (true, false),
            _ => return None,
        };
        let end = b.len();
        if !slotted_len(end) {
            return None;
        }
        let field = |at| le::get_u16(b, at) as usize;
        let s = Slotted { b, end, leaf, ordered, n: field(2), low: field(4), dead: field(6) };
        let sound = s.index_end() <= s.low && s.low <= end && s.dead <= end - s.low;
        (sound && (leaf || s.low.is_multiple_of(8))).then_some(s)
    }

    /// Where the index ends: the header and index are `[0, index_end)`.
    pub fn index_end(&self) -> usize {
        index_at(self.leaf) + SLOT * self.n
    }

    /// Where the entry area starts.
    pub fn low(&self) -> usize {
        self.low
    }

    /// Bytes of the entry area no slot points into.
    pub fn dead(&self) -> usize {
        self.dead
    }

    /// Bytes in use: the header and index, and the live entries.
    pub fn used(&self) -> usize {
        self.index_end() + (self.end - self.low - self.dead)
    }

    /// The node's length (its block's payload).
    pub fn len(&self) -> usize {
        self.end
    }

    /// Where entry `i` is, and its length.
    pub fn span(&self, i: usize) -> Option<(usize, usize)> {
        Some((self.entry(i)?, self.entry_len(i)?))
    }

    fn gap(&self) -> usize {
        self.low - self.index_end()
    }

    /// Where entry `i` starts.
    fn entry(&self, i: usize) -> Option<usize> {
        if i >= self.n {
            return None;
        }
        let at = le::get_u16(self.b, index_at(self.leaf) + SLOT * i) as usize;
        (self.low <= at && at < self.end && (self.leaf || at.is_multiple_of(8))).then_some(at)
    }

    /// Entry `i`'s key.
    pub fn key(&self, i: usize) -> Option<&'a [u8]> {
        let at = self.entry(i)? + if self.leaf { 0 } else { 8 };
        if at + 2 > self.end {
            return None;
        }
        let klen = le::get_u16(self.b, at) as usize;
        let from = at + if self.leaf { LEAF_ENTRY } else { 2 };
        self.b[..self.end].get(from..from + klen)
    }

    /// Entry `i` of a leaf: its key, its value, and the entry's length.
    pub fn leaf_entry(&self, i: usize) -> Option<(&'a [u8], Val, usize)> {
        let (key, word, stored) = self.leaf_raw(i)?;
        Some((key, val_of(word, stored), LEAF_ENTRY + key.len() + stored.len()))
    }

    /// The block holding leaf entry `i`'s value, if it is out of line (`Some(None)`: inline).
    pub fn value_block(&self, i: usize) -> Option<Option<Ptr>> {
        let (_, word, stored) = self.leaf_raw(i)?;
        Some((word & OUT_OF_LINE != 0).then(|| Ptr(le::get_u64(stored, 0))))
    }

    /// Entry `i` of a leaf as it is stored: key, value length word, value or its pointer.
    fn leaf_raw(&self, i: usize) -> Option<(&'a [u8], u32, &'a [u8])> {
        raw_leaf_entry(&self.b[self.entry(i)?..self.end])
    }

    /// Where child `i`'s pointer is in an inner node, and the child.
    pub fn kid(&self, i: usize) -> Option<(usize, Ptr)> {
        let at = if i == 0 { FIRST_KID } else { self.entry(i - 1)? };
        (at + 8 <= self.end).then(|| (at, Ptr(le::get_u64(self.b, at))))
    }

    /// The length of entry `i`.
    fn entry_len(&self, i: usize) -> Option<usize> {
        match self.leaf {
            true => self.leaf_raw(i).map(|(k, _, v)| LEAF_ENTRY + k.len() + v.len()),
            false => self.key(i).map(|k| inner_entry_len(k.len())),
        }
    }

    /// Where `key` is among the entries (`Ok`), or where it would go (`Err`: at the end of an
    /// appended leaf's index).
    pub fn search(&self, key: &[u8]) -> Option<Result<usize, usize>> {
        self.search_seen(key, &mut |_, _| {})
    }

    /// The child of this inner node that holds `key`: where its pointer is, and the
    /// pointer; `seen` is told every part the search read, the pointer's 8 bytes last.
    pub fn kid_seen(&self, key: &[u8], seen: &mut dyn FnMut(usize, usize)) -> Option<(usize, Ptr)> {
        // Child j holds the keys from key j - 1 on.
        let i = self.search_seen(key, seen)?.map_or_else(|j| j, |j| j + 1);
        let (at, kid) = self.kid(i)?;
        seen(at, 8);
        Some((at, kid))
    }

    /// [`Slotted::search`], telling `seen` the bytes of each entry whose key it reads (on a
    /// prefix tie), as (offset, length): with the header and index, all that the search
    /// read, for a read check of those bytes alone.
    pub fn search_seen(
        &self,
        key: &[u8],
        seen: &mut dyn FnMut(usize, usize),
    ) -> Option<Result<usize, usize>> {
        let key_of = |i: usize, seen: &mut dyn FnMut(usize, usize)| {
            let k = self.key(i)?;
            let at = self.entry(i)?;
            seen(at, k.as_ptr() as usize + k.len() - self.b.as_ptr() as usize - at);
            Some(k)
        };
        let want = prefix(key);
        let index = &self.b[index_at(self.leaf)..self.index_end()];
        touch(index);
        let prefix_at =
            |i: usize| u32::from_be_bytes(index[SLOT * i + 2..SLOT * i + 6].try_into().expect("4 bytes"));
        if !self.ordered {
            for i in 0..self.n {
                if prefix_at(i) == want && key_of(i, seen)? == key {
                    return Some(Ok(i));
                }
            }
            return Some(Err(self.n));
        }
        let (mut lo, mut hi) = (0, self.n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let order = match prefix_at(mid).cmp(&want) {
                Ordering::Equal => key_of(mid, seen)?.cmp(key),
                order => order,
            };
            match order {
                Ordering::Less => lo = mid + 1,
                Ordering::Equal => return Some(Ok(mid)),
                Ordering::Greater => hi = mid,
            }
        }
        Some(Err(lo))
    }

    /// Whether the entries lie in the entry area, none over another, in key order, and the
    /// dead bytes are the rest of it.
    pub fn consistent(&self) -> bool {
        let mut spans = Vec::with_capacity(self.n);
        let mut keys = Vec::with_capacity(self.n);
        for i in 0..self.n {
            let (Some(at), Some(len), Some(key)) = (self.entry(i), self.entry_len(i), self.key(i)) else {
                return false;
            };
            let slot = index_at(self.leaf) + SLOT * i + 2;
            let stamped = prefix(key) == u32::from_be_bytes(self.b[slot..slot + 4].try_into().expect("4"));
            if at + len > self.end || !stamped {
                return false;
            }
            spans.push((at, len));
            keys.push(key);
        }
        // Keys in order (an appended leaf's once sorted), none twice.
        if !self.ordered {
            keys.sort_unstable();
        }
        if keys.windows(2).any(|w| w[0] >= w[1]) {
            return false;
        }
        spans.sort_unstable();
        let apart = spans.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0);
        let live: usize = spans.iter().map(|s| s.1).sum();
        apart && live + self.dead == self.end - self.low
    }

    /// An entry for `key` of `len` bytes put at index position `i`: a new one (`replaced`
    /// `None`), or in place of entry `i`, `replaced` bytes long (which become dead). `None` if
    /// the gap is too small.
    pub fn splice(&self, i: usize, key: &[u8], len: usize, replaced: Option<usize>) -> Option<Splice> {
        let need = len + if replaced.is_none() { SLOT } else { 0 };
        if need > self.gap() || i > self.n || (!self.ordered && replaced.is_none() && i != self.n) {
            return None;
        }
        let low = self.low - len;
        let n = self.n + replaced.is_none() as usize;
        let dead = self.dead + replaced.unwrap_or(0);
        let index = &self.b[index_at(self.leaf)..self.index_end()];
        let mut tail = Vec::with_capacity(SLOT + index.len() - SLOT * i);
        tail.put_u16(low as u16);
        tail.put_bytes(&prefix(key).to_be_bytes());
        if replaced.is_none() {
            tail.extend_from_slice(&index[SLOT * i..]);
        }
        Some(Splice { entry_at: low as u64, index: self.index_change(n, low, dead, i, tail) })
    }

    /// Entry `i` (of `len` bytes) removed: its slot leaves the index (an ordered index's later
    /// slots move down; an appended leaf's last slot takes its place), its bytes are dead.
    pub fn remove(&self, i: usize, len: usize) -> IndexChange {
        let index = &self.b[index_at(self.leaf)..self.index_end()];
        let tail = match self.ordered {
            true => index[SLOT * i + SLOT..].to_vec(),
            false if i + 1 == self.n => Vec::new(),
            false => index[index.len() - SLOT..].to_vec(),
        };
        self.index_change(self.n - 1, self.low, self.dead + len, i, tail)
    }

    fn index_change(&self, n: usize, low: usize, dead: usize, from: usize, tail: Vec<u8>) -> IndexChange {
        let mut header = [0u8; 6];
        for (i, v) in [n, low, dead].into_iter().enumerate() {
            le::put_u16(&mut header, 2 * i, v as u16);
        }
        IndexChange { header, tail_at: (index_at(self.leaf) + SLOT * from) as u64, tail }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::entries::Entries;

    fn leaf(n: u8) -> Node {
        let keys: Vec<Vec<u8>> = (0..n).map(|i| vec![b'k', i * 2]).collect();
        Node { leaf: true, vals: keys.iter().map(|k| Val::Inline(k.repeat(3))).collect(), keys, kids: vec![] }
    }

    /// Applies a splice to a copy of `b`, as a transaction would.
    fn apply(b: &[u8], s: &Splice, entry: &[u8]) -> Vec<u8> {
        let mut out = b.to_vec();
        let at = s.entry_at as usize;
        out[at..at + entry.len()].copy_from_slice(entry);
        change(&mut out, &s.index);
        out
    }

    fn change(b: &mut [u8], c: &IndexChange) {
        for (at, bytes) in c.ranges() {
            b[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
        }
    }

    #[test]
    fn a_spliced_leaf_decodes_as_the_leaf_with_the_entry_set() {
        let node = leaf(20);
        let bytes = node.encode();
        assert_eq!(Node::decode(&bytes), Some(node.clone()));
        for (key, val) in [
            (vec![b'k', 7], Val::Inline(b"new".to_vec())),
            (vec![b'k', 8], Val::Out(Ptr(4096), 9000)),
            (vec![b'a'], Val::Inline(vec![])),
            (vec![b'z'], Val::Inline(vec![1; 40])),
        ] {
            let s = Slotted::parse(&bytes).unwrap();
            let entry = leaf_entry(&key, &val);
            let mut want = node.clone();
            let spliced = match s.search(&key).unwrap() {
                Ok(i) => {
                    want.vals[i] = val;
                    let old = s.leaf_entry(i).unwrap().2;
                    apply(&bytes, &s.splice(i, &key, entry.len(), Some(old)).unwrap(), &entry)
                }
                Err(i) => {
                    want.keys.insert(i, key.clone());
                    want.vals.insert(i, val);
                    apply(&bytes, &s.splice(i, &key, entry.len(), None).unwrap(), &entry)
                }
            };
            assert_eq!(Node::decode(&spliced), Some(want));
        }
    }

    /// An appended leaf (kind 5) under random puts, replacements and deletes, each a splice
    /// or a removal as a transaction applies it, against a map: it decodes as the map, in key
    /// order; a search finds every key; a new key's slot goes last and logs the header and
    /// that slot alone; when the gap runs out, the entries repack (as a compaction would) into
    /// an appended leaf again.
    #[test]
    fn an_appended_leaf_takes_puts_and_deletes_like_a_map() {
        let mut rng = bitmend_media::rng::Rng::new(55);
        let mut model = std::collections::BTreeMap::<Vec<u8>, Val>::new();
        let mut e = Entries::from_node(&Node { leaf: true, ..Node::default() });
        e.appended = true;
        let mut bytes = e.encode();
        assert_eq!(bytes[0], LEAF_APPENDED);
        for step in 0..3000 {
            let key = vec![b'k', rng.below(3) as u8, rng.below(60) as u8];
            let s = Slotted::parse(&bytes).unwrap();
            assert!(!s.ordered);
            let found = s.search(&key).unwrap();
            assert_eq!(found.is_ok(), model.contains_key(&key), "step {step}");
            if rng.below(3) == 0 {
                if let Ok(i) = found {
                    let c = s.remove(i, s.leaf_entry(i).unwrap().2);
                    change(&mut bytes, &c);
                    model.remove(&key);
                }
            } else {
                let val = Val::Inline(vec![step as u8; rng.below(40) as usize]);
                let entry = leaf_entry(&key, &val);
                let old = found.ok().map(|i| s.leaf_entry(i).unwrap().2);
                let at = found.unwrap_or_else(|n| n);
                match s.splice(at, &key, entry.len(), old) {
                    Some(splice) => {
                        if old.is_none() {
                            let [_, (tail_at, tail)] = splice.index.ranges();
                            assert_eq!(
                                (tail_at as usize, tail.len()),
                                (HEAD + SLOT * s.n, SLOT),
                                "one slot, last"
                            );
                        }
                        bytes = apply(&bytes, &splice, &entry);
                    }
                    None => {
                        let mut all = Entries::of(&bytes).unwrap();
                        match all.search(&key) {
                            Ok(i) => all.replace(i, &entry),
                            Err(i) => all.insert(i, &key, &entry),
                        }
                        if !all.fits() {
                            continue;
                        }
                        bytes = all.encode();
                        assert_eq!(bytes[0], LEAF_APPENDED, "a compaction keeps the kind");
                    }
                }
                model.insert(key, val);
            }
            let want = Node {
                leaf: true,
                keys: model.keys().cloned().collect(),
                vals: model.values().cloned().collect(),
                kids: vec![],
            };
            assert_eq!(Node::decode(&bytes), Some(want), "step {step}");
        }
    }

    #[test]
    fn removing_entries_leaves_dead_bytes_that_a_splice_never_reuses() {
        let node = leaf(10);
        let mut bytes = node.encode();
        let mut want = node.clone();
        for key in [vec![b'k', 0], vec![b'k', 10], vec![b'k', 18]] {
            let s = Slotted::parse(&bytes).unwrap();
            let i = s.search(&key).unwrap().unwrap();
            let len = s.leaf_entry(i).unwrap().2;
            let c = s.remove(i, len);
            change(&mut bytes, &c);
            let j = want.keys.binary_search(&key).unwrap();
            want.keys.remove(j);
            want.vals.remove(j);
            assert_eq!(Node::decode(&bytes), Some(want.clone()));
        }
        // Entries go into the gap until it is too small, never over the dead bytes.
        let (mut fills, mut i) = (0, 0u8);
        loop {
            let s = Slotted::parse(&bytes).unwrap();
            let key = vec![b'm', i];
            let entry = leaf_entry(&key, &Val::Inline(vec![i; 100]));
            let Some(sp) = s.splice(s.search(&key).unwrap().unwrap_err(), &key, entry.len(), None) else {
                break;
            };
            assert!(sp.entry_at as usize + entry.len() <= s.low, "an entry goes below the entry area");
            bytes = apply(&bytes, &sp, &entry);
            want.keys.push(key);
            want.vals.push(Val::Inline(vec![i; 100]));
            assert_eq!(Node::decode(&bytes), Some(want.clone()));
            fills += 1;
            i += 1;
        }
        assert!(fills > 30, "{fills} entries fitted");
    }

    #[test]
    fn inner_nodes_find_the_child_for_every_key_and_take_spliced_children() {
        let keys: Vec<Vec<u8>> = (1..50u32).map(|i| format!("key{:03}", i * 10).into_bytes()).collect();
        let kids = (0..50u64).map(|i| Ptr(4096 * (i + 1))).collect();
        let node = Node { leaf: false, keys: keys.clone(), vals: vec![], kids };
        let mut bytes = node.encode();
        assert_eq!(Node::decode(&bytes), Some(node.clone()));
        let want = |n: &Node, key: &[u8]| n.kids[n.keys.partition_point(|k| k.as_slice() <= key)];
        for probe in ["a", "key010", "key011", "key489", "key490", "z"] {
            let (at, kid) = child_for(&bytes, probe.as_bytes()).unwrap();
            assert_eq!(kid, want(&node, probe.as_bytes()), "{probe}");
            assert_eq!(le::get_u64(&bytes, at), kid.0);
            assert!(at.is_multiple_of(8));
        }
        // A child spliced in after a split.
        let mut grown = node.clone();
        let s = Slotted::parse(&bytes).unwrap();
        let sep = b"key255".to_vec();
        let i = s.search(&sep).unwrap().unwrap_err();
        let entry = inner_entry(&sep, Ptr(999 * 4096));
        bytes = apply(&bytes, &s.splice(i, &sep, entry.len(), None).unwrap(), &entry);
        grown.keys.insert(i, sep);
        grown.kids.insert(i + 1, Ptr(999 * 4096));
        assert_eq!(Node::decode(&bytes), Some(grown.clone()));
        assert_eq!(child_for(&bytes, b"key256").unwrap().1, Ptr(999 * 4096));
    }

    /// A packed inner node as versions 1 and 2 wrote it.
    fn packed_inner(keys: &[Vec<u8>], kids: &[Ptr]) -> Vec<u8> {
        let mut v = vec![PACKED_INNER, 0];
        v.put_u16(keys.len() as u16);
        v.put_u32(0);
        kids.iter().for_each(|k| v.put_u64(k.0));
        for k in keys {
            v.put_u16(k.len() as u16);
            v.put_bytes(k);
        }
        v.resize(NODE as usize, 0);
        v
    }

    #[test]
    fn packed_inner_nodes_of_older_pools_read_and_find_children() {
        let keys: Vec<Vec<u8>> = (1..30u32).map(|i| format!("k{:03}", i * 10).into_bytes()).collect();
        let kids: Vec<Ptr> = (0..30u64).map(|i| Ptr(4096 * (i + 1))).collect();
        let b = packed_inner(&keys, &kids);
        let node = Node::decode(&b).unwrap();
        assert_eq!((node.leaf, &node.keys, &node.kids), (false, &keys, &kids));
        for probe in ["a", "k010", "k011", "k289", "k290", "z"] {
            let i = keys.partition_point(|k| k.as_slice() <= probe.as_bytes());
            let (at, kid) = child_for(&b, probe.as_bytes()).unwrap();
            assert_eq!((at, kid), (FIRST_KID + 8 * i, kids[i]), "{probe}");
        }
        // Rewritten, it is slotted and finds the same children.
        let slotted = node.encode();
        assert_eq!(slotted[0], INNER);
        assert_eq!(child_for(&slotted, b"k155").unwrap().1, kids[15]);
    }

    #[test]
    fn damaged_nodes_read_as_none_never_a_panic() {
        let mut rng = bitmend_media::rng::Rng::new(17);
        let mut appended = Entries::from_node(&leaf(14));
        appended.appended = true;
        let good = [
            leaf(14).encode(),
            {
                let keys: Vec<Vec<u8>> = (0..100u32).map(|i| i.to_be_bytes().to_vec()).collect();
                Node { leaf: false, keys, vals: vec![], kids: (0..101).map(|i| Ptr(i * 4096)).collect() }
                    .encode()
            },
            appended.encode(),
        ];
        for _ in 0..4500 {
            let mut b = good[rng.below(3) as usize].clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(NODE as usize as u64) as usize;
                b[at] = rng.next_u64() as u8;
            }
            if rng.below(4) == 0 {
                let at = 2 + rng.below(6) as usize;
                b[at] = 0xFF;
            }
            let _ = Node::decode(&b);
            let _ = child_for(&b, b"probe");
            // What a split or a compaction reads: refused, or repacked whole.
            if let Some(mut e) = Entries::of(&b) {
                let key = b"zz-probe".as_slice();
                let entry = if e.leaf {
                    leaf_entry(key, &Val::Inline(vec![1; 300]))
                } else {
                    inner_entry(key, Ptr(64))
                };
                if let Err(i) = e.search(key) {
                    e.insert(i, key, &entry);
                }
                let _ = if e.fits() {
                    vec![e.encode()]
                } else {
                    let (l, _, r) = e.split();
                    vec![l, r]
                };
            }
            if let Some(s) = Slotted::parse(&b) {
                if let Some(found) = s.search(b"probe") {
                    let _ = s.splice(found.unwrap_or_else(|i| i), b"probe", 40, None);
                }
                for i in 0..s.n.min(200) {
                    let _ = (s.key(i), s.kid(i), s.entry_len(i));
                }
            }
        }
    }
}
