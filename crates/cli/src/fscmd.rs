//! `bitmend mkfs`, `mount`, `fsck`, `scrub`, `stat`: the flash file system on a NAND image.

use crate::error::{CliError, EXIT_PROBLEMS};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::flash::{Flash, FlashKind};
use crate::json::json_str;
use bitmend_flashfs::{Compression, Fs, FsConfig, FsOptions};
use bitmend_media::nand::{FileNand, Nand};
use clap::builder::TypedValueParser as _;
use clap::{Args, ValueEnum};

use crate::media::{histogram, survey, GeometryArgs};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressArg {
    Lz4,
    Zstd,
    None,
}

impl CompressArg {
    fn options(self) -> FsOptions {
        FsOptions {
            compression: match self {
                CompressArg::Lz4 => Compression::Lz4,
                CompressArg::Zstd => Compression::Zstd,
                CompressArg::None => Compression::None,
            },
            ..FsOptions::default()
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OobArg {
    Raw,
    Ecc,
}

#[derive(Args, Debug)]
pub struct MkfsArgs {
    /// The NAND image file to create (--force replaces an existing bitmend image), or an MTD
    /// device (/dev/mtdN) to erase and format (--force when it holds data).
    pub image: PathBuf,
    #[command(flatten)]
    pub geometry: GeometryArgs,
    /// Parity pages per group in an erase block (corrects that many bad pages per group).
    #[arg(long, default_value_t = 1)]
    pub parity_pages: u32,
    /// Parity erase blocks per segment (corrects that many bad pages per stripe).
    #[arg(long, default_value_t = 1)]
    pub parity_blocks: u32,
    /// Erase blocks per segment.
    #[arg(long, default_value_t = 16)]
    pub segment_blocks: u32,
    /// Compression for file data, recorded in the image (a mount may override it).
    #[arg(long, value_enum, default_value_t = CompressArg::Lz4)]
    pub compress: CompressArg,
    /// Replace an existing image.
    #[arg(long)]
    pub force: bool,
    /// On an MTD device, how the spare area is used: `raw`, every spare byte bitmend's and the
    /// kernel's ECC off (software correction only, RCFFS's way); `ecc`, the kernel's ECC
    /// corrects first and bitmend keeps its spare in the bytes the ECC leaves free. Recorded
    /// in the superblock: later commands open the chip the same way.
    #[arg(long, value_enum, default_value_t = OobArg::Raw)]
    pub oob: OobArg,
    /// Make the image even if the host has not room for all of it (thin provisioning: the
    /// image takes space as it is written, and a program that finds the host full fails
    /// with an I/O error). By default the host's space for the whole image is reserved at
    /// mkfs, and an image the host cannot hold is refused.
    #[arg(long)]
    pub thin: bool,
}

impl MkfsArgs {
    fn config(&self) -> FsConfig {
        FsConfig {
            parity_pages: self.parity_pages,
            parity_blocks: self.parity_blocks,
            blocks_per_segment: self.segment_blocks,
        }
    }
}

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Opens an image (or an MTD device) for a command that needs it unmounted; if it is
/// mounted, says where and what to do instead.
pub(crate) fn open_image(image: &Path) -> Result<Flash, CliError> {
    // A mountpoint given where an image is wanted: say which image is mounted there.
    if image.is_dir() {
        return Err(CliError::Target(
            match crate::mounted::bitmend_mount(image).ok().and_then(|m| m.image()) {
                Some(img) => format!(
                    "{}: a mounted bitmend file system (image {}); this command takes an unmounted image: \
                 unmount it first (bitmend umount {}), or scrub it mounted: bitmend scrub {}",
                    image.display(),
                    img.display(),
                    image.display(),
                    image.display()
                ),
                None => format!("{}: a directory, not a NAND image file", image.display()),
            },
        ));
    }
    crate::flash::open(image).map_err(|e| match (&e, crate::mounted::mounted_at(image)) {
        (CliError::Nand(bitmend_media::nand::NandError::Locked { .. }), Some(at)) => CliError::Target(format!(
            "{}: mounted at {at}; unmount it first (bitmend umount {at}), or scrub it mounted: bitmend scrub {at}",
            image.display(),
            at = at.display()
        )),
        _ => e,
    })
}

/// [`open_image`] for a command that reads or repairs the image unmounted: it says so when
/// the NVRAM tier holds changes the flash does not have yet.
pub(crate) fn open_image_offline(image: &Path) -> Result<Flash, CliError> {
    let nand = open_image(image)?;
    if let Some(note) = crate::nvram::pending_note(image) {
        eprintln!("bitmend: {note}");
    }
    Ok(nand)
}

/// Makes the image file of `mkfs`: `--force` replaces a bitmend image (never anything else,
/// and never one that is mounted).
fn mkfs_image(a: &MkfsArgs) -> Result<FileNand, CliError> {
    let g = a.geometry.geometry()?;
    if a.oob != OobArg::Raw {
        return Err(CliError::Usage(format!(
            "{}: --oob is for MTD devices; an image file's spare is bitmend's",
            a.image.display()
        )));
    }
    if a.image.exists() {
        if !a.force {
            return Err(CliError::Target(format!(
                "{}: exists; mkfs makes a new image (--force replaces this one, and what it holds)",
                a.image.display()
            )));
        }
        if !bitmend_media::nand::is_image_file(&a.image) {
            return Err(CliError::Target(format!(
                "{}: not a bitmend NAND image; --force replaces bitmend images only (remove it yourself if it is to go)",
                a.image.display()
            )));
        }
        // A mounted image is live: replacing it under its daemon destroys what it holds,
        // fsync'd data included.
        if let Err(bitmend_media::nand::NandError::Locked { .. }) = FileNand::open(&a.image) {
            let why = open_image(&a.image).err();
            return Err(why.unwrap_or_else(|| CliError::Target(format!("{}: in use", a.image.display()))));
        }
        std::fs::remove_file(&a.image).map_err(|e| format!("{}: {e}", a.image.display()))?;
        // The old file system's NVRAM tier has nothing to give the new one.
        if let Some(p) = crate::nvram::default_path(&a.image) {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(if a.thin { FileNand::create_thin(&a.image, g)? } else { FileNand::create(&a.image, g)? })
}

/// Readies an MTD device for `mkfs`: its geometry is the chip's (geometry options and
/// `--thin` are for image files), and every good block is erased, which `--force` must allow
/// when the chip holds anything in its first blocks.
fn mkfs_device(a: &MkfsArgs) -> Result<bitmend_media::nand::MtdNand, CliError> {
    let device = a.image.display();
    if a.thin || a.geometry.given() {
        return Err(CliError::Usage(format!(
            "{device}: an MTD device has its own geometry and space: --thin and the geometry options are for image files"
        )));
    }
    let mode = match a.oob {
        OobArg::Raw => bitmend_media::nand::OobMode::Raw,
        OobArg::Ecc => bitmend_media::nand::OobMode::Ecc,
    };
    let mut chip = crate::flash::open_device(&a.image, mode).map_err(|e| match open_image(&a.image) {
        Err(mounted) => mounted,
        Ok(_) => e,
    })?;
    if !a.force && crate::media::holds_data(&mut chip, 2)? {
        return Err(CliError::Target(format!(
            "{device}: holds data; mkfs erases the whole chip (--force does, and what it holds is lost)"
        )));
    }
    crate::media::erase_all(&mut chip, &format!("erasing {device}"))?;
    if let Some(p) = crate::nvram::default_path(&a.image) {
        let _ = std::fs::remove_file(p);
    }
    Ok(chip)
}

/// Opens an unmounted image's file system (fsck, stat, scrub): its errors name the image.
pub(crate) fn open_fs_offline(image: &Path) -> Result<(Fs<Flash>, bitmend_flashfs::MountReport), CliError> {
    let nand = open_image_offline(image)?;
    Fs::open(nand, FsOptions::default())
        .map_err(|source| CliError::Image { image: image.to_path_buf(), source })
}

pub fn mkfs(a: &MkfsArgs) -> Result<(), CliError> {
    let nand = match crate::flash::kind(&a.image)? {
        FlashKind::Mtd => Flash::Mtd(mkfs_device(a)?),
        FlashKind::Image | FlashKind::Missing => Flash::Image(mkfs_image(a)?),
    };
    let made = Fs::format(nand, a.config(), a.compress.options()).and_then(|fs| {
        let (total, _) = fs.statfs();
        fs.unmount().map(|_| total)
    });
    // A failed mkfs leaves nothing behind: the next one must not find "File exists".
    let total = made.map_err(|e| {
        if crate::flash::kind(&a.image).ok() == Some(FlashKind::Image) {
            let _ = std::fs::remove_file(&a.image);
        }
        err(e)
    })?;
    let g = crate::flash::open(&a.image).map(|n| n.geometry())?;
    println!(
        "{}: {g}; {} parity page(s) per group, {} parity block(s) per segment of {} blocks; {} MiB for files",
        a.image.display(),
        a.parity_pages,
        a.parity_blocks,
        a.segment_blocks,
        total >> 20
    );
    Ok(())
}

#[derive(Args, Debug)]
pub struct MountArgs {
    /// The NAND image file, or the MTD device (/dev/mtdN).
    pub image: PathBuf,
    /// Where to mount it (created if missing).
    pub mountpoint: PathBuf,
    /// Stay in the foreground; Ctrl-C unmounts, writing everything out.
    #[arg(long)]
    pub foreground: bool,
    /// Create the image with the default geometry if it does not exist.
    #[arg(long)]
    pub create: bool,
    /// Let other users see the mount (needs user_allow_other in /etc/fuse.conf for non-root).
    #[arg(long)]
    pub allow_other: bool,
    /// Compression for file data written during this mount [default: the one chosen at
    /// mkfs, else lz4]. Data already written stays readable whatever is chosen.
    #[arg(long, value_enum)]
    pub compress: Option<CompressArg>,
    /// Start a background scrub pass this long after mount and after each pass (s, m, h or
    /// d; 0: only on request). A pass checks every written page, repairs and relocates.
    /// Request one now with `bitmend scrub MOUNTPOINT` or `echo start > MOUNTPOINT/.bitmend-scrub`.
    #[arg(long, default_value = "24h", value_name = "DURATION")]
    pub scrub_every: String,
    /// Commit every change within this long even if no one syncs (ms, s, m, h or d; 0: only
    /// at fsync, `bitmend sync` and unmount). A crash or `kill -9` of the daemon loses at
    /// most the changes of the last interval; fsync'd ones never.
    #[arg(long, default_value = "5s", value_name = "DURATION")]
    pub commit_interval: String,
    /// Pause between the segments of a pass, so that it takes a bounded share of the daemon
    /// (each segment is checked under the file system's lock).
    #[arg(long, default_value_t = 10, value_name = "MS")]
    pub scrub_pause_ms: u64,
    /// Chunks of the file index (64 logical pages, 256 KiB of a file, each) kept in RAM; the
    /// least recently used are dropped and read again from the flash when needed. About 4 KiB
    /// of RAM per chunk at most.
    #[arg(long, default_value_t = bitmend_flashfs::DEFAULT_INDEX_CHUNKS, value_name = "N")]
    pub index_chunks: usize,
    /// Inodes of the namespace kept in RAM, with their names and maps: the groups of the
    /// namespace are read as they are needed, and those unchanged since are let go between
    /// requests past this many. About 1 KiB of RAM each; 0 keeps every one read.
    #[arg(long, default_value_t = bitmend_flashfs::DEFAULT_NAMESPACE_CACHE, value_name = "N")]
    pub namespace_cache: usize,
    /// lz4's effort for cold data, which the cleaner rewrites when it moves it: 0 its fast
    /// compressor (several hundred MB/s), 1 to 12 its high-compression one (9: about 13%
    /// smaller on source code, about 40 MB/s; 12: slower still for little more). Either way
    /// the data is lz4's block format.
    #[arg(long, default_value_t = bitmend_flashfs::DEFAULT_LZ4_LEVEL, value_name = "LEVEL",
          value_parser = clap::value_parser!(u8).range(0..=bitmend_flashfs::MAX_LZ4_LEVEL as i64))]
    pub lz4_level: u8,
    /// lz4's effort for what is written (as --lz4-level): by default the fast compressor, so
    /// that compressing does not slow the writer; the cleaner compresses harder later.
    #[arg(long, default_value_t = 0, value_name = "LEVEL",
          value_parser = clap::value_parser!(u8).range(0..=bitmend_flashfs::MAX_LZ4_LEVEL as i64))]
    pub lz4_write_level: u8,
    /// The most consecutive 4 KiB pages of a file compressed together into one node (1 to
    /// 16). More compress better (on source code lz4 takes about 10% less at 4 than at 1); a
    /// read of one page then decompresses its whole node. Data that does not compress is
    /// stored a page per node whatever this is.
    #[arg(long, default_value_t = bitmend_flashfs::DEFAULT_NODE_PAGES, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=bitmend_flashfs::MAX_NODE_PAGES as u64)
              .map(|n| n as usize))]
    pub node_pages: usize,
    /// When a read checks the page it reads, in the daemon's cache, against its CRC-32C:
    /// `every` read, a read of a page last checked at least DUR ago (`last-check=DUR`), or
    /// last used at least DUR ago (`last-use=DUR`), or no read (`background`: the checker
    /// alone). DUR is `tick` (1/60 s) or a number with us, ms or s. A clean page that fails is
    /// read again from flash; a dirty one fails the read (EIO), never returns its bytes.
    #[arg(long, default_value = "last-check=tick", value_name = "STRATEGY")]
    pub verify: String,
    /// Clean file data the daemon keeps in RAM, each 4 KiB page with its CRC (K, M or G; 0:
    /// none, every read the kernel does not serve goes to flash).
    #[arg(long, default_value = "16M", value_name = "SIZE")]
    pub cache: String,
    /// Pages of the cache (clean and dirty) the background checker checks per second
    /// against their CRCs, whatever --verify says (0: none).
    #[arg(long, default_value_t = 10_000, value_name = "PAGES")]
    pub cache_check_rate: u64,
    /// Namespace groups per second the on-line check compares with their copies on flash
    /// (PRIMS's check of the live state; 0: none). A group that differs means the daemon's
    /// memory is wrong: under --supervise the worker is replaced, else the log says so.
    #[arg(long, default_value_t = 20, value_name = "GROUPS")]
    pub state_check_rate: u64,
    /// Serve every read from the daemon (FUSE direct_io), so that its checked cache is the
    /// only cache. By default the kernel's page cache keeps what it read and serves it again
    /// without asking: those copies are not checked.
    #[arg(long)]
    pub direct_io: bool,
    /// Let the kernel gather writes in its page cache and hand them over in large batches
    /// (FUSE writeback_cache). Faster for small writes, but a write returns before the daemon
    /// has it: a `kill -9` of the daemon loses what the kernel still held, as a crash of the
    /// kernel would. Without it, every write that returned is in the NVRAM tier.
    #[arg(long, conflicts_with = "direct_io")]
    pub writeback_cache: bool,
    /// Threads serving FUSE requests, each with its own /dev/fuse descriptor. A request
    /// holds the file system's lock only while it changes or reads it; receiving the next
    /// request and copying replies to the kernel go on beside it (docs/DESIGN.md, "Concurrency in the mount").
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Write dirty data back in the request that passes the dirty limit, as before the
    /// write-back thread (for comparison). By default a thread of its own writes it back,
    /// a step at a time, and that request returns at once (docs/DESIGN.md, "Concurrency in the mount").
    #[arg(long)]
    pub write_back_in_request: bool,
    /// Read every page under the file system's lock, as before reads went without it (for
    /// comparison). By default a read takes the lock only to find its pages; the flash pages
    /// are read and checked against their CRCs without it, so reads do not wait for each
    /// other's flash reads, nor write-back for them (docs/DESIGN.md, "Reads without the lock").
    #[arg(long)]
    pub read_under_lock: bool,
    /// The kernel's readahead for this mount, in KiB (0: leave the kernel's 128 KiB). The
    /// default, one full request, makes sequential reads about 15% faster. Set as root only.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(0..=65536))]
    pub readahead_kib: u32,
    /// The NVRAM tier: a file whose mapping holds every acknowledged change until it is on
    /// flash (`none`: no tier; changes wait in the daemon's memory for the commit interval).
    /// With the tier, fsync returns once a change is in it, without a flash program, and a
    /// `kill -9` of the daemon loses nothing that returned. On a DAX file a power cut loses
    /// nothing either. [default: /dev/shm/bitmend-IMAGE-HASH.nvram]
    #[arg(long, default_value = "", hide_default_value = true, value_name = "FILE|none")]
    pub nvram: String,
    /// Size of the NVRAM tier's file when it is made (K, M or G). A slot freed in the tier
    /// cools for 0.2 s before reuse (wear), so writes run at most at about size / 0.2 s: 256M
    /// keeps that above 1 GB/s. The file is reserved whole when made (a full /dev/shm is an error
    /// at mount, not a crash mid-write), and on tmpfs mapped in at mount.
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub nvram_size: String,
    /// Keep the mount when the daemon's worker crashes: a small supervisor process holds
    /// the FUSE connection and journals each request; a worker that dies (a signal, a
    /// panic) is replaced by one that recovers from the NVRAM tier and answers what was in
    /// flight (docs/DESIGN.md, "The supervisor"). Needs the tier (not `--nvram none`).
    #[arg(long)]
    pub supervise: bool,
    /// Serve the FUSE connection over this socket, as a supervisor's worker (internal).
    #[arg(long, hide = true, value_name = "FD")]
    pub serve_fd: Option<i32>,
    /// As a worker started after another died: its connection is the one the tier's
    /// requests were made on (internal).
    #[arg(long, hide = true, requires = "serve_fd")]
    pub serve_again: bool,
    /// The supervisor's counters, as a memory file (internal).
    #[arg(long, hide = true, requires = "serve_fd", value_name = "FD")]
    pub serve_status_fd: Option<i32>,
    /// The inodes open on that connection, as INO:HANDLES,... (internal).
    #[arg(long, hide = true, requires = "serve_fd", value_parser = crate::supervised::parse_held, default_value = "")]
    pub serve_open: crate::supervised::Held,
}

/// When the scrubber and the cache checker run.
fn scrub_schedule(a: &MountArgs) -> Result<crate::scrubber::Schedule, CliError> {
    Ok(crate::scrubber::Schedule {
        every: crate::units::parse_duration(&a.scrub_every).map_err(CliError::Usage)?,
        pause: Duration::from_millis(a.scrub_pause_ms),
        cache_check_rate: a.cache_check_rate,
        state_check_rate: a.state_check_rate,
    })
}

/// The cache options of `a`, checked: (strategy, pages).
fn cache_options(a: &MountArgs) -> Result<(bitmend_flashfs::Verify, usize), CliError> {
    let verify = a.verify.parse().map_err(|e| CliError::Usage(format!("--verify {e}")))?;
    let bytes = crate::units::parse_size(&a.cache).map_err(|e| CliError::Usage(format!("--cache {e}")))?;
    Ok((verify, (bytes / bitmend_flashfs::LOGICAL_PAGE as u64) as usize))
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Runs the mount in a child, in the foreground there, and returns once it is mounted (or
/// says why the child exited first).
fn spawn_daemon(a: &MountArgs) -> Result<(), CliError> {
    let exe = std::env::current_exe().map_err(err)?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount").arg(&a.image).arg(&a.mountpoint).arg("--foreground");
    if let Some(c) = a.compress {
        cmd.arg("--compress").arg(format!("{c:?}").to_lowercase());
    }
    cmd.arg("--scrub-every")
        .arg(&a.scrub_every)
        .arg("--commit-interval")
        .arg(&a.commit_interval)
        .arg("--scrub-pause-ms")
        .arg(a.scrub_pause_ms.to_string())
        .arg("--index-chunks")
        .arg(a.index_chunks.to_string())
        .arg("--namespace-cache")
        .arg(a.namespace_cache.to_string())
        .arg("--lz4-level")
        .arg(a.lz4_level.to_string())
        .arg("--lz4-write-level")
        .arg(a.lz4_write_level.to_string())
        .arg("--node-pages")
        .arg(a.node_pages.to_string())
        .arg("--verify")
        .arg(&a.verify)
        .arg("--cache")
        .arg(&a.cache)
        .arg("--cache-check-rate")
        .arg(a.cache_check_rate.to_string())
        .arg("--state-check-rate")
        .arg(a.state_check_rate.to_string())
        .arg("--threads")
        .arg(a.threads.to_string())
        .arg("--readahead-kib")
        .arg(a.readahead_kib.to_string());
    if a.allow_other {
        cmd.arg("--allow-other");
    }
    if a.direct_io {
        cmd.arg("--direct-io");
    }
    if a.writeback_cache {
        cmd.arg("--writeback-cache");
    }
    if a.write_back_in_request {
        cmd.arg("--write-back-in-request");
    }
    if a.read_under_lock {
        cmd.arg("--read-under-lock");
    }
    if a.supervise {
        cmd.arg("--supervise");
    }
    cmd.arg("--nvram").arg(&a.nvram).arg("--nvram-size").arg(&a.nvram_size);
    // The daemon must not hold our output open (a caller waiting for it would hang): its
    // messages go to a log file, shown if it fails to mount.
    let log = std::env::temp_dir().join(format!("bitmend-mount-{}.log", std::process::id()));
    let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(log_file);
    let mut child = cmd.spawn().map_err(err)?;
    // Mounted is what the daemon says once its session serves (a mount table entry at the
    // mountpoint could be another's); a daemon that exits first passes on its error and its
    // exit status. A mount recovering a large tier may take a while: no deadline but the
    // daemon's own.
    loop {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said.lines().any(|l| l.starts_with(SERVING)) {
            println!(
                "mounted {} at {} (pid {}, log {}); unmount with: bitmend umount {}",
                a.image.display(),
                a.mountpoint.display(),
                child.id(),
                log.display(),
                a.mountpoint.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait().map_err(err)? {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            let why = said.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
            return Err(CliError::Child {
                // Killed by a signal: the work failed.
                code: status.code().and_then(|c| u8::try_from(c).ok()).filter(|&c| c != 0).unwrap_or(1),
                why: format!("the mount failed ({status}): {}", why.trim_start_matches("bitmend: ")),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The line a daemon writes to its log once its FUSE session serves requests.
const SERVING: &str = "bitmend: serving ";

/// Refuses a mountpoint that is already a mount (the new daemon would mount over it, or
/// fail after a caller was told it had mounted). One left by a daemon that died
/// ("Transport endpoint is not connected") is unmounted first when it was a bitmend mount,
/// else named with the command that clears it.
fn check_mountpoint(mountpoint: &Path) -> Result<(), CliError> {
    // Its root's attributes may still be cached by the kernel: opening it asks the daemon.
    let dead = matches!(std::fs::read_dir(mountpoint), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN));
    if dead {
        let ours = crate::mounted::bitmend_mount_dead(mountpoint);
        if !ours {
            return Err(CliError::Target(format!(
                "{}: a mount whose daemon has died (Transport endpoint is not connected); \
                 clear it with: fusermount3 -u {}",
                mountpoint.display(),
                mountpoint.display()
            )));
        }
        crate::mounted::detach(mountpoint).map_err(|e| {
            CliError::Target(format!(
                "{}: a bitmend mount whose daemon has died, and unmounting it failed ({e}); \
                 clear it with: bitmend umount {}",
                mountpoint.display(),
                mountpoint.display()
            ))
        })?;
        eprintln!("bitmend: {}: its daemon had died; unmounted the dead mount", mountpoint.display());
        return Ok(());
    }
    if crate::mounted::is_mountpoint(mountpoint) {
        let what = match crate::mounted::bitmend_mount(mountpoint) {
            Ok(m) => format!("bitmend image {}", m.image().unwrap_or_default().display()),
            Err(_) => "another file system".into(),
        };
        return Err(CliError::Target(format!(
            "{}: already a mount point ({what}); unmount it first: bitmend umount {}",
            mountpoint.display(),
            mountpoint.display()
        )));
    }
    Ok(())
}

/// The image `mount --create` makes: 128 MiB, RCFFS's geometry and parity.
fn default_mkfs(a: &MountArgs) -> MkfsArgs {
    MkfsArgs {
        image: a.image.clone(),
        geometry: GeometryArgs::default(),
        parity_pages: 1,
        parity_blocks: 1,
        segment_blocks: 16,
        compress: a.compress.unwrap_or(CompressArg::Lz4),
        force: false,
        thin: false,
        oob: OobArg::Raw,
    }
}

/// The FUSE session: `--threads` request threads, each with its own /dev/fuse descriptor
/// (FUSE_DEV_IOC_CLONE), so that the kernel hands a waiting thread the next request while
/// another is busy with the last.
fn fuse_config(a: &MountArgs) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.n_threads = Some(a.threads as usize);
    config.clone_fd = true;
    config.mount_options = vec![
        // The canonical path, so that commands given the image can tell it is mounted.
        fuser::MountOption::FSName(format!(
            "{}{}",
            crate::mounted::SOURCE_PREFIX,
            std::fs::canonicalize(&a.image).unwrap_or_else(|_| a.image.clone()).display()
        )),
        fuser::MountOption::DefaultPermissions,
    ];
    if a.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config
}

/// Opens the image for the mount, through its NVRAM tier when it has one (recovering what
/// the tier holds); the image's own errors name the image.
fn open_for_mount(
    a: &MountArgs,
    nand: Flash,
    opts: FsOptions,
    nvram: Option<&Path>,
    nvram_size: usize,
) -> Result<(Fs<Flash>, bitmend_flashfs::MountReport, Vec<u64>), CliError> {
    let on_image = |e: CliError| match e {
        CliError::Fs(source) => CliError::Image { image: a.image.clone(), source },
        e => e,
    };
    match nvram {
        Some(path) => {
            let held: Vec<u64> = a.serve_open.0.iter().map(|&(ino, _)| ino).collect();
            let (fs, rep, tier) =
                crate::nvram::mount(nand, opts, path, nvram_size, &held).map_err(on_image)?;
            if let Some(said) = crate::nvram::describe(path, &tier) {
                eprintln!("bitmend: {said}");
            }
            // Taking over a live connection, the programs on it saw those writes: going on
            // without them would hand them other bytes. Stopped, as Loris halts.
            if a.serve_again && tier.lost_anything() {
                return Err(CliError::Child {
                    code: 5,
                    why: format!(
                        "NVRAM tier {}: after the worker's crash, part of what it held failed its check (named above); \
                         the mount is stopped rather than go on without it",
                        path.display()
                    ),
                });
            }
            Ok((fs, rep, tier.requests))
        }
        None => Fs::open(nand, opts).map(|(fs, rep)| (fs, rep, Vec::new())).map_err(|e| on_image(e.into())),
    }
}

fn say_mounted(image: &Path, rep: &bitmend_flashfs::MountReport) {
    eprintln!(
        "bitmend: mounted {} ({}; {} pages replayed{}, {} repaired on the way; superblock from {}, {} damaged copies, {} rewritten)",
        image.display(),
        mount_method(rep),
        rep.pages,
        if rep.from_checkpoint { " from a checkpoint" } else { "" },
        rep.pages_repaired,
        superblock_source(rep),
        rep.superblocks_damaged,
        rep.superblocks_rewritten
    );
}

/// SIGINT and SIGTERM end the mount (`catch`), or are ignored (a worker's).
pub(crate) fn catch_stop_signals(catch: bool) {
    let handler = if catch { on_signal as *const () as libc::sighandler_t } else { libc::SIG_IGN };
    // SAFETY: installs an async-signal-safe handler (it only stores to an atomic), or none.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// The mount's work done by another process, when it is: a daemon started in the
/// background, or a supervisor's workers. `None` in the process that serves the mount (in
/// the foreground, or a supervisor's worker, which serves a mount its supervisor has made).
fn served_elsewhere(a: &MountArgs) -> Option<Result<(), CliError>> {
    if a.serve_fd.is_some() {
        return None;
    }
    let r = (|| {
        check_mountpoint(&a.mountpoint)?;
        if a.create && !a.image.exists() {
            mkfs(&default_mkfs(a))?;
        }
        std::fs::create_dir_all(&a.mountpoint).map_err(|e| format!("{}: {e}", a.mountpoint.display()))?;
        if !a.foreground {
            return spawn_daemon(a).map(|()| true);
        }
        if a.supervise {
            if crate::nvram::chosen(&a.nvram, &a.image)?.is_none() {
                return Err(CliError::Usage(
                    "--supervise needs the NVRAM tier (a new worker recovers from it): drop --nvram none"
                        .into(),
                ));
            }
            catch_stop_signals(true);
            return crate::supervised::run(&a.mountpoint, &fuse_config(a), a.threads as usize, &STOP)
                .map(|()| true);
        }
        Ok(false)
    })();
    match r {
        Ok(false) => None,
        Ok(true) => Some(Ok(())),
        Err(e) => Some(Err(e)),
    }
}

pub fn mount(a: &MountArgs) -> Result<(), CliError> {
    crate::units::parse_duration(&a.scrub_every).map_err(CliError::Usage)?;
    let commit_interval = crate::units::parse_duration(&a.commit_interval).map_err(CliError::Usage)?;
    if a.index_chunks == 0 {
        return Err(CliError::Usage("--index-chunks must be at least 1".into()));
    }
    let (verify, cache_pages) = cache_options(a)?;
    let nvram_size =
        crate::units::parse_size(&a.nvram_size).map_err(|e| CliError::Usage(format!("--nvram-size {e}")))?;
    if nvram_size < 1 << 20 {
        return Err(CliError::Usage("--nvram-size must be at least 1M".into()));
    }
    if let Some(done) = served_elsewhere(a) {
        return done;
    }
    keep_heap_memory();
    if a.serve_fd.is_some() {
        crate::worker::become_worker(a.serve_status_fd);
    }
    let nand = open_image(&a.image)?;
    let opts = FsOptions {
        index_chunks: a.index_chunks,
        namespace_cache: a.namespace_cache,
        lz4_level: a.lz4_level,
        lz4_write_level: a.lz4_write_level,
        node_pages: a.node_pages,
        verify,
        cache_pages,
        background_write_back: !a.write_back_in_request,
        ..FsOptions::default()
    };
    let nvram = crate::nvram::chosen(&a.nvram, &a.image)?;
    let (mut fs, rep, done) = open_for_mount(a, nand, opts, nvram.as_deref(), nvram_size as usize)?;
    // The handles the kernel still has, as the worker that died had them.
    for &(ino, handles) in &a.serve_open.0 {
        for _ in 0..handles {
            let _ = fs.open_file(bitmend_flashfs::Ino(ino));
        }
    }
    if let Some(c) = a.compress.map(|c| c.options().compression).or(fs.recorded_compression()) {
        fs.set_compression(c);
    }
    say_mounted(&a.image, &rep);
    let config = fuse_config(a);
    // A worker leaves the signals that end a mount to its supervisor, which unmounts.
    catch_stop_signals(a.serve_fd.is_none());
    let schedule = scrub_schedule(a)?;
    let reader = if a.read_under_lock { None } else { fs.data_reader() };
    let shared = crate::scrubber::share(fs, schedule);
    let scrubber = crate::scrubber::spawn(shared.clone(), schedule);
    let committer = commit_interval.map(|i| crate::commit::spawn(shared.clone(), i));
    let (write_back, writer) = crate::write_back::spawn(shared.clone());
    let fuse_fs = crate::fuse::FuseFs {
        shared: shared.clone(),
        direct_io: a.direct_io,
        writeback_cache: a.writeback_cache,
        drops_privileges: false,
        write_back,
        durable_on_answer: nvram.is_some(),
        reader,
        largest_message: a.serve_fd.map(crate::supervisor::largest_message),
        tags_requests: a.serve_fd.is_some(),
        // A first worker's connection is new: requests a tier names are another's.
        done_before: if a.serve_again { done.into_iter().collect() } else { Default::default() },
    };
    let session = match a.serve_fd {
        Some(fd) => crate::supervised::serve(fuse_fs, fd, config),
        None => fuser::spawn_mount(fuse_fs, &a.mountpoint, &config),
    }
    .map_err(err)?;
    crate::mounted::set_readahead(&a.mountpoint, a.readahead_kib);
    eprintln!("{SERVING}{}", a.mountpoint.display());
    while !STOP.load(Ordering::SeqCst) && !session.guard.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every request thread has returned once the session is joined. The session is dropped
    // (and with it fuser's own unmount of the mountpoint's path, a no-op by then) before the
    // file system lets go of the image: `bitmend umount` returns once the image is free, and
    // a mount made then at the same place must not be the one fuser unmounts.
    let ended = if session.guard.is_finished() { session.join() } else { session.umount_and_join() };
    // A worker's connection ends when its supervisor closes it: no error.
    if let Err(e) = ended.or_else(|e| if a.serve_fd.is_some() { Ok(()) } else { Err(e) }) {
        eprintln!("bitmend: unmount: {e}");
        // Still mounted (busy): requests may still come, so the file system stays until the
        // mount is gone.
        while crate::mounted::is_mountpoint(&a.mountpoint) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    crate::fuse::write_out(&shared, nvram.as_deref());
    let _ = scrubber.join();
    let _ = writer.join();
    if let Some(c) = committer {
        let _ = c.join();
    }
    eprintln!("bitmend: unmounted {}", a.image.display());
    Ok(())
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The NAND image file or MTD device (not mounted).
    pub image: PathBuf,
    /// Rewrite what reading had to repair, so the image is clean afterwards.
    #[arg(long)]
    pub repair: bool,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn fsck(a: &CheckArgs) -> Result<u8, CliError> {
    let (mut fs, rep) = open_fs_offline(&a.image)?;
    let tty = std::io::stderr().is_terminal() && !a.json;
    let c = fs.check_with_progress(true, &mut |done, total| {
        if tty {
            let pct = done * 100 / total.max(1);
            eprint!("\rfsck: [{:<25}] {done}/{total} logical pages read back", "#".repeat(pct as usize / 4));
            let _ = std::io::stderr().flush();
        }
    });
    if tty {
        eprintln!();
    }
    let st = fs.store().stats();
    if a.json {
        let problems: Vec<String> = c.problems.iter().map(|p| json_str(p)).collect();
        let unreadable: Vec<String> = c
            .unreadable_files
            .iter()
            .map(|(p, n)| format!("{{\"path\": {}, \"pages\": {n}}}", json_str(p)))
            .collect();
        println!(
            "{{\"image\": {}, \"files\": {}, \"dirs\": {}, \"symlinks\": {}, \"data_pages\": {}, \"unreadable_pages\": {}, \"unreadable_files\": [{}], \
             \"repaired_pages\": {}, \"maps_rebuilt\": {}, \"repaired_by_group\": {}, \"repaired_by_segment\": {}, \"pages_lost_at_mount\": {}, \
             \"superblock_from\": {}, \"superblocks_damaged\": {}, \"superblocks_rewritten\": {}, \"problems\": [{}], \"clean\": {}}}",
            json_str(&a.image.display().to_string()),
            c.files,
            c.dirs,
            c.symlinks,
            c.data_pages,
            c.unreadable_pages,
            unreadable.join(", "),
            c.repaired_pages,
            c.maps_rebuilt,
            st.repaired_by_group,
            st.repaired_by_segment,
            rep.pages_lost,
            json_str(&superblock_source(&rep)),
            rep.superblocks_damaged,
            rep.superblocks_rewritten,
            problems.join(", "),
            c.clean()
        );
    } else {
        println!(
            "{}: {} files, {} directories, {} symlinks, {} data pages read back",
            a.image.display(),
            c.files,
            c.dirs,
            c.symlinks,
            c.data_pages
        );
        println!(
            "  flash pages repaired: {} from group parity, {} from segment parity",
            st.repaired_by_group, st.repaired_by_segment
        );
        println!(
            "  unreadable logical pages: {}; pages lost at mount: {}",
            c.unreadable_pages, rep.pages_lost
        );
        if c.maps_rebuilt > 0 {
            println!(
                "  index maps lost and rebuilt from the data nodes: {}{}",
                c.maps_rebuilt,
                if a.repair { " (written again)" } else { " (fsck --repair writes them again)" }
            );
        }
        if rep.superblocks_damaged > 0 {
            println!(
                "  superblock copies: {} damaged, {} rewritten from {}",
                rep.superblocks_damaged,
                rep.superblocks_rewritten,
                superblock_source(&rep)
            );
        }
        for (path, pages) in &c.unreadable_files {
            println!("  unreadable: {path} ({pages} logical pages beyond repair)");
        }
        for p in &c.problems {
            println!("  problem: {p}");
        }
        println!("  {}", if c.clean() { "clean" } else { "NOT clean" });
    }
    if a.repair {
        fs.unmount()?;
    }
    Ok(if c.clean() { 0 } else { EXIT_PROBLEMS })
}

/// Which superblock copy a mount read, in words.
fn superblock_source(rep: &bitmend_flashfs::MountReport) -> String {
    rep.store.superblock.map_or_else(|| "a new format".to_string(), |c| c.to_string())
}

/// `bitmend stat MOUNTPOINT`: what the daemon of a mounted file system says through its
/// control file (space, files, the index, lifetime health).
fn stat_mounted(a: &StatArgs) -> Result<(), CliError> {
    let control = crate::mounted::control_file(&a.image);
    let status = std::fs::read_to_string(&control)
        .map_err(|e| format!("{}: not a mounted bitmend file system ({e})", a.image.display()))?;
    if a.json {
        let fields = status.trim().trim_start_matches('{').trim_end_matches('}');
        println!("{{\"mountpoint\": {}, {fields}}}", json_str(&a.image.display().to_string()));
        return Ok(());
    }
    let space = crate::report::space_from_json(&status)?;
    let h = crate::report::health_from_json(&status)?;
    let (logical, stored) = (space.file_data_bytes, space.stored_bytes);
    let ratio = if stored > 0 { logical as f64 / stored as f64 } else { 1.0 };
    println!("{}: mounted bitmend flash file system", a.image.display());
    println!(
        "  space          {} MiB free of {} MiB (segments: {} of {} in use)",
        space.bytes_free >> 20,
        space.bytes_total >> 20,
        space.segments_used,
        space.segments
    );
    println!(
        "  files          {} inodes; {} KiB of file data stored in {} KiB ({ratio:.2}x)",
        space.inodes,
        logical >> 10,
        stored >> 10
    );
    println!("  index          {} chunks", space.index_chunks);
    if let Ok(groups) = crate::json::number(&status, "namespace_groups") {
        let n = |k| crate::json::number(&status, k).unwrap_or(0);
        println!(
            "  namespace      {} inodes in memory; {} of {groups} groups not in memory, {} let go so far",
            n("namespace_inodes_in_memory"),
            n("namespace_groups_unread"),
            n("namespace_groups_shed")
        );
    }
    println!(
        "  repairs so far {} pages from group parity, {} from segment parity, {} logical pages relocated, \
         {} beyond repair",
        h.repaired_by_group, h.repaired_by_segment, h.relocated, h.unrecoverable
    );
    println!("  scrubs so far  {} passes, {} pages checked", h.scrub_passes, h.pages_scrubbed);
    if let Ok(compared) = crate::json::number(&status, "state_groups_compared") {
        let n = |k| crate::json::number(&status, k).unwrap_or(0);
        println!(
            "  memory checks  {} dirty pages healed from the tier, {} refused; {compared} namespace groups compared with flash, {} differed, {} copies unreadable",
            n("cache_dirty_healed"),
            n("cache_dirty_caught"),
            n("state_mismatches"),
            n("state_groups_unreadable")
        );
    }
    if let (Ok(used), Ok(size)) =
        (crate::json::number(&status, "tier_log_used"), crate::json::number(&status, "tier_log_size"))
    {
        println!(
            "  NVRAM tier     {} KiB of {} KiB of records, {} dirty pages",
            used >> 10,
            size >> 10,
            crate::json::number(&status, "tier_pages").unwrap_or(0)
        );
    }
    if let Ok(restarts) = crate::json::number(&status, "supervisor_restarts") {
        let n = |k| crate::json::number(&status, k).unwrap_or(0);
        println!(
            "  supervisor     {restarts} worker restarts, {} requests replayed, {} answered EIO, longest stall {} ms",
            n("supervisor_replayed"),
            n("supervisor_refused"),
            n("supervisor_longest_stall_us") / 1000
        );
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct StatArgs {
    /// The NAND image file or MTD device (not mounted), or the mountpoint of a mounted file system (asked
    /// through its daemon's control file).
    pub image: PathBuf,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// After mounting, read every directory and the attributes of every file in it (as
    /// `find -ls` does), keeping the namespace within its default cache, and report the time
    /// and the memory the walk took beyond the mount (an image file, not mounted).
    #[arg(long)]
    pub walk: bool,
}

/// What [`walk`] found and cost.
struct Walked {
    files: u64,
    ms: f64,
    /// The most anonymous memory the process held beyond what it held when the walk began.
    ram: u64,
}

/// Reads every directory from the root and the attributes of every entry, letting the
/// namespace go back within its cache between operations (as the mount does).
fn walk(fs: &mut Fs<Flash>) -> Result<Walked, bitmend_flashfs::FsError> {
    let (start, t) = (anon_rss(), std::time::Instant::now());
    let (mut files, mut ram) = (0u64, 0u64);
    let mut dirs = vec![bitmend_flashfs::ROOT];
    while let Some(dir) = dirs.pop() {
        let entries = fs.readdir(dir)?;
        fs.shed_namespace();
        for e in entries {
            let a = fs.getattr(e.ino)?;
            fs.shed_namespace();
            files += 1;
            if a.kind == bitmend_flashfs::FileType::Dir {
                dirs.push(e.ino);
            }
        }
        ram = ram.max(anon_rss().saturating_sub(start));
    }
    Ok(Walked { files, ms: t.elapsed().as_secs_f64() * 1e3, ram })
}

/// Tells glibc's allocator to keep freed memory for reuse instead of handing it back to the
/// kernel: a request allocates and frees up to a megabyte (a read's reply, its pages), and by
/// default the top of the heap was trimmed after each and grown again by the next, with page
/// faults and zeroed pages every time (a fifth of a 1 MiB read's samples were in
/// `sysmalloc`; none after). One pass of 1 MiB reads through the mount, five runs each,
/// alternating: median 932 MB/s before, 1032 after. RAM stays bounded by what the daemon
/// holds at its peak (its caches are bounded).
fn keep_heap_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before the daemon's threads.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
        // Fixed: glibc otherwise moves it with each freed mapping, and a megabyte buffer
        // then comes from a fresh mapping (zeroed pages) until it has.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 8 << 20);
    }
}

/// This process's anonymous resident memory, in bytes (0 where /proc says nothing).
fn anon_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kb.unwrap_or(0) * 1024
}

pub fn stat(a: &StatArgs) -> Result<(), CliError> {
    if a.image.is_dir() {
        return stat_mounted(a);
    }
    // What mounting costs: the process is fresh, so the memory it gains is the mount's.
    let (ram_before, t) = (anon_rss(), std::time::Instant::now());
    let (mut fs, rep) = open_fs_offline(&a.image)?;
    let (mount_ms, mount_ram) = (t.elapsed().as_secs_f64() * 1e3, anon_rss().saturating_sub(ram_before));
    let walked = match a.walk {
        true => Some(walk(&mut fs).map_err(|source| CliError::Image { image: a.image.clone(), source })?),
        false => None,
    };
    let (total, free) = fs.statfs();
    let (logical, stored) = fs.data_space();
    let ratio = if stored > 0 { logical as f64 / stored as f64 } else { 1.0 };
    let segs = fs.store().segments();
    let used = fs.store().used_segments().len();
    let s = survey(fs.store().nand())?;
    let hist = histogram(&s.erase_counts, 8);
    let codec =
        fs.recorded_compression().map_or("not recorded".to_string(), |c| format!("{c:?}").to_lowercase());
    let walk = walked.as_ref().map_or(String::new(), |w| {
        format!(", \"walk_files\": {}, \"walk_ms\": {:.1}, \"walk_ram_bytes\": {}", w.files, w.ms, w.ram)
    });
    if a.json {
        let h: Vec<String> =
            hist.iter().map(|(a, b, n)| format!("{{\"from\": {a}, \"to\": {b}, \"blocks\": {n}}}")).collect();
        println!(
            "{{\"image\": {}, {}, \"compression\": \"{codec}\", \"compression_ratio\": {ratio:.3}, \
             \"bad_blocks\": {}, \"repaired_at_mount\": {}, \"mounted_by\": \"{}\", \"chain_segments\": {}, \"pages_replayed\": {}, \
             {}, \"mount_ms\": {mount_ms:.2}, \"mount_ram_bytes\": {mount_ram}{walk}, \"erase_histogram\": [{}]}}",
            json_str(&a.image.display().to_string()),
            crate::report::space_json(&crate::report::Space::of(&fs)),
            s.bad.len(),
            rep.pages_repaired,
            if rep.store.scanned { "scan" } else { "anchor" },
            rep.store.chain_length,
            rep.pages,
            crate::report::health_json(&fs.health()),
            h.join(", ")
        );
        return Ok(());
    }
    println!("{}: bitmend flash file system", a.image.display());
    println!("  mount          {mount_ms:.1} ms, {:.1} MiB of RAM", mount_ram as f64 / (1 << 20) as f64);
    if let Some(w) = &walked {
        let mib = w.ram as f64 / (1 << 20) as f64;
        println!(
            "  walk           {} files in {:.0} ms, {mib:.1} MiB of RAM beyond the mount at most",
            w.files, w.ms
        );
    }
    println!(
        "  space          {} MiB free of {} MiB (segments: {used} of {segs} in use)",
        free >> 20,
        total >> 20
    );
    println!(
        "  files          {} inodes; {} KiB of file data stored in {} KiB ({ratio:.2}x, {codec} chosen at mkfs)",
        fs.inode_count(),
        logical >> 10,
        stored >> 10
    );
    println!(
        "  index          {} chunks of {} logical pages, each a map node read when first used",
        fs.index_chunk_count(),
        bitmend_flashfs::CHUNK_PAGES
    );
    println!("  bad blocks     {}", s.bad.len());
    println!(
        "  mount          {}; {} pages replayed, {} index maps read, {} pages repaired on the way",
        mount_method(&rep),
        rep.pages,
        rep.maps_loaded,
        rep.pages_repaired
    );
    let h = fs.health();
    println!(
        "  repairs so far {} pages from group parity, {} from segment parity, {} logical pages relocated, \
         {} beyond repair",
        h.repaired_by_group, h.repaired_by_segment, h.relocated, h.unrecoverable
    );
    println!(
        "  scrubs so far  {} passes, {} pages checked; chip failures: {} programs, {} erases",
        h.scrub_passes, h.pages_scrubbed, h.program_failures, h.erase_failures
    );
    println!("  erase counts   (blocks per range)");
    let widest = hist.iter().map(|h| h.2).max().unwrap_or(1).max(1);
    for (lo, hi, count) in hist {
        let bar = "#".repeat((count * 40).div_ceil(widest));
        let range = if lo == hi { format!("{lo}") } else { format!("{lo}-{hi}") };
        println!("    {range:>12} {count:>7} {bar}");
    }
    Ok(())
}

/// How a mount found the file system: by the anchor log and the successor chain, or by a
/// scan of every segment (an image made before format 3, or a broken chain).
fn mount_method(rep: &bitmend_flashfs::MountReport) -> String {
    if rep.store.scanned {
        format!("by a scan of every segment ({} spares read)", rep.store.spares_read)
    } else {
        format!(
            "by the anchor log and a chain of {} segment{} ({} spares read)",
            rep.store.chain_length,
            if rep.store.chain_length == 1 { "" } else { "s" },
            rep.store.spares_read
        )
    }
}
