//! PRIMS's on-line check (`Fs::check_state`): the namespace in memory compared with its
//! groups on flash. Through thousands of random operations, with the check run after each
//! one, it never reports a group that is right (a false alarm restarts a mount's worker);
//! an inode flipped in memory is reported, in its group alone, and flash still holds it
//! right.

mod common;

use bitmend_flashfs::{Compression, Fs, Ino, SetAttr, ROOT};
use bitmend_media::nand::{FaultyNand, Nand, RamNand};
use bitmend_media::rng::Rng;
use common::{cfg, chip, lose_beyond_repair, opts, pages_with};

/// A file: its directory, name and inode.
type File = (Ino, Vec<u8>, Ino);

/// 600 files in 6 directories, their groups written by a checkpoint.
fn populated() -> (Fs<RamNand>, Vec<File>) {
    populated_on(chip(256))
}

fn populated_on<N: Nand>(chip: N) -> (Fs<N>, Vec<File>) {
    let mut fs = Fs::format(chip, cfg(), opts(Compression::Lz4)).unwrap();
    let mut files = Vec::new();
    for d in 0..6u8 {
        let dir = fs.mkdir(ROOT, &[b'd', b'0' + d], 0o755, 0, 0).unwrap().ino;
        for i in 0..100u32 {
            let name = format!("f{i}").into_bytes();
            let f = fs.create(dir, &name, 0o644, 0, 0).unwrap().ino;
            fs.write(f, 0, &i.to_le_bytes()).unwrap();
            files.push((dir, name, f));
        }
    }
    fs.checkpoint().unwrap();
    (fs, files)
}

#[test]
fn random_operations_never_raise_a_false_alarm() {
    let (mut fs, mut files) = populated();
    let mut rng = Rng::new(7);
    let mut compared = 0;
    for op in 0..3000 {
        let k = rng.below(files.len() as u64) as usize;
        let (dir, name, f) = files[k].clone();
        match rng.below(8) {
            0 => drop(
                fs.setattr(f, SetAttr { perm: Some(0o600 + rng.below(64) as u16), ..SetAttr::default() }),
            ),
            1 => drop(fs.write(f, rng.below(20_000), &vec![op as u8; 1 + rng.below(9000) as usize])),
            2 => drop(fs.setattr(f, SetAttr { size: Some(rng.below(30_000)), ..SetAttr::default() })),
            3 => {
                let to = format!("r{op}").into_bytes();
                fs.rename(dir, &name, dir, &to).unwrap();
                files[k].1 = to;
            }
            4 => {
                fs.unlink(dir, &name).unwrap();
                let f = fs.create(dir, &name, 0o644, 0, 0).unwrap().ino;
                files[k].2 = f;
            }
            5 => fs.sync().unwrap(),
            6 if op % 50 == 0 => fs.checkpoint().unwrap(),
            _ => drop(fs.read(f, 0, 4096)),
        }
        let r = fs.check_state(usize::MAX).unwrap();
        assert!(r.mismatched.is_empty(), "after operation {op}: {r:?}");
        compared += r.compared;
    }
    assert!(compared > 1000, "the check compared groups with flash ({compared}), not none");
    assert!(fs.check(true).clean());
}

#[test]
fn an_inode_flipped_in_memory_is_found_in_its_group_alone() {
    let (mut fs, files) = populated();
    let before = fs.check_state(usize::MAX).unwrap();
    assert!(before.mismatched.is_empty() && before.compared > 1, "{before:?}");
    let (_, _, f) = files[123];
    let uid = fs.getattr(f).unwrap().uid;
    assert!(fs.flip_inode(f.0, 5), "inode {f:?} is there");
    assert!(!fs.flip_inode(9_999_999, 5), "no such inode");
    // In steps of 2 groups, round and round: found once per round.
    let mut found = Vec::new();
    for _ in 0..before.compared.div_ceil(2) {
        found.extend(fs.check_state(2).unwrap().mismatched);
    }
    assert_eq!(found.len(), 1, "one flip, one group: {found:?}");
    // What flash holds is the inode as it was.
    let (mut again, _) = Fs::open(fs.into_nand(), opts(Compression::Lz4)).unwrap();
    assert_eq!(again.getattr(f).unwrap().uid, uid);
    assert!(again.check_state(usize::MAX).unwrap().mismatched.is_empty());
}

/// A group's copy damaged on flash under the check: repairable (one page lost, its parity
/// rebuilds it) the group is compared and matches; beyond repair it is passed over (the
/// scrubber's to report), never taken for a wrong memory, which would restart a worker that
/// is right. Every page holding a group node is damaged in turn, both ways.
#[test]
fn a_group_copy_damaged_on_flash_is_never_a_mismatch() {
    let fresh = || populated_on(FaultyNand::new(chip(256), 11));
    let (mut fs, _) = fresh();
    let pages = pages_with(&mut fs, 10, u64::MAX, None);
    let whole = fs.check_state(usize::MAX).unwrap().compared;
    assert!(pages.len() >= 2 && whole >= 2, "{} group pages, {whole} groups", pages.len());
    let (mut faults, mut unreadable) = (0, 0);
    for &p in &pages {
        for beyond in [false, true] {
            let (mut fs, files) = fresh();
            if beyond {
                lose_beyond_repair(&mut fs, p);
                faults += 3;
            } else {
                fs.store_mut().nand_mut().lose_page(p).unwrap();
                faults += 1;
            }
            let r = fs.check_state(usize::MAX).unwrap();
            assert!(r.mismatched.is_empty(), "page {p} lost (beyond repair: {beyond}): {r:?}");
            if beyond {
                assert_eq!(r.compared + r.unreadable, whole, "page {p} lost beyond repair: {r:?}");
                unreadable += r.unreadable;
            } else {
                assert_eq!(r.compared, whole, "page {p} lost, repairable: every group compared");
            }
            // Memory is untouched: every file still reads as written.
            for (i, (_, _, f)) in files.iter().enumerate() {
                let i = (i % 100) as u32;
                assert_eq!(fs.read(*f, 0, 64).unwrap(), i.to_le_bytes(), "file {f:?} after page {p} lost");
            }
        }
    }
    assert!(unreadable > 0, "no loss beyond repair reached a group's copy");
    eprintln!(
        "{} group pages, each lost both ways: {faults} pages lost in all, {unreadable} copies passed over",
        pages.len()
    );
}
