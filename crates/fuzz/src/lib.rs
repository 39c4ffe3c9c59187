//! Fuzz targets: each decoder of bytes from a medium, driven through the public API over an
//! image a fuzzer has damaged. An input is a list of patches (`patches`); each target
//! applies them to a small image made once (a log with wrapped and trimmed records, a pool
//! with a store, a flash file system with files, links and a checkpoint), then opens it and
//! uses everything it holds. A target may meet errors; it must never panic, loop or ask for
//! memory the image cannot justify. `fuzz/` wraps them for cargo-fuzz (nightly);
//! `tests/corpus.rs` replays the checked-in corpus, and a sweep of random patches, on stable.

pub mod decoders;
pub mod flash;
pub mod heap;
pub mod nvlog;
mod patches;
pub mod tier;

pub use patches::{patches, Patch};
