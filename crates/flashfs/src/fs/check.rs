//! fsck: every structural invariant, and every byte of file data read back and CRC-checked.

use std::collections::HashMap;

use bitmend_media::nand::Nand;

use super::{Fs, LOGICAL_PAGE, ROOT};
use crate::FileType;

/// What a check found. `problems` is empty for a consistent file system.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Check {
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
    pub problems: Vec<String>,
}

impl Check {
    pub fn clean(&self) -> bool {
        self.problems.is_empty() && self.unreadable_pages == 0
    }
}

impl<N: Nand> Fs<N> {
    /// Checks the file system; `read_data` also reads every logical page back.
    pub fn check(&mut self, read_data: bool) -> Check {
        self.check_with_progress(read_data, &mut |_, _| {})
    }

    /// As [`check`](Self::check), calling `progress(done, total)` as logical pages are read.
    pub fn check_with_progress(&mut self, read_data: bool, progress: &mut dyn FnMut(u64, u64)) -> Check {
        let mut c = Check::default();
        let mut links: HashMap<u64, u32> = HashMap::new();
        let mut subdirs: HashMap<u64, u32> = HashMap::new();
        for (dir, entries) in &self.dirs {
            if !self.inodes.get(dir).is_some_and(|i| i.attr.kind == FileType::Dir) {
                c.problems.push(format!("entries for {dir}, which is not a directory"));
            }
            for (name, child) in entries {
                match self.inodes.get(child) {
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
        for (ino, i) in &self.inodes {
            let named = links.get(ino).copied().unwrap_or(0);
            match i.attr.kind {
                FileType::Dir => {
                    c.dirs += 1;
                    let want = 2 + subdirs.get(ino).copied().unwrap_or(0);
                    if i.attr.nlink != want {
                        c.problems
                            .push(format!("directory {ino}: nlink {} but {want} expected", i.attr.nlink));
                    }
                    if *ino != ROOT && named != 1 {
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
                    if kind == FileType::Symlink && i.target.len() as u64 != i.attr.size {
                        c.problems.push(format!(
                            "symlink {ino}: size {} but a {}-byte target",
                            i.attr.size,
                            i.target.len()
                        ));
                    }
                }
            }
            if *ino != ROOT && named == 0 {
                c.problems.push(format!("inode {ino} is not in any directory"));
            }
        }
        let keys: Vec<(u64, u64)> = self.data.keys().copied().collect();
        let total = keys.len() as u64;
        for (done, (ino, index)) in keys.into_iter().enumerate() {
            if done % 256 == 0 {
                progress(done as u64, total);
            }
            c.data_pages += 1;
            match self.inodes.get(&ino) {
                Some(i) if i.attr.kind == FileType::File => {
                    if index.saturating_mul(LOGICAL_PAGE as u64) >= i.attr.size {
                        c.problems.push(format!("inode {ino}: page {index} past its size {}", i.attr.size));
                    }
                }
                _ => c.problems.push(format!("data page {index} of inode {ino}, which is not a file")),
            }
            if read_data {
                let before = self.stats.relocated;
                match self.page(ino, index) {
                    Ok(_) => c.repaired_pages += self.stats.relocated - before,
                    Err(_) => c.unreadable_pages += 1,
                }
            }
        }
        progress(total, total);
        c
    }
}
