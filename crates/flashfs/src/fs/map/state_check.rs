//! PRIMS's on-line check of the live state: the namespace in memory compared, a few groups at
//! a time, with what flash says it must be. A group not changed since it was written must
//! encode, from memory, to the very bytes its copy on flash holds (the CRC of its plain
//! payload): the copy is read back and verified first, so a difference means the memory is
//! wrong (a memory error, or a change that marked no group: a bug). Groups changed since
//! written are left for after their next write, and so are groups holding an inode whose
//! size or pages wait for write-back (memory is ahead of flash there by design).

use bitmend_media::nand::Nand;

use super::groups::{decode_group, encode_group, sound_group_crc};
use super::keys::GroupId;
use crate::fs::Fs;
use crate::{Corruption, FsError};

/// What one step of the on-line check did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateCheck {
    /// Groups compared with their copy on flash.
    pub compared: usize,
    /// Groups passed over: changed since written, or their node still in the page being
    /// filled, or holding an inode that waits for write-back.
    pub unsettled: usize,
    /// Groups passed over because their copy on flash is damaged beyond repair: the
    /// scrubber's to report (the memory may well be right, and is what a checkpoint writes
    /// next).
    pub unreadable: usize,
    /// Groups whose state in memory is not what flash holds: (hash prefix, depth).
    pub mismatched: Vec<(u64, u8)>,
}

impl<N: Nand> Fs<N> {
    /// A step of the on-line check: up to `max` groups compared with their copies on flash,
    /// going on from where the last step stopped (round and round). A copy that cannot be
    /// read, or fails its CRC, is the scrubber's to report, not a mismatch.
    pub fn check_state(&mut self, max: usize) -> Result<StateCheck, FsError> {
        let mut ids: Vec<GroupId> = self.groups.at.keys().copied().collect();
        ids.sort_unstable();
        let from = ids.partition_point(|g| Some(*g) <= self.groups.checked_to);
        let mut report = StateCheck::default();
        for g in ids[from..].iter().chain(&ids[..from]).take(max).copied().collect::<Vec<_>>() {
            self.groups.checked_to = Some(g).filter(|&g| Some(g) != ids.last().copied());
            if !self.settled(g) {
                report.unsettled += 1;
                continue;
            }
            match self.group_matches_flash(g)? {
                Some(true) => report.compared += 1,
                Some(false) => {
                    report.compared += 1;
                    report.mismatched.push((g.prefix, g.depth));
                }
                None => report.unreadable += 1,
            }
        }
        Ok(report)
    }

    /// Whether group `g` holds only what is on flash as memory holds it: not changed since
    /// written, not in the page being filled, and none of its inodes waiting for write-back.
    fn settled(&self, g: GroupId) -> bool {
        let groups = &self.groups;
        let written = groups.at.get(&g).is_some_and(|at| !at.frags.is_empty());
        let members = groups.members.get(&g);
        written
            && !groups.unread.contains(&g)
            && !groups.dirty.contains(&g)
            && !groups.buf.contains(&g)
            && members.is_none_or(|m| m.inos.iter().all(|i| !self.wb.inode_waits(*i)))
    }

    /// Whether group `g` encoded from memory is the copy flash holds; `None` when that copy
    /// is damaged beyond repair (it cannot say what memory must be).
    fn group_matches_flash(&mut self, g: GroupId) -> Result<Option<bool>, FsError> {
        let at = self.groups.at[&g].clone();
        let payload = match self.read_payload(&at.frags) {
            Ok((p, _)) => p,
            Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        // A payload that fails its own CRC is a damaged copy (a page lost beyond its parity
        // reads as whatever it holds); one that passes it but is not the copy memory says
        // was written last, or not this group, says memory is wrong.
        if sound_group_crc(&payload).is_none() {
            return Ok(None);
        }
        if decode_group(&payload, g, at.crc).is_none() {
            return Ok(Some(false));
        }
        let mut members = self.groups.members.get(&g).cloned().unwrap_or_default();
        let fresh = encode_group(g, &mut members, &self.ns, &self.index.maps);
        Ok(Some(fresh.is_some_and(|(v, _)| bitmend_code::le::get_u32(&v, v.len() - 4) == at.crc)))
    }

    /// Flips bit `bit` of inode `ino`'s owner in memory, as a memory error would, marking
    /// nothing: what the on-line check is there to find (tests and demos). Whether there
    /// is such an inode.
    pub fn flip_inode(&mut self, ino: u64, bit: u32) -> bool {
        let Some(uid) = self.ns.get(ino).map(|i| i.attr.uid) else { return false };
        let set = crate::SetAttr { uid: Some(uid ^ (1 << (bit % 32))), ..Default::default() };
        let ctime = self.ns.get(ino).map(|i| i.attr.ctime).unwrap_or_default();
        self.ns.set_attrs(ino, &set, ctime);
        true
    }
}
