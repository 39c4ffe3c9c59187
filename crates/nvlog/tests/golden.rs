//! The checked-in golden log (docs/FORMAT.md, "PRIMS log"): a layout change breaks this test.

use bitmend_media::pmem::{RamRegion, Region};
use bitmend_nvlog::{LogConfig, NvLog, RecordId};

fn golden_path(version: u32) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/nvlog-v{version}.bin"))
}

const CFG: LogConfig = LogConfig { k: 2, m: 1, chunk_size: 256, block_size: 8, segments: 3 };

/// Version 1: two superblock copies, one set of head slots.
#[test]
fn golden_log_v1_reads_back() {
    let bytes = std::fs::read(golden_path(1)).unwrap();
    assert_eq!(&bytes[8..12], &1u32.to_le_bytes());
    assert!(bytes[128..4096].iter().all(|&b| b == 0) && bytes[8192 + 128..12288].iter().all(|&b| b == 0));
    reads_back(bytes);
}

/// Version 2: a third superblock copy after the head slots, the head slots copied after the
/// superblock in the first two pages.
#[test]
fn golden_log_v2_reads_back() {
    let bytes = std::fs::read(golden_path(2)).unwrap();
    assert_eq!(&bytes[8..12], &2u32.to_le_bytes());
    assert_eq!(bytes[..128], bytes[8192 + 128..8192 + 256], "the third superblock copy");
    for page in [0, 4096] {
        assert_eq!(bytes[page + 128..page + 256], bytes[8192..8192 + 128], "head slots copied at {page}");
    }
    reads_back(bytes);
}

fn reads_back(bytes: Vec<u8>) {
    assert_eq!(bytes.len(), 12288 + 3 * (2 * 64 + 3 * 256));
    // Byte-level spot checks of the layout.
    assert_eq!(&bytes[0..8], b"BMNVLOG\0");
    assert_eq!(bytes[..128], bytes[4096..4224], "superblock copies are identical");
    let first_record = 12288 + 64; // segment 0, header A, then data chunk 0
    assert_eq!(&bytes[first_record + 4..first_record + 8], &(5u32 | 1 << 31).to_le_bytes());
    assert_eq!(&bytes[first_record + 12..first_record + 17], b"alpha");
    let (mut log, rec) = NvLog::open(RamRegion::from_bytes(bytes)).unwrap();
    assert!(rec.repairs.is_empty() && rec.torn_bytes_discarded == 0, "{rec}");
    assert_eq!(log.config(), CFG);
    let all = log.records().unwrap();
    let got: Vec<(u64, u16, Vec<u8>)> = all.into_iter().map(|r| (r.id.0, r.tag, r.data)).collect();
    assert_eq!(
        got,
        vec![(0, 1, b"alpha".to_vec()), (24, 2, vec![0xAB; 200]), (256, 3, b"gamma: chunk 1".to_vec())]
    );
    assert_eq!(log.tail(), RecordId(256 + 32));
    // The scrubber finds the checked-in image consistent, parity and signatures included.
    assert!(log.scrub().unwrap().repairs.is_empty());
}

/// Rewrites the golden log (run with `--ignored` after a deliberate format change, then bump
/// the log version).
#[test]
#[ignore]
fn write_golden_log() {
    let len = 12288 + 3 * (2 * 64 + 3 * 256);
    let mut log = NvLog::format(RamRegion::new(len), CFG).unwrap();
    log.append(1, b"alpha").unwrap();
    log.append(2, &[0xAB; 200]).unwrap();
    log.append(3, b"gamma: chunk 1").unwrap();
    std::fs::write(golden_path(bitmend_nvlog::LOG_VERSION), log.region().bytes()).unwrap();
}
