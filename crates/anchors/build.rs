//! Links PMDK's libpmemobj (libpmemobj-dev) when its development files are installed, and
//! sets `cfg(has_pmemobj)`; without them the shims report "not installed" and tests skip the
//! cross-checks unless BITMEND_REQUIRE_ANCHORS is set. ISA-L needs nothing here: the
//! isal-sys crate builds 2.31 from source, and Debian's 2.30 is loaded at run time
//! (src/isal.rs).

use std::path::Path;

fn main() {
    let dirs = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"];
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
