//! A checkpoint's payload read back, in every version a mount still reads (FORMAT.md
//! section 8): version 3's list of every page, version 4's maps, usage and totals, version
//! 7's summaries and extended attributes, version 8's group table. The writer
//! (`checkpoint.rs`) writes only the newest; this is the one place the older ones are read.

use std::collections::{BTreeMap, HashMap};

use bitmend_code::le::Reader;

use crate::fs::map::groups::GroupAt;
use crate::fs::map::index::{read_frags, MapAt, Totals};
use crate::fs::map::keys::{ChunkKey, GroupId, MapSummary, NumberMap};
use crate::fs::node::{self, FLAG_ZSTD};
use crate::fs::{Health, Inode, Loc};
use crate::store::Segment;

pub(crate) const MAGIC: u32 = 0x434B_5054; // "CKPT"
/// The largest checkpoint state a mount will decompress (a million files is about 150 MB).
const MAX_STATE: usize = 1 << 30;
/// The optional section after the data section (FORMAT.md section 8, checkpoint payload):
/// lifetime health counters.
pub(crate) const HEALTH_MAGIC: u32 = 0x484C_5448; // "HLTH"
/// The optional section after the health section (version 3): the segments in use, which
/// mount needs for the segments older than the checkpoint's (FORMAT.md section 8).
pub(crate) const TABLE_MAGIC: u32 = 0x5447_4553; // "SEGT"
/// Version 4's sections after the table: where each index chunk's map node is, the segment
/// usage table, and the totals of file data (FORMAT.md section 8).
pub(crate) const MAPS_MAGIC: u32 = 0x5350_414D; // "MAPS"
pub(crate) const USAGE_MAGIC: u32 = 0x4741_5355; // "USAG"
pub(crate) const TOTALS_MAGIC: u32 = 0x4C54_4F54; // "TOTL"
/// Version 7's section after the totals: per map, which pages it holds and a digest of their
/// versions, from which a lost map is rebuilt (FORMAT.md section 8).
pub(crate) const SUMMARY_MAGIC: u32 = 0x4D55_534D; // "MSUM"
/// Version 7's section after the summaries: the extended attributes of every inode that has
/// any (FORMAT.md section 8).
pub(crate) const XATTR_MAGIC: u32 = 0x5254_4158; // "XATR"
/// Version 10's section after the extended attributes: the hash bits and where each group
/// of the namespace is (`map/groups.rs`; the sections before it then hold no inode, entry, map
/// or attribute). Version 8's ("GRPS") held prefixes of 32 bits, of groups whose items were
/// hashed without directory regions: a mount puts such a state in new groups.
pub(crate) const GROUPS_MAGIC: u32 = 0x3250_5247; // "GRP2"
const GROUPS_MAGIC_V8: u32 = 0x5350_5247; // "GRPS"

/// The state a checkpoint holds.
pub(crate) struct State {
    pub inodes: NumberMap<u64, Inode>,
    pub dirs: NumberMap<u64, BTreeMap<Vec<u8>, u64>>,
    pub data: HashMap<(u64, u64), Loc>,
    pub next_ino: u64,
    pub health: Health,
    /// The segments in use when the checkpoint was taken.
    pub segments: Option<Vec<Segment>>,
    /// Version 4: the index by chunk (the data section is then empty), the usage table and
    /// the totals.
    pub maps: Option<BTreeMap<ChunkKey, MapAt>>,
    pub usage: HashMap<u32, u64>,
    pub totals: Totals,
    /// Version 8: where each group is.
    pub groups: Option<Vec<(GroupId, GroupAt)>>,
    /// The groups' items were hashed as before version 10 (without directory regions).
    pub groups_v8: bool,
}

/// Decodes a checkpoint payload whose first fragment carried `flags`.
pub(crate) fn decode_payload(flags: u8, b: &[u8]) -> Option<State> {
    if flags & FLAG_ZSTD == 0 {
        return decode(b);
    }
    let mut r = Reader::new(b);
    let len = r.u32()? as usize;
    // The length is read from the flash: a damaged one must not make a huge allocation.
    if len > MAX_STATE {
        return None;
    }
    decode(&crate::fs::node::zstd_decompress(r.rest(), len)?)
}

/// The group table, after its magic (`wide`: version 10's, of 64-bit prefixes).
fn decode_groups(r: &mut Reader, wide: bool) -> Option<Vec<(GroupId, GroupAt)>> {
    let n = r.u32()?;
    let mut table = Vec::with_capacity(n.min(1 << 20) as usize);
    for _ in 0..n {
        let depth = r.u8()?;
        let g = GroupId { depth, prefix: if wide { r.u64()? } else { u64::from(r.u32()?) } };
        let (version, crc) = (r.u64()?, r.u32()?);
        let inodes = if wide { r.u32()? } else { 0 };
        table.push((g, GroupAt { frags: read_frags(r)?, version, crc, inodes }));
    }
    Some(table)
}

pub(crate) fn decode(b: &[u8]) -> Option<State> {
    let mut r = Reader::new(b);
    if r.u32()? != MAGIC {
        return None;
    }
    let next_ino = r.u64()?;
    let mut inodes = NumberMap::default();
    for _ in 0..r.u32()? {
        let (ino, inode) = Inode::take_record(&mut r)?;
        inodes.insert(ino, inode);
    }
    let mut dirs: NumberMap<u64, BTreeMap<Vec<u8>, u64>> = NumberMap::default();
    for _ in 0..r.u32()? {
        let parent = r.u64()?;
        let child = r.u64()?;
        let len = r.u16()? as usize;
        dirs.entry(parent).or_default().insert(r.take(len)?.to_vec(), child);
    }
    let mut data = HashMap::new();
    for _ in 0..r.u32()? {
        let key = (r.u64()?, r.u64()?);
        let version = r.u64()?;
        let codec = r.take(1)?[0];
        let n = r.u16()? as usize;
        let mut frags = Vec::with_capacity(n);
        for _ in 0..n {
            frags.push((r.u32()?, r.u16()?, r.u16()?));
        }
        data.insert(key, Loc::single(frags, codec, version, None));
    }
    // Checkpoints written before the health section existed end here: zeros.
    let mut health = Health::default();
    if r.u32() == Some(HEALTH_MAGIC) {
        // Counters a later version added beyond those known here are skipped.
        let mut counters = [0u64; Health::COUNTERS];
        for i in 0..r.u32()? as usize {
            let c = r.u64()?;
            if let Some(slot) = counters.get_mut(i) {
                *slot = c;
            }
        }
        health = Health::from_array(counters);
    }
    let mut segments = None;
    if r.u32() == Some(TABLE_MAGIC) {
        let n = r.u32()?;
        let mut t = Vec::with_capacity(n.min(1 << 20) as usize);
        for _ in 0..n {
            t.push(Segment { logical: r.u64()?, physical: r.u32()? });
        }
        segments = Some(t);
    }
    let (mut maps, mut usage, mut totals) = (None, HashMap::new(), Totals::default());
    if r.u32() == Some(MAPS_MAGIC) {
        let mut m = BTreeMap::new();
        for _ in 0..r.u32()? {
            let key = ChunkKey { ino: r.u64()?, chunk: r.u64()? };
            let version = r.u64()?;
            m.insert(key, MapAt { frags: read_frags(&mut r)?, version, summary: None });
        }
        if r.u32()? != USAGE_MAGIC {
            return None;
        }
        for _ in 0..r.u32()? {
            usage.insert(r.u32()?, r.u64()?);
        }
        if r.u32()? != TOTALS_MAGIC {
            return None;
        }
        totals = Totals { pages: r.u64()?, stored: r.u64()?, footprint: r.u64()? };
        if r.u32() == Some(SUMMARY_MAGIC) && r.u32()? as usize == m.len() {
            for at in m.values_mut() {
                let (mask, digest) = (r.u64()?, r.u64()?);
                at.summary = (mask != 0).then_some(MapSummary { mask, digest });
            }
        }
        maps = Some(m);
    }
    if r.u32() == Some(XATTR_MAGIC) {
        for _ in 0..r.u32()? {
            let ino = r.u64()?;
            let version = r.u64()?;
            let len = r.u32()? as usize;
            let set = node::decode_xattrs(r.take(len)?)?;
            let i = inodes.get_mut(&ino)?;
            (i.xattrs, i.xattr_version) = (set, version);
        }
    }
    let (groups, groups_v8) = match r.u32() {
        Some(GROUPS_MAGIC) => (Some(decode_groups(&mut r, true)?), false),
        Some(GROUPS_MAGIC_V8) => (Some(decode_groups(&mut r, false)?), true),
        _ => (None, false),
    };
    Some(State { inodes, dirs, data, next_ino, health, segments, maps, usage, totals, groups, groups_v8 })
}
