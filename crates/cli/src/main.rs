//! The `bitmend` command line.

mod bench;
mod inject;
mod media;
mod size;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Self-healing, crash-consistent storage for persistent memory and raw NAND flash.
#[derive(Parser, Debug)]
#[command(name = "bitmend", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure bitmend beside the systems it replaces, in one run, as ratios (> 1 is better).
    Bench(bench::BenchArgs),
    /// Create and describe raw NAND image files.
    Media(media::MediaArgs),
    /// Damage an unmounted NAND image as hardware does: flip bits, lose pages, mark blocks bad.
    ///
    /// Prints every fault it injected (page, block, bit positions) and the seed that repeats it.
    Inject(inject::InjectArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Media(args) => media::run(args),
        Command::Inject(args) => inject::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bitmend: {e}");
            ExitCode::FAILURE
        }
    }
}
