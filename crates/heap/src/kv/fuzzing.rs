//! Round trips of the node decoders, for the fuzz targets: what they accept, packed again,
//! reads back as the same entries, and packing it once more changes nothing.

use super::entries::Entries;
use super::node::Node;

/// Panics if bytes accepted as a node do not round-trip.
pub fn node(b: &[u8]) {
    if let Some(e) = Entries::of(b).filter(Entries::fits) {
        let once = e.encode();
        let again = Entries::of(&once).expect("a packed node reads back");
        assert_eq!(again.len(), e.len(), "a packed node keeps its entries");
        for i in 0..e.len() {
            assert_eq!(again.key(i), e.key(i), "entry {i}'s key");
        }
        assert_eq!(again.encode(), once, "packing is a fixpoint");
    }
    if let Some(n) = Node::decode(b) {
        let bytes = n.encode();
        if bytes.len() <= b.len().max(super::node::NODE as usize) {
            assert_eq!(Node::decode(&bytes), Some(n), "a decoded node, encoded, decodes the same");
        }
    }
}
