//! The tier under the flash file system: [`DirtyTier`] as its [`DirtyState`], and a mount
//! that recovers what a tier held into the file system before it serves anything.

use std::ops::Range;

use bitmend_flashfs::{
    DirtyRecovery, DirtyRecoveryReport, DirtyState, DirtyStateError, Fs, FsError, FsOptions, MountReport,
    PagePut,
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

    fn put_nodes(&mut self, nodes: &[u8]) -> Result<(), DirtyStateError> {
        DirtyTier::put_nodes(self, nodes).map_err(state_error)
    }

    fn checkout(&mut self) -> Result<(), DirtyStateError> {
        DirtyTier::checkout(self).map_err(state_error)
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// The chip and the tier's two regions as a crash leaves them: nothing more is written.
/// (The tier's regions come back only if the mount's tier is a `DirtyTier<L, H>`.)
pub fn crash<N: Nand, L: Region + 'static, H: Region + 'static>(fs: Fs<N>) -> (N, Option<(L, H)>) {
    let (nand, tier) = fs.into_parts();
    let regions =
        tier.and_then(|t| t.into_any().downcast::<DirtyTier<L, H>>().ok()).map(|t| t.into_regions());
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

/// Mounts the file system on `nand` with its dirty state in the tier of `log` and `heap`,
/// which must hold a tier (made by [`DirtyTier::create_for`]). Whatever the tier held after
/// a crash is applied first (`Fs::open_recovering`), written to flash with a checkpoint,
/// and checked out; the tier then takes the mount's dirty state.
pub fn mount<N, L, H>(
    nand: N,
    opts: FsOptions,
    log: L,
    heap: H,
) -> Result<(Fs<N>, MountReport, TierReport), TierMountError>
where
    N: Nand,
    L: Region + 'static,
    H: Region + 'static,
{
    let (mut tier, found) = DirtyTier::open(log, heap)?;
    let mut report = report_of(&found);
    let Recovered { pages, nodes, owner, .. } = found;
    let dirty = DirtyRecovery {
        owner,
        records: nodes,
        pages: pages.into_iter().map(|p| (p.ino, p.index, p.bytes, p.crc)).collect(),
    };
    let (mut fs, mount, applied) = Fs::open_recovering(nand, opts, dirty)?;
    report.applied = applied;
    let fs_id = fs.store().fs_id();
    if tier.owner() != fs_id {
        tier.bind(fs_id)?;
    }
    fs.attach_dirty_state(Box::new(tier));
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
    Ok((fs, mount, report))
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
        still_in_tier: false,
    }
}
