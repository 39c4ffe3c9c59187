//! The region backends behave alike, and the faults land where they say.

use bitmend_media::pmem::{
    flush_instruction, MmapRegion, Persistence, ProtectedRegion, RamRegion, Region, RegionError, RegionFault,
    RegionFaults,
};

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("bitmend-pmem-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

/// The same sequence of stores on any region gives the same bytes.
fn exercise(r: &mut dyn Region) -> Vec<u8> {
    assert_eq!(r.len(), 10_000);
    r.write(0, b"hello").unwrap();
    r.write(4095, &[1, 2, 3]).unwrap(); // across a page boundary
    r.write_u64(8192, 0xDEAD_BEEF).unwrap();
    r.persist(0, 10_000).unwrap();
    r.fence().unwrap();
    assert!(matches!(r.write(9999, &[0, 0]), Err(RegionError::Range { .. })));
    assert!(matches!(r.persist(usize::MAX, 2), Err(RegionError::Range { .. })));
    assert_eq!(r.read_u64(8192).unwrap(), 0xDEAD_BEEF);
    let mut b = [0u8; 5];
    r.read(0, &mut b).unwrap();
    assert_eq!(&b, b"hello");
    assert_eq!(r.line_writes()[0], 1);
    assert_eq!(r.line_writes()[63], 1);
    assert_eq!(r.line_writes()[64], 1);
    r.bytes().to_vec()
}

#[test]
fn ram_mmap_and_protected_regions_agree() {
    let mut ram = RamRegion::new(10_000);
    let want = exercise(&mut ram);
    let mut prot = ProtectedRegion::new(10_000).unwrap();
    assert_eq!(exercise(&mut prot), want);
    for mode in [Persistence::Msync, Persistence::CacheLineFlush] {
        let path = temp_path(&format!("{mode:?}.pmem"));
        {
            let mut m = MmapRegion::create(&path, 10_000).unwrap().with_persistence(mode).with_line_counts();
            assert_eq!(m.persistence(), mode);
            assert_eq!(exercise(&mut m), want, "{mode:?}");
        }
        // Reopened, the file holds what was stored.
        let m = MmapRegion::open(&path).unwrap();
        assert_eq!(m.bytes(), &want[..], "{mode:?} (flush instruction: {})", flush_instruction());
        assert!(m.line_writes().is_empty(), "a region counts lines only when asked to");
        drop(m);
        std::fs::remove_file(&path).unwrap();
    }
}

/// A region's file is reserved whole when made (not a sparse file whose first store into a
/// hole could find the file system full and die of SIGBUS), and a region the host cannot
/// hold is refused with an error and leaves no file behind.
#[test]
fn a_new_region_is_reserved_whole_or_refused() {
    use std::os::unix::fs::MetadataExt;
    let path = temp_path("reserved.pmem");
    let len = 8 << 20;
    let m = MmapRegion::create(&path, len).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), len as u64);
    assert!(meta.blocks() * 512 >= len as u64, "{} bytes allocated of {len}", meta.blocks() * 512);
    drop(m);
    std::fs::remove_file(&path).unwrap();
    // A GiB more than the temporary file system has free.
    let df = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path.parent().unwrap())
        .output()
        .expect("df runs");
    let free: usize = String::from_utf8_lossy(&df.stdout).lines().nth(1).unwrap().trim().parse().unwrap();
    let huge = (free + (1 << 30)).next_multiple_of(4096);
    let err = MmapRegion::create(&path, huge).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("reserving"), "{err}");
    assert!(!path.exists(), "a refused region leaves no file");
}

#[test]
fn an_ordinary_file_is_not_dax_and_defaults_to_msync() {
    let path = temp_path("plain.pmem");
    let m = MmapRegion::create(&path, 4096).unwrap();
    // /tmp is tmpfs or a disk file system here, never DAX.
    assert!(!m.is_dax());
    assert_eq!(m.persistence(), Persistence::Msync);
    assert!(MmapRegion::open(&path).is_err(), "a mapped file is locked");
    drop(m);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_protected_region_is_read_only_between_stores() {
    let mut p = ProtectedRegion::new(8192).unwrap();
    p.write(5000, &[42; 10]).unwrap();
    assert_eq!(&p.bytes()[5000..5010], &[42; 10]);
    // A direct store would fault; check the protection through /proc instead of crashing.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let base = p.bytes().as_ptr() as usize;
    let line = maps
        .lines()
        .find(|l| {
            let range = l.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let (a, b) = (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(b, 16).unwrap());
            (a..b).contains(&base)
        })
        .expect("mapping listed");
    assert!(line.split_whitespace().nth(1).unwrap().starts_with("r-"), "{line}");
}

#[test]
fn wild_writes_change_every_byte_they_hit_and_nothing_else() {
    let mut r = RamRegion::new(64 * 1024);
    let orig: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    r.write(0, &orig).unwrap();
    let mut f = RegionFaults::new(77);
    let mut hit = vec![false; orig.len()];
    for _ in 0..200 {
        let RegionFault::WildWrite { offset, len } = f.wild_write(&mut r, 1000..60_000, 300).unwrap() else {
            unreachable!()
        };
        assert!(offset >= 1000 && offset + len <= 60_000 && (1..=300).contains(&len));
        hit[offset..offset + len].iter_mut().for_each(|h| *h = true);
    }
    assert_eq!(f.faults().len(), 200);
    for (i, (&now, &was)) in r.bytes().iter().zip(&orig).enumerate() {
        if !hit[i] {
            assert_eq!(now, was, "byte {i} changed but no wild write hit it");
        }
    }
    // A single wild write changes every byte in its range.
    let before = r.bytes().to_vec();
    f.wild_write_at(&mut r, 100, 50).unwrap();
    assert!((100..150).all(|i| r.bytes()[i] != before[i]));
}

#[test]
fn bit_flips_on_demand_and_at_a_rate() {
    let mut r = RamRegion::new(4096);
    let mut f = RegionFaults::new(5);
    let bits = f.flip_bits(&mut r, 1024..2048, 100).unwrap();
    assert_eq!(bits.len(), 100);
    let ones: u32 = r.bytes().iter().map(|b| b.count_ones()).sum();
    assert_eq!(ones, 100);
    assert!(r.bytes()[..1024].iter().chain(&r.bytes()[2048..]).all(|&b| b == 0));

    let mut big = RamRegion::new(1 << 20);
    let flipped = f.decay(&mut big, 0..1 << 20, 1e-4).unwrap();
    let ones: u64 = big.bytes().iter().map(|b| b.count_ones() as u64).sum();
    assert_eq!(ones, flipped.len() as u64);
    let expected = (8u64 << 20) as f64 * 1e-4; // 838.9
    assert!((ones as f64 - expected).abs() < 5.0 * expected.sqrt(), "{ones} flips, expected {expected}");
    // Media damage bypasses the store counters.
    assert!(big.line_writes().iter().all(|&c| c == 0));
}

#[test]
fn region_faults_replay_from_the_seed() {
    let run = |seed| {
        let mut r = RamRegion::new(8192);
        let mut f = RegionFaults::new(seed);
        f.wild_write(&mut r, 0..8192, 100).unwrap();
        f.flip_bits(&mut r, 0..8192, 10).unwrap();
        (r.bytes().to_vec(), f.faults().to_vec())
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn streaming_stores_match_plain_stores_at_every_alignment() {
    // The non-temporal path (MOVNTDQ for 16-byte aligned pairs of words, MOVNTI for a lone
    // word, ordinary stores and flushes for the ragged ends) against plain stores into RAM,
    // for every start alignment and every length to 45, and longer ones.
    let path = temp_path("stream.pmem");
    let mut want = RamRegion::new(8192);
    {
        let mut m = MmapRegion::create(&path, 8192).unwrap().with_persistence(Persistence::CacheLineFlush);
        let mut at = 0;
        for align in 0..16 {
            for len in (0..45).chain([64, 100, 255, 1000]) {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + align * 13 + 1) as u8).collect();
                let off = at + align;
                m.write_streaming(off, &data).unwrap();
                want.write(off, &data).unwrap();
                at += len.next_multiple_of(64).max(64);
                if at + 1100 > 8192 {
                    at = 0;
                }
            }
        }
        m.fence().unwrap();
        assert_eq!(m.bytes(), want.bytes());
        assert!(m.write_streaming(8190, &[1, 2, 3]).is_err());
    }
    let m = MmapRegion::open(&path).unwrap();
    assert_eq!(m.bytes(), want.bytes(), "streamed bytes reached the file");
    drop(m);
    std::fs::remove_file(&path).unwrap();
}

/// A reader's private copy: its stores never reach the file, readers share the file with
/// each other, and a writer waits for them (or fails at once without a wait).
#[test]
fn private_readers_share_the_file_and_never_write_it() {
    use std::time::{Duration, Instant};
    let path = temp_path("private.pool");
    {
        let mut w = MmapRegion::create(&path, 8192).unwrap();
        w.write(100, b"kept").unwrap();
        w.persist(100, 4).unwrap();
    }
    let mut a = MmapRegion::open_private(&path, Duration::ZERO).unwrap();
    let b = MmapRegion::open_private(&path, Duration::ZERO).unwrap();
    assert_eq!(a.persistence(), Persistence::Private);
    a.write(100, b"lost").unwrap();
    a.persist(100, 4).unwrap();
    assert_eq!(&a.bytes()[100..104], b"lost", "the reader sees its own stores");
    assert_eq!(&b.bytes()[100..104], b"kept", "another reader does not");
    assert_eq!(&std::fs::read(&path).unwrap()[100..104], b"kept", "nor does the file");
    // A writer is refused while readers hold the file, and waits for them when asked to.
    let e = MmapRegion::open(&path).unwrap_err().to_string();
    assert!(e.contains("in use by another process"), "{e}");
    let t = Instant::now();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        drop((a, b));
    });
    let w = MmapRegion::open_waiting(&path, Duration::from_secs(10)).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(140), "the writer waited for the readers");
    release.join().unwrap();
    // A reader waits for the writer in turn, and gives up after its wait.
    let e = MmapRegion::open_private(&path, Duration::from_millis(50)).unwrap_err().to_string();
    assert!(e.contains("waited"), "{e}");
    drop(w);
    // A read-only file can be read (and its copy written) by a reader.
    let mut perm = std::fs::metadata(&path).unwrap().permissions();
    perm.set_readonly(true);
    std::fs::set_permissions(&path, perm).unwrap();
    let mut r = MmapRegion::open_private(&path, Duration::ZERO).unwrap();
    r.write(0, b"x").unwrap();
    assert_eq!(&r.bytes()[100..104], b"kept");
}
