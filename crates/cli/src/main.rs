//! The `bitmend` command line.

mod bench;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bitmend: {e}");
            ExitCode::FAILURE
        }
    }
}
