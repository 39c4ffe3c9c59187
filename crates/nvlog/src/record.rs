//! Records inside a data chunk: a 12-byte header, then the payload.
//!
//! The header's CRC-32C covers its header fields and its payload, and is XORed with the
//! record's id folded to 32 bits, so a record copied to another place, torn by a crash, or
//! damaged in the medium never passes. (One CRC pass over contiguous bytes: the append path
//! is measured in nanoseconds.)
//! A zero header ends the records of a chunk; the rest of the chunk is zero.

use bitmend_code::crc::crc32c;
use bitmend_code::le;

/// Header bytes before the payload.
pub const HEADER: usize = 12;

/// Where a record header's fields are (FORMAT.md section 6, "Records").
mod header_at {
    pub const CHECK: usize = 0;
    pub const LEN: usize = 4;
    pub const TAG: usize = 8;
    pub const ZERO: usize = 10;
}
const PRESENT: u32 = 1 << 31;

/// A record found in a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    /// Offset of the header within the chunk.
    pub off: usize,
    pub tag: u16,
    pub len: usize,
}

impl Found {
    pub fn payload(&self) -> std::ops::Range<usize> {
        self.off + HEADER..self.off + HEADER + self.len
    }
}

/// The check of a record: CRC-32C of `fields_and_payload` (header bytes 4..12, then the
/// payload, contiguous) XOR the id folded to 32 bits.
fn check(id: u64, fields_and_payload: &[u8]) -> u32 {
    crc32c(fields_and_payload) ^ (id as u32) ^ ((id >> 32) as u32)
}

/// Writes the header and payload of the record `id` into `out` (cleared first). Header:
/// check u32, length | 1 << 31 u32, tag u16, zero u16.
pub(crate) fn encode(id: u64, tag: u16, payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.resize(HEADER, 0);
    le::put_u32(out, header_at::LEN, payload.len() as u32 | PRESENT);
    le::put_u16(out, header_at::TAG, tag);
    out.extend_from_slice(payload);
    let c = check(id, &out[header_at::LEN..]);
    le::put_u32(out, header_at::CHECK, c);
}

/// What is at offset `off` of a chunk whose first byte has id `chunk_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum At {
    Record(Found),
    /// A zero header, or no room for one: the chunk's records end here.
    End,
    /// Neither: damage, a torn append, or not a record boundary.
    Invalid,
}

pub(crate) fn at(chunk: &[u8], chunk_id: u64, off: usize) -> At {
    if off + HEADER > chunk.len() {
        return At::End;
    }
    let h = &chunk[off..off + HEADER];
    if le::is_zero(h) {
        return At::End;
    }
    let word = le::get_u32(h, header_at::LEN);
    let len = (word & !PRESENT) as usize;
    if word & PRESENT == 0 || le::get_u16(h, header_at::ZERO) != 0 || off + HEADER + len > chunk.len() {
        return At::Invalid;
    }
    let stored = le::get_u32(h, header_at::CHECK);
    if stored != check(chunk_id + off as u64, &chunk[off + header_at::LEN..off + HEADER + len]) {
        return At::Invalid;
    }
    At::Record(Found { off, tag: le::get_u16(h, header_at::TAG), len })
}

/// `n` rounded up to a multiple of `block` (a power of two).
pub(crate) fn align(n: usize, block: usize) -> usize {
    (n + block - 1) & !(block - 1)
}

/// The records of a chunk, from its start, as far as they are valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Chain {
    pub records: Vec<Found>,
    /// Where the next record would start (the chunk's tail).
    pub end: usize,
    /// The chain stopped at an invalid header rather than at a clean end.
    pub broken: bool,
    /// Every byte from `end` to the chunk's end is zero.
    pub clean_tail: bool,
}

pub(crate) fn chain(chunk: &[u8], chunk_id: u64, block: usize) -> Chain {
    let mut records = Vec::new();
    let mut off = 0;
    let broken = loop {
        match at(chunk, chunk_id, off) {
            At::Record(f) => {
                // The padding to the next record is zero as written: a stray byte there is
                // damage like any other (the chunk's signature, taken when it closes, from
                // what was written, counts those bytes too).
                let (end, next) = (off + HEADER + f.len, align(off + HEADER + f.len, block).min(chunk.len()));
                if !le::is_zero(&chunk[end..next]) {
                    break true;
                }
                records.push(f);
                off = next;
            }
            At::End => break false,
            At::Invalid => break true,
        }
    };
    let clean_tail = le::is_zero(&chunk[off..]);
    Chain { records, end: off, broken, clean_tail }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk_with(records: &[(u16, &[u8])], base: u64) -> (Vec<u8>, Vec<usize>) {
        let mut c = vec![0u8; 256];
        let mut off = 0;
        let mut offs = vec![];
        let mut buf = vec![];
        for (tag, p) in records {
            encode(base + off as u64, *tag, p, &mut buf);
            c[off..off + buf.len()].copy_from_slice(&buf);
            offs.push(off);
            off = align(off + buf.len(), 8);
        }
        (c, offs)
    }

    #[test]
    fn records_parse_back_and_damage_is_caught() {
        let (mut c, offs) = chunk_with(&[(1, b"hello"), (2, b""), (3, &[7; 40])], 1000);
        let ch = chain(&c, 1000, 8);
        assert_eq!(ch.records.len(), 3);
        assert_eq!(ch.records.iter().map(|r| r.off).collect::<Vec<_>>(), offs);
        assert_eq!(&c[ch.records[0].payload()], b"hello");
        assert!(!ch.broken && ch.clean_tail);
        // The id is part of the CRC: the same bytes at another id do not parse.
        assert_eq!(at(&c, 1008, 0), At::Invalid);
        // Any flipped bit in a record breaks the chain there.
        c[offs[2] + 20] ^= 4;
        let ch = chain(&c, 1000, 8);
        assert_eq!((ch.records.len(), ch.end, ch.broken), (2, offs[2], true));
        c[offs[2] + 20] ^= 4;
        // Garbage after the last record: the chain ends cleanly but the tail is not clean.
        c[200] = 1;
        let ch = chain(&c, 1000, 8);
        assert!(ch.broken || !ch.clean_tail);
    }
}
