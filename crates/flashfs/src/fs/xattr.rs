//! Extended attributes (version 7): all of an inode's attributes in one node, written whole
//! on every change in a page of its own, so a change survives a crash whole or not at all,
//! as every metadata operation does. The checkpoint carries them beside the inodes.
//!
//! Like ext4 without its `ea_inode` feature, an inode's attributes together fit in one
//! block: here a flash page less a fragment header (2,016 bytes on 2 KiB pages, 4,064 on
//! 4 KiB ones). A set that would not fit is refused with E2BIG.

use bitmend_media::nand::Nand;

use super::write::Out;
use super::Ino;
use super::{now, Fs};
use crate::fs::node::{self, NodeKind};
use crate::FsError;
use crate::PosixError;

/// The namespaces Linux passes to a file system; a name must start with one of them and
/// have more after it.
const NAMESPACES: [&[u8]; 4] = [b"user.", b"security.", b"system.", b"trusted."];
/// Longest attribute name (Linux's XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;

/// How `setxattr` treats an attribute that exists or does not (XATTR_CREATE, XATTR_REPLACE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrMode {
    /// Create it or replace it.
    #[default]
    Any,
    /// Fail with `Exists` if it exists.
    Create,
    /// Fail with `NoXattr` if it does not.
    Replace,
}

fn check_xattr_name(name: &[u8]) -> Result<(), FsError> {
    if name.len() > XATTR_NAME_MAX {
        return Err(PosixError::NameTooLong.into());
    }
    if !NAMESPACES.iter().any(|ns| name.len() > ns.len() && name.starts_with(ns)) || name.contains(&0) {
        return Err(PosixError::Unsupported {
            why: "attribute names are user., security., system. or trusted. and more".into(),
        }
        .into());
    }
    Ok(())
}

impl<N: Nand> Fs<N> {
    /// Bytes an inode's attributes may take together (their node's payload).
    pub fn xattr_room(&self) -> usize {
        self.page.size() - crate::fs::node::FRAG_HEADER
    }

    /// The value of attribute `name` of `ino`.
    pub fn getxattr(&mut self, ino: Ino, name: &[u8]) -> Result<Vec<u8>, FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        check_xattr_name(name)?;
        self.inode(ino)?.xattrs.get(name).cloned().ok_or(FsError::Posix(PosixError::NoXattr))
    }

    /// The names of the attributes of `ino`, in order.
    pub fn listxattr(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>, FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        Ok(self.inode(ino)?.xattrs.keys().cloned().collect())
    }

    /// Sets attribute `name` of `ino` to `value`.
    pub fn setxattr(&mut self, ino: Ino, name: &[u8], value: &[u8], mode: XattrMode) -> Result<(), FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        check_xattr_name(name)?;
        let mut set = self.inode(ino)?.xattrs.clone();
        match (mode, set.contains_key(name)) {
            (XattrMode::Create, true) => return Err(PosixError::Exists.into()),
            (XattrMode::Replace, false) => return Err(PosixError::NoXattr.into()),
            _ => {}
        }
        set.insert(name.to_vec(), value.to_vec());
        if node::xattrs_len(&set) > self.xattr_room() {
            return Err(PosixError::XattrTooBig { room: self.xattr_room() }.into());
        }
        self.reserve(0, 1)?;
        self.put_xattrs(ino, set)
    }

    /// Removes attribute `name` of `ino`.
    pub fn removexattr(&mut self, ino: Ino, name: &[u8]) -> Result<(), FsError> {
        let ino = ino.0;
        self.need_inode(ino)?;
        check_xattr_name(name)?;
        let mut set = self.inode(ino)?.xattrs.clone();
        if set.remove(name).is_none() {
            return Err(PosixError::NoXattr.into());
        }
        self.put_xattrs(ino, set)
    }

    /// What a write or truncate by an unprivileged caller, or a change of owner, does to an
    /// executable's privileges (Linux's rule): set-user-ID cleared, set-group-ID cleared if
    /// the group may execute (else it marks mandatory locking), and the file capability
    /// (`security.capability`) removed. Nothing is written if there is nothing to clear.
    pub fn drop_privileges(&mut self, ino: Ino) -> Result<(), FsError> {
        self.need_inode(ino.0)?;
        let perm = self.inode(ino.0)?.attr.perm;
        let mut kept = perm & !0o4000;
        if kept & 0o010 != 0 {
            kept &= !0o2000;
        }
        if kept != perm {
            self.setattr(ino, super::SetAttr { perm: Some(kept), ..Default::default() })?;
        }
        if self.inode(ino.0)?.xattrs.contains_key(&b"security.capability"[..]) {
            self.removexattr(ino, b"security.capability")?;
        }
        Ok(())
    }

    /// Writes `set` as the attributes of `ino` (in a page of its own); the inode's new ctime
    /// goes with the next write-back.
    fn put_xattrs(&mut self, ino: u64, set: node::Xattrs) -> Result<(), FsError> {
        let payload = node::encode_xattrs(&set);
        debug_assert_eq!(node::decode_xattrs(&payload).as_ref(), Some(&set));
        self.ns.set_xattrs(ino, set, 0);
        self.ns.set_ctime(ino, now());
        self.wb.mark_inode(ino);
        self.commit(vec![Out { kind: NodeKind::Xattr, key: ino, key2: 0, payload }])?;
        // The version the node was written with (replay keeps the newest).
        let version = self.page.last_version();
        self.ns.set_xattr_version(ino, version);
        Ok(())
    }
}
