//! `bitmend bench`.

use crate::error::CliError;
use std::io::Write;

use bitmend_bench::{harness, Options, Row};
use clap::{Args, ValueEnum};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    suite: Suite,
    /// A short run (under a minute) with fewer cases and samples: for smoke tests.
    #[arg(long)]
    quick: bool,
    /// One JSON object per row on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Samples per figure; the median is reported.
    #[arg(long)]
    samples: Option<usize>,
    /// The tree of files for `corpus` (default: this machine's /usr/lib/python3.N).
    #[arg(long, value_name = "DIR")]
    corpus: Option<std::path::PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Suite {
    /// GF(2^8) engines, Reed-Solomon, signatures and CRC-32C beside ISA-L.
    Code,
    /// The flash file system on a modelled RCFFS chip (128 MiB, 2 KiB pages): throughput,
    /// write amplification, sync cost, repair time and mount time.
    Flashfs,
    /// Of `flashfs`'s rows, the namespace's alone: mount time, the mount's RAM and create,
    /// stat, readdir and unlink with 1,000 to 1,000,000 files (image files in the temporary
    /// directory).
    Namespace,
    /// The space a real tree of files takes with each codec, beside mkfs.ubifs images of the
    /// same tree (lz4 beside LZO, zstd beside zstd).
    Corpus,
    /// The PRIMS log's small writes beside mprotect, PMDK transactions and bare persists
    /// (the paper's Figure 2), ns per write.
    Nvlog,
    /// The checked page cache (Loris's Table VI): PostMark and a file-server mix with each
    /// read-check strategy, run time against no read checks; memory errors caught per
    /// strategy; and the NVRAM tier's synced overwrites (fsync CPU and device time, write
    /// amplification) against no tier.
    Cache,
    /// How long a program's request waits while a supervised mount's worker is killed and
    /// replaced with the NVRAM tier nearly full, at 128 MiB and 1 GiB, beside the same crash
    /// without the supervisor (unmount, mount again). Needs FUSE.
    Stall,
    /// The persistent heap's transactional overwrites (55 B to 16 KiB; data logging and
    /// pointer logging) beside PMDK transactions and bare persists, ns per transaction.
    Heap,
}

pub fn run(args: BenchArgs) -> Result<(), CliError> {
    let mut opts = if args.quick { Options::quick() } else { Options::full() };
    if let Some(s) = args.samples {
        if s == 0 {
            return Err(CliError::Usage("--samples must be at least 1".into()));
        }
        opts.samples = s;
    }
    let mut rows: Vec<Row> = Vec::new();
    let json = args.json;
    let mut emit = |r: Row| {
        if json {
            println!("{}", r.to_json());
        } else {
            eprint!(".");
            let _ = std::io::stderr().flush();
        }
        rows.push(r);
    };
    match args.suite {
        Suite::Code => {
            if !json {
                eprintln!(
                    "bench code: engine {}, beside {}, {} samples per figure (medians)",
                    bitmend_code::gf::engine().name(),
                    bitmend_bench::code::isal_builds().join(" and "),
                    opts.samples
                );
            }
            bitmend_bench::code::run(&opts, &mut emit);
        }
        Suite::Corpus => {
            let dir = match args.corpus.or_else(bitmend_bench::corpus::default_corpus) {
                Some(d) => d,
                None => {
                    return Err(CliError::Usage(
                        "no corpus: give --corpus DIR (no /usr/lib/python3.N here)".into(),
                    ))
                }
            };
            if !json {
                eprintln!(
                    "bench corpus: {} into the flash file system and into mkfs.ubifs images",
                    dir.display()
                );
            }
            bitmend_bench::corpus::run(&opts, &dir, &mut emit)?;
        }
        Suite::Flashfs => {
            if !json {
                eprintln!("bench flashfs: RAM NAND, RCFFS geometry, typical timing (tR 25 us, tPROG 200 us, tBERS 2 ms, 25 ns/B)");
            }
            bitmend_bench::flashfs::run(&opts, &mut emit);
        }
        Suite::Namespace => bitmend_bench::namespace::run(&opts, &mut emit),
        Suite::Nvlog => {
            if !json {
                eprintln!(
                    "bench nvlog: {} writes per run, medians of {} runs; PMDK {}; persist by {}",
                    if args.quick { "20,000" } else { "1,000,000 (200,000 per fixed size)" },
                    if args.quick { 1 } else { 3 },
                    if bitmend_anchors::pmdk::available() { "linked" } else { "NOT linked (no anchor)" },
                    bitmend_media::pmem::flush_instruction()
                );
            }
            bitmend_bench::nvlog::run(&opts, &mut emit);
        }
        Suite::Cache => {
            if !json {
                eprintln!(
                    "bench cache: the flash file system on a RAM chip with no timing (CPU only: the worst case for checks), medians of {} runs",
                    if args.quick { 1 } else { 5 }
                );
            }
            bitmend_bench::cache::run(&opts, &mut emit);
            bitmend_bench::tier::run(&opts, &mut emit);
        }
        Suite::Stall => crate::bench_stall::run(args.quick, opts.samples, json, &mut emit)?,
        Suite::Heap => {
            if !json {
                eprintln!(
                    "bench heap: {} transactions per overwrite case, {} operations of the allocation trace, {} B+tree inserts, medians of {} runs; PMDK {}; persist by {}",
                    if args.quick { "2,000" } else { "40,000" },
                    if args.quick { "20,000" } else { "200,000" },
                    if args.quick { "20,000" } else { "1,000,000" },
                    if args.quick { 1 } else { 3 },
                    if bitmend_anchors::pmdk::available() { "linked" } else { "NOT linked (no anchor)" },
                    bitmend_media::pmem::flush_instruction()
                );
            }
            bitmend_bench::heap::run(&opts, &mut emit);
            bitmend_bench::heap_alloc::run(&opts, &mut emit);
            bitmend_bench::heap_kv::run(&opts, &mut emit);
        }
    }
    if !json {
        eprintln!();
        print!("{}", harness::table(&rows));
    }
    Ok(())
}
