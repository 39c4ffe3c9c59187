//! `bitmend media`: create and describe raw NAND image files.

use crate::error::CliError;
use std::path::PathBuf;

use crate::flash::Flash;
use crate::json::json_str;
use bitmend_media::nand::{FileNand, Geometry, Nand, RawAccess};
use clap::{Args, Subcommand};

use crate::units::{parse_size, show_size};

#[derive(Args, Debug)]
pub struct MediaArgs {
    #[command(subcommand)]
    command: MediaCommand,
}

#[derive(Subcommand, Debug)]
enum MediaCommand {
    /// Create a blank (fully erased) NAND image file.
    ///
    /// The image records its geometry in a header, so later commands open it without being
    /// told. The default geometry is RCFFS's chip: 128 MiB, 2 KiB pages with 64 spare bytes,
    /// 128 KiB erase blocks.
    Create(CreateArgs),
    /// Print an image's geometry, bad blocks, program state and erase-count histogram.
    Info(InfoArgs),
}

/// The shape of an image file's chip (a real chip has its own).
#[derive(Args, Debug, Default)]
pub struct GeometryArgs {
    /// Data capacity of the chip (spare areas not counted) [default: 128MiB].
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Data bytes per page [default: 2KiB].
    #[arg(long, value_parser = parse_size)]
    pub page: Option<u64>,
    /// Spare (out-of-band) bytes per page [default: 64].
    #[arg(long, value_parser = parse_size)]
    pub spare: Option<u64>,
    /// Data bytes per erase block [default: 128KiB].
    #[arg(long, value_parser = parse_size)]
    pub block: Option<u64>,
}

impl GeometryArgs {
    pub fn geometry(&self) -> Result<Geometry, CliError> {
        let usage = |why: String| CliError::Usage(why);
        let d = Geometry::RCFFS;
        let page = u32::try_from(self.page.unwrap_or(d.page_size as u64))
            .map_err(|_| usage("--page is too large".into()))?;
        let spare = u32::try_from(self.spare.unwrap_or(d.spare_size as u64))
            .map_err(|_| usage("--spare is too large".into()))?;
        let block = self.block.unwrap_or(d.block_size());
        let size = self.size.unwrap_or(d.total_size());
        Geometry::with_size(page, spare, block, size).map_err(|e| usage(e.to_string()))
    }

    /// Whether any geometry option was given.
    pub fn given(&self) -> bool {
        self.size.is_some() || self.page.is_some() || self.spare.is_some() || self.block.is_some()
    }
}

#[derive(Args, Debug)]
struct CreateArgs {
    /// The image file to create (it must not exist).
    image: PathBuf,
    #[command(flatten)]
    geometry: GeometryArgs,
}

#[derive(Args, Debug)]
struct InfoArgs {
    /// The image file, or an MTD device (/dev/mtdN).
    image: PathBuf,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: MediaArgs) -> Result<(), CliError> {
    match args.command {
        MediaCommand::Create(a) => {
            let g = a.geometry.geometry()?;
            FileNand::create(&a.image, g)?;
            println!("created {}: {g}", a.image.display());
            Ok(())
        }
        MediaCommand::Info(a) => info(&a.image, a.json),
    }
}

/// What `media info` reports.
pub struct Survey {
    pub geometry: Geometry,
    pub bad: Vec<u32>,
    pub erase_counts: Vec<u32>,
    /// Pages at or below each block's program position (programmed or skipped).
    pub used_pages: u64,
    /// Blocks with no page programmed since their last erase.
    pub empty_blocks: u32,
}

pub fn survey(flash: &Flash) -> Result<Survey, CliError> {
    let Some(n) = flash.image() else { return survey_device(flash) };
    let g = n.geometry();
    let mut s = Survey { geometry: g, bad: vec![], erase_counts: vec![], used_pages: 0, empty_blocks: 0 };
    for b in 0..g.blocks {
        let st = n.block_state(b)?;
        if st.bad {
            s.bad.push(b);
        }
        s.erase_counts.push(st.erase_count);
        s.used_pages += st.next_index as u64;
        s.empty_blocks += (st.next_index == 0 && !st.bad) as u32;
    }
    Ok(s)
}

/// What a real chip can say without reading every page: its bad blocks. Erase counts are
/// this open's (a chip keeps none), and which pages are programmed is not surveyed.
fn survey_device(n: &Flash) -> Result<Survey, CliError> {
    let g = n.geometry();
    let mut s = Survey { geometry: g, bad: vec![], erase_counts: vec![], used_pages: 0, empty_blocks: 0 };
    for b in 0..g.blocks {
        if n.is_bad(b)? {
            s.bad.push(b);
        }
        s.erase_counts.push(n.erase_count(b)?);
    }
    Ok(s)
}

/// Whether any of the first `blocks` good blocks of `n` has a page that does not read erased
/// in its first two pages (where a file system keeps its superblock, and most keep a header).
pub fn holds_data(n: &mut impl Nand, blocks: u32) -> Result<bool, CliError> {
    let g = n.geometry();
    let (mut data, mut spare) = (vec![0u8; g.page_size as usize], vec![0u8; g.spare_size as usize]);
    let good: Vec<u32> =
        (0..g.blocks).filter(|&b| !n.is_bad(b).unwrap_or(true)).take(blocks as usize).collect();
    for b in good {
        for p in g.first_page(b)..g.first_page(b) + 2.min(g.pages_per_block) {
            n.read_page(p, &mut data, &mut spare)?;
            if data.iter().chain(&spare).any(|&x| x != 0xFF) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Erases every good block of `n`, a line of progress on a terminal; a block whose erase
/// fails is marked bad by the chip and passed over.
pub fn erase_all(n: &mut impl Nand, what: &str) -> Result<(), CliError> {
    use std::io::{IsTerminal, Write};
    let g = n.geometry();
    let tty = std::io::stderr().is_terminal();
    let mut failed = 0;
    for b in 0..g.blocks {
        if n.is_bad(b)? {
            continue;
        }
        match n.erase(b) {
            Ok(()) => {}
            Err(bitmend_media::nand::NandError::EraseFailed { .. }) => failed += 1,
            Err(e) => return Err(e.into()),
        }
        if tty && (b % 64 == 63 || b + 1 == g.blocks) {
            let pct = (b + 1) * 100 / g.blocks;
            eprint!("\r{what}: [{:<25}] {}/{} blocks", "#".repeat(pct as usize / 4), b + 1, g.blocks);
            let _ = std::io::stderr().flush();
        }
    }
    if tty {
        eprintln!();
    }
    if failed > 0 {
        eprintln!("bitmend: {what}: {failed} block(s) failed to erase and are now marked bad");
    }
    Ok(())
}

/// Buckets of erase counts: (from, to inclusive, blocks).
pub fn histogram(counts: &[u32], buckets: u32) -> Vec<(u32, u32, usize)> {
    let (Some(&min), Some(&max)) = (counts.iter().min(), counts.iter().max()) else { return vec![] };
    let width = (max - min) / buckets + 1;
    let mut out: Vec<(u32, u32, usize)> = (0..buckets)
        .map(|i| (min + i * width, min + (i + 1) * width - 1, 0))
        .take_while(|b| b.0 <= max)
        .collect();
    for &c in counts {
        out[((c - min) / width) as usize].2 += 1;
    }
    out
}

fn info(path: &std::path::Path, json: bool) -> Result<(), CliError> {
    let n = crate::flash::open(path)?;
    let s = survey(&n)?;
    let g = s.geometry;
    let hist = histogram(&s.erase_counts, 8);
    let total: u64 = s.erase_counts.iter().map(|&c| c as u64).sum();
    let mean = total as f64 / g.blocks as f64;
    if json {
        let bad: Vec<String> = s.bad.iter().map(|b| b.to_string()).collect();
        let h: Vec<String> =
            hist.iter().map(|(a, b, n)| format!("{{\"from\": {a}, \"to\": {b}, \"blocks\": {n}}}")).collect();
        println!(
            "{{\"image\": {}, \"version\": {}, \"page_size\": {}, \"spare_size\": {}, \"pages_per_block\": {}, \
             \"blocks\": {}, \"size\": {}, \"bad_blocks\": [{}], \"used_pages\": {}, \"empty_blocks\": {}, \
             \"erases_total\": {}, \"erases_mean\": {:.3}, \"erase_histogram\": [{}]}}",
            json_str(&path.display().to_string()),
            bitmend_media::nand::IMAGE_VERSION,
            g.page_size,
            g.spare_size,
            g.pages_per_block,
            g.blocks,
            g.total_size(),
            bad.join(", "),
            s.used_pages,
            s.empty_blocks,
            total,
            mean,
            h.join(", ")
        );
        return Ok(());
    }
    println!("{}: NAND image, format version {}", path.display(), bitmend_media::nand::IMAGE_VERSION);
    println!("  geometry      {g}");
    println!(
        "  pages         {} used of {} ({} blocks untouched since erase)",
        s.used_pages,
        g.pages(),
        s.empty_blocks
    );
    let bad = if s.bad.is_empty() {
        "none".to_string()
    } else {
        let list: Vec<String> = s.bad.iter().take(20).map(|b| b.to_string()).collect();
        format!("{} ({}{})", s.bad.len(), list.join(", "), if s.bad.len() > 20 { ", ..." } else { "" })
    };
    println!("  bad blocks    {bad}");
    println!("  erases        {total} in all, {mean:.2} per block, capacity {}", show_size(g.total_size()));
    println!("  erase counts  (blocks per range)");
    let widest = hist.iter().map(|h| h.2).max().unwrap_or(1).max(1);
    for (a, b, count) in hist {
        let bar = "#".repeat((count * 40).div_ceil(widest));
        let range = if a == b { format!("{a}") } else { format!("{a}-{b}") };
        println!("    {range:>12} {count:>7} {bar}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::histogram;

    #[test]
    fn histogram_buckets_cover_every_count() {
        let h = histogram(&[0, 0, 1, 5, 9, 10], 4);
        assert_eq!(h, vec![(0, 2, 3), (3, 5, 1), (6, 8, 0), (9, 11, 2)]);
        assert_eq!(histogram(&[3, 3], 8), vec![(3, 3, 2)]);
        assert!(histogram(&[], 8).is_empty());
    }
}
