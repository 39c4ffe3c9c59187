//! Reading the data areas of an image file's pages from any thread, without the chip: the
//! file system's reads outside its lock (docs/DESIGN.md, "Reads without the lock").
//!
//! The reader goes through `pread` on a descriptor of its own, not through the chip's
//! mapping: the kernel copies from the page cache the mapping writes into, so a page being
//! erased or programmed by the writer at the same moment comes back torn, never as a data
//! race in this process. A torn or stale page is the caller's to catch (the file system
//! checks each logical page against the CRC-32C its index holds, and reads it again under
//! its lock if that fails). No counter moves and no cell is disturbed: this is not a chip
//! read, and nothing that models one (fault injection, timing) offers a reader.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::NandError;

/// A reader of page data of one image file. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DataReader {
    file: Arc<File>,
    path: Arc<str>,
    /// Offset of page 0 in the file.
    base: u64,
    page_size: usize,
    raw_page_size: usize,
    pages: u32,
    /// Version 2 images store each byte complemented (a hole reads as erased).
    complemented: bool,
}

/// Where the pages are in the file, and how they are stored.
pub(crate) struct ReaderLayout {
    pub base: u64,
    pub page_size: usize,
    pub raw_page_size: usize,
    pub pages: u32,
    pub complemented: bool,
}

impl DataReader {
    pub(crate) fn new(file: File, path: &str, layout: ReaderLayout) -> DataReader {
        let ReaderLayout { base, page_size, raw_page_size, pages, complemented } = layout;
        debug_assert!(page_size < raw_page_size, "a raw page is its data and its spare");
        DataReader {
            file: Arc::new(file),
            path: path.into(),
            base,
            page_size,
            raw_page_size,
            pages,
            complemented,
        }
    }

    /// Bytes of a page's data area.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Reads the data areas of pages `first .. first + count`, one after another, into `out`
    /// (replacing what it held), with one system call; `scratch` is reused between calls.
    /// A page never programmed since its erase reads as ones, as the chip would return it.
    pub fn read_data(
        &self,
        first: u32,
        count: u32,
        out: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
    ) -> Result<(), NandError> {
        let end = first.checked_add(count).filter(|&e| e <= self.pages);
        let Some(_) = end else {
            return Err(NandError::PageRange { page: first.saturating_add(count), pages: self.pages });
        };
        scratch.resize(count as usize * self.raw_page_size, 0);
        let at = self.base + first as u64 * self.raw_page_size as u64;
        self.file.read_exact_at(scratch, at).map_err(|source| NandError::Io {
            context: format!("{}: read pages from {first}", self.path),
            source,
        })?;
        out.clear();
        out.reserve(count as usize * self.page_size);
        for raw in scratch.chunks_exact(self.raw_page_size) {
            let data = &raw[..self.page_size];
            if self.complemented {
                out.extend(data.iter().map(|b| !b));
            } else {
                out.extend_from_slice(data);
            }
        }
        Ok(())
    }
}
