//! `bitmend kv`: the key-value store in a pool file (a persistent-memory region: an mmap'd
//! file, or a file on a DAX file system or /dev/shm), each command one or more transactions.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use bitmend_heap::kv::Kv;
use bitmend_heap::{HeapError, Pool, PoolOptions, ReadCheck, ScrubPass, ScrubReport, StripeShape};
use bitmend_media::pmem::{MmapRegion, RamRegion, Region};
use clap::{Args, Subcommand};

use crate::error::{CliError, EXIT_PROBLEMS};
use crate::json::json_str;

mod opened;
use opened::Opened;

#[derive(Args, Debug)]
pub struct KvArgs {
    #[command(subcommand)]
    pub command: KvCommand,
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
    },
    /// Set KEY to VALUE (or to the contents of --value-file), one transaction.
    Put {
        file: PathBuf,
        key: String,
        value: Option<String>,
        #[arg(long, conflicts_with = "value")]
        value_file: Option<PathBuf>,
    },
    /// Print the value of KEY (exit 1 if there is none). In a pool that heals, every page
    /// read is checked, and a damaged one rebuilt before its bytes are used.
    Get {
        file: PathBuf,
        key: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove KEY.
    Del { file: PathBuf, key: String },
    /// Entries in key order: all, those with --prefix, or those from --from up to --to.
    Scan {
        file: PathBuf,
        #[arg(long)]
        prefix: Option<String>,
        #[arg(long)]
        from: Option<String>,
        #[arg(long)]
        to: Option<String>,
        /// Stop after this many.
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Put every line `KEY<TAB>VALUE` of INPUT (`-`: standard input), a transaction per
    /// 1,000 lines. A bad line stops it and is named, with what was loaded before.
    Load { file: PathBuf, input: PathBuf },
    /// Check every block header, every tree invariant and the journal; in a pool that heals,
    /// sign every page too and name the keys on damaged pages. Writes nothing but what
    /// recovery at open writes.
    Check {
        file: PathBuf,
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
        #[arg(long)]
        json: bool,
    },
    /// Space, objects and the journal.
    Stat {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

fn open(file: &Path) -> Result<(Opened, bitmend_heap::OpenReport, Kv), CliError> {
    Opened::open(file, PoolOptions::default())
}

pub fn run(a: KvArgs) -> Result<u8, CliError> {
    match a.command {
        KvCommand::Create { file, size, stripes } => {
            let region = MmapRegion::create(&file, size as usize)
                .map_err(|e| CliError::Target(format!("{}: {e}", file.display())))?;
            let made = Pool::create(region, PoolOptions { stripes, ..PoolOptions::default() })
                .and_then(|mut pool| Kv::create(&mut pool).map(|_| pool));
            // A create that fails leaves no file behind (it made the file).
            made.inspect_err(|_| {
                let _ = std::fs::remove_file(&file);
            })?
            .close();
            let heals = stripes.map_or(String::new(), |s| format!(", healing in stripes of {}+{}", s.k, s.m));
            println!(
                "{}: a key-value store in a pool of {}{heals}",
                file.display(),
                crate::units::show_size(size)
            );
        }
        KvCommand::Put { file, key, value, value_file } => {
            let value = match (value, value_file) {
                (Some(v), None) => v.into_bytes(),
                (None, Some(f)) => {
                    std::fs::read(&f).map_err(|e| CliError::Usage(format!("{}: {e}", f.display())))?
                }
                _ => return Err(CliError::Usage("give a VALUE or --value-file".into())),
            };
            let (mut pool, _, kv) = open(&file)?;
            kv.put(&mut pool, key.as_bytes(), &value)?;
        }
        KvCommand::Get { file, key, json } => {
            let (mut pool, _, kv) = open(&file)?;
            // One read: checking every page it reads costs nothing a person would notice.
            pool.set_read_check(ReadCheck::Every);
            let got = kv.get_healing(&mut pool, key.as_bytes())?;
            let Some(v) = got else {
                return Err(CliError::Failed(format!("no key {key:?}")));
            };
            if json {
                println!(
                    "{{\"key\": {}, \"value\": {}}}",
                    json_str(&key),
                    json_str(&String::from_utf8_lossy(&v))
                );
            } else {
                // The value's bytes exactly; a newline after them only for a person.
                let mut out = std::io::stdout().lock();
                out.write_all(&v).map_err(|e| CliError::Failed(e.to_string()))?;
                if out.is_terminal() {
                    let _ = writeln!(out);
                }
            }
        }
        KvCommand::Del { file, key } => {
            let (mut pool, _, kv) = open(&file)?;
            let found = kv.delete(&mut pool, key.as_bytes())?;
            if !found {
                return Err(CliError::Failed(format!("no key {key:?}")));
            }
        }
        KvCommand::Scan { file, prefix, from, to, limit, json } => {
            scan(&file, prefix, from, to, limit, json)?
        }
        KvCommand::Load { file, input } => load(&file, &input)?,
        KvCommand::Check { file, json } => return check(&file, json),
        KvCommand::Scrub { file, full, json } => return scrub(&file, full, json),
        KvCommand::Stat { file, json } => stat(&file, json)?,
    }
    Ok(0)
}

fn scan(
    file: &Path,
    prefix: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<usize>,
    json: bool,
) -> Result<(), CliError> {
    let (mut pool, _, kv) = open(file)?;
    // Every node and value checked before it is printed, as `get` reads.
    pool.set_read_check(ReadCheck::Every);
    let mut n = 0usize;
    let limit = limit.unwrap_or(usize::MAX);
    let mut out = std::io::stdout().lock();
    let mut emit = |k: &[u8], v: Vec<u8>| {
        if n >= limit {
            return false;
        }
        n += 1;
        let (k, v) = (String::from_utf8_lossy(k), String::from_utf8_lossy(&v));
        let line = if json {
            format!("{{\"key\": {}, \"value\": {}}}", json_str(&k), json_str(&v))
        } else {
            format!("{k}\t{v}")
        };
        writeln!(out, "{line}").is_ok() && n < limit
    };
    match prefix {
        // With --from and --to: the keys in both (from the later start, to the earlier end).
        Some(p) => {
            let p = p.as_bytes();
            let start = from.as_deref().map(str::as_bytes).filter(|f| *f > p).unwrap_or(p);
            let end = to.as_deref().map(str::as_bytes);
            kv.scan_healing(&mut pool, Some(start), end, &mut |k, v| k.starts_with(p) && emit(k, v))?
        }
        None => kv.scan_healing(
            &mut pool,
            from.as_deref().map(str::as_bytes),
            to.as_deref().map(str::as_bytes),
            &mut emit,
        )?,
    }
    Ok(())
}

fn load(file: &Path, input: &Path) -> Result<(), CliError> {
    let (mut pool, _, kv) = open(file)?;
    let stdin = input == Path::new("-");
    let (reader, total): (Box<dyn BufRead>, u64) = if stdin {
        (Box::new(std::io::stdin().lock()), 0)
    } else {
        let f =
            std::fs::File::open(input).map_err(|e| CliError::Usage(format!("{}: {e}", input.display())))?;
        let total = f.metadata().map(|m| m.len()).unwrap_or(0);
        (Box::new(std::io::BufReader::new(f)), total)
    };
    let tty = std::io::stderr().is_terminal() && total > 0;
    let mut lines = reader.lines().enumerate();
    let (mut done_bytes, mut entries) = (0u64, 0u64);
    // A bad line stops the load: what was committed before its batch stays, and is said.
    let bad = |n: usize, why: &str, entries: u64| {
        CliError::Usage(format!(
            "{}: line {}: {why}; {entries} entries were loaded before the batch of up to 1,000 lines that holds it, which was not",
            input.display(),
            n + 1
        ))
    };
    loop {
        let mut batch = Vec::with_capacity(1000);
        for (n, line) in lines.by_ref().take(1000) {
            let line = match line {
                Ok(line) => line,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    return Err(bad(n, "not UTF-8 text", entries));
                }
                Err(e) => return Err(CliError::Failed(format!("{}: {e}", input.display()))),
            };
            done_bytes += line.len() as u64 + 1;
            let Some((k, v)) = line.split_once('\t') else {
                return Err(bad(n, "no tab between key and value", entries));
            };
            batch.push((k.to_string(), v.to_string()));
        }
        if batch.is_empty() {
            break;
        }
        put_all(&mut pool, &kv, &batch)?;
        entries += batch.len() as u64;
        if tty {
            let pct = (done_bytes * 100 / total.max(1)).min(100);
            eprint!("\rload: [{:<25}] {pct}%, {entries} entries", "#".repeat(pct as usize / 4));
        }
    }
    if tty {
        eprintln!();
    }
    println!("{}: {entries} entries loaded; the store holds {}", file.display(), kv.len(&pool)?);
    Ok(())
}

/// Puts `batch` in one transaction, or, when its records do not fit in the pool's journal, in
/// halves (each all or nothing), down to one entry per transaction.
fn put_all<R: Region>(pool: &mut Pool<R>, kv: &Kv, batch: &[(String, String)]) -> Result<(), HeapError> {
    let r = kv.batch(pool, |kv, tx| {
        for (k, v) in batch {
            kv.put_in(tx, k.as_bytes(), v.as_bytes())?;
        }
        Ok(())
    });
    match r {
        Err(HeapError::JournalFull { .. }) if batch.len() > 1 => {
            let (a, b) = batch.split_at(batch.len() / 2);
            put_all(pool, kv, a)?;
            put_all(pool, kv, b)
        }
        r => r,
    }
}

/// `K+M`, as `--stripes` takes it.
fn parse_stripes(s: &str) -> Result<StripeShape, String> {
    let (k, m) = s.split_once('+').ok_or_else(|| format!("{s:?}: give K+M, as 8+2"))?;
    let num = |v: &str| v.trim().parse::<u8>().map_err(|_| format!("{s:?}: {v:?} is not a number"));
    StripeShape { k: num(k)?, m: num(m)? }.check().map_err(|e| e.to_string())
}

/// The damaged pages of `report` as byte ranges, and what of the store is on them.
fn damage_lines<R: Region>(pool: &Pool<R>, kv: &Kv, report: &ScrubReport) -> Result<Vec<String>, CliError> {
    let ranges: Vec<(u64, u64)> =
        report.damaged.iter().filter_map(|&p| pool.page_offset(p)).map(|at| (at, 4096)).collect();
    let on = kv.damaged(pool, &ranges)?;
    let beyond = |p: &u64| report.beyond_repair.contains(p);
    let mut lines: Vec<String> = report
        .damaged
        .iter()
        .map(|p| {
            let at = pool.page_offset(*p).unwrap_or(0);
            let what = if beyond(p) { "beyond repair" } else { "repairable (bitmend kv scrub)" };
            format!("page {p} at {at:#x} damaged, {what}")
        })
        .collect();
    lines
        .extend(on.keys.iter().map(|k| format!("key {:?} is on a damaged page", String::from_utf8_lossy(k))));
    Ok(lines)
}

/// A copy of the pool in memory with every page that can be rebuilt rebuilt, for naming
/// the keys on damaged pages: a wiped leaf read as it is names none of its keys, rebuilt it
/// names all those on the damage. The file is not written. `None` when nothing is
/// repairable, or the copy does not open.
fn rebuilt_copy<R: Region>(pool: &Pool<R>, d: &ScrubReport) -> Option<(Pool<RamRegion>, Kv)> {
    if d.damaged.iter().all(|p| d.beyond_repair.contains(p)) {
        return None;
    }
    let copy = RamRegion::from_bytes(pool.region().bytes().to_vec());
    let (mut copy, _) = Pool::open(copy, PoolOptions::default()).ok()?;
    copy.scrub(ScrubPass::Full).ok()?;
    let kv = Kv::open(&copy).ok()?;
    Some((copy, kv))
}

/// Damage the open itself repaired (the superblock copies, the journal's own parts): found,
/// so reported, though already mended.
fn repaired_at_open(report: &bitmend_heap::OpenReport) -> Vec<String> {
    let mut lines = Vec::new();
    if report.superblocks_rewritten > 0 {
        lines.push(format!(
            "{} superblock copies were damaged, rewritten at open",
            report.superblocks_rewritten
        ));
    }
    if report.journal_repairs > 0 {
        lines.push(format!("the journal had {} damaged parts, rebuilt at open", report.journal_repairs));
    }
    lines
}

/// What a check found besides damaged data pages, all of it repairable by a scrub: parity
/// pages, signature table entries and line checks (their own pages damaged; the data pages
/// they describe sound).
fn protection_lines(report: &ScrubReport) -> Vec<String> {
    let parity = report.bad_pages.saturating_sub(report.damaged.len() as u64);
    let counted = [
        (parity, "parity pages damaged"),
        (report.sigs_rewritten, "signature table entries wrong"),
        (report.checks_rewritten, "line checks wrong"),
    ];
    counted
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}, repairable (bitmend kv scrub)"))
        .collect()
}

/// The lines of a report for a terminal: the first `SHOWN`, then how many more (`--json`
/// has them all).
fn shown(lines: &[String]) -> Vec<String> {
    const SHOWN: usize = 20;
    let mut v: Vec<String> = lines.iter().take(SHOWN).cloned().collect();
    if lines.len() > SHOWN {
        v.push(format!("... and {} more (--json lists them all)", lines.len() - SHOWN));
    }
    v
}

fn check(file: &Path, json: bool) -> Result<u8, CliError> {
    // Recovery writes what a crash left; damage is only reported.
    let (mut pool, report, kv) =
        Opened::open(file, PoolOptions { rebuild_headers: false, ..PoolOptions::default() })?;
    let damage = if pool.heals() { Some(pool.check_damage(ScrubPass::Full)?) } else { None };
    let damage_lines = match &damage {
        Some(d) => {
            let named = match rebuilt_copy(&pool, d) {
                Some((copy, copy_kv)) => damage_lines(&copy, &copy_kv, d)?,
                None => damage_lines(&pool, &kv, d)?,
            };
            [named, protection_lines(d)].concat()
        }
        None => Vec::new(),
    };
    let tree = kv.check(&pool);
    // The damage first: bad headers on a damaged page are its consequence.
    let problems: Vec<String> =
        damage_lines
            .into_iter()
            .chain(repaired_at_open(&report))
            .chain(report.bad_headers.iter().map(|b| {
                format!("{} header at {:#x}: {}", if b.run { "run" } else { "block" }, b.at, b.fault)
            }))
            .chain(tree.as_ref().err().map(|e| e.to_string()))
            .collect();
    let st = tree.unwrap_or_default();
    if json {
        let list: Vec<String> = problems.iter().map(|p| json_str(p)).collect();
        println!(
            "{{\"file\": {}, \"clean\": {}, \"entries\": {}, \"nodes\": {}, \"depth\": {}, \"rolled_back\": {}, \"problems\": [{}]}}",
            json_str(&file.display().to_string()),
            problems.is_empty(),
            st.entries,
            st.nodes,
            st.depth,
            report.rolled_back,
            list.join(", ")
        );
    } else {
        println!("{}: {} entries in {} nodes, depth {}", file.display(), st.entries, st.nodes, st.depth);
        if let Some(d) = &damage {
            println!(
                "  pages          {} checked in {} stripes, {} damaged",
                pool.geometry().map_or(0, |g| g.pages),
                d.stripes_checked,
                d.damaged.len()
            );
        }
        for p in shown(&problems) {
            println!("  problem: {p}");
        }
        println!("  {}", if problems.is_empty() { "clean" } else { "NOT clean" });
    }
    Ok(if problems.is_empty() { 0 } else { EXIT_PROBLEMS })
}

fn scrub(file: &Path, full: bool, json: bool) -> Result<u8, CliError> {
    let (mut pool, opened, kv) = open(file)?;
    if !pool.heals() {
        return Err(CliError::Usage(format!(
            "{}: this pool keeps no parity (made without --stripes): nothing to scrub with; `bitmend kv check` checks it",
            file.display()
        )));
    }
    let pass = if full { ScrubPass::Full } else { ScrubPass::Cheap };
    let mut r = pool.scrub(pass)?;
    // Pages under damaged headers were rebuilt as the pool opened: counted with the scrub's.
    let at_open = opened.header_pages_rebuilt;
    r.pages_repaired += at_open;
    r.bad_pages += at_open;
    let lines = damage_lines(&pool, &kv, &ScrubReport { damaged: r.beyond_repair.clone(), ..r.clone() })?;
    // Each figure named once, for both printers.
    let ScrubReport {
        stripes_checked,
        cheap_mismatches,
        bad_pages,
        pages_repaired,
        sigs_rewritten,
        checks_rewritten,
        ..
    } = &r;
    let pass = if full { "full" } else { "cheap" };
    // Lines damaged while a crashed pool was down, rebuilt before its recovery.
    let mended = opened.lines_mended;
    if json {
        let left: Vec<String> = r.beyond_repair.iter().map(|p| p.to_string()).collect();
        let keys: Vec<String> = lines.iter().filter(|l| l.starts_with("key ")).map(|l| json_str(l)).collect();
        println!(
            "{{\"file\": {}, \"pass\": \"{pass}\", \"stripes_checked\": {stripes_checked}, \"cheap_mismatches\": {cheap_mismatches}, \"bad_pages\": {bad_pages}, \"pages_repaired\": {pages_repaired}, \"sigs_rewritten\": {sigs_rewritten}, \"checks_rewritten\": {checks_rewritten}, \"rebuilt_at_open\": {at_open}, \"lines_mended_before_recovery\": {mended}, \"beyond_repair\": [{}], \"damaged_keys\": [{}]}}",
            json_str(&file.display().to_string()),
            left.join(", "),
            keys.join(", ")
        );
    } else {
        println!(
            "{}: {pass} pass, {stripes_checked} stripes checked ({cheap_mismatches} inconsistent in the table), {bad_pages} bad pages, {pages_repaired} rebuilt ({at_open} of them as the pool opened, under damaged headers), {sigs_rewritten} signatures and {checks_rewritten} line checks rewritten",
            file.display()
        );
        if mended > 0 {
            println!(
                "  {mended} lines damaged while the pool was down after a crash, rebuilt before its recovery"
            );
        }
        for l in shown(&lines) {
            println!("  {l}");
        }
    }
    Ok(if r.beyond_repair.is_empty() { 0 } else { EXIT_PROBLEMS })
}

fn stat(file: &Path, json: bool) -> Result<(), CliError> {
    let (pool, _, kv) = open(file)?;
    let a = pool.stats();
    let t = kv.check(&pool)?;
    let wear = pool.wear_histogram();
    let (log_used, log_cap) = pool.journal_use();
    // The protection: stripes k+m over how many pages, and the version that says so.
    let geo = pool.geometry();
    let stripes = geo.map_or("null".to_string(), |g| format!("\"{}+{}\"", g.shape.k, g.shape.m));
    if json {
        let w: Vec<String> = wear.iter().map(|n| n.to_string()).collect();
        println!(
            "{{\"file\": {}, \"capacity\": {}, \"entries\": {}, \"nodes\": {}, \"depth\": {}, \"value_blocks\": {}, \
             \"allocated_blocks\": {}, \"free_blocks\": {}, \"quarantined_blocks\": {}, \"unassigned_runs\": {}, \
             \"journal_used\": {log_used}, \"journal_capacity\": {log_cap}, \"version\": {}, \"stripes\": {stripes}, \
             \"protected_pages\": {}, \"wear_histogram\": [{}]}}",
            json_str(&file.display().to_string()),
            pool.capacity(),
            t.entries,
            t.nodes,
            t.depth,
            t.value_blocks,
            a.allocated_blocks,
            a.free_blocks + a.cooling_blocks,
            a.quarantined_blocks,
            a.unassigned_runs,
            pool.version(),
            geo.map_or(0, |g| g.pages),
            w.join(", ")
        );
    } else {
        println!("{}: bitmend key-value store (pool version {})", file.display(), pool.version());
        match geo {
            Some(g) => println!(
                "  healing        stripes of {}+{} over {} pages: up to {} bad pages per stripe rebuilt",
                g.shape.k, g.shape.m, g.pages, g.shape.m
            ),
            None => println!("  healing        none (made without --stripes): damage is not detected"),
        }
        println!(
            "  pool           {} of runs, {} runs unassigned",
            crate::units::show_size(pool.capacity()),
            a.unassigned_runs
        );
        println!(
            "  store          {} entries, {} nodes, depth {}, {} values out of line",
            t.entries, t.nodes, t.depth, t.value_blocks
        );
        println!(
            "  blocks         {} allocated, {} free, {} quarantined",
            a.allocated_blocks,
            a.free_blocks + a.cooling_blocks,
            a.quarantined_blocks
        );
        println!(
            "  journal        {} of {} in use",
            crate::units::show_size(log_used),
            crate::units::show_size(log_cap)
        );
        let buckets: Vec<String> = wear
            .iter()
            .enumerate()
            .map(|(i, n)| match i {
                0 => format!("never: {n}"),
                1 => format!("1: {n}"),
                _ => format!("{}-{}: {n}", 1u64 << (i - 1), (1u64 << i) - 1),
            })
            .collect();
        println!("  wear           blocks by times allocated: {}", buckets.join(", "));
    }
    Ok(())
}
