//! The POSIX-like operations.

use std::collections::BTreeMap;

use bitmend_media::nand::Nand;

use super::{
    now, DirEntry, Fs, Inode, Loc, SetAttr, TierWrite, INLINE_TARGET_MAX, LOGICAL_PAGE, NAME_MAX, PENDING,
    SYMLINK_MAX,
};
use super::{Ino, ROOT};
use crate::fs::cache::DirtyPage;
use crate::fs::node::{self, Attr, FileType};
use crate::store::{PageAddr, Repaired};
use crate::FsError;
use crate::{Corruption, PosixError};

/// What the last reads decoded, so that a sequential read does not read or decompress the
/// same thing once per logical page.
#[derive(Debug, Default)]
pub(crate) struct ReadCache {
    /// The last flash pages read (verified), newest last, each with whether it had to be
    /// repaired: consecutive logical pages share flash pages.
    recent: Vec<(u32, Vec<u8>, bool)>,
    /// The last node of several pages decoded: (ino, first page, version), its pages, and
    /// whether a flash page under it was repaired.
    last_node: Option<super::DecodedNode>,
}

impl ReadCache {
    /// The flash pages read are about to be erased or rewritten: forgotten.
    pub fn forget_flash(&mut self) {
        self.recent.clear();
    }
}

/// The CRC-32C of a logical page of zeros (a hole).
fn zero_page_crc() -> u32 {
    static CRC: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CRC.get_or_init(|| bitmend_code::crc::crc32c(&[0u8; LOGICAL_PAGE]))
}

fn check_name(name: &[u8]) -> Result<(), FsError> {
    if name.len() > NAME_MAX {
        return Err(PosixError::NameTooLong.into());
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(PosixError::Invalid { why: "not a valid file name".into() }.into());
    }
    Ok(())
}

impl<N: Nand> Fs<N> {
    pub(crate) fn inode(&self, ino: u64) -> Result<&Inode, FsError> {
        self.ns.get(ino).ok_or(FsError::Posix(PosixError::NotFound))
    }

    fn dir(&self, ino: u64) -> Result<&BTreeMap<Vec<u8>, u64>, FsError> {
        match self.inode(ino)?.attr.kind {
            FileType::Dir => Ok(self.ns.entries(ino).expect("every directory has entries")),
            _ => Err(PosixError::NotDir.into()),
        }
    }

    /// The attributes of `ino`.
    pub fn getattr(&mut self, ino: Ino) -> Result<Attr, FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        Ok(self.inode(ino)?.attr.clone())
    }

    /// The entry `name` in directory `parent`.
    pub fn lookup(&mut self, parent: Ino, name: &[u8]) -> Result<Attr, FsError> {
        let parent = parent.0;
        if name.len() > NAME_MAX {
            return Err(PosixError::NameTooLong.into());
        }
        self.need_inode(parent)?;
        self.need_entry(parent, name)?;
        let child = *self.dir(parent)?.get(name).ok_or(FsError::Posix(PosixError::NotFound))?;
        self.getattr(Ino(child))
    }

    /// The entries of directory `ino` (without "." and "..").
    pub fn readdir(&mut self, ino: Ino) -> Result<Vec<DirEntry>, FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        self.need_dir(ino)?;
        let children: Vec<u64> = self.dir(ino)?.values().copied().collect();
        for child in children {
            self.need_inode(child)?;
        }
        Ok(self
            .dir(ino)?
            .iter()
            .map(|(name, &child)| DirEntry {
                name: name.clone(),
                ino: Ino(child),
                kind: self.ns.get(child).expect("an entry names an inode").attr.kind,
            })
            .collect())
    }

    fn make(
        &mut self,
        parent: u64,
        name: &[u8],
        (kind, perm, rdev): (FileType, u16, u32),
        (uid, gid): (u32, u32),
        target: &[u8],
    ) -> Result<Attr, FsError> {
        check_name(name)?;
        self.need_inode(parent)?;
        self.need_entry(parent, name)?;
        if self.dir(parent)?.contains_key(name) {
            return Err(PosixError::Exists.into());
        }
        // A symlink's target goes into its inode node, or, when long, into a page of data.
        self.reserve(u64::from(!target.is_empty()), 1)?;
        let inline = target.len() <= INLINE_TARGET_MAX;
        let ino = self.ns.allocate_ino(parent).ok_or(FsError::NoSpace)?;
        // Its group read before it changes (a group is in memory whole or not at all).
        self.need_inode(ino)?;
        let t = now();
        let attr = Attr {
            ino: Ino(ino),
            kind,
            perm: perm & 0o7777,
            uid,
            gid,
            size: if kind == FileType::Symlink { target.len() as u64 } else { 0 },
            nlink: if kind == FileType::Dir { 2 } else { 1 },
            atime: t,
            mtime: t,
            ctime: t,
            rdev,
        };
        let kept = if inline { target.to_vec() } else { Vec::new() };
        self.ns.insert(ino, Inode::new(attr.clone(), kept, 0));
        if !inline {
            // Written before the operation's page: a crash between them leaves data of an
            // inode that does not exist, which mount drops.
            let mut page = target.to_vec();
            page.resize(LOGICAL_PAGE, 0);
            let crc = bitmend_code::crc::crc32c(&page);
            let written = self
                .write_page(ino, 0, &page, crc)
                .and_then(|()| self.tier_page((ino, 0), &DirtyPage::with_crc(page, crc), 0..LOGICAL_PAGE));
            if let Err(e) = written {
                self.ns.remove(ino);
                return Err(e);
            }
        }
        self.ns.add_entry(parent, name, ino);
        self.ns.touch(parent, now());
        let nodes =
            vec![self.inode_node(ino), Fs::<N>::dirent_node(parent, name, ino), self.inode_node(parent)];
        self.commit(nodes)?;
        Ok(attr)
    }

    /// Creates an empty regular file.
    pub fn create(
        &mut self,
        parent: Ino,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Attr, FsError> {
        let parent = parent.0;
        self.make(parent, name, (FileType::File, perm, 0), (uid, gid), b"")
    }

    pub fn mkdir(
        &mut self,
        parent: Ino,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Attr, FsError> {
        let parent = parent.0;
        self.make(parent, name, (FileType::Dir, perm, 0), (uid, gid), b"")
    }

    pub fn symlink(
        &mut self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr, FsError> {
        let parent = parent.0;
        if target.is_empty() || target.len() > SYMLINK_MAX {
            return Err(
                PosixError::Invalid { why: format!("symlink targets are 1 to {SYMLINK_MAX} bytes") }.into()
            );
        }
        self.make(parent, name, (FileType::Symlink, 0o777, 0), (uid, gid), target)
    }

    /// A FIFO, socket or device node (no data of its own).
    pub fn mknod(
        &mut self,
        parent: Ino,
        name: &[u8],
        kind: FileType,
        perm: u16,
        rdev: u32,
        (uid, gid): (u32, u32),
    ) -> Result<Attr, FsError> {
        let parent = parent.0;
        match kind {
            FileType::File => self.create(Ino(parent), name, perm, uid, gid),
            FileType::Dir | FileType::Symlink => {
                Err(PosixError::Invalid { why: "mknod makes files and special files".into() }.into())
            }
            _ => self.make(parent, name, (kind, perm, rdev), (uid, gid), b""),
        }
    }

    pub fn readlink(&mut self, ino: Ino) -> Result<Vec<u8>, FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        let i = self.inode(ino)?;
        if i.attr.kind != FileType::Symlink {
            return Err(PosixError::Invalid { why: "not a symlink".into() }.into());
        }
        if !i.target.is_empty() || i.attr.size == 0 {
            return Ok(i.target.clone());
        }
        // A target longer than the inode node holds is the symlink's page 0.
        let len = (i.attr.size as usize).min(SYMLINK_MAX);
        // Not a hole: a target page the index lost reads as an error, not as NULs.
        if self.loc(ino, 0)?.is_none() {
            return Err(Corruption::Unrecoverable { page: 0 }.into());
        }
        let mut page = self.page(ino, 0)?;
        page.truncate(len);
        Ok(page)
    }

    /// A new name `name` in `parent` for the file `ino`.
    pub fn link(&mut self, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr, FsError> {
        let ino = ino.0;
        let parent = parent.0;
        check_name(name)?;
        self.need_inode(ino)?;
        self.need_inode(parent)?;
        self.need_entry(parent, name)?;
        if self.inode(ino)?.attr.kind == FileType::Dir {
            return Err(PosixError::IsDir.into());
        }
        if self.dir(parent)?.contains_key(name) {
            return Err(PosixError::Exists.into());
        }
        self.reserve(0, 1)?;
        self.ns.add_entry(parent, name, ino);
        self.ns.link(ino, now());
        self.ns.touch(parent, now());
        let nodes =
            vec![self.inode_node(ino), Fs::<N>::dirent_node(parent, name, ino), self.inode_node(parent)];
        self.commit(nodes)?;
        self.getattr(Ino(ino))
    }

    /// Notes an open handle on `ino` (it keeps an unlinked file alive).
    pub fn open_file(&mut self, ino: Ino) -> Result<(), FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        self.inode(ino)?;
        self.ns.open(ino);
        Ok(())
    }

    /// Drops an open handle; the last one on an unlinked file lets it go.
    pub fn release_file(&mut self, ino: Ino) {
        let ino = ino.0;
        if self.ns.release(ino) {
            self.forget_if_unlinked(ino);
        }
    }

    fn forget_if_unlinked(&mut self, ino: u64) {
        if self.ns.is_open(ino) {
            return;
        }
        if self.ns.get(ino).is_some_and(|i| i.attr.nlink == 0) {
            self.ns.remove(ino);
            // Its group may have been written since the node with no link (by a checkpoint
            // the cleaner wrote inside the operation): written again, without it.
            self.groups.mark_inode(ino);
            // A map beyond repair cannot stop the file's removal (its chunks go whole).
            let _ = self.remove_pages(ino, 0, None);
            self.cache.forget_from(ino, 0);
            self.wb.forget(ino);
            self.reserved.take(ino, 0..u64::MAX);
            // The tier's pages of a file that is gone are dropped at recovery anyway: a
            // failure here loses nothing.
            let _ = self.tier_drop(ino, 0..u64::MAX);
        }
    }

    pub fn unlink(&mut self, parent: Ino, name: &[u8]) -> Result<(), FsError> {
        let parent = parent.0;
        self.need_inode(parent)?;
        self.need_entry(parent, name)?;
        let ino = *self.dir(parent)?.get(name).ok_or(FsError::Posix(PosixError::NotFound))?;
        self.need_inode(ino)?;
        self.need_file_maps(ino)?;
        if self.inode(ino)?.attr.kind == FileType::Dir {
            return Err(PosixError::IsDir.into());
        }
        self.ns.remove_entry(parent, name);
        self.ns.drop_link(ino, now());
        self.ns.touch(parent, now());
        let nodes =
            vec![Fs::<N>::dirent_node(parent, name, 0), self.inode_node(ino), self.inode_node(parent)];
        self.commit(nodes)?;
        self.forget_if_unlinked(ino);
        Ok(())
    }

    pub fn rmdir(&mut self, parent: Ino, name: &[u8]) -> Result<(), FsError> {
        let parent = parent.0;
        self.need_inode(parent)?;
        self.need_entry(parent, name)?;
        let ino = *self.dir(parent)?.get(name).ok_or(FsError::Posix(PosixError::NotFound))?;
        self.need_inode(ino)?;
        self.need_dir(ino)?;
        if !self.dir(ino)?.is_empty() {
            return Err(PosixError::NotEmpty.into());
        }
        self.ns.remove_entry(parent, name);
        self.ns.drop_link(ino, now());
        self.ns.touch(parent, now());
        let nodes =
            vec![Fs::<N>::dirent_node(parent, name, 0), self.inode_node(ino), self.inode_node(parent)];
        self.commit(nodes)?;
        self.forget_if_unlinked(ino);
        Ok(())
    }

    /// Renames atomically, replacing an existing target (a file by a file, an empty directory
    /// by a directory), as rename(2) does.
    pub fn rename(
        &mut self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
    ) -> Result<(), FsError> {
        let parent = parent.0;
        let newparent = newparent.0;
        check_name(newname)?;
        for (dir, n) in [(parent, name), (newparent, newname)] {
            self.need_inode(dir)?;
            self.need_entry(dir, n)?;
        }
        let ino = *self.dir(parent)?.get(name).ok_or(FsError::Posix(PosixError::NotFound))?;
        self.dir(newparent)?;
        self.need_inode(ino)?;
        let is_dir = self.inode(ino)?.attr.kind == FileType::Dir;
        if is_dir && parent != newparent {
            // Whether the target lies under the directory walks its parents up to the root.
            let mut d = newparent;
            while d != ino && d != ROOT.0 {
                self.need_parent(d)?;
                let Some(p) = self.ns.parent_of(d) else { break };
                d = p;
            }
        }
        if let Some(old) = self.dir(newparent)?.get(newname).copied() {
            self.need_inode(old)?;
            self.need_dir(old)?;
            self.need_file_maps(old)?;
        }
        if is_dir && self.ns.is_under(newparent, ino) {
            return Err(PosixError::Invalid { why: "a directory cannot move under itself".into() }.into());
        }
        let replaced = self.dir(newparent)?.get(newname).copied();
        if replaced == Some(ino) {
            return Ok(());
        }
        if let Some(old) = replaced {
            match (is_dir, self.inode(old)?.attr.kind == FileType::Dir) {
                (true, false) => return Err(PosixError::NotDir.into()),
                (false, true) => return Err(PosixError::IsDir.into()),
                (true, true) if !self.dir(old)?.is_empty() => return Err(PosixError::NotEmpty.into()),
                _ => {}
            }
        }
        // The replaced name goes first, so that each directory's link count follows its
        // entries (a directory's name in its parent is a link of the parent).
        if replaced.is_some() {
            self.ns.remove_entry(newparent, newname);
        }
        self.ns.remove_entry(parent, name);
        self.ns.add_entry(newparent, newname, ino);
        let mut nodes = vec![Fs::<N>::dirent_node(newparent, newname, ino)];
        if parent != newparent || name != newname {
            nodes.push(Fs::<N>::dirent_node(parent, name, 0));
        }
        if let Some(old) = replaced {
            self.ns.drop_link(old, now());
            nodes.push(self.inode_node(old));
        }
        self.ns.set_ctime(ino, now());
        self.ns.touch(parent, now());
        self.ns.touch(newparent, now());
        nodes.push(self.inode_node(ino));
        nodes.push(self.inode_node(parent));
        if newparent != parent {
            nodes.push(self.inode_node(newparent));
        }
        self.commit(nodes)?;
        if let Some(old) = replaced {
            self.forget_if_unlinked(old);
        }
        Ok(())
    }

    /// Changes attributes; a size change truncates or extends with zeros.
    pub fn setattr(&mut self, ino: Ino, set: SetAttr) -> Result<Attr, FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        if set.size.is_some() {
            self.need_file_maps(ino)?;
        }
        let kind = self.inode(ino)?.attr.kind;
        if let Some(size) = set.size {
            if kind != FileType::File {
                return Err(if kind == FileType::Dir {
                    FsError::Posix(PosixError::IsDir)
                } else {
                    FsError::Posix(PosixError::Invalid { why: "not a file".into() })
                });
            }
            self.truncate(ino, size)?;
        }
        self.ns.set_attrs(ino, &set, now());
        let n = self.inode_node(ino);
        self.commit(vec![n])?;
        self.getattr(Ino(ino))
    }

    fn truncate(&mut self, ino: u64, size: u64) -> Result<(), FsError> {
        let old = self.inode(ino)?.attr.size;
        if size < old {
            // The tier learns the new size first: a crash in the middle then recovers the
            // truncate whole (recovery cuts the pages at the size).
            self.ns.set_size(ino, size);
            self.tier_inode(ino)?;
            let keep = size.div_ceil(LOGICAL_PAGE as u64);
            // The bytes after the new end of the last page must read as zero if the file grows
            // again: rewrite that page cut.
            let tail = (size % LOGICAL_PAGE as u64) as usize;
            if tail != 0 {
                let mut page = self.page_to_change(ino, keep - 1)?;
                page.cut(tail);
                self.tier_page((ino, keep - 1), &page, tail..LOGICAL_PAGE)?;
                self.set_dirty((ino, keep - 1), page);
            }
            self.remove_pages(ino, keep, None)?;
            self.wb.drop_pages(ino, keep..u64::MAX);
            self.tier_drop(ino, keep..u64::MAX)?;
            self.cache.forget_from(ino, keep);
            self.reserved.take(ino, keep..u64::MAX);
            self.ns.set_size(ino, size);
            // The new size goes into the log before the cut page: a crash keeps a prefix of
            // the log, so the cut page (zeros past the end) is never found under the old
            // size. Then the pages are written, before any later data, so older pages past
            // the end never come back at mount.
            let n = self.inode_node(ino);
            self.commit(vec![n])?;
            self.flush_data()?;
        } else {
            self.zero_past_end(ino, old)?;
            self.ns.set_size(ino, size);
        }
        self.ns.touch(ino, now());
        Ok(())
    }

    /// Before file `ino` grows past `end` with a gap: the bytes of its last page past `end`
    /// read as zeros. They are zeros unless a crash kept a truncate's new size without the
    /// page it cut (the size goes into the log first); then they are cut now, before the
    /// gap shows them.
    fn zero_past_end(&mut self, ino: u64, end: u64) -> Result<(), FsError> {
        let tail = (end % LOGICAL_PAGE as u64) as usize;
        if tail == 0 {
            return Ok(());
        }
        let index = end / LOGICAL_PAGE as u64;
        let was_dirty = self.wb.contains((ino, index));
        let mut page = self.page_to_change(ino, index)?;
        if page.bytes[tail..].iter().all(|&b| b == 0) {
            // As it was: a dirty page goes back; a clean one needs no write.
            if was_dirty {
                self.set_dirty((ino, index), page);
            }
            return Ok(());
        }
        page.cut(tail);
        self.tier_page((ino, index), &page, tail..LOGICAL_PAGE)?;
        self.set_dirty((ino, index), page);
        Ok(())
    }

    /// Logical page `index` of file `ino` (see [`Fs::page_and_crc`]).
    pub(crate) fn page(&mut self, ino: u64, index: u64) -> Result<Vec<u8>, FsError> {
        Ok(self.page_and_crc(ino, index)?.0)
    }

    /// Logical page `index` of `ino` as a dirty page about to change: the dirty one taken out,
    /// else the page read with the CRC that came with it.
    pub(crate) fn page_to_change(&mut self, ino: u64, index: u64) -> Result<DirtyPage, FsError> {
        if let Some(p) = self.wb.take((ino, index)) {
            return Ok(p);
        }
        let (bytes, crc) = self.page_and_crc(ino, index)?;
        Ok(DirtyPage::with_crc(bytes, crc))
    }

    /// Makes `page` the dirty copy of `key`; a clean copy cached is forgotten.
    pub(crate) fn set_dirty(&mut self, key: (u64, u64), page: DirtyPage) {
        self.cache.forget(key);
        self.wb.put(key, page);
    }

    /// Logical page `index` of file `ino` and its CRC-32C: the dirty copy, else the cached
    /// clean copy, each checked if the read strategy says it is due (`cache.rs`), else from
    /// the flash (verified, CRC checked, repaired pages rewritten) and cached with the CRC
    /// the index holds, else zeros (a hole).
    pub(crate) fn page_and_crc(&mut self, ino: u64, index: u64) -> Result<(Vec<u8>, u32), FsError> {
        let key = (ino, index);
        self.cache.count_read();
        if let Some(p) = self.wb.get_mut(key) {
            if let Err(e) = self.cache.check_dirty(key, p) {
                if !self.heal_dirty(key) {
                    return Err(e);
                }
            }
            let p = self.wb.get_mut(key).expect("dirty above");
            return Ok((p.bytes.clone(), p.crc));
        }
        if let Some((bytes, crc)) = self.cache.get(key) {
            return Ok((bytes, crc));
        }
        let Some(loc) = self.loc(ino, index)? else { return Ok((vec![0; LOGICAL_PAGE], zero_page_crc())) };
        let slot = loc.slot as usize;
        let unreadable = |fs: &mut Self| {
            fs.stats.unreadable += 1;
            FsError::Corrupt(Corruption::Unrecoverable { page: loc.frags.first().map_or(0, |f| f.0) })
        };
        // A place past the page's own index can only come from a damaged map.
        let Some(first) = index.checked_sub(slot as u64) else { return Err(unreadable(self)) };
        let node_key = (ino, first, loc.version);
        let span = slot * LOGICAL_PAGE..(slot + 1) * LOGICAL_PAGE;
        // A node decoded for an earlier page is reused only where the index holds the page's
        // CRC to check it against (the payload's is not kept).
        let cached = self.read_cache.last_node.as_ref().filter(|n| n.0 == node_key && loc.count > 1);
        let (page, repaired) = match cached.filter(|_| loc.crc.is_some()) {
            Some((_, pages, repaired)) => {
                let page = pages[span].to_vec();
                if loc.crc != Some(bitmend_code::crc::crc32c(&page)) {
                    return Err(unreadable(self));
                }
                (page, *repaired)
            }
            None => {
                let (payload, repaired) = self.read_payload(&loc.frags)?;
                let Some(mut pages) = checked_node(&payload, &loc) else {
                    return Err(unreadable(self));
                };
                if loc.count > 1 {
                    let page = pages[span].to_vec();
                    self.read_cache.last_node = Some((node_key, pages, repaired));
                    (page, repaired)
                } else {
                    pages.truncate(LOGICAL_PAGE);
                    (pages, repaired)
                }
            }
        };
        // The CRC the store checked the page against (images that recorded none: computed,
        // as the flash read did not check one).
        let crc = loc.crc.unwrap_or_else(|| bitmend_code::crc::crc32c(&page));
        if repaired {
            // Rewrite the logical page elsewhere, away from the damaged flash page.
            self.stats.relocated += 1;
            self.set_dirty(key, DirtyPage::with_crc(page.clone(), crc));
        } else {
            self.cache.insert(key, &page, crc);
        }
        Ok((page, crc))
    }

    /// Whether page `key` is held in RAM: dirty, or clean in the cache (not checked, not
    /// counted as a use).
    pub(crate) fn cached(&self, key: (u64, u64)) -> bool {
        self.wb.contains(key) || self.cache.contains(key)
    }

    /// A node's payload from its fragments: bytes still in the page being filled, in the
    /// cache of recent flash pages, or read (verified) from the flash; and whether a flash
    /// page under it had to be repaired.
    pub(crate) fn read_payload(&mut self, frags: &[(u32, u16, u16)]) -> Result<(Vec<u8>, bool), FsError> {
        let ps = self.page.size();
        let mut payload = Vec::with_capacity(LOGICAL_PAGE + 64);
        let mut repaired = false;
        for &(page, off, len) in frags {
            let (off, len) = (off as usize, len as usize);
            // A fragment outside its page can only come from a damaged (or hostile) index:
            // the logical page is unreadable, never a panic.
            let bad = || FsError::Corrupt(Corruption::Unrecoverable { page });
            if page == PENDING {
                payload.extend_from_slice(self.page.bytes(off..off + len).ok_or_else(bad)?);
                continue;
            }
            if let Some((_, bytes, was_repaired)) = self.read_cache.recent.iter().find(|r| r.0 == page) {
                // A page repaired when it was read repairs every logical page on it.
                repaired |= *was_repaired;
                payload.extend_from_slice(bytes.get(off..off + len).ok_or_else(bad)?);
                continue;
            }
            // The oldest cached page's buffer is reused for this one (no allocation per read).
            let mut flash = if self.read_cache.recent.len() == 2 {
                self.read_cache.recent.remove(0).1
            } else {
                vec![0u8; ps]
            };
            // Every payload read here is checked by its CRC-32C: a page whose spare is lost
            // is still data, for the index says so.
            let how = match self.store.read_claimed(PageAddr(page), &mut flash) {
                Ok(how) => how != Repaired::No,
                Err(e) => {
                    self.stats.unreadable += 1;
                    return Err(e);
                }
            };
            let Some(bytes) = flash.get(off..off + len) else {
                self.stats.unreadable += 1;
                return Err(bad());
            };
            payload.extend_from_slice(bytes);
            repaired |= how;
            self.read_cache.recent.push((page, flash, how));
        }
        Ok((payload, repaired))
    }

    /// Reads up to `len` bytes at `off` (fewer at the end of the file).
    pub fn read(&mut self, ino: Ino, off: u64, len: usize) -> Result<Vec<u8>, FsError> {
        self.need_inode(ino.0)?;
        let span = self.read_span(ino.0, off, len)?;
        let mut out = Vec::with_capacity((span.end - span.start) as usize);
        for (index, within, n) in page_pieces(span) {
            let page = self.page(ino.0, index)?;
            out.extend_from_slice(&page[within..within + n]);
        }
        Ok(out)
    }

    /// The bytes of file `ino` a read of `len` at `off` covers: clipped at its end (empty past
    /// it); an error if it is not a regular file.
    pub(crate) fn read_span(&self, ino: u64, off: u64, len: usize) -> Result<std::ops::Range<u64>, FsError> {
        let i = self.inode(ino)?;
        match i.attr.kind {
            FileType::File => {}
            FileType::Dir => return Err(PosixError::IsDir.into()),
            _ => return Err(PosixError::Invalid { why: "not a regular file".into() }.into()),
        }
        Ok(off..i.attr.size.min(off.saturating_add(len as u64)).max(off))
    }

    /// Writes `data` at `off`, extending the file (with a hole if `off` is past its end).
    pub fn write(&mut self, ino: Ino, off: u64, data: &[u8]) -> Result<usize, FsError> {
        self.write_prepared(ino, PreparedWrite::new(off, data))
    }

    /// As [`write`](Self::write), with the whole pages copied and checksummed already
    /// ([`PreparedWrite::new`], which needs no file system: a mount does it before taking
    /// the lock).
    pub fn write_prepared(&mut self, ino: Ino, prepared: PreparedWrite<'_>) -> Result<usize, FsError> {
        let data = prepared.data;
        let (n, tier) = self.write_staged(ino, prepared)?;
        if let Some(t) = tier {
            let r = t.finish(data);
            self.tier_outcome(r)?;
        }
        Ok(n)
    }

    /// As [`write_prepared`](Self::write_prepared), but the tier's records are left to the
    /// [`TierWrite`] returned (there is one if the mount has a tier), to be made once the
    /// caller has let this file system's lock go: the write is durable, and may be
    /// acknowledged, only after [`TierWrite::finish`] (and, if it says the tier is full,
    /// [`tier_outcome`](Self::tier_outcome) under the lock again).
    pub fn write_staged(
        &mut self,
        ino: Ino,
        prepared: PreparedWrite<'_>,
    ) -> Result<(usize, Option<TierWrite>), FsError> {
        let PreparedWrite { off, data, mut whole } = prepared;
        let ino = ino.0;
        self.need_inode(ino)?;
        match self.inode(ino)?.attr.kind {
            FileType::File => {}
            FileType::Dir => return Err(PosixError::IsDir.into()),
            _ => return Err(PosixError::Invalid { why: "not a regular file".into() }.into()),
        }
        let old_size = self.inode(ino)?.attr.size;
        if off > old_size {
            self.zero_past_end(ino, old_size)?;
        }
        let mut pos = off;
        let Some(end) = off.checked_add(data.len() as u64) else {
            return Err(PosixError::Invalid { why: "a write past the largest offset".into() }.into());
        };
        let pages = off / LOGICAL_PAGE as u64..end.div_ceil(LOGICAL_PAGE as u64);
        // A page whose index chunk is beyond repair cannot be written (its map could only
        // be rewritten without the lost entries, turning them into holes): refused here,
        // not accepted and dropped at write-back.
        for ck in pages.clone().step_by(super::CHUNK_PAGES as usize) {
            self.load_chunk(super::map::keys::chunk_key(ino, ck))?;
        }
        self.load_chunk(super::map::keys::chunk_key(ino, pages.end.saturating_sub(1)))?;
        let new = pages.clone().filter(|&i| !self.wb.contains((ino, i))).count() as u64;
        // Write-back at the limit comes before this write is staged: a write refused there
        // (the chip or the host under the image full) changes nothing. Staged first, its new
        // size went to flash with the flush's inode nodes and outlived the refusal (a test of
        // a full host found it: after a crash the file was one refused write longer).
        if self.wb.dirty_bytes() + new as usize * LOGICAL_PAGE > self.write_back_limit() {
            self.flush_data()?;
        }
        // Pages fallocate reserved are paid for: the write takes their reservation over.
        let held = self.reserved.count(ino, pages.clone());
        self.reserve(new.saturating_sub(held), 0)?;
        self.reserved.take(ino, pages);
        self.wb.note_unsynced();
        let mut changed = Vec::with_capacity(data.len() / LOGICAL_PAGE + 2);
        let mut whole_crcs = Vec::with_capacity(data.len() / LOGICAL_PAGE);
        while pos < end {
            let index = pos / LOGICAL_PAGE as u64;
            let within = (pos % LOGICAL_PAGE as u64) as usize;
            let n = (LOGICAL_PAGE - within).min((end - pos) as usize);
            let from = (pos - off) as usize;
            let page = if n == LOGICAL_PAGE {
                let page = whole.next().expect("a prepared page for each whole one");
                debug_assert_eq!(page.bytes, data[from..from + n]);
                whole_crcs.push(page.crc);
                page
            } else {
                let mut page = self.page_to_change(ino, index)?;
                page.overwrite(within, &data[from..from + n]);
                page
            };
            self.set_dirty((ino, index), page);
            changed.push((index, within..within + n));
            pos += n as u64;
        }
        let size = self.inode(ino)?.attr.size;
        self.ns.set_size(ino, size.max(end));
        self.ns.touch(ino, now());
        self.wb.mark_inode(ino);
        // The pages for the tier before write-back may take them; the tier's lock after it,
        // since a checkout (the flush's checkpoint) needs that lock. Put after the flush, the
        // pages are a harmless copy of what flash holds until the next checkout. This flush
        // is only for a write larger than the limit on its own.
        let pages = self.staged_pages((ino, off), &changed, &whole_crcs);
        if self.wb.dirty_bytes() > self.write_back_limit() {
            self.flush_data()?;
        }
        Ok((data.len(), self.tier_write(ino, pages)))
    }

    /// Space in bytes: (total, free), as the budget counts it (see `budget`): total is what
    /// live data and metadata may ever take, free what a write may still reserve.
    pub fn statfs(&self) -> (u64, u64) {
        self.space()
    }

    /// Files that the free space can still hold, each empty with a short name: its inode
    /// record and its directory entry, each a node with its header (`statfs`'s free inodes;
    /// there is no inode table to run out of, only space).
    pub fn free_inodes(&self) -> u64 {
        const SHORT_NAME: usize = 16;
        let empty_file =
            2 * node::FRAG_HEADER + node::INODE_LEN + node::encode_dirent(0, &[0; SHORT_NAME]).len();
        self.space().1 / empty_file as u64
    }
}

/// A write's data with its whole logical pages copied out and checksummed: the part of a
/// write that needs no file system, done before the lock that [`Fs::write_prepared`] holds.
pub struct PreparedWrite<'a> {
    off: u64,
    data: &'a [u8],
    /// The whole pages in order (the partial first and last ones are merged under the lock).
    whole: std::vec::IntoIter<DirtyPage>,
}

impl<'a> PreparedWrite<'a> {
    pub fn new(off: u64, data: &'a [u8]) -> PreparedWrite<'a> {
        let page = LOGICAL_PAGE as u64;
        // A write past the largest offset has no pages: `write_prepared` refuses it.
        let (first_whole, end) =
            match (off.checked_next_multiple_of(page), off.checked_add(data.len() as u64)) {
                (Some(first), Some(end)) => (first, end),
                _ => (0, 0),
            };
        let whole: Vec<DirtyPage> = (first_whole..end / page * page)
            .step_by(LOGICAL_PAGE)
            .map(|at| {
                let from = (at - off) as usize;
                DirtyPage::new(data[from..from + LOGICAL_PAGE].to_vec())
            })
            .collect();
        PreparedWrite { off, data, whole: whole.into_iter() }
    }
}

impl<N: Nand> Fs<N> {
    /// File data as the index knows it: (logical bytes in pages written, bytes they take
    /// in nodes). Their ratio is the compression ratio.
    /// Bytes the live file data takes in flash pages, fragment headers included (what a
    /// copy of the data occupies, before parity; the checkpoint holds the rest).
    pub fn data_footprint(&self) -> u64 {
        self.index.totals().footprint
    }

    /// Bytes the index's map nodes take in flash pages, fragment headers included.
    pub fn index_footprint(&self) -> u64 {
        let frag = crate::fs::node::FRAG_HEADER as u64;
        self.index.maps().values().flat_map(|m| m.frags.iter()).map(|f| f.2 as u64 + frag).sum()
    }

    pub fn data_space(&self) -> (u64, u64) {
        let t = self.index.totals();
        (t.pages * LOGICAL_PAGE as u64, t.stored)
    }
}

/// The logical pages of node `payload`, decoded, where the page `loc` names is the page the
/// index meant: the node's recorded CRC for it is the index's (where the index has one: a
/// node that is not the page the index meant is as bad as a wrong byte), and the decoded
/// page matches it. Each page is checked alone: one that fails does not take the pages
/// stored with it down too. None: unreadable.
pub(crate) fn checked_node(payload: &[u8], loc: &Loc) -> Option<Vec<u8>> {
    let slot = loc.slot as usize;
    let span = slot * LOGICAL_PAGE..(slot + 1) * LOGICAL_PAGE;
    let recorded = node::recorded_crc(payload, slot)?;
    if loc.crc.is_some_and(|c| c != recorded) {
        return None;
    }
    let pages = node::decode_pages(payload, loc.codec, loc.count as usize)?;
    let page = pages.get(span)?;
    (bitmend_code::crc::crc32c(page) == recorded).then_some(pages)
}

/// The pieces of logical pages the bytes `span` of a file cover, in order: (page, offset in
/// the page, length).
pub(crate) fn page_pieces(span: std::ops::Range<u64>) -> impl Iterator<Item = (u64, usize, usize)> {
    let page = LOGICAL_PAGE as u64;
    let mut pos = span.start;
    std::iter::from_fn(move || {
        (pos < span.end).then(|| {
            let within = (pos % page) as usize;
            let n = (LOGICAL_PAGE - within).min((span.end - pos) as usize);
            let piece = (pos / page, within, n);
            pos += n as u64;
            piece
        })
    })
}
