//! Appending, reading, replaying, trimming, reopening.

mod common;

use bitmend_media::pmem::{MmapRegion, RamRegion, Region};
use bitmend_nvlog::{LogConfig, LogError, NvLog, RecordId, RECORD_HEADER};
use common::*;

#[test]
fn records_read_back_across_chunks_and_segments() {
    for m in [0, 1, 2, 4] {
        let cfg = small(m);
        let mut log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
        let mut model = Model::default();
        workload(&mut log, &mut model, 1, 0, 120, 100, 1000).unwrap();
        assert!(log.tail().0 > 2 * cfg.segment_data(), "the workload spans several segments");
        assert_eq!(check_all(&mut log, &model), 120, "m={m}");
        assert_eq!(log.stats().appends, 120);
        assert_eq!(log.stats().repaired_data_chunks, 0);
    }
}

#[test]
fn ids_increase_and_bad_ids_are_refused() {
    let cfg = small(2);
    let mut log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
    let a = log.append(1, b"first").unwrap();
    let b = log.append(2, b"second").unwrap();
    assert!(b > a);
    assert!(matches!(log.read(RecordId(a.0 + 1)), Err(LogError::NoSuchRecord { .. })));
    assert!(matches!(log.read(log.tail()), Err(LogError::NoSuchRecord { .. })));
    assert!(matches!(log.read(RecordId(u64::MAX)), Err(LogError::NoSuchRecord { .. })));
    let max = log.max_record();
    assert_eq!(max, 512 - RECORD_HEADER);
    log.append(3, &vec![9; max]).unwrap();
    assert!(matches!(log.append(3, &vec![9; max + 1]), Err(LogError::RecordTooLarge { .. })));
    log.append(4, b"").unwrap();
    assert_eq!(log.records().unwrap().len(), 4);
}

#[test]
fn the_ring_fills_and_trimming_makes_room() {
    let cfg = small(1);
    let mut log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
    let mut model = Model::default();
    let mut i = 0;
    let err = loop {
        let (tag, data) = payload(5, i, 200);
        match log.append(tag, &data) {
            Ok(id) => model.records.push((id, tag, data)),
            Err(e) => break e,
        }
        i += 1;
    };
    assert!(matches!(err, LogError::Full { .. }), "{err}");
    assert!(log.tail().0 >= 5 * cfg.segment_data(), "five of six segments filled before Full");
    check_all(&mut log, &model);
    // Trim three quarters; the ring accepts more; trimmed records are gone.
    let cut = model.records[model.records.len() * 3 / 4].0;
    log.trim(cut).unwrap();
    assert!(matches!(log.read(model.records[0].0), Err(LogError::Trimmed { .. })));
    workload(&mut log, &mut model, 5, i + 1, i + 25, 200, 10_000).unwrap();
    check_all(&mut log, &model);
    assert!(matches!(log.trim(RecordId(0)), Err(LogError::TrimRange { .. })));
    assert!(matches!(log.trim(RecordId(log.tail().0 + 1)), Err(LogError::TrimRange { .. })));
}

#[test]
fn a_long_run_wraps_the_ring_many_times() {
    let cfg = small(2);
    let mut log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
    let mut model = Model::default();
    workload(&mut log, &mut model, 9, 0, 3000, 100, 40).unwrap();
    assert!(log.tail().0 > 20 * cfg.segment_data(), "wrapped the 6-segment ring several times");
    assert_eq!(check_all(&mut log, &model), model.live_from(log.head()).len());
}

#[test]
fn reopen_after_a_clean_close_finds_everything() {
    let cfg = small(2);
    let mut log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
    let mut model = Model::default();
    workload(&mut log, &mut model, 3, 0, 400, 90, 60).unwrap();
    let (head, tail) = (log.head(), log.tail());
    let (mut log, rec) = NvLog::open(log.into_region()).unwrap();
    assert_eq!((rec.head, rec.tail), (head, tail), "{rec}");
    assert_eq!(rec.torn_bytes_discarded, 0);
    assert_eq!(rec.parity_chunks_rewritten, 0);
    assert!(rec.repairs.is_empty() && rec.unrecoverable.is_empty(), "{rec}");
    check_all(&mut log, &model);
    // And it goes on appending where it stopped.
    workload(&mut log, &mut model, 3, 400, 500, 90, 60).unwrap();
    check_all(&mut log, &model);
}

#[test]
fn an_empty_log_reopens_empty() {
    let cfg = small(1);
    let log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
    let (mut log, rec) = NvLog::open(log.into_region()).unwrap();
    assert_eq!(rec.live_segment, None);
    assert!(log.records().unwrap().is_empty());
    log.append(1, b"x").unwrap();
}

#[test]
fn a_file_backed_log_survives_the_process() {
    let dir = std::env::temp_dir().join(format!("bitmend-nvlog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("log.pmem");
    let _ = std::fs::remove_file(&path);
    let cfg = LogConfig::new(4, 2, 1024);
    let mut model = Model::default();
    {
        let region = MmapRegion::create(&path, 1 << 20).unwrap();
        let mut log = NvLog::format(region, cfg).unwrap();
        workload(&mut log, &mut model, 11, 0, 300, 200, 10_000).unwrap();
    }
    let (mut log, rec) = NvLog::open(MmapRegion::open(&path).unwrap()).unwrap();
    assert!(rec.repairs.is_empty(), "{rec}");
    assert_eq!(check_all(&mut log, &model), 300);
    drop(log);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn not_a_log_and_too_small_are_clear_errors() {
    assert!(matches!(NvLog::open(RamRegion::new(1 << 16)), Err(LogError::NotALog { .. })));
    assert!(matches!(NvLog::open(RamRegion::new(100)), Err(LogError::NotALog { .. })));
    let cfg = small(1);
    assert!(matches!(NvLog::format(RamRegion::new(20_000), cfg), Err(LogError::RegionTooSmall { .. })));
    let log = NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap();
    let mut bytes = log.into_region().bytes().to_vec();
    bytes.truncate(region_len(cfg) - 1);
    assert!(matches!(NvLog::open(RamRegion::from_bytes(bytes)), Err(LogError::RegionTooSmall { .. })));
}
