//! The heap's journal records (FORMAT.md section 9, "Journal records"): a kind byte, the
//! transaction id, a body. One encoder and one decoder per kind, side by side.

use bitmend_code::le::{Put, Reader};

use crate::alloc::Ptr;

/// The journal tag of the heap's records.
pub(crate) const TAG: u16 = 0x4854;

/// A record's kind (its first byte).
pub(crate) mod kind {
    /// Read, not written: a transaction's first record is its begin.
    pub const BEGIN: u8 = 1;
    pub const UNDO: u8 = 2;
    pub const ALLOC: u8 = 3;
    pub const FREE: u8 = 4;
    pub const POINTER: u8 = 5;
    pub const COMMIT: u8 = 6;
    pub const FORMAT: u8 = 7;
    /// The old bytes of several ranges, written together (pool version 3).
    pub const UNDO_RANGES: u8 = 8;
}

/// Bytes of a record's fixed part: kind and transaction id.
pub(crate) const HEAD: usize = 9;

/// Bytes of one range in a checksummed commit record: offset and length.
const RANGE: usize = 12;

/// What a checksummed commit record vouches for: the CRC-32C of the bytes of every range the
/// transaction wrote in place, in order, as they were when it committed. Such a record is
/// made durable by the same fence as those writes (one fence fewer per transaction), so a
/// crash can keep the record and lose some of them; recovery then finds the CRC wrong and
/// rolls the transaction back (its undo records were fenced before any write in place).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Written {
    pub crc: u32,
    pub ranges: Vec<(u64, u32)>,
}

impl Written {
    /// The CRC of `ranges` of `bytes` (ranges outside `bytes` read as empty: a record that
    /// names them cannot match, and is not trusted).
    pub fn crc_of(bytes: &[u8], ranges: &[(u64, u32)]) -> u32 {
        let mut crc = 0;
        for &(at, len) in ranges {
            let end = at.saturating_add(len as u64);
            if end <= bytes.len() as u64 {
                crc = bitmend_code::crc::crc32c_append(crc, &bytes[at as usize..end as usize]);
            }
        }
        crc
    }

    /// Whether `bytes` hold what the record vouches for.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        let inside = self.ranges.iter().all(|&(at, len)| at.saturating_add(len as u64) <= bytes.len() as u64);
        inside && Written::crc_of(bytes, &self.ranges) == self.crc
    }
}

/// A journal record of the heap, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rec {
    Begin,
    /// The old bytes of one range or more, in the order they were logged.
    Undo(Vec<(u64, Vec<u8>)>),
    Alloc {
        p: Ptr,
        len: u64,
    },
    Free(Ptr),
    Pointer {
        slot: u64,
        old: Ptr,
        new: Ptr,
    },
    /// `None`: a commit fenced after the writes it ends (they are durable if it is).
    Commit(Option<Written>),
    Format {
        run: u32,
        class: u8,
        runs: u32,
    },
}

/// Starts a record of `kind` for transaction `id` in `rec` (emptied first).
pub(crate) fn start(rec: &mut Vec<u8>, kind: u8, id: u64) {
    rec.clear();
    rec.put_u8(kind);
    rec.put_u64(id);
}

/// A checksummed commit record's body.
pub(crate) fn put_written(rec: &mut Vec<u8>, w: &Written) {
    rec.put_u32(w.crc);
    for &(at, len) in &w.ranges {
        rec.put_u64(at);
        rec.put_u32(len);
    }
    debug_assert_eq!(decode(rec).map(|(_, r)| r), Some(Rec::Commit(Some(w.clone()))), "a commit reads back");
}

/// The most ranges a checksummed commit record lists (more: a fenced commit).
pub(crate) const MAX_RANGES: usize = 64;

/// Decodes a heap record: (transaction, what); `None` for bytes that are not one.
pub(crate) fn decode(b: &[u8]) -> Option<(u64, Rec)> {
    let mut r = Reader::new(b);
    let k = r.u8()?;
    let id = r.u64()?;
    let rec = match k {
        kind::BEGIN => Rec::Begin,
        kind::UNDO => Rec::Undo(vec![(r.u64()?, r.rest().to_vec())]),
        kind::UNDO_RANGES => Rec::Undo(decode_ranges(r.rest())?),
        kind::ALLOC => Rec::Alloc { p: Ptr(r.u64()?), len: r.u64()? },
        kind::FREE => Rec::Free(Ptr(r.u64()?)),
        kind::POINTER => Rec::Pointer { slot: r.u64()?, old: Ptr(r.u64()?), new: Ptr(r.u64()?) },
        kind::COMMIT => Rec::Commit(decode_written(r.rest())?),
        kind::FORMAT => Rec::Format { run: r.u32()?, class: r.u8()?, runs: r.u32()? },
        _ => return None,
    };
    Some((id, rec))
}

/// Bytes of a range's fixed part in an undo record of several: offset and length.
pub(crate) const UNDO_RANGE: usize = 12;

/// Puts the range of `len` bytes at `at` of `bytes` into an undo record of several.
pub(crate) fn put_undo_range(rec: &mut Vec<u8>, bytes: &[u8], at: u64, len: usize) {
    rec.put_u64(at);
    rec.put_u32(len as u32);
    rec.put_bytes(&bytes[at as usize..at as usize + len]);
}

/// The ranges of an undo record of several: each u64 offset, u32 length, the old bytes.
fn decode_ranges(body: &[u8]) -> Option<Vec<(u64, Vec<u8>)>> {
    let mut r = Reader::new(body);
    let mut out = Vec::new();
    while !r.is_empty() {
        let at = r.u64()?;
        let len = r.u32()? as usize;
        out.push((at, r.take(len)?.to_vec()));
    }
    (!out.is_empty()).then_some(out)
}

/// A commit body: empty (fenced), or a CRC and whole ranges.
fn decode_written(body: &[u8]) -> Option<Option<Written>> {
    if body.is_empty() {
        return Some(None);
    }
    if body.len() < 4 || !(body.len() - 4).is_multiple_of(RANGE) {
        return None;
    }
    let mut r = Reader::new(body);
    let crc = r.u32()?;
    let mut ranges = Vec::with_capacity((body.len() - 4) / RANGE);
    while !r.is_empty() {
        ranges.push((r.u64()?, r.u32()?));
    }
    Some(Some(Written { crc, ranges }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_reads_back_with_and_without_its_checksum() {
        let mut rec = Vec::new();
        start(&mut rec, kind::COMMIT, 7);
        assert_eq!(decode(&rec), Some((7, Rec::Commit(None))));
        let w = Written { crc: 0xdead_beef, ranges: vec![(4096, 55), (8192, 16)] };
        put_written(&mut rec, &w);
        assert_eq!(decode(&rec), Some((7, Rec::Commit(Some(w)))));
        // A body cut inside a range is not a commit.
        assert_eq!(decode(&rec[..rec.len() - 3]), None);
    }

    #[test]
    fn undo_records_of_one_range_and_of_several_read_back() {
        let bytes: Vec<u8> = (0..200u8).collect();
        let mut rec = Vec::new();
        start(&mut rec, kind::UNDO, 3);
        rec.put_u64(10);
        rec.put_bytes(&bytes[10..15]);
        assert_eq!(decode(&rec), Some((3, Rec::Undo(vec![(10, bytes[10..15].to_vec())]))));
        start(&mut rec, kind::UNDO_RANGES, 4);
        put_undo_range(&mut rec, &bytes, 2, 6);
        put_undo_range(&mut rec, &bytes, 150, 40);
        let want = vec![(2, bytes[2..8].to_vec()), (150, bytes[150..190].to_vec())];
        assert_eq!(decode(&rec), Some((4, Rec::Undo(want))));
        // Cut inside a range, or with no range, it is not a record.
        assert_eq!(decode(&rec[..rec.len() - 1]), None);
        assert_eq!(decode(&rec[..HEAD]), None);
    }

    #[test]
    fn a_checksum_catches_one_lost_line() {
        let mut bytes = vec![0u8; 1 << 12];
        bytes[100..155].fill(7);
        bytes[3000..3016].fill(9);
        let ranges = vec![(100, 55), (3000, 16)];
        let w = Written { crc: Written::crc_of(&bytes, &ranges), ranges };
        assert!(w.matches(&bytes));
        bytes[3008..3016].fill(0);
        assert!(!w.matches(&bytes));
        // A range past the region never matches.
        let past = Written { crc: 0, ranges: vec![(4090, 16)] };
        assert!(!past.matches(&bytes));
    }
}
