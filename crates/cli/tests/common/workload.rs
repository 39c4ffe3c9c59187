//! A random workload on a mounted tree, with its model: what the tree must hold after
//! each operation that returned.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};

pub type Model = BTreeMap<String, Vec<u8>>;

/// A tiny generator (the test must not depend on the library's).
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One operation on the mounted tree: the model if it completes.
pub fn step(mnt: &str, model: &Model, rng: &mut Rng) -> (std::io::Result<()>, Model, bool) {
    let mut after = model.clone();
    let name = format!("f{}", rng.below(8));
    let path = format!("{mnt}/{name}");
    let roll = rng.below(20);
    let mut write = false;
    let r = if !model.contains_key(&name) {
        after.insert(name.clone(), Vec::new());
        std::fs::File::create(&path).map(|_| ())
    } else {
        match roll {
            0 => {
                after.remove(&name);
                std::fs::remove_file(&path)
            }
            1..=2 => {
                let size = rng.below(200_000) as usize;
                after.get_mut(&name).unwrap().resize(size, 0);
                std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(size as u64))
            }
            3 => {
                let to = format!("f{}", rng.below(8));
                let data = after.remove(&name).unwrap();
                after.insert(to.clone(), data);
                std::fs::rename(&path, format!("{mnt}/{to}"))
            }
            _ => {
                write = true;
                let off = rng.below(160_000) as usize;
                let len = 1 + rng.below(if roll < 12 { 3000 } else { 40_000 }) as usize;
                let seed = rng.next();
                let data: Vec<u8> =
                    (0..len).map(|i| (seed.wrapping_mul(i as u64 / 5 + 1) >> 17) as u8).collect();
                let file = after.get_mut(&name).unwrap();
                if file.len() < off + len {
                    file.resize(off + len, 0);
                }
                file[off..off + len].copy_from_slice(&data);
                std::fs::OpenOptions::new().write(true).open(&path).and_then(|mut f| {
                    f.seek(SeekFrom::Start(off as u64))?;
                    f.write_all(&data)
                })
            }
        }
    };
    (r, after, write)
}

pub fn tree(mnt: &str) -> Model {
    let mut out = Model::new();
    for e in std::fs::read_dir(mnt).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let mut data = Vec::new();
        std::fs::File::open(e.path()).unwrap().read_to_end(&mut data).unwrap();
        out.insert(name, data);
    }
    out
}
