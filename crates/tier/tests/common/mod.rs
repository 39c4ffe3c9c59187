//! What the tier's tests share.

#![allow(dead_code)] // each test file uses its own part

use bitmend_flashfs::{Fs, FsConfig, FsOptions};
use bitmend_media::nand::{Geometry, RamNand, Timing};
use bitmend_media::pmem::{RamRegion, Region};
use bitmend_media::rng::Rng;
use bitmend_tier::{mount, DirtyTier, TieredFs};

/// A file system made with `opts` on a small chip, mounted over a fresh tier (256 KiB of log,
/// 4 MiB of slots).
pub fn mounted(opts: FsOptions) -> TieredFs<RamNand, RamRegion, RamRegion> {
    let chip = RamNand::new(Geometry::new(2048, 64, 16, 64).unwrap()).unwrap().with_timing(Timing::NONE);
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 };
    let fs = Fs::format(chip, cfg, opts).unwrap();
    let id = fs.store().fs_id();
    let nand = fs.unmount().unwrap();
    let tier = DirtyTier::create_for(RamRegion::new(256 << 10), RamRegion::new(4 << 20), id).unwrap();
    let (log, heap) = tier.into_regions();
    mount(nand, opts, log, heap).unwrap().0
}

/// `len` random bytes from `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    Rng::new(seed).fill(&mut b);
    b
}

/// Wild writes into the dirty state store: garbage over `hit` chunks of log segment `seg`,
/// drawn at random from `chunks`. Returns the tier's regions as the damage left them.
pub fn hit_log_chunks<L: Region, H: Region>(
    tier: DirtyTier<L, H>,
    seg: u64,
    mut chunks: Vec<usize>,
    hit: usize,
    rng: &mut Rng,
) -> (L, H) {
    assert!(chunks.len() >= hit, "{} chunks to hit {hit} of", chunks.len());
    let ranges: Vec<_> = (0..hit)
        .map(|_| tier.log().chunk_range(seg, chunks.swap_remove(rng.below(chunks.len() as u64) as usize)))
        .collect();
    let (mut log, heap) = tier.into_regions();
    for r in &ranges {
        let mut junk = vec![0u8; r.len()];
        rng.fill(&mut junk);
        log.corrupt(r.start, &junk).unwrap();
    }
    (log, heap)
}
