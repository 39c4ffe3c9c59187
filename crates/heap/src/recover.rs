//! Recovery at open (MinL2R section 3.3): the journal's heap records, grouped by
//! transaction. A transaction without its commit record was caught in LOGGING or WRITING: its
//! old bytes are written back, its pointer slots restored, its new blocks freed. A committed
//! one needs nothing written back; its frees, and the release of the old blocks of its
//! pointer-logged writes, may not have been applied: every block the journal names is
//! settled to the state the records, in order, leave it in. Then the journal is trimmed.
//! Idempotent: a crash during recovery leaves the records, and the next open does the same.

use bitmend_media::pmem::Region;
use bitmend_nvlog::NvLog;

use crate::alloc::{Allocator, Ptr};
use crate::heal::mend::{Mend, MendRanges};
use crate::heal::Healed;
use crate::layout::{
    class_size, BlockHeader, BlockState, RunHeader, RunKind, Superblock, BLOCK_HEADER, CLASSES, RUN,
    RUN_HEADER,
};
use crate::record::{self, Rec};
use crate::HeapError;

/// The heap's records in the journal, in order: (transaction, record).
pub(crate) fn heap_records<R: Region>(log: &mut NvLog<R>) -> Result<Vec<(u64, Rec)>, HeapError> {
    let mut recs = Vec::new();
    log.replay(bitmend_nvlog::RecordId(0), |_, tag, data| {
        if tag == record::TAG {
            if let Some(r) = record::decode(data) {
                recs.push(r);
            }
        }
    })?;
    Ok(recs)
}

/// A transaction whose checksummed commit record is the journal's last record shared its
/// final fence with its writes in place: if the crash kept the record and lost some of those
/// writes, the bytes no longer match the record's CRC. Its commit record is then dropped from
/// `recs`, and the transaction is rolled back like any other caught before its commit
/// (its undo records were fenced before it wrote in place). Returns whether it was.
/// Only the last record can be such a commit: any later record was written after that
/// fence returned.
pub(crate) fn drop_torn_commit<R: Region>(region: &R, recs: &mut Vec<(u64, Rec)>) -> bool {
    let torn = match recs.last() {
        Some((_, Rec::Commit(Some(w)))) => !w.matches(region.bytes()),
        _ => false,
    };
    if torn {
        recs.pop();
    }
    torn
}

/// Before the allocator reads the headers: finishes every run format the journal records
/// (a crash may have torn its headers), and rewrites, free, the header of any block the
/// journal names that does not decode (torn while being written; settled to its state
/// after). Writes only headers the journal vouches for: damage elsewhere stays for the
/// allocator to quarantine. Returns whether it wrote.
pub(crate) fn finish_formats<R: Region>(
    region: &mut Healed<R>,
    sb: Superblock,
    recs: &[(u64, Rec)],
) -> Result<bool, HeapError> {
    let run_base = |run: u32| sb.first_run + run as u64 * RUN;
    let mut touched = false;
    for (_, r) in recs {
        if let Rec::Format { run, class, runs } = *r {
            if run as u64 + runs as u64 > sb.runs as u64 || runs == 0 || class > CLASSES {
                continue;
            }
            if class > 0 {
                // A run header in place says the format finished: its block headers were
                // fenced before it. A header of the run that does not decode now is damage
                // (or an allocation's, settled below), not a torn format: left to the
                // allocator to report.
                let at = run_base(run) as usize;
                let header =
                    RunHeader::decode(&region.bytes()[at..at + RUN_HEADER as usize], run, sb.pool_id);
                if header == Ok(Some(RunHeader { kind: RunKind::Blocks, class, arg: 0 })) {
                    continue;
                }
                touched = true;
                let size = class_size(class);
                for i in 0..(RUN - RUN_HEADER) / size {
                    mend_block(region, sb, run_base(run) + RUN_HEADER + i * size, class)?;
                }
                // As a format does it: the block headers durable before the run header that
                // says they are all there, and (a pool that heals) their parity and
                // signatures too, so that a run header in place means the run's patches
                // are whole (see `torn_ranges`).
                region.recompute(run_base(run), RUN)?;
                region.fence()?;
                let h = RunHeader { kind: RunKind::Blocks, class, arg: 0 };
                write_line(region, run_base(run), &h.encode(run, sb.pool_id))?;
            } else {
                touched = true;
                let h = RunHeader { kind: RunKind::SpanHead, class: 0, arg: runs };
                write_line(region, run_base(run), &h.encode(run, sb.pool_id))?;
                mend_block(region, sb, run_base(run) + RUN_HEADER, 0)?;
            }
        }
    }
    for (_, r) in recs {
        for p in
            blocks_named(r).into_iter().flatten().filter(|p| p.0 >= sb.first_run + RUN_HEADER + BLOCK_HEADER)
        {
            let run = ((p.0 - sb.first_run) / RUN) as u32;
            if run >= sb.runs {
                continue;
            }
            let at = run_base(run) as usize;
            let class =
                match RunHeader::decode(&region.bytes()[at..at + RUN_HEADER as usize], run, sb.pool_id) {
                    Ok(Some(RunHeader { kind: RunKind::Blocks, class, .. })) => class,
                    Ok(Some(RunHeader { kind: RunKind::SpanHead, .. })) => 0,
                    _ => continue,
                };
            touched |= mend_block(region, sb, p.0 - BLOCK_HEADER, class)?;
        }
    }
    if touched {
        region.fence()?;
    }
    Ok(touched)
}

/// The blocks a record names, whose headers recovery settles.
fn blocks_named(r: &Rec) -> [Option<Ptr>; 2] {
    match r {
        Rec::Alloc { p, .. } | Rec::Free(p) => [Some(*p), None],
        Rec::Pointer { old, new, .. } => [Some(*old), Some(*new)],
        _ => [None, None],
    }
}

/// Writes a free header for the block at `at` if its header does not decode as one of
/// class `class`; returns whether it wrote.
fn mend_block<R: Region>(region: &mut R, sb: Superblock, at: u64, class: u8) -> Result<bool, HeapError> {
    let bytes = &region.bytes()[at as usize..(at + BLOCK_HEADER) as usize];
    let layout = sb.header_layout();
    if BlockHeader::decode(bytes, at, sb.pool_id, layout).is_ok_and(|h| h.class == class) {
        return Ok(false);
    }
    let h = BlockHeader { state: BlockState::Free, class, allocations: 0, len: 0, link: 0 };
    region.write(at as usize, &h.encode(at, sb.pool_id, layout))?;
    region.flush(at as usize, BLOCK_HEADER as usize)?;
    Ok(true)
}

fn write_line<R: Region>(region: &mut R, at: u64, bytes: &[u8]) -> Result<(), HeapError> {
    region.write(at as usize, bytes)?;
    region.flush(at as usize, bytes.len())?;
    Ok(())
}

/// The ranges whose parity and signature patches a crash may have torn: every store not yet
/// fenced is named by a journal record, or is a linked block's header or slot, or an
/// unlinked block's header. A format whose
/// run header is in place finished (its block headers, and their patches, were fenced before
/// that header was written): only the run header is named. Read before recovery writes
/// anything.
pub(crate) fn torn_ranges<R: Region>(
    region: &R,
    sb: Superblock,
    alloc: &Allocator,
    recs: &[(u64, Rec)],
) -> Vec<(u64, u64)> {
    let block = |p: Ptr| (p.header(), BLOCK_HEADER + alloc.capacity(p).unwrap_or(0));
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (_, r) in recs {
        match r {
            Rec::Undo(undo) => ranges.extend(undo.iter().map(|(at, b)| (*at, b.len() as u64))),
            Rec::Alloc { p, .. } => ranges.push(block(*p)),
            Rec::Free(p) => ranges.push((p.header(), BLOCK_HEADER)),
            Rec::Pointer { slot, old, new } => {
                ranges.extend([(*slot, 8), (old.header(), BLOCK_HEADER), block(*new)])
            }
            Rec::Commit(Some(w)) => ranges.extend(w.ranges.iter().map(|&(at, len)| (at, len as u64))),
            &Rec::Format { run, class, runs } => {
                let base = sb.first_run + run as u64 * RUN;
                let at = base as usize;
                let in_place = region.bytes().get(at..at + RUN_HEADER as usize).is_some_and(|b| {
                    RunHeader::decode(b, run, sb.pool_id)
                        == Ok(Some(RunHeader { kind: RunKind::Blocks, class, arg: 0 }))
                });
                ranges.push(match class {
                    0 => (base, RUN_HEADER + BLOCK_HEADER),
                    _ if in_place => (base, RUN_HEADER),
                    _ => (base, runs.max(1) as u64 * RUN),
                });
            }
            Rec::Begin | Rec::Commit(None) => {}
        }
    }
    for &(p, slot) in &alloc.linked {
        ranges.extend([(slot, 8), (p.header(), BLOCK_HEADER)]);
    }
    ranges.extend(alloc.unlinked.iter().map(|p| (p.header(), BLOCK_HEADER)));
    ranges
}

/// Before recovery writes anything to a pool that heals: the last commit's damaged lines,
/// then every damaged line of the stripes recovery recomputes (`torn`) but those whose
/// patches may be torn (`suspect`), rebuilt from their stripes (see `heal/mend.rs`).
/// Returns the lines rebuilt and the pages left damaged.
pub(crate) fn mend<R: Region>(
    region: &mut Healed<R>,
    recs: &[(u64, Rec)],
    torn: &[(u64, u64)],
    suspect: &[(u64, u64)],
) -> Result<Mend, HeapError> {
    let mut mended = Mend::default();
    if let Some((_, Rec::Commit(Some(w)))) = recs.last() {
        let ranges: Vec<(u64, u64)> = w.ranges.iter().map(|&(at, len)| (at, len as u64)).collect();
        mended.lines_rebuilt += region.mend_written(&ranges, |bytes| w.matches(bytes))?;
    }
    // Recovery settles the header of every block the journal names, and an earlier recovery
    // that a crash cut short may have torn their patches.
    let settled: Vec<(u64, u64)> = recs
        .iter()
        .flat_map(|(_, r)| blocks_named(r).into_iter().flatten())
        .map(|p| {
            debug_assert!(p.header().is_multiple_of(64), "a block header starts its line");
            (p.header(), BLOCK_HEADER)
        })
        .collect();
    let around = region.mend_around(MendRanges { recomputed: torn, suspect, settled: &settled })?;
    mended.lines_rebuilt += around.lines_rebuilt;
    mended.checks_rewritten += around.checks_rewritten;
    mended.pages_beyond = around.pages_beyond;
    Ok(mended)
}
