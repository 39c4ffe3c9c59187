//! Nodes: what the file system writes into the page store's data pages.
//!
//! A data page holds fragments back to back; a fragment is a 32-byte header and up to the
//! rest of the page of payload; a node larger than the room left in a page continues in a
//! fragment at the start of the next data page. A zero kind byte ends a page's fragments. A
//! node is applied at mount only if all its fragments are found, so a node cut by a crash
//! never half-applies. Every page is signed by the page store; the node's header adds the
//! CRC-32C of its uncompressed payload, checked end to end on every read.

use bitmend_code::byte_enum;
#[cfg(test)]
use bitmend_code::crc::crc32c;
use bitmend_code::le::{self, Put, Reader};

/// Bytes per logical page of a file (the unit of compression, of the index and of the CRC
/// the page cache reuses).
pub const LOGICAL_PAGE: usize = 4096;

/// An inode number, as the file system's operations take and return it: its own type, so
/// that a page index, an offset or a file handle (all `u64` in a FUSE request) cannot be
/// passed for one unseen. Inside, the namespace keys its tables by the bare number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ino(pub u64);

impl std::fmt::Display for Ino {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Fragment header bytes.
pub(crate) const FRAG_HEADER: usize = 32;

/// Where the fragment header's fields are (FORMAT.md section 8, "Fragment header").
mod frag_at {
    pub const KIND: usize = 0;
    pub const FLAGS: usize = 1;
    pub const LEN: usize = 2;
    pub const TOTAL: usize = 4;
    pub const KEY: usize = 8;
    pub const KEY2: usize = 16;
    pub const VERSION: usize = 24;
}

/// Where the inode payload's fields are (FORMAT.md section 8, "Inode payload").
/// Bytes of an inode record (without a symlink's target).
pub(crate) const INODE_LEN: usize = inode_at::LEN;

mod inode_at {
    pub const TYPE: usize = 0;
    pub const PERM: usize = 2;
    pub const UID: usize = 4;
    pub const GID: usize = 8;
    pub const NLINK: usize = 12;
    pub const SIZE: usize = 16;
    /// atime, mtime, ctime: seconds i64 then nanoseconds u32, 12 bytes each.
    pub const TIMES: usize = 24;
    pub const RDEV: usize = 60;
    /// The attributes' length; a symlink's target follows.
    pub const LEN: usize = 64;
}

byte_enum! {
/// What a node describes (a fragment header's byte 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// An inode's attributes (key: ino).
    Inode = 1,
    /// A directory entry (key: parent ino; payload: child ino, name). A child of 0 removes it.
    Dirent = 2,
    /// A logical page of a file (key: ino, page index; payload: the page, maybe compressed).
    Data = 3,
    /// Marks an operation's nodes complete (a page of metadata is applied whole or not).
    Commit = 4,
    /// The first page of each segment: where the newest checkpoint starts.
    SegmentInfo = 5,
    /// The file-system state (inodes, entries, where each chunk's map is), from which
    /// replay starts.
    Checkpoint = 6,
    /// A chunk of a file's index (key: ino, chunk number; payload: its pages' locations),
    /// written before the checkpoint that refers to it (format version 4).
    Map = 7,
    /// An inode's extended attributes, all of them (key: ino; version 7).
    Xattr = 8,
    /// File pages punched out: key2 to the end in the payload (key: ino; version 7).
    Punch = 9,
    /// A group of the namespace: inodes, entries and where maps are (key: the group, key2:
    /// the hash bits; version 8), written before the checkpoint that refers to it.
    Group = 10,
}
}

/// Flags of a fragment.
pub(crate) const FLAG_LZ4: u8 = 1;
pub(crate) const FLAG_ZSTD: u8 = 4;
/// The flag bits that say how a data payload is compressed (none of them: not at all).
pub(crate) const CODEC_FLAGS: u8 = FLAG_LZ4 | FLAG_ZSTD;
pub(crate) const FLAG_LAST: u8 = 2;
/// A data node's flag bits 4 to 7: how many logical pages it holds, less one (version 5).
pub(crate) const PAGES_SHIFT: u8 = 4;
/// The most logical pages one data node holds.
pub const MAX_NODE_PAGES: usize = 16;

/// A fragment's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frag {
    pub kind: NodeKind,
    pub flags: u8,
    /// Payload bytes in this fragment.
    pub len: u16,
    /// Payload bytes of the whole node (as stored, compressed or not).
    pub total: u32,
    pub key: u64,
    pub key2: u64,
    /// The node's version: larger wins at mount.
    pub version: u64,
}

impl Frag {
    /// Logical pages in the data node this fragment belongs to (1 before version 5).
    pub fn pages(&self) -> usize {
        (self.flags >> PAGES_SHIFT) as usize + 1
    }

    /// The flag bits of a data node of `pages` logical pages (1 to [`MAX_NODE_PAGES`]).
    pub fn pages_flags(pages: usize) -> u8 {
        debug_assert!((1..=MAX_NODE_PAGES).contains(&pages));
        ((pages - 1) as u8) << PAGES_SHIFT
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[frag_at::KIND] = self.kind as u8;
        out[frag_at::FLAGS] = self.flags;
        le::put_u16(out, frag_at::LEN, self.len);
        le::put_u32(out, frag_at::TOTAL, self.total);
        le::put_u64(out, frag_at::KEY, self.key);
        le::put_u64(out, frag_at::KEY2, self.key2);
        le::put_u64(out, frag_at::VERSION, self.version);
    }

    /// `Ok(None)` at the end of a page's fragments; `Err` for bytes that are not a fragment.
    pub fn decode(b: &[u8]) -> Result<Option<Frag>, ()> {
        if b.len() < FRAG_HEADER || b[0] == 0 {
            return Ok(None);
        }
        let kind = NodeKind::from_u8(b[frag_at::KIND]).ok_or(())?;
        let f = Frag {
            kind,
            flags: b[frag_at::FLAGS],
            len: le::get_u16(b, frag_at::LEN),
            total: le::get_u32(b, frag_at::TOTAL),
            key: le::get_u64(b, frag_at::KEY),
            key2: le::get_u64(b, frag_at::KEY2),
            version: le::get_u64(b, frag_at::VERSION),
        };
        if FRAG_HEADER + f.len as usize > b.len() || f.len as u32 > f.total {
            return Err(());
        }
        Ok(Some(f))
    }
}

/// The fragments of a page, or of a record of whole nodes, in order: each header, where its
/// body starts, and the body. The one walk over fragments (the mount's scan, the cleaner's
/// liveness check and the tier's records all take it). It ends at the end of the fragments
/// (a zero kind byte, or no room for a header), or at bytes that are not a fragment;
/// [`FragWalk::rest`] says how many bytes it did not take.
pub(crate) struct FragWalk<'a> {
    b: &'a [u8],
    off: usize,
}

pub(crate) fn frags(b: &[u8]) -> FragWalk<'_> {
    FragWalk { b, off: 0 }
}

impl FragWalk<'_> {
    /// Bytes after the last fragment taken.
    pub fn rest(&self) -> usize {
        self.b.len() - self.off
    }
}

impl<'a> Iterator for FragWalk<'a> {
    type Item = (Frag, usize, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let f = Frag::decode(self.b.get(self.off..)?).ok()??;
        // `decode` vouched that the body lies within the bytes.
        let at = self.off + FRAG_HEADER;
        let body = &self.b[at..at + f.len as usize];
        self.off = at + f.len as usize;
        Some((f, at, body))
    }
}

byte_enum! {
/// File types (an inode payload's byte 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDevice = 6,
    BlockDevice = 7,
}
}

/// An inode's attributes, as stored in an inode node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileType,
    /// Permission bits (and setuid/setgid/sticky), without the type.
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    /// Seconds and nanoseconds since the epoch.
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    /// Device number (character and block devices).
    pub rdev: u32,
}

/// Inode payload: the attributes (64 bytes), then (symlinks) the target.
pub(crate) fn encode_inode(a: &Attr, target: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(inode_at::LEN + target.len());
    encode_inode_into(&mut v, a, target);
    v
}

/// [`encode_inode`], appended to `out` (a checkpoint encodes thousands: no allocation each).
pub(crate) fn encode_inode_into(out: &mut Vec<u8>, a: &Attr, target: &[u8]) {
    let start = out.len();
    out.resize(start + inode_at::LEN, 0);
    let v = &mut out[start..];
    v[inode_at::TYPE] = a.kind as u8;
    le::put_u16(v, inode_at::PERM, a.perm);
    le::put_u32(v, inode_at::UID, a.uid);
    le::put_u32(v, inode_at::GID, a.gid);
    le::put_u32(v, inode_at::NLINK, a.nlink);
    le::put_u64(v, inode_at::SIZE, a.size);
    for (i, (s, ns)) in [a.atime, a.mtime, a.ctime].into_iter().enumerate() {
        le::put_i64(v, inode_at::TIMES + 12 * i, s);
        le::put_u32(v, inode_at::TIMES + 12 * i + 8, ns);
    }
    le::put_u32(v, inode_at::RDEV, a.rdev);
    out.extend_from_slice(target);
    debug_assert_eq!(
        decode_inode(a.ino.0, &out[start..]),
        Some((a.clone(), target.to_vec())),
        "an inode reads back as written"
    );
}

pub(crate) fn decode_inode(ino: u64, b: &[u8]) -> Option<(Attr, Vec<u8>)> {
    // The byte after the type is zero as every version writes it: one spelling per inode.
    if b.len() < inode_at::LEN || b[inode_at::TYPE + 1] != 0 {
        return None;
    }
    let time = |i: usize| {
        let at = inode_at::TIMES + 12 * i;
        (le::get_i64(b, at), le::get_u32(b, at + 8))
    };
    Some((
        Attr {
            ino: Ino(ino),
            kind: FileType::from_u8(b[inode_at::TYPE])?,
            perm: le::get_u16(b, inode_at::PERM),
            uid: le::get_u32(b, inode_at::UID),
            gid: le::get_u32(b, inode_at::GID),
            nlink: le::get_u32(b, inode_at::NLINK),
            size: le::get_u64(b, inode_at::SIZE),
            atime: time(0),
            mtime: time(1),
            ctime: time(2),
            rdev: le::get_u32(b, inode_at::RDEV),
        },
        b[inode_at::LEN..].to_vec(),
    ))
}

/// Dirent payload: the child's ino (0: the name is removed), then the name.
pub(crate) fn encode_dirent(child: u64, name: &[u8]) -> Vec<u8> {
    let mut v = child.to_le_bytes().to_vec();
    v.extend_from_slice(name);
    v
}

pub(crate) fn decode_dirent(b: &[u8]) -> Option<(u64, Vec<u8>)> {
    let mut r = Reader::new(b);
    Some((r.u64()?, r.rest().to_vec()))
}

/// An inode's extended attributes, by name.
pub type Xattrs = std::collections::BTreeMap<Vec<u8>, Vec<u8>>;

/// Extended-attribute payload: u16 count, then per attribute u8 name length, u16 value
/// length, the name, the value (in name order).
pub(crate) fn encode_xattrs(set: &Xattrs) -> Vec<u8> {
    let mut v = Vec::with_capacity(xattrs_len(set));
    v.put_u16(set.len() as u16);
    for (name, value) in set {
        debug_assert!(!name.is_empty() && name.len() <= 255 && value.len() <= u16::MAX as usize);
        v.put_u8(name.len() as u8);
        v.put_u16(value.len() as u16);
        v.put_bytes(name);
        v.put_bytes(value);
    }
    v
}

/// The size of [`encode_xattrs`]'s payload for `set`.
pub(crate) fn xattrs_len(set: &Xattrs) -> usize {
    2 + set.iter().map(|(n, v)| 3 + n.len() + v.len()).sum::<usize>()
}

pub(crate) fn decode_xattrs(b: &[u8]) -> Option<Xattrs> {
    let mut r = Reader::new(b);
    let mut set = Xattrs::new();
    for _ in 0..r.u16()? {
        let n = r.u8()? as usize;
        let len = r.u16()? as usize;
        let name = r.take(n)?.to_vec();
        // Names ascend, as they are written: no empty name, none twice (one spelling per set).
        if name.is_empty() || set.last_key_value().is_some_and(|(last, _)| *last >= name) {
            return None;
        }
        set.insert(name, r.take(len)?.to_vec());
    }
    r.is_empty().then_some(set)
}

/// Punch payload: the end (exclusive) of the logical pages removed from key2 on.
pub(crate) fn encode_punch(end: u64) -> Vec<u8> {
    end.to_le_bytes().to_vec()
}

pub(crate) fn decode_punch(b: &[u8]) -> Option<u64> {
    let mut r = Reader::new(b);
    r.u64().filter(|_| r.is_empty())
}

/// A payload zstd-compressed behind `magic` (then the plain length, u32, then one zstd
/// frame) when that saves more than those 8 bytes; else the plain payload itself (whose own
/// magic differs). Maps and groups are stored so (FORMAT.md section 8).
pub(crate) fn pack_zstd(plain: Vec<u8>, level: i32, magic: u32) -> Vec<u8> {
    match zstd_compress(&plain, level) {
        Ok(z) if z.len() + 8 < plain.len() => {
            let mut c = Vec::with_capacity(8 + z.len());
            c.put_u32(magic);
            c.put_u32(plain.len() as u32);
            c.put_bytes(&z);
            c
        }
        _ => plain,
    }
}

/// The plain payload of one [`pack_zstd`] made (a payload without `magic` is plain
/// already); `None` if it does not decompress, or claims more than `max` bytes (the length
/// is read from the flash: a damaged one must not make a huge allocation).
pub(crate) fn unpack_zstd(b: &[u8], magic: u32, max: usize) -> Option<std::borrow::Cow<'_, [u8]>> {
    let mut head = Reader::new(b);
    if head.u32()? != magic {
        return Some(std::borrow::Cow::Borrowed(b));
    }
    let len = head.u32()? as usize;
    if len > max {
        return None;
    }
    zstd_decompress(head.rest(), len).map(std::borrow::Cow::Owned)
}

/// One zstd frame decompressed (at most `len` bytes), by a decompressor kept per thread: as
/// for [`zstd_compress`], making one costs more than decompressing a small group or map.
pub(crate) fn zstd_decompress(frame: &[u8], len: usize) -> Option<Vec<u8>> {
    use std::cell::RefCell;
    thread_local! {
        static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    }
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new().ok()?);
        }
        d.as_mut()?.decompress(frame, len).ok()
    })
}

/// `data` compressed as one zstd frame at `level`, by a compressor kept per thread and
/// level: making one costs more than compressing a map node or a small checkpoint.
pub(crate) fn zstd_compress(data: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    use std::cell::RefCell;
    thread_local! {
        static COMPRESSORS: RefCell<Vec<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(Vec::new()) };
    }
    COMPRESSORS.with(|c| {
        let mut c = c.borrow_mut();
        let at = match c.iter().position(|(l, _)| *l == level) {
            Some(i) => i,
            None => {
                c.push((level, zstd::bulk::Compressor::new(level)?));
                c.len() - 1
            }
        };
        c[at].1.compress(data)
    })
}

/// The highest lz4 high-compression level (the library's optimal parser).
pub const MAX_LZ4_LEVEL: u8 = 12;

/// Data payload of `pages` (one or more logical pages back to back): `crcs`, the CRC-32C of
/// each uncompressed logical page as the page cache carried it (see `cache.rs`: never
/// recomputed here, so a page a memory error hit while dirty is stored under the CRC of what
/// was written, and fails at its next read), then the pages, compressed together with
/// `codec` when that saves space (else plain, without their trailing zeros). Returns the
/// payload and the codec flag actually used (0 when stored plain). `lz4_level` 0 is lz4's
/// fast compressor, 1 to 12 its high-compression one (the same block format: readers do not
/// know the difference).
pub(crate) fn encode_data(pages: &[u8], crcs: &[u32], codec: u8, lz4_level: u8) -> (Vec<u8>, u8) {
    debug_assert!(pages.len().is_multiple_of(LOGICAL_PAGE) && !pages.is_empty());
    debug_assert_eq!(crcs.len(), pages.len() / LOGICAL_PAGE);
    // Room for the plain case up front: grown from the CRCs' four bytes, the page was copied
    // twice.
    let mut v: Vec<u8> = Vec::with_capacity(4 * crcs.len() + pages.len());
    v.extend(crcs.iter().flat_map(|c| c.to_le_bytes()));
    // Stored plain, the pages leave out their trailing zeros (the end of a file's last page).
    let plain = &pages[..pages.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)];
    let packed = match codec {
        // lz4 compresses straight after the CRCs, into at most a byte less than the plain
        // pages: output that would not be smaller stops it early (data that does not compress
        // costs part of an attempt, not all of it), and nothing is copied after.
        FLAG_LZ4 => {
            let at = v.len();
            v.resize(at + plain.len().saturating_sub(1), 0);
            // The fast compressor first: data it cannot shrink, the high-compression one
            // would only shrink by less than it costs (ten times the fast one's time on
            // random pages, which the cleaner moves cold near full).
            let fast = lz4::block::compress_to_buffer(pages, None, false, &mut v[at..]);
            let packed = match (fast, lz4_level) {
                (Ok(n), 0) => Ok(n),
                (Ok(_), l) => {
                    let mode = lz4::block::CompressionMode::HIGHCOMPRESSION(l.min(MAX_LZ4_LEVEL) as i32);
                    lz4::block::compress_to_buffer(pages, Some(mode), false, &mut v[at..])
                        .or_else(|_| lz4::block::compress_to_buffer(pages, None, false, &mut v[at..]))
                }
                (Err(e), _) => Err(e),
            };
            if let Ok(n) = packed {
                v.truncate(at + n);
                return (v, codec);
            }
            v.truncate(at);
            None
        }
        FLAG_ZSTD => zstd_compress(pages, 3).ok(),
        _ => None,
    };
    if let Some(c) = packed.filter(|c| c.len() < plain.len()) {
        v.extend_from_slice(&c);
        return (v, codec);
    }
    v.extend_from_slice(plain);
    (v, 0)
}

/// The payload [`encode_data`] makes of one page stored plain, as its two parts: the page's
/// CRC, and the page without its trailing zeros (which the caller copies where it goes).
pub(crate) fn plain_data(page: &[u8], crc: u32) -> ([u8; 4], &[u8]) {
    debug_assert_eq!(page.len(), LOGICAL_PAGE);
    (crc.to_le_bytes(), &page[..page.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)])
}

/// Decodes a data payload into its `count` logical pages (`count` x [`LOGICAL_PAGE`] bytes);
/// `None` if the bytes do not decompress or a page does not match its CRC.
#[cfg(test)]
pub(crate) fn decode_data(b: &[u8], codec: u8, count: usize) -> Option<Vec<u8>> {
    let pages = decode_pages(b, codec, count)?;
    let crcs = &b[..4 * count];
    let good = pages.chunks(LOGICAL_PAGE).zip(crcs.chunks(4)).all(|(p, c)| crc32c(p).to_le_bytes() == c);
    good.then_some(pages)
}

/// The CRC a data payload records for its page `slot`.
pub(crate) fn recorded_crc(b: &[u8], slot: usize) -> Option<u32> {
    b.get(4 * slot..4 * slot + 4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
}

/// Decodes a data payload into its `count` logical pages, unchecked: each page read must be
/// checked against its own CRC ([`recorded_crc`]). A page that a memory error hit while
/// dirty was stored under the CRC of what was written (`cache.rs`), and fails alone; the
/// pages compressed with it still read.
pub(crate) fn decode_pages(b: &[u8], codec: u8, count: usize) -> Option<Vec<u8>> {
    if !(1..=MAX_NODE_PAGES).contains(&count) || b.len() < 4 * count {
        return None;
    }
    let body = &b[4 * count..];
    let len = count * LOGICAL_PAGE;
    let pages = match codec {
        0 if body.len() <= len => {
            let mut p = body.to_vec();
            p.resize(len, 0);
            p
        }
        // liblz4's bounds-checked decoder (about twice lz4_flex's safe one, measured when
        // both were in use): a 4 KiB read may decompress a node of 16.
        FLAG_LZ4 => lz4::block::decompress(body, Some(len as i32)).ok()?,
        FLAG_ZSTD => zstd_decompress(body, len)?,
        _ => return None,
    };
    (pages.len() == len).then_some(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_page_in_parts_is_the_payload_encode_data_makes() {
        let mut random = vec![0u8; LOGICAL_PAGE];
        let mut x = 7u32;
        random.iter_mut().for_each(|b| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            *b = (x >> 16) as u8;
        });
        let mut short = random.clone();
        short[3000..].fill(0);
        short[10] = 0; // a zero inside is kept, only the trailing ones go
        for page in [random, short, vec![0u8; LOGICAL_PAGE]] {
            let crc = crc32c(&page);
            let (whole, codec) = encode_data(&page, &[crc], 0, 0);
            let (head, plain) = plain_data(&page, crc);
            assert_eq!(codec, 0);
            assert_eq!([&head[..], plain].concat(), whole);
            assert_eq!(decode_data(&whole, 0, 1).as_deref(), Some(&page[..]));
        }
    }

    /// `encode_data` with the CRCs computed from the pages (what a page cache would carry).
    fn encode(pages: &[u8], codec: u8, level: u8) -> (Vec<u8>, u8, Vec<u32>) {
        let crcs: Vec<u32> = pages.chunks(LOGICAL_PAGE).map(crc32c).collect();
        let (v, used) = encode_data(pages, &crcs, codec, level);
        (v, used, crcs)
    }

    #[test]
    fn lz4_output_bounded_by_the_plain_pages_is_what_lz4_makes_unbounded() {
        // Pages from barely compressible to not at all (a run of one byte in random bytes,
        // shorter and shorter): around where lz4's output reaches the plain size, the bounded
        // attempt must choose as an unbounded one would, and store the same bytes. The high
        // compression is tried only where the fast compressor shrinks the page.
        let mut rng = bitmend_media::rng::Rng::new(11);
        let (mut packed, mut plain) = (0, 0);
        for run in (0..60).chain((60..400).step_by(20)) {
            let mut page: Vec<u8> = (0..LOGICAL_PAGE).map(|_| rng.next_u64() as u8).collect();
            page[1000..1000 + run].fill(b'x');
            for level in [0, 9] {
                let mode = match level {
                    0 => lz4::block::CompressionMode::DEFAULT,
                    l => lz4::block::CompressionMode::HIGHCOMPRESSION(l),
                };
                let fast = lz4::block::compress(&page, None, false).expect("compresses");
                let unbounded = lz4::block::compress(&page, Some(mode), false).expect("compresses");
                let (enc, used) = encode_data(&page, &[7], FLAG_LZ4, level as u8);
                if fast.len() < page.len() && unbounded.len() >= page.len() {
                    assert_eq!((used, &enc[4..]), (FLAG_LZ4, &fast[..]), "run {run} level {level}");
                    packed += 1;
                } else if fast.len() < page.len() {
                    assert_eq!((used, &enc[4..]), (FLAG_LZ4, &unbounded[..]), "run {run} level {level}");
                    packed += 1;
                } else {
                    assert_eq!((used, &enc[4..]), (0, &page[..]), "run {run} level {level}");
                    plain += 1;
                }
                assert_eq!(decode_pages(&enc, used, 1).as_deref(), Some(&page[..]));
            }
        }
        assert!(packed > 10 && plain > 10, "both sides of the line: {packed} packed, {plain} plain");
    }

    #[test]
    fn every_lz4_level_writes_what_the_reader_decodes() {
        // Text-like data: words from a small vocabulary, so the levels differ in what they find.
        let words = [&b"import "[..], b"self", b".value", b" = ", b"return ", b"def ", b"(x, y)", b"\n    "];
        let mut rng = bitmend_media::rng::Rng::new(7);
        let mut page = Vec::new();
        while page.len() < 4096 {
            page.extend_from_slice(words[rng.next_u64() as usize % words.len()]);
        }
        page.truncate(4096);
        let (fast, _, _) = encode(&page, FLAG_LZ4, 0);
        for level in 0..=MAX_LZ4_LEVEL + 1 {
            let (enc, used, crc) = encode(&page, FLAG_LZ4, level);
            assert_eq!((used, crc), (FLAG_LZ4, vec![crc32c(&page)]), "level {level}");
            assert_eq!(decode_data(&enc, FLAG_LZ4, 1), Some(page.clone()), "level {level}");
            if level >= 9 {
                assert!(enc.len() < fast.len(), "level {level}: {} bytes, fast {}", enc.len(), fast.len());
            }
        }
    }

    #[test]
    fn a_plain_page_leaves_out_its_trailing_zeros() {
        let mut page = vec![0u8; 4096];
        page[..1000].iter_mut().enumerate().for_each(|(i, b)| *b = (i * 7919 % 251) as u8 | 1);
        let (payload, codec, crc) = encode(&page, 0, 0);
        assert_eq!((payload.len(), codec, crc), (4 + 1000, 0, vec![crc32c(&page)]));
        assert_eq!(decode_data(&payload, 0, 1).as_deref(), Some(&page[..]));
        // All zeros: the CRC alone.
        let (zeros, _, _) = encode(&[0u8; 4096], 0, 0);
        assert_eq!(zeros.len(), 4);
        assert_eq!(decode_data(&zeros, 0, 1), Some(vec![0u8; 4096]));
        // Longer than a page, or the wrong bytes: refused.
        let mut long = payload.clone();
        long.resize(4 + 4097, 1);
        assert_eq!(decode_data(&long, 0, 1), None);
        let mut bad = payload;
        bad[10] ^= 1;
        assert_eq!(decode_data(&bad, 0, 1), None);
    }

    #[test]
    fn a_node_of_several_pages_checks_each_page() {
        let words = [&b"segment "[..], b"parity ", b"signature ", b"page "];
        let mut rng = bitmend_media::rng::Rng::new(3);
        let mut pages = Vec::new();
        while pages.len() < 3 * 4096 {
            pages.extend_from_slice(words[rng.next_u64() as usize % words.len()]);
        }
        pages.truncate(3 * 4096);
        pages[2 * 4096 + 100..].fill(0); // a short last page
        for codec in [FLAG_LZ4, FLAG_ZSTD] {
            let (enc, used, crcs) = encode(&pages, codec, 9);
            let want: Vec<u32> = pages.chunks(4096).map(crc32c).collect();
            assert_eq!((used, &crcs), (codec, &want));
            // Together the pages take less than the first one alone would plain.
            assert!(enc.len() < 4096, "{} bytes", enc.len());
            assert_eq!(decode_data(&enc, codec, 3), Some(pages.clone()));
            // Read as the wrong number of pages, or with any CRC changed: refused.
            assert_eq!(decode_data(&enc, codec, 2), None);
            assert_eq!(decode_data(&enc, codec, 4), None);
            for at in [0, 5, 10] {
                let mut bad = enc.clone();
                bad[at] ^= 0x10;
                assert_eq!(decode_data(&bad, codec, 3), None, "byte {at}");
            }
        }
        assert_eq!(decode_data(&[0u8; 80], 0, MAX_NODE_PAGES + 1), None);
        let f = Frag {
            kind: NodeKind::Data,
            flags: FLAG_LZ4 | Frag::pages_flags(16),
            len: 1,
            total: 1,
            key: 1,
            key2: 0,
            version: 1,
        };
        assert_eq!((f.pages(), f.flags & CODEC_FLAGS), (16, FLAG_LZ4));
    }

    #[test]
    fn forms_round_trip() {
        let f = Frag {
            kind: NodeKind::Data,
            flags: FLAG_LZ4 | FLAG_LAST,
            len: 100,
            total: 300,
            key: 7,
            key2: 9,
            version: 42,
        };
        let mut b = [0u8; 200];
        f.encode(&mut b);
        assert_eq!(Frag::decode(&b), Ok(Some(f)));
        assert_eq!(Frag::decode(&[0u8; 40]), Ok(None));
        b[0] = 77;
        assert!(Frag::decode(&b).is_err());

        let a = Attr {
            ino: Ino(5),
            kind: FileType::Symlink,
            perm: 0o755,
            uid: 1000,
            gid: 100,
            size: 12,
            nlink: 1,
            atime: (1, 2),
            mtime: (3, 4),
            ctime: (-5, 6),
            rdev: 0x0801,
        };
        assert_eq!(decode_inode(5, &encode_inode(&a, b"target")), Some((a, b"target".to_vec())));
        assert_eq!(decode_dirent(&encode_dirent(9, b"name")), Some((9, b"name".to_vec())));

        let page: Vec<u8> = (0..4096).map(|i| (i / 100) as u8).collect();
        for codec in [FLAG_LZ4, FLAG_ZSTD] {
            let (enc, used, _) = encode(&page, codec, 0);
            assert!(used == codec && enc.len() < 1000);
            assert_eq!(decode_data(&enc, codec, 1), Some(page.clone()));
            let mut bad = enc.clone();
            bad[10] ^= 1;
            assert_ne!(decode_data(&bad, codec, 1), Some(page.clone()));
        }
        // Incompressible data is stored plain.
        let mut noise = vec![0u8; 4096];
        bitmend_media::rng::Rng::new(1).fill(&mut noise);
        let (enc, used, _) = encode(&noise, FLAG_ZSTD, 0);
        assert_eq!((used, enc.len()), (0, 4100));
        assert_eq!(decode_data(&enc, 0, 1), Some(noise));
    }
}
