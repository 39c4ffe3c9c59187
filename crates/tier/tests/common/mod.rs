//! What the tier's tests share.

use bitmend_media::pmem::Region;
use bitmend_media::rng::Rng;
use bitmend_tier::DirtyTier;

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
