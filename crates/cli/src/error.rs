//! The command line's errors, each with its exit code, so that a script can tell a typo from
//! a damaged chip without reading the message.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done (fsck and scrub: nothing left wrong) |
//! | 1 | the work failed: an I/O error, a full chip, a failing one |
//! | 2 | bad arguments or values (clap's own parse errors exit 2 too) |
//! | 3 | the target cannot be used: missing, not a bitmend image, a newer format, locked or mounted |
//! | 4 | fsck or scrub found problems it could not repair |
//! | 5 | data beyond repair stopped the command |

use bitmend_flashfs::FsError;
use bitmend_flashfs::{Corruption, FormatError};
use bitmend_heap::HeapError;
use bitmend_media::nand::NandError;

/// fsck or scrub found problems (a report, not an error: the command ran to its end).
pub const EXIT_PROBLEMS: u8 = 4;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An argument or value the user gave is not valid.
    #[error("{0}")]
    Usage(String),
    /// The image or mountpoint named cannot be used as asked.
    #[error("{0}")]
    Target(String),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Nand(#[from] NandError),
    #[error(transparent)]
    Heap(#[from] HeapError),
    /// A file-system error on the image named (not on the NVRAM tier file beside it).
    #[error("{}: {source}", image.display())]
    Image { image: std::path::PathBuf, source: FsError },
    /// A child command (the mount's daemon) failed: its message and its exit code, passed on.
    #[error("{why}")]
    Child { code: u8, why: String },
    /// Anything else that stopped the work.
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Target(_) => 3,
            CliError::Fs(e) => fs_code(e),
            CliError::Nand(e) => nand_code(e),
            CliError::Heap(e) => heap_code(e),
            CliError::Image { source, .. } => fs_code(source),
            CliError::Child { code, .. } => *code,
            CliError::Failed(_) => 1,
        }
    }
}

fn fs_code(e: &FsError) -> u8 {
    match e {
        FsError::Nand(n) => nand_code(n),
        FsError::Format(FormatError::NotAFs { .. }) | FsError::Format(FormatError::Version { .. }) => 3,
        FsError::Corrupt(Corruption::Unrecoverable { .. }) => 5,
        _ => 1,
    }
}

fn heap_code(e: &HeapError) -> u8 {
    match e {
        HeapError::NotAPool { .. } | HeapError::Version { .. } | HeapError::RegionTooSmall { .. } => 3,
        HeapError::TooLarge { .. } | HeapError::KeyTooLong { .. } => 2,
        // Data beyond repair (what healing could not rebuild).
        HeapError::Corrupt { .. } | HeapError::Damaged { .. } => 5,
        _ => 1,
    }
}

fn nand_code(e: &NandError) -> u8 {
    match e {
        NandError::NotAnImage { .. } | NandError::Version { .. } | NandError::Locked { .. } => 3,
        NandError::Io { source, .. }
            if matches!(source.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::AlreadyExists) =>
        {
            3
        }
        // Geometry given on the command line, a page or block number past the chip.
        NandError::Geometry { .. } | NandError::PageRange { .. } | NandError::BlockRange { .. } => 2,
        _ => 1,
    }
}

/// Messages built along the way (`format!`, a library's `Display`) are failures of the work.
impl From<String> for CliError {
    fn from(s: String) -> CliError {
        CliError::Failed(s)
    }
}

impl From<&str> for CliError {
    fn from(s: &str) -> CliError {
        CliError::Failed(s.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_failure_has_its_own_code() {
        let codes = [
            CliError::Usage("--size 3".into()).exit_code(),
            CliError::Target("not mounted".into()).exit_code(),
            CliError::Fs(FsError::Format(FormatError::NotAFs { why: "no magic".into() })).exit_code(),
            CliError::Fs(FsError::Corrupt(Corruption::Unrecoverable { page: 9 })).exit_code(),
            CliError::Fs(FsError::NoSpace).exit_code(),
            CliError::Nand(NandError::Locked { path: "x".into() }).exit_code(),
            CliError::Failed("io".into()).exit_code(),
        ];
        assert_eq!(codes, [2, 3, 3, 5, 1, 3, 1]);
        assert!(!codes.contains(&EXIT_PROBLEMS), "4 is a report, never an error");
    }
}
