//! The CMF v2 container (spec §1–§10, §12). Depends on nothing else in the engine: a reader
//! needs no inference code.

pub mod dtype;
pub mod error;
pub mod hash64;

pub use dtype::DType;
pub use error::{ErrorKind, FormatError, Result};
pub use hash64::hash64;
