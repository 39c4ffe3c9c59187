//! What the flash tests share: a small simulated chip and the configuration most of them use.

#![allow(dead_code)] // each test file uses its own part

use bitmend_flashfs::FsConfig;
use bitmend_media::nand::{FaultyNand, Geometry, RamNand, Timing};

/// A chip of `blocks` erase blocks of 16 pages of 2 KiB (64-byte spares), without timing.
pub fn chip(blocks: u32) -> RamNand {
    RamNand::new(Geometry::new(2048, 64, 16, blocks).unwrap()).unwrap().with_timing(Timing::NONE)
}

/// The same chip behind fault injection, its random choices drawn from `seed`.
pub fn faulty_chip(blocks: u32, seed: u64) -> FaultyNand<RamNand> {
    FaultyNand::new(chip(blocks), seed)
}

/// One parity page per group, one parity block per segment of 4 blocks.
pub fn cfg() -> FsConfig {
    FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 }
}
