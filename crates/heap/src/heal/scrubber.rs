//! The scrubber thread: the scrub of [`Pool::scrub`], a few stripes at a time, the pool
//! locked only for those, at a rate the caller sets, round and round until stopped (PRIMS's
//! background scrub; Loris's "background only" read check is this and nothing on reads).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bitmend_media::pmem::Region;

use super::{ScrubPass, ScrubReport};
use crate::pool::Pool;
use crate::HeapError;

/// How a [`Scrubber`] runs.
#[derive(Clone, Copy, Debug)]
pub struct ScrubberOptions {
    /// The most stripes checked per second (the rate limit): at k = 8, a stripe is 32 KiB
    /// of data pages signed.
    pub stripes_per_second: u32,
    /// The pass each round takes.
    pub pass: ScrubPass,
}

/// A running scrubber; [`Scrubber::stop`] ends it and says what it did.
pub struct Scrubber {
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<Result<ScrubberReport, HeapError>>>,
}

/// What a scrubber did.
#[derive(Clone, Debug, Default)]
pub struct ScrubberReport {
    /// Whole rounds over every stripe.
    pub rounds: u64,
    /// Everything its steps found and did, summed.
    pub total: ScrubReport,
}

/// Stripes per step: the pool is locked for one step.
const STEP: u64 = 4;

impl Scrubber {
    /// Starts scrubbing `pool`, which the caller shares through the mutex.
    pub fn spawn<R: Region + 'static>(pool: Arc<Mutex<Pool<R>>>, opts: ScrubberOptions) -> Scrubber {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let worker = std::thread::spawn(move || run(&pool, opts, &flag));
        Scrubber { stop, worker: Some(worker) }
    }

    /// Stops after the step under way; the totals, or the first error a step met.
    pub fn stop(mut self) -> Result<ScrubberReport, HeapError> {
        self.stop.store(true, Ordering::Relaxed);
        self.worker.take().expect("running").join().expect("the scrubber does not panic")
    }
}

impl Drop for Scrubber {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn run<R: Region>(
    pool: &Mutex<Pool<R>>,
    opts: ScrubberOptions,
    stop: &AtomicBool,
) -> Result<ScrubberReport, HeapError> {
    let mut report = ScrubberReport::default();
    let step_time = Duration::from_secs_f64(STEP as f64 / opts.stripes_per_second.max(1) as f64);
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let (r, stripes) = {
            let mut pool = pool.lock().expect("pool lock");
            let stripes = pool.stripes();
            (pool.scrub_stripes(next..next + STEP, opts.pass)?, stripes)
        };
        report.total.absorb(r);
        next += STEP;
        if next >= stripes {
            next = 0;
            report.rounds += 1;
        }
        // The rate limit: a step's worth of time, whatever the step took.
        if let Some(rest) = step_time.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Ok(report)
}
