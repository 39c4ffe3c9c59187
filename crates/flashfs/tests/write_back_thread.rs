//! Write-back in steps, as the mount's write-back thread runs it: a write past the limit
//! leaves the data to the thread (up to the hard limit), a step writes whole runs, an
//! inode's size reaches the flash only after all its data, and a power cut between steps
//! leaves no size pointing past data.

mod common;

use bitmend_flashfs::{
    Compression, Fs, FsOptions, SetAttr, BACKGROUND_HARD_LIMIT, CHECKPOINT_FLUSH_MOST, LOGICAL_PAGE, ROOT,
};
use bitmend_media::rng::Rng;
use common::{cfg, chip};

/// 64 KiB of dirty data (16 pages) wakes the thread.
const LIMIT: usize = 64 << 10;

fn opts() -> FsOptions {
    FsOptions { background_write_back: true, dirty_limit: LIMIT, ..common::opts(Compression::Lz4) }
}

/// Pages of random bytes (incompressible: a page per node, many flash pages).
fn random(seed: u64, pages: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..pages * LOGICAL_PAGE).map(|_| r.next_u64() as u8).collect()
}

#[test]
fn a_write_past_the_limit_waits_for_the_thread_until_the_hard_limit() {
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let pages = LIMIT / LOGICAL_PAGE;
    fs.write(f, 0, &random(1, 2 * pages)).unwrap();
    assert!(fs.write_back_due(), "twice the limit dirty: the thread is due");
    assert_eq!(fs.stats().data_bytes, 0, "the request wrote nothing back itself");
    // A write that would take dirty data past the hard limit has the request write back what
    // was dirty before it, then staged (so that a write refused by that write-back changes
    // nothing: `tier/tests/host_full.rs`).
    let more = random(2, BACKGROUND_HARD_LIMIT * pages);
    fs.write(f, (2 * pages * LOGICAL_PAGE) as u64, &more).unwrap();
    assert_eq!(fs.stats().data_bytes, (2 * pages * LOGICAL_PAGE) as u64, "what was dirty before it");
    assert!(fs.write_back_due(), "the write itself is dirty, at the hard limit");
    // One page more is past it: everything back.
    fs.write(f, ((2 + BACKGROUND_HARD_LIMIT) * pages * LOGICAL_PAGE) as u64, &random(3, 1)).unwrap();
    assert!(!fs.write_back_due());
    assert_eq!(fs.stats().data_bytes, ((2 + BACKGROUND_HARD_LIMIT) * pages * LOGICAL_PAGE) as u64);

    // Without the option, a write past the limit writes back at once.
    let mut inline = Fs::format(chip(64), cfg(), common::opts(Compression::Lz4)).unwrap();
    let g = inline.create(ROOT, b"g", 0o644, 0, 0).unwrap().ino;
    inline.write(g, 0, &random(1, 2 * pages)).unwrap();
    assert!(!inline.write_back_due());
    assert_eq!(inline.stats().data_bytes, (2 * pages * LOGICAL_PAGE) as u64);
}

#[test]
fn steps_write_whole_runs_and_sizes_after_their_data_even_across_a_power_cut() {
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    // `b` gets the lower inode number: its pages come first in a step.
    let b = fs.create(ROOT, b"b", 0o644, 0, 0).unwrap().ino;
    let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let (a_data, b_data) = (random(3, 32), random(4, 32));
    fs.write(a, 0, &a_data).unwrap();
    // A step of 6 pages writes 8: the run of node_pages (4) it ends in is not split.
    assert_eq!(fs.write_back_step(6).unwrap(), 8);
    assert!(!fs.write_back_done());
    // More data of `b`, written by the next step ahead of the rest of `a`: enough flash
    // pages to seal whatever the first step left in the page being filled (an inode node of
    // `a` written too early would be there).
    fs.write(b, 0, &b_data).unwrap();
    assert_eq!(fs.write_back_step(16).unwrap(), 16);
    let cut = fs.into_nand();
    let (mut after, _) = Fs::open(cut.clone(), opts()).unwrap();
    assert_eq!(after.getattr(a).unwrap().size, 0, "a's size reached the flash before its data");
    let b_size = after.getattr(b).unwrap().size;
    assert_eq!(b_size, 0, "b's pages 16..32 are not out: its size must not be either");
    assert!(after.check(true).clean(), "{:?}", after.check(true).problems);

    // Uncut: the steps go on until the thread may stop, then everything reads back, and
    // again after a sync and a remount.
    let (mut fs, _) = Fs::open(cut, opts()).unwrap();
    fs.write(a, 0, &a_data).unwrap();
    fs.write(b, 0, &b_data).unwrap();
    let mut steps = 0;
    while !fs.write_back_done() {
        fs.write_back_step(8).unwrap();
        steps += 1;
    }
    assert!(steps >= 4, "64 dirty pages, down to 8: at least 4 steps of 8 ({steps})");
    assert_eq!(fs.read(a, 0, a_data.len()).unwrap(), a_data);
    assert_eq!(fs.read(b, 0, b_data.len()).unwrap(), b_data);
    fs.sync().unwrap();
    let (mut fs, _) = Fs::open(fs.into_nand(), opts()).unwrap();
    assert_eq!(fs.read(a, 0, a_data.len()).unwrap(), a_data);
    assert_eq!(fs.read(b, 0, b_data.len()).unwrap(), b_data);
    assert!(fs.check(true).clean());
}

#[test]
fn a_checkpoint_due_waits_for_the_step_that_ends_a_burst() {
    // A checkpoint writes back every dirty page first, in the step's one hold of the lock;
    // taken in the middle of a burst, it would write all that a streaming writer keeps
    // adding while the writer's requests wait. Bursts of 48 dirty pages (three limits),
    // written back 8 pages a step: only a burst's last step may write more than its own 8.
    let mut fs = Fs::format(chip(256), cfg(), opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let pages = 3 * LIMIT / LOGICAL_PAGE;
    let page = LOGICAL_PAGE as u64;
    let mut checkpoints_at_burst_end = 0;
    for burst in 0..8u64 {
        fs.write(f, burst * pages as u64 * page, &random(10 + burst, pages)).unwrap();
        assert!(fs.write_back_due());
        loop {
            let before = fs.stats().data_bytes;
            assert_eq!(fs.write_back_step(5).unwrap(), 8, "a run of node_pages (4) is not split");
            let written = (fs.stats().data_bytes - before) / page;
            if !fs.write_back_done() {
                assert_eq!(
                    written, 8,
                    "burst {burst}: a step in the middle of a burst wrote back more than its own pages"
                );
                continue;
            }
            // The last step: 8 pages of the burst are left dirty, unless a checkpoint
            // wrote them back too.
            assert!(written == 8 || written == 16, "burst {burst}: {written} pages");
            checkpoints_at_burst_end += usize::from(written == 16);
            break;
        }
    }
    assert!(checkpoints_at_burst_end >= 1, "some burst ended past the checkpoint interval");
    fs.sync().unwrap();
    let back = fs.read(f, 0, 8 * pages * LOGICAL_PAGE).unwrap();
    let want: Vec<u8> = (0..8).flat_map(|b| random(10 + b, pages)).collect();
    assert!(back == want, "the file reads back as written");
}

/// The mount's dirty limit (1 MiB), where a step's worth is less than half of it.
fn mount_opts() -> FsOptions {
    FsOptions { dirty_limit: 1 << 20, ..opts() }
}

#[test]
fn a_due_checkpoint_is_left_at_most_one_step_to_flush() {
    // A checkpoint writes back every dirty page first, in its one hold of the lock: with one
    // due, the thread's steps bring dirty data down to CHECKPOINT_FLUSH_MOST pages before the
    // step that writes it. Bursts of one limit, written back 16 pages a step.
    let mut fs = Fs::format(chip(1024), cfg(), mount_opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let pages = (1 << 20) / LOGICAL_PAGE;
    let page = LOGICAL_PAGE as u64;
    let mut flushes = Vec::new();
    for burst in 0..12u64 {
        fs.write(f, burst * pages as u64 * page, &random(30 + burst, pages)).unwrap();
        while !fs.write_back_done() {
            let (before, checkpoints) = (fs.stats().data_bytes, fs.stats().checkpoints);
            let own = fs.write_back_step(16).unwrap() as u64;
            if fs.stats().checkpoints > checkpoints {
                flushes.push((fs.stats().data_bytes - before) / page - own);
            }
        }
    }
    assert!(flushes.len() >= 3, "checkpoints in steps: {flushes:?}");
    assert!(
        flushes.iter().all(|&n| n <= CHECKPOINT_FLUSH_MOST as u64),
        "a checkpoint flushed more than a step's worth: {flushes:?}"
    );
    fs.sync().unwrap();
    let back = fs.read(f, 0, 12 * pages * LOGICAL_PAGE).unwrap();
    let want: Vec<u8> = (0..12).flat_map(|b| random(30 + b, pages)).collect();
    assert!(back == want, "the file reads back as written");
}

#[test]
fn a_writer_that_keeps_dirty_data_level_still_gets_checkpoints() {
    // 16 pages appended for every 16 written back, 200 dirty throughout (refilled after
    // each checkpoint, which writes everything back): no step ends a burst. An overdue checkpoint (four intervals of log) is written anyway, so the log a
    // replay reads after a power cut stays bounded.
    let mut fs = Fs::format(chip(2048), cfg(), mount_opts()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut model = random(40, 200);
    fs.write(f, 0, &model).unwrap();
    let mut mid_burst = 0;
    for i in 0..300u64 {
        let data = random(41 + i, 16);
        fs.write(f, model.len() as u64, &data).unwrap();
        model.extend_from_slice(&data);
        let checkpoints = fs.stats().checkpoints;
        fs.write_back_step(16).unwrap();
        if fs.stats().checkpoints == checkpoints {
            assert!(!fs.write_back_done(), "step {i}: dirty data fell below half the limit");
            continue;
        }
        // The checkpoint wrote everything back: the writer fills up again.
        mid_burst += 1;
        let data = random(1000 + i, 200);
        fs.write(f, model.len() as u64, &data).unwrap();
        model.extend_from_slice(&data);
    }
    // Over 4,800 pages written back, about 9,600 log pages: a checkpoint per 1,024.
    assert!(mid_burst >= 5, "only {mid_burst} checkpoints");
    let (mut after, _) = Fs::open(fs.store().nand().clone(), mount_opts()).unwrap();
    assert!(after.check(true).clean(), "{:?}", after.check(true).problems);
    fs.sync().unwrap();
    assert!(fs.read(f, 0, model.len()).unwrap() == model, "the file reads back as written");
}

/// A namespace changing with little file data dirty (chmods of files holding a page each)
/// still gets its checkpoint, from the thread: once one is due it is the thread's work, and
/// a step writes it. Until then, a writer the thread would make wait is never left waiting
/// for a thread with nothing to do.
#[test]
fn a_checkpoint_due_with_little_dirty_is_the_threads_work() {
    let mut fs = Fs::format(chip(64), cfg(), opts()).unwrap();
    let files: Vec<_> = (0..8u8)
        .map(|i| {
            let f = fs.create(ROOT, &[b'f', b'0' + i], 0o644, 0, 0).unwrap().ino;
            fs.write(f, 0, b"x").unwrap();
            f
        })
        .collect();
    assert!(!fs.write_back_due(), "8 pages dirty, under the limit");
    let before = fs.stats().checkpoints;
    let mut chmods = 0usize;
    while !fs.write_back_due() {
        assert!(chmods < 200_000, "a checkpoint never came due for the thread");
        let perm = if (chmods / 8).is_multiple_of(2) { 0o600 } else { 0o644 };
        fs.setattr(files[chmods % 8], SetAttr { perm: Some(perm), ..SetAttr::default() }).unwrap();
        chmods += 1;
        assert!(!fs.writer_should_wait() || fs.write_back_due(), "a writer would wait on an idle thread");
    }
    assert_eq!(fs.stats().checkpoints, before, "nothing but the thread writes it ({chmods} chmods)");
    // The thread's loop: steps until it may stop.
    let mut steps = 0;
    loop {
        fs.write_back_step(64).unwrap();
        steps += 1;
        if fs.write_back_done() && fs.stats().checkpoints > before {
            break;
        }
        assert!(steps < 100, "the thread's steps never wrote the checkpoint");
    }
    assert!(!fs.write_back_due(), "written: nothing left due");
    for (i, &f) in files.iter().enumerate() {
        assert_eq!(fs.read(f, 0, 4).unwrap(), b"x", "file {i}");
    }
}
