//! `bitmend kv`: the key-value store in a pool file (a persistent-memory region: an mmap'd
//! file, or a file on a DAX file system or /dev/shm), each command one or more transactions.
//! Commands that only read share the file with each other; a command that writes holds it
//! alone.

use std::path::PathBuf;
use std::time::Duration;

use bitmend_heap::StripeShape;
use clap::{Args, Subcommand};

use crate::error::CliError;

mod bytes;
mod opened;
mod read;
mod report;
mod write;

use bytes::Form;
pub use read::Range;

#[derive(Args, Debug)]
pub struct KvArgs {
    #[command(subcommand)]
    pub command: KvCommand,
    /// How long to wait for other processes that hold the pool: a command that writes waits
    /// for readers and writers, one that reads for a writer (`0`: fail at once, exit 3).
    #[arg(long, global = true, default_value = "5s", value_name = "DURATION", value_parser = parse_wait)]
    pub wait: Duration,
    /// Keys and values are hex, two digits a byte, on the command line, in `load`'s input
    /// and in output: any bytes, tabs and newlines included. Without it they are UTF-8
    /// text, and an entry text cannot carry is refused, never altered (`--json` then gives
    /// it as `key_hex` / `value_hex`).
    #[arg(long, global = true)]
    pub hex: bool,
}

#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// Make a pool file holding an empty store.
    Create {
        file: PathBuf,
        /// The pool's size (the journal takes a sixteenth, 256 KiB to 64 MiB).
        #[arg(long, default_value = "64MiB", value_parser = crate::units::parse_size)]
        size: u64,
        /// A pool that heals: stripes of K data pages and M parity pages (K 1 to 64, M 0 to
        /// 4), a signature per 4 KiB page and a check per 64-byte line; up to M bad pages per
        /// stripe are rebuilt. Costs M/K of the space, and time on every write (see `bitmend
        /// bench heap`). Without it, damage to live data is not detected.
        #[arg(long, value_name = "K+M", value_parser = parse_stripes)]
        stripes: Option<StripeShape>,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Set KEY to VALUE, one transaction. KEY may come from --key-file (then a single
    /// argument after FILE is the value), VALUE from --value-file (`-`: standard input).
    Put {
        /// The pool file.
        file: PathBuf,
        key: Option<String>,
        value: Option<String>,
        /// The key's bytes, exactly as the file holds them.
        #[arg(long)]
        key_file: Option<PathBuf>,
        /// The value's bytes, exactly as the file holds them (`-`: standard input).
        #[arg(long, conflicts_with = "value")]
        value_file: Option<PathBuf>,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Print the value of KEY: its bytes exactly (a newline after them only on a terminal;
    /// never with --raw), or hex with --hex. Exit 1 if there is none. In a pool that heals,
    /// every page read is checked, and a damaged one rebuilt (in this command's copy; `bitmend
    /// kv scrub` mends the file) before its bytes are used.
    Get {
        file: PathBuf,
        key: Option<String>,
        /// The key's bytes, exactly as the file holds them.
        #[arg(long, conflicts_with = "key")]
        key_file: Option<PathBuf>,
        /// No newline after the value, even on a terminal.
        #[arg(long)]
        raw: bool,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Remove KEY (exit 1 if there is none), or every key in a range: --prefix, --from,
    /// --to (a transaction per 1,000 keys).
    Del {
        file: PathBuf,
        key: Option<String>,
        /// The key's bytes, exactly as the file holds them.
        #[arg(long, conflicts_with = "key")]
        key_file: Option<PathBuf>,
        #[command(flatten)]
        range: Range,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Entries in key order, `KEY<TAB>VALUE` a line: all, or those in a range. Every node and
    /// value is checked before it is printed.
    Scan {
        file: PathBuf,
        #[command(flatten)]
        range: Range,
        /// Stop after this many.
        #[arg(long)]
        limit: Option<usize>,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// How many entries: all, or those in a range.
    Count {
        file: PathBuf,
        #[command(flatten)]
        range: Range,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Every entry (or those in a range) as `KEYHEX<TAB>VALUEHEX` lines, which `load --hex`
    /// takes back: `dump A | load --hex B -` copies any store exactly.
    Dump {
        file: PathBuf,
        #[command(flatten)]
        range: Range,
    },
    /// Put every line `KEY<TAB>VALUE` of INPUT (`-`: standard input; hex fields with
    /// --hex), a transaction per 1,000 lines. A bad line stops it and is named, with what
    /// was loaded before.
    Load {
        file: PathBuf,
        input: PathBuf,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Check every block header, every tree invariant and the journal; in a pool that heals,
    /// sign every page too and name the keys on damaged pages. Writes nothing to the file.
    Check {
        file: PathBuf,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild damaged pages of a pool that heals from their stripes: the cheap pass (the
    /// signature table alone, then the stripes it finds inconsistent) or, with --full, every
    /// page signed. Exit 4 if damage is left that could not be rebuilt.
    Scrub {
        file: PathBuf,
        #[arg(long)]
        full: bool,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Space (what is free, and about how many more entries it holds), objects, protection
    /// and the journal.
    Stat {
        file: PathBuf,
        /// Print JSON (scan: an object a line) for scripts.
        #[arg(long)]
        json: bool,
    },
}

/// What every command takes besides its own arguments.
#[derive(Clone, Copy, Debug)]
pub struct Session {
    pub wait: Duration,
    pub form: Form,
}

pub fn run(a: KvArgs) -> Result<u8, CliError> {
    let s = Session { wait: a.wait, form: Form::of(a.hex) };
    match a.command {
        KvCommand::Create { file, size, stripes, json } => write::create(&file, size, stripes, json)?,
        KvCommand::Put { file, key, value, key_file, value_file, json } => {
            let (key, value) = write::key_and_value(s.form, (key, key_file), (value, value_file))?;
            write::put(s, &file, &key, &value, json)?
        }
        KvCommand::Get { file, key, key_file, raw, json } => {
            read::get(s, &file, &given_key(s.form, key, key_file)?, raw, json)?
        }
        KvCommand::Del { file, key, key_file, range, json } => match (key, key_file, range.is_empty()) {
            (None, None, false) => write::del_range(s, &file, &range, json)?,
            (key, key_file, true) => write::del(s, &file, &given_key(s.form, key, key_file)?, json)?,
            _ => {
                return Err(CliError::Usage(
                    "give a KEY or a range (--prefix, --from, --to), not both".into(),
                ))
            }
        },
        KvCommand::Scan { file, range, limit, json } => read::scan(s, &file, &range, limit, json)?,
        KvCommand::Count { file, range, json } => read::count(s, &file, &range, json)?,
        KvCommand::Dump { file, range } => {
            read::scan(Session { form: Form::Hex, ..s }, &file, &range, None, false)?
        }
        KvCommand::Load { file, input, json } => write::load(s, &file, &input, json)?,
        KvCommand::Check { file, json } => return report::check(s, &file, json),
        KvCommand::Scrub { file, full, json } => return report::scrub(s, &file, full, json),
        KvCommand::Stat { file, json } => report::stat(s, &file, json)?,
    }
    Ok(0)
}

/// The key named by a KEY argument (in the session's form) or by --key-file.
fn given_key(form: Form, key: Option<String>, key_file: Option<PathBuf>) -> Result<Vec<u8>, CliError> {
    match (key, key_file) {
        (Some(k), None) => form.parse(&k, "key").map_err(CliError::Usage),
        (None, Some(f)) => read_input(&f),
        _ => Err(CliError::Usage("give a KEY or --key-file".into())),
    }
}

/// The bytes of a file a user named (`-`: standard input).
fn read_input(f: &std::path::Path) -> Result<Vec<u8>, CliError> {
    if f == std::path::Path::new("-") {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut b)
            .map_err(|e| CliError::Failed(format!("standard input: {e}")))?;
        return Ok(b);
    }
    std::fs::read(f).map_err(|e| CliError::Usage(format!("{}: {e}", f.display())))
}

/// `--wait`: a duration, `0` for none.
fn parse_wait(s: &str) -> Result<Duration, String> {
    crate::units::parse_duration(s).map(Option::unwrap_or_default)
}

/// `K+M`, as `--stripes` takes it.
fn parse_stripes(s: &str) -> Result<StripeShape, String> {
    let (k, m) = s.split_once('+').ok_or_else(|| format!("{s:?}: give K+M, as 8+2"))?;
    let num = |v: &str| v.trim().parse::<u8>().map_err(|_| format!("{s:?}: {v:?} is not a number"));
    StripeShape { k: num(k)?, m: num(m)? }.check().map_err(|e| e.to_string())
}
