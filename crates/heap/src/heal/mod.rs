//! A heap that heals: an algebraic signature per protected page and Reed–Solomon parity per
//! stripe of pages, kept up to date by every write (PRIMS's protection, on live heap data).
//!
//! [`Healed`] wraps the pool's region. Every store into the protected pages goes through it:
//! it copies the bytes about to be overwritten, stores, then patches the stripe's parity pages
//! by `column * (old ^ new)` and the page's signature incrementally, and the parity pages'
//! signatures by the same column (signatures are linear, so a parity page's signature is the
//! parity row applied to its stripe's data signatures). No caller can forget it: the journal,
//! the allocator, transactions and recovery all store through the same region.
//!
//! A patch is only as good as the old bytes it starts from: a wild write into bytes that a
//! store then overwrites would be folded into the parity and the signature, and a later
//! rebuild would bring the wild bytes back, matching their signature. So every line a store
//! overwrites is first checked against its line check (a CRC-32C per 64-byte line, kept
//! beside the signatures; a few ns a line, where signing the page would read all 4 KiB).
//! A line that fails sends its stripe to be checked and rebuilt before the store goes on.
//!
//! Parity and signature lines are not flushed when patched. Each is noted once (NVMalloc's
//! cache line counters: the count of a transaction's lines still in the cache) and all are
//! flushed just before the next fence, which is the one that makes the data they describe
//! durable. A crash between can leave a page, its parity and its signature of different ages;
//! recovery recomputes them for every range the journal names ([`Healed::recompute`]).

mod geometry;
pub(crate) mod mend;
pub(crate) mod read_checker;
pub(crate) mod reads;
pub(crate) mod repair;
mod scrub;
mod scrubber;

pub use geometry::{Geometry, StripeShape, CHECK, LINE, MAX_K, MAX_M, PAGE, SIG, ZERO_LINE_CRC};
pub use read_checker::ReadCheck;
pub use reads::TICK;
pub use scrub::{ScrubPass, ScrubReport};
pub use scrubber::{Scrubber, ScrubberOptions, ScrubberReport};

use bitmend_code::rs::Codec;
use bitmend_code::sig::{Sig64, Signer};
use bitmend_media::pmem::{Region, RegionError};

/// Counts of the healing work, for the bench and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealStats {
    /// Stores into protected pages.
    pub stores: u64,
    /// Parity and signature lines written back.
    pub lines_flushed: u64,
    /// Fences.
    pub fences: u64,
    /// Pages checked against their signature.
    pub pages_checked: u64,
    /// Pages rebuilt from their stripe.
    pub pages_repaired: u64,
}

/// The state of the protection: where everything is, and the signatures in DRAM.
pub(crate) struct Shield {
    pub geo: Geometry,
    /// `None` with no parity pages.
    pub codec: Option<Codec>,
    pub signer: Signer<4>,
    /// The signature table, as the stores left it (the medium's copy may lag until a fence).
    pub sigs: Vec<Sig64>,
    /// Runs of lines (first, end) of parity and signatures stored since the last fence, to
    /// flush before it.
    pending: Vec<(usize, usize)>,
    /// Flush each parity and signature line as it is stored, not once before the fence (the
    /// bench's "without counters" rows).
    pub eager: bool,
    /// Check the lines a store overwrites first (off while a pool is opened: recovery
    /// stores into ranges a crash may have left unchecked, then recomputes them).
    pub verify: bool,
    /// The change of the store being patched (see [`Shield::take_delta`]).
    delta: Vec<u8>,
    /// Data pages whose signatures a recompute leaves as they are: damage on them could not
    /// be rebuilt before recovery, and they must read as damaged (see [`mend`]).
    keep_sigs: std::collections::BTreeSet<u64>,
    pub stats: HealStats,
}

/// A region whose protected pages carry signatures and parity (see the module docs).
pub struct Healed<R: Region> {
    inner: R,
    pub(crate) shield: Option<Box<Shield>>,
}

impl<R: Region> Healed<R> {
    /// Unprotected until [`Healed::protect`]: stores pass through.
    pub fn new(inner: R) -> Healed<R> {
        Healed { inner, shield: None }
    }

    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// The region below, whose stores bypass the protection (a wild write, for tests).
    pub fn inner_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Protects the pages of `geo`, whose signature table (on the medium) describes them.
    pub(crate) fn protect(&mut self, geo: Geometry) {
        let bytes = self.inner.bytes();
        let sigs = (0..geo.sig_count())
            .map(|n| {
                let at = geo.sig_at(n) as usize;
                Sig64::from_u64(bitmend_code::le::get_u64(bytes, at))
            })
            .collect();
        let codec = (geo.shape.m > 0)
            .then(|| Codec::new(geo.shape.k as usize, geo.shape.m as usize).expect("a checked shape"));
        self.shield = Some(Box::new(Shield {
            geo,
            codec,
            signer: Signer::new(),
            sigs,
            pending: Vec::new(),
            eager: false,
            verify: false,
            delta: Vec::new(),
            keep_sigs: Default::default(),
            stats: HealStats::default(),
        }));
    }

    pub fn stats(&self) -> HealStats {
        self.shield.as_ref().map(|s| s.stats).unwrap_or_default()
    }

    /// The part of `[at, at + len)` that is protected, if any.
    fn protected(&self, at: usize, len: usize) -> Option<(usize, usize)> {
        let s = self.shield.as_ref()?;
        let (lo, hi) = (s.geo.base as usize, s.geo.limit() as usize);
        let (start, end) = (at.max(lo), (at + len).min(hi));
        (start < end).then_some((start, end))
    }

    /// Stores `data` at `at` with `store`, patching parity and signatures for the protected
    /// part by the change, taken before the store (old ^ new, padded to whole lines).
    fn store_with(
        &mut self,
        at: usize,
        data: &[u8],
        store: impl FnOnce(&mut R) -> Result<(), RegionError>,
    ) -> Result<(), RegionError> {
        let Some((start, end)) = self.protected(at, data.len()) else {
            return store(&mut self.inner);
        };
        let (base, stop) = (start & !63, end.next_multiple_of(LINE as usize));
        let shield = self.shield.as_ref().expect("protected");
        shield.touch_parity(self.inner.bytes(), base, end);
        if shield.verify && !shield.lines_match(self.inner.bytes(), base, stop) {
            self.heal_lines(base, stop)?;
        }
        let shield = self.shield.as_mut().expect("protected");
        shield.take_delta(&self.inner.bytes()[base..], start - base, &data[start - at..end - at]);
        store(&mut self.inner)?;
        let shield = self.shield.as_mut().expect("protected");
        shield.patch(&mut self.inner, base)?;
        shield.set_checks(&mut self.inner, base, stop)
    }

    /// Lines in `[base, stop)` failed their checks before a store: each page they are on is
    /// checked with its stripe and rebuilt if bad; a page that matches its signature had its
    /// check entries damaged, and they are rewritten from its bytes. A page beyond repair
    /// refuses the store.
    fn heal_lines(&mut self, base: usize, stop: usize) -> Result<(), RegionError> {
        let geo = self.shield.as_ref().expect("protected").geo;
        let (first, last) = (geo.page_of(base as u64), geo.page_of(stop as u64 - 1));
        let (Some(first), Some(last)) = (first, last) else { return Ok(()) };
        for p in first..=last {
            let (stripe, _) = geo.locate(p);
            let check = self.check_stripe(stripe)?;
            if !check.repaired {
                let at = geo.page_at(p) as usize;
                return Err(RegionError::Damaged { offset: at, len: PAGE as usize });
            }
            let shield = self.shield.as_mut().expect("protected");
            let at = geo.page_at(p) as usize;
            shield.set_checks(&mut self.inner, at, at + PAGE as usize)?;
        }
        Ok(())
    }

    /// Computes every signature and parity page from the pages as they are (a pool being
    /// made: a fresh file is all zeros, and writes nothing but the table's changed lines; a
    /// reused region gets parity for whatever it holds), then fences.
    pub(crate) fn rebuild_all(&mut self) -> Result<(), RegionError> {
        let shield = self.shield.as_mut().expect("protected");
        let geo = shield.geo;
        let mut zero = vec![false; geo.pages as usize];
        for p in 0..geo.pages {
            let bytes = page_bytes(&self.inner, &geo, p);
            zero[p as usize] = bitmend_code::le::is_zero(bytes);
            shield.sigs[p as usize] = if zero[p as usize] { Sig64::ZERO } else { shield.signer.sign(bytes) };
        }
        for p in (0..geo.pages).filter(|&p| !zero[p as usize]) {
            let at = geo.page_at(p) as usize;
            shield.set_checks(&mut self.inner, at, at + PAGE as usize)?;
        }
        for stripe in 0..geo.stripes {
            let members_zero =
                (0..geo.shape.k as usize).filter_map(|i| geo.member(stripe, i)).all(|p| zero[p as usize]);
            let parity_zero = (0..geo.shape.m as usize).all(|j| {
                let at = geo.parity_page(stripe, j) as usize;
                bitmend_code::le::is_zero(&self.inner.bytes()[at..at + PAGE as usize])
            });
            if members_zero && parity_zero {
                for j in 0..geo.shape.m as usize {
                    shield.sigs[geo.parity_sig(stripe, j) as usize] = Sig64::ZERO;
                }
            } else {
                shield.recompute_parity(&mut self.inner, stripe, 0, PAGE as usize)?;
            }
        }
        // The table: only lines that differ are written (a fresh file stays sparse).
        let mut line = [0u8; 64];
        let end = geo.sig_at(geo.sig_count()) as usize;
        for at in (geo.sigs_at as usize..end).step_by(64) {
            let stop = (at + 64).min(end);
            for (i, b) in line[..stop - at].chunks_mut(SIG as usize).enumerate() {
                let n = (at - geo.sigs_at as usize) / SIG as usize + i;
                b.copy_from_slice(&shield.sigs[n].to_u64().to_le_bytes());
            }
            if self.inner.bytes()[at..stop] != line[..stop - at] {
                self.inner.write(at, &line[..stop - at])?;
                shield.note(&mut self.inner, at, stop - at)?;
            }
        }
        self.fence()
    }

    /// Recomputes the signatures of the pages holding `[at, at + len)` from their bytes, and
    /// the parity of those bytes from their stripes: after a crash that may have torn the
    /// patches of stores the journal names (their bytes are as the journal vouches).
    pub(crate) fn recompute(&mut self, at: u64, len: u64) -> Result<(), RegionError> {
        let Some((start, end)) = self.protected(at as usize, len as usize) else {
            return Ok(());
        };
        let shield = self.shield.as_mut().expect("protected");
        shield.recompute(&mut self.inner, start as u64, end as u64)?;
        shield.set_checks(&mut self.inner, start & !63, end.next_multiple_of(LINE as usize))
    }

    /// Checks the lines each store overwrites from now on (see the module docs).
    pub(crate) fn start_verifying(&mut self) {
        if let Some(s) = self.shield.as_mut() {
            s.verify = true;
        }
    }
}

impl Shield {
    /// Whether every line of `[base, stop)` (whole lines) matches its check (all do in a
    /// pool without checks).
    pub(crate) fn lines_match(&self, bytes: &[u8], base: usize, stop: usize) -> bool {
        let Some(checks) = self.geo.check_at(base as u64) else { return true };
        let (checks, line) = (checks as usize, LINE as usize);
        // A kilobyte at a time: a mismatch stops the check soon after it.
        let mut crcs = [0u32; 16];
        let (mut at, mut i) = (base, 0);
        while at < stop {
            let n = (stop - at).div_ceil(line).min(crcs.len());
            checks_of(&bytes[at..at + n * line], &mut crcs);
            let stored = |k: usize| bitmend_code::le::get_u32(bytes, checks + (i + k) * CHECK as usize);
            if crcs[..n].iter().enumerate().any(|(k, &c)| c != stored(k)) {
                return false;
            }
            (at, i) = (at + n * line, i + n);
        }
        true
    }

    /// Whether `line`, as the line at `at` would be, matches that line's check.
    fn check_matches(&self, bytes: &[u8], at: usize, line: &[u8]) -> bool {
        let Some(checks) = self.geo.check_at(at as u64) else { return true };
        check_of(line) == bitmend_code::le::get_u32(bytes, checks as usize)
    }

    /// Rewrites the checks of the lines of `[base, stop)` (whole lines) from their bytes.
    pub(crate) fn set_checks<R: Region>(
        &mut self,
        inner: &mut R,
        base: usize,
        stop: usize,
    ) -> Result<(), RegionError> {
        if self.geo.checks_at.is_none() {
            return Ok(());
        }
        let mut checks = [0u8; 256];
        let mut crcs = [0u32; 256 / CHECK as usize];
        let mut at = base;
        while at < stop {
            let n = ((stop - at) / LINE as usize).min(crcs.len());
            checks_of(&inner.bytes()[at..at + n * LINE as usize], &mut crcs);
            for (c, crc) in checks.chunks_exact_mut(CHECK as usize).zip(&crcs[..n]) {
                c.copy_from_slice(&crc.to_le_bytes());
            }
            let to = self.geo.check_at(at as u64).expect("a pool with checks") as usize;
            let len = n * CHECK as usize;
            if inner.bytes()[to..to + len] != checks[..len] {
                inner.write(to, &checks[..len])?;
                self.note(inner, to, len)?;
            }
            at += n * LINE as usize;
        }
        Ok(())
    }

    /// Loads one byte of every parity line that bytes `[start, end)` map to, so that their
    /// misses overlap with each other and with the work before the patch (a patch's
    /// read-modify-write would take them one line at a time), and with the line checks'.
    fn touch_parity(&self, bytes: &[u8], start: usize, end: usize) {
        let mut x = 0u8;
        let mut pos = start as u64;
        while pos < end as u64 {
            let p = self.geo.page_of(pos).expect("a protected byte");
            let off = pos - self.geo.page_at(p);
            let stop = (end as u64).min(self.geo.page_at(p) + PAGE);
            let (stripe, _) = self.geo.locate(p);
            for j in 0..self.geo.shape.m as usize {
                let at = self.geo.parity_page(stripe, j) + off;
                for line in (at..at + (stop - pos)).step_by(64) {
                    x ^= bytes[line as usize];
                }
            }
            pos = stop;
        }
        std::hint::black_box(x);
    }

    /// The change a store of `new` at `head` bytes into `old` makes, in `delta`: zeros
    /// from the line start, old ^ new, zeros to the line end.
    fn take_delta(&mut self, old: &[u8], head: usize, new: &[u8]) {
        let end = head + new.len();
        let span = end.next_multiple_of(64);
        self.delta.clear();
        self.delta.resize(head, 0);
        self.delta.extend(old[head..end].iter().zip(new).map(|(a, b)| a ^ b));
        self.delta.resize(span, 0);
    }

    /// Parity and signatures after the bytes from `at` (a line start) changed by `delta`.
    fn patch<R: Region>(&mut self, inner: &mut R, at: usize) -> Result<(), RegionError> {
        self.stats.stores += 1;
        let delta = std::mem::take(&mut self.delta);
        let mut done = 0;
        let mut result = Ok(());
        while done < delta.len() && result.is_ok() {
            let pos = (at + done) as u64;
            let p = self.geo.page_of(pos).expect("a protected byte");
            let off = (pos - self.geo.page_at(p)) as usize;
            let n = (PAGE as usize - off).min(delta.len() - done);
            result = self.patch_page(inner, p, off, &delta[done..done + n]);
            done += n;
        }
        self.delta = delta;
        result
    }

    /// Page `p`'s signature, and its stripe's parity and their signatures, after its bytes
    /// from `off` (a line start) changed by `delta` (whole lines).
    fn patch_page<R: Region>(
        &mut self,
        inner: &mut R,
        p: u64,
        off: usize,
        delta: &[u8],
    ) -> Result<(), RegionError> {
        let (stripe, index) = self.geo.locate(p);
        let change = self.signer.sign_groups_at(delta, off / 64);
        let after = self.sigs[p as usize].xor(change);
        self.set_sig(inner, p, after)?;
        let Some(codec) = &self.codec else {
            return Ok(());
        };
        let m = self.geo.shape.m as usize;
        let mut column = [0u8; MAX_M as usize];
        column[..m].copy_from_slice(codec.parity_column(index));
        let engine = codec.engine();
        for (j, &c) in column[..m].iter().enumerate() {
            let at = self.geo.parity_page(stripe, j) as usize + off;
            inner.update(at, delta.len(), &mut |dst| engine.mul_acc(c, delta, dst))?;
            self.note(inner, at, delta.len())?;
            let n = self.geo.parity_sig(stripe, j);
            let sig = self.sigs[n as usize].xor(change.scale(c));
            self.set_sig(inner, n, sig)?;
        }
        Ok(())
    }

    /// Sets signature `n`, in DRAM and on the medium.
    fn set_sig<R: Region>(&mut self, inner: &mut R, n: u64, sig: Sig64) -> Result<(), RegionError> {
        self.sigs[n as usize] = sig;
        let at = self.geo.sig_at(n) as usize;
        inner.write(at, &sig.to_u64().to_le_bytes())?;
        self.note(inner, at, SIG as usize)
    }

    /// Notes lines stored, to be flushed before the next fence (or now, if eager).
    fn note<R: Region>(&mut self, inner: &mut R, at: usize, len: usize) -> Result<(), RegionError> {
        if self.eager {
            self.stats.lines_flushed += ((at + len).div_ceil(64) - at / 64) as u64;
            return inner.flush(at, len);
        }
        // As a run of lines, grown in place when it continues the last one (a store's parity
        // lines do): a fence then sorts a few runs, not every line (a sort of a 4 KiB store's
        // lines one by one took a tenth of its transaction).
        let (first, end) = (at / 64, (at + len).div_ceil(64));
        match self.pending.last_mut() {
            Some(last) if last.0 <= first && first <= last.1 => last.1 = last.1.max(end),
            _ => self.pending.push((first, end)),
        }
        Ok(())
    }

    /// Flushes every noted line once.
    fn flush_pending<R: Region>(&mut self, inner: &mut R) -> Result<(), RegionError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.pending.sort_unstable();
        // Runs that overlap or touch are merged, so that each line is flushed once.
        let (mut from, mut to) = self.pending[0];
        let mut lines = 0;
        for i in 1..=self.pending.len() {
            match self.pending.get(i) {
                Some(&(a, b)) if a <= to => to = to.max(b),
                next => {
                    inner.flush(from * 64, (to - from) * 64)?;
                    lines += to - from;
                    if let Some(&(a, b)) = next {
                        (from, to) = (a, b);
                    }
                }
            }
        }
        self.stats.lines_flushed += lines as u64;
        self.pending.clear();
        Ok(())
    }

    fn recompute<R: Region>(&mut self, inner: &mut R, start: u64, end: u64) -> Result<(), RegionError> {
        let mut pos = start;
        while pos < end {
            let p = self.geo.page_of(pos).expect("a protected byte");
            let page_end = self.geo.page_at(p) + PAGE;
            let stop = end.min(page_end);
            let (stripe, _) = self.geo.locate(p);
            let off = (pos - self.geo.page_at(p)) as usize;
            self.recompute_parity(inner, stripe, off, (stop - pos) as usize)?;
            if !self.keep_sigs.contains(&p) {
                let sig = self.signer.sign(page_bytes(inner, &self.geo, p));
                self.set_sig(inner, p, sig)?;
            }
            pos = stop;
        }
        Ok(())
    }

    /// Parity bytes `[off, off + len)` of `stripe`, from its data pages, and the parity
    /// pages' signatures after.
    fn recompute_parity<R: Region>(
        &mut self,
        inner: &mut R,
        stripe: u64,
        off: usize,
        len: usize,
    ) -> Result<(), RegionError> {
        let Some(codec) = &self.codec else {
            return Ok(());
        };
        let (k, m) = (self.geo.shape.k as usize, self.geo.shape.m as usize);
        let zeros = vec![0u8; len];
        let mut parity = vec![vec![0u8; len]; m];
        {
            let bytes = inner.bytes();
            let data: Vec<&[u8]> = (0..k)
                .map(|i| match self.geo.member(stripe, i) {
                    Some(p) => {
                        let at = (self.geo.page_at(p) as usize) + off;
                        &bytes[at..at + len]
                    }
                    None => &zeros[..],
                })
                .collect();
            let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
            codec.encode(&data, &mut outs).expect("equal lengths");
        }
        for (j, bytes) in parity.iter().enumerate() {
            let at = self.geo.parity_page(stripe, j) as usize;
            inner.write(at + off, bytes)?;
            self.note(inner, at + off, len)?;
            let sig = self.signer.sign(&inner.bytes()[at..at + PAGE as usize]);
            self.set_sig(inner, self.geo.parity_sig(stripe, j), sig)?;
        }
        Ok(())
    }
}

/// A line's check: its CRC-32C XOR that of a zero line (FORMAT.md section 9).
fn check_of(line: &[u8]) -> u32 {
    bitmend_code::crc::crc32c(line) ^ ZERO_LINE_CRC
}

/// [`check_of`] each whole line of `lines`, into `out`: several lines at once, which a run of
/// lines (a store's, a read's) always is.
fn checks_of(lines: &[u8], out: &mut [u32]) {
    let n = lines.len() / LINE as usize;
    bitmend_code::crc::crc32c_lines(lines, &mut out[..n]);
    out[..n].iter_mut().for_each(|c| *c ^= ZERO_LINE_CRC);
}

/// The bytes of data page `p`.
pub(crate) fn page_bytes<'a, R: Region>(inner: &'a R, geo: &Geometry, p: u64) -> &'a [u8] {
    let at = geo.page_at(p) as usize;
    &inner.bytes()[at..at + PAGE as usize]
}

impl<R: Region> Region for Healed<R> {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn bytes(&self) -> &[u8] {
        self.inner.bytes()
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.store_with(offset, data, |r| r.write(offset, data))
    }
    fn write_streaming(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.store_with(offset, data, |r| r.write_streaming(offset, data))
    }
    fn update(&mut self, offset: usize, len: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<(), RegionError> {
        if self.protected(offset, len).is_none() {
            return self.inner.update(offset, len, f);
        }
        // The new bytes first, in a copy, then stored like any write.
        if offset.checked_add(len).is_none_or(|end| end > self.inner.len()) {
            return Err(RegionError::Range { offset, len, size: self.inner.len() });
        }
        let mut new = self.inner.bytes()[offset..offset + len].to_vec();
        f(&mut new);
        self.write(offset, &new)
    }
    fn flush(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        self.inner.flush(offset, len)
    }
    fn fence(&mut self) -> Result<(), RegionError> {
        if let Some(s) = self.shield.as_mut() {
            s.flush_pending(&mut self.inner)?;
            s.stats.fences += 1;
        }
        self.inner.fence()
    }
    fn line_writes(&self) -> &[u32] {
        self.inner.line_writes()
    }
    fn guard(&mut self, start: usize, end: usize) -> Result<(), RegionError> {
        self.inner.guard(start, end)
    }
    fn seal(&mut self) -> Result<(), RegionError> {
        self.inner.seal()
    }
    /// Damage, as the media layer injects it: the protection does not see it.
    fn corrupt(&mut self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.inner.corrupt(offset, data)
    }
}
