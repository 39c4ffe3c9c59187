//! Shared workload and model for the log's tests.
#![allow(dead_code)]

use bitmend_media::pmem::Region;
use bitmend_media::rng::Rng;
use bitmend_nvlog::{LogConfig, LogError, NvLog, RecordId};

/// A small shape that crosses chunk and segment boundaries quickly: 4 + m chunks of 512 B.
pub fn small(m: usize) -> LogConfig {
    LogConfig { k: 4, m, chunk_size: 512, block_size: 8, segments: 6 }
}

/// A region size that holds `cfg` exactly (segments included).
pub fn region_len(cfg: LogConfig) -> usize {
    cfg.region_len()
}

/// The payload of the i-th record of stream `seed`: 0..=max bytes, all derived from i.
pub fn payload(seed: u64, i: u64, max: usize) -> (u16, Vec<u8>) {
    let mut r = Rng::new(seed.wrapping_mul(1_000_003) ^ i);
    let len = r.below(max as u64 + 1) as usize;
    let mut v = vec![0u8; len];
    r.fill(&mut v);
    ((i % 7) as u16 + 1, v)
}

/// What the log should hold: acknowledged records in order.
#[derive(Default, Clone, Debug)]
pub struct Model {
    pub records: Vec<(RecordId, u16, Vec<u8>)>,
}

impl Model {
    pub fn live_from(&self, head: RecordId) -> Vec<(RecordId, u16, Vec<u8>)> {
        self.records.iter().filter(|r| r.0 >= head).cloned().collect()
    }
}

/// Appends records `from..to` of stream `seed`, trimming to keep about `keep` records live;
/// stops at the first error, returning it (the model holds what was acknowledged).
pub fn workload<R: Region>(
    log: &mut NvLog<R>,
    model: &mut Model,
    seed: u64,
    from: u64,
    to: u64,
    max: usize,
    keep: usize,
) -> Result<(), LogError> {
    for i in from..to {
        let (tag, data) = payload(seed, i, max);
        let id = log.append(tag, &data)?;
        model.records.push((id, tag, data));
        if model.records.len() > keep && i % 16 == 0 {
            let to = model.records[model.records.len() - keep].0;
            log.trim(to)?;
        }
    }
    Ok(())
}

/// Every record the model holds from the log's head on reads back exactly, one by one and
/// by replay; returns how many.
pub fn check_all<R: Region>(log: &mut NvLog<R>, model: &Model) -> usize {
    let live = model.live_from(log.head());
    for (id, tag, data) in &live {
        let r = log.read(*id).unwrap_or_else(|e| panic!("record {id}: {e}"));
        assert_eq!((r.tag, &r.data), (*tag, data), "record {id}");
    }
    let replayed = log.records().unwrap();
    assert_eq!(replayed.len(), live.len(), "replay count");
    for (r, (id, tag, data)) in replayed.iter().zip(&live) {
        assert_eq!((r.id, r.tag, &r.data), (*id, *tag, data));
    }
    live.len()
}
