//! The PRIMS log: superblocks, head slots, segment headers, records, parity.

use std::sync::OnceLock;

use bitmend_media::pmem::{RamRegion, Region};
use bitmend_nvlog::{LogConfig, NvLog};

use crate::patches::apply;

/// A log that has wrapped and trimmed, its live chunk part written: every structure in use.
fn base() -> &'static Vec<u8> {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        let cfg = LogConfig { k: 4, m: 1, chunk_size: 4096, block_size: 64, segments: 5 };
        let mut log = NvLog::format(RamRegion::new(cfg.region_len()), cfg).expect("a log");
        for i in 0..400u32 {
            let len = (i as usize * 37) % 700;
            let id = log.append((i % 5) as u16 + 1, &vec![i as u8; len]).expect("an append");
            if i % 20 == 19 {
                log.trim(bitmend_nvlog::RecordId(id.0.saturating_sub(6000).max(log.head().0)))
                    .expect("a trim");
            }
        }
        log.into_region().bytes().to_vec()
    })
}

/// Opens the damaged log, replays it, scrubs it, appends, and opens it again; whether it
/// opened.
pub fn log_image(data: &[u8]) -> bool {
    let mut bytes = base().clone();
    let len = bytes.len() as u64;
    apply(data, len, |at, b| bytes[at as usize..at as usize + b.len()].copy_from_slice(b));
    let Ok((mut log, _)) = NvLog::open(RamRegion::from_bytes(bytes)) else { return false };
    let _ = log.records();
    let _ = log.scrub();
    if log.append(7, b"after the damage").is_ok() {
        let _ = NvLog::open(log.into_region()).map(|(mut log, _)| log.records());
    }
    true
}
