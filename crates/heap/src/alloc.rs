//! NVMalloc: the allocator's working state lives in DRAM only (a state per block, free lists
//! per size class, the runs not yet given a class), rebuilt at open from the persistent block
//! headers, every checksum checked. Persistent memory holds one 16-byte header per block: an
//! allocation or a free rewrites that header, one cache line. A freed block cools on the
//! don't-allocate list for at least `reuse_after` before it is handed out again, so that no
//! block is allocated more often than once per period and hot reuse cannot wear one place out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bitmend_media::pmem::Region;

use crate::layout::{
    class_for, class_size, BlockHeader, BlockState, HeaderFault, HeaderLayout, RunHeader, RunKind,
    Superblock, BLOCK_HEADER, CLASSES, HEAP_VERSION_PAGE_CLASS, RUN, RUN_HEADER,
};
use crate::HeapError;

/// A block's payload: where an object lives in the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ptr(pub u64);

impl Ptr {
    /// No object.
    pub const NULL: Ptr = Ptr(0);

    /// The block's header. A pointer too low to have one (damage in what held it) gives
    /// offset 0, where no block header is: every check of it then fails, none wraps.
    pub(crate) fn header(self) -> u64 {
        self.0.saturating_sub(BLOCK_HEADER)
    }
}

/// Where an allocation goes (see [`Allocator::plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// A free block of the class.
    Block(Ptr),
    /// A run to give the class first (its first block).
    Run { run: u32, class: u8 },
    /// Runs to make one span.
    Span { head: u32, runs: u32 },
}

/// A header that failed its check at open: the block (or run) is quarantined, never handed
/// out and never freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadHeader {
    /// Offset of the header in the region.
    pub at: u64,
    /// A run header (the whole run is quarantined) or a block header.
    pub run: bool,
    pub fault: HeaderFault,
}

/// What the allocator knows about one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    Allocated,
    /// Freed, waiting out the don't-allocate period.
    Cooling,
    Quarantined,
}

#[derive(Clone, Debug)]
enum RunUse {
    Unassigned,
    Blocks {
        class: u8,
        slots: Vec<Slot>,
    },
    Span {
        runs: u32,
        slot: Slot,
    },
    /// A later run of a span (part of its block's payload).
    Tail,
    Quarantined,
}

/// How time passes for the don't-allocate list (a test moves it by hand).
#[derive(Clone, Debug, Default)]
pub enum Clock {
    #[default]
    System,
    /// Time as set with [`Clock::advance`], from an arbitrary start.
    Manual(std::sync::Arc<std::sync::Mutex<Instant>>),
}

impl Clock {
    pub fn manual() -> Clock {
        Clock::Manual(std::sync::Arc::new(std::sync::Mutex::new(Instant::now())))
    }

    pub fn now(&self) -> Instant {
        match self {
            Clock::System => Instant::now(),
            Clock::Manual(t) => *t.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Moves a manual clock forward (a system clock moves by itself).
    pub fn advance(&self, by: Duration) {
        if let Clock::Manual(t) = self {
            *t.lock().unwrap_or_else(|e| e.into_inner()) += by;
        }
    }
}

/// Counts the allocator keeps (for `stat` and the tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    pub allocated_blocks: u64,
    pub free_blocks: u64,
    pub cooling_blocks: u64,
    pub quarantined_blocks: u64,
    pub unassigned_runs: u64,
    /// Header lines written by allocations and frees (each one line).
    pub header_writes: u64,
    /// Run header and block header lines written to give runs a class.
    pub run_formats: u64,
}

pub(crate) struct Allocator {
    sb: Superblock,
    runs: Vec<RunUse>,
    /// Free block payloads per class (index class - 1), oldest freed first.
    free: Vec<VecDeque<Ptr>>,
    /// Freed blocks and when they may be handed out again.
    cooling: VecDeque<(Instant, Ptr)>,
    /// Free spans by their runs, oldest freed first within a size. A span keeps its runs: its
    /// later runs have no header of their own (they are its payload), so they never return to
    /// the classes. Keyed by size so that the best fit is one lookup, not a scan of every
    /// free span (a store of many large values frees many).
    free_spans: BTreeMap<u32, VecDeque<Ptr>>,
    unassigned: BTreeSet<u32>,
    pub faults: Vec<BadHeader>,
    pub stats: AllocStats,
    reuse_after: Duration,
    pub clock: Clock,
    /// How often each block has been allocated, per run and block index (the headers'
    /// count, kept here so that writing a header never waits to read the old one: its line
    /// is cold). Grown as blocks are first counted.
    wear: Vec<Vec<u16>>,
    layout: HeaderLayout,
    /// Plans made (the clock is read every 16th).
    plans: u32,
    /// Blocks whose headers were found linked, with their slots: allocated until
    /// [`Pool::open`](crate::Pool::open) has looked at the slots (after the journal's
    /// rollback, which may restore them).
    pub linked: Vec<(Ptr, u64)>,
    /// Allocated blocks whose headers still name the slot they were linked to: unlinked
    /// ([`unlink`](Allocator::unlink) rewrites word 0 alone) with no journal record, so
    /// recovery after a crash recomputes their headers' parity and signatures.
    pub unlinked: Vec<Ptr>,
}

impl Allocator {
    /// The class of an allocation of `len` bytes in this pool (the page class from version 7).
    fn class_for(&self, len: u64) -> Option<u8> {
        class_for(len, self.sb.version >= HEAP_VERSION_PAGE_CLASS)
    }

    fn run_base(&self, run: u32) -> u64 {
        self.sb.first_run + run as u64 * RUN
    }

    /// Where the headers are that read as free or unassigned: what a damaged header looks
    /// like when its bytes are zeros (its block, or a whole run, then seems free). A pool
    /// that heals checks their lines at open.
    pub(crate) fn free_looking_headers(&self) -> Vec<u64> {
        let blocks =
            self.free.iter().flatten().chain(self.cooling.iter().map(|(_, p)| p)).map(|p| p.header());
        let spans = self.free_spans.values().flatten().map(|p| p.header());
        let runs = self.unassigned.iter().map(|&r| self.run_base(r));
        blocks.chain(spans).chain(runs).collect()
    }

    /// The run and block index of payload `p`, if it is the start of a block's payload.
    fn locate(&self, p: Ptr) -> Option<(u32, usize)> {
        let off = p.0.checked_sub(self.sb.first_run + RUN_HEADER + BLOCK_HEADER)?;
        // A pointer far past the pool (damage in what held it) has no run: its index must
        // not wrap around to one.
        let run = u32::try_from(off / RUN).ok()?;
        let within = off % RUN;
        match self.runs.get(run as usize)? {
            RunUse::Blocks { class, slots } => {
                let size = class_size(*class);
                (within.is_multiple_of(size) && ((within / size) as usize) < slots.len())
                    .then_some((run, (within / size) as usize))
            }
            RunUse::Span { .. } => (within == 0).then_some((run, 0)),
            _ => None,
        }
    }

    fn slot_mut(&mut self, run: u32, i: usize) -> &mut Slot {
        match &mut self.runs[run as usize] {
            RunUse::Blocks { slots, .. } => &mut slots[i],
            RunUse::Span { slot, .. } => slot,
            _ => unreachable!("locate returns block runs only"),
        }
    }

    /// Payload bytes of the block at `p` (allocated or not).
    pub fn capacity(&self, p: Ptr) -> Option<u64> {
        let (run, _) = self.locate(p)?;
        Some(self.capacity_in(run))
    }

    fn capacity_in(&self, run: u32) -> u64 {
        match &self.runs[run as usize] {
            RunUse::Blocks { class, .. } => class_size(*class) - BLOCK_HEADER,
            RunUse::Span { runs, .. } => *runs as u64 * RUN - RUN_HEADER - BLOCK_HEADER,
            _ => 0,
        }
    }

    /// Payload bytes of the block at `p` if it is allocated (one lookup for both: every
    /// read through the pool asks).
    pub fn allocated_capacity(&self, p: Ptr) -> Option<u64> {
        let (run, i) = self.locate(p)?;
        let allocated = match &self.runs[run as usize] {
            RunUse::Blocks { slots, .. } => slots[i] == Slot::Allocated,
            RunUse::Span { slot, .. } => *slot == Slot::Allocated,
            _ => false,
        };
        allocated.then(|| self.capacity_in(run))
    }

    /// How often each block of the assigned runs has been allocated, from its header (its
    /// wear; quarantined blocks left out).
    pub fn allocation_counts<R: Region>(&self, region: &R) -> Vec<u16> {
        let bytes = region.bytes();
        let mut out = Vec::new();
        for (run, r) in self.runs.iter().enumerate() {
            let base = self.run_base(run as u32) + RUN_HEADER;
            let headers: Vec<u64> = match r {
                RunUse::Blocks { class, slots } => {
                    (0..slots.len()).map(|i| base + i as u64 * class_size(*class)).collect()
                }
                RunUse::Span { .. } => vec![base],
                _ => continue,
            };
            for at in headers {
                let b = &bytes[at as usize..(at + BLOCK_HEADER) as usize];
                if let Ok(h) = BlockHeader::decode(b, at, self.sb.pool_id, self.layout) {
                    out.push(h.allocations);
                }
            }
        }
        out
    }

    /// The payload of every allocated block, in pool order.
    pub fn allocated(&self) -> Vec<Ptr> {
        let mut out = Vec::new();
        for (run, r) in self.runs.iter().enumerate() {
            let base = self.run_base(run as u32) + RUN_HEADER + BLOCK_HEADER;
            match r {
                RunUse::Blocks { class, slots } => out.extend(
                    (0..slots.len())
                        .filter(|&i| slots[i] == Slot::Allocated)
                        .map(|i| Ptr(base + i as u64 * class_size(*class))),
                ),
                RunUse::Span { slot: Slot::Allocated, .. } => out.push(Ptr(base)),
                _ => {}
            }
        }
        out
    }

    /// The block whose payload holds offset `off` (allocated or not), if any.
    pub fn holder_of(&self, off: u64) -> Option<Ptr> {
        let mut run = (off.checked_sub(self.sb.first_run)? / RUN) as usize;
        // A span's later run: its block starts in the span's first run.
        while matches!(self.runs.get(run)?, RunUse::Tail) {
            run = run.checked_sub(1)?;
        }
        let base = self.run_base(run as u32) + RUN_HEADER;
        let p = match &self.runs[run] {
            RunUse::Blocks { class, slots } => {
                let size = class_size(*class);
                let i = off.checked_sub(base)? / size;
                (i < slots.len() as u64).then_some(Ptr(base + i * size + BLOCK_HEADER))?
            }
            RunUse::Span { .. } => Ptr(base + BLOCK_HEADER),
            _ => return None,
        };
        (off >= p.0).then_some(p)
    }

    /// Whether `p` is the payload of an allocated block.
    pub fn is_allocated(&self, p: Ptr) -> bool {
        self.locate(p).is_some_and(|(run, i)| match &self.runs[run as usize] {
            RunUse::Blocks { slots, .. } => slots[i] == Slot::Allocated,
            RunUse::Span { slot, .. } => *slot == Slot::Allocated,
            _ => false,
        })
    }

    /// The largest object the pool could ever hold: a span over every run.
    pub fn max_len(&self) -> u64 {
        (self.runs.len() as u64 * RUN).saturating_sub(RUN_HEADER + BLOCK_HEADER)
    }

    /// Rebuilds the working state from the headers of a pool whose runs start at
    /// `sb.first_run`, checking every checksum.
    pub fn rebuild<R: Region>(region: &R, sb: Superblock, reuse_after: Duration, clock: Clock) -> Allocator {
        let mut a = Allocator {
            sb,
            runs: vec![RunUse::Unassigned; sb.runs as usize],
            free: vec![VecDeque::new(); CLASSES as usize],
            cooling: VecDeque::new(),
            free_spans: BTreeMap::new(),
            unassigned: BTreeSet::new(),
            faults: Vec::new(),
            stats: AllocStats::default(),
            reuse_after,
            clock,
            wear: vec![Vec::new(); sb.runs as usize],
            layout: sb.header_layout(),
            plans: 0,
            linked: Vec::new(),
            unlinked: Vec::new(),
        };
        let bytes = region.bytes();
        let mut run = 0u32;
        while run < sb.runs {
            let base = a.run_base(run) as usize;
            match RunHeader::decode(&bytes[base..base + RUN_HEADER as usize], run, sb.pool_id) {
                Ok(None) => {
                    a.unassigned.insert(run);
                }
                Ok(Some(h)) => run = a.adopt_run(bytes, run, h),
                Err(fault) => a.quarantine_run(run, fault),
            }
            run += 1;
        }
        a.recount();
        a
    }

    fn quarantine_run(&mut self, run: u32, fault: HeaderFault) {
        self.faults.push(BadHeader { at: self.run_base(run), run: true, fault });
        self.runs[run as usize] = RunUse::Quarantined;
    }

    /// Takes run `run` with header `h`; returns the last run it covers.
    fn adopt_run(&mut self, bytes: &[u8], run: u32, h: RunHeader) -> u32 {
        match h.kind {
            RunKind::Blocks => {
                let size = class_size(h.class);
                let n = ((RUN - RUN_HEADER) / size) as usize;
                let base = self.run_base(run) + RUN_HEADER;
                let slots = (0..n)
                    .map(|i| {
                        let at = base + i as u64 * size;
                        self.read_block(bytes, at, h.class)
                    })
                    .collect();
                self.runs[run as usize] = RunUse::Blocks { class: h.class, slots };
                run
            }
            RunKind::SpanHead => {
                let runs = h.arg;
                if runs == 0 || run as u64 + runs as u64 > self.sb.runs as u64 {
                    self.quarantine_run(run, HeaderFault::Contents);
                    return run;
                }
                let at = self.run_base(run) + RUN_HEADER;
                let slot = self.read_block(bytes, at, 0);
                self.runs[run as usize] = RunUse::Span { runs, slot };
                if slot == Slot::Free {
                    self.free_spans.entry(runs).or_default().push_back(Ptr(at + BLOCK_HEADER));
                }
                // The later runs are the block's payload: no header of their own.
                for t in run + 1..run + runs {
                    self.runs[t as usize] = RunUse::Tail;
                }
                run + runs - 1
            }
        }
    }

    /// The state of the block whose header is at `at`, its fault recorded.
    fn read_block(&mut self, bytes: &[u8], at: u64, class: u8) -> Slot {
        let b = &bytes[at as usize..(at + BLOCK_HEADER) as usize];
        let h = BlockHeader::decode(b, at, self.sb.pool_id, self.layout);
        if let Some(h) = h.as_ref().ok().filter(|h| h.allocations > 0) {
            *self.wear_of(at, class) = h.allocations;
        }
        match h {
            Ok(h) if h.class != class => {
                self.faults.push(BadHeader { at, run: false, fault: HeaderFault::Contents });
                Slot::Quarantined
            }
            Ok(h) if h.state == BlockState::Allocated => {
                if h.link != 0 {
                    self.unlinked.push(Ptr(at + BLOCK_HEADER));
                }
                Slot::Allocated
            }
            Ok(h) if h.state == BlockState::Linked && h.link != 0 => {
                self.linked.push((Ptr(at + BLOCK_HEADER), h.link as u64 * 8));
                Slot::Allocated
            }
            Ok(_) => {
                let p = Ptr(at + BLOCK_HEADER);
                if let Some(c) = class.checked_sub(1) {
                    self.free[c as usize].push_back(p);
                }
                Slot::Free
            }
            Err(fault) => {
                self.faults.push(BadHeader { at, run: false, fault });
                Slot::Quarantined
            }
        }
    }

    /// Bytes a new object could take: free and cooling blocks (each its class's size, a
    /// span its runs) and unassigned runs, headers included.
    pub fn free_bytes(&self) -> u64 {
        let free = |slot: &Slot| matches!(slot, Slot::Free | Slot::Cooling);
        self.runs
            .iter()
            .map(|r| match r {
                RunUse::Blocks { slots, class } => {
                    slots.iter().filter(|s| free(s)).count() as u64 * class_size(*class)
                }
                RunUse::Span { slot, runs } if free(slot) => *runs as u64 * RUN,
                RunUse::Unassigned => RUN,
                _ => 0,
            })
            .sum()
    }

    /// Recounts the block states (after a rebuild or a change of many).
    fn recount(&mut self) {
        let mut s = AllocStats {
            header_writes: self.stats.header_writes,
            run_formats: self.stats.run_formats,
            ..Default::default()
        };
        for r in &self.runs {
            let slots: &[Slot] = match r {
                RunUse::Blocks { slots, .. } => slots,
                RunUse::Span { slot, .. } => std::slice::from_ref(slot),
                RunUse::Unassigned => {
                    s.unassigned_runs += 1;
                    &[]
                }
                _ => &[],
            };
            for slot in slots {
                match slot {
                    Slot::Free => s.free_blocks += 1,
                    Slot::Allocated => s.allocated_blocks += 1,
                    Slot::Cooling => s.cooling_blocks += 1,
                    Slot::Quarantined => s.quarantined_blocks += 1,
                }
            }
        }
        self.stats = s;
    }

    /// Moves the blocks that have cooled long enough to their free lists.
    fn warm_up(&mut self) {
        if self.cooling.is_empty() {
            return;
        }
        let now = self.clock.now();
        while let Some(&(since, p)) = self.cooling.front() {
            if now.duration_since(since) < self.reuse_after {
                break;
            }
            self.cooling.pop_front();
            if let Some((run, i)) = self.locate(p) {
                *self.slot_mut(run, i) = Slot::Free;
                self.stats.cooling_blocks -= 1;
                self.stats.free_blocks += 1;
                match &self.runs[run as usize] {
                    RunUse::Blocks { class, .. } => self.free[*class as usize - 1].push_back(p),
                    _ => self.free_span(p, false),
                }
            }
        }
    }

    /// When the first cooling block that could take an allocation of `len` bytes may be
    /// handed out (`None`: no such block is cooling).
    pub fn ready_at(&self, len: u64) -> Option<Instant> {
        let class = self.class_for(len);
        let runs = (len + RUN_HEADER + BLOCK_HEADER).div_ceil(RUN) as u32;
        let fits = |p: Ptr| match self.locate(p).map(|(run, _)| &self.runs[run as usize]) {
            Some(RunUse::Blocks { class: c, .. }) => Some(*c) == class,
            Some(RunUse::Span { runs: r, .. }) => class.is_none() && *r >= runs,
            _ => false,
        };
        self.cooling.iter().find(|(_, p)| fits(*p)).map(|(since, _)| *since + self.reuse_after)
    }

    /// Allocates a block for `len` payload bytes: its header is written allocated (one
    /// line), a new run formatted first if its class has no free block.
    #[cfg(test)]
    pub fn alloc<R: Region>(&mut self, region: &mut R, len: u64) -> Result<Ptr, HeapError> {
        let p = self.pick(region, len)?;
        self.mark_allocated(region, p, len)?;
        Ok(p)
    }

    /// Chooses the block an allocation of `len` bytes gets, without writing anything.
    #[cfg(test)]
    pub fn pick<R: Region>(&mut self, region: &mut R, len: u64) -> Result<Ptr, HeapError> {
        let plan = self.plan(len)?;
        self.realize(region, plan)
    }

    /// Decides where an allocation of `len` bytes goes, in DRAM only: a free block of its
    /// class, or runs to format (the journal records a format before it is written, so that
    /// recovery can finish one a crash tore). Until [`realize`](Self::realize) or
    /// [`unplan`](Self::unplan), what it names is out of the free lists.
    pub fn plan(&mut self, len: u64) -> Result<Plan, HeapError> {
        // The clock is read every 16th plan, or when a class has no free block: reading it
        // costs a tenth of an allocation, and a block that waits longer than its period
        // only waits longer.
        self.plans = self.plans.wrapping_add(1);
        let class = self.class_for(len);
        if self.plans.is_multiple_of(16) || class.is_none_or(|c| self.free[c as usize - 1].is_empty()) {
            self.warm_up();
        }
        match class {
            Some(class) => match self.free[class as usize - 1].pop_front() {
                Some(p) => Ok(Plan::Block(p)),
                None => {
                    let run = self.take_runs(1).ok_or(HeapError::Full { len: class_size(class) })?;
                    Ok(Plan::Run { run, class })
                }
            },
            None => {
                if len > self.max_len() {
                    return Err(HeapError::TooLarge { len, max: self.max_len() });
                }
                let runs = (len + RUN_HEADER + BLOCK_HEADER).div_ceil(RUN) as u32;
                // The smallest free span that holds it, else new runs.
                if let Some(p) = self.take_span(runs) {
                    return Ok(Plan::Block(p));
                }
                let head = self.take_runs(runs).ok_or(HeapError::Full { len })?;
                Ok(Plan::Span { head, runs })
            }
        }
    }

    /// Formats what `plan` needs and takes its block (allocated in DRAM; its header is
    /// written by [`mark_allocated`](Self::mark_allocated)).
    pub fn realize<R: Region>(&mut self, region: &mut R, plan: Plan) -> Result<Ptr, HeapError> {
        let p = match plan {
            Plan::Block(p) => p,
            Plan::Run { run, class } => {
                self.format_run(region, run, class)?;
                self.free[class as usize - 1].pop_front().expect("a run just formatted")
            }
            Plan::Span { head, runs } => self.format_span(region, head, runs)?,
        };
        let (run, i) = self.locate(p).expect("a block just found");
        *self.slot_mut(run, i) = Slot::Allocated;
        self.stats.free_blocks -= 1;
        self.stats.allocated_blocks += 1;
        Ok(p)
    }

    /// Gives back what [`plan`](Self::plan) took, unwritten.
    pub fn unplan(&mut self, plan: Plan) {
        match plan {
            Plan::Block(p) => {
                let class = self.locate(p).and_then(|(run, _)| match &self.runs[run as usize] {
                    RunUse::Blocks { class, .. } => Some(*class),
                    _ => None,
                });
                match class {
                    Some(c) => self.free[c as usize - 1].push_front(p),
                    None => self.free_span(p, true),
                }
            }
            Plan::Run { run, .. } => self.give_back(run, 1),
            Plan::Span { head, runs } => self.give_back(head, runs),
        }
    }

    fn give_back(&mut self, first: u32, n: u32) {
        for r in first..first + n {
            self.unassigned.insert(r);
        }
        self.stats.unassigned_runs += n as u64;
    }

    /// Gives back a block [`realize`](Self::realize) took but that was never written
    /// allocated.
    pub fn unpick(&mut self, p: Ptr) {
        let Some((run, i)) = self.locate(p) else { return };
        *self.slot_mut(run, i) = Slot::Free;
        self.stats.free_blocks += 1;
        self.stats.allocated_blocks -= 1;
        if let RunUse::Blocks { class, .. } = &self.runs[run as usize] {
            self.free[*class as usize - 1].push_front(p);
        } else {
            self.free_span(p, true);
        }
    }

    /// Lists free span `p` by its size: last, or first if it was never written allocated
    /// (`unwritten`: no wear to spread).
    fn free_span(&mut self, p: Ptr, unwritten: bool) {
        let list = self.free_spans.entry(self.span_runs_of(p)).or_default();
        if unwritten {
            list.push_front(p);
        } else {
            list.push_back(p);
        }
    }

    /// The oldest freed of the smallest free spans of at least `runs` runs, out of the lists.
    fn take_span(&mut self, runs: u32) -> Option<Ptr> {
        let mut fits = self.free_spans.range_mut(runs..);
        let (&size, list) = fits.find(|(_, l)| !l.is_empty())?;
        let p = list.pop_front();
        if list.is_empty() {
            self.free_spans.remove(&size);
        }
        p
    }

    /// The runs of the span whose block is `p`.
    fn span_runs_of(&self, p: Ptr) -> u32 {
        match self.locate(p).map(|(run, _)| &self.runs[run as usize]) {
            Some(RunUse::Span { runs, .. }) => *runs,
            _ => 0,
        }
    }

    /// Writes the header of picked block `p` allocated (one line, flushed: the transaction's
    /// commit makes it durable, and vouches for it).
    pub fn mark_allocated<R: Region>(&mut self, region: &mut R, p: Ptr, len: u64) -> Result<(), HeapError> {
        self.write_header(region, p, BlockState::Allocated, len)
    }

    /// Makes runs `head..head + runs` one span: the head's and the tails' run headers, and
    /// the block's header free.
    fn format_span<R: Region>(&mut self, region: &mut R, head: u32, runs: u32) -> Result<Ptr, HeapError> {
        let pool_id = self.sb.pool_id;
        let h = RunHeader { kind: RunKind::SpanHead, class: 0, arg: runs };
        let at = self.run_base(head) as usize;
        region.write(at, &h.encode(head, pool_id))?;
        region.flush(at, RUN_HEADER as usize)?;
        self.runs[head as usize] = RunUse::Span { runs, slot: Slot::Free };
        for t in head + 1..head + runs {
            self.runs[t as usize] = RunUse::Tail;
        }
        let p = Ptr(self.run_base(head) + RUN_HEADER + BLOCK_HEADER);
        self.write_header(region, p, BlockState::Free, 0)?;
        self.stats.run_formats += 2;
        self.stats.free_blocks += 1;
        Ok(p)
    }

    /// `n` consecutive unassigned runs (the lowest that fit), taken out of the unassigned
    /// set; `None` if there are none.
    fn take_runs(&mut self, n: u32) -> Option<u32> {
        let mut start = None;
        let mut len = 0;
        for &r in &self.unassigned {
            match start {
                Some(s) if s + len == r => len += 1,
                _ => {
                    start = Some(r);
                    len = 1;
                }
            }
            if len == n {
                break;
            }
        }
        let s = start.filter(|_| len == n)?;
        for r in s..s + n {
            self.unassigned.remove(&r);
        }
        self.stats.unassigned_runs -= n as u64;
        Some(s)
    }

    /// Gives run `run` class `class`: every block header written free, then the run header,
    /// all persisted (so that a header of all zeros is never a block's, only damage).
    fn format_run<R: Region>(&mut self, region: &mut R, run: u32, class: u8) -> Result<(), HeapError> {
        let size = class_size(class);
        let n = ((RUN - RUN_HEADER) / size) as usize;
        let base = self.run_base(run) + RUN_HEADER;
        let pool_id = self.sb.pool_id;
        for i in 0..n {
            let at = base + i as u64 * size;
            let h = BlockHeader { state: BlockState::Free, class, allocations: 0, len: 0, link: 0 };
            // Non-temporal: the lines are cold (a run is formatted once), and a store that
            // bypasses the cache does not wait to read them first.
            region.write_streaming(at as usize, &h.encode(at, pool_id, self.layout))?;
        }
        region.fence()?;
        let at = self.run_base(run) as usize;
        region.write(at, &RunHeader { kind: RunKind::Blocks, class, arg: 0 }.encode(run, pool_id))?;
        region.persist(at, RUN_HEADER as usize)?;
        self.stats.run_formats += n as u64 + 1;
        self.runs[run as usize] = RunUse::Blocks { class, slots: vec![Slot::Free; n] };
        self.free[class as usize - 1].extend((0..n).map(|i| Ptr(base + i as u64 * size + BLOCK_HEADER)));
        self.stats.free_blocks += n as u64;
        Ok(())
    }

    /// Recovery: makes block `p` allocated (`len` bytes) or free, in its header and in the
    /// working state, if it is not already; returns whether anything changed. A block that
    /// recovery frees cools like any freed block.
    pub fn settle<R: Region>(
        &mut self,
        region: &mut R,
        p: Ptr,
        allocated: bool,
        len: u64,
    ) -> Result<bool, HeapError> {
        let Some((run, i)) = self.locate(p) else { return Ok(false) };
        let now = match &self.runs[run as usize] {
            RunUse::Blocks { slots, .. } => slots[i],
            RunUse::Span { slot, .. } => *slot,
            _ => return Ok(false),
        };
        match (now, allocated) {
            (Slot::Quarantined, _) | (Slot::Allocated, true) => Ok(false),
            (Slot::Free | Slot::Cooling, false) => Ok(false),
            (Slot::Allocated, false) => {
                self.free(region, p)?;
                Ok(true)
            }
            (Slot::Free | Slot::Cooling, true) => {
                if now == Slot::Free {
                    for list in &mut self.free {
                        list.retain(|&q| q != p);
                    }
                    self.stats.free_blocks -= 1;
                } else {
                    self.cooling.retain(|c| c.1 != p);
                    self.stats.cooling_blocks -= 1;
                }
                *self.slot_mut(run, i) = Slot::Allocated;
                self.stats.allocated_blocks += 1;
                self.write_header(region, p, BlockState::Allocated, len)?;
                Ok(true)
            }
        }
    }

    /// Frees the block at `p`: its header is written free and flushed (one line, durable at the
    /// next fence; until then the journal's free record stands for it), and it
    /// cools on the don't-allocate list before it can be handed out again.
    pub fn free<R: Region>(&mut self, region: &mut R, p: Ptr) -> Result<(), HeapError> {
        if !self.is_allocated(p) {
            return Err(HeapError::NotAllocated { at: p.0 });
        }
        self.write_header(region, p, BlockState::Free, 0)?;
        self.release(p)
    }

    /// The allocation count of the block whose header is at `at`, in a run of `class` (0: a
    /// span's one block).
    fn wear_of(&mut self, at: u64, class: u8) -> &mut u16 {
        let within = at - self.sb.first_run;
        let (run, i) = (
            (within / RUN) as usize,
            match class {
                0 => 0,
                c => ((within % RUN - RUN_HEADER) / class_size(c)) as usize,
            },
        );
        let counts = &mut self.wear[run];
        if counts.len() <= i {
            counts.resize(i + 1, 0);
        }
        &mut counts[i]
    }

    /// Rewrites the header of the block at `p` (its allocation count kept, and counted up
    /// when it is allocated) and flushes it. No fence: every caller is followed by one before
    /// the journal records that name the block are trimmed.
    fn write_header<R: Region>(
        &mut self,
        region: &mut R,
        p: Ptr,
        state: BlockState,
        len: u64,
    ) -> Result<(), HeapError> {
        self.write_header_linked(region, p, state, len, 0)
    }

    /// [`write_header`](Self::write_header), with a link (version 4: the slot's offset / 8).
    fn write_header_linked<R: Region>(
        &mut self,
        region: &mut R,
        p: Ptr,
        state: BlockState,
        len: u64,
        link: u32,
    ) -> Result<(), HeapError> {
        let at = p.header();
        let class = self.class_of(p);
        let count = self.wear_of(at, class);
        if state != BlockState::Free {
            *count = count.saturating_add(1);
        }
        let allocations = *count;
        // A length past 32 bits is recorded as u32::MAX: "the whole block".
        let h = BlockHeader { state, class, allocations, len: len.min(u32::MAX as u64) as u32, link };
        region.write(at as usize, &h.encode(at, self.sb.pool_id, self.layout))?;
        region.flush(at as usize, BLOCK_HEADER as usize)?;
        self.stats.header_writes += 1;
        Ok(())
    }

    /// The class of the run block `p` is in (0: a span's block).
    fn class_of(&self, p: Ptr) -> u8 {
        let (run, _) = self.locate(p).expect("a block");
        match self.runs[run as usize] {
            RunUse::Blocks { class, .. } => class,
            _ => 0,
        }
    }

    /// Whether this pool's headers can link a block to a slot (version 4), and a block of
    /// `len` bytes would be a run's (a span's header has no room for a link).
    pub fn links(&self, len: u64) -> bool {
        self.layout == HeaderLayout::Words && self.class_for(len).is_some()
    }

    /// Writes the header of picked block `p` linked to the slot at `slot`: allocated once
    /// the slot points at it (one line, flushed; the caller fences before it writes the slot).
    pub fn mark_linked<R: Region>(
        &mut self,
        region: &mut R,
        p: Ptr,
        len: u64,
        slot: u64,
    ) -> Result<(), HeapError> {
        debug_assert!(self.links(len) && slot.is_multiple_of(8) && slot / 8 <= u32::MAX as u64);
        self.write_header_linked(region, p, BlockState::Linked, len, (slot / 8) as u32)
    }

    /// Whether the header of allocated block `p` says it is linked to the slot at `slot`.
    pub fn is_linked_to<R: Region>(&self, region: &R, p: Ptr, slot: u64) -> bool {
        self.is_allocated(p)
            && self
                .read_header(region, p)
                .is_ok_and(|h| h.state == BlockState::Linked && h.link as u64 * 8 == slot)
    }

    /// Whether allocated block `p`'s header says linked to `slot`, from its state and link
    /// fields alone (their checks are left to the next open: a fast path for a free).
    pub fn names_link<R: Region>(&self, region: &R, p: Ptr, slot: u64) -> bool {
        let at = p.header() as usize;
        let b = &region.bytes()[at..at + BLOCK_HEADER as usize];
        self.layout == HeaderLayout::Words
            && self.is_allocated(p)
            && b[0] == BlockState::Linked as u8
            && bitmend_code::le::get_u32(b, 8) as u64 * 8 == slot
    }

    fn read_header<R: Region>(&self, region: &R, p: Ptr) -> Result<BlockHeader, HeaderFault> {
        let at = p.header();
        BlockHeader::decode(
            &region.bytes()[at as usize..(at + BLOCK_HEADER) as usize],
            at,
            self.sb.pool_id,
            self.layout,
        )
    }

    /// Makes linked block `p` plainly allocated: its header's word 0 rewritten, one aligned
    /// 8-byte store (atomic), flushed. For a slot about to point elsewhere, or to move.
    pub fn unlink<R: Region>(&mut self, region: &mut R, p: Ptr) -> Result<(), HeapError> {
        let h = self
            .read_header(region, p)
            .map_err(|_| HeapError::Corrupt { at: p.header(), what: "a linked block's header" })?;
        debug_assert_eq!(h.state, BlockState::Linked);
        let word = BlockHeader { state: BlockState::Allocated, ..h }.word_0(p.header(), self.sb.pool_id);
        region.write(p.header() as usize, &word)?;
        region.flush(p.header() as usize, 8)?;
        self.stats.header_writes += 1;
        Ok(())
    }

    /// Frees allocated block `p` in the working state only: its header stays linked to a
    /// slot that no longer points at it, which says free (the caller cleared the slot).
    pub fn release(&mut self, p: Ptr) -> Result<(), HeapError> {
        if !self.is_allocated(p) {
            return Err(HeapError::NotAllocated { at: p.0 });
        }
        let (run, i) = self.locate(p).expect("allocated");
        *self.slot_mut(run, i) = Slot::Cooling;
        self.stats.allocated_blocks -= 1;
        self.stats.cooling_blocks += 1;
        self.cooling.push_back((self.clock.now(), p));
        Ok(())
    }

    /// At open: a linked block whose slot does not point at it is free (the allocation
    /// into it never finished, or it was freed from it); handed out at once.
    pub fn free_unlinked(&mut self, p: Ptr) {
        let Some((run, i)) = self.locate(p) else { return };
        if *self.slot_mut(run, i) != Slot::Allocated {
            return;
        }
        *self.slot_mut(run, i) = Slot::Free;
        self.stats.allocated_blocks -= 1;
        self.stats.free_blocks += 1;
        let class = self.class_of(p);
        self.free[class as usize - 1].push_back(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitmend_media::pmem::CrashRegion;

    const POOL_ID: u64 = 0xB17;

    fn fresh(runs: u32, reuse_after: Duration, clock: Clock) -> (CrashRegion, Allocator) {
        fresh_of(crate::layout::HEAP_VERSION, runs, reuse_after, clock)
    }

    fn fresh_of(version: u32, runs: u32, reuse_after: Duration, clock: Clock) -> (CrashRegion, Allocator) {
        let first_run = 4096;
        let region = CrashRegion::new((first_run + runs as u64 * RUN) as usize);
        let sb =
            Superblock { version, first_run, runs, journal: 0, pool_id: POOL_ID, shape: None, closed: false };
        let a = Allocator::rebuild(&region, sb, reuse_after, clock);
        (region, a)
    }

    #[test]
    fn blocks_come_back_after_a_reopen_as_the_headers_say() {
        let (mut r, mut a) = fresh(12, Duration::ZERO, Clock::System);
        let mut live = Vec::new();
        for len in [1u64, 48, 49, 300, 4000, 60_000, 70_000, 600_000] {
            live.push((a.alloc(&mut r, len).unwrap(), len));
        }
        let freed = live.remove(2).0;
        a.free(&mut r, freed).unwrap();
        let again = Allocator::rebuild(&r, a.sb, Duration::ZERO, Clock::System);
        assert!(again.faults.is_empty(), "{:?}", again.faults);
        for &(p, len) in &live {
            assert!(again.is_allocated(p), "{p:?}");
            assert!(again.capacity(p).unwrap() >= len);
        }
        assert!(!again.is_allocated(freed));
        assert_eq!(again.stats.allocated_blocks, live.len() as u64);
    }

    #[test]
    fn an_allocation_and_a_free_each_write_one_header_line() {
        let (mut r, mut a) = fresh(4, Duration::ZERO, Clock::System);
        let p = a.alloc(&mut r, 100).unwrap();
        let lines_before: u64 = r.line_writes().iter().map(|&c| c as u64).sum();
        let q = a.alloc(&mut r, 100).unwrap();
        a.free(&mut r, p).unwrap();
        let lines_after: u64 = r.line_writes().iter().map(|&c| c as u64).sum();
        assert_eq!(lines_after - lines_before, 2, "one line for the allocation, one for the free");
        assert_ne!(p, q);
    }

    #[test]
    fn a_freed_block_waits_out_the_period_before_reuse() {
        let clock = Clock::manual();
        let (mut r, mut a) = fresh(4, Duration::from_millis(200), clock.clone());
        // One run of the 4 KiB class holds 63 blocks: use them all, free one.
        let blocks: Vec<Ptr> = (0..63).map(|_| a.alloc(&mut r, 4000).unwrap()).collect();
        a.free(&mut r, blocks[10]).unwrap();
        // Before the period ends, the freed block is not handed out: a new run is.
        clock.advance(Duration::from_millis(199));
        let next = a.alloc(&mut r, 4000).unwrap();
        assert_ne!(next, blocks[10]);
        a.free(&mut r, next).unwrap();
        clock.advance(Duration::from_millis(1));
        // Cooled, blocks[10] joins the free list behind the new run's unused blocks (which
        // spreads wear further); `next`, freed later, is still cooling and never comes.
        let mut handed = Vec::new();
        while !handed.contains(&blocks[10]) {
            handed.push(a.alloc(&mut r, 4000).unwrap());
            assert!(handed.len() <= 63, "the cooled block never came back");
        }
        assert!(!handed.contains(&next), "a block came back before its period was out");
    }

    #[test]
    fn a_freed_span_goes_to_the_smallest_fit_oldest_freed_first() {
        let (mut r, mut a) = fresh(20, Duration::ZERO, Clock::System);
        let (small, big) = (RUN, 3 * RUN); // spans of 2 and 4 runs
        let a1 = a.alloc(&mut r, small).unwrap();
        let b = a.alloc(&mut r, big).unwrap();
        let a2 = a.alloc(&mut r, small).unwrap();
        let _kept = a.alloc(&mut r, small).unwrap();
        for p in [b, a1, a2] {
            a.free(&mut r, p).unwrap();
        }
        // The larger span, freed first, waits while a smaller one fits.
        assert_eq!(a.alloc(&mut r, small).unwrap(), a1);
        assert_eq!(a.alloc(&mut r, small).unwrap(), a2);
        assert_eq!(a.alloc(&mut r, small).unwrap(), b, "the only free span that holds it");
        let fresh = a.alloc(&mut r, small).unwrap();
        assert!(![a1, a2, b].contains(&fresh), "a span handed out twice");
        assert!(a.capacity(b).unwrap() >= big, "a reused span keeps its runs");
    }

    /// Both header layouts: a version 3 header copied onto another block is told apart as
    /// misplaced (it stores its location); a version 4 one fails its checks (the location is
    /// in them, not stored).
    #[test]
    fn damaged_headers_are_quarantined_with_the_check_that_failed() {
        for (version, copied) in [(3, HeaderFault::Misplaced), (4, HeaderFault::Checksum)] {
            let (mut r, mut a) = fresh_of(version, 4, Duration::ZERO, Clock::System);
            let p: Vec<Ptr> = (0..4).map(|_| a.alloc(&mut r, 200).unwrap()).collect();
            // Three faults: a flipped bit, a header copied onto another block, a zeroed header.
            let h0 = p[0].header() as usize;
            r.corrupt(h0 + 2, &[r.bytes()[h0 + 2] ^ 1]).unwrap();
            let copy = r.bytes()[p[1].header() as usize..p[1].header() as usize + 16].to_vec();
            r.corrupt(p[2].header() as usize, &copy).unwrap();
            r.corrupt(p[3].header() as usize, &[0u8; 16]).unwrap();
            let again = Allocator::rebuild(&r, a.sb, Duration::ZERO, Clock::System);
            let got: Vec<(u64, HeaderFault)> = again.faults.iter().map(|f| (f.at, f.fault)).collect();
            assert_eq!(
                got,
                vec![
                    (p[0].header(), HeaderFault::Checksum),
                    (p[2].header(), copied),
                    (p[3].header(), HeaderFault::Checksum),
                ],
                "version {version}"
            );
            // Quarantined blocks are neither allocated nor handed out again.
            let mut again = again;
            assert!(!again.is_allocated(p[0]) && again.is_allocated(p[1]));
            for _ in 0..2000 {
                let q = again.alloc(&mut r, 200).unwrap();
                assert!(![p[0], p[2], p[3]].contains(&q), "a quarantined block was handed out");
            }
            assert_eq!(again.stats.quarantined_blocks, 3);
        }
    }

    #[test]
    fn a_full_pool_says_so_and_changes_nothing() {
        let (mut r, mut a) = fresh(2, Duration::ZERO, Clock::System);
        assert!(matches!(a.alloc(&mut r, 1 << 30), Err(HeapError::TooLarge { .. })));
        let big = a.alloc(&mut r, RUN + 1000).unwrap();
        let before = r.bytes().to_vec();
        assert!(matches!(a.alloc(&mut r, 10), Err(HeapError::Full { .. })));
        assert_eq!(r.bytes(), &before[..], "a refused allocation writes nothing");
        a.free(&mut r, big).unwrap();
        // A freed span keeps its runs: another large object takes it, a small one does not.
        assert_eq!(a.alloc(&mut r, RUN + 500).unwrap(), big);
        assert!(matches!(a.alloc(&mut r, 10), Err(HeapError::Full { .. })));
    }
}
