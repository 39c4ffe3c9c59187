//! The littlefs side of `bench flashfs`: the same workloads, on the same simulated chip with
//! the same timing model, through the `littlefs2` crate. littlefs commits on every file close
//! (its natural sync point), so each operation below is durable when it returns; bitmend's
//! rows say whether they buffered or synced.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use bitmend_anchors::littlefs::{path, Allocation, Filesystem, LfsResult, NandStorage, SeekFrom, GEOMETRY};
use bitmend_media::nand::{Counters, Nand, RamNand};

use crate::postmark::Op;

type Storage = NandStorage<RamNand>;
type Lfs<'a> = Filesystem<'a, Storage>;

/// What one phase of a workload cost littlefs: chip counters (device time) and CPU.
#[derive(Clone, Copy)]
pub struct Cost {
    pub chip: Counters,
    pub cpu_ns: u64,
}

/// A point in a session, to measure a phase from.
struct Stamp {
    chip: Counters,
    at: Instant,
}

/// Formats a fresh chip, mounts littlefs and runs `work`, which measures its own phases with
/// the stamp function it is given.
fn session<R>(work: impl FnOnce(&Lfs, &dyn Fn() -> Stamp) -> R) -> R {
    let (mut storage, chip): (Storage, Rc<RefCell<RamNand>>) =
        NandStorage::new(RamNand::new(GEOMETRY).expect("geometry")).expect("littlefs storage");
    Filesystem::format(&mut storage).expect("littlefs format");
    let mut alloc: Allocation<Storage> = Filesystem::allocate();
    let fs = Filesystem::mount(&mut alloc, &mut storage).expect("littlefs mount");
    let stamp = || Stamp { chip: chip.borrow().counters(), at: Instant::now() };
    work(&fs, &stamp)
}

fn since(start: Stamp, end: Stamp) -> Cost {
    Cost { chip: end.chip - start.chip, cpu_ns: (end.at - start.at).as_nanos() as u64 }
}

/// `n` files of `body`, each created, written and closed.
pub fn small_files(n: usize, body: &[u8]) -> Cost {
    session(|fs, stamp| {
        let start = stamp();
        for i in 0..n {
            fs.write(&path(&format!("copy{i}")), body).expect("littlefs write");
        }
        since(start, stamp())
    })
}

/// What [`one_file`] measured.
pub struct FileCosts {
    pub write: Cost,
    pub read: Cost,
    pub overwrite: Cost,
    pub random_read: Cost,
}

/// One file written in `pieces` and closed; read back whole; then each of `overwrites`
/// (offset, bytes) written with the file closed (synced) after each; then a 4 KiB read at
/// each of `reads`. Every byte read is checked.
pub fn one_file(pieces: &[Vec<u8>], overwrites: &[(u64, Vec<u8>)], reads: &[u64]) -> FileCosts {
    let name = path("big");
    let mut want: Vec<u8> = pieces.concat();
    session(|fs, stamp| {
        let start = stamp();
        fs.create_file_and_then(&name, |f| {
            for p in pieces {
                f.write(p)?;
            }
            Ok(())
        })
        .expect("littlefs sequential write");
        let write = since(start, stamp());

        let start = stamp();
        let mut buf = vec![0u8; 1 << 20];
        fs.open_file_and_then(&name, |f| {
            for p in pieces {
                let n = f.read(&mut buf[..p.len()])?;
                assert!(n == p.len() && buf[..n] == p[..], "littlefs sequential read differs");
            }
            Ok(())
        })
        .expect("littlefs sequential read");
        let read = since(start, stamp());

        let start = stamp();
        for (at, page) in overwrites {
            let at = *at;
            fs.open_file_with_options_and_then(
                |o| o.read(true).write(true),
                &name,
                |f| {
                    f.seek(SeekFrom::Start(at as u32))?;
                    f.write(page)
                },
            )
            .expect("littlefs overwrite");
            want[at as usize..at as usize + page.len()].copy_from_slice(page);
        }
        let overwrite = since(start, stamp());

        let start = stamp();
        for &at in reads {
            fs.open_file_and_then(&name, |f| {
                f.seek(SeekFrom::Start(at as u32))?;
                let n = f.read(&mut buf[..4096])?;
                assert!(buf[..n] == want[at as usize..at as usize + 4096], "littlefs random read differs");
                Ok(())
            })
            .expect("littlefs random read");
        }
        let random_read = since(start, stamp());
        FileCosts { write, read, overwrite, random_read }
    })
}

/// Runs `pool` (not measured), then `txns` (measured) of a PostMark-style workload. An
/// error names the operation littlefs refused (it runs out of space first: every file of
/// more than an inline few hundred bytes takes a whole 128 KiB block).
pub fn postmark(pool: &[Op], txns: &[Op], body: &[u8]) -> Result<Cost, String> {
    session(|fs, stamp| {
        let run = |op: &Op| -> LfsResult<()> {
            match *op {
                Op::Create(id, len) => fs.write(&path(&crate::postmark::name(id)), &body[..len]),
                Op::Delete(id) => fs.remove(&path(&crate::postmark::name(id))),
                Op::Read(id) => {
                    let mut buf = vec![0u8; body.len()];
                    fs.open_file_and_then(&path(&crate::postmark::name(id)), |f| f.read(&mut buf)).map(drop)
                }
                Op::Append(id, len) => fs
                    .open_file_with_options_and_then(
                        |o| o.write(true).append(true),
                        &path(&crate::postmark::name(id)),
                        |f| f.write(&body[..len]),
                    )
                    .map(drop),
            }
        };
        let all = |ops: &[Op]| -> Result<(), String> {
            for (i, op) in ops.iter().enumerate() {
                run(op).map_err(|e| format!("littlefs: {op:?} (operation {i}) failed: {e:?}"))?;
            }
            Ok(())
        };
        all(pool)?;
        let start = stamp();
        all(txns)?;
        Ok(since(start, stamp()))
    })
}
