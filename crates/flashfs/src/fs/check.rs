//! fsck: every structural invariant, and every byte of file data read back and CRC-checked.

use std::collections::HashMap;

use bitmend_media::nand::Nand;

use super::{Fs, LOGICAL_PAGE, ROOT};
use crate::FileType;

/// What a check found. `problems` is empty for a consistent file system.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes.
    pub special: u64,
    pub data_pages: u64,
    /// Logical pages that could not be read back (beyond the redundancy).
    pub unreadable_pages: u64,
    /// Logical pages read back through a repair (they are rewritten by the next sync).
    pub repaired_pages: u64,
    /// Index chunks whose map node was lost and rebuilt from the data nodes (written again
    /// by the next checkpoint: `fsck --repair`, a sync, an unmount).
    pub maps_rebuilt: u64,
    /// Files with logical pages that could not be read back: path (one of its names; the
    /// inode number when it has none) and how many pages.
    pub unreadable_files: Vec<(String, u64)>,
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn clean(&self) -> bool {
        self.problems.is_empty() && self.unreadable_pages == 0
    }
}

impl<N: Nand> Fs<N> {
    /// Checks the file system; `read_data` also reads every logical page back.
    pub fn check(&mut self, read_data: bool) -> CheckReport {
        self.check_with_progress(read_data, &mut |_, _| {})
    }

    /// As [`check`](Self::check), calling `progress(done, total)` as logical pages are read.
    pub fn check_with_progress(
        &mut self,
        read_data: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> CheckReport {
        let mut c = CheckReport::default();
        let rebuilt_before = self.index.counts().rebuilt;
        // The whole namespace: a group that does not read is a problem to name.
        for (g, pages, e) in self.page_in_all_for_check() {
            c.unreadable_pages += pages as u64;
            c.problems.push(format!("namespace group {g:?} does not read: {e}"));
        }
        if let Err(e) = self.drop_orphans() {
            c.problems.push(format!("the pages of a file without a link do not go: {e}"));
        }
        self.check_namespace(&mut c);
        // Every copy of the superblock (a mount rewrites a damaged one it can).
        for &block in self.store.damaged_superblocks() {
            let which = if block < 2 { "reserved" } else { "far" };
            c.problems.push(format!("the superblock copy in {which} block {block} is damaged"));
        }
        let done = self.check_index(read_data, progress, &mut c);
        self.check_accounting(&mut c);
        progress(done, done);
        c.maps_rebuilt = self.index.counts().rebuilt - rebuilt_before;
        c
    }

    /// Every entry names an inode, every inode is named, and link counts add up.
    fn check_namespace(&self, c: &mut CheckReport) {
        let mut links: HashMap<u64, u32> = HashMap::new();
        let mut subdirs: HashMap<u64, u32> = HashMap::new();
        for (dir, entries) in self.ns.dirs() {
            if !self.ns.get(*dir).is_some_and(|i| i.attr.kind == FileType::Dir) {
                c.problems.push(format!("entries for {dir}, which is not a directory"));
            }
            for (name, child) in entries {
                match self.ns.get(*child) {
                    None => c.problems.push(format!(
                        "{dir}/{}: entry for missing inode {child}",
                        String::from_utf8_lossy(name)
                    )),
                    Some(i) => {
                        *links.entry(*child).or_default() += 1;
                        if i.attr.kind == FileType::Dir {
                            *subdirs.entry(*dir).or_default() += 1;
                        }
                    }
                }
            }
        }
        for (ino, i) in self.ns.inodes() {
            let named = links.get(ino).copied().unwrap_or(0);
            match i.attr.kind {
                FileType::Dir => {
                    c.dirs += 1;
                    let want = 2 + subdirs.get(ino).copied().unwrap_or(0);
                    if i.attr.nlink != want {
                        c.problems
                            .push(format!("directory {ino}: nlink {} but {want} expected", i.attr.nlink));
                    }
                    if *ino != ROOT.0 && named != 1 {
                        c.problems.push(format!("directory {ino} is named {named} times"));
                    }
                }
                kind => {
                    match kind {
                        FileType::File => c.files += 1,
                        FileType::Symlink => c.symlinks += 1,
                        _ => c.special += 1,
                    }
                    if i.attr.nlink != named {
                        c.problems.push(format!("inode {ino}: nlink {} but {named} names", i.attr.nlink));
                    }
                    let in_data = i.target.is_empty() && i.attr.size as usize > super::INLINE_TARGET_MAX;
                    if kind == FileType::Symlink && !in_data && i.target.len() as u64 != i.attr.size {
                        c.problems.push(format!(
                            "symlink {ino}: size {} but a {}-byte target",
                            i.attr.size,
                            i.target.len()
                        ));
                    }
                }
            }
            if *ino != ROOT.0 && named == 0 {
                c.problems.push(format!("inode {ino} is not in any directory"));
            }
        }
    }

    /// Every chunk of the index loads, every data page belongs to a file and lies within its
    /// size, and (`read_data`) reads back. Returns the pages seen.
    fn check_index(
        &mut self,
        read_data: bool,
        progress: &mut dyn FnMut(u64, u64),
        c: &mut CheckReport,
    ) -> u64 {
        // The index, a chunk at a time (loaded and evicted as reads do, within the bound).
        let chunks = self.index.all_chunks();
        let total = self.index.totals().pages;
        let mut done = 0u64;
        let mut unreadable: std::collections::BTreeMap<u64, u64> = Default::default();
        for ck in chunks {
            match self.load_chunk(ck) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    c.problems.push(format!("inode {}: index chunk {} unreadable: {e}", ck.ino, ck.chunk));
                    continue;
                }
            }
            let keys: Vec<u64> = self.index.pages_in(ck).expect("loaded above");
            for index in keys {
                let ino = ck.ino;
                if done.is_multiple_of(256) {
                    progress(done, total);
                }
                done += 1;
                c.data_pages += 1;
                match self.ns.get(ino) {
                    Some(i) if i.attr.kind == FileType::File => {
                        if index.saturating_mul(LOGICAL_PAGE as u64) >= i.attr.size {
                            c.problems
                                .push(format!("inode {ino}: page {index} past its size {}", i.attr.size));
                        }
                    }
                    // A long symlink target (version 7).
                    Some(i) if i.attr.kind == FileType::Symlink && index == 0 && i.target.is_empty() => {}
                    _ => c.problems.push(format!("data page {index} of inode {ino}, which is not a file")),
                }
                if read_data {
                    let before = self.stats.relocated;
                    match self.page(ino, index) {
                        Ok(_) => c.repaired_pages += self.stats.relocated - before,
                        Err(_) => {
                            c.unreadable_pages += 1;
                            *unreadable.entry(ino).or_insert(0) += 1;
                        }
                    }
                }
            }
        }
        c.unreadable_files = self.name_files(&unreadable);
        done
    }

    /// A path for each inode of `counts` (with its count): what a user can act on.
    fn name_files(&self, counts: &std::collections::BTreeMap<u64, u64>) -> Vec<(String, u64)> {
        if counts.is_empty() {
            return Vec::new();
        }
        let mut parent: HashMap<u64, (u64, &[u8])> = HashMap::new();
        for (&dir, entries) in self.ns.dirs() {
            for (name, &child) in entries {
                parent.entry(child).or_insert((dir, name));
            }
        }
        let path = |mut ino: u64| {
            let mut parts: Vec<&[u8]> = Vec::new();
            // A bound on the walk: a damaged namespace must not loop.
            while ino != ROOT.0 && parts.len() <= parent.len() {
                let &(up, name) = parent.get(&ino)?;
                parts.push(name);
                ino = up;
            }
            let names: Vec<String> =
                parts.iter().rev().map(|n| String::from_utf8_lossy(n).into_owned()).collect();
            Some(format!("/{}", names.join("/")))
        };
        counts
            .iter()
            .map(|(&ino, &n)| (path(ino).unwrap_or_else(|| format!("inode {ino} (no name)")), n))
            .collect()
    }

    /// The segment usage table and the totals kept as the index changed must be what the
    /// index adds up to (the cleaner's choices and statfs rest on them).
    fn check_accounting(&mut self, c: &mut CheckReport) {
        let (usage, totals, lost) = self.recount();
        if lost == 0 {
            if totals != self.index.totals() {
                c.problems.push(format!(
                    "index totals {:?}, but the chunks add up to {totals:?}",
                    self.index.totals()
                ));
            }
            let mut kept: Vec<(u32, u64)> =
                self.index.usage_table().iter().filter(|u| *u.1 > 0).map(|(&p, &b)| (p, b)).collect();
            let mut real: Vec<(u32, u64)> = usage.into_iter().collect();
            kept.sort_unstable();
            real.sort_unstable();
            if kept != real {
                let diff: Vec<String> = real
                    .iter()
                    .filter(|r| !kept.contains(r))
                    .map(|r| {
                        format!("segment {}: {} live bytes, table says {}", r.0, r.1, self.index.usage(r.0))
                    })
                    .chain(
                        kept.iter()
                            .filter(|k| !real.iter().any(|r| r.0 == k.0))
                            .map(|k| format!("segment {}: table says {} live bytes, none found", k.0, k.1)),
                    )
                    .take(4)
                    .collect();
                c.problems.push(format!("segment usage table differs: {}", diff.join("; ")));
            }
        }
    }
}
