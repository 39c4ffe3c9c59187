//! The checked-in golden log (docs/FORMAT.md, "PRIMS log"): a layout change breaks this test.

use bitmend_media::pmem::{RamRegion, Region};
use bitmend_nvlog::{LogConfig, NvLog, RecordId};

fn golden_path(version: u32) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/nvlog-v{version}.bin"))
}

/// The shape of the version 1 and 2 images: small chunks, packed between 64-byte headers.
const CFG: LogConfig = LogConfig { k: 2, m: 1, chunk_size: 256, block_size: 8, segments: 3 };
/// The shape of the version 3 image: chunks of a page, each on pages of its own.
const CFG_PAGED: LogConfig = LogConfig { chunk_size: 4096, ..CFG };
/// A record that fills the version 3 image's chunk 0 from byte 240 to its end.
const FILLER: usize = 4096 - 240 - 12;

/// Version 1: two superblock copies, one set of head slots.
#[test]
fn golden_log_v1_reads_back() {
    let bytes = std::fs::read(golden_path(1)).unwrap();
    assert_eq!(&bytes[8..12], &1u32.to_le_bytes());
    assert!(bytes[128..4096].iter().all(|&b| b == 0) && bytes[8192 + 128..12288].iter().all(|&b| b == 0));
    reads_back(bytes, CFG);
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
    reads_back(bytes, CFG);
}

/// Version 3: page-sized chunks on pages of their own; a segment's header copy A starts the
/// page before its chunks, copy B ends the page after them (which the next segment's copy A
/// starts).
#[test]
fn golden_log_v3_reads_back() {
    let bytes = std::fs::read(golden_path(3)).unwrap();
    assert_eq!(&bytes[8..12], &3u32.to_le_bytes());
    let stride = 4096 + 3 * 4096;
    for seg in 0..3 {
        let (a, b) = (12288 + seg * stride, 12288 + (seg + 1) * stride + 4096 - 64);
        assert_eq!(bytes[a..a + 64], bytes[b..b + 64], "segment {seg}'s header copies");
    }
    reads_back(bytes, CFG_PAGED);
}

fn reads_back(bytes: Vec<u8>, cfg: LogConfig) {
    assert_eq!(bytes.len(), cfg.region_len());
    // Byte-level spot checks of the layout.
    assert_eq!(&bytes[0..8], b"BMNVLOG\0");
    assert_eq!(bytes[..128], bytes[4096..4224], "superblock copies are identical");
    let chunk = cfg.chunk_size as u64;
    // Segment 0's data chunk 0, after its header copy A (a page of its own when paged).
    let first_record = 12288 + if chunk == 4096 { 4096 } else { 64 };
    assert_eq!(&bytes[first_record + 4..first_record + 8], &(5u32 | 1 << 31).to_le_bytes());
    assert_eq!(&bytes[first_record + 12..first_record + 17], b"alpha");
    let (mut log, rec) = NvLog::open(RamRegion::from_bytes(bytes)).unwrap();
    assert!(rec.repairs.is_empty() && rec.torn_bytes_discarded == 0, "{rec}");
    assert_eq!(log.config(), cfg);
    let all = log.records().unwrap();
    let got: Vec<(u64, u16, Vec<u8>)> = all.into_iter().map(|r| (r.id.0, r.tag, r.data)).collect();
    let mut want = vec![(0, 1, b"alpha".to_vec()), (24, 2, vec![0xAB; 200])];
    if chunk == 4096 {
        want.push((240, 4, vec![0xCD; FILLER]));
    }
    want.push((chunk, 3, b"gamma: chunk 1".to_vec()));
    assert_eq!(got, want);
    assert_eq!(log.tail(), RecordId(chunk + 32));
    // The scrubber finds the checked-in image consistent, parity and signatures included.
    assert!(log.scrub().unwrap().repairs.is_empty());
}

/// Rewrites the golden log (run with `--ignored` after a deliberate format change, then bump
/// the log version).
#[test]
#[ignore]
fn write_golden_log() {
    let mut log = NvLog::format(RamRegion::new(CFG_PAGED.region_len()), CFG_PAGED).unwrap();
    log.append(1, b"alpha").unwrap();
    log.append(2, &[0xAB; 200]).unwrap();
    // The rest of chunk 0 filled (a record ends it), so that the next goes to chunk 1.
    log.append(4, &[0xCD; FILLER]).unwrap();
    log.append(3, b"gamma: chunk 1").unwrap();
    std::fs::write(golden_path(bitmend_nvlog::LOG_VERSION), log.region().bytes()).unwrap();
}
