//! The crash simulation: persisted bytes always survive; unpersisted lines are lost or kept,
//! each by its own draw; aligned 8-byte stores are never torn.

use bitmend_media::pmem::{CrashGranularity, CrashPoint, CrashRegion, Region, RegionError, LINE};

#[test]
fn persisted_bytes_survive_every_crash() {
    for seed in 0..50 {
        let mut r = CrashRegion::new(4096);
        let data: Vec<u8> = (0..1000).map(|i| (i * 13 + seed) as u8).collect();
        r.write(100, &data).unwrap();
        r.persist(100, data.len()).unwrap();
        r.write(2000, &[7; 300]).unwrap(); // not persisted
        r.crash(seed as u64);
        assert_eq!(&r.bytes()[100..1100], &data[..]);
    }
}

#[test]
fn unpersisted_lines_are_lost_or_kept_whole_each_by_its_own_draw() {
    let lines = 64;
    let (mut all_lost, mut all_kept, mut mixed) = (0, 0, 0);
    let mut kept_total = 0u64;
    for seed in 0..200u64 {
        let mut r = CrashRegion::new(lines * LINE);
        r.write(0, &vec![0xAB; lines * LINE]).unwrap();
        let report = r.crash(seed);
        assert_eq!(report.dirty, lines as u64);
        assert_eq!(report.kept + report.lost, lines as u64);
        let mut kept = 0;
        for l in 0..lines {
            let line = &r.bytes()[l * LINE..(l + 1) * LINE];
            // Line granularity: a line is all old or all new.
            assert!(line.iter().all(|&b| b == 0xAB) || line.iter().all(|&b| b == 0), "torn line {l}");
            kept += (line[0] == 0xAB) as usize;
        }
        assert_eq!(kept as u64, report.kept);
        kept_total += report.kept;
        match kept {
            0 => all_lost += 1,
            k if k == lines => all_kept += 1,
            _ => mixed += 1,
        }
    }
    assert_eq!((all_lost, all_kept), (0, 0), "64 independent draws are never unanimous here");
    assert_eq!(mixed, 200);
    let frac = kept_total as f64 / (200.0 * lines as f64);
    assert!((frac - 0.5).abs() < 0.03, "keep fraction {frac}");
}

#[test]
fn keep_probability_zero_and_one_are_the_two_extremes() {
    let mut lost = CrashRegion::new(1024).with_crash_model(CrashGranularity::Line, 0.0);
    lost.write(0, &[1; 1024]).unwrap();
    lost.crash(1);
    assert!(lost.bytes().iter().all(|&b| b == 0));
    let mut kept = CrashRegion::new(1024).with_crash_model(CrashGranularity::Line, 1.0);
    kept.write(0, &[1; 1024]).unwrap();
    kept.crash(1);
    assert!(kept.bytes().iter().all(|&b| b == 1));
}

#[test]
fn later_stores_are_not_ordered_after_earlier_ones() {
    // The NVMalloc hazard: write the data, then the pointer to it, persist neither; a crash can
    // keep the pointer and lose the data. The simulation must produce that outcome.
    let mut seen_pointer_without_data = false;
    for seed in 0..64 {
        let mut r = CrashRegion::new(4096);
        r.write(1024, &[0xDD; 64]).unwrap(); // data, line 16
        r.write_u64(0, 1024).unwrap(); // pointer, line 0
        r.crash(seed);
        if r.read_u64(0).unwrap() == 1024 && r.bytes()[1024] == 0 {
            seen_pointer_without_data = true;
        }
    }
    assert!(seen_pointer_without_data);
}

#[test]
fn aligned_8_byte_stores_are_never_torn_at_word_granularity() {
    for seed in 0..300u64 {
        let mut r = CrashRegion::new(512).with_crash_model(CrashGranularity::Word, 0.5);
        let old = 0x1111_1111_1111_1111u64;
        for w in 0..64 {
            r.write_u64(w * 8, old).unwrap();
        }
        r.persist(0, 512).unwrap();
        let new = 0xEEEE_EEEE_EEEE_EEEEu64;
        for w in 0..64 {
            r.write_u64(w * 8, new ^ w as u64).unwrap();
        }
        // A 40-byte store spanning five words can tear between words.
        r.write(8 * 60, &[0x77; 32]).unwrap();
        r.crash(seed);
        for w in 0..60 {
            let v = r.read_u64(w * 8).unwrap();
            assert!(v == old || v == new ^ w as u64, "word {w} torn: {v:#x}");
        }
        for w in 60..64 {
            let v = r.read_u64(w * 8).unwrap();
            assert!(v == old || v == 0x7777_7777_7777_7777, "word {w} torn: {v:#x}");
        }
    }
}

#[test]
fn word_granularity_tears_a_multi_word_store_line_granularity_does_not() {
    let torn = |g: CrashGranularity| {
        (0..200u64).any(|seed| {
            let mut r = CrashRegion::new(64).with_crash_model(g, 0.5);
            r.write(0, &[0xFF; 64]).unwrap();
            r.crash(seed);
            let ones = r.bytes().iter().filter(|&&b| b == 0xFF).count();
            ones != 0 && ones != 64
        })
    };
    assert!(torn(CrashGranularity::Word));
    assert!(!torn(CrashGranularity::Line));
}

#[test]
fn a_misaligned_u64_store_is_refused() {
    let mut r = CrashRegion::new(64);
    assert!(matches!(r.write_u64(4, 1), Err(RegionError::Misaligned { offset: 4, align: 8 })));
}

#[test]
fn persist_covers_every_line_the_range_touches() {
    let mut r = CrashRegion::new(256).with_crash_model(CrashGranularity::Line, 0.0);
    r.write(60, &[9; 10]).unwrap(); // lines 0 and 1
    r.write(200, &[8; 4]).unwrap(); // line 3
    r.persist(63, 2).unwrap(); // touches lines 0 and 1 only
    r.crash(0);
    assert_eq!(&r.bytes()[60..70], &[9; 10]);
    assert_eq!(&r.bytes()[200..204], &[0; 4], "line 3 was never persisted");
}

#[test]
fn an_armed_crash_at_a_fence_stops_everything_until_reboot() {
    let mut r = CrashRegion::new(1024).with_crash_model(CrashGranularity::Line, 0.0);
    r.arm_crash(CrashPoint::Fence(1));
    r.write(0, &[1; 8]).unwrap();
    r.persist(0, 8).unwrap(); // fence 0 completes
    r.write(64, &[2; 8]).unwrap();
    assert!(matches!(r.persist(64, 8), Err(RegionError::PowerLost))); // fence 1: the crash
    assert!(!r.powered());
    assert!(matches!(r.write(128, &[3; 8]), Err(RegionError::PowerLost)));
    assert!(matches!(r.persist(0, 8), Err(RegionError::PowerLost)));
    assert_eq!(r.fences(), 2);
    r.crash(9);
    assert!(r.powered());
    assert_eq!(&r.bytes()[0..8], &[1; 8]);
    assert_eq!(&r.bytes()[64..72], &[0; 8], "the crashing persist made nothing durable");
    r.write(128, &[3; 8]).unwrap();
}

#[test]
fn an_armed_crash_at_a_store_keeps_that_store_to_the_draw() {
    let mut kept = 0;
    for seed in 0..100 {
        let mut r = CrashRegion::new(256);
        r.arm_crash(CrashPoint::Store(2));
        r.write(0, &[1]).unwrap();
        r.write(64, &[2]).unwrap();
        assert!(matches!(r.write(128, &[3]), Err(RegionError::PowerLost)));
        r.crash(seed);
        kept += (r.bytes()[128] == 3) as u32;
    }
    assert!((20..80).contains(&kept), "the store in flight is kept about half the time: {kept}");
}

#[test]
fn crash_image_does_not_change_the_region_and_replays_from_its_seed() {
    let mut r = CrashRegion::new(4096);
    r.write(0, &[5; 4096]).unwrap();
    let (a, ra) = r.crash_image(42);
    let (b, rb) = r.crash_image(42);
    let (c, _) = r.crash_image(43);
    assert_eq!((a.clone(), ra), (b, rb));
    assert_ne!(a, c);
    assert_eq!(r.dirty_lines(), 64);
    assert!(r.bytes().iter().all(|&x| x == 5));
}

#[test]
fn line_write_counters_count_stores_per_line() {
    let mut r = CrashRegion::new(256);
    r.write(0, &[1; 8]).unwrap();
    r.write(60, &[1; 8]).unwrap();
    r.write(130, &[1; 1]).unwrap();
    assert_eq!(r.line_writes(), &[2, 1, 1, 0]);
}

#[test]
fn a_flush_without_a_fence_guarantees_nothing() {
    let mut kept = 0;
    for seed in 0..100 {
        let mut r = CrashRegion::new(128);
        r.write(0, &[1; 8]).unwrap();
        r.flush(0, 8).unwrap();
        r.crash(seed);
        kept += (r.bytes()[0] == 1) as u32;
    }
    assert!((20..80).contains(&kept), "flushed but unfenced lines are a draw: kept {kept} of 100");
    // The fence makes every flushed line durable, and only those.
    let mut r = CrashRegion::new(256).with_crash_model(CrashGranularity::Line, 0.0);
    r.write(0, &[1; 8]).unwrap();
    r.write(64, &[2; 8]).unwrap();
    r.write(128, &[3; 8]).unwrap();
    r.flush(0, 8).unwrap();
    r.flush(128, 8).unwrap();
    r.fence().unwrap();
    r.crash(0);
    assert_eq!((r.bytes()[0], r.bytes()[64], r.bytes()[128]), (1, 0, 3));
}

#[test]
fn update_is_a_store_in_place() {
    let mut r = CrashRegion::new(256).with_crash_model(CrashGranularity::Line, 0.0);
    r.write(10, &[5; 4]).unwrap();
    r.persist(0, 64).unwrap();
    r.update(10, 4, &mut |b| b.iter_mut().for_each(|x| *x ^= 3)).unwrap();
    assert_eq!(&r.bytes()[10..14], &[6; 4]);
    assert_eq!(r.line_writes()[0], 2);
    r.crash(1);
    assert_eq!(&r.bytes()[10..14], &[5; 4], "the update was not persisted");
}
