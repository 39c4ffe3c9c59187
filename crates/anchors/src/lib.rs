//! # bitmend-anchors
//!
//! Thin, safe wrappers over the C libraries bitmend is measured against and cross-checked
//! with. Each anchor is optional at build time: when its library is missing, its functions
//! return `None` and [`isal::available`] / [`pmdk::available`] is false.

pub mod isal;
pub mod littlefs;
pub mod pmdk;
pub mod pmem_count;
