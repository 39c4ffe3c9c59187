//! Writing nodes: metadata operations whole in one page, file data fragmented across pages,
//! data before the inodes that refer to it.

use bitmend_media::nand::Nand;

use super::{Fs, Loc, PENDING, SKIP_AFTER_INCOMPRESSIBLE};
use crate::node::{self, Frag, NodeKind, FLAG_LAST, FRAG_HEADER};
use crate::store::PageAddr;
use crate::FsError;

/// Where the fragments of a node being written are recorded.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pending {
    /// A logical page's location (ino, page index).
    Data((u64, u64)),
    /// A chunk's map node (ino, chunk).
    Map((u64, u64)),
}

/// A node about to be written.
pub(crate) struct Out {
    pub kind: NodeKind,
    pub key: u64,
    pub key2: u64,
    pub payload: Vec<u8>,
}

impl<N: Nand> Fs<N> {
    pub(crate) fn inode_node(&self, ino: u64) -> Out {
        let i = &self.inodes[&ino];
        Out { kind: NodeKind::Inode, key: ino, key2: 0, payload: node::encode_inode(&i.attr, &i.target) }
    }

    pub(crate) fn dirent_node(parent: u64, name: &[u8], child: u64) -> Out {
        Out { kind: NodeKind::Dirent, key: parent, key2: 0, payload: node::encode_dirent(child, name) }
    }

    /// Appends the page being filled to the store (zeros after the last fragment) and points
    /// the fragments that were pending in it at their flash page. A new segment starts with a
    /// page naming the newest checkpoint.
    pub(crate) fn seal_page(&mut self) -> Result<PageAddr, FsError> {
        self.seal_page_with(false)
    }

    /// As [`seal_page`](Self::seal_page); `marked` flags the page in its spare as the start of
    /// a checkpoint.
    pub(crate) fn seal_page_with(&mut self, marked: bool) -> Result<PageAddr, FsError> {
        if self.store.next_page_opens_segment() {
            let info = self.segment_info_page();
            self.store.append(&info)?;
            self.set_mount_ckpt();
        }
        self.buf[self.fill..].fill(0);
        let addr =
            if marked { self.store.append_marked(&self.buf)? } else { self.store.append(&self.buf)? };
        let keys = std::mem::take(&mut self.buf_keys);
        self.fix_pending(addr, keys);
        self.fill = 0;
        Ok(addr)
    }

    fn put_frag(&mut self, f: &Frag, payload: &[u8]) -> u16 {
        let at = self.fill;
        f.encode(&mut self.buf[at..at + FRAG_HEADER]);
        self.buf[at + FRAG_HEADER..at + FRAG_HEADER + payload.len()].copy_from_slice(payload);
        self.fill += FRAG_HEADER + payload.len();
        (at + FRAG_HEADER) as u16
    }

    /// Writes the nodes of one metadata operation into one page (starting a fresh page if the
    /// current one has no room for all of them), so that they reach the flash together.
    pub(crate) fn commit(&mut self, nodes: Vec<Out>) -> Result<(), FsError> {
        let need: usize = nodes.iter().map(|n| FRAG_HEADER + n.payload.len()).sum();
        if need > self.buf.len() {
            return Err(FsError::Invalid {
                why: format!("an operation of {need} bytes does not fit in a page"),
            });
        }
        if self.fill + need > self.buf.len() {
            self.seal_page()?;
        }
        for n in nodes {
            self.version += 1;
            if n.kind == NodeKind::Inode {
                if let Some(i) = self.inodes.get_mut(&n.key) {
                    i.version = self.version;
                }
            }
            let f = Frag {
                kind: n.kind,
                flags: FLAG_LAST,
                len: n.payload.len() as u16,
                total: n.payload.len() as u32,
                key: n.key,
                key2: n.key2,
                version: self.version,
            };
            self.put_frag(&f, &n.payload);
        }
        self.maybe_clean()
    }

    /// Writes one logical page of file data as a data node, in fragments across as many flash
    /// pages as it needs; the index entry is in place (with pending fragments) on return.
    fn write_data_node(&mut self, ino: u64, index: u64, page: &[u8]) -> Result<(), FsError> {
        // After a page of a file that compressed poorly (by less than an eighth), the next
        // pages of that file are stored plain without trying (then one is tried again): data
        // that does not compress (media, archives, encrypted files) does not pay for an
        // attempt per page, which costs more CPU than the whole rest of the write path.
        let wanted = self.opts.compression.flag();
        let attempt = match self.skip_compression.get_mut(&ino) {
            Some(left) if *left > 0 => {
                *left -= 1;
                self.stats.compression_skipped += 1;
                0
            }
            _ => wanted,
        };
        let (payload, codec, crc) = node::encode_data(page, attempt, self.opts.lz4_level);
        if attempt != 0 {
            // The payload carries a 4-byte CRC before the page. Judged on the page's bytes up
            // to its trailing zeros: a short last page (or a hole) says nothing of the rest.
            let content = page.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            if content >= page.len() / 2 && (codec == 0 || payload.len() - 4 > content - content / 8) {
                if self.skip_compression.len() >= 4096 {
                    self.skip_compression.clear();
                }
                self.skip_compression.insert(ino, SKIP_AFTER_INCOMPRESSIBLE);
            } else {
                self.skip_compression.remove(&ino);
            }
        }
        self.stats.data_bytes += page.len() as u64;
        self.stats.data_stored += payload.len() as u64;
        self.version += 1;
        let version = self.version;
        let key = (ino, index);
        self.set_loc(key, Loc { frags: Vec::new(), codec, version, crc: Some(crc) })?;
        self.put_node(NodeKind::Data, codec, key, version, &payload, Pending::Data(key))
    }

    /// Writes a node in fragments across as many flash pages as it needs, recording each
    /// fragment (pending until its page is sealed) where `into` says.
    pub(crate) fn put_node(
        &mut self,
        kind: NodeKind,
        codec: u8,
        key: (u64, u64),
        version: u64,
        payload: &[u8],
        into: Pending,
    ) -> Result<(), FsError> {
        let mut done = 0;
        while done < payload.len() {
            // A fragment needs its header and at least a few bytes: otherwise start afresh.
            if self.fill + FRAG_HEADER + 16 > self.buf.len() {
                self.seal_page()?;
            }
            let room = self.buf.len() - self.fill - FRAG_HEADER;
            let n = room.min(payload.len() - done);
            let last = done + n == payload.len();
            let f = Frag {
                kind,
                flags: codec | if last { FLAG_LAST } else { 0 },
                len: n as u16,
                total: payload.len() as u32,
                key: key.0,
                key2: key.1,
                version,
            };
            let off = self.put_frag(&f, &payload[done..done + n]);
            match into {
                Pending::Data(key) => {
                    self.push_pending(key, off, n as u16);
                    if !self.buf_keys.contains(&key) {
                        self.buf_keys.push(key);
                    }
                }
                Pending::Map(ck) => {
                    if let Some(m) = self.index.maps.get_mut(&ck) {
                        m.frags.push((PENDING, off, n as u16));
                    }
                    if !self.index.buf_maps.contains(&ck) {
                        self.index.buf_maps.push(ck);
                    }
                }
            }
            done += n;
        }
        Ok(())
    }

    /// Writes every dirty logical page, then the inodes whose size or times changed.
    pub(crate) fn flush_data(&mut self) -> Result<(), FsError> {
        let dirty = std::mem::take(&mut self.dirty);
        for ((ino, index), page) in dirty {
            if self.inodes.contains_key(&ino) {
                self.write_data_node(ino, index, &page)?;
            }
        }
        for ino in std::mem::take(&mut self.dirty_inodes) {
            if self.inodes.contains_key(&ino) {
                let n = self.inode_node(ino);
                self.commit(vec![n])?;
            }
        }
        self.maybe_clean()?;
        self.maybe_checkpoint()
    }

    /// Writes out everything and makes it durable and correctable.
    pub fn sync(&mut self) -> Result<(), FsError> {
        self.flush_data()?;
        if self.fill > 0 {
            self.seal_page()?;
        }
        self.store.sync()
    }

    /// `fsync`: as `sync` (one log, so one file's durability is everyone's).
    pub fn fsync(&mut self, ino: u64) -> Result<(), FsError> {
        if !self.inodes.contains_key(&ino) {
            return Err(FsError::NotFound);
        }
        self.sync()
    }

    pub(crate) fn dirty_bytes(&self) -> usize {
        self.dirty.len() * super::LOGICAL_PAGE
    }
}
