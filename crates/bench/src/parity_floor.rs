//! The parity floor of the healing B+tree rows: what the parity stores of the inserts cost
//! with nothing else around them. The issue asks for the stripe's parity to be patched at
//! commit, by the writer. That makes each changed data line cost m parity lines, which the
//! writer reads, changes and writes back before the commit's fence. Those lines are as
//! scattered as the leaves they cover, so most are cache misses.
//!
//! [`Recording`] sits under the pool and notes every store into the parity pages and every
//! fence. The replay then does the same stores on a fresh region of the same size: each one
//! a read, an XOR and a write of the same lines, each line flushed once before the fence
//! that follows it. No signatures, no line checks, no codec, no journal. The replay's time
//! per insert, added to the unprotected insert, is a floor for any design that patches
//! parity at commit on the writing core.

use std::time::Instant;

use bitmend_media::pmem::{MmapRegion, Region, RegionError};

use crate::harness::{shm_region, LineCounts};

/// One noted event: a parity store (first line, lines) or a fence.
#[derive(Clone, Copy)]
enum Event {
    Store { line: u32, lines: u32 },
    Fence,
}

/// A region that notes the stores into `[watch.0, watch.1)` and every fence (see the module
/// docs). It notes nothing until `watch` is set.
pub struct Recording<R: Region> {
    inner: R,
    watch: (usize, usize),
    events: Vec<Event>,
}

impl<R: Region> Recording<R> {
    pub fn new(inner: R) -> Recording<R> {
        Recording { inner, watch: (0, 0), events: Vec::new() }
    }

    /// Notes stores into `[start, end)` from now on.
    pub fn watch(&mut self, start: usize, end: usize) {
        self.watch = (start, end);
    }

    fn note(&mut self, offset: usize, len: usize) {
        let (start, end) = (offset.max(self.watch.0), (offset + len).min(self.watch.1));
        if start < end {
            let first = start / 64;
            let lines = (end.div_ceil(64) - first) as u32;
            self.events.push(Event::Store { line: first as u32, lines });
        }
    }
}

impl<R: Region> Region for Recording<R> {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn bytes(&self) -> &[u8] {
        self.inner.bytes()
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.note(offset, data.len());
        self.inner.write(offset, data)
    }
    fn write_streaming(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.note(offset, data.len());
        self.inner.write_streaming(offset, data)
    }
    fn update(&mut self, offset: usize, len: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<(), RegionError> {
        self.note(offset, len);
        self.inner.update(offset, len, f)
    }
    fn flush(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        self.inner.flush(offset, len)
    }
    fn fence(&mut self) -> Result<(), RegionError> {
        if self.watch.1 > 0 {
            self.events.push(Event::Fence);
        }
        self.inner.fence()
    }
    fn line_writes(&self) -> &[u32] {
        self.inner.line_writes()
    }
    fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.inner.corrupt(offset, data)
    }
}

/// What a [`Recording`] noted, its region let go (the replay's is as large).
pub struct Trace {
    len: usize,
    events: Vec<Event>,
}

impl<R: Region> Recording<R> {
    /// The events, and the region's size; the region is dropped.
    pub fn finish(self) -> Trace {
        Trace { len: self.inner.len(), events: self.events }
    }
}

impl Trace {
    /// Replays the noted parity stores on a fresh region of the recorded size: ns in all.
    pub fn replay(&self, path: &std::path::Path) -> f64 {
        let mut region: MmapRegion = shm_region(path, self.len, LineCounts::Timed);
        let ns = self.replay_on(&mut region);
        drop(region);
        let _ = std::fs::remove_file(path);
        ns
    }

    fn replay_on<R: Region>(&self, region: &mut R) -> f64 {
        let mut written: Vec<u32> = Vec::new();
        let t = Instant::now();
        for e in &self.events {
            match *e {
                Event::Store { line, lines } => {
                    let (at, len) = (line as usize * 64, lines as usize * 64);
                    region.update(at, len, &mut |b| b.iter_mut().for_each(|x| *x ^= 0x5A)).expect("in range");
                    written.extend(line..line + lines);
                }
                Event::Fence => {
                    written.sort_unstable();
                    written.dedup();
                    for &l in &written {
                        region.flush(l as usize * 64, 64).expect("in range");
                    }
                    written.clear();
                    region.fence().expect("fence");
                }
            }
        }
        t.elapsed().as_secs_f64() * 1e9
    }

    /// Parity lines stored, in all (each store's lines, counted once per store).
    pub fn lines_stored(&self) -> u64 {
        self.events
            .iter()
            .map(|e| match e {
                Event::Store { lines, .. } => *lines as u64,
                Event::Fence => 0,
            })
            .sum()
    }
}
