//! littlefs on bitmend's strict NAND chip: the anchor must obey the same media rules as
//! bitmend (whole pages, programmed once per erase and in order) and keep every byte, or the
//! benchmark comparing them would be meaningless.

use bitmend_anchors::littlefs::{path, Allocation, Filesystem, NandStorage, SeekFrom, GEOMETRY};
use bitmend_media::nand::{Geometry, Nand, RamNand};
use bitmend_media::rng::Rng;

type Storage = NandStorage<RamNand>;

fn contents(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

#[test]
fn littlefs_keeps_every_byte_on_the_strict_chip_across_remounts() {
    let (mut storage, chip) = Storage::new(RamNand::new(GEOMETRY).unwrap()).unwrap();
    Filesystem::format(&mut storage).expect("format");
    // 200 files of 0..40 KiB, a third of them overwritten in the middle, a fifth removed.
    let sizes: Vec<usize> = (0..200).map(|i| (i * 7919) % 40_000).collect();
    {
        let mut alloc: Allocation<Storage> = Filesystem::allocate();
        let fs = Filesystem::mount(&mut alloc, &mut storage).expect("mount");
        for (i, &len) in sizes.iter().enumerate() {
            fs.write(&path(&format!("f{i}")), &contents(i as u64, len)).expect("write");
        }
        for i in (0..200).step_by(3).filter(|&i| sizes[i] > 4096) {
            fs.open_file_with_options_and_then(
                |o| o.read(true).write(true),
                &path(&format!("f{i}")),
                |f| {
                    f.seek(SeekFrom::Start(1000))?;
                    f.write(&contents(1000 + i as u64, 3000))
                },
            )
            .expect("overwrite");
        }
        for i in (0..200).step_by(5) {
            fs.remove(&path(&format!("f{i}"))).expect("remove");
        }
    }
    let programs = chip.borrow().counters().programs;
    assert!(programs > 2000, "littlefs programmed only {programs} pages");

    let mut alloc: Allocation<Storage> = Filesystem::allocate();
    let fs = Filesystem::mount(&mut alloc, &mut storage).expect("remount");
    let mut checked = 0;
    for (i, &len) in sizes.iter().enumerate() {
        let name = path(&format!("f{i}"));
        if i % 5 == 0 {
            assert!(!fs.exists(&name), "f{i} was removed");
            continue;
        }
        let mut want = contents(i as u64, len);
        if i % 3 == 0 && len > 4096 {
            want[1000..4000].copy_from_slice(&contents(1000 + i as u64, 3000));
        }
        let mut got = vec![0u8; len + 1];
        let n = fs.open_file_and_then(&name, |f| f.read(&mut got)).expect("read");
        assert_eq!(n, len, "f{i} length");
        assert!(got[..len] == want[..], "f{i} contents differ");
        checked += len;
    }
    assert!(checked > 2_000_000, "only {checked} bytes checked");
    assert!(storage.last_error.is_none(), "chip error: {:?}", storage.last_error);
}

#[test]
fn littlefs_storage_refuses_another_geometry() {
    let small = Geometry::new(2048, 64, 64, 64).unwrap();
    let e = Storage::new(RamNand::new(small).unwrap()).err().expect("refused");
    assert!(e.contains("built for"), "{e}");
}
