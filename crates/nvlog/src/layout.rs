//! Where everything lives in the region, and the byte forms of the superblock, the segment
//! headers and the head slots (docs/FORMAT.md, "PRIMS log").

use bitmend_code::crc::crc32c;
use bitmend_code::le::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use bitmend_code::sig::{Sig64, Signer};

use crate::LogError;

/// The on-media version of the log layout this build writes (it reads 1 and 2 too).
pub const LOG_VERSION: u32 = 3;
/// Version 1: two superblock copies and one pair of head slots, in three pages.
pub const LOG_VERSION_TWO_COPIES: u32 = 1;
/// Version 3: chunks of whole pages start on a page, with the segment headers in pages of
/// their own, so that one lost 4 KiB page costs at most one chunk of a segment (before, a
/// page across a chunk boundary cost two, beyond a segment with m = 1).
pub const LOG_VERSION_PAGED_CHUNKS: u32 = 3;
/// The page the paged layout keeps chunks and headers apart by.
const PAGE: usize = 4096;

const MAGIC: [u8; 8] = *b"BMNVLOG\0";
/// Superblock copies, one page apart so that one stray write rarely hits both.
pub(crate) const SUPERBLOCK_A: usize = 0;
pub(crate) const SUPERBLOCK_B: usize = 4096;
/// Bytes of a superblock copy (the last 8 are its signature).
pub(crate) const SUPERBLOCK_SIZE: usize = 128;
/// Two head slots, a cache line each.
pub(crate) const HEAD_SLOTS: usize = 8192;
pub(crate) const HEAD_SLOT_SIZE: usize = 64;
/// Version 2: a third superblock copy after the head slots, so that each of the first three
/// pages holds a copy, and a copy of the head slots after the superblock in pages 0 and 1:
/// a log loses neither its shape nor its head with any two of those pages.
pub(crate) const SUPERBLOCK_C: usize = HEAD_SLOTS + 2 * HEAD_SLOT_SIZE;

/// Where a log of `version` keeps its superblock copies, the first read first.
pub(crate) fn superblock_copies(version: u32) -> &'static [usize] {
    if version == LOG_VERSION_TWO_COPIES {
        &[SUPERBLOCK_A, SUPERBLOCK_B]
    } else {
        &[SUPERBLOCK_A, SUPERBLOCK_B, SUPERBLOCK_C]
    }
}
/// Segments start here.
pub(crate) const SEGMENTS_START: usize = 12288;

/// The shape of a log, chosen at format time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Data chunks per segment.
    pub k: usize,
    /// Parity chunks per segment: a segment survives damage to any m of its chunks.
    pub m: usize,
    /// Bytes per chunk (a multiple of `block_size`; at most 131,008 so that the chunk
    /// signature detects every change of up to 4 words).
    pub chunk_size: usize,
    /// Records start on multiples of this (8 or more, a power of two).
    pub block_size: usize,
    /// Segments in the ring.
    pub segments: u32,
}

impl Default for LogConfig {
    /// 8 data + 2 parity chunks of 4 KiB; segments to be fitted to the region.
    fn default() -> Self {
        LogConfig { k: 8, m: 2, chunk_size: 4096, block_size: 8, segments: 0 }
    }
}

impl LogConfig {
    /// k data and m parity chunks of `chunk_size` bytes, 8-byte blocks.
    pub fn new(k: usize, m: usize, chunk_size: usize) -> LogConfig {
        LogConfig { k, m, chunk_size, block_size: 8, segments: 0 }
    }

    /// Bytes of region a log of this shape takes, as this build formats it.
    pub fn region_len(&self) -> usize {
        Layout::new(*self, LOG_VERSION).needed()
    }

    /// The same shape with as many segments as fit in `region_len` bytes.
    pub fn fit(mut self, region_len: usize) -> Result<LogConfig, LogError> {
        self.segments = 2;
        self.validate()?;
        let two = Layout::new(self, LOG_VERSION);
        let n = region_len.saturating_sub(two.needed() - 2 * two.stride) / two.stride;
        if n < 2 {
            return Err(LogError::RegionTooSmall { len: region_len, needed: two.needed() });
        }
        self.segments = n.min(u32::MAX as usize) as u32;
        Ok(self)
    }

    pub(crate) fn validate(&self) -> Result<(), LogError> {
        let bad = |why: String| Err(LogError::Config { why });
        if self.k == 0 || self.k + self.m > 255 {
            return bad(format!("k={} m={}: need k >= 1 and k + m <= 255", self.k, self.m));
        }
        if self.block_size < 8 || !self.block_size.is_power_of_two() || self.block_size > 4096 {
            return bad(format!("block size {} is not a power of two from 8 to 4096", self.block_size));
        }
        if self.chunk_size < 64
            || !self.chunk_size.is_multiple_of(self.block_size)
            || self.chunk_size > bitmend_code::sig::MAX_LEN
        {
            return bad(format!(
                "chunk size {} must be a multiple of the block size, from 64 to {} bytes",
                self.chunk_size,
                bitmend_code::sig::MAX_LEN
            ));
        }
        if self.segments < 2 {
            return bad(format!("{} segments: a ring needs at least 2", self.segments));
        }
        Ok(())
    }

    /// Chunks per segment.
    pub fn n(&self) -> usize {
        self.k + self.m
    }

    /// Record bytes a segment holds (its data chunks).
    pub fn segment_data(&self) -> u64 {
        (self.k * self.chunk_size) as u64
    }
}

/// Offsets of every structure, from the configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub cfg: LogConfig,
    /// Bytes of one segment-header copy (a multiple of 64).
    pub header_size: usize,
    /// Bytes from one segment to the next.
    pub stride: usize,
    /// Chunks on pages of their own (version 3, chunks of whole pages): each segment starts
    /// with a page that holds its header copy A at its start and the previous segment's
    /// copy B at its end; the last segment's copy B ends the page after the ring.
    paged: bool,
}

impl Layout {
    /// The layout of a log of `cfg` made by `version`.
    pub fn new(cfg: LogConfig, version: u32) -> Layout {
        let header_size = SegmentHeader::size(cfg.n());
        let paged = version >= LOG_VERSION_PAGED_CHUNKS
            && cfg.chunk_size.is_multiple_of(PAGE)
            && 2 * header_size <= PAGE;
        let chunks = cfg.n() * cfg.chunk_size;
        let stride = if paged { PAGE + chunks } else { 2 * header_size + chunks };
        Layout { cfg, header_size, stride, paged }
    }

    /// Region bytes the log needs.
    pub fn needed(&self) -> usize {
        SEGMENTS_START + self.cfg.segments as usize * self.stride + if self.paged { PAGE } else { 0 }
    }

    /// Header copy `copy` (0 before the chunks, 1 after them) of physical segment `p`.
    pub fn header(&self, p: usize, copy: usize) -> usize {
        let base = SEGMENTS_START + p * self.stride;
        match (copy, self.paged) {
            (0, _) => base,
            (_, true) => base + self.stride + PAGE - self.header_size,
            (_, false) => base + self.header_size + self.cfg.n() * self.cfg.chunk_size,
        }
    }

    /// Chunk `i` (data 0..k, then parity) of physical segment `p`.
    pub fn chunk(&self, p: usize, i: usize) -> usize {
        let headers = if self.paged { PAGE } else { self.header_size };
        SEGMENTS_START + p * self.stride + headers + i * self.cfg.chunk_size
    }

    /// All chunks of physical segment `p`, as one range.
    pub fn chunks(&self, p: usize) -> std::ops::Range<usize> {
        let s = self.chunk(p, 0);
        s..s + self.cfg.n() * self.cfg.chunk_size
    }

    /// The physical segment holding logical segment `seg`.
    pub fn physical(&self, seg: u64) -> usize {
        (seg % self.cfg.segments as u64) as usize
    }
}

/// Where the superblock's fields are (FORMAT.md section 6, "Superblock").
mod superblock_at {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const K: usize = 12;
    pub const M: usize = 14;
    pub const CHUNK: usize = 16;
    pub const BLOCK: usize = 20;
    pub const SEGMENTS: usize = 24;
    pub const HEADER: usize = 28;
    pub const STRIDE: usize = 32;
    pub const LOG_ID: usize = 40;
    pub const REGION_LEN: usize = 48;
    /// The signature of the bytes before it, at the copy's end.
    pub const SIG: usize = super::SUPERBLOCK_SIZE - 8;
}

/// Where a segment header's fields are (FORMAT.md section 6, "Segment header"); the CRC
/// follows the n signatures.
mod segment_at {
    pub const LOG_ID: usize = 0;
    pub const SEGMENT: usize = 8;
    pub const CLOSED: usize = 16;
    pub const SEALED: usize = 18;
    pub const SIGS: usize = 24;
    pub fn crc(n: usize) -> usize {
        SIGS + 8 * n
    }
}

/// Where a head slot's fields are (FORMAT.md section 6, "Head slot").
mod head_at {
    pub const LOG_ID: usize = 0;
    pub const SEQ: usize = 8;
    pub const HEAD: usize = 16;
    pub const CRC: usize = 24;
}

/// The superblock: the log's shape and identity, in two signed copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub version: u32,
    pub cfg: LogConfig,
    pub log_id: u64,
    pub region_len: u64,
}

impl Superblock {
    pub fn encode(&self, signer: &Signer<4>) -> [u8; SUPERBLOCK_SIZE] {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        use superblock_at as at;
        b[at::MAGIC..at::MAGIC + 8].copy_from_slice(&MAGIC);
        put_u32(&mut b, at::VERSION, self.version);
        put_u16(&mut b, at::K, self.cfg.k as u16);
        put_u16(&mut b, at::M, self.cfg.m as u16);
        put_u32(&mut b, at::CHUNK, self.cfg.chunk_size as u32);
        put_u32(&mut b, at::BLOCK, self.cfg.block_size as u32);
        put_u32(&mut b, at::SEGMENTS, self.cfg.segments);
        put_u32(&mut b, at::HEADER, SegmentHeader::size(self.cfg.n()) as u32);
        put_u64(&mut b, at::STRIDE, Layout::new(self.cfg, self.version).stride as u64);
        put_u64(&mut b, at::LOG_ID, self.log_id);
        put_u64(&mut b, at::REGION_LEN, self.region_len);
        let sig = signer.sign(&b[..at::SIG]).to_u64();
        put_u64(&mut b, at::SIG, sig);
        debug_assert_eq!(
            Superblock::decode(&b, signer).ok(),
            Some(*self),
            "a superblock reads back as written"
        );
        b
    }

    /// Decodes one copy; the error says why it is not a superblock.
    pub fn decode(b: &[u8], signer: &Signer<4>) -> Result<Superblock, LogError> {
        use superblock_at as at;
        let not = |why: &str| Err(LogError::NotALog { why: why.to_string() });
        if b[at::MAGIC..at::MAGIC + 8] != MAGIC {
            return not("no log magic");
        }
        if get_u64(b, at::SIG) != signer.sign(&b[..at::SIG]).to_u64() {
            return not("superblock signature mismatch");
        }
        let version = get_u32(b, at::VERSION);
        if !(LOG_VERSION_TWO_COPIES..=LOG_VERSION).contains(&version) {
            return Err(LogError::Version { found: version, supported: LOG_VERSION });
        }
        let cfg = LogConfig {
            k: get_u16(b, at::K) as usize,
            m: get_u16(b, at::M) as usize,
            chunk_size: get_u32(b, at::CHUNK) as usize,
            block_size: get_u32(b, at::BLOCK) as usize,
            segments: get_u32(b, at::SEGMENTS),
        };
        cfg.validate().map_err(|e| LogError::NotALog { why: format!("superblock shape: {e}") })?;
        if get_u32(b, at::HEADER) as usize != SegmentHeader::size(cfg.n())
            || get_u64(b, at::STRIDE) as usize != Layout::new(cfg, version).stride
        {
            return not("superblock layout fields disagree with its shape");
        }
        Ok(Superblock {
            version,
            cfg,
            log_id: get_u64(b, at::LOG_ID),
            region_len: get_u64(b, at::REGION_LEN),
        })
    }
}

/// A segment's header: which logical segment the physical slot holds, how many of its data
/// chunks are closed, whether it is sealed, and the signature of every chunk (data chunks as
/// they close, parity chunks at the seal). Two copies, each with a CRC-32C.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub seg: u64,
    pub closed: usize,
    pub sealed: bool,
    pub sigs: Vec<Sig64>,
}

impl SegmentHeader {
    /// Bytes of one copy for n chunks, rounded up to whole cache lines.
    pub fn size(n: usize) -> usize {
        (segment_at::crc(n) + 4).div_ceil(64) * 64
    }

    pub fn fresh(seg: u64, n: usize) -> SegmentHeader {
        SegmentHeader { seg, closed: 0, sealed: false, sigs: vec![Sig64::ZERO; n] }
    }

    pub fn encode(&self, log_id: u64) -> Vec<u8> {
        let n = self.sigs.len();
        let mut b = vec![0u8; SegmentHeader::size(n)];
        put_u64(&mut b, segment_at::LOG_ID, log_id);
        put_u64(&mut b, segment_at::SEGMENT, self.seg);
        put_u16(&mut b, segment_at::CLOSED, self.closed as u16);
        b[segment_at::SEALED] = self.sealed as u8;
        for (i, s) in self.sigs.iter().enumerate() {
            put_u64(&mut b, segment_at::SIGS + 8 * i, s.to_u64());
        }
        let end = segment_at::crc(n);
        let crc = crc32c(&b[..end]);
        put_u32(&mut b, end, crc);
        debug_assert!(
            SegmentHeader::decode(&b, log_id, n, self.closed.max(1)).is_some_and(|h| h == *self),
            "a segment header reads back as written"
        );
        b
    }

    /// Decodes one copy; `None` unless its CRC holds and it belongs to this log.
    pub fn decode(b: &[u8], log_id: u64, n: usize, k: usize) -> Option<SegmentHeader> {
        let end = segment_at::crc(n);
        if get_u32(b, end) != crc32c(&b[..end]) || get_u64(b, segment_at::LOG_ID) != log_id {
            return None;
        }
        let closed = get_u16(b, segment_at::CLOSED) as usize;
        if closed > k || b[segment_at::SEALED] > 1 {
            return None;
        }
        Some(SegmentHeader {
            seg: get_u64(b, segment_at::SEGMENT),
            closed,
            sealed: b[segment_at::SEALED] == 1,
            sigs: (0..n).map(|i| Sig64::from_u64(get_u64(b, segment_at::SIGS + 8 * i))).collect(),
        })
    }
}

/// The head (the first live record), in two alternating slots; the higher valid sequence wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HeadSlot {
    pub seq: u64,
    pub head: u64,
}

impl HeadSlot {
    pub fn encode(&self, log_id: u64) -> [u8; HEAD_SLOT_SIZE] {
        let mut b = [0u8; HEAD_SLOT_SIZE];
        put_u64(&mut b, head_at::LOG_ID, log_id);
        put_u64(&mut b, head_at::SEQ, self.seq);
        put_u64(&mut b, head_at::HEAD, self.head);
        let crc = crc32c(&b[..head_at::CRC]);
        put_u32(&mut b, head_at::CRC, crc);
        debug_assert_eq!(HeadSlot::decode(&b, log_id), Some(*self), "a head slot reads back as written");
        b
    }

    pub fn decode(b: &[u8], log_id: u64) -> Option<HeadSlot> {
        if get_u32(b, head_at::CRC) != crc32c(&b[..head_at::CRC]) || get_u64(b, head_at::LOG_ID) != log_id {
            return None;
        }
        Some(HeadSlot { seq: get_u64(b, head_at::SEQ), head: get_u64(b, head_at::HEAD) })
    }

    /// Where slot `seq mod 2` is, in a log of `version`: the first written first.
    pub fn offsets(seq: u64, version: u32) -> impl Iterator<Item = usize> {
        let within = (seq % 2) as usize * HEAD_SLOT_SIZE;
        let copies: &[usize] = if version == LOG_VERSION_TWO_COPIES {
            &[HEAD_SLOTS]
        } else {
            &[HEAD_SLOTS, SUPERBLOCK_A + SUPERBLOCK_SIZE, SUPERBLOCK_B + SUPERBLOCK_SIZE]
        };
        copies.iter().map(move |at| at + within)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_round_trip_and_reject_damage() {
        let signer = Signer::<4>::new();
        let sb = Superblock {
            version: LOG_VERSION,
            cfg: LogConfig { segments: 10, ..LogConfig::default() },
            log_id: 77,
            region_len: 1 << 20,
        };
        let mut b = sb.encode(&signer);
        assert_eq!(Superblock::decode(&b, &signer).unwrap(), sb);
        b[20] ^= 1;
        assert!(Superblock::decode(&b, &signer).is_err());

        let h = SegmentHeader {
            seg: 5,
            closed: 3,
            sealed: false,
            sigs: (0..10).map(|i| Sig64::from_u64(i * 99)).collect(),
        };
        let mut e = h.encode(9);
        assert_eq!(e.len(), 128);
        assert_eq!(SegmentHeader::decode(&e, 9, 10, 8).unwrap(), h);
        assert!(SegmentHeader::decode(&e, 8, 10, 8).is_none(), "another log's header");
        e[30] ^= 0x10;
        assert!(SegmentHeader::decode(&e, 9, 10, 8).is_none());
        assert!(SegmentHeader::decode(&[0u8; 128], 0, 10, 8).is_none(), "a zeroed header is not valid");

        let s = HeadSlot { seq: 4, head: 12345 };
        assert_eq!(HeadSlot::decode(&s.encode(1), 1).unwrap(), s);
        assert!(HeadSlot::decode(&s.encode(1), 2).is_none());
    }

    #[test]
    fn config_limits() {
        assert!(LogConfig::new(0, 1, 4096).fit(1 << 20).is_err());
        assert!(LogConfig::new(200, 56, 4096).fit(1 << 30).is_err());
        assert!(LogConfig::new(4, 2, 100).fit(1 << 20).is_err());
        assert!(LogConfig::new(4, 2, 4096).fit(20_000).is_err());
        let c = LogConfig::new(4, 2, 4096).fit(1 << 20).unwrap();
        let l = Layout::new(c, LOG_VERSION);
        assert!(l.needed() <= 1 << 20 && l.needed() + l.stride > 1 << 20, "as many segments as fit");
        // Page-sized chunks each on pages of their own, the headers of neighbours in one page.
        assert_eq!(l.stride, 4096 + 6 * 4096);
        assert!((0..6).all(|i| l.chunk(3, i).is_multiple_of(4096)));
        assert_eq!(l.header(3, 1) + l.header_size, l.header(4, 0) + 4096);
        let old = Layout::new(c, 2);
        assert_eq!(old.chunk(0, 0), SEGMENTS_START + old.header_size);
        let small = Layout::new(LogConfig::new(4, 2, 256).fit(1 << 16).unwrap(), LOG_VERSION);
        assert_eq!(small.stride, 2 * small.header_size + 6 * 256, "small chunks are packed");
    }
}
