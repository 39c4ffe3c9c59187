//! The file system's errors.

use bitmend_media::nand::NandError;

/// Errors of the flash file system. The chip's failures arrive as [`FsError::Nand`]; damage
/// beyond the configured redundancy is [`FsError::Unrecoverable`], never wrong bytes.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(transparent)]
    Nand(#[from] NandError),
    #[error("invalid file-system configuration: {why}")]
    Config { why: String },
    #[error("not a bitmend file system: {why}")]
    NotAFs { why: String },
    #[error("file-system format version {found}; this build reads version {supported}")]
    Version { found: u32, supported: u32 },
    #[error("no free segment left")]
    NoSpace,
    /// A page damaged beyond its block's and its segment's parity.
    #[error("page {page} is damaged beyond the configured redundancy")]
    Unrecoverable { page: u32 },
    /// A cached page that failed its CRC while dirty (a memory error): there is no good copy
    /// to read instead.
    #[error(
        "logical page {page} of inode {ino} failed its checksum in memory while dirty; it cannot be read"
    )]
    CorruptInMemory { ino: u64, page: u64 },
    #[error("page {page} holds no data written by the file system")]
    NotWritten { page: u32 },
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name longer than 255 bytes")]
    NameTooLong,
    #[error("invalid argument: {why}")]
    Invalid { why: String },
    #[error("no such extended attribute")]
    NoXattr,
    #[error("the extended attributes of one inode take at most {room} bytes together")]
    XattrTooBig { room: usize },
    #[error("not supported: {why}")]
    Unsupported { why: String },
    /// The NVRAM tier failed to keep the dirty state (its region failed, or is damaged).
    #[error(transparent)]
    Tier(#[from] crate::fs::DirtyStateError),
    /// The NVRAM tier holds the dirty state of another file system: it is not applied.
    #[error("the NVRAM tier holds the state of file system {found:016x}, not of this one ({ours:016x})")]
    ForeignTier { found: u64, ours: u64 },
}

impl FsError {
    /// Out of space, on the chip or on the disk under a thin image: a state the caller may
    /// wait out (what it could not store is still held), not a failure.
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            FsError::NoSpace | FsError::Nand(NandError::HostFull { .. } | NandError::HostSpace { .. })
        )
    }

    /// The errno a POSIX front end (the FUSE mount) answers with: the one place errors
    /// become numbers.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Nand(NandError::HostFull { .. } | NandError::HostSpace { .. }) | FsError::NoSpace => {
                libc::ENOSPC
            }
            FsError::Nand(_)
            | FsError::Unrecoverable { .. }
            | FsError::NotWritten { .. }
            | FsError::CorruptInMemory { .. }
            | FsError::Tier(_)
            | FsError::ForeignTier { .. } => libc::EIO,
            FsError::Config { .. } | FsError::NotAFs { .. } | FsError::Version { .. } => libc::EINVAL,
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::Invalid { .. } => libc::EINVAL,
            FsError::NoXattr => libc::ENODATA,
            FsError::XattrTooBig { .. } => libc::E2BIG,
            FsError::Unsupported { .. } => libc::EOPNOTSUPP,
        }
    }
}
