//! Round trips of the node payload decoders, for the fuzz targets: what a decoder accepts
//! encodes back to the very bytes it read (a decoder that took two spellings of one value
//! would let damage pass as data).

use crate::fs::node::{
    decode_dirent, decode_inode, decode_punch, decode_xattrs, encode_dirent, encode_inode, encode_punch,
    encode_xattrs, Frag, FRAG_HEADER,
};

/// Panics if bytes a decoder (picked by `which`) accepts do not encode back to themselves.
pub fn node_parts(which: u8, b: &[u8]) {
    match which % 5 {
        0 => {
            if let Ok(Some(f)) = Frag::decode(b) {
                let mut out = [0u8; FRAG_HEADER];
                f.encode(&mut out);
                assert_eq!(out[..], b[..FRAG_HEADER], "a fragment header");
            }
        }
        1 => {
            if let Some((a, target)) = decode_inode(7, b) {
                assert_eq!(encode_inode(&a, &target), b, "an inode");
            }
        }
        2 => {
            if let Some((child, name)) = decode_dirent(b) {
                assert_eq!(encode_dirent(child, &name), b, "a directory entry");
            }
        }
        3 => {
            if let Some(set) = decode_xattrs(b) {
                assert_eq!(encode_xattrs(&set), b, "extended attributes");
            }
        }
        _ => {
            if let Some(end) = decode_punch(b) {
                assert_eq!(encode_punch(end), b, "a punch");
            }
        }
    }
}
