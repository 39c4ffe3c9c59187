//! A thin image whose host fills: the chip has room, the disk under it does not. A block's
//! first program asks the host for its space and is refused. Nothing acknowledged may be
//! lost: the write that cannot be stored gets an error naming the host, what was
//! acknowledged before stays (on flash or dirty in RAM), and once the host has room again
//! a sync stores it all, and it reads back, exact, after a remount.
//!
//! The host is a tmpfs of 3 MiB under a 16 MiB image, mounted by the test (root only; it
//! says so and skips elsewhere, unless BITMEND_REQUIRE_FUSE asks for every mount test).

use std::path::Path;

use bitmend_flashfs::{Compression, Fs, FsConfig, FsError, FsOptions, Ino, ROOT};
use bitmend_media::nand::{FileNand, Geometry, NandError};
use bitmend_media::rng::Rng;
use bitmend_media::small_host::SmallHost;

fn opts() -> FsOptions {
    // Written back every 64 KiB, as most tests do: the host fills during a write, not a sync.
    FsOptions { compression: Compression::None, dirty_limit: 64 << 10, ..FsOptions::default() }
}

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

fn read_all(fs: &mut Fs<FileNand>, acked: &[(Ino, u64, Vec<u8>)], when: &str) {
    for (ino, off, data) in acked {
        let back =
            fs.read(*ino, *off, data.len()).unwrap_or_else(|e| panic!("{when}: read {ino:?}@{off}: {e}"));
        assert!(back == *data, "{when}: file {ino:?} at {off} reads back different bytes");
    }
}

#[test]
fn a_full_host_refuses_the_write_it_cannot_store_and_loses_nothing_acknowledged() {
    let Some(host) = SmallHost::or_skip("host-full", 3) else { return };
    let image: &Path = &host.path("chip.img");
    // 16 MiB of chip on 3 MiB of host.
    let g = Geometry::new(2048, 64, 64, 128).unwrap();
    let nand = FileNand::create_thin(image, g).unwrap();
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 };
    let mut fs = Fs::format(nand, cfg, opts()).unwrap();

    // Files of 256 KiB in writes of 64 KiB, until the host refuses one.
    let mut acked: Vec<(Ino, u64, Vec<u8>)> = Vec::new();
    let mut refused = None;
    'files: for file in 0..40u64 {
        let name = format!("f{file}");
        let ino = match fs.create(ROOT, name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => a.ino,
            Err(e) => {
                refused = Some(e);
                break;
            }
        };
        for part in 0..4u64 {
            let data = noise(file * 4 + part, 64 << 10);
            match fs.write(ino, part * (64 << 10), &data) {
                Ok(n) => {
                    assert_eq!(n, data.len());
                    acked.push((ino, part * (64 << 10), data));
                }
                Err(e) => {
                    refused = Some(e);
                    break 'files;
                }
            }
        }
    }
    let refused = refused.expect("3 MiB of host cannot hold 10 MiB of data");
    let what = refused.to_string();
    assert!(
        matches!(refused, FsError::Nand(NandError::HostSpace { .. })) && refused.errno() == libc::ENOSPC,
        "the refusal is the host's ENOSPC: {what}"
    );
    let acked_bytes: usize = acked.iter().map(|a| a.2.len()).sum();
    assert!(acked_bytes >= 1 << 20, "about 2 MiB went in before the host filled ({acked_bytes} bytes)");
    // While the host stays full: a sync fails as clearly, and every acknowledged byte
    // still reads (from flash, or dirty in RAM).
    let again = fs.sync().expect_err("the host is still full");
    assert!(matches!(again, FsError::Nand(NandError::HostSpace { .. })), "{again}");
    read_all(&mut fs, &acked, "host full");

    // Room again: everything acknowledged is stored, checks clean, survives a remount.
    host.grow(64);
    fs.sync().expect("a sync once the host has room");
    read_all(&mut fs, &acked, "after the sync");
    let report = fs.check(true);
    assert!(report.clean(), "check after the host filled: {:?}", report.problems);
    let nand = fs.unmount().unwrap();
    let (mut fs, _) = Fs::open(nand, opts()).unwrap();
    read_all(&mut fs, &acked, "after a remount");
    eprintln!(
        "host full: {} writes of 64 KiB acknowledged, the next refused ({what}); all {} bytes back after the host grew",
        acked.len(),
        acked_bytes
    );
}
