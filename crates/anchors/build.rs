//! Links ISA-L when its development files are installed (Debian: libisal-dev) and sets
//! `cfg(has_isal)`; without it the shims report "not installed" and tests skip the cross-check
//! unless BITMEND_REQUIRE_ANCHORS is set.

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
}
