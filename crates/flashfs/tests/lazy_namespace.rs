//! A namespace read a group at a time (`FsOptions::lazy_namespace`) answers every operation
//! as one read whole at mount does: the same random operations on two mounts of the same
//! image, one lazy and one not, give the same results, byte for byte, across remounts;
//! fsck is clean on both at the end.

mod common;

use bitmend_flashfs::{Compression, Fs, FsError, FsOptions, Ino, SetAttr, ROOT};
use bitmend_media::nand::RamNand;
use bitmend_media::rng::Rng;
use common::{cfg, chip};

fn opts(lazy: bool) -> FsOptions {
    FsOptions {
        compression: Compression::Lz4,
        dirty_limit: 64 << 10,
        lazy_namespace: lazy,
        namespace_cache: 0,
        ..FsOptions::default()
    }
}

/// 1,200 files in 12 directories, unmounted cleanly.
fn image() -> RamNand {
    let mut fs = Fs::format(chip(512), cfg(), opts(false)).unwrap();
    for d in 0..12u32 {
        let dir = fs.mkdir(ROOT, format!("d{d}").as_bytes(), 0o755, 0, 0).unwrap().ino;
        for i in 0..100u32 {
            let f = fs.create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write(f, 0, format!("{d}/{i}").as_bytes()).unwrap();
        }
    }
    fs.unmount().unwrap()
}

/// An operation's outcome, comparable across the two mounts.
fn outcome<T: std::fmt::Debug>(r: Result<T, FsError>) -> String {
    match r {
        Ok(v) => format!("ok {v:?}"),
        Err(e) => format!("err {e}"),
    }
}

fn step(fs: &mut Fs<RamNand>, rng: &mut Rng, op: u64) -> String {
    let d = format!("d{}", rng.below(13));
    let name = format!("f{}", rng.below(130));
    let dir = match fs.lookup(ROOT, d.as_bytes()) {
        Ok(a) => a.ino,
        Err(e) => return format!("lookup {d}: {e}"),
    };
    let file = fs.lookup(dir, name.as_bytes()).map(|a| a.ino);
    let strip = |mut a: bitmend_flashfs::Attr| {
        (a.atime, a.mtime, a.ctime) = ((0, 0), (0, 0), (0, 0));
        a
    };
    match rng.below(9) {
        0 => outcome(fs.create(dir, name.as_bytes(), 0o644, 0, 0).map(strip)),
        1 => outcome(fs.unlink(dir, name.as_bytes())),
        2 => {
            let to = format!("d{}", rng.below(12));
            match fs.lookup(ROOT, to.as_bytes()) {
                Ok(t) => outcome(fs.rename(dir, name.as_bytes(), t.ino, format!("r{op}").as_bytes())),
                Err(e) => format!("{e}"),
            }
        }
        3 => match file {
            Ok(f) => outcome(fs.write(f, rng.below(9000), &vec![op as u8; 1 + rng.below(6000) as usize])),
            Err(e) => format!("{e}"),
        },
        4 => match file {
            Ok(f) => outcome(fs.read(f, 0, 20_000)),
            Err(e) => format!("{e}"),
        },
        5 => match file {
            Ok(f) => outcome(
                fs.setattr(f, SetAttr { size: Some(rng.below(5000)), ..SetAttr::default() }).map(strip),
            ),
            Err(e) => format!("{e}"),
        },
        6 => {
            let mut names: Vec<Vec<u8>> = match fs.readdir(dir) {
                Ok(v) => v.into_iter().map(|e| e.name).collect(),
                Err(e) => return format!("{e}"),
            };
            names.sort();
            format!("{names:?}")
        }
        7 => outcome(fs.getattr(file.unwrap_or(Ino(1))).map(strip)),
        _ => outcome(fs.mkdir(dir, format!("sub{}", rng.below(5)).as_bytes(), 0o755, 0, 0).map(|a| a.kind)),
    }
}

/// The same random operations on a lazy mount (keeping at most `cache` inodes, shedding
/// between operations as the mount does; 0: no bound) and one read whole, with remounts:
/// every answer alike, fsck clean on both. Returns the lazy mount's last statistics and the
/// most inodes it held in memory between operations.
fn differential(cache: usize) -> (bitmend_flashfs::FsStats, u64) {
    let base = image();
    let lazy_opts = FsOptions { namespace_cache: cache, ..opts(true) };
    let open =
        |nand: RamNand, lazy: bool| Fs::open(nand, if lazy { lazy_opts } else { opts(false) }).unwrap().0;
    let mut mounts: Vec<Fs<RamNand>> = [true, false].iter().map(|&lazy| open(base.clone(), lazy)).collect();
    let (lazy, whole) = (mounts[0].stats(), mounts[1].stats());
    assert!(lazy.groups > 8 && lazy.groups_unread + 1 >= lazy.groups, "lazy: {lazy:?}");
    assert_eq!(whole.groups_unread, 0);
    assert_eq!(mounts[0].inode_count(), mounts[1].inode_count(), "counted from the table");
    let mut rng = [Rng::new(3), Rng::new(3)];
    let mut most = 0;
    for op in 0..3000u64 {
        let said: Vec<String> =
            mounts.iter_mut().zip(rng.iter_mut()).map(|(fs, r)| step(fs, r, op)).collect();
        assert_eq!(said[0], said[1], "operation {op}: lazy against whole");
        mounts[0].shed_namespace();
        most = most.max(mounts[0].stats().inodes_in_memory);
        if op % 500 == 499 && op < 2999 {
            mounts = mounts
                .into_iter()
                .zip([true, false])
                .map(|(fs, lazy)| open(fs.unmount().unwrap(), lazy))
                .collect();
        }
    }
    let read = mounts[0].stats();
    assert!(cache > 0 || read.groups_unread < lazy.groups_unread, "the operations read groups: {read:?}");
    for fs in &mut mounts {
        let c = fs.check(true);
        assert!(c.clean(), "{:?}", c.problems);
    }
    (read, most)
}

#[test]
fn a_lazily_read_namespace_answers_as_one_read_whole() {
    let (read, most) = differential(0);
    assert_eq!(read.groups_shed, 0);
    assert!(most > 600, "{most} inodes in memory at most");
    eprintln!(
        "lazy mount: {} of {} groups still unread after the last 500 operations",
        read.groups_unread, read.groups
    );
}

/// As above, with a cache of 60 inodes of the 1,200 or so: groups go and come back
/// between every two operations, and every answer is still the same. (Groups whose files
/// have pages or an inode waiting to be written stay: memory is ahead of their copies.)
#[test]
fn a_namespace_within_a_small_cache_answers_as_one_read_whole() {
    let (read, most) = differential(60);
    assert!(read.groups_shed > 100, "groups let go: {read:?}");
    assert!(most < 900, "{most} inodes in memory at most");
    eprintln!(
        "cache of 60 inodes: {} groups let go in the last 500 operations, {most} inodes held at most",
        read.groups_shed
    );
}

/// A file unlinked while open is kept in its group by a checkpoint; a mount after a crash
/// has no reader for it. Read lazily, it goes as its group is read, and its pages with it:
/// the space comes back as it does on a mount that reads every group.
#[test]
fn a_file_kept_for_readers_goes_with_its_pages_when_its_group_is_read() {
    let mut fs = Fs::open(image(), opts(false)).unwrap().0;
    let dir = fs.lookup(ROOT, b"d3").unwrap().ino;
    let f = fs.lookup(dir, b"f7").unwrap().ino;
    let big = vec![0x5a; 600 << 10];
    fs.write(f, 0, &big).unwrap();
    fs.open_file(f).unwrap();
    fs.unlink(dir, b"f7").unwrap();
    fs.checkpoint().unwrap();
    let crashed = fs.into_nand();
    let mut free = Vec::new();
    for lazy in [true, false] {
        let (mut fs, _) = Fs::open(crashed.clone(), opts(lazy)).unwrap();
        // Reads the orphan's group (and drops it there) on the lazy mount.
        assert!(fs.getattr(f).is_err(), "lazy {lazy}: the orphan is gone");
        fs.checkpoint().unwrap();
        let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts(lazy)).unwrap();
        free.push(fs.statfs().1);
        let c = fs.check(true);
        assert!(c.clean(), "lazy {lazy}: {:?}", c.problems);
    }
    assert_eq!(free[0], free[1], "free bytes, lazy against whole");
    assert!(free[0] > 0);
}

/// A file spanning several runs of maps (16 MiB each), truncated and unlinked on a lazy
/// mount: the groups of every run its size covers are read first, so every page goes (data
/// as on a mount that reads every group; fsck clean).
#[test]
fn a_file_over_several_runs_loses_every_page_on_a_lazy_mount() {
    let mut fs = Fs::open(image(), opts(false)).unwrap().0;
    // A directory whose region spans more groups than the files have runs.
    let dir = fs.mkdir(ROOT, b"big", 0o755, 0, 0).unwrap().ino;
    for i in 0..2000u32 {
        fs.create(dir, format!("n{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let (a, b) =
        (fs.create(dir, b"a", 0o644, 0, 0).unwrap().ino, fs.create(dir, b"b", 0o644, 0, 0).unwrap().ino);
    for f in [a, b] {
        for mib in [0u64, 17, 35, 52] {
            fs.write(f, mib << 20, &vec![f.0 as u8 | 1; 64 << 10]).unwrap();
        }
    }
    let before = fs.data_space();
    let base = fs.unmount().unwrap();
    let mut free = Vec::new();
    for lazy in [true, false] {
        let (mut fs, _) = Fs::open(base.clone(), opts(lazy)).unwrap();
        fs.setattr(a, SetAttr { size: Some(20 << 20), ..SetAttr::default() }).unwrap();
        fs.unlink(dir, b"b").unwrap();
        fs.checkpoint().unwrap();
        let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts(lazy)).unwrap();
        let left = fs.read(a, 17 << 20, 64 << 10).unwrap();
        assert!(left.iter().all(|&x| x == a.0 as u8 | 1), "lazy {lazy}: the data below the cut");
        free.push(fs.data_space());
        let c = fs.check(true);
        assert!(c.clean(), "lazy {lazy}: {:?}", c.problems);
    }
    assert_eq!(free[0], free[1], "data bytes (logical, stored), lazy against whole");
    // b's four writes of 64 KiB at least are gone.
    assert!(before.0 - free[0].0 >= 4 * (64 << 10), "pages gone: {before:?} then {:?}", free[0]);
}

/// A mount after a crash replays the log onto the checkpoint and prunes what the replay
/// names (a file unlinked, its name), reading the groups of those inodes only: most stay
/// unread, and the state is the one a mount that reads every group finds.
#[test]
fn a_mount_after_a_crash_reads_only_what_the_log_names() {
    let mut fs = Fs::open(image(), opts(true)).unwrap().0;
    let dir = fs.lookup(ROOT, b"d4").unwrap().ino;
    let f = fs.create(dir, b"new", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"after the checkpoint").unwrap();
    fs.unlink(dir, b"f9").unwrap();
    fs.fsync(f).unwrap();
    let crashed = fs.into_nand();
    let mut lazy = Fs::open(crashed.clone(), opts(true)).unwrap().0;
    let mut whole = Fs::open(crashed, opts(false)).unwrap().0;
    let s = lazy.stats();
    assert!(s.groups_unread * 2 > s.groups, "the crash mount read most groups: {s:?}");
    for (fs, which) in [(&mut lazy, "lazy"), (&mut whole, "whole")] {
        assert_eq!(fs.read(f, 0, 100).unwrap(), b"after the checkpoint", "{which}");
        assert!(fs.lookup(dir, b"f9").is_err(), "{which}: the unlinked name is gone");
        let c = fs.check(true);
        assert!(c.clean(), "{which}: {:?}", c.problems);
    }
    assert_eq!(lazy.inode_count(), whole.inode_count());
}

/// The attributes of a directory (the root above all, which the kernel asks for again and
/// again) read its inode's group only: a directory has no maps to count blocks from. A
/// file's read the groups of the runs its size covers. Both answer as a mount that reads
/// every group does.
#[test]
fn the_attributes_of_a_directory_or_a_file_read_a_group_or_two() {
    let mut answers = Vec::new();
    for lazy in [true, false] {
        let (mut fs, _) = Fs::open(image(), opts(lazy)).unwrap();
        let before = fs.stats().groups_unread;
        let dir = fs.lookup(ROOT, b"d7").unwrap().ino;
        let f = fs.lookup(dir, b"f3").unwrap().ino;
        answers.push([ROOT, dir, f].map(|ino| fs.stored_blocks(ino)));
        let s = fs.stats();
        if lazy {
            let read = before - s.groups_unread;
            assert!(read <= 6, "{read} of {} groups read for two lookups and three getattrs", s.groups);
            assert!(s.groups_unread * 2 > s.groups, "{s:?}");
        }
    }
    assert_eq!(answers[0], answers[1], "blocks of the root, a directory and a file: lazy, then whole");
    assert!(answers[0][2] > 0, "the file's page is counted");
}

/// Directories moved to other parents on a lazy mount, and moves under themselves refused:
/// the walk up from the target reads the regions its directories were made in (where a
/// directory never moved is named), not every group; a directory that was moved is found by
/// reading every group. The tree and fsck are those of a mount that reads every group.
#[test]
fn a_directory_moved_across_parents_reads_its_parents_not_every_group() {
    let mut fs = Fs::open(image(), opts(false)).unwrap().0;
    let look = |fs: &mut Fs<RamNand>, d: Ino, n: &str| fs.lookup(d, n.as_bytes()).unwrap().ino;
    let (d0, d5) = (look(&mut fs, ROOT, "d0"), look(&mut fs, ROOT, "d5"));
    let a = fs.mkdir(d0, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
    let c = fs.mkdir(b, b"c", 0o755, 0, 0).unwrap().ino;
    fs.create(c, b"leaf", 0o644, 0, 0).unwrap();
    let base = fs.unmount().unwrap();
    let mut trees = Vec::new();
    for lazy in [true, false] {
        let (mut fs, _) = Fs::open(base.clone(), opts(lazy)).unwrap();
        let invalid = |r: Result<(), FsError>| matches!(r, Err(e) if e.to_string().contains("under itself"));
        // a under its own grandchild: refused; then a into d5, walked from d5 to the root.
        assert!(invalid(fs.rename(d0, b"a", c, b"a")), "lazy {lazy}: a moved under c");
        fs.rename(d0, b"a", d5, b"a").unwrap();
        if lazy {
            let s = fs.stats();
            assert!(s.groups_unread * 2 > s.groups, "the walks read most groups: {s:?}");
        }
        // b (made in a, a moved since) to the root; d5 under b; then b under a, which is under
        // d5 under b: refused, found through directories that were moved.
        fs.rename(a, b"b", ROOT, b"b").unwrap();
        fs.rename(ROOT, b"d5", b, b"d5").unwrap();
        assert!(invalid(fs.rename(ROOT, b"b", a, b"b")), "lazy {lazy}: b moved under a");
        let c = fs.check(true);
        assert!(c.clean(), "lazy {lazy}: {:?}", c.problems);
        let mut tree = Vec::new();
        for d in [ROOT, b, d5, a, c_of(&mut fs, b)] {
            let mut names: Vec<_> = fs.readdir(d).unwrap().into_iter().map(|e| e.name).collect();
            names.sort();
            tree.push(names);
        }
        trees.push(tree);
    }
    assert_eq!(trees[0], trees[1], "the tree, lazy and whole");
    assert!(trees[0][0].contains(&b"b".to_vec()) && !trees[0][0].contains(&b"d5".to_vec()));
}

/// The directory `c` under `b`.
fn c_of(fs: &mut Fs<RamNand>, b: Ino) -> Ino {
    fs.lookup(b, b"c").unwrap().ino
}
