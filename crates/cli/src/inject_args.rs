//! What `bitmend inject` takes: the file, the fault, the seed. Both kinds of file (a NAND
//! image, `inject.rs`; a heap pool, `inject_pool.rs`) read the same arguments.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

#[derive(Args, Debug)]
pub struct InjectArgs {
    /// The NAND image file (not mounted: the image is locked while in use), or a heap pool
    /// file (`bitmend kv create`; not in use), whose pages take flips and losses.
    pub(crate) image: PathBuf,
    #[command(subcommand)]
    pub(crate) fault: Fault,
    /// Seed for every random choice; the same seed on the same image repeats the damage.
    /// Without it a seed is drawn and printed.
    #[arg(long, global = true)]
    pub(crate) seed: Option<u64>,
    /// One JSON object per fault on stdout instead of text.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Fault {
    /// Flip random bits in pages (retention loss, read disturb).
    Flip {
        /// The page to damage; without it, random programmed pages.
        #[arg(long)]
        page: Option<u32>,
        /// How many random pages, when --page is not given.
        #[arg(long, default_value_t = 1)]
        pages: u32,
        /// Bits to flip per page.
        #[arg(long, default_value_t = 1)]
        bits: u32,
        /// Which part of the page.
        #[arg(long, value_enum, default_value_t = AreaArg::Both)]
        area: AreaArg,
    },
    /// Replace pages' data and spare with garbage (a page that no longer reads back).
    Lose {
        /// The page to destroy; without it, random programmed pages.
        #[arg(long)]
        page: Option<u32>,
        /// How many random pages, when --page is not given.
        #[arg(long, default_value_t = 1)]
        pages: u32,
    },
    /// Copy a page, data and spare, over another (a write that reached the wrong address).
    Misdirect {
        /// The page whose contents are copied.
        #[arg(long)]
        from: u32,
        /// The page they land on.
        #[arg(long)]
        to: u32,
    },
    /// Mark an erase block bad (as a failed erase does).
    Bad {
        /// The erase block.
        #[arg(long)]
        block: u32,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub(crate) enum AreaArg {
    Data,
    Spare,
    Both,
}
