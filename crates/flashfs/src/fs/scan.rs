//! Reassembling nodes from the fragments of data pages read in write order: what replay does
//! from a checkpoint on, and what rebuilding a lost map does over the whole log.

use crate::fs::node::{frags, Frag, NodeKind, FLAG_LAST};

/// A node reassembled from its fragments (complete once its last fragment was added).
pub(crate) struct Partial {
    pub head: Frag,
    pub payload: Vec<u8>,
    pub frags: Vec<(u32, u16, u16)>,
}

/// Feeds pages in write order; hands over each node whose fragments were all found.
#[derive(Default)]
pub(crate) struct Assembler {
    partial: Option<Partial>,
    /// Nodes not applied because a fragment was missing (a crash cut, a lost page).
    pub cut: u64,
}

impl Assembler {
    /// A page in the sequence could not be read: a node in progress across it is lost.
    pub fn lost_page(&mut self) {
        if self.partial.take().is_some() {
            self.cut += 1;
        }
    }

    /// Takes the fragments of the data page at `addr`; calls `each` with every node it
    /// completes (and stops at the first error `each` returns).
    pub fn page<E>(
        &mut self,
        addr: u32,
        flash: &[u8],
        mut each: impl FnMut(Partial) -> Result<(), E>,
    ) -> Result<(), E> {
        for (f, at, body) in frags(flash) {
            let loc = (addr, at as u16, f.len);
            // A segment's first page names the checkpoint; it may fall between two
            // fragments of a node that crosses into the segment, and does not cut it.
            if f.kind == NodeKind::SegmentInfo {
                continue;
            }
            // Continue the node in progress, or start one (dropping a node cut short).
            let continues = self.partial.as_ref().is_some_and(|p| {
                (p.head.kind, p.head.key, p.head.key2, p.head.version) == (f.kind, f.key, f.key2, f.version)
            });
            if !continues {
                self.lost_page();
                self.partial = Some(Partial { head: f, payload: Vec::new(), frags: Vec::new() });
            }
            let p = self.partial.as_mut().expect("set above");
            p.payload.extend_from_slice(body);
            p.frags.push(loc);
            if f.flags & FLAG_LAST != 0 {
                let done = self.partial.take().expect("in progress");
                if done.payload.len() == done.head.total as usize {
                    each(done)?;
                } else {
                    self.cut += 1;
                }
            }
        }
        Ok(())
    }
}
