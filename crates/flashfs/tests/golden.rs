//! The checked-in golden flash image (docs/FORMAT.md, section 7): a layout change breaks it.

use bitmend_flashfs::{FsConfig, Kind, PageAddr, PageStore, Repaired, Spare};
use bitmend_media::nand::{FileNand, Geometry, Nand, RawAccess};

fn golden() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/store-v1.img")
}

fn data(i: u32) -> Vec<u8> {
    (0..512u32).map(|b| (b * 31 + i * 7) as u8).collect()
}

fn temp(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("bitmend-flash-golden-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn golden_store_reads_back() {
    let path = temp("read.img");
    std::fs::copy(golden(), &path).unwrap();
    let mut nand = FileNand::open(&path).unwrap();
    assert_eq!(nand.geometry(), Geometry::new(512, 48, 16, 12).unwrap());
    // Byte-level spot checks: superblock magic, and the spare of the first data page.
    let mut raw = vec![0u8; 560];
    nand.raw_read(0, &mut raw).unwrap();
    assert_eq!(&raw[..8], b"BMFLASH\0");
    nand.raw_read(32, &mut raw).unwrap(); // block 2, page 0: segment 0's first page
    let s = Spare::decode(&raw[512..], 32).unwrap();
    assert_eq!((s.kind, s.group_first, s.segment), (Kind::Data, 0, 0));
    assert_eq!(raw[..512], data(0)[..]);
    let (mut store, m) = PageStore::open(nand).unwrap();
    assert_eq!(m.live_segment, Some(0));
    assert_eq!(store.layout_config(), FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 });
    // Syncs every 7 pages: groups of 7 data pages and their parity page, 8 pages per group.
    let mut buf = vec![0u8; 512];
    for i in 0..40u32 {
        let addr = PageAddr(32 + i / 14 * 16 + (i % 14) / 7 * 8 + i % 7);
        assert_eq!(store.read(addr, &mut buf).unwrap(), Repaired::No, "page {i}");
        assert_eq!(buf, data(i), "page {i}");
    }
    drop(store);
    std::fs::remove_file(&path).unwrap();
}

/// Rewrites the golden image (run with `--ignored` after a deliberate format change, then
/// bump the flash version).
#[test]
#[ignore]
fn write_golden_store() {
    let _ = std::fs::remove_file(golden());
    let nand = FileNand::create(golden(), Geometry::new(512, 48, 16, 12).unwrap()).unwrap();
    let mut store =
        PageStore::format(nand, FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 })
            .unwrap();
    for i in 0..40u32 {
        store.append(&data(i)).unwrap();
        if i % 7 == 6 {
            store.sync().unwrap();
        }
    }
    store.sync().unwrap();
}
