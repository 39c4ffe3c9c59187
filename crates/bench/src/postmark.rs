//! A PostMark-style workload (Katcher, 1997) as a list of operations, so that bitmend and its
//! anchor replay exactly the same sequence: a pool of small files, then transactions that each
//! create or delete a file and then read or append to a random live one, then every file
//! deleted.

use bitmend_media::rng::Rng;

/// One file operation; files are named by number.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// Create file `id` with the first `len` bytes of the body.
    Create(u64, usize),
    Delete(u64),
    /// Read the whole file.
    Read(u64),
    /// Append the first `len` bytes of the body.
    Append(u64, usize),
}

/// The largest file created, and so the body length the replayers need.
pub const MAX_FILE: usize = 10_000;

/// The three phases: the pool, the transactions (two operations each), the final deletions.
pub struct Workload {
    pub pool: Vec<Op>,
    pub txns: Vec<Op>,
    pub finish: Vec<Op>,
    pub transactions: usize,
}

/// The files a workload has made and not deleted, and the number the next one gets.
#[derive(Default)]
pub struct Live {
    pub ids: Vec<u64>,
    next: u64,
}

impl Live {
    /// A new file of `len` bytes.
    pub fn create(&mut self, len: usize) -> Op {
        self.ids.push(self.next);
        self.next += 1;
        Op::Create(self.next - 1, len)
    }

    /// Deletes a live file chosen by `rng`.
    pub fn delete(&mut self, rng: &mut Rng) -> Op {
        Op::Delete(self.ids.swap_remove(rng.below(self.ids.len() as u64) as usize))
    }

    /// A live file chosen by `rng`.
    pub fn pick(&self, rng: &mut Rng) -> u64 {
        self.ids[rng.below(self.ids.len() as u64) as usize]
    }
}

pub fn workload(files: usize, transactions: usize, seed: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let mut live = Live::default();
    let size = |rng: &mut Rng| 500 + rng.below((MAX_FILE - 500) as u64) as usize;
    let pool = (0..files).map(|_| live.create(size(&mut rng))).collect();
    let mut txns = Vec::with_capacity(2 * transactions);
    for _ in 0..transactions {
        if rng.below(2) == 0 || live.ids.is_empty() {
            let len = size(&mut rng);
            txns.push(live.create(len));
        } else {
            txns.push(live.delete(&mut rng));
        }
        if !live.ids.is_empty() {
            let id = live.pick(&mut rng);
            txns.push(if rng.below(2) == 0 {
                Op::Read(id)
            } else {
                Op::Append(id, 100 + rng.below(1000) as usize)
            });
        }
    }
    let finish = live.ids.into_iter().map(Op::Delete).collect();
    Workload { pool, txns, finish, transactions }
}

/// File `id`'s name, in the root of whichever file system replays the workload.
pub fn name(id: u64) -> String {
    format!("pm{id}")
}

/// The files a replay on the flash file system made, by number.
pub type Inos = std::collections::HashMap<u64, bitmend_flashfs::Ino>;

/// Replays `op` on the flash file system (files in its root, named `pm` and their number),
/// each file's bytes the first bytes of `body`.
pub fn apply<N: bitmend_media::nand::Nand>(
    fs: &mut bitmend_flashfs::Fs<N>,
    inos: &mut Inos,
    op: &Op,
    body: &[u8],
) {
    use bitmend_flashfs::ROOT;
    match *op {
        Op::Create(id, len) => {
            let ino = fs.create(ROOT, name(id).as_bytes(), 0o644, 0, 0).expect("create").ino;
            fs.write(ino, 0, &body[..len]).expect("write");
            inos.insert(id, ino);
        }
        Op::Delete(id) => {
            fs.unlink(ROOT, name(id).as_bytes()).expect("unlink");
            inos.remove(&id);
        }
        Op::Read(id) => {
            fs.read(inos[&id], 0, body.len()).expect("read");
        }
        Op::Append(id, len) => {
            let size = fs.getattr(inos[&id]).expect("stat").size;
            fs.write(inos[&id], size, &body[..len]).expect("append");
        }
    }
}
