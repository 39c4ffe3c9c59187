//! A tier's state applied at mount, on top of what replay found: its metadata records as
//! nodes (the rules replay follows), then its pages as dirty pages, each only where its file
//! still holds it.

use std::collections::BTreeSet;

use bitmend_media::nand::Nand;

use super::{DirtyRecoveryReport, MountReport};
use crate::fs::cache::DirtyPage;
use crate::fs::node::{frags, NodeKind, FLAG_LAST};
use crate::fs::scan::Partial;
use crate::fs::{Fs, LOGICAL_PAGE};
use crate::Corruption;
use crate::FsError;

impl<N: Nand> Fs<N> {
    /// Makes the tier just attached hold what recovery kept of it: the pages it dropped
    /// leave the tier, and the pages it cut are put again whole. Until the next checkout
    /// the tier goes on naming them (a chip too full for the recovery's checkpoint), and a
    /// page it still named uncut would come back at the next recovery where the file has
    /// grown since, or be changed in place around bytes the file no longer has.
    pub fn reconcile_dirty_state(&mut self, report: &DirtyRecoveryReport) -> Result<(), FsError> {
        for &(ino, index) in &report.pages_dropped {
            self.tier_drop(ino, index..index + 1)?;
        }
        for &key in &report.pages_cut {
            if let Some(page) = self.wb.get(key).cloned() {
                self.tier_page(key, &page, 0..LOGICAL_PAGE)?;
            }
        }
        Ok(())
    }

    /// Applies a tier's metadata records on top of what replay found (before the namespace
    /// is tidied). A node no newer than the checkpoint replay started from is in it already.
    /// Returns the files whose size a record shrank.
    pub(crate) fn apply_tier_records(
        &mut self,
        records: &[Vec<u8>],
        dirent_versions: &mut std::collections::HashMap<(u64, Vec<u8>), u64>,
        mount: &mut MountReport,
        report: &mut DirtyRecoveryReport,
    ) -> Result<BTreeSet<u64>, FsError> {
        let base = self.cp.replayed_version();
        let mut shrunk = BTreeSet::new();
        for rec in records {
            let mut nodes = frags(rec);
            // A record is whole nodes of the kinds a tier may hold, every byte of it: what
            // is not is refused from there on.
            let mut refused = false;
            for (head, _, body) in nodes.by_ref() {
                let whole = head.flags & FLAG_LAST != 0 && head.total == u32::from(head.len);
                let allowed = matches!(
                    head.kind,
                    NodeKind::Inode | NodeKind::Dirent | NodeKind::Punch | NodeKind::Xattr
                );
                if !whole || !allowed {
                    refused = true;
                    break;
                }
                let payload = body.to_vec();
                if head.version <= base {
                    report.nodes_on_flash += 1;
                    continue;
                }
                let (kind, ino) = (head.kind, head.key);
                if kind == NodeKind::Inode {
                    self.need_inode(ino)?;
                }
                let size_before = self.ns.get(ino).map(|i| i.attr.size);
                let applied =
                    self.apply(Partial { head, payload, frags: Vec::new() }, dirent_versions, mount)?;
                let size_after = self.ns.get(ino).map(|i| i.attr.size);
                if kind == NodeKind::Inode && size_before.zip(size_after).is_some_and(|(b, a)| a < b) {
                    shrunk.insert(ino);
                }
                if applied {
                    report.nodes_applied += 1;
                } else {
                    report.nodes_refused += 1;
                }
            }
            if refused || nodes.rest() > 0 {
                report.nodes_refused += 1;
            }
        }
        Ok(shrunk)
    }

    /// Cuts at the size the last page of each file in `shrunk` as flash holds it. A truncate
    /// records its new size in the tier before its cut page, so a crash between leaves the
    /// size applied and the page whole on flash: its bytes past the end would come back if
    /// the file grew again. (Pages the tier holds are cut with the tier's pages, after.)
    pub(crate) fn cut_shrunk_pages(
        &mut self,
        shrunk: &BTreeSet<u64>,
        report: &mut DirtyRecoveryReport,
    ) -> Result<(), FsError> {
        for &ino in shrunk {
            let Some(size) =
                self.ns.get(ino).filter(|i| i.attr.kind == crate::FileType::File).map(|i| i.attr.size)
            else {
                continue;
            };
            let tail = (size % LOGICAL_PAGE as u64) as usize;
            if tail == 0 {
                continue;
            }
            let index = size / LOGICAL_PAGE as u64;
            let (bytes, crc) = match self.page_and_crc(ino, index) {
                Ok(p) => p,
                // Beyond repair: it reads as EIO whatever its bytes.
                Err(FsError::Corrupt(Corruption::Unrecoverable { .. } | Corruption::NotWritten { .. })) => {
                    continue
                }
                Err(e) => return Err(e),
            };
            if bytes[tail..].iter().all(|&b| b == 0) {
                continue;
            }
            let mut page = DirtyPage::with_crc(bytes, crc);
            page.cut(tail);
            self.set_dirty((ino, index), page);
            self.wb.note_unsynced();
            report.pages_cut.push((ino, index));
        }
        Ok(())
    }

    /// Puts a tier's pages back as dirty pages of their files (after the namespace is
    /// tidied): a page whose file is gone, or past its end, is dropped; the last page is cut
    /// at the size.
    pub(crate) fn apply_tier_pages(
        &mut self,
        pages: Vec<(u64, u64, Vec<u8>, u32)>,
        report: &mut DirtyRecoveryReport,
    ) {
        for (ino, index, bytes, crc) in pages {
            let size = match self.ns.get(ino) {
                Some(i) if matches!(i.attr.kind, crate::FileType::File | crate::FileType::Symlink) => {
                    i.attr.size
                }
                _ => {
                    report.pages_dropped.push((ino, index));
                    continue;
                }
            };
            let end = size.div_ceil(LOGICAL_PAGE as u64);
            if index >= end || bytes.len() != LOGICAL_PAGE {
                report.pages_dropped.push((ino, index));
                continue;
            }
            let mut page = DirtyPage::with_crc(bytes, crc);
            let tail = (size % LOGICAL_PAGE as u64) as usize;
            if index + 1 == end && tail != 0 {
                page.cut(tail);
                report.pages_cut.push((ino, index));
            }
            self.set_dirty((ino, index), page);
            self.wb.note_unsynced();
            report.pages += 1;
        }
    }
}
