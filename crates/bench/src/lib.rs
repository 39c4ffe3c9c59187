//! # bitmend-bench
//!
//! The benchmarks behind `bitmend bench`. Every row is measured in one process beside its
//! anchor, on the same buffers, with samples of the two interleaved so that load on a shared
//! machine hits both alike; the figures are medians.

#![forbid(unsafe_code)]

pub mod cache;
pub mod cache_flips;
pub mod code;
pub mod corpus;
pub mod flashfs;
pub mod harness;
pub mod heap;
pub mod heap_alloc;
pub mod heap_kv;
pub mod littlefs;
pub mod namespace;
pub mod near_full;
pub mod nvlog;
pub mod parity_floor;
pub mod postmark;
pub mod scale;
pub mod tier;

pub use harness::{Options, Row};
