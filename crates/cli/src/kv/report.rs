//! The commands that report on a pool and mend it: `check` (reads only), `scrub` (writes
//! what it rebuilds), `stat` (reads only).

use std::path::Path;

use bitmend_heap::kv::{Kv, KvStats};
use bitmend_heap::{HeapError, Pool, PoolOptions, ReadCheck, ScrubPass, ScrubReport};
use bitmend_media::pmem::{RamRegion, Region};

use super::opened::{Access, Opened};
use super::Session;
use crate::error::{CliError, EXIT_PROBLEMS};
use crate::json::json_str;

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

pub fn check(s: Session, file: &Path, json: bool) -> Result<u8, CliError> {
    // A reader's copy: what the open's recovery stores never reaches the file, and damaged
    // headers are reported, not rebuilt.
    let opts = PoolOptions { rebuild_headers: false, ..PoolOptions::default() };
    let (mut pool, report, kv) = Opened::open(file, opts, Access::Read, s.wait)?;
    let damage = if pool.heals() { Some(pool.check_damage(ScrubPass::Full)?) } else { None };
    let rebuilt = damage.as_ref().and_then(|d| rebuilt_copy(&pool, d));
    let damage_lines = match (&damage, &rebuilt) {
        (Some(d), Some((copy, copy_kv))) => [damage_lines(copy, copy_kv, d)?, protection_lines(d)].concat(),
        (Some(d), None) => [damage_lines(&pool, &kv, d)?, protection_lines(d)].concat(),
        (None, _) => Vec::new(),
    };
    // The tree as a reader finds it: in the copy with every repairable page rebuilt (a wiped
    // leaf counts its entries), else in the pool.
    let tree = match &rebuilt {
        Some((copy, copy_kv)) => copy_kv.check(copy),
        None => kv.check(&pool),
    };
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

pub fn scrub(s: Session, file: &Path, full: bool, json: bool) -> Result<u8, CliError> {
    let (mut pool, opened, kv) = Opened::open(file, PoolOptions::default(), Access::Write, s.wait)?;
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

pub fn stat(s: Session, file: &Path, json: bool) -> Result<(), CliError> {
    let (mut pool, _, kv) = Opened::open(file, PoolOptions::default(), Access::Read, s.wait)?;
    // Counted through the checks, as `get` reads: a damaged page is rebuilt (in this
    // command's copy) or named, never counted from wrong bytes.
    pool.set_read_check(ReadCheck::Every);
    let t = check_healing(&mut pool, &kv)?;
    let a = pool.stats();
    let (free, cap) = (pool.free_bytes(), pool.capacity());
    // What a person can use: about how many more entries like those stored fit (each costs
    // its share of the bytes in use: its leaf, the tree over it, its value's block).
    // Fewer than a hundred entries say too little: a near-empty leaf holds the bytes.
    let per_entry = (cap.saturating_sub(free)).checked_div(t.entries).filter(|&b| b > 0 && t.entries >= 100);
    let more = per_entry.map(|b| free / b);
    let wear = pool.wear_histogram();
    let (log_used, log_cap) = pool.journal_use();
    // The protection: stripes k+m over how many pages, and the version that says so.
    let geo = pool.geometry();
    let stripes = geo.map_or("null".to_string(), |g| format!("\"{}+{}\"", g.shape.k, g.shape.m));
    // How a writer makes a store durable in this file: what the medium under it allows.
    let dax = bitmend_media::pmem::maps_direct(file);
    if json {
        let w: Vec<String> = wear.iter().map(|n| n.to_string()).collect();
        println!(
            "{{\"file\": {}, \"capacity\": {}, \"entries\": {}, \"nodes\": {}, \"depth\": {}, \"value_blocks\": {}, \
             \"allocated_blocks\": {}, \"free_blocks\": {}, \"quarantined_blocks\": {}, \"unassigned_runs\": {}, \
             \"journal_used\": {log_used}, \"journal_capacity\": {log_cap}, \"version\": {}, \"stripes\": {stripes}, \
             \"protected_pages\": {}, \"free_bytes\": {free}, \"more_entries_estimate\": {}, \"wear_histogram\": [{}], \
             \"dax\": {dax}}}",
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
            more.map_or("null".into(), |n| n.to_string()),
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
        let pct = free * 100 / cap.max(1);
        let room = match (more, per_entry) {
            (Some(n), Some(b)) => {
                format!(
                    ": room for about {n} more entries like these ({} each, the tree included)",
                    crate::units::show_about(b)
                )
            }
            _ => String::new(),
        };
        println!(
            "  free           {} of {} ({pct}%){room}",
            crate::units::show_about(free),
            crate::units::show_about(cap)
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
        println!("  persistence    {}", persistence_line(dax));
    }
    Ok(())
}

/// How a writer makes a store of the pool durable, for `kv stat`.
fn persistence_line(dax: bool) -> String {
    if dax {
        let flush = bitmend_media::pmem::flush_instruction();
        format!("direct access (DAX, MAP_SYNC): a writer persists with {flush} and sfence")
    } else {
        "through the page cache: a writer persists with msync (not a DAX file)".to_string()
    }
}

/// [`Kv::check`] with every read checked, a damaged page rebuilt and the walk taken again.
fn check_healing<R: Region>(pool: &mut Pool<R>, kv: &Kv) -> Result<KvStats, HeapError> {
    // Each round rebuilds a page or fails.
    for _ in 0..64 {
        match kv.check(pool) {
            Err(HeapError::Damaged { at, len, .. }) => pool.verify(at, len)?,
            r => return r,
        }
    }
    kv.check(pool)
}
