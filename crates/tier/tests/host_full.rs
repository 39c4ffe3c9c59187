//! The tier over a thin image whose host fills (the chip has room, the disk under it does
//! not): writes go into the tier until write-back needs the host's room and is refused
//! (ENOSPC); a crash then leaves the acknowledged writes in the tier. A mount while the host
//! is still full keeps them there (its checkpoint is refused as a full chip's is) and serves
//! them; once the host has room, a mount recovers them to flash. Every acknowledged byte is
//! checked after each crash. Root only (a tmpfs of 3 MiB is mounted under the image).

use bitmend_flashfs::{Compression, Fs, FsConfig, FsError, FsOptions, ROOT};
use bitmend_media::nand::{FileNand, Geometry, NandError};
use bitmend_media::pmem::RamRegion;
use bitmend_media::rng::Rng;
use bitmend_media::small_host::SmallHost;
use bitmend_tier::{crash, mount, DirtyTier};

fn opts() -> FsOptions {
    FsOptions { compression: Compression::None, dirty_limit: 256 << 10, ..FsOptions::default() }
}

fn piece(seed: u64) -> Vec<u8> {
    let mut p = vec![0u8; 64 << 10];
    Rng::new(seed).fill(&mut p);
    p
}

fn check(fs: &mut Fs<FileNand>, acked: u64, when: &str) {
    let f = fs.lookup(ROOT, b"f").unwrap();
    assert_eq!(f.size, acked * (64 << 10), "{when}: the size is what was acknowledged");
    for i in 0..acked {
        let back = fs.read(f.ino, i * (64 << 10), 64 << 10).unwrap();
        assert!(back == piece(i), "{when}: piece {i} of {acked} reads back different bytes");
    }
}

#[test]
fn acknowledged_writes_wait_in_the_tier_while_the_host_is_full_and_reach_flash_once_it_is_not() {
    let Some(host) = SmallHost::or_skip("tier-host-full", 3) else { return };
    // 16 MiB of chip on 3 MiB of host; a tier of 16 MiB of slots in RAM.
    let g = Geometry::new(2048, 64, 64, 128).unwrap();
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 };
    let fs = Fs::format(FileNand::create_thin(host.path("chip.img"), g).unwrap(), cfg, opts()).unwrap();
    let id = fs.store().fs_id();
    let nand = fs.unmount().unwrap();
    let tier = DirtyTier::create_for(RamRegion::new(1 << 20), RamRegion::new(16 << 20), id).unwrap();
    let (log, heap) = tier.into_regions();
    let (mut fs, _, _) = mount(nand, opts(), log, heap).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut acked = 0u64;
    let refused = loop {
        match fs.write(f, acked * (64 << 10), &piece(acked)) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 200, "3 MiB of host took {acked} pieces of 64 KiB");
    };
    assert!(matches!(refused, FsError::Nand(NandError::HostSpace { .. })), "{refused}");
    assert_eq!(refused.errno(), 28, "ENOSPC");
    assert!(acked >= 16, "{acked} pieces before the host was full");

    // A crash; the host still full: the mount keeps the state in the tier and serves it.
    let (nand, regions) = crash::<FileNand, RamRegion, RamRegion>(fs);
    let (log, heap) = regions.unwrap();
    let (mut fs, _, report) = mount(nand, opts(), log, heap).unwrap();
    assert!(!report.lost_anything(), "{report:?}");
    assert!(report.still_in_tier, "the host is full: the state stays in the tier ({report:?})");
    check(&mut fs, acked, "host full");

    // Another crash, then room: the mount recovers everything to flash and checks it out.
    let (nand, regions) = crash::<FileNand, RamRegion, RamRegion>(fs);
    let (log, heap) = regions.unwrap();
    host.grow(64);
    let (mut fs, _, report) = mount(nand, opts(), log, heap).unwrap();
    assert!(!report.lost_anything() && !report.still_in_tier, "{report:?}");
    check(&mut fs, acked, "host grown");
    let clean = fs.check(true);
    assert!(clean.clean(), "{:?}", clean.problems);
    // Everything is on flash now: without the tier, the image alone holds it.
    let nand = fs.unmount().unwrap();
    let (mut fs, _) = Fs::open(nand, opts()).unwrap();
    check(&mut fs, acked, "flash alone");
    eprintln!("tier over a full host: {acked} pieces of 64 KiB acknowledged, all back after two crashes");
}
