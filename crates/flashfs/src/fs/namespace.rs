//! The namespace: inodes, directories, inode numbers and open handles, as the operations
//! (`ops.rs`) change them and replay and checkpoints rebuild them.

use std::collections::{BTreeMap, HashMap};

use bitmend_code::le::{Put, Reader};

use super::node::{self, Attr, Xattrs};
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
