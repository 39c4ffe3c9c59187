//! `bitmend media`: create and describe raw NAND image files.

use crate::error::CliError;
use std::path::PathBuf;

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

#[derive(Args, Debug)]
pub struct GeometryArgs {
    /// Data capacity of the chip (spare areas not counted).
    #[arg(long, default_value = "128MiB", value_parser = parse_size)]
    pub size: u64,
    /// Data bytes per page.
    #[arg(long, default_value = "2KiB", value_parser = parse_size)]
    pub page: u64,
    /// Spare (out-of-band) bytes per page.
    #[arg(long, default_value = "64", value_parser = parse_size)]
    pub spare: u64,
    /// Data bytes per erase block.
    #[arg(long, default_value = "128KiB", value_parser = parse_size)]
    pub block: u64,
}

impl GeometryArgs {
    pub fn geometry(&self) -> Result<Geometry, CliError> {
        let usage = |why: String| CliError::Usage(why);
        let page = u32::try_from(self.page).map_err(|_| usage("--page is too large".into()))?;
        let spare = u32::try_from(self.spare).map_err(|_| usage("--spare is too large".into()))?;
        Geometry::with_size(page, spare, self.block, self.size).map_err(|e| usage(e.to_string()))
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
    /// The image file.
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

pub fn survey(n: &FileNand) -> Result<Survey, CliError> {
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
    let n = FileNand::open(path)?;
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
