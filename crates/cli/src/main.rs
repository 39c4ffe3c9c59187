//! The `bitmend` command line.

#[cfg(feature = "bench")]
mod bench;
#[cfg(feature = "bench")]
mod bench_stall;
mod commit;
mod demo;
mod demo_heap;
mod error;
mod fault_points;
mod flash;
mod fscmd;
mod fuse;
mod fuse_mount;
mod generate;
mod holds;
mod inject;
mod inject_args;
mod inject_pool;
mod json;
mod kv;
mod media;
mod mount_helper;
mod mounted;
mod nvram;
mod report;
mod scrub;
mod scrubber;
mod state_check;
mod supervised;
mod supervisor;
mod units;
mod worker;
mod write_back;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The exit codes (`error.rs`), for `--help`.
const EXIT_STATUS: &str = "Exit status: 0 done; 1 the work failed (I/O, a full or failing chip); \
2 bad arguments or values; 3 the target cannot be used (missing, not a bitmend image, a newer \
format, mounted); 4 fsck or scrub found problems left unrepaired; 5 data beyond repair stopped \
the command. The message is on stderr.";

/// Self-healing, crash-consistent storage for persistent memory and raw NAND flash.
#[derive(Parser, Debug)]
#[command(name = "bitmend", version, about, long_about = None, after_help = EXIT_STATUS)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Make a flash file system on a new NAND image file, or on a NAND chip (/dev/mtdN).
    Mkfs(fscmd::MkfsArgs),
    /// Mount a flash file system (an image file, or a chip: /dev/mtdN) with FUSE.
    ///
    /// Without --foreground the mount runs in a background process and this command returns
    /// once it is mounted; unmount with `bitmend umount MOUNTPOINT`. Everything is written
    /// out (with a checkpoint) at unmount. An image is locked while mounted: a second mount
    /// is refused.
    ///
    /// Durability: `fsync` (and `sync FILE`) returns once everything written before it is
    /// on the image; `bitmend sync MOUNTPOINT` does the same for the whole file system; and
    /// every change is committed within --commit-interval even if no one syncs. Linux does
    /// not pass `sync` or `syncfs` to FUSE file systems, so plain `sync` gives no guarantee.
    Mount(fscmd::MountArgs),
    /// Commit everything a mounted file system holds, and return once it is durable.
    Sync(mounted::SyncArgs),
    /// Unmount a mounted file system and wait until its daemon has written everything out
    /// and let go of the image.
    Umount(mounted::UmountArgs),
    /// Check every structure of an unmounted image and read back every byte of file data.
    Fsck(fscmd::CheckArgs),
    /// Check every written page of an image, or of a mounted file system, against its
    /// signature; repair what parity allows and rewrite repaired data elsewhere.
    Scrub(scrub::ScrubArgs),
    /// Space, compression, bad blocks and erase counts of an unmounted image.
    Stat(fscmd::StatArgs),
    /// Show the flash file system meeting the faults it was built for: write a tree of files,
    /// flip bits, lose a page, cut the power mid-write, remount, scrub, verify every byte.
    Demo(demo::DemoArgs),
    /// Measure bitmend beside the systems it replaces, in one run, as ratios (> 1 is better).
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
    /// Measure bitmend beside the systems it replaces (not in this build: `--features bench`).
    #[cfg(not(feature = "bench"))]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        rest: Vec<String>,
    },
    /// Create and describe raw NAND image files.
    Media(media::MediaArgs),
    /// Damage an unmounted NAND image as hardware does: flip bits, lose pages, mark blocks bad.
    ///
    /// Prints every fault it injected (page, block, bit positions) and the seed that repeats it.
    Inject(inject::InjectArgs),
    /// An ordered key-value store in persistent memory (a pool file): transactions that
    /// survive crashes, checksummed allocator headers, a journal that heals itself.
    Kv(kv::KvArgs),
    /// Man pages and shell completions, made from these very definitions.
    Generate(generate::GenerateArgs),
}

/// A closed stdout (`bitmend stat MNT | head -1`) ends a command as it ends any Unix tool,
/// by SIGPIPE, instead of a panic in `println!`. Not the mount: a daemon lives on whatever
/// becomes of the terminal that started it.
fn die_quietly_on_closed_pipe() {
    // SAFETY: restores the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.first().is_some_and(mount_helper::invoked_as_helper) {
        match mount_helper::translate(&argv) {
            Ok(Some(mount)) => argv = mount,
            Ok(None) => return ExitCode::SUCCESS,
            Err(why) => {
                eprintln!("mount.bitmend: {why}");
                return ExitCode::from(2);
            }
        }
    }
    let cli = Cli::parse_from(argv);
    if !matches!(cli.command, Command::Mount(_)) {
        die_quietly_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Mkfs(a) => fscmd::mkfs(&a).map(|()| 0),
        Command::Mount(a) => fscmd::mount(&a).map(|()| 0),
        Command::Sync(a) => mounted::sync(&a).map(|()| 0),
        Command::Umount(a) => mounted::umount(&a).map(|()| 0),
        Command::Fsck(a) => fscmd::fsck(&a),
        Command::Scrub(a) => scrub::scrub(&a),
        Command::Stat(a) => fscmd::stat(&a).map(|()| 0),
        Command::Demo(a) => demo::run(&a).map(|()| 0),
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::run(args).map(|()| 0),
        #[cfg(not(feature = "bench"))]
        Command::Bench { .. } => Err(error::CliError::Usage(
            "this bitmend was built without the benchmarks: \
             cargo install --path crates/cli --features bench (needs ISA-L, PMDK and libclang)"
                .into(),
        )),
        Command::Media(args) => media::run(args).map(|()| 0),
        Command::Inject(args) => inject::run(args).map(|()| 0),
        Command::Kv(args) => kv::run(args),
        Command::Generate(args) => generate::run(args).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("bitmend: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
