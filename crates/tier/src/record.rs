//! The dirty state store's records (docs/FORMAT.md, "The NVRAM tier").
//!
//! Every record is one [`Entry`], tagged [`TAG`] in the log; its first byte says which:
//! - `1` page: ino u64, index u64, slot u64, crc u32 (29 bytes). Page `index` of `ino` is
//!   in the heap object at offset `slot`, with this CRC as of the record.
//! - `2` drop: ino u64, from u64 (17 bytes). The pages of `ino` from `from` on are gone (a
//!   truncate or an unlink).
//! - `3` checkout (1 byte). Everything recorded before is on flash.
//! - `4` drop range: ino u64, from u64, end u64 (25 bytes). The pages of `ino` in
//!   `from..end` are gone (a punched hole).
//! - `5` nodes: the file system's nodes of one operation, as its flash log would hold them
//!   (any length up to the log's largest record). The tier does not read them.
//! - `6` owner: fs id u64 (9 bytes). The file system whose dirty state follows; appended
//!   when the tier is made and after every checkout's trim, so it precedes any state.
//! - `7` run: ino u64, first u64, count u32, block u64 (29 bytes; version 3). Pages `first`
//!   to `first + count - 1` of `ino` are in one heap object at offset `block`: the pages back
//!   to back, then their trailers ([`crate::store`]'s run layout). `count` is 1 to
//!   [`MAX_RUN`]; any other count is refused.
//!
//! - `8` request nodes: request u64, then nodes (version 4). A nodes record made for the FUSE
//!   request with this unique: recovery reports the request done, so that a supervisor's
//!   new worker answers it again from the state instead of doing it twice.
//! - `9` requests: count u16, then that many request uniques u64 (version 4). Requests whose
//!   effect is in the state (on flash since a checkout); written after a checkout's trim.
//!
//! All integers little-endian. The log's own CRCs, signatures and parity cover the bytes.

use bitmend_code::le::{self, Put};

/// The log tag of the tier's records.
pub const TAG: u16 = 0x7D55;

const PAGE: u8 = 1;
const DROP: u8 = 2;
const CHECKOUT: u8 = 3;
const DROP_RANGE: u8 = 4;
const NODES: u8 = 5;
const OWNER: u8 = 6;
const RUN: u8 = 7;
const REQUEST_NODES: u8 = 8;
const REQUESTS: u8 = 9;

/// Where each record's fields are, after its kind byte (FORMAT.md, "The NVRAM tier").
mod at {
    /// Every record but checkout, nodes and owner: the inode first.
    pub const INO: usize = 1;
    /// page: the logical page, its slot, its CRC.
    pub const INDEX: usize = 9;
    pub const SLOT: usize = 17;
    pub const CRC: usize = 25;
    /// drop, drop range: the first page gone; drop range: the end.
    pub const FROM: usize = 9;
    pub const END: usize = 17;
    /// owner: the file system's id.
    pub const FS_ID: usize = 1;
    /// run: its first page, how many, the object holding them.
    pub const FIRST: usize = 9;
    pub const COUNT: usize = 17;
    pub const BLOCK: usize = 21;
    /// request nodes: the request, then the nodes; requests: the count, then the requests.
    pub const REQUEST: usize = 1;
    pub const REQUEST_NODES: usize = 9;
    pub const COUNT_OF_REQUESTS: usize = 1;
    pub const REQUEST_LIST: usize = 3;
}

/// The most requests one requests record lists.
pub const MAX_REQUESTS: usize = 1024;

/// The most pages one run record names: as many slots as fit a 256 KiB heap run.
pub const MAX_RUN: u32 = 63;

/// One record of the dirty state store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Page { ino: u64, index: u64, slot: u64, crc: u32 },
    Drop { ino: u64, from: u64 },
    Checkout,
    DropRange { ino: u64, from: u64, end: u64 },
    Nodes(Vec<u8>),
    Owner { fs_id: u64 },
    Run { ino: u64, first: u64, count: u32, block: u64 },
    RequestNodes { request: u64, nodes: Vec<u8> },
    Requests(Vec<u64>),
}

impl Entry {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(29);
        match *self {
            Entry::DropRange { ino, from, end } => {
                v.push(DROP_RANGE);
                v.put_u64(ino);
                v.put_u64(from);
                v.put_u64(end);
            }
            Entry::Owner { fs_id } => {
                v.push(OWNER);
                v.put_u64(fs_id);
            }
            Entry::Nodes(ref nodes) => {
                v.push(NODES);
                v.extend_from_slice(nodes);
            }
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
            Entry::RequestNodes { request, ref nodes } => {
                v.push(REQUEST_NODES);
                v.put_u64(request);
                v.extend_from_slice(nodes);
            }
            Entry::Requests(ref requests) => {
                assert!(requests.len() <= MAX_REQUESTS, "a requests record lists at most {MAX_REQUESTS}");
                v.push(REQUESTS);
                v.put_u16(requests.len() as u16);
                for &r in requests {
                    v.put_u64(r);
                }
            }
            Entry::Run { ino, first, count, block } => {
                v.push(RUN);
                v.put_u64(ino);
                v.put_u64(first);
                v.put_u32(count);
                v.put_u64(block);
            }
        }
        debug_assert_eq!(Entry::decode(&v).as_ref(), Some(self), "a record reads back");
        v
    }

    /// `None` for bytes that are no record of ours (the log vouched for them, so only a
    /// newer build's record could be: refused, never guessed at).
    pub fn decode(b: &[u8]) -> Option<Entry> {
        let u64_at = |at| le::get_u64(b, at);
        match (b.first()?, b.len()) {
            (&PAGE, 29) => Some(Entry::Page {
                ino: u64_at(at::INO),
                index: u64_at(at::INDEX),
                slot: u64_at(at::SLOT),
                crc: le::get_u32(b, at::CRC),
            }),
            (&DROP, 17) => Some(Entry::Drop { ino: u64_at(at::INO), from: u64_at(at::FROM) }),
            (&CHECKOUT, 1) => Some(Entry::Checkout),
            (&DROP_RANGE, 25) => {
                Some(Entry::DropRange { ino: u64_at(at::INO), from: u64_at(at::FROM), end: u64_at(at::END) })
            }
            (&NODES, _) => Some(Entry::Nodes(b[1..].to_vec())),
            (&OWNER, 9) => Some(Entry::Owner { fs_id: u64_at(at::FS_ID) }),
            (&RUN, 29) => {
                let (first, count) = (u64_at(at::FIRST), le::get_u32(b, at::COUNT));
                let valid = (1..=MAX_RUN).contains(&count) && first.checked_add(u64::from(count)).is_some();
                valid.then(|| Entry::Run { ino: u64_at(at::INO), first, count, block: u64_at(at::BLOCK) })
            }
            (&REQUEST_NODES, n) if n >= at::REQUEST_NODES => Some(Entry::RequestNodes {
                request: u64_at(at::REQUEST),
                nodes: b[at::REQUEST_NODES..].to_vec(),
            }),
            (&REQUESTS, n) if n >= at::REQUEST_LIST => {
                let count = usize::from(le::get_u16(b, at::COUNT_OF_REQUESTS));
                (count <= MAX_REQUESTS && n == at::REQUEST_LIST + 8 * count)
                    .then(|| Entry::Requests((0..count).map(|i| u64_at(at::REQUEST_LIST + 8 * i)).collect()))
            }
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
            Entry::DropRange { ino: 3, from: 2, end: 9 },
            Entry::Owner { fs_id: 0x1234_5678_9ABC },
            Entry::Run { ino: 5, first: 1 << 33, count: MAX_RUN, block: 1 << 30 },
            Entry::Requests(vec![2, 4, u64::MAX]),
        ] {
            let b = e.encode();
            assert_eq!(Entry::decode(&b), Some(e.clone()));
            assert_eq!(Entry::decode(&b[..b.len() - 1]), None, "{e:?} cut short");
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(Entry::decode(&longer), None, "{e:?} with a byte more");
        }
        // Nodes are the file system's bytes, any length, read back as they were.
        for nodes in [vec![], vec![7u8; 3000]] {
            let e = Entry::Nodes(nodes);
            assert_eq!(Entry::decode(&e.encode()), Some(e));
        }
        for (request, nodes) in [(0, vec![]), (u64::MAX, vec![5u8; 700])] {
            let e = Entry::RequestNodes { request, nodes };
            assert_eq!(Entry::decode(&e.encode()), Some(e));
        }
        assert_eq!(Entry::decode(&[REQUEST_NODES, 1, 2, 3]), None, "a request cut short");
        assert_eq!(Entry::decode(&Entry::Requests(vec![]).encode()), Some(Entry::Requests(vec![])));
        assert_eq!(Entry::decode(&[]), None);
        assert_eq!(Entry::decode(&[9; 29]), None);
        // A run of no pages, of more than a heap run holds, or past the last page: refused.
        for (first, count) in [(0, 0), (0, MAX_RUN + 1), (u64::MAX - 3, 4)] {
            let mut b = vec![RUN];
            b.put_u64(1);
            b.put_u64(first);
            b.put_u32(count);
            b.put_u64(4096);
            assert_eq!(Entry::decode(&b), None, "run of {count} from {first}");
        }
    }
}
