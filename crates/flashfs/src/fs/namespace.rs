//! The namespace: inodes, directories, inode numbers and open handles, as the operations
//! (`ops.rs`) change them and replay and checkpoints rebuild them.

use std::collections::{BTreeMap, HashMap};

use super::node::{Attr, Xattrs};
use super::ROOT;

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
}

/// Every file, directory and symlink, and who holds them open.
#[derive(Debug)]
pub(crate) struct Namespace {
    pub inodes: HashMap<u64, Inode>,
    /// Each directory's entries: name to inode number.
    pub dirs: HashMap<u64, BTreeMap<Vec<u8>, u64>>,
    pub next_ino: u64,
    /// Open handles per inode: an unlinked file stays readable until its last close.
    pub open_handles: HashMap<u64, u32>,
}

impl Default for Namespace {
    fn default() -> Self {
        Namespace {
            inodes: HashMap::new(),
            dirs: HashMap::new(),
            next_ino: ROOT.0 + 1,
            open_handles: HashMap::new(),
        }
    }
}

/// A file's inode for unit tests: inode `ino`, its size and times from its number, version
/// three times it.
#[cfg(test)]
pub(crate) fn sample_file(ino: u64) -> Inode {
    use super::node::FileType;
    let t = (1_700_000_000 + ino as i64, 7);
    let attr = Attr {
        ino: super::Ino(ino),
        kind: FileType::File,
        perm: 0o644,
        uid: 1000,
        gid: 1000,
        size: ino * 100,
        nlink: 1,
        atime: t,
        mtime: t,
        ctime: t,
        rdev: 0,
    };
    Inode::new(attr, Vec::new(), ino * 3)
}
