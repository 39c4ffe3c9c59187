//! The file system's errors, in layers as a caller tells them apart: the answers POSIX
//! names ([`PosixError`]: the request cannot be done as asked, nothing is damaged), the
//! medium's failures ([`FsError::Nand`]: I/O, or the host's disk full under a thin image),
//! damage found ([`Corruption`]: beyond the redundancy, never wrong bytes), no space, an
//! image that is not one this build mounts ([`FormatError`]), and the NVRAM tier's faults
//! ([`DirtyStateError`]).
//! Each is `#[non_exhaustive]` and converts into [`FsError`] with `From`.

use bitmend_media::nand::NandError;

/// Errors of the flash file system.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The request cannot be done as asked (a name that is not there, a directory not
    /// empty): an answer, not a fault.
    #[error(transparent)]
    Posix(#[from] PosixError),
    /// The chip, or the disk under an image, failed an operation.
    #[error(transparent)]
    Nand(#[from] NandError),
    /// What was read is damaged beyond the configured redundancy: refused, never returned.
    #[error(transparent)]
    Corrupt(#[from] Corruption),
    #[error("no free segment left")]
    NoSpace,
    /// The image is not one this build mounts, or a configuration is not one it makes.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The NVRAM tier failed to keep the dirty state (its region failed, or is damaged).
    #[error(transparent)]
    Tier(#[from] DirtyStateError),
    /// The NVRAM tier holds the dirty state of another file system: it is not applied.
    #[error("the NVRAM tier holds the state of file system {found:016x}, not of this one ({ours:016x})")]
    ForeignTier { found: u64, ours: u64 },
}

/// The answers POSIX names, each with its errno ([`FsError::errno`]).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PosixError {
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
}

/// Damage found where data was to be read: the bytes are refused (EIO), never returned.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    /// A page damaged beyond its block's and its segment's parity.
    #[error("page {page} is damaged beyond the configured redundancy")]
    Unrecoverable { page: u32 },
    /// A page that holds no data the file system wrote (erased, or another's).
    #[error("page {page} holds no data written by the file system")]
    NotWritten { page: u32 },
    /// A cached page that failed its CRC while dirty (a memory error): there is no good copy
    /// to read instead.
    #[error(
        "logical page {page} of inode {ino} failed its checksum in memory while dirty; it cannot be read"
    )]
    InMemory { ino: u64, page: u64 },
}

/// An image this build does not mount, or a configuration it does not make.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("invalid file-system configuration: {why}")]
    Config { why: String },
    #[error("not a bitmend file system: {why}")]
    NotAFs { why: String },
    #[error("file-system format version {found}; this build reads version {supported}")]
    Version { found: u32, supported: u32 },
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

    /// Damage found beyond the redundancy (not an I/O failure of the chip).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, FsError::Corrupt(_))
    }

    /// The errno a POSIX front end (the FUSE mount) answers with: the one place errors
    /// become numbers.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Nand(NandError::HostFull { .. } | NandError::HostSpace { .. }) | FsError::NoSpace => {
                libc::ENOSPC
            }
            FsError::Nand(_) | FsError::Corrupt(_) | FsError::Tier(_) | FsError::ForeignTier { .. } => {
                libc::EIO
            }
            FsError::Format(_) => libc::EINVAL,
            FsError::Posix(p) => p.errno(),
        }
    }
}

impl PosixError {
    pub fn errno(&self) -> i32 {
        match self {
            PosixError::NotFound => libc::ENOENT,
            PosixError::Exists => libc::EEXIST,
            PosixError::NotDir => libc::ENOTDIR,
            PosixError::IsDir => libc::EISDIR,
            PosixError::NotEmpty => libc::ENOTEMPTY,
            PosixError::NameTooLong => libc::ENAMETOOLONG,
            PosixError::Invalid { .. } => libc::EINVAL,
            PosixError::NoXattr => libc::ENODATA,
            PosixError::XattrTooBig { .. } => libc::E2BIG,
            PosixError::Unsupported { .. } => libc::EOPNOTSUPP,
        }
    }
}

/// Why a tier did not take something.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirtyStateError {
    /// No room (or a record too large for it): the file system writes the state to flash
    /// instead, which makes it just as durable.
    #[error("the NVRAM tier is full")]
    Full,
    /// The tier's medium failed, or holds damage past its redundancy: what it was asked to
    /// keep is not kept. `source` is the tier's own error.
    #[error("the NVRAM tier failed: {source}")]
    Failed {
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
