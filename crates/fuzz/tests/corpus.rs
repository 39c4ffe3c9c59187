//! The fuzz targets on stable: every input of the checked-in corpus (`fuzz/corpus/<target>/`,
//! seeds and what fuzzing kept), then a sweep of random patches; each target must return.
//! `FUZZ_SWEEP` (default 60) sets the random inputs per target.

use bitmend_media::rng::Rng;

/// A target: whether the damaged image opened.
type Target = fn(&[u8]) -> bool;

const TARGETS: [(&str, Target); 5] = [
    ("tier_image", bitmend_fuzz::tier::tier_image),
    ("decoders", bitmend_fuzz::decoders::decoders),
    ("flash_image", bitmend_fuzz::flash::flash_image),
    ("pool_image", bitmend_fuzz::heap::pool_image),
    ("log_image", bitmend_fuzz::nvlog::log_image),
];

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    inputs.sort();
    inputs
}

#[test]
fn every_corpus_input_returns() {
    for (target, run) in TARGETS {
        let inputs = corpus(target);
        assert!(!inputs.is_empty(), "{target}: no corpus");
        let mut opened = 0;
        for (name, data) in &inputs {
            let ok = run(data);
            if name.ends_with("none") {
                assert!(ok, "{target}: the image with no damage does not open");
            }
            opened += usize::from(ok);
        }
        eprintln!("{target}: {} corpus inputs returned, {opened} opened", inputs.len());
    }
}

/// Random patches: 1 to 8 of up to 64 bytes each, anywhere, random or zero or erased.
#[test]
fn random_patches_return() {
    let n: u64 = std::env::var("FUZZ_SWEEP").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    for (target, run) in TARGETS {
        let mut rng = Rng::new(0xF022 ^ target.len() as u64);
        let mut opened = 0;
        for _ in 0..n {
            let mut data = vec![rng.below(256) as u8];
            for _ in 0..1 + rng.below(8) {
                let len = 1 + rng.below(64) as usize;
                data.extend_from_slice(&(rng.next_u64() as u32).to_le_bytes());
                data.push(len as u8);
                let fill = match rng.below(3) {
                    0 => 0x00,
                    1 => 0xFF,
                    _ => 0x5A,
                };
                let mut bytes = vec![fill; len];
                if fill == 0x5A {
                    rng.fill(&mut bytes);
                }
                data.extend_from_slice(&bytes);
            }
            opened += u64::from(run(&data));
        }
        eprintln!("{target}: {n} random patch sets returned, {opened} opened");
        // Damage within the redundancy opens: most of these must reach past the open.
        assert!(opened * 2 >= n, "{target}: {opened} of {n} opened");
    }
}
