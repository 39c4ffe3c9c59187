//! # bitmend-media
//!
//! The media bitmend stores on, as traits with real and simulated backends, strict about the
//! hardware's rules and failing the way hardware fails:
//!
//! - [`nand`]: raw NAND flash ([`nand::Nand`]): program once per erase, in order, erase to
//!   ones; [`nand::RamNand`], [`nand::FileNand`] (a self-describing image file), and
//!   [`nand::FaultyNand`] (bit flips, stuck bits, lost pages, failed programs and erases, wear,
//!   power cuts that tear the operation in flight).
//! - [`pmem`]: byte-addressable persistent memory ([`pmem::Region`]): [`pmem::RamRegion`],
//!   [`pmem::MmapRegion`], [`pmem::CrashRegion`] (unpersisted cache lines lost or kept at a
//!   crash), [`pmem::ProtectedRegion`] (mprotect around each store), and
//!   [`pmem::RegionFaults`] (wild writes and bit flips).
//!
//! Every fault is drawn from a seed ([`rng::Rng`]) and recorded, so a test states exactly
//! what it injected and replays it. For tests of a full disk under a thin image,
//! [`small_host::SmallHost`] mounts a tmpfs of a few MiB (root only).

pub mod campaign;
mod host_space;
pub mod nand;
pub mod pmem;
pub mod rng;
pub mod small_host;
