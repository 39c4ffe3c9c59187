//! `mount --nvram`: where the NVRAM tier's file lives, how it is laid out, and the mount
//! over it (the tier itself is `bitmend-tier`).
//!
//! One file holds the tier: its dirty state store (a PRIMS log) in the first sixteenth, at
//! least 256 KiB, and its slots (a heap pool) in the rest. By default it lives on /dev/shm,
//! named after the image, so it survives a crash of the daemon; on a DAX file (real NVRAM,
//! or CXL memory) it survives a power cut too. A clean unmount leaves it empty and removes
//! it: a tier file that exists holds the state of a mount that did not end cleanly.

use std::path::{Path, PathBuf};

use crate::flash::Flash;
use bitmend_flashfs::{Fs, FsOptions, MountReport};
use bitmend_media::pmem::{on_tmpfs, MmapRegion, Persistence};
use bitmend_tier::{DirtyTier, TierReport};

use crate::error::CliError;

/// Where the tier of `image` lives unless `--nvram` says otherwise: /dev/shm, named after
/// the image file and a hash of its full path (two images of one name do not share).
pub fn default_path(image: &Path) -> Option<PathBuf> {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return None;
    }
    let full = std::fs::canonicalize(image).unwrap_or_else(|_| image.to_path_buf());
    // FNV-1a: a name, not a checksum.
    let hash = full
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    let name = full.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Some(shm.join(format!("bitmend-{name}-{hash:016x}.nvram")))
}

/// The tier file `--nvram` names: `none` for no tier, empty for the default.
pub fn chosen(arg: &str, image: &Path) -> Result<Option<PathBuf>, CliError> {
    match arg {
        "none" => {
            // A tier left by a mount that did not end cleanly holds acknowledged writes:
            // mounting without it would go on from older state, and a later mount with it
            // would apply it on top of newer.
            if let Some(p) = default_path(image).filter(|p| p.exists()) {
                return Err(CliError::Target(format!(
                    "{} holds dirty state of {} from a mount that did not end cleanly: mount \
                     without --nvram none to recover it, or delete the file to discard it",
                    p.display(),
                    image.display()
                )));
            }
            Ok(None)
        }
        "" => Ok(default_path(image)),
        p => Ok(Some(PathBuf::from(p))),
    }
}

/// A note for commands that open `image` unmounted, when a tier file holds changes that are
/// not on its flash yet (a mount that did not end cleanly): they see the image without them.
pub fn pending_note(image: &Path) -> Option<String> {
    let p = default_path(image).filter(|p| p.exists())?;
    Some(format!(
        "note: {} holds changes to this image that are not on its flash yet (a mount that did          not end cleanly); this command does not see them: mount the image to recover them",
        p.display()
    ))
}

/// Bytes of the log window of a tier file of `len` bytes.
fn log_len(len: usize) -> usize {
    (len / 16).clamp(256 << 10, 16 << 20) / 4096 * 4096
}

/// The tier's two regions in `path`, made with `size` bytes if it does not exist. On tmpfs
/// a persist is a cache-line write-back (the page cache keeps every store across a crash of
/// the process; msync would only cost a system call).
fn regions(path: &Path, size: usize) -> Result<(MmapRegion, MmapRegion, bool), CliError> {
    let fail = |e: bitmend_media::pmem::RegionError| CliError::Target(format!("{}: {e}", path.display()));
    let created = !path.exists();
    let (log, heap) = if created {
        MmapRegion::create_split(path, size, log_len(size)).map_err(fail)?
    } else {
        let len = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len() as usize;
        MmapRegion::open_split(path, log_len(len)).map_err(fail)?
    };
    let (mut log, mut heap) = (log, heap);
    let tmpfs = on_tmpfs(path);
    // The file is reserved whole at creation; tmpfs zeroes each page at its first touch,
    // which would land in the write path under the file system's lock (a third of a fresh
    // mount's 1 MiB write rate). A file on a disk is not touched ahead: that would dirty
    // every page of it in the page cache, to be written out.
    if tmpfs || log.is_dax() {
        log.prefault();
        heap.prefault();
    }
    if tmpfs && !log.is_dax() {
        let p = Persistence::CacheLineFlush;
        return Ok((log.with_persistence(p), heap.with_persistence(p), created));
    }
    Ok((log, heap, created))
}

/// The tier file this daemon's mount uses (its status names it, for `bitmend umount`).
static IN_USE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The tier file as a JSON field for the status (empty without a tier).
pub fn status_json() -> String {
    IN_USE.get().map_or(String::new(), |p| {
        format!(", \"tier_path\": {}", crate::json::json_str(&p.to_string_lossy()))
    })
}

/// Mounts `nand` with its dirty state in the tier at `path` (made, `size` bytes, if it does
/// not exist), recovering what the tier held first.
pub fn mount(
    nand: Flash,
    opts: FsOptions,
    path: &Path,
    size: usize,
    held_open: &[u64],
) -> Result<(Fs<Flash>, MountReport, TierReport), CliError> {
    let tier_error =
        |e: bitmend_tier::TierError| CliError::Target(format!("NVRAM tier {}: {e}", path.display()));
    let (log, heap, created) = regions(path, size)?;
    let _ = IN_USE.set(std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()));
    let (log, heap) =
        if created { DirtyTier::create(log, heap).map_err(tier_error)?.into_regions() } else { (log, heap) };
    let (tiered, mount, report) =
        bitmend_tier::mount_holding(nand, opts, log, heap, held_open).map_err(|e| match e {
            bitmend_tier::TierMountError::Tier(e) => tier_error(e),
            // The image's own fault (not a file system, damaged, a newer format): named as the
            // image's by the caller, with its own exit status.
            bitmend_tier::TierMountError::Fs(e) => CliError::Fs(e),
        })?;
    // The daemon never hands the tier's regions back: a crash of it leaves them as they are.
    Ok((tiered.into_fs(), mount, report))
}

/// What the mount says of the tier's recovery (nothing when there was nothing to recover).
pub fn describe(path: &Path, r: &TierReport) -> Option<String> {
    if !r.recovered_anything() && !r.lost_anything() {
        return None;
    }
    let a = &r.applied;
    let mut s = format!(
        "NVRAM tier {}: recovered {} operations ({} nodes applied, {} already on flash) and {} dirty pages",
        path.display(),
        r.node_records,
        a.nodes_applied,
        a.nodes_on_flash,
        a.pages
    );
    if !a.pages_dropped.is_empty() {
        s += &format!(", {} pages dropped (their file gone, or past its end)", a.pages_dropped.len());
    }
    for (ino, page) in &r.unverified {
        let at = page * bitmend_flashfs::LOGICAL_PAGE as u64;
        s += &format!(
            "\n  NOT recovered: inode {ino}, bytes {at}..{}: its slot failed its check; the file keeps what flash holds there",
            at + bitmend_flashfs::LOGICAL_PAGE as u64
        );
    }
    for (seg, chunk) in &r.lost_chunks {
        s += &format!("\n  NOT recovered: chunk {chunk} of log segment {seg}, damaged beyond its parity");
    }
    if r.withheld_nodes > 0 {
        s += &format!("\n  NOT applied: {} operations recorded after the lost chunks", r.withheld_nodes);
    }
    if a.nodes_refused > 0 {
        s += &format!("\n  NOT applied: {} nodes that did not decode", a.nodes_refused);
    }
    if r.still_in_tier {
        s += "\n  the chip is too full to write the recovered state to flash: the tier keeps holding it, \
              and writes answer ENOSPC until files are removed";
    }
    Some(s)
}
