//! The background cleaner through the mount: overwrites of a file half the size of a small
//! image make the write-back thread clean in steps (the control file's JSON counts them and
//! their holds), every byte reads back, before and after a remount, and fsck is clean.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use common::{bitmend, fsck_clean, fuse_available, mount, noise, scratch, umount};

const MIB: usize = 1 << 20;

/// The number after `"key": ` in the control file's JSON.
fn number(json: &str, key: &str) -> u64 {
    let at = json.find(&format!("\"{key}\": ")).unwrap_or_else(|| panic!("{key} in {json}")) + key.len() + 4;
    let rest = &json[at..];
    rest[..rest.find([',', '}']).unwrap()].trim().parse().unwrap()
}

#[test]
fn overwrites_are_cleaned_in_steps_and_read_back() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("cleaning-mount");
    let made = bitmend(&["mkfs", &img, "--size", "32MiB"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    mount(&img, &mnt, &[]);
    let path = format!("{mnt}/f");
    let f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
    // 12 MiB, then 48 MiB of 1 MiB overwrites at pseudo-random places: the image's free
    // space written over about three times.
    let size = 12 * MIB;
    let mut model = noise(1, size);
    f.write_all_at(&model, 0).unwrap();
    let mut x = 7u64;
    for i in 0..48u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let at = (x >> 33) as usize % (size / MIB) * MIB;
        let data = noise(100 + i, MIB);
        f.write_all_at(&data, at as u64).unwrap();
        model[at..at + MIB].copy_from_slice(&data);
        if i % 8 == 7 {
            f.sync_all().unwrap();
        }
    }
    let mut back = vec![0u8; size];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == model, "the file reads back as written");
    let status = std::fs::read_to_string(format!("{mnt}/.bitmend-scrub")).unwrap();
    let (cleaned, in_steps) =
        (number(&status, "segments_cleaned"), number(&status, "segments_cleaned_in_steps"));
    eprintln!(
        "segments cleaned {cleaned}, in steps {in_steps}, backstop runs {}, clean steps {} (hold p99 {} us, max {} us), write-back steps {} (p99 {} us, max {} us)",
        number(&status, "cleaner_runs"),
        number(&status, "clean_steps"),
        number(&status, "clean_hold_p99_us"),
        number(&status, "clean_hold_max_us"),
        number(&status, "write_back_steps"),
        number(&status, "write_back_hold_p99_us"),
        number(&status, "write_back_hold_max_us"),
    );
    assert!(in_steps > 0 && number(&status, "clean_steps") > 0, "{status}");
    assert!(number(&status, "write_back_steps") > 0, "{status}");
    // Most of the cleaning in the thread's steps, not in the backstop's long holds.
    assert!(2 * in_steps >= cleaned, "{status}");
    drop(f);
    umount(&mnt);
    fsck_clean(&img, "after the overwrites");
    mount(&img, &mnt, &[]);
    let again = std::fs::read(&path).unwrap();
    assert!(again == model, "the file reads back after a remount");
    umount(&mnt);
    fsck_clean(&img, "after the remount");
    let _ = std::fs::remove_dir_all(dir);
}
