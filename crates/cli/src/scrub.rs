//! `bitmend scrub IMAGE|MOUNTPOINT`: a scrub pass over an unmounted image, run here; or over a
//! mounted file system, run by its daemon, requested and watched through the control file.

use crate::error::CliError;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::json::{field, json_str, number, text_field};
use bitmend_flashfs::ScrubReport;
use clap::Args;

use crate::error::EXIT_PROBLEMS;
use crate::report::{
    health_json, quick_from_json, quick_json, quick_text, report_from_json, report_json, report_text, Quick,
};

#[derive(Args, Debug)]
pub struct ScrubArgs {
    /// A NAND image file or MTD device (not mounted), or the mountpoint of a mounted bitmend file system
    /// (its daemon runs the pass; see `bitmend mount --scrub-every`).
    pub target: PathBuf,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// The quick pass: every segment's parity checked against its data from the signatures
    /// in the spare areas alone, reading no data area (about 3% of the chip's bytes). It
    /// catches parity that disagrees with its data; a segment whose parity does is rewritten
    /// under fresh parity. Damage inside a page is the full pass's to find.
    #[arg(long)]
    pub quick: bool,
    /// For a mountpoint: give up waiting for the pass after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
}

pub fn scrub(a: &ScrubArgs) -> Result<u8, CliError> {
    if a.quick {
        return quick(a);
    }
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
fn image(a: &ScrubArgs, tty: bool) -> Result<(ScrubReport, String), CliError> {
    let (mut fs, mounted) = crate::fscmd::open_fs_offline(&a.target)?;
    let mut pass = fs.scrub_begin();
    while !fs.scrub_step(&mut pass)? {
        progress(tty, &pass.report());
    }
    progress(tty, &pass.report());
    if tty {
        eprintln!();
    }
    let health = health_json(&fs.health());
    fs.unmount()?;
    // Opening the image already checked the superblock copies and rewrote what it could.
    let mut r = pass.report();
    r.superblocks_damaged += mounted.superblocks_damaged;
    r.superblocks_rewritten += mounted.superblocks_rewritten;
    Ok((r, health))
}

/// `--quick`: run here on an image, or by the daemon of a mountpoint (the control file's
/// `quick` returns once the pass is done).
fn quick(a: &ScrubArgs) -> Result<u8, CliError> {
    let q = if a.target.is_dir() {
        let control = control_file(a)?;
        std::fs::write(&control, "quick\n")
            .map_err(|e| format!("{}: the quick pass failed: {e}", control.display()))?;
        let status = std::fs::read_to_string(&control).map_err(|e| format!("{}: {e}", control.display()))?;
        quick_from_json(&status, "quick_")?
    } else {
        let (mut fs, _) = crate::fscmd::open_fs_offline(&a.target)?;
        let r = fs.scrub_quick()?;
        fs.unmount()?;
        Quick::from(&r)
    };
    if a.json {
        let target = json_str(&a.target.display().to_string());
        println!("{{\"target\": {target}, \"quick\": true, {}}}", quick_json(&q, ""));
    } else {
        println!("{}: {}", a.target.display(), quick_text(&q));
    }
    Ok(if q.segments_mismatched == q.segments_healed { 0 } else { EXIT_PROBLEMS })
}

/// The control file of the mounted file system at `a.target`, or why it is not one.
fn control_file(a: &ScrubArgs) -> Result<PathBuf, CliError> {
    let control: PathBuf = crate::mounted::control_file(&a.target);
    std::fs::metadata(&control).map_err(|e| {
        format!("{}: not a mounted bitmend file system ({}: {e})", a.target.display(), control.display())
    })?;
    Ok(control)
}

/// A mounted file system: ask its daemon for a pass and follow it to the end.
fn mounted(a: &ScrubArgs, tty: bool) -> Result<(ScrubReport, String), CliError> {
    let control = control_file(a)?;
    let read = |p: &Path| std::fs::read_to_string(p);
    let before = read(&control).map_err(|e| format!("{}: {e}", control.display()))?;
    let pass = number(&before, "pass")?;
    let running = field(&before, "state") == Some("running");
    std::fs::write(&control, "start\n").map_err(|e| format!("{}: {e}", control.display()))?;
    // The pass that answers: the one running now if there was one, else the next.
    let want = if running { pass } else { pass + 1 };
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    loop {
        let status = read(&control).map_err(|e| format!("{}: {e}", control.display()))?;
        let report = report_from_json(&status)?;
        if number(&status, "pass")? >= want {
            progress(tty, &report);
            let idle = field(&status, "state") == Some("idle");
            if let Some(error) = text_field(&status, "error").filter(|_| idle) {
                if tty {
                    eprintln!();
                }
                return Err(format!("the scrub pass stopped: {error}").into());
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
            return Err(format!("the scrub pass did not finish within {} s", a.timeout).into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
