//! The file system over the NVRAM tier, with power cuts: the tier's two regions on
//! `CrashRegion`s (lines not persisted are lost, each kept or not at random) and the chip on
//! a `FaultyNand` (the program or erase in flight is torn). A workload of creates, writes,
//! truncates, renames and unlinks, with no sync, is cut at every fence of either region and
//! at every NAND operation (every k-th in CI: `TIER_FS_EVERY=1` for all). After each cut the
//! mount recovers the tier, and the tree must hold every operation that returned, byte for
//! byte, and the one in flight done or not (a write in flight: each byte old or new). A
//! second mount, after the recovery's checkpoint, must find the same again.

use std::collections::BTreeMap;

use bitmend_flashfs::{Compression, Fs, FsConfig, FsOptions, Ino, SetAttr, ROOT};
use bitmend_media::campaign::PowerCut;
use bitmend_media::nand::{FaultyNand, Geometry, RamNand, Timing};
use bitmend_media::pmem::{CrashGranularity, CrashRegion};
use bitmend_media::rng::Rng;
use bitmend_tier::{crash, mount, DirtyTier};

const LOG: usize = 256 << 10;
const HEAP: usize = 2 << 20;

type Chip = FaultyNand<RamNand>;
/// Path ("f3" or "d/f3") to contents.
type Model = BTreeMap<String, Vec<u8>>;

fn opts() -> FsOptions {
    FsOptions { compression: Compression::Lz4, dirty_limit: 32 << 10, ..FsOptions::default() }
}

/// A formatted chip with directory `d`, and the tier's regions made for it.
fn base(seed: u64) -> (Chip, CrashRegion, CrashRegion) {
    let chip = RamNand::new(Geometry::new(2048, 64, 16, 64).unwrap()).unwrap().with_timing(Timing::NONE);
    let cfg = FsConfig { parity_pages: 1, parity_blocks: 1, blocks_per_segment: 4 };
    let mut fs = Fs::format(FaultyNand::new(chip, seed), cfg, opts()).unwrap();
    fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap();
    let id = fs.store().fs_id();
    let nand = fs.unmount().unwrap();
    let g = CrashGranularity::Line;
    let (log, heap) =
        (CrashRegion::new(LOG).with_crash_model(g, 0.5), CrashRegion::new(HEAP).with_crash_model(g, 0.5));
    let tier = DirtyTier::create_for(log, heap, id).unwrap();
    let (log, heap) = tier.into_regions();
    (nand, log, heap)
}

fn split(path: &str) -> (bool, &str) {
    match path.strip_prefix("d/") {
        Some(name) => (true, name),
        None => (false, path),
    }
}

fn dir_of(fs: &mut Fs<Chip>, in_d: bool) -> Ino {
    if in_d {
        fs.lookup(ROOT, b"d").unwrap().ino
    } else {
        ROOT
    }
}

/// One operation, drawn from `rng` against `model`: applied to the file system, and the
/// model as it will be if the operation completes.
fn step(fs: &mut Fs<Chip>, model: &Model, rng: &mut Rng) -> (Result<(), String>, Model, bool) {
    let mut after = model.clone();
    let name = format!("{}f{}", if rng.below(3) == 0 { "d/" } else { "" }, rng.below(6));
    let (in_d, leaf) = split(&name);
    let parent = dir_of(fs, in_d);
    let exists = model.contains_key(&name);
    let roll = rng.below(20);
    let mut is_write = false;
    let r = if !exists || roll == 0 {
        if exists {
            after.remove(&name);
            fs.unlink(parent, leaf.as_bytes()).map(|_| ())
        } else {
            after.insert(name.clone(), Vec::new());
            fs.create(parent, leaf.as_bytes(), 0o644, 0, 0).map(|_| ())
        }
    } else {
        let ino = fs.lookup(parent, leaf.as_bytes()).unwrap().ino;
        match roll {
            1..=2 => {
                let size = rng.below(30_000) as usize;
                after.get_mut(&name).unwrap().resize(size, 0);
                fs.setattr(ino, SetAttr { size: Some(size as u64), ..SetAttr::default() }).map(|_| ())
            }
            19 => {
                // A sync now and then: the tier checked out, the state on flash.
                fs.sync().map(|_| ())
            }
            18 => fs.fsync(ino),
            3 => {
                let to = format!("{}g{}", if rng.below(2) == 0 { "d/" } else { "" }, rng.below(3));
                let (to_d, to_leaf) = split(&to);
                let to_parent = dir_of(fs, to_d);
                let data = after.remove(&name).unwrap();
                after.insert(to.clone(), data);
                fs.rename(parent, leaf.as_bytes(), to_parent, to_leaf.as_bytes())
            }
            _ => {
                is_write = true;
                let file = after.get_mut(&name).unwrap();
                let off = rng.below(24_000) as usize;
                let len = 1 + rng.below(if roll < 12 { 600 } else { 9000 }) as usize;
                let mut data = vec![0u8; len];
                // Compressible half the time, as file data is.
                if rng.below(2) == 0 {
                    rng.fill(&mut data);
                } else {
                    data.iter_mut().enumerate().for_each(|(i, b)| *b = (i / 7) as u8 ^ roll as u8);
                }
                if file.len() < off + len {
                    file.resize(off + len, 0);
                }
                file[off..off + len].copy_from_slice(&data);
                fs.write(ino, off as u64, &data).map(|_| ())
            }
        }
    };
    (r.map_err(|e| e.to_string()), after, is_write)
}

/// The tree as the file system holds it (files of the root and of `d`).
fn tree(fs: &mut Fs<Chip>) -> Model {
    let mut out = Model::new();
    for (prefix, dir) in [("", ROOT), ("d/", dir_of(fs, true))] {
        for e in fs.readdir(dir).unwrap() {
            if e.name == b"d" && prefix.is_empty() {
                continue;
            }
            let size = fs.getattr(e.ino).unwrap().size as usize;
            let data = fs.read(e.ino, 0, size).unwrap();
            assert_eq!(data.len(), size);
            out.insert(format!("{prefix}{}", String::from_utf8_lossy(&e.name)), data);
        }
    }
    out
}

/// Whether `got` is `before` or `after`, or, for a write in flight, each byte of the one
/// file it changes is old or new.
fn matches(got: &Model, before: &Model, after: &Model, write: bool) -> bool {
    if got == before || got == after {
        return true;
    }
    if !write || got.keys().ne(before.keys()) {
        return false;
    }
    got.iter().all(|(k, g)| {
        let (b, a) = (&before[k], &after[k]);
        (g.len() == b.len() || g.len() == a.len())
            && g.iter().enumerate().all(|(i, x)| {
                b.get(i).is_some_and(|y| y == x) || a.get(i) == Some(x) || (i >= b.len() && *x == 0)
            })
    })
}

struct Run {
    /// The model as acknowledged, and as it would be with the operation in flight done.
    before: Model,
    after: Option<(Model, bool)>,
}

const STEPS: usize = 150;

/// Mounts over the media and runs the workload until it finishes or an operation fails.
fn work(media: (Chip, CrashRegion, CrashRegion), seed: u64) -> (Run, Chip, CrashRegion, CrashRegion) {
    work_from(media, Model::new(), seed, STEPS)
}

/// As [`work`], on a tree that holds `model`, for `steps` operations.
fn work_from(
    media: (Chip, CrashRegion, CrashRegion),
    model: Model,
    seed: u64,
    steps: usize,
) -> (Run, Chip, CrashRegion, CrashRegion) {
    let (nand, log, heap) = media;
    let (mut fs, _, _) = mount(nand, opts(), log, heap).expect("the mount before the workload");
    let mut run = Run { before: model, after: None };
    let mut rng = Rng::new(seed);
    for _ in 0..steps {
        let (r, after, write) = step(&mut fs, &run.before, &mut rng);
        if r.is_err() {
            run.after = Some((after, write));
            break;
        }
        run.before = after;
    }
    let (nand, regions) = crash::<Chip, CrashRegion, CrashRegion>(fs);
    let (log, heap) = regions.expect("the tier's regions");
    (run, nand, log, heap)
}

/// Power back on for all three, each losing what it had not made durable.
fn reboot(media: &mut (Chip, CrashRegion, CrashRegion), seed: u64) {
    PowerCut::reboot(&mut media.0, seed);
    media.1.crash(seed);
    media.2.crash(seed ^ 0x5555);
}

/// Mounts after a cut and checks the tree against `run`, then again after a crash with
/// nothing done. Returns the tree found, and the media as that second crash left them.
fn check(
    media: (Chip, CrashRegion, CrashRegion),
    run: &Run,
    what: &str,
) -> (Model, (Chip, CrashRegion, CrashRegion)) {
    let (nand, log, heap) = media;
    let (mut fs, _, report) =
        mount(nand, opts(), log, heap).unwrap_or_else(|e| panic!("{what}: the mount after the cut: {e}"));
    assert!(!report.lost_anything(), "{what}: {report:?}");
    let got = tree(&mut fs);
    let (after, write) = run.after.clone().unwrap_or((run.before.clone(), false));
    assert!(
        matches(&got, &run.before, &after, write),
        "{what}: the tree is neither what was acknowledged nor that with the operation in flight\n\
         got {:?}\nbefore {:?}\nafter {:?}\n{}{report:?}",
        sizes(&got),
        sizes(&run.before),
        sizes(&after),
        differences(&got, &run.before, &after)
    );
    // The recovery's checkpoint holds: a second crash, with nothing done, finds the same.
    let (nand, regions) = crash::<Chip, CrashRegion, CrashRegion>(fs);
    let (log, heap) = regions.unwrap();
    let (mut fs, _, again) = mount(nand, opts(), log, heap).unwrap();
    // (Unless the chip was too full for that checkpoint: the tier then still holds it all.)
    let held = report.still_in_tier;
    assert!(held || !again.recovered_anything() || again.applied.nodes_applied == 0, "{what}: {again:?}");
    assert_eq!(tree(&mut fs), got, "{what}: after a second mount");
    let (nand, regions) = crash::<Chip, CrashRegion, CrashRegion>(fs);
    let (log, heap) = regions.unwrap();
    (got, (nand, log, heap))
}

/// Per file unlike what was expected: where the first wrong byte is, and how many are wrong.
fn differences(got: &Model, before: &Model, after: &Model) -> String {
    let mut out = String::new();
    for (k, g) in got {
        for (which, m) in [("acknowledged", before), ("with the one in flight", after)] {
            if let Some(e) = m.get(k).filter(|e| *e != g) {
                let first = g.iter().zip(e.iter()).position(|(a, b)| a != b);
                let n = g.iter().zip(e.iter()).filter(|(a, b)| a != b).count();
                out += &format!(
                    "{k}: unlike {which} from byte {first:?} ({n} bytes; {} vs {} long)\n",
                    g.len(),
                    e.len()
                );
            }
        }
    }
    out
}

fn sizes(m: &Model) -> Vec<(&String, usize)> {
    m.iter().map(|(k, v)| (k, v.len())).collect()
}

#[test]
fn every_acknowledged_operation_survives_power_cuts_of_region_and_chip() {
    let every: u64 = std::env::var("TIER_FS_EVERY").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let seeds: u64 = std::env::var("TIER_FS_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    for seed in 11..11 + seeds {
        campaign(seed, every);
    }
}

/// Rounds of work, each cut at a random point (a NAND operation, a fence of either region,
/// or none: the daemon dies between operations), on a chip small enough that the cleaner
/// and checkpoints run often. The tree carries over from round to round, so the recovery
/// of one round is the ground the next works on (what the kill -9 campaign through the
/// mount does, without the kernel). `TIER_FS_ROUNDS` (default 40).
#[test]
fn rounds_of_work_cut_at_random_carry_every_acknowledged_operation() {
    let rounds: u64 = std::env::var("TIER_FS_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    let mut media = base(7);
    let mut model = Model::new();
    let mut rng = Rng::new(0xC0FFEE);
    let mut struck = [0u64; 4];
    for round in 0..rounds {
        // Cuts fall after the mount (counted by a mount of copies: it does the same again).
        let (fs, _, _) = mount(media.0.clone(), opts(), media.1.clone(), media.2.clone()).unwrap();
        let (n, regions) = crash::<Chip, CrashRegion, CrashRegion>(fs);
        let (l, h) = regions.unwrap();
        let ahead = 1 + rng.below(300);
        let which = rng.below(4) as usize;
        match which {
            0 => media.0.arm(n.ops() + ahead),
            1 => media.1.arm(l.fences() + ahead),
            2 => media.2.arm(h.fences() + ahead),
            _ => {}
        }
        let steps = 20 + rng.below(200) as usize;
        let (run, n, l, h) = work_from(media, model, rng.next_u64(), steps);
        let hit = n.cut() || l.cut() || h.cut();
        struck[if hit { which } else { 3 }] += 1;
        let mut m = (n, l, h);
        reboot(&mut m, round);
        let (got, m) = check(m, &run, &format!("round {round}, cut at {which}/{ahead}"));
        (model, media) = (got, m);
    }
    eprintln!(
        "{rounds} rounds: cut at a NAND operation {}, a log fence {}, a heap fence {}, between operations {}; \
         every acknowledged operation recovered, byte for byte",
        struck[0], struck[1], struck[2], struck[3]
    );
}

fn campaign(seed: u64, every: u64) {
    let media = base(seed);
    // Cuts fall in the workload, after the mount before it (the mount takes the same
    // operations every time: measured by a mount and nothing else).
    let (fs, _, _) = mount(media.0.clone(), opts(), media.1.clone(), media.2.clone()).unwrap();
    let (n, regions) = crash::<Chip, CrashRegion, CrashRegion>(fs);
    let (l, h) = regions.unwrap();
    let start = (n.ops(), l.fences(), h.fences());
    let (_, n, l, h) = work(media.clone(), seed);
    let totals = [n.ops() - start.0, l.fences() - start.1, h.fences() - start.2];
    assert!(totals.iter().all(|&t| t > 20), "the workload reaches every medium: {totals:?}");
    let mut cuts = [0u64; 3];
    for (which, &total) in totals.iter().enumerate() {
        for op in (0..total).step_by(every as usize) {
            let mut m = media.clone();
            match which {
                0 => m.0.arm(start.0 + op),
                1 => m.1.arm(start.1 + op),
                _ => m.2.arm(start.2 + op),
            }
            let (run, n, l, h) = work(m, seed);
            let mut m = (n, l, h);
            reboot(&mut m, op);
            check(m, &run, &format!("medium {which}, cut at operation {op} of {total}"));
            cuts[which] += 1;
        }
    }
    eprintln!(
        "seed {seed}: power cuts: {} at NAND operations, {} at log fences, {} at heap fences (of {totals:?}); \
         every acknowledged operation recovered, byte for byte",
        cuts[0], cuts[1], cuts[2]
    );
}
