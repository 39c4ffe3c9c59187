//! What the flash tests share: a small simulated chip and the configuration most of them use.

#![allow(dead_code)] // each test file uses its own part

use bitmend_flashfs::{Compression, Fs, FsConfig, FsOptions};
use bitmend_media::nand::{FaultyNand, Geometry, Nand, RamNand, Timing};

/// A chip of `blocks` erase blocks of 16 pages of 2 KiB (64-byte spares), without timing.
pub fn chip(blocks: u32) -> RamNand {
    RamNand::new(Geometry::new(2048, 64, 16, blocks).unwrap()).unwrap().with_timing(Timing::NONE)
}

/// The same chip behind fault injection, its random choices drawn from `seed`.
pub fn faulty_chip(blocks: u32, seed: u64) -> FaultyNand<RamNand> {
    FaultyNand::new(chip(blocks), seed)
}

/// The options most tests use: `compression`, and write-back of every 64 KiB of dirty data
/// (a test's writes reach the flash, and its power cuts, without a sync).
pub fn opts(compression: Compression) -> FsOptions {
    FsOptions { compression, dirty_limit: 64 << 10, ..FsOptions::default() }
}

/// One parity page per group, one parity block per segment of 4 blocks.
pub fn cfg() -> FsConfig {
    FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 }
}

/// Flash pages holding a fragment of kind `kind` with `key` (any, for `u64::MAX`; and
/// `key2`, if given), in log order.
pub fn pages_with<N: Nand>(fs: &mut Fs<N>, kind: u8, key: u64, key2: Option<u64>) -> Vec<u32> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 2048];
    for p in fs.store_mut().log_pages(0, None).unwrap() {
        if fs.store_mut().read(p, &mut buf).is_err() {
            continue;
        }
        let mut off = 0;
        while off + 32 <= buf.len() && buf[off] != 0 {
            let len = u16::from_le_bytes([buf[off + 2], buf[off + 3]]) as usize;
            let k = u64::from_le_bytes(buf[off + 8..off + 16].try_into().unwrap());
            let k2 = u64::from_le_bytes(buf[off + 16..off + 24].try_into().unwrap());
            if buf[off] == kind
                && (key == u64::MAX || k == key)
                && key2.is_none_or(|x| x == k2)
                && !out.contains(&p.0)
            {
                out.push(p.0);
            }
            off += 32 + len;
        }
    }
    out
}

/// Loses flash page `p` beyond both levels of parity (p = 1, s = 1): the next page of its
/// group and the same page of the next block of its segment go too. Returns what was lost.
pub fn lose_beyond_repair(fs: &mut Fs<FaultyNand<RamNand>>, p: u32) -> [u32; 3] {
    let lost = [p, p + 1, p + 16];
    for q in lost {
        fs.store_mut().nand_mut().lose_page(q).unwrap();
    }
    lost
}
