//! `bitmend inject`: damage an unmounted NAND image, or a heap pool file, the way hardware
//! does, and say exactly how.

use crate::error::CliError;

pub use crate::inject_args::InjectArgs;
use crate::inject_args::{AreaArg, Fault};
use crate::json::json_str;
use bitmend_media::nand::{Area, FaultyNand, FileNand, Nand, NandFault, RawAccess};
use bitmend_media::rng::Rng;

/// Pages programmed since their block's last erase, in good blocks.
fn programmed_pages(n: &FileNand) -> Result<Vec<u32>, CliError> {
    let g = n.geometry();
    let mut v = Vec::new();
    for b in 0..g.blocks {
        let st = n.block_state(b)?;
        if !st.bad {
            v.extend((0..st.next_index).map(|i| g.first_page(b) + i));
        }
    }
    Ok(v)
}

fn targets(n: &FileNand, page: Option<u32>, pages: u32, rng: &mut Rng) -> Result<Vec<u32>, CliError> {
    if let Some(p) = page {
        n.geometry().check_page(p)?;
        return Ok(vec![p]);
    }
    let candidates = programmed_pages(n)?;
    if candidates.is_empty() {
        return Err(CliError::Target(
            "the image has no programmed page to damage; name one with --page".into(),
        ));
    }
    let k = (pages as usize).min(candidates.len());
    Ok(rng.distinct(k, candidates.len() as u64).into_iter().map(|i| candidates[i as usize]).collect())
}

/// Why `inject` refuses an MTD device.
fn not_a_device(device: &std::path::Path) -> CliError {
    CliError::Target(format!(
        "{}: an MTD device; inject writes beneath a chip's rules, which only an image file allows \
         (on a simulated chip, use nandsim's own faults: bitflips=, gravepages=, weakpages=, \
         badblocks=, or nandflipbits)",
        device.display()
    ))
}

/// A seed that differs from run to run, when none is given.
fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
}

pub fn run(args: InjectArgs) -> Result<(), CliError> {
    let seed = args.seed.unwrap_or_else(fresh_seed);
    let chip = match crate::fscmd::open_image(&args.image) {
        Ok(crate::flash::Flash::Image(chip)) => chip,
        Ok(crate::flash::Flash::Mtd(_)) => return Err(not_a_device(&args.image)),
        Err(nand) => return crate::inject_pool::run(&args, seed).map_err(|pool| pool.or_not_nand(nand)),
    };
    let mut pick = Rng::new(seed ^ 0x5EED_0F7A_26E7);
    let plan = match &args.fault {
        Fault::Flip { page, pages, .. } | Fault::Lose { page, pages } => {
            targets(&chip, *page, *pages, &mut pick)?
        }
        Fault::Bad { block } => {
            chip.geometry().check_block(*block)?;
            vec![]
        }
        Fault::Misdirect { .. } => vec![],
    };
    let mut n = FaultyNand::new(chip, seed);
    match args.fault {
        Fault::Flip { bits, area, .. } => {
            let area = match area {
                AreaArg::Data => Area::Data,
                AreaArg::Spare => Area::Spare,
                AreaArg::Both => Area::Both,
            };
            for p in plan {
                n.flip_bits_in(p, bits, area)?;
            }
        }
        Fault::Lose { .. } => {
            for p in plan {
                n.lose_page(p)?;
            }
        }
        Fault::Bad { block } => n.mark_bad(block)?,
        Fault::Misdirect { from, to } => n.misdirect(from, to)?,
    }
    n.sync()?;
    let g = n.geometry();
    let image = args.image.display().to_string();
    if let Fault::Bad { block } = args.fault {
        if args.json {
            println!("{{\"image\": {}, \"fault\": \"bad-block\", \"block\": {block}}}", json_str(&image));
        } else {
            println!("{image}: marked erase block {block} bad");
        }
    }
    for f in n.faults() {
        match f {
            NandFault::BitFlips { page, bits } => {
                if args.json {
                    let list: Vec<String> = bits.iter().map(|b| b.to_string()).collect();
                    println!(
                        "{{\"image\": {}, \"fault\": \"bit-flips\", \"page\": {page}, \"block\": {}, \"seed\": {seed}, \"bits\": [{}]}}",
                        json_str(&image),
                        g.block_of(*page),
                        list.join(", ")
                    );
                } else {
                    let shown: Vec<String> = bits.iter().take(8).map(|b| b.to_string()).collect();
                    let more =
                        if bits.len() > 8 { format!(", and {} more", bits.len() - 8) } else { String::new() };
                    println!(
                        "{image}: flipped {} bit(s) in page {page} (block {}): bits {}{more}",
                        bits.len(),
                        g.block_of(*page),
                        shown.join(", ")
                    );
                }
            }
            NandFault::LostPage { page } => {
                if args.json {
                    println!(
                        "{{\"image\": {}, \"fault\": \"lost-page\", \"page\": {page}, \"block\": {}, \"seed\": {seed}}}",
                        json_str(&image),
                        g.block_of(*page)
                    );
                } else {
                    println!("{image}: page {page} (block {}) replaced with garbage", g.block_of(*page));
                }
            }
            NandFault::Misdirected { from, to } => {
                if args.json {
                    println!(
                        "{{\"image\": {}, \"fault\": \"misdirected\", \"from\": {from}, \"to\": {to}}}",
                        json_str(&image)
                    );
                } else {
                    println!("{image}: page {from} copied over page {to} (block {})", g.block_of(*to));
                }
            }
            _ => {}
        }
    }
    if !args.json {
        println!("seed {seed} (pass --seed {seed} to repeat this on a copy of the original image)");
    }
    Ok(())
}
