//! Reads without the lock, racing the writer, the write-back thread and the cleaner through
//! the mount: on a small image a file is rewritten again and again (so the cleaner moves live
//! data and erases the blocks it came from) while two readers read it and a file that never
//! changes. Every page a reader gets is one the writer wrote whole (its header names a version
//! and the page, its body is that version's), never a mix, a torn page or an erased one; the
//! file that never changes reads back exact every time. With --direct-io every read reaches
//! the daemon, and the control file counts the pages read without the lock.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{bitmend, fsck_clean, fuse_available, mount, scratch, umount};

const PAGE: usize = 4096;
const PAGES: usize = 512; // 2 MiB

/// Page `index` of version `v`: a header (v, index), then bytes only that pair makes.
fn page(v: u64, index: usize) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    p[..8].copy_from_slice(&v.to_le_bytes());
    p[8..16].copy_from_slice(&(index as u64).to_le_bytes());
    let mut x = v.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64;
    for b in &mut p[16..] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    p
}

/// Whether `got` is page `index` of some version (and which).
fn whole_page(got: &[u8], index: usize) -> Option<u64> {
    let v = u64::from_le_bytes(got[..8].try_into().unwrap());
    (got == page(v, index)).then_some(v)
}

fn number(json: &str, key: &str) -> u64 {
    let at =
        json.find(&format!("\"{key}\": ")).unwrap_or_else(|| panic!("no {key} in {json}")) + key.len() + 4;
    json[at..].split([',', '}']).next().unwrap().trim().parse().unwrap()
}

#[test]
fn reads_racing_rewrites_and_the_cleaner_get_whole_pages_only() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("reads-racing");
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    mount(&img, &mnt, &["--direct-io", "--cache", "0"]);
    let moving = Path::new(&mnt).join("moving");
    let still = Path::new(&mnt).join("still");
    let still_data: Vec<u8> = (0..PAGES).flat_map(|i| page(u64::MAX, i)).collect();
    std::fs::write(&still, &still_data).unwrap();
    let first: Vec<u8> = (0..PAGES).flat_map(|i| page(0, i)).collect();
    std::fs::write(&moving, &first).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (moving, still, stop, still_data) =
                (moving.clone(), still.clone(), stop.clone(), still_data.clone());
            std::thread::spawn(move || {
                let (m, s) = (std::fs::File::open(&moving).unwrap(), std::fs::File::open(&still).unwrap());
                let mut buf = vec![0u8; 64 * PAGE];
                let (mut reads, mut pages) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    // 256 KiB at a page boundary that moves with each read.
                    let at = (reads as usize * 37 % (PAGES - 64)) * PAGE;
                    m.read_exact_at(&mut buf, at as u64).unwrap();
                    for (k, got) in buf.chunks(PAGE).enumerate() {
                        let index = at / PAGE + k;
                        if whole_page(got, index).is_none() {
                            let v = u64::from_le_bytes(got[..8].try_into().unwrap());
                            let i = u64::from_le_bytes(got[8..16].try_into().unwrap());
                            let zeros = got.iter().filter(|&&b| b == 0).count();
                            let ones = got.iter().filter(|&&b| b == 0xFF).count();
                            let firstbad = (0..PAGE).find(|&j| got[j] != page(v, index)[j]);
                            panic!("reader {r}: page {index} (at {at}) is no page written: header v {v} i {i}, zeros {zeros}, ones {ones}, first differing byte {firstbad:?}");
                        }
                        pages += 1;
                    }
                    s.read_exact_at(&mut buf, at as u64).unwrap();
                    assert!(buf == still_data[at..at + buf.len()], "reader {r}: the file that never changes");
                    reads += 1;
                }
                pages
            })
        })
        .collect();
    // 30 rewrites of 2 MiB, 60 MiB through an image of 32: the cleaner runs throughout.
    let f = std::fs::OpenOptions::new().write(true).open(&moving).unwrap();
    // From a page-aligned buffer: with --direct-io the kernel cuts a write where the buffer's
    // pages end, and an unaligned one would split a page between two requests (a reader
    // between them would see half of each version, as POSIX allows).
    let mut buffer = vec![0u8; PAGES * PAGE + PAGE];
    let skew = buffer.as_ptr().align_offset(PAGE);
    for v in 1..=30u64 {
        let data = &mut buffer[skew..skew + PAGES * PAGE];
        for (i, p) in data.chunks_mut(PAGE).enumerate() {
            p.copy_from_slice(&page(v, i));
        }
        f.write_all_at(data, 0).unwrap();
    }
    drop(f);
    stop.store(true, Ordering::Relaxed);
    let checked: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    let last: Vec<u8> = (0..PAGES).flat_map(|i| page(30, i)).collect();
    assert!(std::fs::read(&moving).unwrap() == last, "the last version, whole");
    let status = std::fs::read_to_string(Path::new(&mnt).join(".bitmend-scrub")).unwrap();
    assert!(number(&status, "reads_unlocked") > 1000, "reads went without the lock: {status}");
    eprintln!(
        "{checked} pages checked while 30 versions were written; {} pages read without the lock, {} read again under it",
        number(&status, "reads_unlocked"),
        number(&status, "reads_relocked")
    );
    umount(&mnt);
    fsck_clean(&img, "after the race");
    let _ = std::fs::remove_dir_all(dir);
}
