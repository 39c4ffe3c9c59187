//! Runs of a file's logical pages compressed together into one data node (format version
//! 5): pages overwritten one by one inside a node, a truncation into one, their places read
//! back by replay and from map nodes, and the cleaner moving what stays live of them.

mod common;

use std::collections::BTreeMap;

use bitmend_flashfs::Ino;
use bitmend_flashfs::{Compression, Fs, FsOptions, SetAttr, ROOT};
use bitmend_media::nand::RamNand;
use bitmend_media::rng::Rng;
use common::{cfg, chip};

fn opts(c: Compression, node_pages: usize) -> FsOptions {
    FsOptions { index_chunks: 2, node_pages, ..common::opts(c) }
}

/// Text from a vocabulary: compresses, and better over 16 KiB than over 4.
fn text(seed: u64, len: usize) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "segment ",
        "parity ",
        "signature ",
        "erase ",
        "block ",
        "page ",
        "cleaner ",
        "checkpoint ",
        "index ",
        "node ",
        "fragment ",
        "\n",
    ];
    let mut r = Rng::new(seed);
    let mut v = Vec::with_capacity(len + 16);
    while v.len() < len {
        v.extend_from_slice(WORDS[r.below(WORDS.len() as u64) as usize].as_bytes());
        if r.below(9) == 0 {
            v.extend_from_slice(format!("{} ", r.below(100_000)).as_bytes());
        }
    }
    v.truncate(len);
    v
}

fn assert_reads(fs: &mut Fs<RamNand>, ino: Ino, want: &[u8], when: &str) {
    assert_eq!(fs.getattr(ino).unwrap().size, want.len() as u64, "{when}");
    let got = fs.read(ino, 0, want.len() + 4096).unwrap();
    assert!(got == want, "{when}: the file reads back different");
    let check = fs.check(true);
    assert!(check.clean(), "{when}: {:?}", check.problems);
}

#[test]
fn pages_of_a_node_are_overwritten_truncated_and_found_again_one_by_one() {
    for c in [Compression::Lz4, Compression::Zstd] {
        let mut fs = Fs::format(chip(64), cfg(), opts(c, 4)).unwrap();
        let f = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
        let mut model = text(1, 40 * 4096 + 100);
        fs.write(f.ino, 0, &model).unwrap();
        fs.sync().unwrap();
        let st = fs.stats();
        // 41 pages: ten nodes of four, the last page alone.
        assert_eq!((st.multi_page_nodes, st.pages_in_multi_page_nodes), (10, 40), "{c:?}: {st:?}");
        assert_reads(&mut fs, f.ino, &model, "written");

        // Single pages inside nodes (each place in a node once), then a range across two.
        for (at, seed) in [(5u64, 2u64), (10, 3), (3, 4), (12, 5)] {
            let page = text(seed, 4096);
            fs.write(f.ino, at * 4096, &page).unwrap();
            model[at as usize * 4096..][..4096].copy_from_slice(&page);
            fs.sync().unwrap();
        }
        let across = text(6, 2 * 4096);
        fs.write(f.ino, 7 * 4096 + 100, &across).unwrap();
        model[7 * 4096 + 100..][..across.len()].copy_from_slice(&across);
        fs.sync().unwrap();
        assert_reads(&mut fs, f.ino, &model, "overwritten");

        // Truncated into the middle of a node, then grown again: the cut page reads zeros.
        fs.setattr(f.ino, SetAttr { size: Some(22 * 4096 + 300), ..SetAttr::default() }).unwrap();
        model.truncate(22 * 4096 + 300);
        fs.setattr(f.ino, SetAttr { size: Some(26 * 4096), ..SetAttr::default() }).unwrap();
        model.resize(26 * 4096, 0);
        fs.sync().unwrap();
        assert_reads(&mut fs, f.ino, &model, "truncated");

        // Found again by replay (a crash after the sync), then from the map nodes.
        let (mut fs, report) = Fs::open(fs.into_nand(), opts(c, 4)).unwrap();
        assert_eq!(report.pages_lost, 0);
        assert_reads(&mut fs, f.ino, &model, "replayed");
        let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts(c, 4)).unwrap();
        assert_reads(&mut fs, f.ino, &model, "from the maps");
        // And written one page per node by a mount that asks so: read back the same.
        let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts(c, 1)).unwrap();
        fs.write(f.ino, 4096, &text(7, 4096)).unwrap();
        model[4096..2 * 4096].copy_from_slice(&text(7, 4096));
        fs.sync().unwrap();
        assert_eq!(fs.stats().multi_page_nodes, 0);
        assert_reads(&mut fs, f.ino, &model, "mixed");
    }
}

#[test]
fn nodes_of_several_pages_take_less_flash() {
    let data = text(9, 64 * 4096);
    let mut stored = Vec::new();
    for node_pages in [1, 2, 4, 16] {
        // At the high level, as the cleaner stores cold data (the fast compressor gains less).
        let o = FsOptions {
            lz4_write_level: bitmend_flashfs::DEFAULT_LZ4_LEVEL,
            ..opts(Compression::Lz4, node_pages)
        };
        let mut fs = Fs::format(chip(64), cfg(), o).unwrap();
        let f = fs.create(ROOT, b"t", 0o644, 0, 0).unwrap();
        fs.write(f.ino, 0, &data).unwrap();
        fs.sync().unwrap();
        assert_eq!(fs.read(f.ino, 0, data.len()).unwrap(), data);
        stored.push(fs.stats().data_stored);
    }
    eprintln!("64 pages of text, lz4, nodes of 1, 2, 4 and 16 pages: {stored:?} bytes stored");
    assert!(stored.windows(2).all(|w| w[1] < w[0]), "{stored:?}");
    assert!(stored[2] * 100 < stored[0] * 95, "{stored:?}");
}

#[test]
fn the_cleaner_moves_what_stays_live_of_nodes_of_several_pages() {
    // 8 segments of 45 pages; random page and range overwrites of text files, so that nodes
    // die a page at a time and the cleaner finds them part live.
    let o = opts(Compression::Lz4, 4);
    let mut fs = Fs::format(chip(34), cfg(), o).unwrap();
    let mut r = Rng::new(5);
    let mut model: BTreeMap<Ino, Vec<u8>> = BTreeMap::new();
    for i in 0..4u64 {
        let f = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        let data = text(100 + i, 24 * 4096);
        fs.write(f.ino, 0, &data).unwrap();
        model.insert(f.ino, data);
    }
    fs.sync().unwrap();
    let inos: Vec<Ino> = model.keys().copied().collect();
    let (mut cleaned, mut moved, mut several) = (0, 0, 0);
    for step in 0..1500u64 {
        let ino = inos[r.below(4) as usize];
        let len = if r.below(4) == 0 { 4096 * (2 + r.below(6) as usize) } else { 1 + r.below(4096) as usize };
        let at = r.below((24 * 4096 - len) as u64);
        let piece = text(1000 + step, len);
        fs.write(ino, at, &piece).unwrap();
        model.get_mut(&ino).unwrap()[at as usize..][..len].copy_from_slice(&piece);
        if step % 5 == 0 {
            fs.sync().unwrap();
        }
        if step % 300 == 299 {
            let st = fs.stats();
            (cleaned, moved, several) =
                (cleaned + st.segments_cleaned, moved + st.pages_moved, several + st.multi_page_nodes);
            let (f2, _) = Fs::open(fs.unmount().unwrap(), o).unwrap();
            fs = f2;
            for (ino, data) in &model {
                assert!(fs.read(*ino, 0, data.len()).unwrap() == *data, "step {step}, inode {ino}");
            }
            let check = fs.check(true);
            assert!(check.clean(), "step {step}: {:?}", check.problems);
        }
    }
    eprintln!("cleaner over nodes of several pages: {cleaned} segments cleaned, {moved} pages moved, {several} nodes of several pages written");
    assert!(cleaned > 20 && moved > 100 && several > 100, "{cleaned} {moved} {several}");
}

/// Writes use lz4's fast compressor; the cleaner, moving the data, stores it again at the
/// high level: after `compact` the same files take less flash and read back the same. With
/// the high level at 0 too, compaction saves nothing on the data: the saving is the level's.
#[test]
fn the_cleaner_recompresses_what_the_writer_compressed_fast() {
    let mut ends = Vec::new();
    for cold_level in [0u8, 9] {
        let o = FsOptions { lz4_level: cold_level, lz4_write_level: 0, ..opts(Compression::Lz4, 4) };
        let mut fs = Fs::format(chip(64), cfg(), o).unwrap();
        let mut model = Vec::new();
        for i in 0..6u64 {
            let f = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
            let data = text(200 + i, 20 * 4096 + 77);
            fs.write(f.ino, 0, &data).unwrap();
            model.push((f.ino, data));
        }
        fs.sync().unwrap();
        let written = fs.stats().data_stored;
        let live_before = fs.data_footprint();
        let emptied = fs.compact().unwrap();
        assert!(emptied > 0, "compact emptied no segment");
        let live_after = fs.data_footprint();
        for (ino, data) in &model {
            assert!(fs.read(*ino, 0, data.len()).unwrap() == *data, "level {cold_level}: inode {ino}");
        }
        let (mut fs, _) = Fs::open(fs.unmount().unwrap(), o).unwrap();
        for (ino, data) in &model {
            assert!(fs.read(*ino, 0, data.len()).unwrap() == *data, "level {cold_level}, remounted: {ino}");
        }
        assert!(fs.check(true).clean());
        eprintln!(
            "cold level {cold_level}: {written} bytes written, live data {live_before} before compact, {live_after} after"
        );
        ends.push((live_before, live_after));
    }
    let (fast, hc) = (ends[0], ends[1]);
    assert_eq!(fast.0, hc.0, "both wrote with the fast compressor");
    assert!(fast.1 * 100 >= fast.0 * 99, "level 0 again: no saving expected, {fast:?}");
    assert!(hc.1 * 100 < hc.0 * 95, "level 9 saves at least 5%: {hc:?}");
}
