//! With the `bench` feature, the `bitmend` binary exports libpmem's flush and copy functions
//! (defined in the anchors crate), so that libpmemobj's calls reach them and `bench heap`
//! can count PMDK's persistent line writes. Without it nothing changes.

fn main() {
    println!("cargo::rerun-if-env-changed=CARGO_FEATURE_BENCH");
    if std::env::var_os("CARGO_FEATURE_BENCH").is_some() {
        for name in ["pmem_flush", "pmem_persist", "pmem_memcpy", "pmem_memmove", "pmem_memset"] {
            println!("cargo::rustc-link-arg-bins=-Wl,--export-dynamic-symbol={name}");
        }
    }
}
