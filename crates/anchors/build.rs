//! Links ISA-L (Debian: libisal-dev) and PMDK's libpmemobj (libpmemobj-dev) when their
//! development files are installed, and sets `cfg(has_isal)` / `cfg(has_pmemobj)`; without
//! them the shims report "not installed" and tests skip the cross-checks unless
//! BITMEND_REQUIRE_ANCHORS is set.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_isal)");
    println!("cargo::rerun-if-env-changed=BITMEND_NO_ISAL");
    let dirs = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"];
    let header = ["/usr/include/isa-l/erasure_code.h", "/usr/local/include/isa-l/erasure_code.h"];
    let lib = dirs.iter().find(|d| Path::new(d).join("libisal.so").exists());
    if let (Some(dir), true, false) =
        (lib, header.iter().any(|h| Path::new(h).exists()), std::env::var_os("BITMEND_NO_ISAL").is_some())
    {
        println!("cargo::rustc-link-search=native={dir}");
        println!("cargo::rustc-link-lib=dylib=isal");
        println!("cargo::rustc-cfg=has_isal");
    }
    println!("cargo::rustc-check-cfg=cfg(has_pmemobj)");
    let lib = dirs.iter().find(|d| Path::new(d).join("libpmemobj.so").exists());
    println!("cargo::rustc-check-cfg=cfg(has_btree_map)");
    if let (Some(dir), true) = (lib, Path::new("/usr/include/libpmemobj.h").exists()) {
        println!("cargo::rustc-link-search=native={dir}");
        println!("cargo::rustc-link-lib=dylib=pmemobj");
        println!("cargo::rustc-cfg=has_pmemobj");
        btree_map();
    }
}

/// PMDK's example B-tree, from the copy Debian's libpmemobj-dev installs with its
/// documentation, with our flat interface to it (csrc/btree_glue.c): the anchor of the
/// B+tree benchmark. Sets `cfg(has_btree_map)` when the example is there.
fn btree_map() {
    let dir = Path::new("/usr/share/doc/libpmemobj-dev/examples/tree_map");
    println!("cargo::rerun-if-changed=csrc/btree_glue.c");
    if !dir.join("btree_map.c").exists() {
        return;
    }
    cc::Build::new()
        .file(dir.join("btree_map.c"))
        .file("csrc/btree_glue.c")
        .include(dir)
        .opt_level(2)
        .warnings(false)
        .compile("bitmend_btree_map");
    println!("cargo::rustc-cfg=has_btree_map");
}
