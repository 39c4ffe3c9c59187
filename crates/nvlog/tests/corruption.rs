//! Corruption campaigns: wild writes and bit flips into chunks, headers, superblock and head.
//! Within the redundancy every record reads back exact; beyond it, reads fail, never lie.

mod common;

use bitmend_media::pmem::{RamRegion, Region, RegionFaults};
use bitmend_media::rng::Rng;
use bitmend_nvlog::{Cause, LogConfig, LogError, NvLog};
use common::*;

/// A log with several sealed segments and a live one partly filled.
fn filled(m: usize, chunk: usize) -> (NvLog<RamRegion>, Model) {
    let cfg = LogConfig { k: 4, m, chunk_size: chunk, block_size: 8, segments: 8 };
    let mut log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
    let mut model = Model::default();
    let target = 5 * cfg.segment_data() + cfg.segment_data() / 3;
    let mut i = 0;
    while log.tail().0 < target {
        let (tag, data) = payload(42, i, chunk / 4);
        model.records.push((log.append(tag, &data).unwrap(), tag, data));
        i += 1;
    }
    (log, model)
}

/// Every record either reads back exact or fails; returns (exact, failed).
fn read_all_never_wrong(log: &mut NvLog<RamRegion>, model: &Model) -> (usize, usize) {
    let (mut ok, mut failed) = (0, 0);
    for (id, tag, data) in &model.records {
        match log.read(*id) {
            Ok(r) => {
                assert_eq!((r.tag, &r.data), (*tag, data), "record {id} read back WRONG");
                ok += 1;
            }
            Err(LogError::Unrecoverable { .. }) => failed += 1,
            Err(e) => panic!("record {id}: unexpected {e}"),
        }
    }
    (ok, failed)
}

#[test]
fn wild_writes_into_up_to_m_chunks_per_segment_are_repaired() {
    let mut injected = 0;
    let mut trials = 0;
    let mut repaired = 0;
    for m in [1, 2, 4] {
        let (mut log, model) = filled(m, 1024);
        let n = 4 + m;
        let mut faults = RegionFaults::new(m as u64);
        let mut rng = Rng::new(100 + m as u64);
        let live = log.live_segments();
        for trial in 0..60 {
            let seg = live.start + rng.below(live.end - live.start);
            let bad = 1 + rng.below(m as u64) as usize;
            for chunk in rng.distinct(bad, n as u64) {
                let range = log.chunk_range(seg, chunk as usize);
                // 1 byte, a run, or the whole chunk.
                let len = match trial % 3 {
                    0 => 1,
                    1 => 1 + rng.below(200) as usize,
                    _ => range.len(),
                };
                let at = range.start + rng.below((range.len() - len + 1) as u64) as usize;
                faults.wild_write_at(log.region_mut(), at, len).unwrap();
                injected += 1;
            }
            trials += 1;
            // Reads find and repair what touches records; a scrub cleans the rest.
            let (ok, failed) = read_all_never_wrong(&mut log, &model);
            assert_eq!(
                (ok, failed),
                (model.records.len(), 0),
                "m={m} trial {trial}: {bad} bad chunks in segment {seg}"
            );
            let report = log.scrub().unwrap();
            assert!(report.unrecoverable.is_empty(), "{report}");
            let clean = log.scrub().unwrap();
            assert!(clean.repairs.is_empty(), "a second scrub finds nothing: {clean}");
        }
        let s = log.stats();
        repaired += s.repaired_data_chunks + s.repaired_parity_chunks + s.zeroed_garbage;
        assert_eq!(s.unrecoverable_chunks, 0);
        check_all(&mut log, &model);
    }
    eprintln!("corruption campaign: {trials} trials, {injected} wild writes (1 B to a whole chunk) into 1..m chunks of sealed and live segments, m=1,2,4; {repaired} chunk repairs; 0 records lost, 0 wrong bytes");
}

/// The live chunk is signed, when it closes, from the copy the appends wrote, not read back:
/// a wild write into it while it is open (into its records, or into the bytes past its
/// tail) must fail that signature afterwards and be rebuilt from the parity. One damaged
/// chunk at a time: it is scrubbed once it has closed (damage left to pile up in more than
/// m chunks of a segment is beyond any code, open chunk or not).
#[test]
fn wild_writes_into_the_open_chunk_are_repaired_after_it_closes() {
    let (mut injected, mut written_over, mut repaired) = (0, 0, 0);
    for m in [1, 2] {
        for block in [8, 64] {
            let cfg = LogConfig { k: 4, m, chunk_size: 2048, block_size: block, segments: 16 };
            let mut log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
            let mut model = Model::default();
            let mut faults = RegionFaults::new(7 + m as u64);
            let mut rng = Rng::new(block as u64 + m as u64);
            let per_segment = cfg.segment_data();
            // Which chunk holds the tail: (segment, chunk, offset in it).
            let place = |tail: u64| {
                let within = (tail % per_segment) as usize;
                (tail / per_segment, within / cfg.chunk_size, within % cfg.chunk_size)
            };
            let mut damaged = None;
            for i in 0..400 {
                let (tag, data) = payload(9, i, 300);
                model.records.push((log.append(tag, &data).unwrap(), tag, data));
                let (seg, chunk, off) = place(log.tail().0);
                if damaged.is_some_and(|d| d != (seg, chunk)) {
                    let report = log.scrub().unwrap();
                    assert!(report.unrecoverable.is_empty(), "m={m} block={block}: {report}");
                    damaged = None;
                }
                if damaged.is_some() || chunk == cfg.k || off == 0 {
                    continue;
                }
                // Into its records, or past its tail (where the next record overwrites part
                // of it: what it leaves outside that record must still be found).
                let range = log.chunk_range(seg, chunk);
                let (from, to) = if i % 2 == 0 { (0, off) } else { (off, cfg.chunk_size) };
                let len = (1 + rng.below(40) as usize).min(to - from);
                let at = range.start + from + rng.below((to - from - len + 1) as u64) as usize;
                faults.wild_write_at(log.region_mut(), at, len).unwrap();
                injected += 1;
                written_over += (from == 0) as u64;
                damaged = Some((seg, chunk));
            }
            let (ok, failed) = read_all_never_wrong(&mut log, &model);
            assert_eq!((ok, failed), (model.records.len(), 0), "m={m} block={block}");
            let report = log.scrub().unwrap();
            assert!(report.unrecoverable.is_empty(), "{report}");
            assert!(log.scrub().unwrap().repairs.is_empty(), "a second scrub finds nothing");
            let s = log.stats();
            repaired += s.repaired_data_chunks + s.repaired_parity_chunks + s.zeroed_garbage;
            assert_eq!(s.unrecoverable_chunks, 0);
            check_all(&mut log, &model);
        }
    }
    // Each write into records (or their padding) damaged a chunk of its own; one past the
    // tail may since be covered by the next record.
    assert!(
        repaired >= written_over,
        "every write into written bytes was found: {repaired} repairs, {written_over} such writes"
    );
    eprintln!("open-chunk campaign: {injected} wild writes (1..40 B) into open chunks ({written_over} into their records), m=1,2, blocks of 8 and 64 B; {repaired} chunk repairs; 0 records lost, 0 wrong bytes");
}

/// A reopened log has no copy of its live chunk: its first append reads the chunk from the
/// region, and checks it first, so damage there is repaired, not copied and signed.
#[test]
fn a_reopened_log_checks_its_live_chunk_before_appending_to_it() {
    let cfg = LogConfig { k: 4, m: 1, chunk_size: 2048, block_size: 64, segments: 8 };
    let mut faults = RegionFaults::new(11);
    let mut found = 0;
    for trial in 0..20u64 {
        let mut log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
        let mut model = Model::default();
        // Partway into a chunk: 3 + trial records of up to 200 bytes.
        for i in 0..3 + trial {
            let (tag, data) = payload(trial, i, 200);
            model.records.push((log.append(tag, &data).unwrap(), tag, data));
        }
        let (mut log, _) = NvLog::open(log.into_region()).unwrap();
        let tail = log.tail().0;
        let per_segment = cfg.segment_data();
        let within = (tail % per_segment) as usize;
        let (chunk, off) = (within / cfg.chunk_size, within % cfg.chunk_size);
        assert!(off > 0, "the live chunk holds records");
        let start = log.chunk_range(tail / per_segment, chunk).start;
        faults
            .wild_write_at(log.region_mut(), start + (trial as usize * 37) % off, 1 + trial as usize % 8)
            .unwrap();
        // Appends fill the chunk and close it, then a read of every record.
        for i in 100..140 {
            let (tag, data) = payload(trial, i, 200);
            model.records.push((log.append(tag, &data).unwrap(), tag, data));
        }
        found += log.stats().repaired_data_chunks;
        let (ok, failed) = read_all_never_wrong(&mut log, &model);
        assert_eq!((ok, failed), (model.records.len(), 0), "trial {trial}");
        assert!(log.scrub().unwrap().repairs.is_empty(), "trial {trial}: nothing left to repair");
    }
    assert_eq!(found, 20, "each damaged live chunk was repaired before the first append");
}

#[test]
fn more_than_m_bad_chunks_fail_reads_of_them_and_only_them() {
    for m in [1, 2] {
        let (mut log, model) = filled(m, 512);
        let seg = log.live_segments().start + 1; // a sealed segment
        let mut faults = RegionFaults::new(7);
        for chunk in 0..=m {
            let r = log.chunk_range(seg, chunk);
            faults.wild_write_at(log.region_mut(), r.start, r.len()).unwrap();
        }
        let (ok, failed) = read_all_never_wrong(&mut log, &model);
        assert!(failed > 0, "m={m}: records in the destroyed chunks fail");
        // Exactly the records in the m+1 damaged chunks fail.
        let seg_data = log.config().segment_data();
        let in_damaged = model
            .records
            .iter()
            .filter(|(id, _, _)| id.0 / seg_data == seg && (id.0 % seg_data) / 512 <= m as u64)
            .count();
        assert_eq!(failed, in_damaged, "m={m}");
        assert_eq!(ok + failed, model.records.len());
        // Replay stops with an error at the damage rather than skipping or inventing.
        assert!(matches!(log.records(), Err(LogError::Unrecoverable { segment, .. }) if segment == seg));
        // A data chunk plus every parity chunk also exceeds the redundancy.
        let (mut log, model) = filled(m, 512);
        let r = log.chunk_range(seg, 2);
        faults.wild_write_at(log.region_mut(), r.start + 5, 1).unwrap();
        for j in 0..m {
            let r = log.chunk_range(seg, 4 + j);
            faults.wild_write_at(log.region_mut(), r.start + 9, 3).unwrap();
        }
        let (_, failed) = read_all_never_wrong(&mut log, &model);
        assert!(failed > 0);
    }
}

#[test]
fn equal_errors_255_bytes_apart_are_caught_by_the_signature() {
    // A signature over GF(2^8) with a primitive element cancels two equal errors 255 bytes
    // apart; ours (GF(2^16)) must not. The scrub's full pass checks sealed chunks by their
    // signature alone, so detection here is the signature's.
    let (mut log, model) = filled(2, 4096);
    let seg = log.live_segments().start;
    let mut caught = 0;
    for (trial, gap) in [255usize, 510, 765, 1020, 255 * 8, 255 * 15].into_iter().enumerate() {
        let r = log.chunk_range(seg, trial % 4);
        let p = r.start + 100 + trial;
        let delta = 0x5Au8 ^ trial as u8;
        for at in [p, p + gap] {
            let b = log.region().bytes()[at] ^ delta;
            log.region_mut().corrupt(at, &[b]).unwrap();
        }
        let report = log.scrub().unwrap();
        assert_eq!(report.count(Cause::DataChunk), 1, "gap {gap}: {report}");
        caught += 1;
    }
    check_all(&mut log, &model);
    eprintln!("signature: {caught} pairs of equal errors 255*i bytes apart detected and repaired");
}

#[test]
fn random_bit_flips_are_corrected_or_refused() {
    let (mut log, model) = filled(2, 1024);
    let live = log.live_segments();
    let first = log.chunk_range(live.start, 0).start;
    let last = log.chunk_range(live.end - 1, 5).end;
    let mut faults = RegionFaults::new(31);
    let mut flipped = 0;
    for round in 0..40 {
        // About one flipped bit per four segments' worth of chunks, per round: now and then
        // three land in one segment, beyond m = 2.
        let rate = 1.0 / (24.0 * 1024.0 * 8.0);
        flipped += faults.decay(log.region_mut(), first..last, rate).unwrap().len();
        let (ok, failed) = read_all_never_wrong(&mut log, &model);
        assert_eq!(ok + failed, model.records.len(), "round {round}");
        log.scrub().unwrap();
    }
    let s = log.stats();
    eprintln!(
        "bit flips: {flipped} flipped over 40 rounds; {} data and {} parity chunks repaired, {} garbage ranges zeroed, {} chunks unrecoverable",
        s.repaired_data_chunks, s.repaired_parity_chunks, s.zeroed_garbage, s.unrecoverable_chunks
    );
    assert!(flipped > 40);
    if s.unrecoverable_chunks == 0 {
        check_all(&mut log, &model);
    }
}

#[test]
fn repairs_name_the_modules_whose_records_were_hit() {
    let (mut log, model) = filled(1, 1024);
    let seg = log.live_segments().start;
    let r = log.chunk_range(seg, 1);
    let mut faults = RegionFaults::new(3);
    faults.wild_write_at(log.region_mut(), r.start, r.len()).unwrap();
    let report = log.scrub().unwrap();
    let repair = report.repairs.iter().find(|r| r.cause == Cause::DataChunk).expect("a data repair");
    let seg_data = log.config().segment_data();
    let mut want: Vec<u16> = model
        .records
        .iter()
        .filter(|(id, _, _)| id.0 / seg_data == seg && (id.0 % seg_data) / 1024 == 1)
        .map(|(_, tag, _)| *tag)
        .collect();
    let mut got = repair.tags.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want);
}

#[test]
fn damaged_superblock_headers_and_head_are_repaired() {
    let (log, model) = filled(2, 512);
    let head = log.head();
    let live = log.live_segments();
    let sealed = live.start + 1;
    let [ha, hb] = log.header_ranges(sealed);
    let mut region = log.into_region();
    let mut faults = RegionFaults::new(1);
    // One superblock copy, one header copy of a sealed segment, the live segment's header A.
    faults.wild_write_at(&mut region, 10, 30).unwrap();
    faults.wild_write_at(&mut region, ha.start + 20, 8).unwrap();
    let (mut log, rec) = NvLog::open(region).unwrap();
    assert_eq!(rec.superblock_repaired, 1, "{rec}");
    assert!(rec.headers_repaired >= 1, "{rec}");
    assert_eq!(log.head(), head);
    check_all(&mut log, &model);

    // Both copies of a sealed segment's header: rebuilt from the segment's bytes.
    let mut region = log.into_region();
    faults.wild_write_at(&mut region, ha.start, ha.len()).unwrap();
    faults.wild_write_at(&mut region, hb.start, hb.len()).unwrap();
    let (mut log, rec) = NvLog::open(region).unwrap();
    assert_eq!(rec.headers_rebuilt, 1, "{rec}");
    check_all(&mut log, &model);

    // A header copy damaged while running: the cheap scrub pass rewrites it.
    let [a2, _] = log.header_ranges(sealed);
    faults.wild_write_at(log.region_mut(), a2.start + 30, 4).unwrap();
    let report = log.scrub_cheap().unwrap();
    assert_eq!(report.count(Cause::SegmentHeader), 1, "{report}");

    // Two of the three superblock copies, and the head slots' page: the third copy and the
    // head slots' copies in the first two pages keep the log whole, and are copied back.
    let mut region = log.into_region();
    zero(&mut region, 8192, 4096);
    faults.wild_write_at(&mut region, 4096, 4096).unwrap();
    let (mut log, rec) = NvLog::open(region).unwrap();
    assert_eq!(rec.superblock_repaired, 2, "{rec}");
    assert!(rec.head_from_slot, "{rec}");
    assert_eq!(log.head(), head);
    check_all(&mut log, &model);

    // All three copies: not a log any more, said clearly.
    let mut region = log.into_region();
    for at in [0, 4096, 8192 + 128] {
        faults.wild_write_at(&mut region, at, 128).unwrap();
    }
    assert!(matches!(NvLog::open(region), Err(LogError::NotALog { .. })));
}

/// A small log after a workload that trimmed and wrapped it, and what it holds.
fn worked_small_log() -> (NvLog<RamRegion>, Model) {
    let cfg = small(1);
    let mut log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
    let mut model = Model::default();
    workload(&mut log, &mut model, 8, 0, 200, 60, 30).unwrap();
    (log, model)
}

fn zero(region: &mut RamRegion, at: usize, len: usize) {
    region.update(at, len, &mut |b| b.fill(0)).unwrap();
}

/// Any one of the first three pages lost (a superblock copy and a set of head slots in
/// each), or any two: the log opens with its shape and its head, and copies them back.
#[test]
fn any_two_of_the_first_three_pages_lost_lose_nothing() {
    let (log, model) = worked_small_log();
    let head = log.head();
    let mut region = log.into_region();
    let mut cases = 0;
    for lost in [[0, 0], [1, 1], [2, 2], [0, 1], [0, 2], [1, 2]] {
        let mut r = region.clone();
        for p in lost {
            zero(&mut r, p * 4096, 4096);
        }
        let (mut log, rec) = NvLog::open(r).unwrap();
        assert!(rec.head_from_slot && rec.superblock_repaired >= 1, "pages {lost:?}: {rec}");
        assert_eq!(log.head(), head, "pages {lost:?}");
        check_all(&mut log, &model);
        // Everything lost was written back: each page alone is enough again.
        let mut r = log.into_region();
        for p in [0, 1, 2].into_iter().filter(|p| !lost.contains(p)) {
            zero(&mut r, p * 4096, 4096);
        }
        let (log, rec) = NvLog::open(r).unwrap();
        assert!(rec.head_from_slot, "pages {lost:?}, then the others: {rec}");
        assert_eq!(log.head(), head);
        cases += 1;
    }
    assert_eq!(cases, 6);
    zero(&mut region, 0, 3 * 4096);
    assert!(matches!(NvLog::open(region), Err(LogError::NotALog { .. })));
}

#[test]
fn a_lost_head_slot_resets_the_head_to_the_oldest_segment() {
    let (log, model) = worked_small_log();
    let head = log.head();
    let mut region = log.into_region();
    let mut faults = RegionFaults::new(2);
    // Every copy of both slots (version 2 keeps one set in each of the first three pages).
    for at in [8192, 128, 4096 + 128] {
        faults.wild_write_at(&mut region, at, 128).unwrap();
    }
    let (mut log, rec) = NvLog::open(region).unwrap();
    assert!(!rec.head_from_slot, "{rec}");
    assert!(log.head() <= head, "the head may only move back: records are never lost");
    check_all(&mut log, &model);
}

/// Any one 4 KiB page lost, whichever it is, costs a log with m = 1 nothing: its chunks are
/// whole pages on pages of their own, so that a page never holds parts of two chunks of a
/// segment (before the paged layout, a page across a chunk boundary cost two).
#[test]
fn any_one_page_lost_loses_no_record_with_m_1() {
    let cfg = LogConfig { k: 4, m: 1, chunk_size: 8192, block_size: 64, segments: 5 };
    let mut log = NvLog::format(RamRegion::new(cfg.region_len()), cfg).unwrap();
    let mut model = Model::default();
    // Wrapped, trimmed, and with the live chunk part written: live records in sealed
    // segments and in the live one.
    workload(&mut log, &mut model, 11, 0, 700, 400, 150).unwrap();
    let (head, tail) = (log.head(), log.tail());
    let region = log.into_region();
    let pages = region.len() / 4096;
    let mut live_checked = 0;
    for p in 0..pages {
        let mut r = region.clone();
        zero(&mut r, p * 4096, 4096);
        let (mut log, rec) = NvLog::open(r).unwrap_or_else(|e| panic!("page {p}: {e}"));
        assert!(rec.unrecoverable.is_empty(), "page {p}: {rec}");
        assert_eq!((log.head(), log.tail()), (head, tail), "page {p}: {rec}");
        live_checked += check_all(&mut log, &model);
        assert!(log.scrub().unwrap().unrecoverable.is_empty(), "page {p}");
        log.append(1, b"after").unwrap();
    }
    assert_eq!(pages, 3 + 5 * 11 + 1);
    assert!(live_checked > pages * 100, "{live_checked} live records read back");
}
