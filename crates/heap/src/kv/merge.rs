//! Deleting gives space back: a node left less than half full is merged with a neighbour
//! under the same parent when the two fit in one node, so that a store that was full takes
//! new keys, in any order, once keys are deleted (without it, the keys of emptied leaves
//! were gone but their blocks kept, and only keys that fell into those leaves fit).

use bitmend_media::pmem::Region;

use super::node::Slotted;
use super::{not_a_node, Kv};
use crate::alloc::Ptr;
use crate::tx::{Slot, Tx};
use crate::HeapError;

/// A pair of neighbours to merge, and what their parent loses.
struct Pair {
    left: Ptr,
    right: Ptr,
    /// The parent's key between them, the index of its entry, and that entry's length.
    sep: Vec<u8>,
    sep_index: usize,
    sep_len: usize,
    /// Entries the parent keeps.
    parent_after: usize,
}

impl Kv {
    /// After a delete from the node at `p` (`path`: the inner nodes above it, each with
    /// its slot): while the node is less than half full, merges it with a neighbour when
    /// the two fit in one node, then looks at the parent the same way. The merged node is
    /// written in place in the left one's block (data-logged: a merge allocates nothing, so
    /// that a delete in a full pool still succeeds), the right one's block is freed and its
    /// separator taken out of the parent. A root left with one child gives way to it.
    pub(super) fn merge_up<R: Region>(
        &self,
        tx: &mut Tx<R>,
        mut path: Vec<(Slot, Ptr)>,
        mut p: Ptr,
        key: &[u8],
    ) -> Result<(), HeapError> {
        while let Some((pslot, pp)) = path.pop() {
            let Some((pair, leaf)) = Kv::pair_to_merge(tx, p, pp, key)? else { return Ok(()) };
            let merged = Kv::entries_in(tx, pair.left, leaf)?
                .merged(&pair.sep, &Kv::entries_in(tx, pair.right, leaf)?);
            if !merged.fits() {
                return Ok(());
            }
            let change = match Slotted::parse(tx.object(pp)?) {
                Some(ps) => ps.remove(pair.sep_index, pair.sep_len),
                None => return Err(not_a_node(pp)),
            };
            tx.write(pair.left, 0, &merged.encode())?;
            self.change_index(tx, pp, &change, None)?;
            tx.free(pair.right)?;
            if path.is_empty() && pair.parent_after == 0 {
                tx.set(pslot, pair.left)?;
                return tx.free(pp);
            }
            p = pp;
        }
        Ok(())
    }

    /// The node at `p` and a neighbour under `pp` (the parent whose child holds `key`), if
    /// `p` is less than half full and the two may fit in one node; and whether they are
    /// leaves. `None` for nodes of the packed format (pool versions 1 and 2): never merged.
    fn pair_to_merge<R: Region>(
        tx: &Tx<R>,
        p: Ptr,
        pp: Ptr,
        key: &[u8],
    ) -> Result<Option<(Pair, bool)>, HeapError> {
        let (used, leaf) = match Slotted::parse(tx.object(p)?) {
            Some(s) if s.used() * 2 < s.len() => (s.used(), s.leaf),
            _ => return Ok(None),
        };
        let Some(ps) = Slotted::parse(tx.object(pp)?).filter(|s| !s.leaf && s.n > 0) else { return Ok(None) };
        let bad = || not_a_node(pp);
        let j = ps.search(key).ok_or_else(bad)?.map_or_else(|j| j, |j| j + 1);
        // The pair (r - 1, r): this node and the one after it, or the last and the one before.
        let r = if j < ps.n { j + 1 } else { j };
        let (left, right) = (ps.kid(r - 1).ok_or_else(bad)?.1, ps.kid(r).ok_or_else(bad)?.1);
        let other = if r - 1 == j { right } else { left };
        let fits = match Slotted::parse(tx.object(other)?) {
            // The index and header of one of them go: a cheap first look before a copy.
            Some(o) if o.leaf == leaf => used + o.used() <= o.len() + o.index_end().min(used),
            _ => false,
        };
        if !fits {
            return Ok(None);
        }
        let pair = Pair {
            left,
            right,
            sep: ps.key(r - 1).ok_or_else(bad)?.to_vec(),
            sep_index: r - 1,
            sep_len: ps.span(r - 1).ok_or_else(bad)?.1,
            parent_after: ps.n - 1,
        };
        Ok(Some((pair, leaf)))
    }
}
