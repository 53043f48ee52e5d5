//! The CMF v2 container (spec §1–§10, §12). Depends on nothing else in the engine: a reader
//! needs no inference code.

pub mod directory;
pub mod dtype;
pub mod envelope;
pub mod error;
pub mod file;
pub mod hash64;
pub mod header;
pub mod index;
pub mod layers;
pub mod masks;
pub mod shards;
pub mod signature;
pub mod skills;
pub mod verify;
pub mod writer;

pub use directory::{Directory, TensorEntry};
pub use dtype::DType;
pub use envelope::{feature, Envelope, Section, SectionKind};
pub use error::{ErrorKind, FormatError, Result};
pub use file::CmfFile;
pub use hash64::hash64;
pub use header::Header;
pub use shards::CmfModel;

/// Text from a file, made safe to print: control characters (and DEL, and the C1 range)
/// are shown as escapes so a hostile name cannot drive the terminal.
pub fn escape_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Bytes shown as printable ASCII with `\xNN` escapes for everything else.
pub fn escape_bytes(b: &[u8]) -> String {
    b.iter()
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect()
}
