//! The tier under the flash file system: [`DirtyTier`] as its [`DirtyState`], and a mount
//! that recovers what a tier held into the file system before it serves anything.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bitmend_flashfs::{
    DirtyRecovery, DirtyRecoveryReport, DirtyState, DirtyStateError, Fs, FsError, FsOptions, MountReport,
    PagePut, TierFill,
};
use bitmend_media::nand::Nand;
use bitmend_media::pmem::Region;

use crate::{DirtyTier, Recovered, TierError};

fn state_error(e: TierError) -> DirtyStateError {
    if e.is_full() || matches!(e, TierError::Log(bitmend_nvlog::LogError::RecordTooLarge { .. })) {
        DirtyStateError::Full
    } else {
        DirtyStateError::Failed { source: Box::new(e) }
    }
}

impl<L: Region + 'static, H: Region + 'static> DirtyState for DirtyTier<L, H> {
    fn put_pages(&mut self, pages: &[PagePut<'_>]) -> Result<(), DirtyStateError> {
        DirtyTier::put_pages(self, pages).map_err(state_error)
    }

    fn drop_pages(&mut self, ino: u64, pages: Range<u64>) -> Result<(), DirtyStateError> {
        self.drop_range(ino, pages).map_err(state_error)
    }

    fn put_nodes(&mut self, nodes: &[u8], request: Option<u64>) -> Result<(), DirtyStateError> {
        match request {
            Some(r) => self.put_request_nodes(r, nodes),
            None => DirtyTier::put_nodes(self, nodes),
        }
        .map_err(state_error)
    }

    fn put_requests(&mut self, requests: &[u64]) -> Result<(), DirtyStateError> {
        DirtyTier::put_requests(self, requests).map_err(state_error)
    }

    fn checkout(&mut self) -> Result<(), DirtyStateError> {
        DirtyTier::checkout(self).map_err(state_error)
    }

    fn fill(&self) -> TierFill {
        DirtyTier::fill(self)
    }

    fn page(&self, ino: u64, index: u64) -> Option<(Vec<u8>, u32)> {
        DirtyTier::page(self, ino, index)
    }
}

/// The tier as a mount hands it to the file system: shared with the [`TieredFs`] that
/// mounted it, which keeps the tier's own type, so that its regions can be had back.
struct SharedTier<L: Region, H: Region>(Arc<Mutex<DirtyTier<L, H>>>);

impl<L: Region, H: Region> SharedTier<L, H> {
    fn lock(&self) -> std::sync::MutexGuard<'_, DirtyTier<L, H>> {
        // A panic while the file system held it left a tier whose records are each whole
        // or absent (its recovery's rule): it is as good as any after a crash.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<L: Region + 'static, H: Region + 'static> DirtyState for SharedTier<L, H> {
    fn put_pages(&mut self, pages: &[PagePut<'_>]) -> Result<(), DirtyStateError> {
        DirtyState::put_pages(&mut *self.lock(), pages)
    }

    fn drop_pages(&mut self, ino: u64, pages: Range<u64>) -> Result<(), DirtyStateError> {
        DirtyState::drop_pages(&mut *self.lock(), ino, pages)
    }

    fn put_nodes(&mut self, nodes: &[u8], request: Option<u64>) -> Result<(), DirtyStateError> {
        DirtyState::put_nodes(&mut *self.lock(), nodes, request)
    }

    fn put_requests(&mut self, requests: &[u64]) -> Result<(), DirtyStateError> {
        DirtyState::put_requests(&mut *self.lock(), requests)
    }

    fn checkout(&mut self) -> Result<(), DirtyStateError> {
        DirtyState::checkout(&mut *self.lock())
    }

    fn fill(&self) -> TierFill {
        DirtyState::fill(&*self.lock())
    }

    fn page(&self, ino: u64, index: u64) -> Option<(Vec<u8>, u32)> {
        DirtyState::page(&*self.lock(), ino, index)
    }
}

/// A file system mounted over a tier ([`mount`]): the file system (it derefs to it), and
/// the tier it writes its dirty state to, by its own type.
pub struct TieredFs<N: Nand, L: Region, H: Region> {
    fs: Fs<N>,
    tier: Arc<Mutex<DirtyTier<L, H>>>,
}

impl<N: Nand, L: Region, H: Region> TieredFs<N, L, H> {
    /// The file system alone (the tier stays attached to it).
    pub fn into_fs(self) -> Fs<N> {
        self.fs
    }

    /// Writes everything out, with a checkpoint, and returns the chip.
    pub fn unmount(self) -> Result<N, FsError> {
        self.fs.unmount()
    }
}

impl<N: Nand, L: Region, H: Region> std::ops::Deref for TieredFs<N, L, H> {
    type Target = Fs<N>;
    fn deref(&self) -> &Fs<N> {
        &self.fs
    }
}

impl<N: Nand, L: Region, H: Region> std::ops::DerefMut for TieredFs<N, L, H> {
    fn deref_mut(&mut self) -> &mut Fs<N> {
        &mut self.fs
    }
}

/// The chip and the tier's two regions as a crash leaves them: nothing more is written.
/// (`None` for the regions only if something else still holds the tier.)
pub fn crash<N: Nand, L: Region, H: Region>(tiered: TieredFs<N, L, H>) -> (N, Option<(L, H)>) {
    let TieredFs { fs, tier } = tiered;
    // The file system's share of the tier goes with it.
    let nand = fs.into_nand();
    let regions = Arc::try_unwrap(tier)
        .ok()
        .map(|m| m.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner).into_regions());
    (nand, regions)
}

/// What a mount over a tier found in it, and did with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierReport {
    /// The tier's own recovery: records read, pages it could not verify, lost chunks.
    pub records: usize,
    pub foreign_records: usize,
    /// Pages a record names whose slot did not verify: (ino, index). Never applied: the file
    /// keeps what the flash holds for them.
    pub unverified: Vec<(u64, u64)>,
    pub lost_chunks: Vec<(u64, usize)>,
    /// Metadata records after a lost chunk, not applied.
    pub withheld_nodes: usize,
    /// Metadata records and pages the tier handed over.
    pub node_records: usize,
    pub pages_found: usize,
    /// What the file system applied of them.
    pub applied: DirtyRecoveryReport,
    /// FUSE requests whose effect the recovered state holds (a supervisor's new worker
    /// answers them from it if they come again).
    pub requests: Vec<u64>,
    /// The chip was too full for the checkpoint that writes the recovered state to flash:
    /// the tier still holds it (the next mount recovers it again), and writes answer ENOSPC
    /// until space is freed.
    pub still_in_tier: bool,
}

impl TierReport {
    /// Whether the tier held anything to recover.
    pub fn recovered_anything(&self) -> bool {
        self.node_records > 0 || self.pages_found > 0 || !self.unverified.is_empty()
    }

    /// Whether anything could not be recovered (the mount names it).
    pub fn lost_anything(&self) -> bool {
        !self.unverified.is_empty()
            || !self.lost_chunks.is_empty()
            || self.withheld_nodes > 0
            || self.applied.nodes_refused > 0
    }
}

/// Why a mount over a tier failed.
#[derive(Debug, thiserror::Error)]
pub enum TierMountError {
    #[error("NVRAM tier: {0}")]
    Tier(#[from] TierError),
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// What [`mount`] gives: the file system over its tier, what the mount found on flash, and
/// what it found in the tier.
pub type Mounted<N, L, H> = (TieredFs<N, L, H>, MountReport, TierReport);

/// Mounts the file system on `nand` with its dirty state in the tier of `log` and `heap`,
/// which must hold a tier (made by [`DirtyTier::create_for`]). Whatever the tier held after
/// a crash is applied first (`Fs::open_recovering`), written to flash with a checkpoint,
/// and checked out; the tier then takes the mount's dirty state.
pub fn mount<N, L, H>(nand: N, opts: FsOptions, log: L, heap: H) -> Result<Mounted<N, L, H>, TierMountError>
where
    N: Nand,
    L: Region + 'static,
    H: Region + 'static,
{
    mount_holding(nand, opts, log, heap, &[])
}

/// [`mount`] for a mount that takes over a connection on which the inodes `held_open` are
/// open: one unlinked while open is kept ([`DirtyRecovery::held_open`]).
pub fn mount_holding<N, L, H>(
    nand: N,
    opts: FsOptions,
    log: L,
    heap: H,
    held_open: &[u64],
) -> Result<Mounted<N, L, H>, TierMountError>
where
    N: Nand,
    L: Region + 'static,
    H: Region + 'static,
{
    let (mut tier, found) = DirtyTier::open(log, heap)?;
    let mut report = report_of(&found);
    let Recovered { pages, nodes, owner, requests, .. } = found;
    let dirty = DirtyRecovery {
        owner,
        records: nodes,
        pages: pages.into_iter().map(|p| (p.ino, p.index, p.bytes, p.crc)).collect(),
        held_open: held_open.to_vec(),
    };
    let (mut fs, mount, applied) = Fs::open_recovering(nand, opts, dirty)?;
    report.applied = applied;
    let fs_id = fs.store().fs_id();
    if tier.owner() != fs_id {
        tier.bind(fs_id)?;
    }
    let tier = Arc::new(Mutex::new(tier));
    fs.attach_dirty_state(Box::new(SharedTier(Arc::clone(&tier))));
    // Kept across the checkpoint's checkout, for a worker that dies before answering them.
    fs.carry_requests(&requests);
    report.requests = requests;
    if report.recovered_anything() {
        // The recovered state on flash, and the tier checked out (the checkpoint does both).
        // A chip too full for it, or a thin image's host too full, mounts as it is: the tier
        // keeps holding the state (it is not checked out), so nothing recovered is lost, and
        // writes answer ENOSPC until there is room.
        match fs.checkpoint() {
            Ok(()) => {}
            Err(e) if e.is_no_space() => {
                // The tier goes on holding the state: it must hold it as recovery kept it.
                report.still_in_tier = true;
                fs.reconcile_dirty_state(&report.applied)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((TieredFs { fs, tier }, mount, report))
}

fn report_of(found: &Recovered) -> TierReport {
    TierReport {
        records: found.records,
        foreign_records: found.foreign_records,
        unverified: found.unverified.clone(),
        lost_chunks: found.lost_chunks.clone(),
        withheld_nodes: found.withheld_nodes,
        node_records: found.nodes.len(),
        pages_found: found.pages.len(),
        applied: DirtyRecoveryReport::default(),
        requests: Vec::new(),
        still_in_tier: false,
    }
}
