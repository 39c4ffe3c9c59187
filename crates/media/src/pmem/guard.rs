//! NVMalloc's asynchronous `mprotect`: a mapped region whose guarded pages are read-only
//! except while a transaction writes them, so that a wild write between transactions faults.
//!
//! Unprotecting cannot wait (the store is about to happen), protecting can. A store into a
//! read-only page unprotects it at once (one `mprotect` for the run of pages it covers); when
//! the transaction is over ([`Region::seal`]) its pages are queued to be protected again, and
//! a background thread wakes every `quantum`, takes the requests at least that old, sorts
//! them, coalesces neighbours into ranges, and protects each range with one call. A page that
//! is written again before its request runs cancels it: a hot page is never protected at
//! all, which is where the speed comes from.
//!
//! What the window leaves open: a page waits up to two quanta writable after its last
//! transaction, and a wild write then lands. The heap's signatures and parity close it (the
//! page fails its signature at the next check and is rebuilt).

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{MmapRegion, Region, RegionError};

const PAGE: usize = 4096;

/// How a [`Guarded`] region protects pages again after a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reprotect {
    /// At once, in the writing thread (`mprotect` around every transaction).
    Sync,
    /// By a background thread, in batches, after requests wait this long.
    After(Duration),
}

/// Counts of the protection's work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardStats {
    /// `mprotect` calls that made pages writable (in the writing thread).
    pub unprotect_calls: u64,
    /// `mprotect` calls that made pages read-only (either thread).
    pub protect_calls: u64,
    /// Pages protected.
    pub pages_protected: u64,
    /// Protect requests cancelled by a write before they ran.
    pub cancelled: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Page {
    Writable,
    /// Queued to be protected.
    Pending,
    Protected,
}

struct State {
    pages: Vec<Page>,
    /// (page, when its request was made), in request order.
    queue: Vec<(usize, Instant)>,
    stats: GuardStats,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// The mapping's address and the guarded range, for `mprotect`.
    base: usize,
    first: usize,
}

impl Shared {
    /// `mprotect` of guarded pages `[from, to)`.
    fn set(&self, from: usize, to: usize, writable: bool) -> Result<(), RegionError> {
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        let at = self.base + (self.first + from) * PAGE;
        // SAFETY: the pages lie inside the mapping, which outlives every caller: `Guarded`
        // joins the worker before its region is unmapped. Changing protection moves no memory.
        let r = unsafe { libc::mprotect(at as *mut libc::c_void, (to - from) * PAGE, prot) };
        if r != 0 {
            return Err(RegionError::Io {
                context: "mprotect".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Protects `pages` (sorted, deduplicated), a call per run of neighbours; those no longer
    /// pending (written since) are skipped.
    fn protect(&self, st: &mut State, pages: &[usize]) -> Result<(), RegionError> {
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j] == pages[j - 1] + 1 {
                j += 1;
            }
            self.set(pages[i], pages[j - 1] + 1, false)?;
            st.stats.protect_calls += 1;
            st.stats.pages_protected += (j - i) as u64;
            for &p in &pages[i..j] {
                st.pages[p] = Page::Protected;
            }
            i = j;
        }
        Ok(())
    }

    /// The worker: every `quantum`, the requests at least that old, protected a few hundred
    /// pages at a time with the lock let go between, so that a writer waits for one batch
    /// of calls at most, not for a whole quantum's.
    fn run(&self, quantum: Duration) {
        const BATCH: usize = 256;
        loop {
            let mut pages: Vec<usize> = {
                let st = self.state.lock().expect("guard state");
                let (mut st, _) = self.wake.wait_timeout(st, quantum).expect("guard state");
                if st.stop {
                    return;
                }
                let now = Instant::now();
                let due = st.queue.partition_point(|&(_, t)| now.duration_since(t) >= quantum);
                st.queue.drain(..due).map(|(p, _)| p).collect()
            };
            pages.sort_unstable();
            pages.dedup();
            for batch in pages.chunks(BATCH) {
                let mut st = self.state.lock().expect("guard state");
                // Written since the request: cancelled.
                let still: Vec<usize> =
                    batch.iter().copied().filter(|&p| st.pages[p] == Page::Pending).collect();
                // A failed mprotect leaves pages writable: weaker, never wrong.
                let _ = self.protect(&mut st, &still);
            }
        }
    }
}

/// A mapped region whose guarded pages are read-only between transactions (see the module
/// docs). Stores into them unprotect first; [`Guarded::inner_mut`] and `corrupt` do not,
/// and fault, as a wild write would.
pub struct Guarded {
    shared: Option<Arc<Shared>>,
    worker: Option<JoinHandle<()>>,
    reprotect: Reprotect,
    /// Guarded pages written since the last seal.
    touched: Vec<usize>,
    inner: MmapRegion,
}

impl Guarded {
    /// `inner`, unguarded until [`Region::guard`] names the range.
    pub fn new(inner: MmapRegion, reprotect: Reprotect) -> Guarded {
        Guarded { shared: None, worker: None, reprotect, touched: Vec::new(), inner }
    }

    pub fn inner(&self) -> &MmapRegion {
        &self.inner
    }

    /// The mapping below: its stores bypass the guard (and fault on a protected page).
    pub fn inner_mut(&mut self) -> &mut MmapRegion {
        &mut self.inner
    }

    pub fn stats(&self) -> GuardStats {
        self.shared.as_ref().map_or_else(GuardStats::default, |s| s.state.lock().expect("guard state").stats)
    }

    /// Makes the guarded pages under `[offset, offset + len)` writable before a store.
    fn open_up(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        let Some(shared) = &self.shared else { return Ok(()) };
        let mut st = shared.state.lock().expect("guard state");
        let lo = (offset / PAGE).max(shared.first);
        let hi = (offset + len).div_ceil(PAGE).min(shared.first + st.pages.len());
        if lo >= hi {
            return Ok(());
        }
        let mut p = lo - shared.first;
        while p < hi - shared.first {
            match st.pages[p] {
                Page::Writable => p += 1,
                Page::Pending => {
                    st.pages[p] = Page::Writable;
                    st.stats.cancelled += 1;
                    self.touched.push(p);
                    p += 1;
                }
                Page::Protected => {
                    let from = p;
                    while p < hi - shared.first && st.pages[p] == Page::Protected {
                        st.pages[p] = Page::Writable;
                        self.touched.push(p);
                        p += 1;
                    }
                    shared.set(from, p, true)?;
                    st.stats.unprotect_calls += 1;
                }
            }
        }
        Ok(())
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.state.lock().expect("guard state").stop = true;
            shared.wake.notify_all();
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Region for Guarded {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn bytes(&self) -> &[u8] {
        self.inner.bytes()
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.open_up(offset, data.len())?;
        self.inner.write(offset, data)
    }
    fn write_streaming(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.open_up(offset, data.len())?;
        self.inner.write_streaming(offset, data)
    }
    fn update(&mut self, offset: usize, len: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<(), RegionError> {
        self.open_up(offset, len)?;
        self.inner.update(offset, len, f)
    }
    fn flush(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        self.inner.flush(offset, len)
    }
    fn fence(&mut self) -> Result<(), RegionError> {
        self.inner.fence()
    }
    fn line_writes(&self) -> &[u32] {
        self.inner.line_writes()
    }
    fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.inner.corrupt(offset, data)
    }

    /// Protects `[start, end)` (whole pages inside it) from now on, and starts the worker.
    fn guard(&mut self, start: usize, end: usize) -> Result<(), RegionError> {
        if self.shared.is_some() {
            return Ok(());
        }
        let (first, last) = (start.div_ceil(PAGE), end.min(self.inner.len()) / PAGE);
        let n = last.saturating_sub(first);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pages: vec![Page::Protected; n],
                queue: Vec::new(),
                stats: GuardStats::default(),
                stop: false,
            }),
            wake: Condvar::new(),
            base: self.inner.bytes().as_ptr() as usize,
            first,
        });
        if n > 0 {
            shared.set(0, n, false)?;
        }
        if let Reprotect::After(quantum) = self.reprotect {
            let worker = Arc::clone(&shared);
            self.worker = Some(std::thread::spawn(move || worker.run(quantum)));
        }
        self.shared = Some(shared);
        Ok(())
    }

    /// The pages written since the last seal are protected again: now, or queued.
    fn seal(&mut self) -> Result<(), RegionError> {
        let Some(shared) = &self.shared else { return Ok(()) };
        if self.touched.is_empty() {
            return Ok(());
        }
        let mut st = shared.state.lock().expect("guard state");
        match self.reprotect {
            Reprotect::Sync => {
                self.touched.sort_unstable();
                self.touched.dedup();
                shared.protect(&mut st, &self.touched)?;
            }
            Reprotect::After(_) => {
                let now = Instant::now();
                for &p in &self.touched {
                    if st.pages[p] == Page::Writable {
                        st.pages[p] = Page::Pending;
                        st.queue.push((p, now));
                    }
                }
            }
        }
        self.touched.clear();
        Ok(())
    }
}
