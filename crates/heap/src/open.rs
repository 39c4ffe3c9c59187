//! Making a pool and opening one: the journal replayed, what a crash tore mended, the
//! transaction it cut rolled back, and the headers and links made whole (`recover.rs` holds
//! the steps that need no pool; the ones here put it together).

use std::collections::{BTreeMap, BTreeSet};

use bitmend_media::pmem::Region;
use bitmend_nvlog::{LogConfig, NvLog};

use crate::alloc::{Allocator, Ptr};
use crate::heal::{Geometry, Healed, StripeShape, PAGE};
use crate::layout::{
    Superblock, HEAP_VERSION, HEAP_VERSION_FAR_COPY, HEAP_VERSION_UPGRADED, POOL_HEADER, RUN,
};
use crate::pool::{geometry, header_page, pages, random_id, OpenReport, Pool, PoolOptions, ROOT_SLOT};
use crate::record::Rec;
use crate::recover::{drop_torn_commit, finish_formats, heap_records, mend, torn_ranges};
use crate::superblocks::{far_copy_at, SUPERBLOCK_A, SUPERBLOCK_B};
use crate::HeapError;

/// The journal's shape for a region of `len` bytes: a sixteenth of it, between 256 KiB and
/// 64 MiB, in segments of four data chunks and one parity chunk. A chunk is a 32nd of the
/// journal, between 8 and 64 KiB: large enough that the undo record of a 16 KiB write fits
/// in one record of a 64 KiB chunk, and that closing a chunk (checking, signing, two
/// header writes) is paid once per many records.
fn journal_config(len: usize) -> Result<LogConfig, HeapError> {
    let bytes = (len / 16).clamp(256 << 10, 64 << 20);
    let chunk_size = (1usize << (bytes / 32).ilog2()).clamp(8 << 10, 64 << 10);
    Ok(LogConfig { k: 4, m: 1, chunk_size, block_size: 64, segments: 0 }.fit(bytes)?)
}

impl<R: Region> Pool<R> {
    /// Makes a pool of `region`: the journal, the pool header and every run unassigned.
    pub fn create(region: R, opts: PoolOptions) -> Result<Pool<R>, HeapError> {
        let len = region.len();
        let shape = opts.stripes.map(StripeShape::check).transpose()?;
        let cfg = journal_config(len)?;
        let mut log = NvLog::format(Healed::new(region), cfg)?;
        let header = header_page(log.footprint());
        let first_run = header + POOL_HEADER;
        // The region's last page holds the far superblock copy.
        let room = far_copy_at(len);
        let mut runs = room.saturating_sub(first_run) / RUN;
        if let Some(shape) = shape {
            while runs > 0 && first_run + runs * RUN + Geometry::overhead(shape, pages(runs)) > room {
                runs -= 1;
            }
        }
        if runs == 0 {
            let overhead = shape.map_or(0, |s| Geometry::overhead(s, pages(1)));
            return Err(HeapError::RegionTooSmall {
                len,
                needed: (first_run + RUN + overhead + PAGE) as usize,
            });
        }
        let pool_id = random_id();
        let sb = Superblock {
            version: HEAP_VERSION,
            first_run,
            runs: runs as u32,
            journal: log.footprint() as u32,
            pool_id,
            shape,
            closed: false,
        };
        let region = log.region_mut();
        // Every run unassigned (a region reused from an earlier pool holds old headers).
        for r in 0..runs {
            let at = (first_run + r * RUN) as usize;
            region.write(at, &[0u8; 64])?;
            region.flush(at, 64)?;
        }
        region.write((header + ROOT_SLOT) as usize, &[0u8; 64])?;
        region.flush((header + ROOT_SLOT) as usize, 64)?;
        region.fence()?;
        // Parity and signatures for the pages as they are, before the superblocks that
        // say the pool has them.
        if let Some(geo) = geometry(&sb, header) {
            region.protect(geo);
            region.rebuild_all()?;
            region.start_verifying();
        }
        // The superblocks last: a crash before them leaves no pool, never half of one.
        for copy in [SUPERBLOCK_A, SUPERBLOCK_B] {
            region.write((header + copy) as usize, &sb.encode())?;
            region.persist((header + copy) as usize, 64)?;
        }
        crate::superblocks::keep_far_copy(&mut log, &sb)?;
        let alloc = Allocator::rebuild(log.region(), sb, opts.reuse_after, opts.clock);
        let mut pool = Pool::assemble(log, sb, alloc, header);
        pool.guard()?;
        Ok(pool)
    }

    /// Opens the pool in `region`: recovers the journal, reads the superblock (rewriting a
    /// damaged copy from the other) and rebuilds the allocator from the block headers.
    pub fn open(region: R, opts: PoolOptions) -> Result<(Pool<R>, OpenReport), HeapError> {
        let (mut log, journal) = NvLog::open(Healed::new(region)).map_err(|e| match e {
            bitmend_nvlog::LogError::NotALog { why } => {
                HeapError::NotAPool { why: format!("journal: {why}") }
            }
            e => e.into(),
        })?;
        let header = header_page(log.footprint());
        let (mut sb, damaged) = crate::superblocks::read(&mut log, header, |sb| geometry(sb, header))?;
        let geo = geometry(&sb, header);
        let end = geo.map_or(sb.first_run + sb.runs as u64 * RUN, |g| g.end());
        let room = match sb.version >= HEAP_VERSION_FAR_COPY {
            true => far_copy_at(log.region().len()),
            false => log.region().len() as u64,
        };
        if sb.journal as usize != log.footprint() || end > room {
            return Err(HeapError::NotAPool { why: "the superblock disagrees with the region".into() });
        }
        // A pool closed cleanly needs no recompute of its parity and signatures (nothing was
        // torn), and must not take in damage made while it was closed: its stores check the
        // lines they overwrite from the first one on. The mark goes before anything is
        // stored (copy A first: read first, a crash between leaves it open).
        let clean = sb.closed;
        // Protected before anything below writes a page.
        if let Some(geo) = geo {
            log.region_mut().protect(geo);
            if clean {
                log.region_mut().start_verifying();
            }
        }
        sb.closed = false;
        let rewrite: Vec<u64> = if clean { vec![SUPERBLOCK_A, SUPERBLOCK_B] } else { damaged.clone() };
        for copy in &rewrite {
            let at = (header + copy) as usize;
            log.region_mut().write(at, &sb.encode())?;
            log.region_mut().persist(at, 64)?;
        }
        // A version 1 or 2 pool is marked version 3 (copy A, then B: a crash between leaves
        // A, read first, new) before anything this build writes that its readers would
        // misread. Version 3 stays: version 4 differs in its block headers' layout, which a
        // pool keeps.
        let upgraded_from = (sb.version < HEAP_VERSION_UPGRADED).then_some(sb.version);
        if upgraded_from.is_some() {
            sb.version = HEAP_VERSION_UPGRADED;
            for copy in [SUPERBLOCK_A, SUPERBLOCK_B] {
                let at = (header + copy) as usize;
                log.region_mut().write(at, &sb.encode())?;
                log.region_mut().persist(at, 64)?;
            }
        }
        let far_rewritten = crate::superblocks::keep_far_copy(&mut log, &sb)?;
        let mut recs = heap_records(&mut log)?;
        let journal_repairs = log.take_repairs().len();
        // A closed pool's journal was emptied at close; one that is not was never closed
        // by this build, and is recovered as after a crash.
        let clean = clean && recs.is_empty();
        let mut alloc = Allocator::rebuild(log.region(), sb, opts.reuse_after, opts.clock.clone());
        // The superblocks too: the open that a crash cut short may have been writing them.
        let torn = |recs: &[(u64, Rec)]| match clean {
            true => Vec::new(),
            false => [vec![(header, 128)], torn_ranges(log.region(), sb, &alloc, recs)].concat(),
        };
        // Every transaction before the last was fenced, patches and all, before the next
        // began: only the last one's stores can be torn, and damage anywhere else is found
        // by the line checks and rebuilt before recovery writes or recomputes anything
        // (either would take it in). All are recomputed, as ever.
        let last = recs.last().map(|(id, _)| *id);
        let last_tx: Vec<(u64, Rec)> = recs.iter().filter(|(id, _)| Some(*id) == last).cloned().collect();
        let (suspect, torn) = (torn(&last_tx), torn(&recs));
        let mended = mend(log.region_mut(), &recs, &torn, &suspect)?;
        let torn_commit = drop_torn_commit(log.region(), &mut recs);
        let formatted = finish_formats(log.region_mut(), sb, &recs)?;
        if formatted || mended.lines_rebuilt > 0 {
            alloc = Allocator::rebuild(log.region(), sb, opts.reuse_after, opts.clock.clone());
        }
        let mut report = OpenReport {
            journal,
            bad_headers: alloc.faults.clone(),
            superblocks_rewritten: damaged.len() as u32 + u32::from(far_rewritten),
            journal_repairs,
            torn_commit,
            upgraded_from,
            was_closed: clean,
            lines_mended: mended.lines_rebuilt,
            pages_left_damaged: mended.pages_beyond,
            ..OpenReport::default()
        };
        let mut pool = Pool::assemble(log, sb, alloc, header);
        pool.recover(recs, &torn, &mut report)?;
        pool.log.region_mut().start_verifying();
        pool.heal_headers(&mut report, &opts)?;
        pool.guard()?;
        Ok((pool, report))
    }

    /// In a pool that heals, headers that failed their checks are most likely on a damaged
    /// page: each such page is rebuilt from its stripe, and the allocator rebuilt from the
    /// healed headers (its state is DRAM only), so that their blocks are not quarantined
    /// for a whole session.
    fn heal_headers(&mut self, report: &mut OpenReport, opts: &PoolOptions) -> Result<(), HeapError> {
        if !self.heals() || !opts.rebuild_headers {
            return Ok(());
        }
        // Headers that read as free may be zeroed damage (a block that seems free, a run
        // that seems unassigned): those whose lines fail their checks are healed too.
        let mut suspects: Vec<u64> = report.bad_headers.iter().map(|b| b.at).collect();
        suspects.extend(
            self.alloc
                .free_looking_headers()
                .into_iter()
                .filter(|&at| self.check_tx_read(at, crate::layout::BLOCK_HEADER).is_err()),
        );
        if suspects.is_empty() {
            return Ok(());
        }
        let before = self.heal_stats().pages_repaired;
        for at in suspects {
            // A page beyond repair keeps its quarantine.
            let _ = self.verify(at, 64);
        }
        report.header_pages_rebuilt = self.heal_stats().pages_repaired - before;
        if report.header_pages_rebuilt > 0 {
            self.alloc = Allocator::rebuild(self.log.region(), self.sb, opts.reuse_after, opts.clock.clone());
            report.bad_headers = self.alloc.faults.clone();
        }
        Ok(())
    }
}

impl<R: Region> Pool<R> {
    /// `torn`: the ranges whose patches a crash may have torn ([`torn_ranges`]; none after
    /// a clean close), recomputed once recovery has written them.
    pub(crate) fn recover(
        &mut self,
        recs: Vec<(u64, Rec)>,
        torn: &[(u64, u64)],
        report: &mut OpenReport,
    ) -> Result<(), HeapError> {
        if recs.is_empty() {
            self.resolve_links(report);
            self.recompute_torn(torn)?;
            self.log.region_mut().fence()?;
            return Ok(());
        }
        let committed: BTreeSet<u64> =
            recs.iter().filter(|(_, r)| matches!(r, Rec::Commit(_))).map(|(id, _)| *id).collect();
        let all: BTreeSet<u64> = recs.iter().map(|(id, _)| *id).collect();
        report.committed = committed.len() as u64;
        report.rolled_back = all.difference(&committed).count() as u64;
        // Write back what uncommitted transactions overwrote, last record first.
        for (_, r) in recs.iter().rev().filter(|(id, _)| !committed.contains(id)) {
            let ranges = match r {
                Rec::Undo(ranges) => ranges.clone(),
                Rec::Pointer { slot, old, .. } => vec![(*slot, old.0.to_le_bytes().to_vec())],
                _ => continue,
            };
            for (at, bytes) in ranges.into_iter().rev() {
                let region = self.log.region_mut();
                if at as usize + bytes.len() <= region.len() {
                    region.write(at as usize, &bytes)?;
                    region.flush(at as usize, bytes.len())?;
                    report.bytes_restored += bytes.len() as u64;
                }
            }
        }
        self.log.region_mut().fence()?;
        // Before the journal's blocks are settled: a block a committed transaction allocated
        // whose header a crash tore to a linked one is settled allocated below.
        self.resolve_links(report);
        // Every block the journal names, settled to where the records leave it.
        let mut state: BTreeMap<Ptr, Option<u64>> = BTreeMap::new();
        for (id, r) in &recs {
            let done = committed.contains(id);
            match r {
                Rec::Alloc { p, len } => {
                    state.insert(*p, done.then_some(*len));
                }
                Rec::Free(p) if done => {
                    state.insert(*p, None);
                }
                Rec::Pointer { old, new, .. } => {
                    // The new block holds the old object: its length.
                    let len = self.size_of(*old).ok().or_else(|| self.alloc.capacity(*new)).unwrap_or(0);
                    state.insert(*new, done.then_some(len));
                    if done {
                        state.insert(*old, None);
                    }
                }
                _ => {}
            }
        }
        for (p, s) in state {
            let region = self.log.region_mut();
            if self.alloc.settle(region, p, s.is_some(), s.unwrap_or(0))? {
                report.blocks_settled += 1;
            }
        }
        self.recompute_torn(torn)?;
        // The settled headers durable before the records that stand for them are trimmed
        // (and the parity and signatures recomputed for them).
        self.log.region_mut().fence()?;
        let tail = self.log.tail();
        self.log.trim(tail)?;
        self.next_tx = all.iter().max().map_or(1, |m| m + 1);
        Ok(())
    }

    /// Recomputes the parity and signatures of `torn` (see [`torn_ranges`]) from the bytes
    /// as recovery left them. Nothing to do in a pool without stripes.
    fn recompute_torn(&mut self, torn: &[(u64, u64)]) -> Result<(), HeapError> {
        let region = self.log.region_mut();
        if region.shield.is_none() {
            return Ok(());
        }
        for &(at, len) in torn {
            region.recompute(at, len)?;
        }
        Ok(())
    }

    /// Each block whose header is linked to a slot is allocated if the slot (as the rollback
    /// left it) points at it, else free: an allocation into the slot that a crash cut short,
    /// or a block freed from its slot. Writes nothing: a free block's header may stay linked.
    fn resolve_links(&mut self, report: &mut OpenReport) {
        for (p, slot) in std::mem::take(&mut self.alloc.linked) {
            let bytes = self.log.region().bytes();
            let points =
                slot as usize + 8 <= bytes.len() && bitmend_code::le::get_u64(bytes, slot as usize) == p.0;
            if points {
                self.links.insert(&self.alloc, slot, p);
            } else {
                self.alloc.free_unlinked(p);
                report.links_freed += 1;
            }
        }
    }
}
