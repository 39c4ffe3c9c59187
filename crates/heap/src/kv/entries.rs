//! A node as its entries' bytes in key order: what a compaction or a split writes into new
//! blocks. Built from a slotted node with one copy of its entry area (a sequential read of
//! the cold node, where decoding it entry by entry missed a line at a time), changed, then
//! packed into one node or split into two.

use std::cmp::Ordering;

use bitmend_code::le::{self, Put};

use super::node::{self, Node, Slotted, Val, FIRST_KID, INNER, LEAF, LEAF_APPENDED, NODE, SLOT};
use crate::alloc::Ptr;

/// A node's encoding is its entries packed (here, where the packing is, so that the node
/// format below does not reach up for it).
impl Node {
    /// The node's bytes, slotted, its entries packed at the end in key order (every byte of
    /// the node: the entries end where it does).
    pub fn encode(&self) -> Vec<u8> {
        Entries::from_node(self).encode()
    }
}

/// Entries of one node, in key order.
pub(super) struct Entries {
    pub leaf: bool,
    /// A leaf written as an appended one (kind 5: stores of version 4 pools).
    pub appended: bool,
    /// The length of the node they came from, which a compaction keeps (a pointer-logged
    /// rewrite takes a block like the old one).
    end: usize,
    /// An inner node's first child (the keys below its first key).
    first: Ptr,
    /// The entries' bytes (an entry area copied whole, and entries added since).
    bytes: Vec<u8>,
    items: Vec<Item>,
}

/// One entry: where its bytes are in `Entries::bytes`, how many, and its key's prefix.
#[derive(Clone, Copy)]
struct Item {
    at: usize,
    len: usize,
    prefix: u32,
}

impl Entries {
    /// The entries of the node in `b`, in either format; `None` if an entry lies outside it.
    pub fn of(b: &[u8]) -> Option<Entries> {
        // A packed node is written back slotted the first time it changes: one too small
        // (or too large) to be written so is not taken for a node.
        if !node::slotted_len(b.len()) {
            return None;
        }
        let Some(s) = Slotted::parse(b) else {
            return Some(Entries { end: b.len(), ..Entries::from_node(&Node::decode(b)?) });
        };
        let low = s.low();
        let mut e = Entries {
            leaf: s.leaf,
            appended: !s.ordered,
            end: b.len(),
            first: if s.leaf { Ptr::NULL } else { s.kid(0)?.1 },
            bytes: b[low..].to_vec(),
            items: Vec::with_capacity(s.n + 1),
        };
        for i in 0..s.n {
            let (at, len) = s.span(i)?;
            e.items.push(Item { at: at - low, len, prefix: node::prefix(s.key(i)?) });
        }
        if e.appended {
            let bytes = &e.bytes;
            let key = |it: &Item| {
                let entry = &bytes[it.at..it.at + it.len];
                &entry[node::LEAF_ENTRY..node::LEAF_ENTRY + le::get_u16(entry, 0) as usize]
            };
            e.items.sort_unstable_by(|a, b| a.prefix.cmp(&b.prefix).then_with(|| key(a).cmp(key(b))));
        }
        // Live and dead bytes must fill the entry area: entries a wild write made overlap
        // would add up to more than a node holds, and no split could place them.
        let live: usize = e.items.iter().map(|it| it.len).sum();
        (live + s.dead() == b.len() - low).then_some(e)
    }

    /// The entries of a decoded node, for a new node.
    pub fn from_node(n: &Node) -> Entries {
        let mut e = Entries {
            leaf: n.leaf,
            appended: false,
            end: NODE as usize,
            first: n.kids.first().copied().unwrap_or(Ptr::NULL),
            bytes: Vec::new(),
            items: Vec::new(),
        };
        for (i, k) in n.keys.iter().enumerate() {
            let bytes = match n.leaf {
                true => node::leaf_entry(k, &n.vals[i]),
                false => node::inner_entry(k, n.kids[i + 1]),
            };
            e.insert(i, k, &bytes);
        }
        e
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    fn entry(&self, i: usize) -> &[u8] {
        let it = self.items[i];
        &self.bytes[it.at..it.at + it.len]
    }

    /// Entry `i`'s key (every entry was checked to hold its key when it was read).
    pub fn key(&self, i: usize) -> &[u8] {
        let e = self.entry(i);
        let (klen_at, key_at) = if self.leaf { (0, node::LEAF_ENTRY) } else { (8, 10) };
        &e[key_at..key_at + le::get_u16(e, klen_at) as usize]
    }

    /// A leaf entry's value.
    pub fn val(&self, i: usize) -> Val {
        node::leaf_val(self.entry(i)).expect("an entry checked when it was read")
    }

    /// Where `key` is (`Ok`), or where it would go (`Err`): by prefix, then among the
    /// entries that share it, by key.
    pub fn search(&self, key: &[u8]) -> Result<usize, usize> {
        let want = node::prefix(key);
        let from = self.items.partition_point(|it| it.prefix < want);
        let to = from + self.items[from..].partition_point(|it| it.prefix == want);
        let (mut lo, mut hi) = (from, to);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid).cmp(key) {
                Ordering::Less => lo = mid + 1,
                Ordering::Equal => return Ok(mid),
                Ordering::Greater => hi = mid,
            }
        }
        Err(lo)
    }

    /// Entry `entry`, for `key`, put at position `i`.
    pub fn insert(&mut self, i: usize, key: &[u8], entry: &[u8]) {
        let item = Item { at: self.bytes.len(), len: entry.len(), prefix: node::prefix(key) };
        self.bytes.extend_from_slice(entry);
        self.items.insert(i, item);
    }

    /// Entry `i` replaced by `entry` (for the same key).
    pub fn replace(&mut self, i: usize, entry: &[u8]) {
        self.items[i] = Item { at: self.bytes.len(), len: entry.len(), ..self.items[i] };
        self.bytes.extend_from_slice(entry);
    }

    pub fn remove(&mut self, i: usize) {
        self.items.remove(i);
    }

    /// These entries then `right`'s (the next node under the same parent, `sep` the
    /// parent's key between them), as one node the length of this one: an inner node's
    /// separator comes down as the entry for `right`'s first child.
    pub fn merged(mut self, sep: &[u8], right: &Entries) -> Entries {
        debug_assert_eq!(self.leaf, right.leaf, "a node merges with one of its kind");
        if !self.leaf {
            let n = self.len();
            self.insert(n, sep, &node::inner_entry(sep, right.first));
        }
        for i in 0..right.len() {
            let n = self.len();
            let item = Item { at: self.bytes.len(), ..right.items[i] };
            self.bytes.extend_from_slice(right.entry(i));
            self.items.insert(n, item);
        }
        self
    }

    fn index_at(&self) -> usize {
        if self.leaf {
            node::HEAD
        } else {
            FIRST_KID + 8
        }
    }

    /// Bytes the entries in `range` take in a node, their index slots included.
    fn cost(&self, range: std::ops::Range<usize>) -> usize {
        self.items[range].iter().map(|it| it.len + SLOT).sum()
    }

    /// Whether the entries in `range` fit in a node of `end` bytes.
    fn fit(&self, range: std::ops::Range<usize>, end: usize) -> bool {
        self.index_at() + self.cost(range) <= end
    }

    /// Whether they all fit in their node.
    pub fn fits(&self) -> bool {
        self.fit(0..self.len(), self.end)
    }

    /// A node of `end` bytes of the entries in `range` (an inner node's first child
    /// `first`), its entries packed at its end in key order.
    fn pack(&self, range: std::ops::Range<usize>, first: Ptr, end: usize) -> Vec<u8> {
        debug_assert!(self.fit(range.clone(), end), "a node packs only what fits");
        let n = range.len();
        let low = end - self.cost(range.clone()) + SLOT * n;
        let mut v = Vec::with_capacity(end);
        v.put_u8(match (self.leaf, self.appended) {
            (true, true) => LEAF_APPENDED,
            (true, false) => LEAF,
            (false, _) => INNER,
        });
        v.put_u8(0);
        v.put_u16(n as u16);
        v.put_u16(low as u16);
        v.put_u16(0);
        if !self.leaf {
            v.put_u64(first.0);
        }
        let mut at = low;
        for it in &self.items[range.clone()] {
            v.put_u16(at as u16);
            v.put_bytes(&it.prefix.to_be_bytes());
            at += it.len;
        }
        v.resize(low, 0);
        for i in range {
            v.extend_from_slice(self.entry(i));
        }
        debug_assert_eq!(v.len(), end, "a packed node fills its block");
        v
    }

    /// The node of all the entries.
    pub fn encode(&self) -> Vec<u8> {
        self.pack(0..self.len(), self.first, self.end)
    }

    /// The split of a node whose last entry was just added at its end, on the tree's right
    /// edge: the left node keeps every entry it held (it held them before), the last one
    /// starts the right node. Keys that arrive in ascending order (a sorted load, a dump
    /// restored) then fill their leaves, where a balanced cut leaves each half empty for
    /// good, as SQLite's and PostgreSQL's rightmost splits do. `None` when the rest does not
    /// fit the node.
    pub fn split_off_last(&self) -> Option<(Vec<u8>, Vec<u8>, Vec<u8>)> {
        let n = self.len();
        let at = n.checked_sub(1).filter(|&at| at >= 1 && self.fit(0..at, self.end))?;
        let sep = self.key(at).to_vec();
        let (left_first, right_first, right_from) = match self.leaf {
            true => (Ptr::NULL, Ptr::NULL, at),
            // The cut entry moves up; its child becomes the right node's first.
            false => (self.first, Ptr(le::get_u64(self.entry(at), 0)), n),
        };
        Some((
            self.pack(0..at, left_first, self.end),
            sep,
            self.pack(right_from..n, right_first, NODE as usize),
        ))
    }

    /// Two nodes of about equal bytes, and the separator between them: the right node's
    /// first key (leaves), or the key moved up (inner nodes, whose entry's child becomes the
    /// right node's first). The left node keeps the old node's length (it goes where a
    /// pointer-logged rewrite of that node goes); the right one is new, [`NODE`] bytes.
    pub fn split(&self) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let n = self.len();
        // The last cut that leaves the right node an entry (an inner node's cut entry moves up).
        let last = if self.leaf { n - 1 } else { n - 2 };
        debug_assert!(last >= 1, "a node that does not fit holds entries enough to split");
        let total = self.cost(0..n);
        let mut acc = 0;
        let mut at = n / 2;
        for (i, it) in self.items.iter().enumerate() {
            acc += it.len + SLOT;
            if acc * 2 >= total {
                at = i;
                break;
            }
        }
        // Both halves must fit: entries of up to 1.5 KiB can tip a balanced cut over.
        let right_from = |at: usize| if self.leaf { at } else { at + 1 };
        let mut at = at.clamp(1, last);
        while at > 1 && !self.fit(0..at, self.end) {
            at -= 1;
        }
        while at < last && !self.fit(right_from(at)..n, NODE as usize) {
            at += 1;
        }
        let sep = self.key(at).to_vec();
        let (left_first, right_first) = match self.leaf {
            true => (Ptr::NULL, Ptr::NULL),
            false => (self.first, Ptr(le::get_u64(self.entry(at), 0))),
        };
        let left = self.pack(0..at, left_first, self.end);
        (left, sep, self.pack(right_from(at)..n, right_first, NODE as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(n: u32, value: usize) -> Node {
        let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("key{i:04}").into_bytes()).collect();
        let vals =
            keys.iter().map(|k| Val::Inline(k.repeat(value / k.len() + 1)[..value].to_vec())).collect();
        Node { leaf: true, keys, vals, kids: vec![] }
    }

    #[test]
    fn entries_read_from_a_node_pack_back_into_the_same_node() {
        for node in [leaf(14, 250), leaf(0, 0), leaf(150, 3)] {
            let bytes = Entries::from_node(&node).encode();
            assert_eq!(Node::decode(&bytes), Some(node.clone()));
            let e = Entries::of(&bytes).unwrap();
            assert_eq!(e.encode(), bytes);
        }
    }

    #[test]
    fn search_insert_replace_and_remove_agree_with_a_decoded_node() {
        // Keys sharing their 4-byte prefix, so that ties go to the keys.
        let mut e = Entries::from_node(&leaf(30, 20));
        let mut want = leaf(30, 20);
        for (k, v) in
            [("key0005", "changed"), ("key00055", "new"), ("key", "short"), ("zz", "last"), ("k", "")]
        {
            let val = Val::Inline(v.as_bytes().to_vec());
            let entry = node::leaf_entry(k.as_bytes(), &val);
            match e.search(k.as_bytes()) {
                Ok(i) => {
                    e.replace(i, &entry);
                    want.vals[i] = val;
                }
                Err(i) => {
                    e.insert(i, k.as_bytes(), &entry);
                    want.keys.insert(i, k.as_bytes().to_vec());
                    want.vals.insert(i, val);
                }
            }
            assert_eq!(
                want.keys.binary_search(&k.as_bytes().to_vec()).is_ok(),
                e.search(k.as_bytes()).is_ok()
            );
        }
        let i = e.search(b"key0010").unwrap();
        e.remove(i);
        want.keys.remove(i);
        want.vals.remove(i);
        assert_eq!(Node::decode(&e.encode()), Some(want.clone()));
        for (i, k) in want.keys.iter().enumerate() {
            assert_eq!(e.search(k), Ok(i));
            assert_eq!(e.val(i), want.vals[i]);
        }
    }

    #[test]
    fn splits_keep_every_entry_and_both_halves_fit() {
        let node = leaf(80, 150);
        let e = Entries::from_node(&node);
        assert!(!e.fits());
        let (l, sep, r) = e.split();
        assert_eq!((l.len(), r.len()), (NODE as usize, NODE as usize));
        let (l, r) = (Node::decode(&l).unwrap(), Node::decode(&r).unwrap());
        assert_eq!(sep, r.keys[0]);
        assert_eq!([l.keys, r.keys].concat(), node.keys);
        // An inner node: the separator's child becomes the right half's first.
        let keys: Vec<Vec<u8>> = (0..600u32).map(|i| format!("k{i:05}").into_bytes()).collect();
        let kids: Vec<Ptr> = (0..601u64).map(|i| Ptr(4096 * (i + 1))).collect();
        let inner = Node { leaf: false, keys: keys.clone(), vals: vec![], kids: kids.clone() };
        let e = Entries::from_node(&inner);
        assert!(!e.fits());
        let (l, sep, r) = e.split();
        let (l, r) = (Node::decode(&l).unwrap(), Node::decode(&r).unwrap());
        let at = l.keys.len();
        assert_eq!((sep, &r.kids[0]), (keys[at].clone(), &kids[at + 1]));
        assert_eq!([l.keys, vec![keys[at].clone()], r.keys].concat(), keys);
        assert_eq!([l.kids, r.kids].concat(), kids);
    }

    /// A 4080-byte node (pool versions 1 and 2) keeps its length when compacted, and its left
    /// half does when it splits, however large the entries; the right half is a new node.
    #[test]
    fn an_older_smaller_node_splits_into_halves_that_fit() {
        for value in [20, 300, 512] {
            let small = Entries { end: 4080, ..Entries::from_node(&leaf(0, 0)) }.encode();
            let mut e = Entries::of(&small).unwrap();
            let mut i = 0u32;
            while e.fits() {
                let k = format!("key{i:04}").into_bytes();
                let entry = node::leaf_entry(&k, &Val::Inline(vec![1; value]));
                e.insert(e.search(&k).unwrap_err(), &k, &entry);
                i += 1;
            }
            let (l, _, r) = e.split();
            assert_eq!((l.len(), r.len()), (4080, NODE as usize));
            let (l, r) = (Node::decode(&l).unwrap(), Node::decode(&r).unwrap());
            assert_eq!(l.keys.len() + r.keys.len(), i as usize, "{value}-byte values");
        }
    }
}
