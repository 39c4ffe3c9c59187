//! The pool's superblock copies: A and B in the pool header page, and (version 8) C in the
//! region's last page, far from them. A header page lost whole takes A and B with it; C
//! gives the stripe shape, and the page is rebuilt from its stripe (the root slot with it).

use bitmend_media::pmem::Region;
use bitmend_nvlog::NvLog;

use crate::heal::{Geometry, Healed, PAGE};
use crate::layout::{Superblock, HEAP_VERSION_FAR_COPY};
use crate::HeapError;

/// Offsets of copies A and B within the pool header page.
pub(crate) const SUPERBLOCK_A: u64 = 0;
pub(crate) const SUPERBLOCK_B: u64 = 64;

/// Where copy C of a version 8 pool is, in a region of `len` bytes: its last whole page.
pub(crate) fn far_copy_at(len: usize) -> u64 {
    (len as u64 / PAGE).saturating_sub(1) * PAGE
}

/// Copy C as it is kept: the superblock with the closed mark clear (it is written when the
/// pool is made and when a copy is found damaged, not at every open and close).
pub(crate) fn far_copy(sb: &Superblock) -> [u8; 64] {
    Superblock { closed: false, ..*sb }.encode()
}

/// The copy at `at`, or why it is not one.
fn read_at<R: Region>(log: &NvLog<Healed<R>>, at: u64) -> Result<Superblock, HeapError> {
    let bytes = log.region().bytes();
    let at = at as usize;
    if at + 64 > bytes.len() {
        return Err(HeapError::NotAPool { why: "the region ends inside the journal".into() });
    }
    Superblock::decode(&bytes[at..at + 64])
}

/// Reads the superblock at open: A, else B, else, with both lost (the header page), C, whose
/// shape lets the header page be rebuilt from its stripe (`geometry` gives the stripes of a
/// superblock). Returns the superblock and the header page copies found damaged.
pub(crate) fn read<R: Region>(
    log: &mut NvLog<Healed<R>>,
    header: u64,
    geometry: impl Fn(&Superblock) -> Option<Geometry>,
) -> Result<(Superblock, Vec<u64>), HeapError> {
    let (a, b) = (read_at(log, header + SUPERBLOCK_A), read_at(log, header + SUPERBLOCK_B));
    match (a, b) {
        (Ok(a), Ok(b)) if a == b => Ok((a, vec![])),
        (Ok(a), _) => Ok((a, vec![SUPERBLOCK_B])),
        (_, Ok(b)) => Ok((b, vec![SUPERBLOCK_A])),
        (Err(e), _) => {
            let far = read_at(log, far_copy_at(log.region().len()))
                .ok()
                .filter(|c| c.version >= HEAP_VERSION_FAR_COPY && c.first_run == header + PAGE);
            let Some(far) = far else { return Err(e) };
            let Some(geo) = geometry(&far) else {
                return Err(HeapError::NotAPool {
                    why: "the pool header page is damaged, and the pool keeps no parity to rebuild it".into(),
                });
            };
            log.region_mut().protect(geo);
            let (stripe, _) = geo.locate(0);
            let rebuilt = log.region_mut().check_stripe(stripe)?.repaired;
            let (a, b) = (read_at(log, header + SUPERBLOCK_A), read_at(log, header + SUPERBLOCK_B));
            match (rebuilt, a, b) {
                // Both copies were lost with their page: counted as rewritten.
                (true, Ok(a), Ok(b)) if a == b => Ok((a, vec![SUPERBLOCK_A, SUPERBLOCK_B])),
                _ => Err(HeapError::NotAPool {
                    why: "the pool header page is damaged beyond repair (its far superblock copy holds)"
                        .into(),
                }),
            }
        }
    }
}

/// Rewrites copy C of a version 8 pool if it is not `sb`'s (damaged, or a header page was
/// rebuilt); whether it was.
pub(crate) fn keep_far_copy<R: Region>(
    log: &mut NvLog<Healed<R>>,
    sb: &Superblock,
) -> Result<bool, HeapError> {
    if sb.version < HEAP_VERSION_FAR_COPY {
        return Ok(false);
    }
    let at = far_copy_at(log.region().len()) as usize;
    let want = far_copy(sb);
    if log.region().bytes()[at..at + 64] == want {
        return Ok(false);
    }
    log.region_mut().write(at, &want)?;
    log.region_mut().persist(at, 64)?;
    Ok(true)
}
