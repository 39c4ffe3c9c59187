//! Fuzzing the on-flash format: pages rewritten with garbage that passes every check the
//! chip's contents get (the spare re-signed over the new bytes, its CRC recomputed), so that
//! the file system trusts them. Mount, every read, fsck, a write and a remount may fail, with
//! an error; none may panic or hang. (`BITMEND_SEEDS` sets the number of images, 300 by
//! default.)

use bitmend_code::sig::Signer;
use bitmend_flashfs::{Compression, FileType, Fs, FsConfig, FsOptions, Spare, ROOT};
use bitmend_media::nand::{Geometry, Nand, RamNand, RawAccess, Timing};
use bitmend_media::rng::Rng;

fn opts() -> FsOptions {
    FsOptions { compression: Compression::Lz4, dirty_limit: 32 << 10, ..FsOptions::default() }
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    let words: [&[u8]; 3] = [b"erase ", b"block ", b"spare "];
    (0..len).map(|i| words[(i / 6 + seed as usize) % 3][i % 6]).collect()
}

/// A small file system with files in two codecs, a directory, links, a checkpoint and nodes
/// after it.
fn base() -> RamNand {
    let g = Geometry::new(2048, 64, 16, 48).unwrap();
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 };
    let mut fs = Fs::format(RamNand::new(g).unwrap().with_timing(Timing::NONE), cfg, opts()).unwrap();
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..6u64 {
        let f =
            fs.create(if i % 2 == 0 { ROOT } else { d }, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.write(f.ino, 0, &content(i, 3_000 + 7_000 * i as usize)).unwrap();
    }
    fs.symlink(ROOT, b"s", b"d/f1", 0, 0).unwrap();
    let f0 = fs.lookup(ROOT, b"f0").unwrap().ino;
    fs.link(f0, d, b"hard").unwrap();
    fs.checkpoint().unwrap();
    let late = fs.create(d, b"late", 0o600, 0, 0).unwrap().ino;
    fs.write(late, 0, &content(9, 12_345)).unwrap();
    fs.sync().unwrap();
    fs.into_nand()
}

/// Rewrites 1..4 written pages with hostile bytes under a valid spare; returns what was done.
fn damage(nand: &mut RamNand, r: &mut Rng) -> String {
    let g = nand.geometry();
    let (ps, ss) = (g.page_size as usize, g.spare_size as usize);
    let signer = Signer::<4>::new();
    let mut done = Vec::new();
    let mut raw = vec![0u8; ps + ss];
    let pages = g.blocks * g.pages_per_block;
    let mut tries = 0;
    let want = 1 + r.below(4) as usize;
    if r.below(5) == 0 {
        done.push(forge_anchor(nand, r));
    }
    while done.len() < want && tries < 10_000 {
        tries += 1;
        let page = r.below(pages as u64) as u32;
        nand.raw_read(page, &mut raw).unwrap();
        let Some(mut spare) = Spare::decode(&raw[ps..], page) else { continue };
        let data = &mut raw[..ps];
        let how = match r.below(4) {
            0 => {
                r.fill(data);
                "random bytes"
            }
            1 => {
                // Node headers live at the start of a page: bytes there steer the parser.
                for _ in 0..1 + r.below(8) {
                    let at = r.below(256) as usize;
                    data[at] = r.next_u64() as u8;
                }
                "bytes in the first 256 changed"
            }
            2 => {
                // Lengths and counts set to extremes.
                for _ in 0..1 + r.below(4) {
                    let at = r.below(ps as u64 - 4) as usize;
                    let v = [u32::MAX, 0, 0xFFFF, 0x8000_0000, 4096, 2047][r.below(6) as usize];
                    data[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
                "fields set to extremes"
            }
            _ => {
                data.fill(0);
                "zeroed"
            }
        };
        spare.sig = signer.sign(data);
        if r.below(4) == 0 {
            // The spare lies too: another segment, another kind of page.
            spare.segment = spare.segment.wrapping_add(r.below(3)).wrapping_sub(1);
            spare.group_len = r.next_u64() as u8;
        }
        let mut sb = vec![0u8; ss];
        // A forger that knows the format: the spare is valid for where it is written.
        spare.encode(&mut sb, Some(page));
        raw[ps..].copy_from_slice(&sb);
        nand.raw_write(page, 0, &raw).unwrap();
        done.push(format!("page {page}: {how}"));
    }
    done.join("; ")
}

/// Appends to the anchor log a well-formed anchor (FORMAT.md section 7, CRC and all) naming a
/// random checkpoint page and segment, newer than every real one.
fn forge_anchor(nand: &mut RamNand, r: &mut Rng) -> String {
    let g = nand.geometry();
    let (ps, ss) = (g.page_size as usize, g.spare_size as usize);
    let mut raw = vec![0u8; ps + ss];
    let mut newest: Option<(u32, Vec<u8>)> = None;
    let mut free = None;
    for page in 1..2 * g.pages_per_block {
        nand.raw_read(page, &mut raw).unwrap();
        if raw.iter().all(|&b| b == 0xFF) {
            if free.is_none() && page % g.pages_per_block != 0 {
                free = Some(page);
            }
        } else if &raw[..8] == b"BMANCHOR" {
            newest = Some((page, raw.clone()));
        }
    }
    let (Some((from, mut forged)), Some(at)) = (newest, free) else { return "no anchor to forge".into() };
    let seq = u64::from_le_bytes(forged[16..24].try_into().unwrap()) + 1 + r.below(1000);
    forged[16..24].copy_from_slice(&seq.to_le_bytes());
    forged[24] = if r.below(4) == 0 { 2 } else { 1 };
    let pages = g.blocks * g.pages_per_block;
    forged[28..32].copy_from_slice(&(r.below(pages as u64) as u32).to_le_bytes());
    forged[32..40].copy_from_slice(&r.below(40).to_le_bytes());
    forged[40..44].copy_from_slice(&(r.below(14) as u32).to_le_bytes());
    let crc = bitmend_code::crc::crc32c(&forged[..44]);
    forged[44..48].copy_from_slice(&crc.to_le_bytes());
    let mut spare = Spare::decode(&forged[ps..], from).expect("a real anchor's spare");
    spare.sig = Signer::<4>::new().sign(&forged[..ps]);
    let mut sb = vec![0u8; ss];
    spare.encode(&mut sb, Some(at));
    forged[ps..].copy_from_slice(&sb);
    nand.raw_write(at, 0, &forged).unwrap();
    format!("anchor forged at page {at}")
}

/// Everything a user could do with what mounted; errors are fine.
fn exercise(nand: RamNand) {
    let Ok((mut fs, _)) = Fs::open(nand, opts()) else { return };
    let mut stack = vec![ROOT];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs.readdir(dir) else { continue };
        for e in entries {
            seen += 1;
            if seen > 10_000 || e.name == b"." || e.name == b".." {
                continue;
            }
            match fs.getattr(e.ino).map(|a| a.kind) {
                Ok(FileType::Dir) if e.ino != dir => stack.push(e.ino),
                Ok(FileType::Symlink) => {
                    let _ = fs.readlink(e.ino);
                }
                Ok(_) => {
                    let _ = fs.read(e.ino, 0, 1 << 20);
                }
                Err(_) => {}
            }
        }
    }
    let _ = fs.check(true);
    if let Ok(f) = fs.create(ROOT, b"after", 0o644, 0, 0) {
        let _ = fs.write(f.ino, 0, &content(3, 20_000));
    }
    let _ = fs.sync();
    if let Ok(nand) = fs.unmount() {
        if let Ok((mut fs, _)) = Fs::open(nand, opts()) {
            let _ = fs.check(true);
        }
    }
}

#[test]
fn hostile_pages_under_valid_spares_never_panic() {
    let seeds: u64 = std::env::var("BITMEND_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let base = base();
    let (mut pages, mut anchors) = (0, 0);
    for seed in 0..seeds {
        let mut nand = base.clone();
        let mut r = Rng::new(seed);
        let what = damage(&mut nand, &mut r);
        pages += what.matches(": ").count();
        anchors += what.matches("anchor forged").count();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exercise(nand)));
        if let Err(e) = run {
            eprintln!("seed {seed}: {what}");
            std::panic::resume_unwind(e);
        }
    }
    eprintln!("hostile images: {seeds} images, {pages} pages rewritten under valid spares, {anchors} anchors forged; mount, reads, fsck, a write and a remount never panicked");
    assert!(pages >= seeds as usize && (seeds < 20 || anchors > 0));
}
