//! The namespace: inodes, directories, inode numbers and open handles, as the operations
//! (`ops.rs`) change them and replay and checkpoints rebuild them.

use std::collections::BTreeMap;

use bitmend_code::le::{Put, Reader};

use super::map::keys::{ino_counter, ino_in, NumberMap};
use super::node::{self, Attr, FileType, Xattrs};
use super::ROOT;

#[derive(Clone, Debug)]
pub(crate) struct Inode {
    pub attr: Attr,
    pub target: Vec<u8>,
    pub version: u64,
    /// Extended attributes, and the version of the node that last set them.
    pub xattrs: Xattrs,
    pub xattr_version: u64,
}

impl Inode {
    pub fn new(attr: Attr, target: Vec<u8>, version: u64) -> Inode {
        Inode { attr, target, version, xattrs: Default::default(), xattr_version: 0 }
    }

    /// This inode (number `ino`) as checkpoints and namespace groups record it: ino u64,
    /// its node's version u64, the inode payload's length u32, then the payload.
    pub fn put_record(&self, ino: u64, v: &mut Vec<u8>) {
        v.put_u64(ino);
        v.put_u64(self.version);
        let len_at = v.len();
        v.put_u32(0);
        node::encode_inode_into(v, &self.attr, &self.target);
        let len = (v.len() - len_at - 4) as u32;
        v[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// An inode record (as [`Inode::put_record`] writes it), and its number; `None` for
    /// bytes that are not one.
    pub fn take_record(r: &mut Reader) -> Option<(u64, Inode)> {
        let ino = r.u64()?;
        let version = r.u64()?;
        let len = r.u32()? as usize;
        let (attr, target) = node::decode_inode(ino, r.take(len)?)?;
        Some((ino, Inode::new(attr, target, version)))
    }
}

/// Every file, directory and symlink, and who holds them open. Its tables are its own: the
/// operations and replay say what changed through the methods below, and nothing else
/// writes them (scripts/parts.sh checks it).
#[derive(Debug)]
pub(crate) struct Namespace {
    inodes: NumberMap<u64, Inode>,
    /// Each directory's entries: name to inode number.
    dirs: NumberMap<u64, BTreeMap<Vec<u8>, u64>>,
    next_ino: u64,
    /// Open handles per inode: an unlinked file stays readable until its last close.
    open_handles: NumberMap<u64, u32>,
}

impl Default for Namespace {
    fn default() -> Self {
        Namespace {
            inodes: NumberMap::default(),
            dirs: NumberMap::default(),
            next_ino: ROOT.0 + 1,
            open_handles: NumberMap::default(),
        }
    }
}

/// What [`Namespace::prune`] dropped, for the groups that held it.
#[derive(Debug, Default)]
pub(crate) struct Pruned {
    pub inodes: Vec<u64>,
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// Reading.
impl Namespace {
    pub fn get(&self, ino: u64) -> Option<&Inode> {
        self.inodes.get(&ino)
    }

    pub fn contains(&self, ino: u64) -> bool {
        self.inodes.contains_key(&ino)
    }

    /// Files, directories and symlinks.
    pub fn len(&self) -> usize {
        self.inodes.len()
    }

    /// Directory `dir`'s entries; `None` if it is no directory.
    pub fn entries(&self, dir: u64) -> Option<&BTreeMap<Vec<u8>, u64>> {
        self.dirs.get(&dir)
    }

    pub fn inodes(&self) -> impl Iterator<Item = (&u64, &Inode)> {
        self.inodes.iter()
    }

    pub fn dirs(&self) -> impl Iterator<Item = (&u64, &BTreeMap<Vec<u8>, u64>)> {
        self.dirs.iter()
    }

    /// The number the next new inode gets.
    pub fn next_ino(&self) -> u64 {
        self.next_ino
    }

    /// The directory listing directory `dir` (one, for a directory); `None` for the root.
    pub fn parent_of(&self, dir: u64) -> Option<u64> {
        self.dirs.iter().find(|(_, e)| e.values().any(|&c| c == dir)).map(|(&p, _)| p)
    }

    /// Whether `dir` is `ino` or lies under it.
    pub fn is_under(&self, dir: u64, ino: u64) -> bool {
        let mut d = dir;
        loop {
            if d == ino {
                return true;
            }
            if d == ROOT.0 {
                return false;
            }
            match self.parent_of(d) {
                Some(p) => d = p,
                None => return false,
            }
        }
    }

    /// Takes inode `ino` out of memory, not out of the file system: its group is read again
    /// when it is needed (`map/shedding.rs`).
    pub fn forget(&mut self, ino: u64) {
        self.inodes.remove(&ino);
        if self.dirs.get(&ino).is_some_and(|d| d.is_empty()) {
            self.dirs.remove(&ino);
        }
    }

    /// Takes an entry out of memory, as [`forget`](Self::forget) does an inode.
    pub fn forget_entry(&mut self, parent: u64, name: &[u8]) {
        if let Some(d) = self.dirs.get_mut(&parent) {
            d.remove(name);
            if d.is_empty() && !self.inodes.contains_key(&parent) {
                self.dirs.remove(&parent);
            }
        }
    }

    pub fn is_open(&self, ino: u64) -> bool {
        self.open_handles.contains_key(&ino)
    }

    fn attr_mut(&mut self, ino: u64) -> &mut Attr {
        &mut self.inodes.get_mut(&ino).expect("an inode the caller checked").attr
    }
}

/// Changing: each method is one whole change, so that a table never holds half of one.
impl Namespace {
    /// A number for a new inode in directory `dir`: the next counter, in the directory's
    /// region (`keys.rs`); `None` once the counters are spent.
    pub fn allocate_ino(&mut self, dir: u64) -> Option<u64> {
        let ino = ino_in(dir, self.next_ino)?;
        self.next_ino += 1;
        Some(ino)
    }

    /// Puts `inode` in as `ino` (a new one, or one replay or a group found), with an empty
    /// entry table if it is a directory that has none.
    pub fn insert(&mut self, ino: u64, inode: Inode) {
        if inode.attr.kind == FileType::Dir {
            self.dirs.entry(ino).or_default();
        }
        self.inodes.insert(ino, inode);
    }

    /// Puts `inode` in as `ino`, keeping the extended attributes of the inode it replaces
    /// (they have nodes of their own).
    pub fn replace_keeping_xattrs(&mut self, ino: u64, mut inode: Inode) {
        if let Some(old) = self.inodes.remove(&ino) {
            (inode.xattrs, inode.xattr_version) = (old.xattrs, old.xattr_version);
        }
        self.insert(ino, inode);
    }

    /// Removes inode `ino` alone: a directory's entry table stays until [`Namespace::prune`]
    /// names what it held (replay of an inode node with no link left).
    pub fn remove_inode(&mut self, ino: u64) {
        self.inodes.remove(&ino);
    }

    /// Removes inode `ino` and, for a directory, its entry table.
    pub fn remove(&mut self, ino: u64) -> Option<Inode> {
        self.dirs.remove(&ino);
        self.inodes.remove(&ino)
    }

    /// Names `child` as `name` in `parent`; a new subdirectory adds a link to its parent.
    pub fn add_entry(&mut self, parent: u64, name: &[u8], child: u64) {
        if self.inodes.get(&child).is_some_and(|i| i.attr.kind == FileType::Dir) {
            self.attr_mut(parent).nlink += 1;
        }
        self.dirs.entry(parent).or_default().insert(name.to_vec(), child);
    }

    /// Removes `name` from `parent`; a subdirectory's link to its parent goes with it.
    pub fn remove_entry(&mut self, parent: u64, name: &[u8]) -> Option<u64> {
        let child = self.dirs.get_mut(&parent)?.remove(name)?;
        if self.inodes.get(&child).is_some_and(|i| i.attr.kind == FileType::Dir) {
            let p = self.attr_mut(parent);
            p.nlink = p.nlink.saturating_sub(1);
        }
        Some(child)
    }

    /// One more name for `ino`.
    pub fn link(&mut self, ino: u64, t: (i64, u32)) {
        let a = self.attr_mut(ino);
        a.nlink += 1;
        a.ctime = t;
    }

    /// One name of `ino` fewer (a directory's own "." goes with its name); its attributes
    /// after.
    pub fn drop_link(&mut self, ino: u64, t: (i64, u32)) -> Attr {
        let a = self.attr_mut(ino);
        a.nlink = a.nlink.saturating_sub(if a.kind == FileType::Dir { 2 } else { 1 });
        a.ctime = t;
        a.clone()
    }

    /// Content changed: mtime and ctime. Nothing for an inode that is gone.
    pub fn touch(&mut self, ino: u64, t: (i64, u32)) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            (i.attr.mtime, i.attr.ctime) = (t, t);
        }
    }

    /// Attributes changed: ctime.
    pub fn set_ctime(&mut self, ino: u64, t: (i64, u32)) {
        self.attr_mut(ino).ctime = t;
    }

    pub fn set_size(&mut self, ino: u64, size: u64) {
        self.attr_mut(ino).size = size;
    }

    /// `set`'s owner, mode and times (not its size: that is the writer's), and ctime `t`.
    pub fn set_attrs(&mut self, ino: u64, set: &super::SetAttr, t: (i64, u32)) {
        let a = self.attr_mut(ino);
        if let Some(p) = set.perm {
            a.perm = p & 0o7777;
        }
        if let Some(u) = set.uid {
            a.uid = u;
        }
        if let Some(g) = set.gid {
            a.gid = g;
        }
        if let Some(t) = set.atime {
            a.atime = t;
        }
        if let Some(t) = set.mtime {
            a.mtime = t;
        }
        a.ctime = t;
    }

    /// The extended attributes of `ino`, and the version of the node that holds them (0
    /// until it is written); replay keeps only a newer set than the one held.
    pub fn set_xattrs(&mut self, ino: u64, set: Xattrs, version: u64) -> bool {
        match self.inodes.get_mut(&ino) {
            Some(i) if version == 0 || i.xattr_version < version => {
                (i.xattrs, i.xattr_version) = (set, version);
                true
            }
            _ => false,
        }
    }

    /// The version of the inode node just written for `ino` (replay keeps the newest).
    pub fn set_version(&mut self, ino: u64, version: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.version = version;
        }
    }

    /// The version of the node that last wrote `ino`'s extended attributes.
    pub fn set_xattr_version(&mut self, ino: u64, version: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.xattr_version = version;
        }
    }

    /// An open handle on `ino` (it keeps an unlinked file alive).
    pub fn open(&mut self, ino: u64) {
        *self.open_handles.entry(ino).or_insert(0) += 1;
    }

    /// Drops a handle on `ino`; true when it was the last.
    pub fn release(&mut self, ino: u64) -> bool {
        let Some(n) = self.open_handles.get_mut(&ino) else { return false };
        *n -= 1;
        if *n == 0 {
            self.open_handles.remove(&ino);
            return true;
        }
        false
    }
}

/// Rebuilding, at mount.
impl Namespace {
    /// Empty (a replay starts again from another checkpoint).
    pub fn clear(&mut self) {
        self.inodes.clear();
        self.dirs.clear();
    }

    /// The namespace a checkpoint recorded.
    pub fn replace(
        &mut self,
        inodes: NumberMap<u64, Inode>,
        dirs: NumberMap<u64, BTreeMap<Vec<u8>, u64>>,
        next_ino: u64,
    ) {
        (self.inodes, self.dirs, self.next_ino) = (inodes, dirs, next_ino);
    }

    /// A directory entry node replayed: `child` 0 removes the name. Link counts are the
    /// inode nodes' own, not counted here.
    pub fn replay_entry(&mut self, parent: u64, name: Vec<u8>, child: u64) {
        let entries = self.dirs.entry(parent).or_default();
        if child == 0 {
            entries.remove(&name);
        } else {
            entries.insert(name, child);
        }
    }

    /// After replay: drops inodes without a link (kept for readers that a mount no longer
    /// has, but for those in `held_open`), entries of directories that are gone and names of
    /// inodes that are gone; gives every directory an entry table; numbers new inodes past
    /// every one in use.
    pub fn prune(&mut self, held_open: &std::collections::BTreeSet<u64>) -> Pruned {
        let mut pruned = Pruned::default();
        self.inodes.retain(|ino, i| {
            let keep = i.attr.nlink > 0 || held_open.contains(ino);
            if !keep {
                pruned.inodes.push(*ino);
            }
            keep
        });
        let inodes = &self.inodes;
        self.dirs.retain(|d, entries| {
            let keep = inodes.get(d).is_some_and(|i| i.attr.kind == FileType::Dir);
            if !keep {
                pruned.entries.extend(entries.keys().map(|name| (*d, name.clone())));
            }
            keep
        });
        for (parent, entries) in self.dirs.iter_mut() {
            entries.retain(|name, c| {
                let keep = inodes.contains_key(c);
                if !keep {
                    pruned.entries.push((*parent, name.clone()));
                }
                keep
            });
        }
        for (ino, i) in inodes {
            if i.attr.kind == FileType::Dir {
                self.dirs.entry(*ino).or_default();
            }
        }
        let last = self.inodes.keys().map(|&i| ino_counter(i)).max().unwrap_or(ROOT.0);
        self.next_ino = self.next_ino.max(last + 1);
        pruned
    }
}

/// A file's inode for unit tests: inode `ino`, its size and times from its number, version
/// three times it (of its counter, below its region's bits).
#[cfg(test)]
pub(crate) fn sample_file(ino: u64) -> Inode {
    let n = ino_counter(ino);
    let t = (1_700_000_000 + n as i64, 7);
    let attr = Attr {
        ino: super::Ino(ino),
        kind: FileType::File,
        perm: 0o644,
        uid: 1000,
        gid: 1000,
        size: n * 100,
        nlink: 1,
        atime: t,
        mtime: t,
        ctime: t,
        rdev: 0,
    };
    Inode::new(attr, Vec::new(), n * 3)
}
