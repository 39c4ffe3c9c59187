//! `bitmend inject` on a heap pool file: bits flipped in its pages (a worn cell), pages
//! replaced with garbage (a wild memset), a page copied over another (a store that reached
//! the wrong address). The damage goes around the pool's protection, as the hardware's
//! would; `bitmend kv check` finds it and `bitmend kv scrub` rebuilds it.

use bitmend_heap::{Pool, PoolOptions};
use bitmend_media::pmem::{MmapRegion, Region};
use bitmend_media::rng::Rng;

use crate::error::CliError;
use crate::inject_args::{Fault, InjectArgs};
use crate::json::json_str;

/// Why a file took no damage: not a pool (then the NAND error says what it is not), or a
/// pool that refused.
pub(crate) enum PoolInjectError {
    NotAPool,
    Failed(CliError),
}

impl PoolInjectError {
    /// The error to show: the NAND one for a file that is neither.
    pub(crate) fn or_not_nand(self, nand: CliError) -> CliError {
        match self {
            PoolInjectError::NotAPool => nand,
            PoolInjectError::Failed(e) => e,
        }
    }
}

impl From<CliError> for PoolInjectError {
    fn from(e: CliError) -> Self {
        PoolInjectError::Failed(e)
    }
}

fn failed(file: &str, e: impl std::fmt::Display) -> CliError {
    CliError::Failed(format!("{file}: {e}"))
}

/// One fault, as it is reported.
struct Done {
    what: &'static str,
    page: u64,
    at: u64,
    detail: String,
}

pub(crate) fn run(args: &InjectArgs, seed: u64) -> Result<(), PoolInjectError> {
    let region = MmapRegion::open(&args.image).map_err(|_| PoolInjectError::NotAPool)?;
    let (pool, _) = Pool::open(region, PoolOptions::default()).map_err(|_| PoolInjectError::NotAPool)?;
    let file = args.image.display().to_string();
    let Some(geo) = pool.geometry() else {
        return Err(CliError::Usage(format!(
            "{file}: a pool made without --stripes keeps nothing to find damage with; make one with `bitmend kv create --stripes 8+2`"
        ))
        .into());
    };
    // Closed first: the damage is made to a closed pool, as a wild write between runs would
    // be, and the next open finds it rather than taking it in.
    // Pages that hold something (a zero page has nothing to lose), as NAND's programmed ones.
    let used_pages = |pool: &Pool<MmapRegion>| -> Vec<u64> {
        (0..geo.pages)
            .filter(|&p| {
                let at = geo.page_at(p) as usize;
                pool.region().bytes()[at..at + 4096].iter().any(|&b| b != 0)
            })
            .collect()
    };
    let used = used_pages(&pool);
    let mut region = pool.close();
    let mut rng = Rng::new(seed ^ 0x9E1D_0F7A_26E7);
    let pick = |rng: &mut Rng, page: Option<u32>, pages: u32| -> Result<Vec<u64>, CliError> {
        match page {
            Some(p) if (p as u64) < geo.pages => Ok(vec![p as u64]),
            Some(p) => {
                Err(CliError::Usage(format!("{file}: page {p} is past the pool's {} pages", geo.pages)))
            }
            None => Ok((0..pages).map(|_| used[rng.below(used.len() as u64) as usize]).collect()),
        }
    };
    let mut done = Vec::new();
    match &args.fault {
        Fault::Flip { page, pages, bits, .. } => {
            for p in pick(&mut rng, *page, *pages)? {
                let at = geo.page_at(p);
                let mut flipped = Vec::new();
                for _ in 0..*bits {
                    let bit = rng.below(4096 * 8);
                    let byte = region.bytes()[(at + bit / 8) as usize] ^ (1 << (bit % 8));
                    region.corrupt((at + bit / 8) as usize, &[byte]).map_err(|e| failed(&file, e))?;
                    flipped.push(bit);
                }
                let list: Vec<String> = flipped.iter().map(|b| b.to_string()).collect();
                done.push(Done { what: "bit-flips", page: p, at, detail: list.join(", ") });
            }
        }
        Fault::Lose { page, pages } => {
            for p in pick(&mut rng, *page, *pages)? {
                let at = geo.page_at(p);
                let mut garbage = vec![0u8; 4096];
                rng.fill(&mut garbage);
                region.corrupt(at as usize, &garbage).map_err(|e| failed(&file, e))?;
                done.push(Done { what: "lost-page", page: p, at, detail: String::new() });
            }
        }
        Fault::Misdirect { from, to } => {
            let [from, to] = [*from as u64, *to as u64];
            if from.max(to) >= geo.pages {
                return Err(CliError::Usage(format!("{file}: the pool has {} pages", geo.pages)).into());
            }
            let bytes = region.bytes()[geo.page_at(from) as usize..][..4096].to_vec();
            region.corrupt(geo.page_at(to) as usize, &bytes).map_err(|e| failed(&file, e))?;
            done.push(Done {
                what: "misdirected",
                page: to,
                at: geo.page_at(to),
                detail: format!("from page {from}"),
            });
        }
        Fault::Bad { .. } => {
            return Err(
                CliError::Usage(format!("{file}: a heap pool has no erase blocks to mark bad")).into()
            );
        }
    }
    let len = region.len();
    region.persist(0, len).map_err(|e| failed(&file, e))?;
    for d in &done {
        if args.json {
            println!(
                "{{\"pool\": {}, \"fault\": \"{}\", \"page\": {}, \"offset\": {}, \"seed\": {seed}, \"detail\": {}}}",
                json_str(&file),
                d.what,
                d.page,
                d.at,
                json_str(&d.detail)
            );
        } else {
            let what = match d.what {
                "bit-flips" => format!("flipped bits {} of", d.detail),
                "lost-page" => "replaced with garbage".to_string(),
                _ => format!("overwrote with a copy {} of", d.detail),
            };
            println!("{file}: {what} heap page {} (offset {:#x})", d.page, d.at);
        }
    }
    if !args.json {
        println!("seed {seed}; `bitmend kv check {file}` finds the damage, `bitmend kv scrub {file} --full` rebuilds it");
    }
    Ok(())
}
