//! A pool as a command holds it: a writer alone, readers side by side; closed however the
//! command ends.

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::time::Duration;

use bitmend_heap::kv::Kv;
use bitmend_heap::{OpenReport, Pool, PoolOptions};
use bitmend_media::pmem::MmapRegion;

use crate::error::CliError;

/// How a command holds its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Alone, writing the file.
    Write,
    /// Beside other readers, in a private copy of the file's pages: what the open's recovery
    /// or a rebuild stores lands in the copy, never in the file (which may be read-only).
    Read,
}

/// A pool opened by a command, closed (marked clean, its journal emptied) when the command
/// ends, by success or by an error. A pool left unclosed is opened next as after a crash:
/// recovery recomputes the parity of what the journal's last transaction touched, and would
/// take in any damage made there since.
pub struct Opened {
    pool: Option<Pool<MmapRegion>>,
    access: Access,
    file: std::path::PathBuf,
}

impl Opened {
    /// Opens the pool in `file` and the store at its root, waiting up to `wait` for the
    /// processes that hold it.
    pub fn open(
        file: &Path,
        opts: PoolOptions,
        access: Access,
        wait: Duration,
    ) -> Result<(Opened, OpenReport, Kv), CliError> {
        let region = match access {
            Access::Write => MmapRegion::open_waiting(file, wait),
            Access::Read => MmapRegion::open_private(file, wait),
        }
        .map_err(|e| CliError::Target(e.to_string()))?;
        let (pool, report) = Pool::open(region, opts)?;
        let pool = Opened { pool: Some(pool), access, file: file.to_path_buf() };
        let kv = Kv::open(&pool)?;
        Ok((pool, report, kv))
    }
}

impl Deref for Opened {
    type Target = Pool<MmapRegion>;
    fn deref(&self) -> &Self::Target {
        self.pool.as_ref().expect("a pool is held until it is dropped")
    }
}

impl DerefMut for Opened {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.pool.as_mut().expect("a pool is held until it is dropped")
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            // A reader rebuilt damaged pages in its own copy: the file still holds the
            // damage, and the person should know before another page of the stripe goes.
            let rebuilt = pool.heal_stats().pages_repaired;
            if self.access == Access::Read && rebuilt > 0 {
                eprintln!(
                    "{}: {rebuilt} damaged pages were rebuilt for this read, in memory only; the file still holds the damage (`bitmend kv scrub` mends it)",
                    self.file.display()
                );
            }
            pool.close();
        }
    }
}
