//! The background scrubber repairs damage while appends go on.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bitmend_media::pmem::{RamRegion, RegionFaults};
use bitmend_media::rng::Rng;
use bitmend_nvlog::{Cause, LogConfig, NvLog, Scrubber};
use common::*;

#[test]
fn the_scrubber_finds_and_repairs_damage_nobody_reads() {
    let cfg = LogConfig { k: 4, m: 2, chunk_size: 1024, block_size: 8, segments: 12 };
    let log = Arc::new(Mutex::new(NvLog::format(RamRegion::new(region_len(cfg)), cfg).unwrap()));
    let scrubber = Scrubber::spawn(log.clone(), 50 << 20);
    let mut model = Model::default();
    let mut faults = RegionFaults::new(9);
    let mut rng = Rng::new(4);
    let mut injected = 0;
    let mut hit = std::collections::BTreeSet::new();
    for i in 0..1500u64 {
        {
            let mut l = log.lock().unwrap();
            let (tag, data) = payload(6, i, 200);
            model.records.push((l.append(tag, &data).unwrap(), tag, data));
            if model.records.len() > 200 && i % 16 == 0 {
                let to = model.records[model.records.len() - 200].0;
                l.trim(to).unwrap();
            }
            // Now and then a wild write into one chunk of a sealed segment.
            if i % 100 == 50 {
                let live = l.live_segments();
                if live.end - live.start >= 2 {
                    let seg = live.start + rng.below(live.end - live.start - 1);
                    let chunk = rng.below(6) as usize;
                    hit.insert((seg, chunk));
                    let r = l.chunk_range(seg, chunk);
                    let at = r.start + rng.below(r.len() as u64 - 16) as usize;
                    faults.wild_write_at(l.region_mut(), at, 16).unwrap();
                    injected += 1;
                }
            }
        }
        if i % 10 == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // Three more, into distinct chunks of segments that stay live: the scrubber must find them.
    let late: Vec<(u64, usize)> = {
        let mut l = log.lock().unwrap();
        let live = l.live_segments();
        let v: Vec<(u64, usize)> = (0..3).map(|j| (live.start + j, j as usize + 1)).collect();
        for &(seg, chunk) in &v {
            let r = l.chunk_range(seg, chunk);
            faults.wild_write_at(l.region_mut(), r.start + 100, 64).unwrap();
            hit.insert((seg, chunk));
            injected += 1;
        }
        v
    };
    // Give the scrubber time to sweep everything at least once after the last fault.
    let deadline = Instant::now() + Duration::from_secs(20);
    let start_passes = scrubber.totals().passes;
    while scrubber.totals().passes < start_passes + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let totals = scrubber.stop();
    assert!(totals.errors.is_empty(), "{:?}", totals.errors);
    assert!(totals.passes >= 2, "the scrubber swept the log");
    let repaired = totals.report.count(Cause::DataChunk) + totals.report.count(Cause::ParityChunk);
    let mut l = log.lock().unwrap();
    // Every damaged chunk still live was repaired by the scrubber before any read; damage in
    // segments trimmed since may have been repaired first or vanished with the segment.
    let live = l.live_segments();
    let still_live = hit.iter().filter(|(s, _)| live.contains(s)).count();
    assert!(still_live >= late.len());
    assert!(
        repaired >= still_live && repaired <= hit.len(),
        "{repaired} repairs; {} chunks hit, {still_live} still live",
        hit.len()
    );
    let stats = l.stats();
    assert_eq!(stats.reads, 0, "nothing was read: the scrubber found the damage itself");
    check_all(&mut l, &model);
    assert_eq!(l.scrub().unwrap().repairs.len(), 0, "nothing left to repair");
    eprintln!(
        "background scrubber: {} passes, {} segments, {injected} wild writes injected, {} chunks hit, {repaired} repaired, {still_live} of them in segments still live at the end; 1500 appends alongside",
        totals.passes, totals.report.segments_checked, hit.len()
    );
}
