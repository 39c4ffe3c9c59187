//! # bitmend-anchors
//!
//! Thin, safe wrappers over the C libraries bitmend is measured against and cross-checked
//! with. PMDK is optional at build time: when its library is missing, its functions return
//! `None` and [`pmdk::available`] is false. ISA-L is always here (2.31, built by isal-sys),
//! and Debian's 2.30 beside it when installed ([`isal::Isal::debian`]).

pub mod isal;
pub mod littlefs;
pub mod pmdk;
pub mod pmem_count;
