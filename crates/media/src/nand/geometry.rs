//! The shape of a NAND chip.

use super::NandError;

/// Page size, spare (out-of-band) bytes per page, pages per erase block, erase blocks.
///
/// Pages are numbered across the chip: page `p` is page `p % pages_per_block` of block
/// `p / pages_per_block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Bytes of data per page (a power of two, 512 B to 64 KiB).
    pub page_size: u32,
    /// Spare (out-of-band) bytes per page.
    pub spare_size: u32,
    /// Pages per erase block.
    pub pages_per_block: u32,
    /// Erase blocks on the chip.
    pub blocks: u32,
}

impl Geometry {
    /// RCFFS's chip: 128 MiB of 2 KiB pages with 64 spare bytes, 128 KiB erase blocks.
    pub const RCFFS: Geometry =
        Geometry { page_size: 2048, spare_size: 64, pages_per_block: 64, blocks: 1024 };

    /// A checked geometry.
    pub fn new(
        page_size: u32,
        spare_size: u32,
        pages_per_block: u32,
        blocks: u32,
    ) -> Result<Geometry, NandError> {
        let g = Geometry { page_size, spare_size, pages_per_block, blocks };
        g.validate()?;
        Ok(g)
    }

    /// The geometry with `total` bytes of data (a whole number of erase blocks).
    pub fn with_size(
        page_size: u32,
        spare_size: u32,
        block_size: u64,
        total: u64,
    ) -> Result<Geometry, NandError> {
        let bad = |why: &str| NandError::Geometry { why: why.to_string() };
        check_page_size(page_size)?;
        if !block_size.is_multiple_of(page_size as u64) {
            return Err(bad("the erase block size must be a whole number of pages"));
        }
        if block_size == 0 || !total.is_multiple_of(block_size) {
            return Err(bad("the device size must be a whole number of erase blocks"));
        }
        let ppb = u32::try_from(block_size / page_size as u64).map_err(|_| bad("erase block too large"))?;
        let blocks = u32::try_from(total / block_size).map_err(|_| bad("too many erase blocks"))?;
        Geometry::new(page_size, spare_size, ppb, blocks)
    }

    /// Checks the limits every backend relies on.
    pub fn validate(&self) -> Result<(), NandError> {
        let bad = |why: String| Err(NandError::Geometry { why });
        check_page_size(self.page_size)?;
        if self.spare_size > self.page_size / 4 {
            return bad(format!("spare size {} exceeds a quarter of the page", self.spare_size));
        }
        if !(1..=4096).contains(&self.pages_per_block) {
            return bad(format!("{} pages per erase block: need 1 to 4096", self.pages_per_block));
        }
        if self.blocks == 0 {
            return bad("a chip needs at least one erase block".into());
        }
        if self.pages_u64() > u32::MAX as u64 {
            return bad(format!("{} pages: page numbers must fit in 32 bits", self.pages_u64()));
        }
        Ok(())
    }

    fn pages_u64(&self) -> u64 {
        self.pages_per_block as u64 * self.blocks as u64
    }

    /// Pages on the chip.
    pub fn pages(&self) -> u32 {
        self.pages_u64() as u32
    }

    /// Data bytes per erase block.
    pub fn block_size(&self) -> u64 {
        self.page_size as u64 * self.pages_per_block as u64
    }

    /// Data bytes on the chip (spare areas not counted).
    pub fn total_size(&self) -> u64 {
        self.block_size() * self.blocks as u64
    }

    /// Data plus spare bytes of one page: what the medium stores per page.
    pub fn raw_page_size(&self) -> usize {
        (self.page_size + self.spare_size) as usize
    }

    /// The erase block holding `page`.
    pub fn block_of(&self, page: u32) -> u32 {
        page / self.pages_per_block
    }

    /// The position of `page` within its erase block.
    pub fn index_in_block(&self, page: u32) -> u32 {
        page % self.pages_per_block
    }

    /// The first page of `block`.
    pub fn first_page(&self, block: u32) -> u32 {
        block * self.pages_per_block
    }

    /// An error unless `page` exists.
    pub fn check_page(&self, page: u32) -> Result<(), NandError> {
        if page >= self.pages() {
            return Err(NandError::PageRange { page, pages: self.pages() });
        }
        Ok(())
    }

    /// An error unless `page` exists and each buffer given is a whole page's data or spare
    /// area. Returns the bytes the buffers hold (what a read moves).
    pub fn check_buffers(
        &self,
        page: u32,
        data: Option<&[u8]>,
        spare: Option<&[u8]>,
    ) -> Result<usize, NandError> {
        self.check_page(page)?;
        let mut bytes = 0;
        if let Some(d) = data {
            check_len("page data", d.len(), self.page_size)?;
            bytes += d.len();
        }
        if let Some(s) = spare {
            check_len("spare area", s.len(), self.spare_size)?;
            bytes += s.len();
        }
        Ok(bytes)
    }

    /// An error unless `block` exists.
    pub fn check_block(&self, block: u32) -> Result<(), NandError> {
        if block >= self.blocks {
            return Err(NandError::BlockRange { block, blocks: self.blocks });
        }
        Ok(())
    }
}

/// An error unless a buffer holds exactly what it must.
pub(crate) fn check_len(what: &'static str, got: usize, expected: u32) -> Result<(), NandError> {
    if got != expected as usize {
        return Err(NandError::BufferSize { what, got, expected: expected as usize });
    }
    Ok(())
}

fn check_page_size(page_size: u32) -> Result<(), NandError> {
    if !page_size.is_power_of_two() || !(512..=65536).contains(&page_size) {
        return Err(NandError::Geometry {
            why: format!("page size {page_size} is not a power of two from 512 B to 64 KiB"),
        });
    }
    Ok(())
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry::RCFFS
    }
}

impl std::fmt::Display for Geometry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} MiB: {} erase blocks of {} pages of {} B + {} B spare ({} KiB per block)",
            self.total_size() >> 20,
            self.blocks,
            self.pages_per_block,
            self.page_size,
            self.spare_size,
            self.block_size() >> 10
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rcffs_default_is_128_mib_of_2_kib_pages() {
        let g = Geometry::default();
        assert_eq!(g.total_size(), 128 << 20);
        assert_eq!(g.block_size(), 128 << 10);
        assert_eq!(g.pages(), 65536);
        assert_eq!(g.raw_page_size(), 2112);
        g.validate().unwrap();
    }

    #[test]
    fn with_size_and_rejections() {
        let g = Geometry::with_size(4096, 128, 256 << 10, 64 << 20).unwrap();
        assert_eq!((g.pages_per_block, g.blocks), (64, 256));
        assert!(Geometry::with_size(2048, 64, 100_000, 1 << 20).is_err());
        assert!(Geometry::with_size(2048, 64, 128 << 10, (128 << 10) + 1).is_err());
        assert!(Geometry::new(3000, 64, 64, 8).is_err());
        assert!(Geometry::new(2048, 1024, 64, 8).is_err());
        assert!(Geometry::new(2048, 64, 0, 8).is_err());
        assert!(Geometry::new(2048, 64, 64, 0).is_err());
    }
}
