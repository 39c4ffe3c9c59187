//! The dirty state store's records (docs/FORMAT.md, "The NVRAM tier").
//!
//! Every record is one [`Entry`], tagged [`TAG`] in the log; its first byte says which:
//! - `1` page: ino u64, index u64, slot u64, crc u32 (29 bytes). Page `index` of `ino` is
//!   in the heap object at offset `slot`, with this CRC as of the record.
//! - `2` drop: ino u64, from u64 (17 bytes). The pages of `ino` from `from` on are gone (a
//!   truncate or an unlink).
//! - `3` checkout (1 byte). Everything recorded before is on flash.
//!
//! All integers little-endian. The log's own CRCs, signatures and parity cover the bytes.

use bitmend_code::le::{self, Put};

/// The log tag of the tier's records.
pub const TAG: u16 = 0x7D55;

const PAGE: u8 = 1;
const DROP: u8 = 2;
const CHECKOUT: u8 = 3;

/// One record of the dirty state store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Page { ino: u64, index: u64, slot: u64, crc: u32 },
    Drop { ino: u64, from: u64 },
    Checkout,
}

impl Entry {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(29);
        match *self {
            Entry::Page { ino, index, slot, crc } => {
                v.push(PAGE);
                v.put_u64(ino);
                v.put_u64(index);
                v.put_u64(slot);
                v.put_u32(crc);
            }
            Entry::Drop { ino, from } => {
                v.push(DROP);
                v.put_u64(ino);
                v.put_u64(from);
            }
            Entry::Checkout => v.push(CHECKOUT),
        }
        debug_assert_eq!(Entry::decode(&v), Some(*self), "a record reads back");
        v
    }

    /// `None` for bytes that are no record of ours (the log vouched for them, so only a
    /// newer build's record could be: refused, never guessed at).
    pub fn decode(b: &[u8]) -> Option<Entry> {
        match (b.first()?, b.len()) {
            (&PAGE, 29) => Some(Entry::Page {
                ino: le::get_u64(b, 1),
                index: le::get_u64(b, 9),
                slot: le::get_u64(b, 17),
                crc: le::get_u32(b, 25),
            }),
            (&DROP, 17) => Some(Entry::Drop { ino: le::get_u64(b, 1), from: le::get_u64(b, 9) }),
            (&CHECKOUT, 1) => Some(Entry::Checkout),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_and_anything_else_is_refused() {
        for e in [
            Entry::Page { ino: 7, index: u64::MAX, slot: 1 << 40, crc: 0xDEAD_BEEF },
            Entry::Drop { ino: 1, from: 0 },
            Entry::Checkout,
        ] {
            let b = e.encode();
            assert_eq!(Entry::decode(&b), Some(e));
            assert_eq!(Entry::decode(&b[..b.len() - 1]), None, "{e:?} cut short");
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(Entry::decode(&longer), None, "{e:?} with a byte more");
        }
        assert_eq!(Entry::decode(&[]), None);
        assert_eq!(Entry::decode(&[9; 29]), None);
    }
}
