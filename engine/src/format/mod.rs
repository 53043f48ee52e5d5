//! The CMF v2 container (spec §1–§10, §12). Depends on nothing else in the engine: a reader
//! needs no inference code.

pub mod digests;
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
/// are shown as escapes so a hostile name cannot drive the terminal, and so are the
/// bidirectional controls ([`is_bidi_control`]), so that it cannot reorder what is shown
/// ("Trojan Source": a name that displays as another).
pub fn escape_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() || is_bidi_control(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The Unicode bidirectional formatting characters: embeddings and overrides
/// (U+202A–U+202E), isolates (U+2066–U+2069) and the implicit marks (U+200E, U+200F,
/// U+061C). The views crate's `util::esc` escapes the same set.
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{61c}')
}

/// Bytes shown as printable ASCII with `\xNN` escapes for everything else.
pub fn escape_bytes(b: &[u8]) -> String {
    b.iter()
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod escape_tests {
    use super::*;

    #[test]
    fn controls_and_bidi_controls_are_escaped_and_the_rest_kept() {
        // "Trojan Source": an override makes `abc.txt` display as `txt.cba`.
        assert_eq!(escape_str("a\u{202e}txt.cba"), "a\\u{202e}txt.cba");
        for c in [
            '\u{202a}', '\u{202d}', '\u{2066}', '\u{2069}', '\u{200e}', '\u{200f}', '\u{61c}',
        ] {
            let e = escape_str(&format!("x{c}y"));
            assert!(!e.contains(c) && e.starts_with("x\\u{"), "{c:?}: {e}");
        }
        assert_eq!(escape_str("a\u{1b}[2Jb\u{9b}"), "a\\u{1b}[2Jb\\u{9b}");
        // Text that merely is right-to-left, or joins emoji, stays as it is.
        for s in [
            "שלום",
            "مرحبا",
            "👨\u{200d}👩\u{200d}👧",
            "model.layers.0.mlp",
        ] {
            assert_eq!(escape_str(s), s);
        }
    }
}
