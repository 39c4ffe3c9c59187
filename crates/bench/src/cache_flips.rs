//! `bitmend bench cache`, memory errors (Loris's Tables IV and V): bits flipped in the pages
//! the file system holds, clean or dirty, at random moments of a PostMark run, with each
//! read strategy. Each flip ends one of three ways:
//! - *detected*: a check caught it before the application read the page (a clean page read
//!   again from flash, or a read refused; the application then writes the page again);
//! - *propagated*: the application read the flipped bytes;
//! - *discarded*: the page was overwritten whole or deleted first, or, clean and never
//!   checked, dropped at the remount.
//!
//! The protection is detected / (detected + propagated), as in Loris. At the end, after a
//! sync and a remount, every page is read from flash: a flip made while a page was dirty
//! must fail that read, never return wrong bytes under a valid CRC. The bench asserts it.

use std::collections::{BTreeMap, HashMap};

use bitmend_flashfs::{Cached, Compression, Fs, FsConfig, FsError, FsOptions, Ino, SetAttr, Verify, ROOT};
use bitmend_media::nand::{Geometry, RamNand, Timing};
use bitmend_media::rng::Rng;

use crate::postmark::{Op, Workload};
use bitmend_flashfs::Corruption;

const PAGE: usize = 4096;

/// How the flips of one run ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    pub injected: u64,
    pub detected: u64,
    pub propagated: u64,
    pub discarded: u64,
    /// Pages read back from flash after the remount with bytes other than the model's (must
    /// be 0: a flip while dirty fails its CRC on flash).
    pub wrong_from_flash: u64,
}

impl Outcome {
    /// Loris's P%: of the flips the application would have met, the share caught first.
    pub fn protection(&self) -> f64 {
        100.0 * self.detected as f64 / (self.detected + self.propagated).max(1) as f64
    }
}

/// The run's file system, the model of every file, and the flips not yet ended.
struct Run {
    fs: Fs<RamNand>,
    files: HashMap<u64, (Ino, Vec<u8>)>,
    flips: BTreeMap<(u64, u64), u64>,
    out: Outcome,
}

impl Run {
    /// Writes `page` of file `id` again from the model (what an application does after EIO):
    /// cut to the page's start and written from there, so no byte of the old page survives.
    fn rewrite(&mut self, id: u64, page: u64) {
        let (ino, want) = &self.files[&id];
        let (ino, at) = (*ino, page as usize * PAGE);
        self.fs.setattr(ino, SetAttr { size: Some(at as u64), ..SetAttr::default() }).expect("cut");
        self.fs.write(ino, at as u64, &want[at..]).expect("rewrite");
    }

    /// The flips on `page` of `id` end as `how`.
    fn end(&mut self, ino: Ino, page: u64, how: fn(&mut Outcome) -> &mut u64) {
        if let Some(n) = self.flips.remove(&(ino.0, page)) {
            *how(&mut self.out) += n;
        }
    }

    /// Reads file `id` page by page, as the application would use it.
    fn read(&mut self, id: u64) {
        let (ino, len) = (self.files[&id].0, self.files[&id].1.len());
        for page in 0..len.div_ceil(PAGE) as u64 {
            let at = page as usize * PAGE;
            let n = PAGE.min(len - at);
            match self.fs.read(ino, at as u64, n) {
                Ok(bytes) if bytes == self.files[&id].1[at..at + n] => {
                    self.end(ino, page, |o| &mut o.detected)
                }
                Ok(_) => self.end(ino, page, |o| &mut o.propagated),
                Err(
                    FsError::Corrupt(Corruption::InMemory { .. })
                    | FsError::Corrupt(Corruption::Unrecoverable { .. }),
                ) => {
                    self.end(ino, page, |o| &mut o.detected);
                    self.rewrite(id, page);
                }
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// Applies `op` to the file system and the model.
    fn apply(&mut self, op: &Op, body: &[u8]) {
        match *op {
            Op::Create(id, len) => {
                let ino = self
                    .fs
                    .create(ROOT, crate::postmark::name(id).as_bytes(), 0o644, 0, 0)
                    .expect("create")
                    .ino;
                self.fs.write(ino, 0, &body[..len]).expect("write");
                self.files.insert(id, (ino, body[..len].to_vec()));
            }
            Op::Delete(id) => {
                let ino = self.files.remove(&id).expect("live").0;
                self.fs.unlink(ROOT, crate::postmark::name(id).as_bytes()).expect("unlink");
                let gone: Vec<u64> =
                    self.flips.range((ino.0, 0)..=(ino.0, u64::MAX)).map(|(k, _)| k.1).collect();
                gone.into_iter().for_each(|p| self.end(ino, p, |o| &mut o.discarded));
            }
            Op::Read(id) => self.read(id),
            Op::Append(id, len) => {
                let (ino, size) = (self.files[&id].0, self.files[&id].1.len());
                // A page the append writes whole ends its flips; one it changes in part keeps
                // them (its CRC is updated by the change alone).
                for p in size.div_ceil(PAGE)..(size + len) / PAGE {
                    self.end(ino, p as u64, |o| &mut o.discarded);
                }
                loop {
                    match self.fs.write(ino, size as u64, &body[..len]) {
                        Ok(_) => break,
                        // The partial last page was checked on its way in and failed.
                        Err(
                            FsError::Corrupt(Corruption::InMemory { .. })
                            | FsError::Corrupt(Corruption::Unrecoverable { .. }),
                        ) => {
                            let last = (size / PAGE) as u64;
                            self.end(ino, last, |o| &mut o.detected);
                            self.rewrite(id, last);
                        }
                        Err(e) => panic!("append: {e}"),
                    }
                }
                self.files.get_mut(&id).expect("live").1.extend_from_slice(&body[..len]);
            }
        }
    }

    /// Flips a bit of a random page of a random live file, within its bytes.
    fn flip(&mut self, rng: &mut Rng) {
        let ids: Vec<u64> = self.files.keys().copied().collect();
        let Some(&id) = ids.get(rng.below(ids.len().max(1) as u64) as usize) else { return };
        let (ino, len) = (self.files[&id].0, self.files[&id].1.len());
        if len == 0 {
            return;
        }
        let page = rng.below(len.div_ceil(PAGE) as u64);
        let bytes = PAGE.min(len - page as usize * PAGE);
        let bit = rng.below(8 * bytes as u64) as usize;
        if self.fs.flip_cached(ino, page, bit) != Cached::No {
            *self.flips.entry((ino.0, page)).or_default() += 1;
            self.out.injected += 1;
        }
    }
}

/// PostMark `w` with a flip every `every` operations, under `verify`.
pub fn campaign(w: &Workload, body: &[u8], verify: Verify, every: usize, seed: u64) -> Outcome {
    let opts =
        FsOptions { compression: Compression::Lz4, dirty_limit: 1 << 20, verify, ..FsOptions::default() };
    let nand = RamNand::new(Geometry::RCFFS).expect("geometry").with_timing(Timing::NONE);
    let fs = Fs::format(nand, FsConfig::default(), opts).expect("mkfs");
    let mut run = Run { fs, files: HashMap::new(), flips: BTreeMap::new(), out: Outcome::default() };
    w.pool.iter().for_each(|op| run.apply(op, body));
    run.fs.sync().expect("sync");
    let mut rng = Rng::new(seed);
    for (i, op) in w.txns.iter().enumerate() {
        if i % every == 0 {
            run.flip(&mut rng);
        }
        run.apply(op, body);
    }
    // The end: synced, remounted (the cache is gone), every page read from flash.
    run.fs.sync().expect("sync");
    let Run { fs, files, flips, out } = run;
    let fs = Fs::open(fs.unmount().expect("unmount"), opts).expect("remount").0;
    let mut run = Run { fs, files, flips, out };
    let ids: Vec<u64> = run.files.keys().copied().collect();
    for id in ids {
        let (ino, want) = run.files[&id].clone();
        for page in 0..want.len().div_ceil(PAGE) as u64 {
            let at = page as usize * PAGE;
            let n = PAGE.min(want.len() - at);
            match run.fs.read(ino, at as u64, n) {
                Ok(bytes) if bytes == want[at..at + n] => run.end(ino, page, |o| &mut o.discarded),
                Ok(_) => run.out.wrong_from_flash += 1,
                Err(_) => run.end(ino, page, |o| &mut o.detected),
            }
        }
    }
    run.out
}
