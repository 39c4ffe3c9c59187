//! Each NAND fault fires as specified, is recorded, and replays exactly from its seed.

use bitmend_media::nand::{
    Area, Endurance, FaultyNand, Geometry, Nand, NandError, NandFault, RamNand, RawAccess, WearOut,
};

fn small() -> Geometry {
    Geometry::new(512, 16, 8, 16).unwrap()
}

fn chip(seed: u64) -> FaultyNand<RamNand> {
    FaultyNand::new(RamNand::new(small()).unwrap(), seed)
}

fn data(seed: u8) -> (Vec<u8>, Vec<u8>) {
    let g = small();
    (
        (0..g.page_size).map(|i| (i as u8) ^ seed).collect(),
        (0..g.spare_size).map(|i| (i as u8) + seed).collect(),
    )
}

fn raw(n: &mut FaultyNand<RamNand>, page: u32) -> Vec<u8> {
    let mut d = vec![0; 512];
    let mut s = vec![0; 16];
    n.read_page(page, &mut d, &mut s).unwrap();
    d.extend(s);
    d
}

fn differing_bits(a: &[u8], b: &[u8]) -> Vec<u32> {
    let mut v = Vec::new();
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        for bit in 0..8 {
            if (x ^ y) >> bit & 1 == 1 {
                v.push(i as u32 * 8 + bit);
            }
        }
    }
    v
}

#[test]
fn on_demand_bit_flips_change_exactly_the_recorded_bits_and_persist() {
    for n_bits in [1u32, 7, 100, 1000, 4000] {
        let mut n = chip(11);
        let (d, s) = data(1);
        n.program(2, &d, &s).unwrap();
        let before = raw(&mut n, 2);
        let mut bits = n.flip_bits(2, n_bits).unwrap();
        assert_eq!(bits.len(), n_bits as usize);
        let after = raw(&mut n, 2);
        bits.sort();
        assert_eq!(differing_bits(&before, &after), bits, "{n_bits} flips");
        assert_eq!(raw(&mut n, 2), after, "flips persist across reads");
        assert_eq!(n.faults().len(), 1);
        let mut recorded = n.faults()[0].clone().bits();
        recorded.sort();
        assert_eq!(recorded, bits, "the record names the flipped bits");
        // An erase clears them.
        n.erase(0).unwrap();
        assert!(raw(&mut n, 2).iter().all(|&b| b == 0xFF));
    }
}

trait Bits {
    fn bits(self) -> Vec<u32>;
}
impl Bits for NandFault {
    fn bits(self) -> Vec<u32> {
        match self {
            NandFault::BitFlips { bits, .. } | NandFault::ReadDisturb { bits, .. } => bits,
            _ => panic!("not a flip"),
        }
    }
}

#[test]
fn faults_replay_exactly_from_the_seed_and_differ_across_seeds() {
    let run = |seed| {
        let mut n = chip(seed);
        let (d, s) = data(3);
        n.program(0, &d, &s).unwrap();
        n.flip_bits(0, 50).unwrap();
        n.lose_page(9).unwrap();
        n.set_read_disturb(1e-3);
        for _ in 0..20 {
            raw(&mut n, 0);
        }
        (n.faults().to_vec(), raw(&mut n, 0), raw(&mut n, 9))
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5).0, run(6).0);
}

#[test]
fn flips_restricted_to_the_data_or_spare_area() {
    let mut n = chip(2);
    let data_bits = n.flip_bits_in(0, 100, Area::Data).unwrap();
    assert!(data_bits.iter().all(|&b| b < 512 * 8));
    let spare_bits = n.flip_bits_in(1, 100, Area::Spare).unwrap();
    assert!(spare_bits.iter().all(|&b| (512 * 8..528 * 8).contains(&b)));
}

#[test]
fn read_disturb_flips_at_the_configured_rate() {
    let mut n = chip(8);
    let rate = 1e-4;
    n.set_read_disturb(rate);
    let reads = 2000;
    for i in 0..reads {
        raw(&mut n, i % 128);
    }
    let flipped: usize = n.faults().iter().map(|f| f.clone().bits().len()).sum();
    let expected = reads as f64 * 528.0 * 8.0 * rate; // 844.8
    assert!(
        (flipped as f64 - expected).abs() < 5.0 * expected.sqrt(),
        "flipped {flipped}, expected {expected}"
    );
    // What the record says is what the cells hold: the flips recorded for page 0 are
    // exactly the bits where page 0 differs from erased.
    let mut on_page0: Vec<u32> = n
        .faults()
        .iter()
        .filter_map(|f| match f {
            NandFault::ReadDisturb { page: 0, bits } => Some(bits.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    n.set_read_disturb(0.0);
    let now = raw(&mut n, 0);
    let mut odd = std::collections::BTreeMap::new();
    for b in on_page0.drain(..) {
        *odd.entry(b).or_insert(0u32) += 1;
    }
    let expect: Vec<u32> = odd.into_iter().filter(|(_, c)| c % 2 == 1).map(|(b, _)| b).collect();
    assert_eq!(differing_bits(&[0xFF; 528], &now), expect);
}

#[test]
fn a_lost_page_reads_back_as_garbage() {
    let mut n = chip(4);
    let (d, s) = data(9);
    n.program(5, &d, &s).unwrap();
    n.lose_page(5).unwrap();
    let got = raw(&mut n, 5);
    let mut want = d.clone();
    want.extend(&s);
    let same = got.iter().zip(&want).filter(|(a, b)| a == b).count();
    assert!(same < 30, "a lost page keeps about 1/256 of its bytes by chance, kept {same}");
    assert_eq!(n.faults(), &[NandFault::LostPage { page: 5 }]);
}

#[test]
fn stuck_bits_reappear_after_every_program_and_erase() {
    let mut n = chip(1);
    n.stick_bit(3, 17, false).unwrap();
    n.stick_bit(3, 100, true).unwrap();
    let check = |n: &mut FaultyNand<RamNand>| {
        let r = raw(n, 3);
        assert_eq!(r[2] >> 1 & 1, 0, "bit 17 stuck at 0");
        assert_eq!(r[12] >> 4 & 1, 1, "bit 100 stuck at 1");
    };
    check(&mut n);
    n.program(3, &[0xFF; 512], &[0xFF; 16]).unwrap();
    check(&mut n);
    n.erase(0).unwrap();
    check(&mut n);
    n.program(3, &[0x00; 512], &[0x00; 16]).unwrap();
    check(&mut n);
}

#[test]
fn program_failure_reports_and_leaves_a_partly_programmed_page() {
    let mut n = chip(6);
    let (d, s) = data(0x33);
    n.fail_next_program(4);
    assert!(matches!(n.program(4, &d, &s), Err(NandError::ProgramFailed { page: 4 })));
    let got = raw(&mut n, 4);
    let mut want = d.clone();
    want.extend(&s);
    // Every bit is either erased (1) or as programmed; some of each.
    let programmed = got.iter().zip(&want).all(|(g, w)| g & w == *w || (g | w) == *g);
    assert!(programmed);
    assert_ne!(got, want);
    assert!(got.iter().any(|&b| b != 0xFF));
    // The page is spent until the next erase; the next page is fine.
    assert!(n.program(4, &d, &s).is_err());
    n.program(5, &d, &s).unwrap();
}

#[test]
fn erase_failure_turns_the_block_bad() {
    let mut n = chip(6);
    n.fail_next_erase(3);
    assert!(matches!(n.erase(3), Err(NandError::EraseFailed { block: 3 })));
    assert!(n.is_bad(3).unwrap());
    assert!(matches!(n.erase(3), Err(NandError::BadBlock { block: 3 })));
    assert_eq!(n.faults(), &[NandFault::EraseFailed { block: 3 }]);
}

#[test]
fn endurance_limit_wears_blocks_out() {
    let mut n = chip(2);
    n.set_endurance(Some(Endurance { limit: 5, effect: WearOut::EraseFails }));
    for _ in 0..5 {
        n.erase(1).unwrap();
    }
    assert!(matches!(n.erase(1), Err(NandError::EraseFailed { block: 1 })));
    assert!(n.is_bad(1).unwrap());

    let mut n = chip(2);
    n.set_endurance(Some(Endurance { limit: 2, effect: WearOut::BitsStick }));
    for _ in 0..12 {
        n.erase(0).unwrap();
    }
    let stuck = n.faults().iter().filter(|f| matches!(f, NandFault::StuckBit { .. })).count();
    assert_eq!(stuck, 10, "one stuck bit per erase past the limit");
    // The stuck bits show in erased pages.
    let zeros: u32 = (0..8).map(|p| raw(&mut n, p).iter().map(|b| b.count_zeros()).sum::<u32>()).sum();
    assert!((1..=10).contains(&zeros), "{zeros} zero bits in an erased, worn block");
}

/// A workload of programs and erases, run against a chip that may lose power.
fn workload(n: &mut FaultyNand<RamNand>) -> Result<(), NandError> {
    for round in 0..3u8 {
        n.erase(1)?;
        for i in 0..8 {
            let (d, s) = data(round * 8 + i as u8);
            n.program(8 + i, &d, &s)?;
        }
    }
    Ok(())
}

#[test]
fn power_cut_at_every_operation_tears_only_the_operation_in_flight() {
    let mut probe = chip(0);
    workload(&mut probe).unwrap();
    let ops = probe.ops();
    assert_eq!(ops, 27);
    let mut torn_partial = 0;
    for cut in 0..ops {
        let mut n = chip(100 + cut);
        n.cut_power_at(cut);
        assert!(matches!(workload(&mut n), Err(NandError::PowerLost)));
        assert!(!n.powered());
        // Everything fails until power comes back, and nothing changes.
        let snapshot: Vec<Vec<u8>> = (0..16)
            .map(|p| {
                let mut r = vec![0; 528];
                n.raw_read(p, &mut r).unwrap();
                r
            })
            .collect();
        assert!(matches!(n.erase(2), Err(NandError::PowerLost)));
        assert!(matches!(n.program(100, &[0; 512], &[0; 16]), Err(NandError::PowerLost)));
        let mut b = vec![0; 512];
        assert!(matches!(n.read_data(0, &mut b), Err(NandError::PowerLost)));
        n.power_on();
        for (p, want) in snapshot.iter().enumerate() {
            assert_eq!(&raw(&mut n, p as u32), want, "power on must yield the chip as it was at the cut");
        }
        // Exactly one power-cut record, naming this op.
        let cuts: Vec<NandFault> =
            n.faults().iter().filter(|f| matches!(f, NandFault::PowerCut { .. })).cloned().collect();
        assert!(cuts.len() <= 1);
        if let Some(NandFault::PowerCut { op, torn }) = cuts.first() {
            assert_eq!(*op, cut);
            if let bitmend_media::nand::Torn::Program { page, fraction } = torn {
                if *fraction > 0.0 && *fraction < 1.0 {
                    // The torn page holds a strict subset of the cleared bits.
                    let round = (cut / 9) as u8;
                    let (d, s) = data(round * 8 + (page - 8) as u8);
                    let mut want = d;
                    want.extend(s);
                    let got = raw(&mut n, *page);
                    assert!(got.iter().zip(&want).all(|(g, w)| g & w == *w));
                    if got != want {
                        torn_partial += 1;
                    }
                }
            }
        }
        // The pages programmed before the cut, in the current round, read back intact.
        let round = (cut / 9) as u8;
        let done_in_round = (cut % 9).saturating_sub(1) as u32; // op 0 of a round is the erase
        if cut % 9 != 0 {
            for i in 0..done_in_round {
                let (d, s) = data(round * 8 + i as u8);
                let mut want = d;
                want.extend(s);
                assert_eq!(raw(&mut n, 8 + i), want, "cut {cut}: page {} lost", 8 + i);
            }
        }
        // After power on the chip works again.
        n.erase(5).unwrap();
    }
    assert!(torn_partial > 10, "most cuts mid-program leave a partial page: {torn_partial}");
}
