//! The decoders alone, on raw bytes: the first byte picks one, the rest is its input. What
//! a decoder accepts must encode back to the same bytes (flash node parts) or to the same
//! entries (B+tree nodes), tier records to the same bytes.

/// Runs one decoder on `data`; always true (there is no image to open).
pub fn decoders(data: &[u8]) -> bool {
    let Some((&which, b)) = data.split_first() else { return true };
    match which % 3 {
        0 => bitmend_flashfs::fuzzing::node_parts(which / 3, b),
        1 => bitmend_heap::kv::fuzzing::node(b),
        _ => crate::tier::record(b),
    }
    true
}
