//! Edges a user hit (issue 15, point 5): symlink targets up to PATH_MAX - 1, extended
//! attributes stored as nodes, and fallocate (reserve, keep size, punch a hole, zero a
//! range), each checked across a remount and with a power cut at every NAND operation.

mod common;

use std::collections::BTreeMap;

use bitmend_flashfs::{
    Compression, Falloc, Fs, FsError, FsOptions, XattrMode, LOGICAL_PAGE, ROOT, SYMLINK_MAX,
};
use bitmend_flashfs::{Corruption, PosixError};
use bitmend_media::campaign::{self, Schedule};
use bitmend_media::nand::{FaultyNand, RamNand};
use bitmend_media::rng::Rng;
use common::{cfg, chip};

fn opts() -> FsOptions {
    common::opts(Compression::Lz4)
}

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

fn remount<N: bitmend_media::nand::Nand>(fs: Fs<N>) -> Fs<N> {
    Fs::open(fs.unmount().unwrap(), opts()).unwrap().0
}

type Chip = FaultyNand<RamNand>;

/// Runs `work` on a copy of `base` with the power cut at each NAND operation in turn (the
/// shared campaign harness); after each cut, mounts what is left, checks it, and calls
/// `after(fs, op)`, `op` being the operation the power was cut at. Returns the number of cuts.
fn cut_everywhere(
    base: &RamNand,
    work: impl Fn(&mut Fs<&mut Chip>) -> Result<(), FsError>,
    after: impl Fn(&mut Fs<Chip>, u64),
) -> u64 {
    let base = FaultyNand::new(base.clone(), 0);
    let run = |chip: &mut Chip| Fs::open(chip, opts()).and_then(|(mut fs, _)| work(&mut fs)).is_ok();
    let c = campaign::run(&base, Schedule::Every, run, |chip, op| {
        let (mut fs, _) = Fs::open(chip, opts()).unwrap_or_else(|e| panic!("cut at op {op}: {e}"));
        let check = fs.check(true);
        assert!(check.clean(), "cut at op {op}: {:?}", check.problems);
        after(&mut fs, op);
    });
    c.cuts
}

/// NAND operations `work` takes on a copy of `base` (mount included) up to each point it
/// marks by returning: the count after the whole of it.
fn ops_of(base: &RamNand, work: impl Fn(&mut Fs<&mut FaultyNand<RamNand>>) -> Result<(), FsError>) -> u64 {
    let mut faulty = FaultyNand::new(base.clone(), 0);
    let (mut fs, _) = Fs::open(&mut faulty, opts()).unwrap();
    work(&mut fs).unwrap();
    drop(fs);
    faulty.ops()
}

#[test]
fn symlink_targets_up_to_4095_bytes_inline_or_as_data() {
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let lens = [1, 1024, 1025, 2048, 4000, SYMLINK_MAX];
    let target = |len: usize| -> Vec<u8> { (0..len).map(|i| b"abcdefgh/"[i % 9]).collect() };
    for len in lens {
        let s = fs.symlink(ROOT, format!("s{len}").as_bytes(), &target(len), 0, 0).unwrap();
        assert_eq!((s.size, fs.readlink(s.ino).unwrap()), (len as u64, target(len)));
    }
    assert!(matches!(
        fs.symlink(ROOT, b"long", &target(SYMLINK_MAX + 1), 0, 0),
        Err(FsError::Posix(PosixError::Invalid { .. }))
    ));
    // From the log (synced, then a crash: no unmount), then from a checkpoint.
    fs.sync().unwrap();
    let (mut fs, _) = Fs::open(fs.into_nand(), opts()).unwrap();
    for round in 0..2 {
        for len in lens {
            let s = fs.lookup(ROOT, format!("s{len}").as_bytes()).unwrap();
            assert_eq!(fs.readlink(s.ino).unwrap(), target(len), "round {round}, {len} bytes");
        }
        assert!(fs.check(true).clean(), "{:?}", fs.check(true).problems);
        fs = remount(fs);
    }
    // A long one removed gives its page back.
    let pages = fs.data_space();
    fs.unlink(ROOT, format!("s{SYMLINK_MAX}").as_bytes()).unwrap();
    assert!(fs.data_space().0 < pages.0);
    let mut fs = remount(fs);
    assert!(fs.check(true).clean());

    // A power cut at every operation of making six (targets that do not compress, two to
    // a sync): each there whole or not at all, and there once its sync returned.
    let base = Fs::format(chip(64), cfg(), opts()).unwrap().unmount().unwrap();
    let long = |k: usize| -> Vec<u8> { noise(k as u64, SYMLINK_MAX).iter().map(|b| b | 1).collect() };
    let work = |fs: &mut Fs<&mut FaultyNand<RamNand>>, made: usize| {
        for k in 0..made {
            fs.symlink(ROOT, format!("long{k}").as_bytes(), &long(k), 0, 0)?;
            if k % 2 == 1 {
                fs.sync()?;
            }
        }
        fs.sync()
    };
    let synced: Vec<u64> = (0..=6).map(|k| ops_of(&base, |fs| work(fs, k))).collect();
    let cuts = cut_everywhere(
        &base,
        |fs| work(fs, 6),
        |fs, op| {
            for k in 0..6 {
                match fs.lookup(ROOT, format!("long{k}").as_bytes()) {
                    Ok(s) => assert!(fs.readlink(s.ino).unwrap() == long(k), "cut at op {op}: long{k}"),
                    Err(FsError::Posix(PosixError::NotFound)) => {
                        assert!(op < synced[k + 1], "cut at op {op}: long{k} lost after its sync")
                    }
                    Err(e) => panic!("cut at op {op}: {e}"),
                }
            }
        },
    );
    assert!(cuts >= 10, "{cuts} cuts");
    eprintln!("long symlinks: {cuts} power cuts, each whole or absent after each, none lost once synced");
}

#[test]
fn extended_attributes_are_kept_by_the_log_and_the_checkpoint() {
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap();
    let room = fs.xattr_room();
    assert!(matches!(fs.getxattr(f.ino, b"user.none"), Err(FsError::Posix(PosixError::NoXattr))));
    let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for (name, value) in [
        (&b"user.mime_type"[..], &b"text/plain"[..]),
        (b"security.selinux", b"system_u:object_r:user_home_t:s0\0"),
        (b"trusted.md5", b""),
        (b"system.posix_acl_default", &[2, 0, 0, 0, 1, 0, 7, 0][..]),
    ] {
        fs.setxattr(f.ino, name, value, XattrMode::Any).unwrap();
        want.insert(name.to_vec(), value.to_vec());
    }
    fs.setxattr(d.ino, b"user.dir", &noise(1, 300), XattrMode::Create).unwrap();
    // XATTR_CREATE on one that exists, XATTR_REPLACE on one that does not, a bad name.
    assert!(matches!(
        fs.setxattr(d.ino, b"user.dir", b"x", XattrMode::Create),
        Err(FsError::Posix(PosixError::Exists))
    ));
    assert!(matches!(
        fs.setxattr(d.ino, b"user.new", b"x", XattrMode::Replace),
        Err(FsError::Posix(PosixError::NoXattr))
    ));
    assert!(matches!(
        fs.setxattr(f.ino, b"other.x", b"x", XattrMode::Any),
        Err(FsError::Posix(PosixError::Unsupported { .. }))
    ));
    assert!(matches!(
        fs.setxattr(f.ino, b"user.", b"x", XattrMode::Any),
        Err(FsError::Posix(PosixError::Unsupported { .. }))
    ));
    assert!(matches!(
        fs.setxattr(f.ino, &[b'u'; 256], b"x", XattrMode::Any),
        Err(FsError::Posix(PosixError::NameTooLong))
    ));
    // One value as large as the room allows; a byte more is refused and changes nothing.
    let used = 2 + want.iter().map(|(n, v)| 3 + n.len() + v.len()).sum::<usize>();
    let big = noise(2, room - used - 3 - b"user.big".len());
    fs.setxattr(f.ino, b"user.big", &big, XattrMode::Any).unwrap();
    want.insert(b"user.big".to_vec(), big.clone());
    let mut more = big.clone();
    more.push(0);
    assert!(matches!(
        fs.setxattr(f.ino, b"user.big", &more, XattrMode::Any),
        Err(FsError::Posix(PosixError::XattrTooBig { .. }))
    ));
    fs.removexattr(f.ino, b"trusted.md5").unwrap();
    want.remove(&b"trusted.md5"[..]);
    assert!(matches!(fs.removexattr(f.ino, b"trusted.md5"), Err(FsError::Posix(PosixError::NoXattr))));
    let check = |fs: &mut Fs<RamNand>, when: &str| {
        let names: Vec<Vec<u8>> = want.keys().cloned().collect();
        assert_eq!(fs.listxattr(f.ino).unwrap(), names, "{when}");
        for (n, v) in &want {
            assert_eq!(&fs.getxattr(f.ino, n).unwrap(), v, "{when}");
        }
        assert_eq!(fs.getxattr(d.ino, b"user.dir").unwrap(), noise(1, 300), "{when}");
    };
    // Replayed from the log after a crash, then from a checkpoint; a chmod (an inode node
    // after them) keeps them.
    fs.sync().unwrap();
    let (mut fs, _) = Fs::open(fs.into_nand(), opts()).unwrap();
    check(&mut fs, "replayed");
    fs.setattr(f.ino, bitmend_flashfs::SetAttr { perm: Some(0o600), ..Default::default() }).unwrap();
    fs.sync().unwrap();
    let (mut fs, _) = Fs::open(fs.into_nand(), opts()).unwrap();
    check(&mut fs, "after a chmod");
    let mut fs = remount(fs);
    check(&mut fs, "from the checkpoint");
    // They go with their file.
    fs.unlink(ROOT, b"f").unwrap();
    let g = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    assert_eq!(fs.listxattr(g.ino).unwrap(), Vec::<Vec<u8>>::new());
    let mut fs = remount(fs);
    assert!(fs.check(true).clean());

    // A power cut at every operation of two synced changes: each is there whole or not.
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let base = fs.unmount().unwrap();
    let first = |fs: &mut Fs<&mut FaultyNand<RamNand>>| {
        fs.setxattr(f, b"user.a", &noise(3, 1000), XattrMode::Any)?;
        // Other work around it: the attribute's node shares pages with file data.
        fs.write(f, 0, &noise(5, 20_000))?;
        fs.sync()
    };
    let both = |fs: &mut Fs<&mut FaultyNand<RamNand>>| {
        first(fs)?;
        fs.setxattr(f, b"user.b", &noise(4, 500), XattrMode::Any)?;
        fs.write(f, 20_000, &noise(6, 20_000))?;
        fs.removexattr(f, b"user.a")?;
        fs.sync()
    };
    let (one, two) = (ops_of(&base, first), ops_of(&base, both));
    let cuts = cut_everywhere(&base, both, |fs, op| {
        let names = fs.listxattr(f).unwrap();
        let states: [&[&[u8]]; 4] = [&[], &[b"user.a"], &[b"user.a", b"user.b"], &[b"user.b"]];
        let at = states.iter().position(|s| names.iter().map(|n| &n[..]).eq(s.iter().copied()));
        let at = at.unwrap_or_else(|| panic!("cut at op {op}: {names:?}"));
        assert!(op < one || at >= 1, "cut at op {op}: the first sync's attribute is gone");
        assert!(op < two || at == 3, "cut at op {op}");
        if at == 1 || at == 2 {
            assert_eq!(fs.getxattr(f, b"user.a").unwrap(), noise(3, 1000), "cut at op {op}");
        }
    });
    assert!(cuts >= 10, "{cuts} cuts");
    eprintln!("extended attributes: {cuts} power cuts, every change whole or absent after each");
}

#[test]
fn fallocate_reserves_punches_and_zeroes() {
    let page = LOGICAL_PAGE as u64;
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let (_, free) = fs.statfs();
    // Mode 0: the size grows and the space is held.
    fs.fallocate(f, 0, 64 * page, Falloc::Reserve { keep_size: false }).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 64 * page);
    let (_, held) = fs.statfs();
    assert!(free - held >= 64 * page, "{free} free before, {held} after");
    // KEEP_SIZE: held, size kept.
    let g = fs.create(ROOT, b"g", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(g, 0, 32 * page, Falloc::Reserve { keep_size: true }).unwrap();
    assert_eq!(fs.getattr(g).unwrap().size, 0);
    // More than is free: refused, nothing changed.
    let (_, before) = fs.statfs();
    assert!(matches!(
        fs.fallocate(g, 0, 1 << 40, Falloc::Reserve { keep_size: false }),
        Err(FsError::NoSpace)
    ));
    assert_eq!((fs.statfs().1, fs.getattr(g).unwrap().size), (before, 0));
    // Another file fills the chip: the reserved ranges still take their writes.
    let h = fs.create(ROOT, b"h", 0o644, 0, 0).unwrap().ino;
    let mut filled = 0u64;
    loop {
        match fs.write(h, filled, &noise(filled, 16 << 10)) {
            Ok(_) => filled += 16 << 10,
            Err(FsError::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
    }
    let data = noise(7, 64 * LOGICAL_PAGE);
    fs.write(f, 0, &data).unwrap();
    fs.write(g, 0, &data[..32 * LOGICAL_PAGE]).unwrap();
    fs.sync().unwrap();
    assert!(matches!(fs.write(h, filled, &noise(1, 16 << 10)), Err(FsError::NoSpace)));
    // Punch pages 10.5 to 20.25 of f: zeros there, the size kept, whole pages given back.
    let stored = fs.data_space().0;
    let (from, to) = (10 * page + page / 2, 20 * page + page / 4);
    fs.fallocate(f, from, to - from, Falloc::PunchHole).unwrap();
    let mut want = data.clone();
    want[from as usize..to as usize].fill(0);
    assert!(fs.read(f, 0, want.len()).unwrap() == want);
    assert_eq!(fs.getattr(f).unwrap().size, 64 * page);
    assert!(fs.data_space().0 <= stored - 9 * page, "{} logical bytes, {stored} before", fs.data_space().0);
    // Zero a range of g past its end: zeros, and the size grows to it.
    fs.fallocate(g, 30 * page + 7, 4 * page, Falloc::ZeroRange { keep_size: false }).unwrap();
    let mut want_g = data[..32 * LOGICAL_PAGE].to_vec();
    want_g.resize(34 * LOGICAL_PAGE + 7, 0);
    want_g[30 * LOGICAL_PAGE + 7..].fill(0);
    assert!(fs.read(g, 0, 1 << 20).unwrap() == want_g);
    // The punch and the zeroing hold after a crash (replayed punch nodes) and a remount.
    fs.fsync(f).unwrap();
    fs.fsync(g).unwrap();
    let (mut fs, _) = Fs::open(fs.into_nand(), opts()).unwrap();
    for round in 0..2 {
        assert!(fs.read(f, 0, want.len()).unwrap() == want, "round {round}");
        assert!(fs.read(g, 0, 1 << 20).unwrap() == want_g, "round {round}");
        assert!(fs.check(true).clean(), "{:?}", fs.check(true).problems);
        fs = remount(fs);
    }
    // Not a regular file, an empty range: refused.
    assert!(matches!(fs.fallocate(ROOT, 0, 1, Falloc::PunchHole), Err(FsError::Posix(PosixError::IsDir))));
    assert!(matches!(
        fs.fallocate(f, 0, 0, Falloc::PunchHole),
        Err(FsError::Posix(PosixError::Invalid { .. }))
    ));

    // A power cut at every operation of a punch after synced data: the range is the data or
    // zeros, page by page, and zeros once the sync returned.
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let data = noise(9, 40 * LOGICAL_PAGE);
    fs.write(f, 0, &data).unwrap();
    let base = fs.unmount().unwrap();
    let work = |fs: &mut Fs<&mut FaultyNand<RamNand>>| {
        // Edges in the middle of pages 5 and 34: rewritten in part, pages 6 to 33 dropped.
        fs.fallocate(f, 5 * page + 100, 29 * page, Falloc::PunchHole)?;
        fs.sync()
    };
    let synced = ops_of(&base, work);
    let cuts = cut_everywhere(&base, work, |fs, op| {
        let got = fs.read(f, 0, data.len()).unwrap();
        for (i, (g, d)) in got.chunks(LOGICAL_PAGE).zip(data.chunks(LOGICAL_PAGE)).enumerate() {
            // What the page holds once punched: zeros from byte 100 of page 5 to byte 100
            // of page 34.
            let mut p = d.to_vec();
            match i {
                5 => p[100..].fill(0),
                6..=33 => p.fill(0),
                34 => p[..100].fill(0),
                _ => {}
            }
            assert!(g == d || g == p, "cut at op {op}: page {i}");
            assert!(op < synced || g == p, "cut at op {op}: page {i} after the sync");
        }
    });
    assert!(cuts >= 4, "{cuts} cuts");
    eprintln!("fallocate: reserved ranges written on a full chip, punch and zero range replayed; {cuts} power cuts in a punch");
}

#[test]
fn a_long_symlink_whose_target_page_is_lost_is_an_error_not_other_bytes() {
    let mut fs = Fs::format(common::faulty_chip(64, 3), cfg(), opts()).unwrap();
    let target: Vec<u8> = noise(11, SYMLINK_MAX).iter().map(|b| b | 1).collect();
    let s = fs.symlink(ROOT, b"long", &target, 0, 0).unwrap();
    fs.sync().unwrap();
    let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
    // The target's data page, lost with enough of its group and stripe that parity cannot
    // rebuild it (3 pages lost).
    let page = common::pages_with(&mut fs, 3, s.ino.0, Some(0))[0];
    common::lose_beyond_repair(&mut fs, page);
    assert!(
        matches!(fs.readlink(s.ino), Err(FsError::Corrupt(Corruption::Unrecoverable { .. }))),
        "{:?}",
        fs.readlink(s.ino)
    );
    // It can still be removed, and the file system checks clean after.
    fs.unlink(ROOT, b"long").unwrap();
    let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
    assert!(fs.check(true).clean(), "{:?}", fs.check(true).problems);
}

/// Dropping an executable's privileges (what a write by an unprivileged caller does, done by
/// the mount for the kernel): set-user-ID goes; set-group-ID goes only with group execute
/// (without it, it marks mandatory locking and stays); `security.capability` goes, other
/// attributes stay; nothing else changes, and it holds after a remount.
#[test]
fn dropping_privileges_clears_setuid_setgid_with_group_execute_and_the_capability() {
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let cases: [(&[u8], u16, u16); 4] =
        [(b"a", 0o6755, 0o0755), (b"b", 0o6745, 0o2745), (b"c", 0o4700, 0o0700), (b"d", 0o0644, 0o0644)];
    let mut inos = Vec::new();
    for (name, mode, _) in cases {
        let f = fs.create(ROOT, name, mode, 7, 8).unwrap();
        fs.setxattr(f.ino, b"security.capability", b"\x01\x00\x00\x02", XattrMode::Any).unwrap();
        fs.setxattr(f.ino, b"user.keep", b"yes", XattrMode::Any).unwrap();
        fs.write(f.ino, 0, b"#!/bin/sh\n").unwrap();
        inos.push(f.ino);
    }
    for &ino in &inos {
        fs.drop_privileges(ino).unwrap();
    }
    let (mut fs, _) = Fs::open(fs.unmount().unwrap(), opts()).unwrap();
    for ((name, _, want), ino) in cases.iter().zip(&inos) {
        let a = fs.getattr(*ino).unwrap();
        assert_eq!(a.perm, *want, "{}", String::from_utf8_lossy(name));
        assert_eq!((a.uid, a.gid, a.size), (7, 8, 10));
        assert!(matches!(
            fs.getxattr(*ino, b"security.capability"),
            Err(FsError::Posix(PosixError::NoXattr))
        ));
        assert_eq!(fs.getxattr(*ino, b"user.keep").unwrap(), b"yes");
    }
}
