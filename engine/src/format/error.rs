//! The one error type of the container layer. Its variants are the error kinds of spec §1.2
//! plus I/O; every message names what was wrong and where.

use std::fmt;

/// Why a CMF file (or a part of it) is not acceptable.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The first four bytes are not `CMF\x01`.
    #[error("InvalidMagic: {0}")]
    InvalidMagic(String),
    /// `version` is not 2.
    #[error("UnsupportedVersion: {0}")]
    UnsupportedVersion(String),
    /// A `required_features` bit this reader does not know, or a feature this operation
    /// cannot handle (a reserved dtype, a skill file where a model is needed).
    #[error("UnsupportedFeature: {0}")]
    UnsupportedFeature(String),
    /// A section, record, tensor or field lies outside its container, overlaps another,
    /// or disagrees with the size its layout implies.
    #[error("Bounds: {0}")]
    Bounds(String),
    /// Bytes that do not parse: bad UTF-8 or JSON, unknown dtype, bad ndim, bad mask bits,
    /// a hash that does not match (corruption is reported by `verify` as a failure, not here).
    #[error("Parse: {0}")]
    Parse(String),
    /// The operating system refused (missing file, permissions, disk full).
    #[error("Io: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// The machine-readable kind of a [`FormatError`], as `verify --json` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ErrorKind {
    InvalidMagic,
    UnsupportedVersion,
    UnsupportedFeature,
    Bounds,
    Parse,
    Io,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl FormatError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            FormatError::InvalidMagic(_) => ErrorKind::InvalidMagic,
            FormatError::UnsupportedVersion(_) => ErrorKind::UnsupportedVersion,
            FormatError::UnsupportedFeature(_) => ErrorKind::UnsupportedFeature,
            FormatError::Bounds(_) => ErrorKind::Bounds,
            FormatError::Parse(_) => ErrorKind::Parse,
            FormatError::Io { .. } => ErrorKind::Io,
        }
    }

    /// The message without the kind prefix.
    pub fn message(&self) -> String {
        match self {
            FormatError::InvalidMagic(m)
            | FormatError::UnsupportedVersion(m)
            | FormatError::UnsupportedFeature(m)
            | FormatError::Bounds(m)
            | FormatError::Parse(m) => m.clone(),
            FormatError::Io { context, source } => format!("{context}: {source}"),
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        FormatError::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// Shorthands used throughout the format module.
pub(crate) fn bounds(msg: impl Into<String>) -> FormatError {
    FormatError::Bounds(msg.into())
}
pub(crate) fn parse(msg: impl Into<String>) -> FormatError {
    FormatError::Parse(msg.into())
}
