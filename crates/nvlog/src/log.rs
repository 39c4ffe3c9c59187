//! The log: format, append, read, replay, trim.

use std::collections::BTreeSet;

use bitmend_code::le;
use bitmend_code::rs::Codec;
use bitmend_code::sig::{Sig64, Signer};
use bitmend_media::pmem::Region;

use crate::layout::{superblock_copies, HeadSlot, Layout, LogConfig, SegmentHeader, Superblock, LOG_VERSION};
use crate::record::{self, align, At, HEADER};
use crate::{LogError, RecordId};

/// Why a repair was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// A data chunk's bytes did not match its signature or its records' CRCs; rebuilt.
    DataChunk,
    /// A parity chunk's signature disagreed with the data chunks'; recomputed.
    ParityChunk,
    /// A copy of a segment header was damaged; rewritten.
    SegmentHeader,
    /// A copy of the superblock was damaged; rewritten.
    Superblock,
    /// The current head slot was damaged; rewritten.
    HeadSlot,
    /// Non-zero bytes where the log keeps zeros (past the tail); zeroed.
    Garbage,
}

/// One repair: where, why, and the tags of the records whose bytes it restored (the PRIMS
/// "module identification": which parts of the system had their data hit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repair {
    pub segment: u64,
    /// Chunk index (data 0..k, then parity), or `usize::MAX` for a structure outside chunks.
    pub chunk: usize,
    pub cause: Cause,
    pub tags: Vec<u16>,
}

/// Where the next record goes: logical segment, chunk (k when the segment is full), offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tail {
    pub seg: u64,
    /// The physical segment holding `seg` (kept: a division per append shows in profiles).
    pub p: usize,
    pub chunk: usize,
    pub off: usize,
}

/// A record read back: its id, the tag of the module that wrote it, its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub id: RecordId,
    pub tag: u16,
    pub data: Vec<u8>,
}

/// Counters since the log was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    pub appends: u64,
    pub reads: u64,
    /// Chunks checked against their signature or their records' CRCs.
    pub chunks_verified: u64,
    pub repaired_data_chunks: u64,
    pub repaired_parity_chunks: u64,
    pub repaired_headers: u64,
    /// Ranges holding bytes where the log keeps zeros (stray writes past the tail), zeroed.
    pub zeroed_garbage: u64,
    /// Chunks found damaged beyond the code's redundancy.
    pub unrecoverable_chunks: u64,
}

/// The PRIMS encoded log on a persistent-memory region. See the crate documentation.
pub struct NvLog<R: Region> {
    pub(crate) region: R,
    pub(crate) layout: Layout,
    pub(crate) log_id: u64,
    /// The on-media version (1 or 2): where the superblock and head slot copies are.
    pub(crate) version: u32,
    pub(crate) codec: Codec,
    pub(crate) signer: Signer<4>,
    /// Each physical segment's header, as last written (the in-memory copy is a third copy).
    pub(crate) headers: Vec<Option<SegmentHeader>>,
    pub(crate) head: u64,
    pub(crate) head_seq: u64,
    pub(crate) tail: Option<Tail>,
    /// (segment, chunk) pairs found damaged beyond repair.
    pub(crate) lost: BTreeSet<(u64, usize)>,
    pub(crate) stats: LogStats,
    pub(crate) repairs: Vec<Repair>,
    scratch: Vec<u8>,
    /// The live segment's parity chunks, as the append path last wrote them.
    pub(crate) shadow: Vec<u8>,
    pub(crate) shadow_seg: Option<u64>,
    /// A copy of the live chunk as the append path wrote it, and which (segment, chunk)
    /// it is of.
    live: Vec<u8>,
    live_at: Option<(u64, usize)>,
    /// An append's stores failed part way: no more appends until the log is opened again.
    interrupted: bool,
    /// Where the last record written into `live` ends: past it the copy is zero.
    live_end: usize,
}

impl<R: Region> std::fmt::Debug for NvLog<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvLog")
            .field("config", &self.layout.cfg)
            .field("head", &self.head)
            .field("tail", &self.tail)
            .finish_non_exhaustive()
    }
}

impl<R: Region> NvLog<R> {
    pub(crate) fn assemble(region: R, sb: &Superblock) -> Result<NvLog<R>, LogError> {
        let (cfg, log_id, version) = (sb.cfg, sb.log_id, sb.version);
        let codec = Codec::new(cfg.k, cfg.m).map_err(|e| LogError::Config { why: e.to_string() })?;
        Ok(NvLog {
            region,
            layout: Layout::new(cfg, version),
            log_id,
            version,
            codec,
            signer: Signer::new(),
            headers: vec![None; cfg.segments as usize],
            head: 0,
            head_seq: 0,
            tail: None,
            lost: BTreeSet::new(),
            stats: LogStats::default(),
            repairs: Vec::new(),
            scratch: Vec::new(),
            shadow: Vec::new(),
            shadow_seg: None,
            live: Vec::new(),
            live_at: None,
            interrupted: false,
            live_end: 0,
        })
    }

    /// Formats `region` as an empty log. `cfg.segments` 0 means as many as fit.
    pub fn format(mut region: R, cfg: LogConfig) -> Result<NvLog<R>, LogError> {
        let cfg = if cfg.segments == 0 { cfg.fit(region.len())? } else { cfg };
        cfg.validate()?;
        let layout = Layout::new(cfg, LOG_VERSION);
        if region.len() < layout.needed() {
            return Err(LogError::RegionTooSmall { len: region.len(), needed: layout.needed() });
        }
        // An identity that segment headers and head slots carry, so that leftovers of an
        // earlier log in the same region are never taken for this one's.
        let log_id = {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let mut r = bitmend_media::rng::Rng::new(t.as_nanos() as u64 ^ (std::process::id() as u64) << 40);
            r.next_u64() | 1
        };
        // Invalidate every old segment header before anything else is written.
        for p in 0..cfg.segments as usize {
            for copy in 0..2 {
                let at = layout.header(p, copy);
                region.update(at, layout.header_size, &mut |b| b.fill(0))?;
                region.flush(at, layout.header_size)?;
            }
        }
        region.fence()?;
        let sb = Superblock { version: LOG_VERSION, cfg, log_id, region_len: region.len() as u64 };
        let mut log = NvLog::assemble(region, &sb)?;
        log.write_head_slot(0, 0)?;
        log.write_head_slot(1, 0)?;
        log.head_seq = 1;
        let bytes = sb.encode(&log.signer);
        for &at in superblock_copies(LOG_VERSION) {
            log.region.write(at, &bytes)?;
            log.region.persist(at, bytes.len())?;
        }
        Ok(log)
    }

    pub(crate) fn write_head_slot(&mut self, seq: u64, head: u64) -> Result<(), LogError> {
        let b = HeadSlot { seq, head }.encode(self.log_id);
        // Each copy durable before the next: a crash leaves at most one torn, and the others
        // each old or new.
        for at in HeadSlot::offsets(seq, self.version) {
            self.region.write(at, &b)?;
            self.region.persist(at, b.len())?;
        }
        Ok(())
    }

    /// The configuration the log was formatted with.
    pub fn config(&self) -> LogConfig {
        self.layout.cfg
    }

    /// Bytes of the region the log occupies, from offset 0: what follows is free for another
    /// structure in the same region (the heap keeps its pool there, so that one fence orders
    /// the journal and the data it protects).
    pub fn footprint(&self) -> usize {
        self.layout.needed()
    }

    /// The first live record position.
    pub fn head(&self) -> RecordId {
        RecordId(self.head)
    }

    /// Where the next record will be written.
    pub fn tail(&self) -> RecordId {
        RecordId(self.tail.map_or(0, |t| self.id_at(t.seg, t.chunk, t.off)))
    }

    /// Bytes of record space between the head and the tail, and the log's whole record
    /// space: how full it is (an append past it is refused as [`LogError::Full`]).
    pub fn fill(&self) -> (u64, u64) {
        let live = self.tail().0.saturating_sub(self.head);
        (live, self.seg_data() * u64::from(self.layout.cfg.segments))
    }

    /// The largest payload a record can carry.
    pub fn max_record(&self) -> usize {
        self.layout.cfg.chunk_size - HEADER
    }

    pub fn stats(&self) -> LogStats {
        self.stats
    }

    /// Every repair made since the last call, oldest first.
    pub fn take_repairs(&mut self) -> Vec<Repair> {
        std::mem::take(&mut self.repairs)
    }

    pub fn region(&self) -> &R {
        &self.region
    }

    /// The region, for injecting faults in tests (damage goes through `Region::corrupt` or
    /// ordinary stores, as it would in a real system).
    pub fn region_mut(&mut self) -> &mut R {
        &mut self.region
    }

    pub fn into_region(self) -> R {
        self.region
    }

    /// Where chunk `chunk` (data 0..k, then parity) of logical segment `seg` lies in the
    /// region (for fault injection and inspection tools).
    pub fn chunk_range(&self, seg: u64, chunk: usize) -> std::ops::Range<usize> {
        let at = self.layout.chunk(self.layout.physical(seg), chunk);
        at..at + self.layout.cfg.chunk_size
    }

    /// Where the two copies of logical segment `seg`'s header lie in the region.
    pub fn header_ranges(&self, seg: u64) -> [std::ops::Range<usize>; 2] {
        let p = self.layout.physical(seg);
        [0, 1].map(|c| {
            let at = self.layout.header(p, c);
            at..at + self.layout.header_size
        })
    }

    pub(crate) fn seg_data(&self) -> u64 {
        self.layout.cfg.segment_data()
    }

    pub(crate) fn id_at(&self, seg: u64, chunk: usize, off: usize) -> u64 {
        seg * self.seg_data() + (chunk * self.layout.cfg.chunk_size + off) as u64
    }

    pub(crate) fn locate(&self, id: u64) -> (u64, usize, usize) {
        let cs = self.layout.cfg.chunk_size as u64;
        let seg = id / self.seg_data();
        let within = id % self.seg_data();
        (seg, (within / cs) as usize, (within % cs) as usize)
    }

    pub(crate) fn chunk_bytes(&self, p: usize, i: usize) -> &[u8] {
        let at = self.layout.chunk(p, i);
        &self.region.bytes()[at..at + self.layout.cfg.chunk_size]
    }

    /// Writes physical segment `p`'s header: one copy, fence, the other copy, fence. A copy
    /// spans several cache lines, so a crash can tear the one being written; the other is
    /// then intact, old or new.
    pub(crate) fn write_header(&mut self, p: usize) -> Result<(), LogError> {
        let bytes = self.headers[p].as_ref().expect("header present").encode(self.log_id);
        for copy in 0..2 {
            let at = self.layout.header(p, copy);
            self.region.write(at, &bytes)?;
            self.region.persist(at, bytes.len())?;
        }
        Ok(())
    }

    pub(crate) fn note(&mut self, repair: Repair) {
        match repair.cause {
            Cause::DataChunk => self.stats.repaired_data_chunks += 1,
            Cause::ParityChunk => self.stats.repaired_parity_chunks += 1,
            Cause::SegmentHeader | Cause::Superblock | Cause::HeadSlot => self.stats.repaired_headers += 1,
            Cause::Garbage => self.stats.zeroed_garbage += 1,
        }
        self.repairs.push(repair);
    }

    /// Appends a record of `data` issued by module `tag`. When it returns, the record and the
    /// parity that protects it are durable.
    pub fn append(&mut self, tag: u16, data: &[u8]) -> Result<RecordId, LogError> {
        let id = self.append_unfenced(tag, data)?;
        self.region.fence()?;
        Ok(id)
    }

    /// Appends a record as [`append`](Self::append) does, without the fence: the record and
    /// its parity are written and flushed, and durable at the region's next fence, together
    /// with whatever else the caller flushed. A crash before that fence may keep the record
    /// or not (recovery may even rebuild it from its parity while stores flushed beside it
    /// are lost): a caller that shares the fence must be able to tell, as the heap's
    /// checksummed commit record does.
    pub fn append_unfenced(&mut self, tag: u16, data: &[u8]) -> Result<RecordId, LogError> {
        if self.interrupted {
            return Err(LogError::Interrupted);
        }
        let cfg = self.layout.cfg;
        let need = HEADER + data.len();
        if need > cfg.chunk_size {
            return Err(LogError::RecordTooLarge { len: data.len(), max: self.max_record() });
        }
        let t = loop {
            let Some(t) = self.tail else {
                self.enter(0)?;
                continue;
            };
            if t.chunk == cfg.k {
                let p = self.layout.physical(t.seg);
                if !self.headers[p].as_ref().is_some_and(|h| h.sealed) {
                    self.seal(t.seg)?;
                }
                self.enter(t.seg + 1)?;
                continue;
            }
            if t.off + need > cfg.chunk_size {
                self.close_chunk(t)?;
                continue;
            }
            break t;
        };
        let p = t.p;
        let id = self.id_at(t.seg, t.chunk, t.off);
        let mut rec = std::mem::take(&mut self.scratch);
        record::encode(id, tag, data, &mut rec);
        let result = self.store_record(p, t, &rec);
        self.scratch = rec;
        result?;
        self.tail = Some(Tail { off: align(t.off + need, cfg.block_size).min(cfg.chunk_size), ..t });
        self.stats.appends += 1;
        Ok(RecordId(id))
    }

    /// The record's bytes into the live chunk, the parity delta into each parity chunk
    /// (the bytes there were zero, so the delta is the record itself); the caller fences.
    ///
    /// The live chunk and the live segment's parity are kept in DRAM copies (`live`,
    /// `shadow`), and the changed bytes are streamed to the medium from them: non-temporal
    /// stores need no flush and no read of lines that the previous append's write-back just
    /// evicted, and the chunk is signed from its copy when it closes, never read back. The
    /// record's last line is streamed whole with the zeros that follow it: a partial line
    /// of non-temporal stores costs a partial write-combining flush.
    fn store_record(&mut self, p: usize, t: Tail, rec: &[u8]) -> Result<(), LogError> {
        let (k, m, cs) = (self.layout.cfg.k, self.layout.cfg.m, self.layout.cfg.chunk_size);
        if self.shadow_seg != Some(t.seg) {
            self.load_shadow(t.seg);
        }
        if self.live_at != Some((t.seg, t.chunk)) {
            self.load_live(t)?;
        }
        let at = self.layout.chunk(p, t.chunk) + t.off;
        let end = (t.off + rec.len()).next_multiple_of(64).min(cs);
        debug_assert!(le::is_zero(&self.live[t.off..end]), "a record goes where the chunk is unwritten");
        self.live[t.off..t.off + rec.len()].copy_from_slice(rec);
        self.live_end = t.off + rec.len();
        let delta = &self.live[t.off..end];
        let mut result = self.region.write_streaming(at, delta);
        // One pass over the delta for up to 8 parity chunks at a time (the engine splits
        // each source vector once and applies every coefficient to it); no allocation.
        let column = self.codec.parity_column(t.chunk);
        let engine = self.codec.engine();
        let mut rest: &mut [u8] = &mut self.shadow;
        for g in (0..m).step_by(8) {
            let n = (m - g).min(8);
            let mut outs: [&mut [u8]; 8] = Default::default();
            for slot in outs.iter_mut().take(n) {
                // Split rather than `chunks_mut`: that divides by the chunk size each call.
                let (chunk, after) = std::mem::take(&mut rest).split_at_mut(cs);
                *slot = &mut chunk[t.off..end];
                rest = after;
            }
            engine.dot_prod(&column[g..g + n], &[delta], &mut outs[..n], true);
        }
        for j in 0..m {
            if result.is_err() {
                break;
            }
            // Whole cache lines from the copy (the bytes around the delta are what the medium
            // holds): a partial line of non-temporal stores costs a partial write-combining
            // flush, which made a 100-byte append take twice a 50-byte one.
            let base = self.layout.chunk(p, k + j);
            let from = ((base + t.off) & !63).max(base) - base;
            let to = ((base + end).next_multiple_of(64) - base).min(cs);
            result = self.region.write_streaming(base + from, &self.shadow[j * cs + from..j * cs + to]);
        }
        if result.is_err() {
            // The copies in DRAM now hold a record the medium may or may not: appending on
            // top of them would write beside bytes nobody can account for.
            self.interrupted = true;
        }
        result?;
        Ok(())
    }

    /// Makes `live` the copy of the tail's chunk: zeros for a chunk that starts empty, else
    /// its bytes on the medium, checked first (repaired if need be), as a reopened log finds
    /// its live chunk.
    fn load_live(&mut self, t: Tail) -> Result<(), LogError> {
        let cs = self.layout.cfg.chunk_size;
        self.live_at = None;
        if t.off == 0 {
            // Only what the last chunk's records wrote needs zeroing again.
            let written = self.live_end.min(self.live.len());
            self.live[..written].fill(0);
            self.live.resize(cs, 0);
        } else {
            self.live.clear();
            self.verify_chunk(t.seg, t.chunk)?;
            let at = self.layout.chunk(t.p, t.chunk);
            self.live.extend_from_slice(&self.region.bytes()[at..at + cs]);
            self.live_end = cs;
        }
        self.live_at = Some((t.seg, t.chunk));
        Ok(())
    }

    /// Reads the live segment's parity chunks into the DRAM copy the append path updates.
    pub(crate) fn load_shadow(&mut self, seg: u64) {
        let p = self.layout.physical(seg);
        let (k, m, cs) = (self.layout.cfg.k, self.layout.cfg.m, self.layout.cfg.chunk_size);
        let at = self.layout.chunk(p, k);
        self.shadow.clear();
        self.shadow.extend_from_slice(&self.region.bytes()[at..at + m * cs]);
        self.shadow_seg = Some(seg);
    }

    /// Starts logical segment `seg`: zeroes its chunks (so zero parity is right), then writes
    /// its header. Refuses to overwrite a segment that still holds live records.
    fn enter(&mut self, seg: u64) -> Result<(), LogError> {
        let s = self.layout.cfg.segments as u64;
        if seg >= s && self.head < (seg - s + 1) * self.seg_data() {
            return Err(LogError::Full { head: RecordId(self.head) });
        }
        let p = self.layout.physical(seg);
        // Streamed: the segment's lines were last written a lap ago and are not cached, and
        // a store that bypasses the cache neither reads them first nor needs a write-back.
        static ZEROS: [u8; 4096] = [0; 4096];
        let range = self.layout.chunks(p);
        for at in range.clone().step_by(ZEROS.len()) {
            self.region.write_streaming(at, &ZEROS[..ZEROS.len().min(range.end - at)])?;
        }
        self.region.fence()?;
        self.headers[p] = Some(SegmentHeader::fresh(seg, self.layout.cfg.n()));
        self.write_header(p)?;
        if seg >= s {
            self.lost.retain(|&(g, _)| g != seg - s);
        }
        let parity = self.layout.cfg.m * self.layout.cfg.chunk_size;
        self.shadow.clear();
        self.shadow.resize(parity, 0);
        self.shadow_seg = Some(seg);
        self.tail = Some(Tail { seg, p, chunk: 0, off: 0 });
        Ok(())
    }

    /// Closes the live chunk: signs it, from its copy, and records the signature.
    fn close_chunk(&mut self, t: Tail) -> Result<(), LogError> {
        // Records appended without a fence become durable first: the header written next
        // vouches for them (and a crash that kept it but lost them, with their parity,
        // would leave a closed chunk nothing can rebuild).
        self.region.fence()?;
        let p = self.layout.physical(t.seg);
        if self.live_at != Some((t.seg, t.chunk)) {
            self.load_live(t)?;
        }
        // From what was meant to be written, never read back: a stray write into the chunk
        // since fails this signature at the chunk's next check, and the parity (from the
        // same bytes) rebuilds it there. Only up to the tail: the rest of the copy is zero,
        // and zeros at the end add nothing to an algebraic signature (a 16 KiB record
        // leaves a quarter of a 64 KiB chunk unused). The check still signs the whole chunk.
        debug_assert!(le::is_zero(&self.live[t.off..]), "nothing is written past the tail");
        let sig = self.signer.sign(&self.live[..t.off]);
        let h = self.headers[p].as_mut().expect("live header");
        h.sigs[t.chunk] = sig;
        h.closed = t.chunk + 1;
        self.write_header(p)?;
        self.tail = Some(Tail { chunk: t.chunk + 1, off: 0, ..t });
        Ok(())
    }

    /// Seals a full segment: records the parity chunks' signatures, after checking them
    /// against the data chunks' (checked as each closed); on a mismatch the whole segment is
    /// checked and repaired first. Sealed segments are never written again except to repair.
    fn seal(&mut self, seg: u64) -> Result<(), LogError> {
        let (k, m) = (self.layout.cfg.k, self.layout.cfg.m);
        let p = self.layout.physical(seg);
        let data: Vec<Sig64> = self.headers[p].as_ref().expect("live header").sigs[..k].to_vec();
        let parity: Vec<Sig64> = (0..m).map(|j| Sig64::combine(self.codec.parity_row(j), &data)).collect();
        let consistent = (0..m).all(|j| self.signer.sign(self.chunk_bytes(p, k + j)) == parity[j]);
        let sigs =
            if consistent { data.into_iter().chain(parity).collect() } else { self.check_segment(seg)? };
        let h = self.headers[p].as_mut().expect("live header");
        h.sigs = sigs;
        h.sealed = true;
        self.write_header(p)?;
        Ok(())
    }

    /// Reads record `id`, after checking its chunk (and repairing the segment if needed).
    pub fn read(&mut self, id: RecordId) -> Result<Record, LogError> {
        let tail = self.tail().0;
        if id.0 >= tail {
            return Err(LogError::NoSuchRecord { id });
        }
        if id.0 < self.head {
            return Err(LogError::Trimmed { id, head: RecordId(self.head) });
        }
        let (seg, chunk, off) = self.locate(id.0);
        self.verify_chunk(seg, chunk)?;
        self.stats.reads += 1;
        let p = self.layout.physical(seg);
        let bytes = self.chunk_bytes(p, chunk);
        match record::at(bytes, self.id_at(seg, chunk, 0), off) {
            At::Record(f) => Ok(Record { id, tag: f.tag, data: bytes[f.payload()].to_vec() }),
            _ => Err(LogError::NoSuchRecord { id }),
        }
    }

    /// Calls `f` with every live record from `from` on, in order; returns how many. Each chunk
    /// is checked once, before its records are handed out.
    pub fn replay(&mut self, from: RecordId, f: impl FnMut(RecordId, u16, &[u8])) -> Result<u64, LogError> {
        self.replay_in(from, f, None)
    }

    /// As [`NvLog::replay`], but a chunk damaged beyond the code's redundancy is passed over:
    /// `lost` is called with its (segment, chunk) where its records would have come, and the
    /// replay goes on with the next chunk. For a reader that can tell what the lost records
    /// leave uncertain (the NVRAM tier names those pages), never for one that would guess.
    pub fn replay_lossy(
        &mut self,
        from: RecordId,
        f: impl FnMut(RecordId, u16, &[u8]),
        lost: &mut dyn FnMut(u64, usize),
    ) -> Result<u64, LogError> {
        self.replay_in(from, f, Some(lost))
    }

    fn replay_in(
        &mut self,
        from: RecordId,
        mut f: impl FnMut(RecordId, u16, &[u8]),
        mut lost: Option<&mut dyn FnMut(u64, usize)>,
    ) -> Result<u64, LogError> {
        let Some(t) = self.tail else { return Ok(0) };
        let start = from.0.max(self.head);
        let (first_seg, first_chunk, _) = self.locate(start);
        let mut count = 0;
        for seg in first_seg..=t.seg {
            let chunks = if seg == t.seg { (t.chunk + 1).min(self.layout.cfg.k) } else { self.layout.cfg.k };
            let from_chunk = if seg == first_seg { first_chunk } else { 0 };
            for chunk in from_chunk..chunks {
                match (self.verify_chunk(seg, chunk), lost.as_mut()) {
                    (Ok(()), _) => {}
                    (Err(LogError::Unrecoverable { .. }), Some(lost))
                        if self.lost.contains(&(seg, chunk)) =>
                    {
                        lost(seg, chunk);
                        continue;
                    }
                    (Err(e), _) => return Err(e),
                }
                let p = self.layout.physical(seg);
                let base = self.id_at(seg, chunk, 0);
                let bytes = self.chunk_bytes(p, chunk);
                for r in record::chain(bytes, base, self.layout.cfg.block_size).records {
                    let id = base + r.off as u64;
                    if id >= start {
                        f(RecordId(id), r.tag, &bytes[r.payload()]);
                        count += 1;
                    }
                }
            }
        }
        Ok(count)
    }

    /// Every live record, in order.
    pub fn records(&mut self) -> Result<Vec<Record>, LogError> {
        let mut v = Vec::new();
        self.replay(RecordId(0), |id, tag, data| v.push(Record { id, tag, data: data.to_vec() }))?;
        Ok(v)
    }

    /// Drops every record before `to`: their segments become free for reuse.
    pub fn trim(&mut self, to: RecordId) -> Result<(), LogError> {
        let tail = self.tail().0;
        if to.0 < self.head || to.0 > tail {
            return Err(LogError::TrimRange { to, head: RecordId(self.head), tail: RecordId(tail) });
        }
        self.head_seq += 1;
        self.write_head_slot(self.head_seq, to.0)?;
        self.head = to.0;
        Ok(())
    }

    /// The signature of data chunk `i` of logical segment `seg` as the log expects it now.
    pub(crate) fn expected_data_sig(&self, seg: u64, i: usize) -> Option<Sig64> {
        let h = self.headers[self.layout.physical(seg)].as_ref()?;
        (i < h.closed).then(|| h.sigs[i])
    }
}
