//! A pool as a command holds it: closed however the command ends.

use std::ops::{Deref, DerefMut};
use std::path::Path;

use bitmend_heap::kv::Kv;
use bitmend_heap::{OpenReport, Pool, PoolOptions};
use bitmend_media::pmem::MmapRegion;

use crate::error::CliError;

/// A pool opened by a command, closed (marked clean, its journal emptied) when the command
/// ends, by success or by an error. A pool left unclosed is opened next as after a crash:
/// recovery recomputes the parity of what the journal's last transaction touched, and would
/// take in any damage made there since.
pub struct Opened(Option<Pool<MmapRegion>>);

impl Opened {
    /// Opens the pool in `file` and the store at its root.
    pub fn open(file: &Path, opts: PoolOptions) -> Result<(Opened, OpenReport, Kv), CliError> {
        let region =
            MmapRegion::open(file).map_err(|e| CliError::Target(format!("{}: {e}", file.display())))?;
        let (pool, report) = Pool::open(region, opts)?;
        let pool = Opened(Some(pool));
        let kv = Kv::open(&pool)?;
        Ok((pool, report, kv))
    }
}

impl Deref for Opened {
    type Target = Pool<MmapRegion>;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("a pool is held until it is dropped")
    }
}

impl DerefMut for Opened {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("a pool is held until it is dropped")
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if let Some(pool) = self.0.take() {
            pool.close();
        }
    }
}
