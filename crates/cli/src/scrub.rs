//! `bitmend scrub IMAGE|MOUNTPOINT`: a scrub pass over an unmounted image, run here; or over a
//! mounted file system, run by its daemon, requested and watched through the control file.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::json::{field, json_str, number, text_field};
use bitmend_flashfs::{Fs, FsOptions, ScrubReport};
use clap::Args;

use crate::fscmd::{err, EXIT_PROBLEMS};
use crate::scrubber::{health_json, report_json, report_text, CONTROL_NAME};

#[derive(Args, Debug)]
pub struct ScrubArgs {
    /// A NAND image file (not mounted), or the mountpoint of a mounted bitmend file system
    /// (its daemon runs the pass; see `bitmend mount --scrub-every`).
    pub target: PathBuf,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// For a mountpoint: give up waiting for the pass after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
}

pub fn scrub(a: &ScrubArgs) -> Result<u8, String> {
    let tty = std::io::stderr().is_terminal() && !a.json;
    let (r, health) = if a.target.is_dir() { mounted(a, tty)? } else { image(a, tty)? };
    if a.json {
        let target = json_str(&a.target.display().to_string());
        println!("{{\"target\": {target}, {}, {health}}}", report_json(&r));
    } else {
        println!("{}: {}", a.target.display(), report_text(&r));
    }
    let sb_left = r.superblocks_damaged > r.superblocks_rewritten;
    Ok(if r.unreadable_pages == 0 && !sb_left { 0 } else { EXIT_PROBLEMS })
}

fn progress(tty: bool, r: &ScrubReport) {
    if tty {
        let pct = r.segments_done * 100 / r.segments_total.max(1);
        let bar = "#".repeat(pct as usize / 4);
        eprint!(
            "\rscrub: [{bar:<25}] {}/{} segments, {} pages",
            r.segments_done, r.segments_total, r.pages_checked
        );
        let _ = std::io::stderr().flush();
    }
}

/// An unmounted image: the pass runs here, and the image is written out after it.
fn image(a: &ScrubArgs, tty: bool) -> Result<(ScrubReport, String), String> {
    let nand = crate::fscmd::open_image(&a.target)?;
    let (mut fs, mounted) = Fs::open(nand, FsOptions::default()).map_err(err)?;
    let mut pass = fs.scrub_begin();
    while !fs.scrub_step(&mut pass).map_err(err)? {
        progress(tty, &pass.report());
    }
    progress(tty, &pass.report());
    if tty {
        eprintln!();
    }
    let health = health_json(&fs.health());
    fs.unmount().map_err(err)?;
    // Opening the image already checked the superblock copies and rewrote what it could.
    let mut r = pass.report();
    r.superblocks_damaged += mounted.superblocks_damaged;
    r.superblocks_rewritten += mounted.superblocks_rewritten;
    Ok((r, health))
}

/// A mounted file system: ask its daemon for a pass and follow it to the end.
fn mounted(a: &ScrubArgs, tty: bool) -> Result<(ScrubReport, String), String> {
    let control: PathBuf = a.target.join(std::str::from_utf8(CONTROL_NAME).expect("ASCII"));
    let read = |p: &Path| std::fs::read_to_string(p);
    let before = read(&control).map_err(|e| {
        format!("{}: not a mounted bitmend file system ({}: {e})", a.target.display(), control.display())
    })?;
    let pass = number(&before, "pass")?;
    let running = field(&before, "state") == Some("running");
    std::fs::write(&control, "start\n").map_err(|e| format!("{}: {e}", control.display()))?;
    // The pass that answers: the one running now if there was one, else the next.
    let want = if running { pass } else { pass + 1 };
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    loop {
        let status = read(&control).map_err(|e| format!("{}: {e}", control.display()))?;
        let report = ScrubReport {
            segments_total: number(&status, "segments_total")?,
            segments_done: number(&status, "segments_done")?,
            pages_checked: number(&status, "pages_checked")?,
            repaired_by_group: number(&status, "repaired_by_group")?,
            repaired_by_segment: number(&status, "repaired_by_segment")?,
            unreadable_pages: number(&status, "unreadable_pages")?,
            parity_damaged: number(&status, "parity_damaged")?,
            logical_pages_relocated: number(&status, "logical_pages_relocated")?,
            segments_healed: number(&status, "segments_healed")?,
            superblocks_damaged: number(&status, "superblocks_damaged")?,
            superblocks_rewritten: number(&status, "superblocks_rewritten")?,
            done: field(&status, "done") == Some("true"),
        };
        if number(&status, "pass")? >= want {
            progress(tty, &report);
            let idle = field(&status, "state") == Some("idle");
            if let Some(error) = text_field(&status, "error").filter(|_| idle) {
                if tty {
                    eprintln!();
                }
                return Err(format!("the scrub pass stopped: {error}"));
            }
            if report.done && idle {
                if tty {
                    eprintln!();
                }
                let at = status.find("\"lifetime_").unwrap_or(status.len());
                let health = status[at..].trim_end().trim_end_matches('}').to_string();
                return Ok((report, health));
            }
        }
        if Instant::now() > deadline {
            return Err(format!("the scrub pass did not finish within {} s", a.timeout));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
