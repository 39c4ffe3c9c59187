//! An image outlives its first erase blocks, as a user destroys them: zero bytes over the
//! image file (every page reads erased, while the chip's table still counts it programmed).
//! Block 0 alone, blocks 0 and 1, and those with the far copies at the chip's end: each
//! mounts (with the NVRAM tier and without), every byte reads back, fsck says which copy it
//! used; with no copy anywhere, the error names the image.

mod common;

use common::{bitmend, fuse_available, mount, noise, scratch, umount};

/// A 32 MiB image: 256 erase blocks of 64 pages of 2,048 + 64 bytes, after an 8 KiB header.
const BLOCK_BYTES: u64 = 64 * 2112;
const HEADER: u64 = 8192;

fn zero_blocks(img: &str, blocks: &[u64]) {
    use std::os::unix::fs::FileExt as _;
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    for &b in blocks {
        f.write_all_at(&vec![0u8; BLOCK_BYTES as usize], HEADER + b * BLOCK_BYTES).unwrap();
    }
}

fn fsck_json(img: &str) -> (Option<i32>, String, String) {
    let out = bitmend(&["fsck", img, "--json"]);
    let said = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.code(), said(&out.stdout), said(&out.stderr))
}

#[test]
fn destroyed_first_blocks_still_mount_and_read_back() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mnt) = scratch("lost-blocks");
    assert!(bitmend(&["mkfs", &img, "--size", "32MiB"]).status.success());
    let nvram = dir.join("tier").to_str().unwrap().to_string();
    let tier = ["--nvram", nvram.as_str(), "--nvram-size", "8M"];
    let data = noise(11, 3 << 20);
    mount(&img, &mnt, &tier);
    std::fs::write(format!("{mnt}/f"), &data).unwrap();
    umount(&mnt);
    let clean = dir.join("clean.img");
    std::fs::copy(&img, &clean).unwrap();

    let cases: [(&[u64], &str, &[&str]); 3] = [
        (&[0], "the copy in reserved block 1", &tier),
        (&[0, 1], "the far copy in erase block 255", &["--nvram", "none"]),
        (&[0, 1, 254, 255], "the newest segment's copy", &tier),
    ];
    for (blocks, from, how) in cases {
        std::fs::copy(&clean, &img).unwrap();
        zero_blocks(&img, blocks);
        mount(&img, &mnt, how);
        assert_eq!(std::fs::read(format!("{mnt}/f")).unwrap(), data, "blocks {blocks:?} zeroed");
        umount(&mnt);
        let (code, out, err) = fsck_json(&img);
        assert!(code == Some(0) && out.contains("\"clean\": true"), "blocks {blocks:?}: {out}{err}");
        assert!(out.contains("\"superblocks_damaged\": 0"), "the mount rewrote every copy: {out}");

        // Offline, fsck reads the damaged image itself and says which copy it used.
        std::fs::copy(&clean, &img).unwrap();
        zero_blocks(&img, blocks);
        let (code, out, err) = fsck_json(&img);
        assert_eq!(code, Some(0), "blocks {blocks:?}: {out}{err}");
        assert!(out.contains(from), "blocks {blocks:?}: wanted {from}: {out}");
        let damaged = format!("\"superblocks_damaged\": {0}, \"superblocks_rewritten\": {0}", blocks.len());
        assert!(out.contains(&damaged), "blocks {blocks:?}: {out}");
    }

    // Nothing left: every block's first pages zeroed. Refused, naming the image.
    std::fs::copy(&clean, &img).unwrap();
    zero_blocks(&img, &(0..256).collect::<Vec<_>>());
    let (code, out, err) = fsck_json(&img);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(err.contains(&img) && err.contains("no readable superblock"), "{err}");
    let out = bitmend(&["mount", &img, &mnt, "--nvram", &nvram]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&img) && !err.contains(&format!("{nvram}:")),
        "names the image, not the tier: {err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
