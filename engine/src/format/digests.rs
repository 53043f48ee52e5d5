//! Strong digests: an additive header field (§1.1: readers that do not know a key ignore
//! it), `strong_digests`, with a BLAKE3 digest of every tensor (directory order) and of
//! the directory, masks, vocab and index sections.
//!
//! hash64 folds 8-byte words with XOR after a positional mix, and NOTES.md shows it blind
//! to some rearrangements (two swapped 8-byte words can keep it); a cryptographic digest
//! is not. The header itself stays covered by the envelope's hash64 (a digest cannot
//! cover the bytes that hold it); the detached signature (§8.2) covers everything.
//!
//! ```json
//! "strong_digests": {"alg": "blake3", "directory": "<64 hex>", "masks": "<64 hex>",
//!                    "vocab": "<64 hex>", "index": "<64 hex>", "tensors": ["<64 hex>", …]}
//! ```
//!
//! BLAKE3 rather than the SHA-256 of the signature: it hashes one large tensor on every
//! core (a tree hash) and several times faster per core, so `verify` stays near the read
//! bandwidth.

use serde::{Deserialize, Serialize};

use super::header::Header;

/// The header key.
pub const KEY: &str = "strong_digests";
/// The one algorithm written and understood.
pub const ALG: &str = "blake3";

/// Inputs from this size on are hashed on the rayon pool.
const PARALLEL_FROM: usize = 1 << 20;

/// The `strong_digests` header field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrongDigests {
    pub alg: String,
    pub directory: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masks: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<String>,
    /// One per directory entry, in directory order.
    pub tensors: Vec<String>,
}

/// The BLAKE3 digest of `bytes` as 64 lowercase hex digits.
pub fn digest(bytes: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    if bytes.len() >= PARALLEL_FROM {
        h.update_rayon(bytes);
    } else {
        h.update(bytes);
    }
    h.finalize().to_hex().to_string()
}

/// `status` of a link whose hash64 was checked, with its strong digest `want` (when
/// there is one) checked too once hash64 holds.
pub(crate) fn and_strong(
    status: super::verify::LinkStatus,
    want: Option<&String>,
    bytes: &[u8],
) -> super::verify::LinkStatus {
    use super::verify::LinkStatus;
    match (status, want) {
        (LinkStatus::Ok, Some(want)) => {
            let got = digest(bytes);
            if got.eq_ignore_ascii_case(want) {
                LinkStatus::Ok
            } else {
                LinkStatus::Mismatch {
                    expected: format!("blake3 {want}"),
                    actual: format!("blake3 {got}"),
                }
            }
        }
        (status, _) => status,
    }
}

/// A digest of the right length that says nothing: a writer serializes the header with
/// these to learn its length before the tensors are written, then fills them in.
pub fn placeholder() -> String {
    "0".repeat(64)
}

impl StrongDigests {
    /// The field of `header`: `None` when absent, an error when present but malformed
    /// (wrong shape, another algorithm, not 64 hex digits).
    pub fn of_header(header: &Header) -> Option<Result<StrongDigests, String>> {
        let v = header.extra.get(KEY)?;
        Some(
            StrongDigests::deserialize(v)
                .map_err(|e| format!("{KEY} is malformed: {e}"))
                .and_then(|d| {
                    if d.alg != ALG {
                        return Err(format!(
                            "{KEY}: algorithm {:?} is not {ALG}",
                            super::escape_str(&d.alg)
                        ));
                    }
                    let hex =
                        |s: &String| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
                    let all = [
                        Some(&d.directory),
                        d.masks.as_ref(),
                        d.vocab.as_ref(),
                        d.index.as_ref(),
                    ]
                    .into_iter()
                    .flatten()
                    .chain(&d.tensors);
                    for s in all {
                        if !hex(s) {
                            return Err(format!(
                                "{KEY}: {:?} is not 64 hex digits",
                                super::escape_str(s)
                            ));
                        }
                    }
                    Ok(d)
                }),
        )
    }

    /// Stores the field in `header`, replacing any earlier one.
    pub fn put(&self, header: &mut Header) {
        let v = serde_json::to_value(self).expect("StrongDigests serializes");
        header.extra.insert(KEY.to_string(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_through_a_header_and_bad_ones_are_named() {
        let d = StrongDigests {
            alg: ALG.into(),
            directory: digest(b"dir"),
            masks: None,
            vocab: Some(digest(b"vocab")),
            index: None,
            tensors: vec![digest(&[7u8; 3 << 20]), digest(b"")],
        };
        // The parallel path gives the same digest as one thread.
        let big = vec![7u8; 3 << 20];
        assert_eq!(d.tensors[0], blake3::hash(&big).to_hex().to_string());
        let mut h = Header::default();
        assert!(StrongDigests::of_header(&h).is_none());
        d.put(&mut h);
        let (back, _) = Header::parse(&h.to_bytes()).unwrap();
        assert_eq!(StrongDigests::of_header(&back), Some(Ok(d.clone())));

        let mut bad = d.clone();
        bad.tensors[1] = "xyz".into();
        bad.put(&mut h);
        let e = StrongDigests::of_header(&h).unwrap().unwrap_err();
        assert!(e.contains("not 64 hex digits"), "{e}");
        let mut other = d;
        other.alg = "md5".into();
        other.put(&mut h);
        assert!(StrongDigests::of_header(&h).unwrap().is_err());
        h.extra.insert(KEY.into(), serde_json::json!(5));
        assert!(StrongDigests::of_header(&h).unwrap().is_err());
    }
}
