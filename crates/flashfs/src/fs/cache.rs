//! The checksummed page cache (Loris section IV, and V-C for dirty pages).
//!
//! Every logical page the file system holds in memory carries its CRC-32C, the one the flash
//! index stores beside the page's data node:
//! - a clean page takes the CRC the store verified it against on its way up (Loris's
//!   propagation), never one computed from the bytes in memory;
//! - a dirty page gets its CRC when it is written, and keeps it up to date by the change
//!   alone ([`DirtyPage::overwrite`]), so a flip that hit the unchanged part before stays
//!   a mismatch. The flush stores that CRC as the on-flash one. A page that a flip hit while
//!   dirty is never written under a CRC that matches it: the next read from flash refuses it.
//!
//! A read checks a cached page when the mount's strategy says it is due ([`Verify`]). A clean
//! page that fails is dropped and read again from flash; a dirty one cannot be read again,
//! and the read fails with [`FsError::Corrupt(Corruption::InMemory)`] (never its bytes).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bitmend_code::crc;

use bitmend_media::nand::Nand;

use super::{Fs, Ino, LOGICAL_PAGE};
use crate::Corruption;
use crate::FsError;

/// When a read checks the cached page it reads (Loris section IV-C).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Verify {
    /// Every read (ER).
    Every,
    /// A read of a page last checked at least this long ago (LC).
    AfterCheck(Duration),
    /// A read of a page last used at least this long ago (LU).
    AfterUse(Duration),
    /// No read checks: the background checker alone ([`crate::Fs::check_cache`]).
    #[default]
    Background,
}

/// One tick, as Loris measures its strategies: a MINIX 3 clock tick, 1/60 s.
pub const TICK: Duration = Duration::from_micros(16_667);

impl std::str::FromStr for Verify {
    type Err = String;

    /// `every`, `last-check=DUR`, `last-use=DUR` or `background`; DUR is `tick`, or a number
    /// with `us`, `ms` or `s`.
    fn from_str(s: &str) -> Result<Verify, String> {
        let interval = |v: &str| {
            parse_interval(v).ok_or_else(|| format!("{v:?}: not an interval (tick, 500us, 20ms, 1s)"))
        };
        match s.split_once('=') {
            None if s == "every" => Ok(Verify::Every),
            None if s == "background" => Ok(Verify::Background),
            Some(("last-check", v)) => Ok(Verify::AfterCheck(interval(v)?)),
            Some(("last-use", v)) => Ok(Verify::AfterUse(interval(v)?)),
            _ => Err(format!("{s:?}: expected every, last-check=DUR, last-use=DUR or background")),
        }
    }
}

fn parse_interval(v: &str) -> Option<Duration> {
    if v == "tick" {
        return Some(TICK);
    }
    let split = v.find(|c: char| !c.is_ascii_digit())?;
    let n: u64 = v[..split].parse().ok()?;
    match &v[split..] {
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        _ => None,
    }
}

/// A dirty logical page and its CRC-32C, kept from the write on.
#[derive(Clone, Debug)]
pub(crate) struct DirtyPage {
    pub bytes: Vec<u8>,
    pub crc: u32,
    /// When it was last checked or used (see [`Verify`]); 0 for never.
    stamp: u64,
    /// Moved by the cleaner and not written since: cold data, compressed at the high level
    /// (see [`FsOptions::lz4_level`](super::FsOptions)).
    pub moved: bool,
}

impl DirtyPage {
    /// A page written whole: its CRC is computed here, where the flush would have.
    pub fn new(bytes: Vec<u8>) -> DirtyPage {
        debug_assert_eq!(bytes.len(), LOGICAL_PAGE);
        DirtyPage { crc: crc::crc32c(&bytes), bytes, stamp: 0, moved: false }
    }

    /// A page read (clean, or dirty already) with the CRC that came with it.
    pub fn with_crc(bytes: Vec<u8>, crc: u32) -> DirtyPage {
        DirtyPage { bytes, crc, stamp: 0, moved: false }
    }

    /// A page the cleaner read to move it elsewhere.
    pub fn moved(bytes: Vec<u8>, crc: u32) -> DirtyPage {
        DirtyPage { bytes, crc, stamp: 0, moved: true }
    }

    /// Stores `data` at `at`, the CRC updated by the change alone (`crc::update`): an error
    /// already in the rest of the page is not laundered into a fresh CRC.
    pub fn overwrite(&mut self, at: usize, data: &[u8]) {
        let range = at..at + data.len();
        self.moved = false;
        self.crc = crc::update(self.crc, LOGICAL_PAGE, at, &self.bytes[range.clone()], data);
        self.bytes[range].copy_from_slice(data);
    }

    /// Zeros from `at` to the end (a truncate inside the page), the CRC updated likewise.
    pub fn cut(&mut self, at: usize) {
        let zeros = vec![0u8; LOGICAL_PAGE - at];
        self.overwrite(at, &zeros);
    }

    pub fn sound(&self) -> bool {
        crc::crc32c(&self.bytes) == self.crc
    }
}

/// A clean logical page, as the store returned it, and the CRC the store checked it against.
struct CleanPage {
    bytes: Vec<u8>,
    crc: u32,
    stamp: u64,
}

/// What the cache counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Logical pages read (from the dirty pages, the clean ones or the flash).
    pub reads: u64,
    /// Reads served from a cached clean page.
    pub hits: u64,
    /// Pages checked against their CRC (on reads, and by the background checker).
    pub checks: u64,
    /// Clean pages that failed their check: dropped and read again from flash.
    pub clean_caught: u64,
    /// Dirty pages that failed their check and that the NVRAM tier could not heal: refused to
    /// the reader, and stored under their own CRC so that flash refuses them too.
    pub dirty_caught: u64,
    /// Dirty pages that failed their check (on a read, in the background, or at write-back),
    /// put right from the NVRAM tier's copy, which the same write made.
    pub dirty_healed: u64,
}

/// The clean pages, their stamps and the strategy.
pub(crate) struct PageCache {
    verify: Verify,
    /// The interval in microseconds (a `Duration` converts with a 128-bit division).
    interval: u64,
    epoch: Instant,
    clean: HashMap<(u64, u64), CleanPage>,
    /// Insertion order, for eviction (entries already gone are skipped).
    order: VecDeque<(u64, u64)>,
    capacity: usize,
    /// Where the background checker goes on from: (clean, dirty) keys.
    cursor: ((u64, u64), (u64, u64)),
    stats: CacheStats,
}

impl PageCache {
    pub fn new(capacity: usize, verify: Verify) -> PageCache {
        let mut c = PageCache {
            verify,
            interval: 0,
            epoch: Instant::now(),
            clean: HashMap::new(),
            order: VecDeque::new(),
            capacity,
            cursor: ((0, 0), (0, 0)),
            stats: CacheStats::default(),
        };
        c.set_verify(verify);
        c
    }

    /// A read of a logical page through the cache (hit or not).
    pub fn count_read(&mut self) {
        self.stats.reads += 1;
    }

    pub fn set_verify(&mut self, verify: Verify) {
        self.verify = verify;
        self.interval = match verify {
            Verify::AfterCheck(d) | Verify::AfterUse(d) => d.as_micros().min(u64::MAX as u128) as u64,
            Verify::Every | Verify::Background => 0,
        };
    }

    /// Microseconds since the cache was made, never 0 (which means "never").
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    /// Whether a page stamped `stamp` is due a check on a read now; its new stamp.
    fn due(&self, stamp: u64, now: u64) -> (bool, u64) {
        let since = stamp == 0 || now.saturating_sub(stamp) >= self.interval;
        match self.verify {
            Verify::Every => (true, stamp),
            // Stamped when it passes (by the caller).
            Verify::AfterCheck(_) => (since, stamp),
            Verify::AfterUse(_) => (since, now),
            Verify::Background => (false, stamp),
        }
    }

    /// The clean page `key` and its CRC, checked if due; `None` if not cached, or if it
    /// failed its check (then it is dropped, for the caller to read it again from flash).
    pub fn get(&mut self, key: (u64, u64)) -> Option<(Vec<u8>, u32)> {
        let now = self.now();
        let page = self.clean.get(&key)?;
        let (due, stamp) = self.due(page.stamp, now);
        if due {
            self.stats.checks += 1;
            if crc::crc32c(&page.bytes) != page.crc {
                self.stats.clean_caught += 1;
                self.clean.remove(&key);
                return None;
            }
        }
        let page = self.clean.get_mut(&key).expect("looked up");
        page.stamp = if due && matches!(self.verify, Verify::AfterCheck(_)) { now } else { stamp };
        self.stats.hits += 1;
        Some((page.bytes.clone(), page.crc))
    }

    /// Counts a dirty page that failed its check: healed from the tier, or not.
    pub(crate) fn count_heal(&mut self, healed: bool) {
        if healed {
            self.stats.dirty_healed += 1;
        } else {
            self.stats.dirty_caught += 1;
        }
    }

    /// Whether clean page `key` is held (not checked, not counted as a use).
    pub fn contains(&self, key: (u64, u64)) -> bool {
        self.clean.contains_key(&key)
    }

    /// Checks dirty page `page` (of `key`) if a read of it is due one: an error if it fails.
    pub fn check_dirty(&mut self, key: (u64, u64), page: &mut DirtyPage) -> Result<(), FsError> {
        let now = self.now();
        let (due, stamp) = self.due(page.stamp, now);
        page.stamp = stamp;
        if !due {
            return Ok(());
        }
        self.stats.checks += 1;
        if !page.sound() {
            return Err(Corruption::InMemory { ino: key.0, page: key.1 }.into());
        }
        if matches!(self.verify, Verify::AfterCheck(_)) {
            page.stamp = now;
        }
        Ok(())
    }

    /// Caches clean page `key` with the CRC the store verified it against: a copy of
    /// `bytes`, in the buffer of the page it evicts (a full cache under a stream
    /// of reads then allocates nothing).
    pub fn insert(&mut self, key: (u64, u64), bytes: &[u8], crc: u32) {
        if self.capacity == 0 {
            return;
        }
        let mut buf = self.make_room().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(bytes);
        // Read just now, from flash, checked there: stamped as checked.
        let stamp =
            if matches!(self.verify, Verify::AfterCheck(_) | Verify::AfterUse(_)) { self.now() } else { 0 };
        if self.clean.insert(key, CleanPage { bytes: buf, crc, stamp }).is_none() {
            self.order.push_back(key);
        }
        // The order queue holds keys evicted or forgotten since: bounded at twice the pages.
        if self.order.len() > 2 * self.capacity.max(16) {
            let clean = &self.clean;
            self.order.retain(|k| clean.contains_key(k));
        }
    }

    /// Evicts the oldest pages until there is room for one; the last one's buffer back.
    fn make_room(&mut self) -> Option<Vec<u8>> {
        let mut freed = None;
        while self.clean.len() >= self.capacity {
            match self.order.pop_front() {
                Some(old) => {
                    if let Some(p) = self.clean.remove(&old) {
                        freed = Some(p.bytes);
                    }
                }
                None => break,
            }
        }
        freed
    }

    /// Forgets page `key` (it is dirty now, or gone).
    pub fn forget(&mut self, key: (u64, u64)) {
        self.clean.remove(&key);
    }

    /// Forgets the pages of `ino` from page `from` on (a truncate, an unlink, a hole).
    pub fn forget_from(&mut self, ino: u64, from: u64) {
        self.clean.retain(|k, _| k.0 != ino || k.1 < from);
    }

    pub fn len(&self) -> usize {
        self.clean.len()
    }

    /// Checks up to `max` clean pages from the cursor on, dropping those that fail: (pages
    /// checked, pages caught).
    pub fn check_some(&mut self, max: usize) -> (usize, usize) {
        let mut keys: Vec<(u64, u64)> = self.clean.keys().copied().filter(|&k| k >= self.cursor.0).collect();
        keys.sort_unstable();
        keys.truncate(max);
        let mut caught = 0;
        for k in &keys {
            let page = &self.clean[k];
            if crc::crc32c(&page.bytes) != page.crc {
                self.clean.remove(k);
                caught += 1;
            }
        }
        self.stats.checks += keys.len() as u64;
        self.stats.clean_caught += caught as u64;
        // Round and round: past the last key, from the start again.
        self.cursor.0 = keys.last().map_or((0, 0), |&(i, p)| (i, p + 1));
        (keys.len(), caught)
    }

    /// Flips bit `bit` of cached clean page `key` (memory-error injection): whether it was
    /// cached.
    pub fn flip(&mut self, key: (u64, u64), bit: usize) -> bool {
        let Some(page) = self.clean.get_mut(&key) else { return false };
        page.bytes[bit / 8 % LOGICAL_PAGE] ^= 1 << (bit % 8);
        true
    }
}

/// Where a memory error was injected ([`Fs::flip_cached`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cached {
    Clean,
    Dirty,
    /// The page is not in memory: nothing flipped.
    No,
}

/// What one step of the background checker did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheCheck {
    pub checked: usize,
    /// Clean pages that failed, dropped (the next read takes them from flash).
    pub clean_caught: usize,
    /// Dirty pages that failed and the tier could not heal: (ino, page). Reads of them fail,
    /// and flash will refuse them.
    pub dirty_caught: Vec<(u64, u64)>,
}

impl<N: Nand> Fs<N> {
    /// The background checker's step: up to `max` clean and `max` dirty pages checked against
    /// their CRCs, going on from where the last step stopped (round and round).
    pub fn check_cache(&mut self, max: usize) -> CacheCheck {
        let (checked, clean_caught) = self.cache.check_some(max);
        let from = self.cache.cursor.1;
        let mut report = CacheCheck { checked, clean_caught, dirty_caught: Vec::new() };
        let mut last = None;
        let mut failed = Vec::new();
        for (&key, page) in self.wb.from(from).take(max) {
            report.checked += 1;
            last = Some(key);
            if !page.sound() {
                failed.push(key);
            }
        }
        report.dirty_caught = failed.into_iter().filter(|&key| !self.heal_dirty(key)).collect();
        self.cache.stats.checks += (report.checked - checked) as u64;
        self.cache.stats.dirty_caught += report.dirty_caught.len() as u64;
        self.cache.cursor.1 = last.map_or((0, 0), |(i, p)| (i, p + 1));
        report
    }

    /// The cache's counts, and the clean pages it holds.
    pub fn cache_stats(&self) -> (CacheStats, usize) {
        (self.cache.stats, self.cache.len())
    }

    /// How reads check cached pages from now on.
    pub fn set_verify(&mut self, verify: Verify) {
        self.cache.set_verify(verify);
        self.opts.verify = verify;
    }

    /// The `n`th dirty page held (counted round from the first), for memory-error injection:
    /// `None` when none is held.
    pub fn nth_dirty_page(&self, n: usize) -> Option<(Ino, u64)> {
        let count = self.wb.from((0, 0)).count();
        let (&(ino, index), _) = self.wb.from((0, 0)).nth(n.checked_rem(count)?)?;
        Some((Ino(ino), index))
    }

    /// Flips bit `bit` (of 32,768) of logical page `index` of `ino` where it sits in memory,
    /// dirty or clean (memory-error injection, for tests and demos).
    pub fn flip_cached(&mut self, ino: Ino, index: u64, bit: usize) -> Cached {
        let key = (ino.0, index);
        if let Some(p) = self.wb.get_mut(key) {
            p.bytes[bit / 8 % LOGICAL_PAGE] ^= 1 << (bit % 8);
            return Cached::Dirty;
        }
        if self.cache.flip(key, bit) {
            return Cached::Clean;
        }
        Cached::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_strategies_parse_and_bad_ones_are_refused() {
        assert_eq!("every".parse::<Verify>(), Ok(Verify::Every));
        assert_eq!("background".parse::<Verify>(), Ok(Verify::Background));
        assert_eq!("last-check=tick".parse::<Verify>(), Ok(Verify::AfterCheck(TICK)));
        assert_eq!("last-use=20ms".parse::<Verify>(), Ok(Verify::AfterUse(Duration::from_millis(20))));
        assert_eq!("last-check=1s".parse::<Verify>(), Ok(Verify::AfterCheck(Duration::from_secs(1))));
        for bad in ["", "sometimes", "last-check", "last-check=", "last-check=5", "last-use=1h", "every=1s"] {
            assert!(bad.parse::<Verify>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_partial_overwrite_keeps_an_earlier_flip_caught_and_a_clean_one_matches() {
        let mut rng = bitmend_media::rng::Rng::new(7);
        let mut bytes = vec![0u8; LOGICAL_PAGE];
        rng.fill(&mut bytes);
        let mut page = DirtyPage::new(bytes.clone());
        for _ in 0..200 {
            let at = rng.below(LOGICAL_PAGE as u64) as usize;
            let len = 1 + rng.below((LOGICAL_PAGE - at) as u64) as usize;
            let mut data = vec![0u8; len];
            rng.fill(&mut data);
            page.overwrite(at, &data);
            bytes[at..at + len].copy_from_slice(&data);
            assert_eq!(page.crc, crc::crc32c(&bytes), "the CRC follows the bytes");
        }
        // A flip in memory, then an overwrite elsewhere: still a mismatch (a recomputed CRC
        // would have made the flipped page look sound).
        page.bytes[100] ^= 0x10;
        page.overwrite(2000, &[1, 2, 3, 4]);
        assert!(!page.sound());
        page.cut(3000);
        assert!(!page.sound());
    }

    #[test]
    fn a_flipped_clean_page_is_dropped_on_a_due_read_and_kept_when_not_due() {
        let bytes = vec![0xA5u8; LOGICAL_PAGE];
        let crc = crc::crc32c(&bytes);
        for (verify, caught) in [
            (Verify::Every, true),
            (Verify::AfterCheck(Duration::from_secs(3600)), false),
            (Verify::AfterUse(Duration::from_secs(3600)), false),
            (Verify::Background, false),
        ] {
            let mut cache = PageCache::new(8, verify);
            cache.insert((5, 1), &bytes, crc);
            assert!(cache.flip((5, 1), 77));
            let got = cache.get((5, 1));
            assert_eq!(got.is_none(), caught, "{verify:?}");
            assert_eq!(cache.stats.clean_caught, caught as u64);
            // The background checker finds it whatever the strategy.
            if !caught {
                assert_eq!(cache.check_some(100), (1, 1));
                assert_eq!(cache.get((5, 1)), None);
            }
        }
    }

    #[test]
    fn the_cache_holds_at_most_its_capacity_and_forgets_what_it_is_told() {
        let mut cache = PageCache::new(4, Verify::Every);
        let page = |n: u8| vec![n; LOGICAL_PAGE];
        for i in 0..10u64 {
            cache.insert((1, i), &page(i as u8), crc::crc32c(&page(i as u8)));
            assert!(cache.len() <= 4);
        }
        assert_eq!(cache.get((1, 9)).map(|p| p.0), Some(page(9)));
        assert_eq!(cache.get((1, 0)), None);
        cache.forget_from(1, 8);
        assert_eq!(cache.get((1, 9)), None);
        assert_eq!(cache.get((1, 7)).map(|p| p.0), Some(page(7)));
        cache.forget((1, 7));
        assert_eq!(cache.get((1, 7)), None);
    }
}
