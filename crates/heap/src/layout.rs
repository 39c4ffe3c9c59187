//! The pool's persistent bytes (docs/FORMAT.md section 9): after the journal (an nvlog at
//! offset 0), a pool header page with two superblock copies and the root slot, then runs of
//! [`RUN`] bytes. A run starts with a 64-byte run header naming its size class; its blocks
//! follow, each starting with a 16-byte block header (NVMalloc's: state, size, and a checksum
//! over state, size and location).

use bitmend_code::byte_enum;
use bitmend_code::crc::crc32c;
use bitmend_code::le;

use crate::heal::StripeShape;
use crate::HeapError;

/// Bytes per run.
pub const RUN: u64 = 256 << 10;
/// Bytes of a run header (one cache line).
pub const RUN_HEADER: u64 = 64;
/// Bytes of a block header.
pub const BLOCK_HEADER: u64 = 16;
/// Bytes of the pool header page that precedes the first run.
pub const POOL_HEADER: u64 = 4096;
/// Size classes: class `c` (1 to 11) has blocks of `64 << (c - 1)` bytes; class 12, the
/// page class (version 7 on), blocks of [`PAGE_CLASS_SIZE`] bytes.
pub const CLASSES: u8 = 12;
/// The page class: a 4 KiB page with its block header and a trailer of up to 48 bytes (an
/// NVRAM tier's dirty page and its CRC and owner), which the power-of-two classes would
/// put in an 8 KiB block. A run holds 63 of them, to its last byte.
pub const PAGE_CLASS: u8 = 12;
pub const PAGE_CLASS_SIZE: u64 = 4096 + 64;
/// The classes in order of size.
const BY_SIZE: [u8; CLASSES as usize] = [1, 2, 3, 4, 5, 6, 7, PAGE_CLASS, 8, 9, 10, 11];
/// The pool format this build writes. Version 2 adds checksummed commit records and the
/// key-value store's sharded count, version 3 slotted store nodes and undo records of several
/// ranges, version 4 block headers of two words checked apart, which can link a block to the
/// slot that points at it (FORMAT.md section 9), version 5 stripes (version 4 stays a pool
/// without), version 6 line checks over the stripes, and version 7 the page class, with
/// stripes or without (their two bytes zero), version 8 a third superblock copy in the
/// region's last page, far from the header page that holds the other two (a lost header
/// page is rebuilt from its stripe, whose shape that copy gives). This build reads versions
/// 1 to 7 too, and
/// marks a version 1 or 2 pool version 3 when it opens it, before it writes a record or a
/// node that an older reader would misread. A pool keeps the version it was made with
/// otherwise: only pools made as version 7 or later get runs of the page class.
pub const HEAP_VERSION: u32 = 8;
/// The first version with the superblock copy in the region's last page.
pub const HEAP_VERSION_FAR_COPY: u32 = 8;
/// The first version whose runs may be of the page class.
pub const HEAP_VERSION_PAGE_CLASS: u32 = 7;
/// Stripes without line checks: read and written as they are (a store's old bytes are not
/// checked first).
pub const HEAP_VERSION_UNCHECKED: u32 = 5;
/// The version an older pool is marked with at open (its headers keep their layout).
pub const HEAP_VERSION_UPGRADED: u32 = 3;
/// The oldest pool format this build reads.
pub const HEAP_VERSION_MIN: u32 = 1;

const MAGIC: [u8; 8] = *b"BMHEAP\0\0";
const RUN_MAGIC: [u8; 4] = *b"BMRN";

/// Block bytes of class `c`, header included.
pub fn class_size(c: u8) -> u64 {
    debug_assert!((1..=CLASSES).contains(&c));
    if c == PAGE_CLASS {
        PAGE_CLASS_SIZE
    } else {
        64 << (c - 1)
    }
}

/// The smallest class whose blocks hold `len` payload bytes (the page class among them if
/// `page_class`: the pool's version has it); `None` past the largest (a span).
pub fn class_for(len: u64, page_class: bool) -> Option<u8> {
    BY_SIZE
        .iter()
        .copied()
        .filter(|&c| page_class || c != PAGE_CLASS)
        .find(|&c| class_size(c) - BLOCK_HEADER >= len)
}

/// Where the pool superblock's fields are (FORMAT.md section 9, "Pool superblock").
mod superblock_at {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const RUN: usize = 12;
    pub const FIRST_RUN: usize = 16;
    pub const RUNS: usize = 24;
    pub const JOURNAL: usize = 28;
    pub const POOL_ID: usize = 32;
    /// Version 5: data and parity pages per stripe.
    pub const STRIPE_K: usize = 40;
    pub const STRIPE_M: usize = 41;
    pub const CLOSED: usize = 42;
    /// CRC-32C of the bytes before it.
    pub const CRC: usize = 60;
    pub const LEN: usize = 64;
}

/// The pool's shape and identity, in two copies at the start of the pool header page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    /// Where the first run starts, and how many there are.
    pub first_run: u64,
    pub runs: u32,
    /// Bytes the journal occupies from offset 0 (its footprint).
    pub journal: u32,
    pub pool_id: u64,
    /// Version 5: the stripes of parity and signatures over the pages (FORMAT.md section 9,
    /// "Stripes"); older pools have none.
    pub shape: Option<StripeShape>,
    /// Version 6: the pool was closed with every store fenced, its parity and signatures
    /// with it ([`crate::Pool::close`]); cleared at open before anything is stored.
    pub closed: bool,
}

impl Superblock {
    pub fn encode(&self) -> [u8; 64] {
        use superblock_at as at;
        let mut b = [0u8; at::LEN];
        b[at::MAGIC..at::MAGIC + 8].copy_from_slice(&MAGIC);
        le::put_u32(&mut b, at::VERSION, self.version);
        le::put_u32(&mut b, at::RUN, RUN as u32);
        le::put_u64(&mut b, at::FIRST_RUN, self.first_run);
        le::put_u32(&mut b, at::RUNS, self.runs);
        le::put_u32(&mut b, at::JOURNAL, self.journal);
        le::put_u64(&mut b, at::POOL_ID, self.pool_id);
        if let Some(shape) = self.shape {
            debug_assert!(self.version >= 5, "only version 5 and 6 pools have stripes");
            b[at::STRIPE_K] = shape.k;
            b[at::STRIPE_M] = shape.m;
        }
        if self.closed {
            debug_assert!(self.version > HEAP_VERSION_UNCHECKED, "only version 6 pools are marked closed");
            b[at::CLOSED] = 1;
        }
        let crc = crc32c(&b[..at::CRC]);
        le::put_u32(&mut b, at::CRC, crc);
        debug_assert_eq!(Superblock::decode(&b).ok(), Some(*self), "a superblock reads back as written");
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, HeapError> {
        use superblock_at as at;
        let not = |why: &str| HeapError::NotAPool { why: why.into() };
        if b.len() < at::LEN || b[at::MAGIC..at::MAGIC + 8] != MAGIC {
            return Err(not("no pool magic after the journal"));
        }
        if le::get_u32(b, at::CRC) != crc32c(&b[..at::CRC]) {
            return Err(not("pool superblock checksum mismatch"));
        }
        let version = le::get_u32(b, at::VERSION);
        if !(HEAP_VERSION_MIN..=HEAP_VERSION).contains(&version) {
            return Err(HeapError::Version { found: version, supported: HEAP_VERSION });
        }
        if le::get_u32(b, at::RUN) as u64 != RUN {
            return Err(not("a run size this build does not know"));
        }
        Ok(Superblock {
            version,
            first_run: le::get_u64(b, at::FIRST_RUN),
            runs: le::get_u32(b, at::RUNS),
            journal: le::get_u32(b, at::JOURNAL),
            pool_id: le::get_u64(b, at::POOL_ID),
            shape: match (version, b[at::STRIPE_K]) {
                (..=4, _) | (HEAP_VERSION_PAGE_CLASS.., 0) => None,
                _ => Some(StripeShape { k: b[at::STRIPE_K], m: b[at::STRIPE_M] }.check()?),
            },
            closed: version > HEAP_VERSION_UNCHECKED && b[at::CLOSED] == 1,
        })
    }

    /// How this pool's block headers are laid out.
    pub fn header_layout(&self) -> HeaderLayout {
        match self.version {
            ..=3 => HeaderLayout::Whole,
            _ => HeaderLayout::Words,
        }
    }
}

/// How a pool's block headers are laid out (FORMAT.md section 9, "Block header").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderLayout {
    /// Versions 1 to 3: one CRC over the whole header, the location stored.
    Whole,
    /// Version 4: two 8-byte words, each with a check of its own (the location in both), so
    /// that a crash tearing a header between its words leaves two words that each read (an
    /// aligned 8-byte store is never torn), and a state change written as one word is atomic.
    Words,
}

byte_enum! {
    /// What a run holds (a run header's byte 4).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum RunKind {
        /// Blocks of one size class (the class is byte 5).
        Blocks = 1,
        /// The first run of a span: one block over `span` runs, for objects past the largest
        /// class (the later runs are its payload, without headers).
        SpanHead = 2,
    }
}

/// Where a run header's fields are (FORMAT.md section 9, "Run header").
mod run_at {
    pub const MAGIC: usize = 0;
    pub const KIND: usize = 4;
    pub const CLASS: usize = 5;
    /// Blocks: 0. Span head: the runs in the span.
    pub const ARG: usize = 8;
    pub const INDEX: usize = 12;
    pub const POOL_ID: usize = 16;
    pub const CRC: usize = 60;
}

/// A run header: what run `index` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunHeader {
    pub kind: RunKind,
    /// The size class (blocks) or 0 (spans).
    pub class: u8,
    pub arg: u32,
}

impl RunHeader {
    pub fn encode(&self, index: u32, pool_id: u64) -> [u8; RUN_HEADER as usize] {
        let mut b = [0u8; RUN_HEADER as usize];
        b[run_at::MAGIC..run_at::MAGIC + 4].copy_from_slice(&RUN_MAGIC);
        b[run_at::KIND] = self.kind as u8;
        b[run_at::CLASS] = self.class;
        le::put_u32(&mut b, run_at::ARG, self.arg);
        le::put_u32(&mut b, run_at::INDEX, index);
        le::put_u64(&mut b, run_at::POOL_ID, pool_id);
        let crc = crc32c(&b[..run_at::CRC]);
        le::put_u32(&mut b, run_at::CRC, crc);
        debug_assert_eq!(RunHeader::decode(&b, index, pool_id), Ok(Some(*self)), "a run header reads back");
        b
    }

    /// `Ok(None)` for an unassigned run (all zeros); `Err` says which check failed.
    pub fn decode(b: &[u8], index: u32, pool_id: u64) -> Result<Option<RunHeader>, HeaderFault> {
        if bitmend_code::le::is_zero(b) {
            return Ok(None);
        }
        if le::get_u32(b, run_at::CRC) != crc32c(&b[..run_at::CRC]) || b[..4] != RUN_MAGIC {
            return Err(HeaderFault::Checksum);
        }
        if le::get_u32(b, run_at::INDEX) != index || le::get_u64(b, run_at::POOL_ID) != pool_id {
            return Err(HeaderFault::Misplaced);
        }
        let kind = RunKind::from_u8(b[run_at::KIND]).ok_or(HeaderFault::Contents)?;
        let class = b[run_at::CLASS];
        let fits = match kind {
            RunKind::Blocks => (1..=CLASSES).contains(&class),
            RunKind::SpanHead => class == 0,
        };
        if !fits {
            return Err(HeaderFault::Contents);
        }
        Ok(Some(RunHeader { kind, class, arg: le::get_u32(b, run_at::ARG) }))
    }
}

byte_enum! {
    /// A block's state (a block header's byte 0).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum BlockState {
        Allocated = 1,
        Free = 2,
        /// Version 4: allocated if the pointer slot the header names points at the block,
        /// else free (an allocation into a slot, made without the journal: see
        /// `Pool::alloc_into`).
        Linked = 3,
    }
}

/// Where a block header's fields are (FORMAT.md section 9, "Block header").
mod block_at {
    pub const STATE: usize = 0;
    pub const CLASS: usize = 1;
    pub const ALLOCATIONS: usize = 2;
    pub const LEN: usize = 4;
    pub const LOCATION: usize = 8;
    pub const CRC: usize = 12;
}

/// A block header: NVMalloc's state, size and checksum, with the block's location (so a
/// header copied to another block is told from a damaged one) and how often it was allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub state: BlockState,
    /// The run's class, or 0 for a span's block.
    pub class: u8,
    /// Times the block was allocated (saturating): its wear.
    pub allocations: u16,
    /// Payload bytes asked for (allocated), else 0.
    pub len: u32,
    /// Version 4: the slot a linked block was allocated into, as its offset / 8 (0: none).
    pub link: u32,
}

/// Which check a header failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderFault {
    /// Its checksum does not match its bytes (a wild write, worn cells).
    Checksum,
    /// Whole, but made for another place (a header or block copied where it does not belong).
    Misplaced,
    /// Whole and in place, but saying something impossible (a state, class or size no
    /// writer makes).
    Contents,
}

impl std::fmt::Display for HeaderFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HeaderFault::Checksum => "checksum mismatch",
            HeaderFault::Misplaced => "a header made for another place",
            HeaderFault::Contents => "impossible contents",
        })
    }
}

/// The location field of the block at `offset`: its offset in 16-byte units (low 32 bits).
fn location(offset: u64) -> u32 {
    (offset / 16) as u32
}

fn block_crc(b: &[u8], pool_id: u64) -> u32 {
    bitmend_code::crc::crc32c_append(crc32c(&b[..block_at::CRC]), &pool_id.to_le_bytes())
}

/// Where a version 4 header's fields are: word 0 (bytes 0..8) is state, class, length and
/// its CRC; word 1 (bytes 8..16) the link (or a span's length), the allocations and its check.
mod word_at {
    pub const STATE: usize = 0;
    pub const CLASS: usize = 1;
    pub const LEN: usize = 2;
    pub const CRC: usize = 4;
    pub const LINK: usize = 8;
    pub const ALLOCATIONS: usize = 12;
    pub const CHECK: usize = 14;
}

/// Word 0's length field for "the length is in word 1" (a span's block).
const LEN_IN_WORD_1: u16 = u16::MAX;

/// The check of a version 4 header word: CRC-32C of its fields, then of the header's offset,
/// the pool id and the word's number (so that neither word reads as the other, nor as any
/// other block's).
fn word_crc(fields: &[u8], offset: u64, pool_id: u64, word: u8) -> u32 {
    let mut b = [0u8; 6 + 8 + 8 + 1];
    let n = fields.len();
    debug_assert!(n <= 6);
    b[..n].copy_from_slice(fields);
    b[n..n + 8].copy_from_slice(&offset.to_le_bytes());
    b[n + 8..n + 16].copy_from_slice(&pool_id.to_le_bytes());
    b[n + 16] = word;
    crc32c(&b[..n + 17])
}

/// The length a block's header records, unchecked (a fast path for bounds; `None` for the
/// "whole block" mark of objects past 32 bits). Loads of a damaged header can only shrink
/// what a caller may touch: callers clamp it to the block's capacity.
pub fn recorded_len(bytes: &[u8], header: u64, layout: HeaderLayout) -> Option<u64> {
    let at = header as usize;
    let len = match layout {
        HeaderLayout::Whole => le::get_u32(bytes, at + block_at::LEN),
        HeaderLayout::Words => match le::get_u16(bytes, at + word_at::LEN) {
            LEN_IN_WORD_1 => le::get_u32(bytes, at + word_at::LINK),
            short => short as u32,
        },
    };
    (len != u32::MAX).then_some(len as u64)
}

impl BlockHeader {
    /// The header of the block at `offset` of pool `pool_id`.
    pub fn encode(&self, offset: u64, pool_id: u64, layout: HeaderLayout) -> [u8; BLOCK_HEADER as usize] {
        let b = match layout {
            HeaderLayout::Whole => self.encode_whole(offset, pool_id),
            HeaderLayout::Words => self.encode_words(offset, pool_id),
        };
        debug_assert_eq!(
            BlockHeader::decode(&b, offset, pool_id, layout),
            Ok(*self),
            "a block header reads back"
        );
        b
    }

    fn encode_whole(&self, offset: u64, pool_id: u64) -> [u8; BLOCK_HEADER as usize] {
        debug_assert!(self.state != BlockState::Linked && self.link == 0, "version 4 only");
        let mut b = [0u8; BLOCK_HEADER as usize];
        b[block_at::STATE] = self.state as u8;
        b[block_at::CLASS] = self.class;
        le::put_u16(&mut b, block_at::ALLOCATIONS, self.allocations);
        le::put_u32(&mut b, block_at::LEN, self.len);
        le::put_u32(&mut b, block_at::LOCATION, location(offset));
        let crc = block_crc(&b, pool_id);
        le::put_u32(&mut b, block_at::CRC, crc);
        b
    }

    fn encode_words(&self, offset: u64, pool_id: u64) -> [u8; BLOCK_HEADER as usize] {
        use word_at as at;
        let short = self.len < LEN_IN_WORD_1 as u32;
        debug_assert!(short || self.link == 0, "a span's block is never linked");
        let mut b = [0u8; BLOCK_HEADER as usize];
        b[at::STATE] = self.state as u8;
        b[at::CLASS] = self.class;
        le::put_u16(&mut b, at::LEN, if short { self.len as u16 } else { LEN_IN_WORD_1 });
        let crc = word_crc(&b[..at::CRC], offset, pool_id, 0);
        le::put_u32(&mut b, at::CRC, crc);
        le::put_u32(&mut b, at::LINK, if short { self.link } else { self.len });
        le::put_u16(&mut b, at::ALLOCATIONS, self.allocations);
        let check = word_crc(&b[at::LINK..at::CHECK], offset, pool_id, 1) as u16;
        le::put_u16(&mut b, at::CHECK, check);
        b
    }

    pub fn decode(
        b: &[u8],
        offset: u64,
        pool_id: u64,
        layout: HeaderLayout,
    ) -> Result<BlockHeader, HeaderFault> {
        match layout {
            HeaderLayout::Whole => Self::decode_whole(b, offset, pool_id),
            HeaderLayout::Words => Self::decode_words(b, offset, pool_id),
        }
    }

    fn decode_whole(b: &[u8], offset: u64, pool_id: u64) -> Result<BlockHeader, HeaderFault> {
        if le::get_u32(b, block_at::CRC) != block_crc(b, pool_id) {
            return Err(HeaderFault::Checksum);
        }
        if le::get_u32(b, block_at::LOCATION) != location(offset) {
            return Err(HeaderFault::Misplaced);
        }
        let state = BlockState::from_u8(b[block_at::STATE])
            .filter(|&s| s != BlockState::Linked)
            .ok_or(HeaderFault::Contents)?;
        Ok(BlockHeader {
            state,
            class: b[block_at::CLASS],
            allocations: le::get_u16(b, block_at::ALLOCATIONS),
            len: le::get_u32(b, block_at::LEN),
            link: 0,
        })
    }

    /// A version 4 header: both words must pass their checks (a header copied from another
    /// place fails them too: the location is in both). Each word reads alone, so a header
    /// torn between them reads as its old state or its new one (see `Pool::alloc_into`).
    fn decode_words(b: &[u8], offset: u64, pool_id: u64) -> Result<BlockHeader, HeaderFault> {
        use word_at as at;
        if le::get_u32(b, at::CRC) != word_crc(&b[..at::CRC], offset, pool_id, 0)
            || le::get_u16(b, at::CHECK) != word_crc(&b[at::LINK..at::CHECK], offset, pool_id, 1) as u16
        {
            return Err(HeaderFault::Checksum);
        }
        let state = BlockState::from_u8(b[at::STATE]).ok_or(HeaderFault::Contents)?;
        let short = le::get_u16(b, at::LEN);
        let spill = le::get_u32(b, at::LINK);
        if short == LEN_IN_WORD_1 && state == BlockState::Linked {
            return Err(HeaderFault::Contents);
        }
        let (len, link) = match short {
            LEN_IN_WORD_1 => (spill, 0),
            _ => (short as u32, spill),
        };
        Ok(BlockHeader {
            state,
            class: b[at::CLASS],
            allocations: le::get_u16(b, at::ALLOCATIONS),
            len,
            link,
        })
    }

    /// Version 4: word 0 alone (bytes 0..8) of this header, for a state change written as
    /// one aligned 8-byte store (word 1 unchanged).
    pub fn word_0(&self, offset: u64, pool_id: u64) -> [u8; 8] {
        self.encode_words(offset, pool_id)[..8].try_into().expect("8 bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_64_bytes_to_64_kib() {
        assert_eq!((class_size(1), class_size(11)), (64, 64 << 10));
        for page_class in [false, true] {
            assert_eq!(class_for(0, page_class), Some(1));
            assert_eq!(class_for(48, page_class), Some(1));
            assert_eq!(class_for(49, page_class), Some(2));
            assert_eq!(class_for(4080, page_class), Some(7));
            assert_eq!(class_for((64 << 10) - 16, page_class), Some(11));
            assert_eq!(class_for((64 << 10) - 15, page_class), None);
        }
        // A page and its trailer: 8 KiB blocks without the page class, 4160 bytes with it.
        assert_eq!(class_for(4081, false), Some(8));
        assert_eq!(class_for(4081, true), Some(PAGE_CLASS));
        assert_eq!(class_for(4096 + 48, true), Some(PAGE_CLASS));
        assert_eq!(class_for(4096 + 49, true), Some(8));
        // A run holds whole blocks after its header: the page class fills it exactly.
        assert_eq!((RUN - RUN_HEADER) / class_size(11), 3);
        assert_eq!(((RUN - RUN_HEADER) / PAGE_CLASS_SIZE, (RUN - RUN_HEADER) % PAGE_CLASS_SIZE), (63, 0));
        assert!(PAGE_CLASS_SIZE.is_multiple_of(64), "blocks start on cache lines");
    }

    #[test]
    fn a_block_header_tells_damage_from_a_misplaced_copy() {
        let h = BlockHeader { state: BlockState::Allocated, class: 3, allocations: 7, len: 200, link: 0 };
        let w = HeaderLayout::Whole;
        let b = h.encode(4096 + 64, 99, w);
        assert_eq!(BlockHeader::decode(&b, 4096 + 64, 99, w), Ok(h));
        // The same bytes at another block: whole, but not this block's.
        assert_eq!(BlockHeader::decode(&b, 4096 + 64 + 256, 99, w), Err(HeaderFault::Misplaced));
        // Another pool's header: its checksum (seeded with the pool id) fails.
        assert_eq!(BlockHeader::decode(&b, 4096 + 64, 98, w), Err(HeaderFault::Checksum));
        for bit in 0..128 {
            let mut bad = b;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(BlockHeader::decode(&bad, 4096 + 64, 99, w).is_err(), "bit {bit}");
        }
        assert_eq!(BlockHeader::decode(&[0u8; 16], 4096 + 64, 99, w), Err(HeaderFault::Checksum));
    }

    /// Version 4 headers: every bit flip, a copy from another block or pool, a zeroed header
    /// fail; a span's length past 16 bits lives in word 1; a header torn between its words
    /// (each word whole, from different writes) reads as one of its writes' states.
    #[test]
    fn a_two_word_header_checks_each_word_and_reads_torn_as_old_or_new() {
        let l = HeaderLayout::Words;
        let at = 4096 + 64;
        let free = BlockHeader { state: BlockState::Free, class: 3, allocations: 7, len: 0, link: 0 };
        let linked = BlockHeader { state: BlockState::Linked, allocations: 8, len: 200, link: 1234, ..free };
        let span =
            BlockHeader { state: BlockState::Allocated, class: 0, allocations: 1, len: 1 << 20, link: 0 };
        for h in [free, linked, span, BlockHeader { len: u32::MAX, ..span }] {
            let b = h.encode(at, 99, l);
            assert_eq!(BlockHeader::decode(&b, at, 99, l), Ok(h));
            assert_eq!(recorded_len(&b, 0, l), (h.len != u32::MAX).then_some(h.len as u64));
            assert_eq!(BlockHeader::decode(&b, at + 256, 99, l), Err(HeaderFault::Checksum), "a copy");
            assert_eq!(BlockHeader::decode(&b, at, 98, l), Err(HeaderFault::Checksum), "another pool");
            for bit in 0..128 {
                let mut bad = b;
                bad[bit / 8] ^= 1 << (bit % 8);
                assert!(BlockHeader::decode(&bad, at, 99, l).is_err(), "bit {bit}");
            }
        }
        assert_eq!(BlockHeader::decode(&[0u8; 16], at, 99, l), Err(HeaderFault::Checksum));
        let (old, new) = (free.encode(at, 99, l), linked.encode(at, 99, l));
        let torn = |a: &[u8; 16], b: &[u8; 16]| {
            let mut t = *a;
            t[8..].copy_from_slice(&b[8..]);
            BlockHeader::decode(&t, at, 99, l).unwrap()
        };
        // Word 0 new: linked, but to the old link (none); word 1 new: free.
        assert_eq!(torn(&new, &old), BlockHeader { allocations: 7, link: 0, ..linked });
        assert_eq!(torn(&old, &new), BlockHeader { allocations: 8, link: 1234, ..free });
        // Word 0 alone turns a linked header allocated.
        let mut settled = new;
        settled[..8].copy_from_slice(&BlockHeader { state: BlockState::Allocated, ..linked }.word_0(at, 99));
        assert_eq!(
            BlockHeader::decode(&settled, at, 99, l),
            Ok(BlockHeader { state: BlockState::Allocated, ..linked })
        );
    }

    #[test]
    fn run_headers_and_superblocks_read_back_and_refuse_damage() {
        let r = RunHeader { kind: RunKind::SpanHead, class: 0, arg: 5 };
        let b = r.encode(17, 3);
        assert_eq!(RunHeader::decode(&b, 17, 3), Ok(Some(r)));
        assert_eq!(RunHeader::decode(&b, 18, 3), Err(HeaderFault::Misplaced));
        assert_eq!(RunHeader::decode(&[0u8; 64], 17, 3), Ok(None));
        let mut bad = b;
        bad[5] = 1;
        assert_eq!(RunHeader::decode(&bad, 17, 3), Err(HeaderFault::Checksum));
        let sb = Superblock {
            version: HEAP_VERSION,
            first_run: 1 << 20,
            runs: 40,
            journal: 300_000,
            pool_id: 12,
            shape: Some(StripeShape { k: 8, m: 2 }),
            closed: true,
        };
        let e = sb.encode();
        assert_eq!(Superblock::decode(&e).unwrap(), sb);
        // Without stripes: their bytes zero.
        let plain = Superblock { shape: None, closed: false, ..sb };
        assert_eq!(Superblock::decode(&plain.encode()).unwrap(), plain);
        // Versions outside what this build reads are refused by number; version 1 reads.
        let with_version = |v: u32| {
            let mut b = e;
            b[8..12].copy_from_slice(&v.to_le_bytes());
            let crc = crc32c(&b[..60]);
            b[60..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        assert!(matches!(Superblock::decode(&with_version(9)), Err(HeapError::Version { found: 9, .. })));
        assert_eq!(
            Superblock::decode(&with_version(5)).unwrap(),
            Superblock { version: 5, closed: false, ..sb }
        );
        assert!(matches!(Superblock::decode(&with_version(0)), Err(HeapError::Version { found: 0, .. })));
        // Older versions have no stripes, whatever the bytes say.
        assert_eq!(
            Superblock::decode(&with_version(1)).unwrap(),
            Superblock { version: 1, shape: None, closed: false, ..sb }
        );
        assert_eq!(
            Superblock::decode(&with_version(2)).unwrap(),
            Superblock { version: 2, shape: None, closed: false, ..sb }
        );
    }
}
