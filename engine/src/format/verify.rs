//! The integrity chain (spec §8.1): header hash and directory hash in the envelope, section
//! hashes in the header, every tensor's hash64 in the directory, and the detached signature
//! of §8.2. Tensors are hashed in parallel (large tensors in chunks: hash64 folds positional
//! words with XOR, so chunks combine exactly), reporting progress as events.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rayon::prelude::*;
use serde::Serialize;

use super::digests::{self, StrongDigests};
use super::dtype::DType;
use super::envelope::SectionKind;
use super::file::CmfFile;
use super::hash64::{fmix64, hash64, hex16, parse_hex16};
use super::signature::{self, SignatureStatus};

/// One link of the chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "link", rename_all = "snake_case")]
pub enum Link {
    Header,
    Directory,
    Section {
        section: SectionKind,
    },
    Tensor {
        index: usize,
        name: String,
    },
    /// The header's `strong_digests` field itself (see [`super::digests`]).
    StrongDigests,
    Signature,
}

impl Link {
    pub fn describe(&self) -> String {
        match self {
            Link::Header => "header".into(),
            Link::Directory => "directory".into(),
            Link::Section { section } => format!("{} section", section.name()),
            Link::Tensor { name, .. } => format!("tensor {}", super::escape_str(name)),
            Link::StrongDigests => "strong digests".into(),
            Link::Signature => "signature".into(),
        }
    }
}

/// What was found at one link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum LinkStatus {
    /// The recorded hash matches.
    Ok,
    /// Nothing recorded to check against (hash 0, no `section_hashes` key, no `.sig`).
    Unchecked { reason: String },
    /// The recorded hash differs from the bytes.
    Mismatch { expected: String, actual: String },
    /// The bytes hash right but do not form a valid payload, or the link is otherwise bad.
    Invalid { reason: String },
}

impl LinkStatus {
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            LinkStatus::Mismatch { .. } | LinkStatus::Invalid { .. }
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinkResult {
    #[serde(flatten)]
    pub link: Link,
    #[serde(flatten)]
    pub status: LinkStatus,
}

/// Progress reports, in the order they happen (tensor events arrive from worker threads).
#[derive(Clone, Debug)]
pub enum VerifyEvent {
    Started { tensors: usize, tensor_bytes: u64 },
    Checked(LinkResult),
    Progress { bytes_done: u64, bytes_total: u64 },
    Finished,
}

/// A validator for variable-length payloads (q1s/q1t overlays, vbit widths); the engine
/// passes `crate::quant::validate` so that this module stays free of codec arithmetic.
pub type PayloadCheck = fn(DType, &[u64], &[u8]) -> Result<(), String>;

#[derive(Default)]
pub struct VerifyOptions<'a> {
    pub payload_check: Option<PayloadCheck>,
    /// Check `<file>.sig` when present (§8.2).
    pub signature: bool,
    /// Public keys (32 bytes) the user trusts; empty = trust not asked.
    pub trusted_keys: Vec<[u8; 32]>,
    /// Set to stop early; the report then says it was cancelled.
    pub cancel: Option<&'a AtomicBool>,
    /// A hash link with nothing recorded (an old file's zero hash, no `section_hashes`
    /// entry) fails instead of passing as unchecked.
    pub strict: bool,
    /// Check only the envelope, header, directory and sections: the tensors are checked
    /// on first use instead (`run --verify-on-load`).
    pub skip_tensors: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub ok: bool,
    pub cancelled: bool,
    /// The first failing link in chain order (envelope → header → directory → sections →
    /// tensors → signature).
    pub first_failure: Option<LinkResult>,
    /// Every failing link.
    pub failures: Vec<LinkResult>,
    /// Every link checked, in chain order.
    pub links: Vec<LinkResult>,
    pub signature: Option<SignatureStatus>,
    pub tensors_checked: usize,
    pub bytes_hashed: u64,
    /// The hash links that had nothing recorded to check against (§8.1 lets old files
    /// zero their hashes), described ("header", "vocab section"). `ok` with any of these
    /// proves less than a full chain; under [`VerifyOptions::strict`] they are failures.
    pub unhashed: Vec<String>,
    /// Whether the file carries strong digests ([`super::digests`]) and they were checked
    /// beside hash64 for every tensor and section. Without them a swap of two 8-byte words
    /// inside a tensor goes unseen (hash64 is blind to it).
    pub strong_digests: bool,
}

impl LinkResult {
    /// A hash link (not the optional signature) with nothing recorded to check.
    pub fn is_unhashed(&self) -> bool {
        self.link != Link::Signature && matches!(self.status, LinkStatus::Unchecked { .. })
    }
}

/// `names` as an English list: "a", "a and b", "a, b and c".
pub fn english_list(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// Chunk size for hashing one large tensor on several threads.
const CHUNK: usize = 4 << 20;

/// hash64 computed on all threads; equal to [`hash64`] for any input.
pub fn hash64_parallel(bytes: &[u8]) -> u64 {
    if bytes.len() <= CHUNK {
        return hash64(bytes);
    }
    let whole = bytes.len() / 8 * 8;
    let acc = bytes[..whole]
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(ci, chunk)| {
            let first = (ci * CHUNK / 8) as u64;
            super::hash64::fold_words(0, first, chunk).0
        })
        .reduce(|| 0, |a, b| a ^ b);
    let mut acc = acc;
    let tail = &bytes[whole..];
    if !tail.is_empty() {
        let mut t = [0u8; 8];
        t[..tail.len()].copy_from_slice(tail);
        acc ^= fmix64(u64::from_le_bytes(t))
            ^ ((whole / 8) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fmix64(acc ^ bytes.len() as u64)
}

fn check_hash(expected: u64, bytes: &[u8]) -> LinkStatus {
    let actual = hash64_parallel(bytes);
    if actual == expected {
        LinkStatus::Ok
    } else {
        LinkStatus::Mismatch {
            expected: hex16(expected),
            actual: hex16(actual),
        }
    }
}

/// One tensor's link: its hash64, its strong digest when `strong` has them, and its
/// payload. What [`verify`] does for each tensor, for checks on first use.
pub fn check_tensor(
    file: &CmfFile,
    index: usize,
    strong: Option<&StrongDigests>,
    payload_check: Option<PayloadCheck>,
) -> LinkStatus {
    let e = &file.directory.entries[index];
    let bytes = file.tensor_bytes(e);
    let mut status = digests::and_strong(
        check_hash(e.hash, bytes),
        strong.and_then(|d| d.tensors.get(index)),
        bytes,
    );
    if status == LinkStatus::Ok {
        if let Some(check) = payload_check {
            if let Err(reason) = check(e.dtype, &e.shape, bytes) {
                status = LinkStatus::Invalid { reason };
            }
        }
    }
    status
}

/// The strong digests of `file` (what [`verify`] checks tensors against): `Ok(None)`
/// when it has none, an error when the field is malformed or does not fit the directory.
pub fn strong_digests_of(file: &CmfFile) -> Result<Option<StrongDigests>, String> {
    match StrongDigests::of_header(&file.header) {
        None => Ok(None),
        Some(Ok(d)) if d.tensors.len() == file.directory.len() => Ok(Some(d)),
        Some(Ok(d)) => Err(format!(
            "{} tensor digests for {} directory entries",
            d.tensors.len(),
            file.directory.len()
        )),
        Some(Err(e)) => Err(e),
    }
}

/// Runs the whole chain on an open file.
pub fn verify(
    file: &CmfFile,
    opts: &VerifyOptions,
    on_event: &(dyn Fn(VerifyEvent) + Sync),
) -> VerifyReport {
    let env = &file.envelope;
    let entries = &file.directory.entries;
    let tensor_bytes: u64 = entries.iter().map(|e| e.nbytes).sum();
    on_event(VerifyEvent::Started {
        tensors: entries.len(),
        tensor_bytes,
    });
    let mut links: Vec<LinkResult> = Vec::new();
    let push = |links: &mut Vec<LinkResult>, link: Link, status: LinkStatus| {
        let r = LinkResult { link, status };
        on_event(VerifyEvent::Checked(r.clone()));
        links.push(r);
    };
    // The strong digests, when the header has them and they fit the directory; a
    // malformed field is a failed link of its own (pushed after the header's).
    let (strong, strong_problem) = match strong_digests_of(file) {
        Ok(d) => (d, None),
        Err(e) => (None, Some(e)),
    };
    // Header and directory: hashes live in the envelope's reserved bytes.
    for (link, kind, expected) in [
        (Link::Header, SectionKind::Header, env.header_hash),
        (Link::Directory, SectionKind::Directory, env.dir_hash),
    ] {
        let bytes = file.section_bytes(kind);
        let status = if expected == 0 {
            LinkStatus::Unchecked {
                reason: "the envelope records no hash (0)".into(),
            }
        } else {
            check_hash(expected, bytes)
        };
        let status = match (&link, &strong) {
            (Link::Directory, Some(d)) => digests::and_strong(status, Some(&d.directory), bytes),
            _ => status,
        };
        push(&mut links, link, status);
    }
    if let Some(reason) = strong_problem {
        push(
            &mut links,
            Link::StrongDigests,
            LinkStatus::Invalid { reason },
        );
    }
    // Masks, vocab, index: hashes in the header (covered by the header hash).
    let hashes = file.header.section_hashes.as_ref();
    for kind in [SectionKind::Masks, SectionKind::Vocab, SectionKind::Index] {
        let recorded = hashes.and_then(|h| match kind {
            SectionKind::Masks => h.masks.as_deref(),
            SectionKind::Vocab => h.vocab.as_deref(),
            _ => h.index.as_deref(),
        });
        if !env.section(kind).is_present() {
            // The hashed header promises a section the envelope lacks: it was cut out
            // (offset and length zeroed), which no hash of the remaining bytes can see.
            if file.section_cut_out(kind) {
                let reason = "recorded in the hashed header, absent from the envelope \
                              (offset and length 0): cut out of the file";
                push(
                    &mut links,
                    Link::Section { section: kind },
                    LinkStatus::Invalid {
                        reason: reason.into(),
                    },
                );
            }
            continue;
        }
        let status = match recorded {
            None => LinkStatus::Unchecked {
                reason: "section_hashes has no entry for it".into(),
            },
            Some(hex) => match parse_hex16(hex) {
                Some(h) => check_hash(h, file.section_bytes(kind)),
                None => LinkStatus::Invalid {
                    reason: format!("recorded hash {hex:?} is not 16 hex digits"),
                },
            },
        };
        let status = match &strong {
            Some(d) => {
                let recorded = match kind {
                    SectionKind::Masks => d.masks.as_ref(),
                    SectionKind::Vocab => d.vocab.as_ref(),
                    _ => d.index.as_ref(),
                };
                match recorded {
                    Some(_) => digests::and_strong(status, recorded, file.section_bytes(kind)),
                    None if status == LinkStatus::Ok => LinkStatus::Invalid {
                        reason: "strong_digests has no digest for this section".into(),
                    },
                    None => status,
                }
            }
            None => status,
        };
        push(&mut links, Link::Section { section: kind }, status);
    }

    // Tensors: in parallel, largest first for balance; results put back in directory order.
    let done = AtomicU64::new(0);
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(entries[i].nbytes));
    let cancelled = || opts.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
    let mut results: Vec<(usize, Option<LinkStatus>)> = order
        .par_iter()
        .map(|&i| {
            if cancelled() || opts.skip_tensors {
                return (i, None);
            }
            let e = &entries[i];
            let status = check_tensor(file, i, strong.as_ref(), opts.payload_check);
            let d = done.fetch_add(e.nbytes, Ordering::Relaxed) + e.nbytes;
            on_event(VerifyEvent::Checked(LinkResult {
                link: Link::Tensor {
                    index: i,
                    name: e.name.clone(),
                },
                status: status.clone(),
            }));
            on_event(VerifyEvent::Progress {
                bytes_done: d,
                bytes_total: tensor_bytes,
            });
            (i, Some(status))
        })
        .collect();
    results.sort_by_key(|r| r.0);
    let mut tensors_checked = 0;
    for (i, status) in results {
        if let Some(status) = status {
            tensors_checked += 1;
            links.push(LinkResult {
                link: Link::Tensor {
                    index: i,
                    name: entries[i].name.clone(),
                },
                status,
            });
        }
    }
    let was_cancelled = cancelled();

    let mut sig_status = None;
    if opts.signature && !was_cancelled {
        if let Some(path) = &file.path {
            let st = signature::check_detached(path, file.bytes(), &opts.trusted_keys);
            let status = st.link_status();
            on_event(VerifyEvent::Checked(LinkResult {
                link: Link::Signature,
                status: status.clone(),
            }));
            links.push(LinkResult {
                link: Link::Signature,
                status,
            });
            sig_status = Some(st);
        }
    }

    let unhashed: Vec<String> = links
        .iter()
        .filter(|l| l.is_unhashed())
        .map(|l| l.link.describe())
        .collect();
    let failures: Vec<LinkResult> = links
        .iter()
        .filter(|l| l.status.is_failure() || (opts.strict && l.is_unhashed()))
        .cloned()
        .collect();
    on_event(VerifyEvent::Finished);
    VerifyReport {
        ok: failures.is_empty() && !was_cancelled,
        cancelled: was_cancelled,
        first_failure: failures.first().cloned(),
        failures,
        links,
        signature: sig_status,
        tensors_checked,
        bytes_hashed: done.load(Ordering::Relaxed),
        unhashed,
        strong_digests: strong.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_hash_equals_serial() {
        for len in [0usize, 7, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 13] {
            let data: Vec<u8> = (0..len)
                .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
                .collect();
            assert_eq!(hash64_parallel(&data), hash64(&data), "len {len}");
        }
    }
}
