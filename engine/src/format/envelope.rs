//! The fixed 128-byte envelope (spec §1) and the section bounds rules of §1.2.

use super::error::{bounds, FormatError, Result};

pub const MAGIC: [u8; 4] = *b"CMF\x01";
pub const VERSION: u32 = 2;
pub const ENVELOPE_LEN: u64 = 128;
pub const DATA_ALIGN: u64 = 4096;
pub const TENSOR_ALIGN: u64 = 64;

/// `required_features` bits (§1.1).
pub mod feature {
    pub const TENSOR_DIR: u32 = 1 << 0;
    pub const BINARY_MASKS: u32 = 1 << 1;
    pub const QUANT_2F: u32 = 1 << 2;
    pub const DELTA_MASKS: u32 = 1 << 3;
    pub const HOT_PACKS: u32 = 1 << 4;
    pub const LOOP_MASKS: u32 = 1 << 5;
    pub const SKILL_FILE: u32 = 1 << 6;
    /// Bits this reader understands. DELTA_MASKS and HOT_PACKS are reserved by the spec with
    /// no layout, so a file that raises them cannot be read faithfully: they are unknown here.
    pub const KNOWN: u32 = TENSOR_DIR | BINARY_MASKS | QUANT_2F | LOOP_MASKS | SKILL_FILE;

    pub const NAMES: [(u32, &str); 7] = [
        (TENSOR_DIR, "TENSOR_DIR"),
        (BINARY_MASKS, "BINARY_MASKS"),
        (QUANT_2F, "QUANT_2F"),
        (DELTA_MASKS, "DELTA_MASKS"),
        (HOT_PACKS, "HOT_PACKS"),
        (LOOP_MASKS, "LOOP_MASKS"),
        (SKILL_FILE, "SKILL_FILE"),
    ];

    /// Names of the set bits; unknown bits as `bitN`.
    pub fn names(bits: u32) -> Vec<String> {
        (0..32)
            .filter(|b| bits & (1 << b) != 0)
            .map(|b| {
                NAMES
                    .iter()
                    .find(|(v, _)| *v == 1 << b)
                    .map(|(_, n)| n.to_string())
                    .unwrap_or_else(|| format!("bit{b}"))
            })
            .collect()
    }
}

/// One section of the file: `[off, off + len)`; `len == 0` means absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Section {
    pub off: u64,
    pub len: u64,
}

impl Section {
    pub fn is_present(&self) -> bool {
        self.len > 0
    }
    /// End offset; only call after [`Envelope::parse`] validated it.
    pub fn end(&self) -> u64 {
        self.off + self.len
    }
}

/// The section kinds, in the spec's on-disk order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SectionKind {
    Header,
    Directory,
    Data,
    Masks,
    Vocab,
    Index,
}

impl SectionKind {
    pub const ALL: [SectionKind; 6] = [
        SectionKind::Header,
        SectionKind::Directory,
        SectionKind::Data,
        SectionKind::Masks,
        SectionKind::Vocab,
        SectionKind::Index,
    ];
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Header => "header",
            SectionKind::Directory => "directory",
            SectionKind::Data => "data",
            SectionKind::Masks => "masks",
            SectionKind::Vocab => "vocab",
            SectionKind::Index => "index",
        }
    }
}

/// The decoded envelope. Offsets are absolute file offsets.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Envelope {
    pub version: u32,
    pub flags: u32,
    pub required_features: u32,
    pub header: Section,
    pub directory: Section,
    pub data: Section,
    pub masks: Section,
    pub vocab: Section,
    pub index: Section,
    /// hash64 of the header JSON (`[0x70..0x78]`), 0 = absent.
    pub header_hash: u64,
    /// hash64 of the directory section (`[0x78..0x80]`), 0 = absent.
    pub dir_hash: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

impl Envelope {
    pub fn section(&self, kind: SectionKind) -> Section {
        match kind {
            SectionKind::Header => self.header,
            SectionKind::Directory => self.directory,
            SectionKind::Data => self.data,
            SectionKind::Masks => self.masks,
            SectionKind::Vocab => self.vocab,
            SectionKind::Index => self.index,
        }
    }

    /// Parses and validates the envelope of a file of `file_len` bytes whose first bytes are
    /// `bytes`. Checks, in this order: magic, version, features, then every section's bounds.
    pub fn parse(bytes: &[u8], file_len: u64) -> Result<Envelope> {
        if bytes.len() < 4 || bytes[..4] != MAGIC {
            let got = &bytes[..bytes.len().min(4)];
            return Err(FormatError::InvalidMagic(format!(
                "expected CMF\\x01, found {}",
                crate::format::escape_bytes(got)
            )));
        }
        if bytes.len() < ENVELOPE_LEN as usize {
            return Err(bounds(format!(
                "file is {} bytes, shorter than the 128-byte envelope",
                bytes.len()
            )));
        }
        let version = u32_at(bytes, 4);
        if version != VERSION {
            return Err(FormatError::UnsupportedVersion(format!(
                "version {version}; this reader reads CMF version 2"
            )));
        }
        let required_features = u32_at(bytes, 0x0C);
        let unknown = required_features & !feature::KNOWN;
        if unknown != 0 {
            return Err(FormatError::UnsupportedFeature(format!(
                "required_features has bits this reader does not support: {} (0x{unknown:x})",
                feature::names(unknown).join(", ")
            )));
        }
        let sec = |at: usize| Section {
            off: u64_at(bytes, at),
            len: u64_at(bytes, at + 8),
        };
        let env = Envelope {
            version,
            flags: u32_at(bytes, 8),
            required_features,
            header: sec(0x10),
            directory: sec(0x20),
            data: sec(0x30),
            masks: sec(0x40),
            vocab: sec(0x50),
            index: sec(0x60),
            header_hash: u64_at(bytes, 0x70),
            dir_hash: u64_at(bytes, 0x78),
        };
        env.check_bounds(file_len)?;
        Ok(env)
    }

    fn check_bounds(&self, file_len: u64) -> Result<()> {
        let mut present: Vec<(SectionKind, Section)> = Vec::new();
        for kind in SectionKind::ALL {
            let s = self.section(kind);
            let optional = matches!(
                kind,
                SectionKind::Masks | SectionKind::Vocab | SectionKind::Index
            );
            if optional && s.off == 0 && s.len != 0 {
                return Err(bounds(format!(
                    "{} section has offset 0 (absent) but length {}",
                    kind.name(),
                    s.len
                )));
            }
            if !optional && kind != SectionKind::Data && s.len == 0 {
                return Err(bounds(format!("{} section is empty", kind.name())));
            }
            let end = s.off.checked_add(s.len).ok_or_else(|| {
                bounds(format!(
                    "{} section offset {} + length {} overflows",
                    kind.name(),
                    s.off,
                    s.len
                ))
            })?;
            if end > file_len {
                return Err(bounds(format!(
                    "{} section [{}, {}) runs past the end of the file ({} bytes)",
                    kind.name(),
                    s.off,
                    end,
                    file_len
                )));
            }
            if s.len > 0 && s.off < ENVELOPE_LEN {
                return Err(bounds(format!(
                    "{} section at offset {} overlaps the envelope",
                    kind.name(),
                    s.off
                )));
            }
            if s.len > 0 {
                present.push((kind, s));
            }
        }
        if !self.data.off.is_multiple_of(DATA_ALIGN) {
            return Err(bounds(format!(
                "data_off {} is not a multiple of 4096",
                self.data.off
            )));
        }
        present.sort_by_key(|(_, s)| s.off);
        for w in present.windows(2) {
            let ((ka, a), (kb, b)) = (w[0], w[1]);
            if a.end() > b.off {
                return Err(bounds(format!(
                    "{} section [{}, {}) overlaps {} section [{}, {})",
                    ka.name(),
                    a.off,
                    a.end(),
                    kb.name(),
                    b.off,
                    b.end()
                )));
            }
        }
        Ok(())
    }

    /// The 128 envelope bytes.
    pub fn to_bytes(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        b[..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&self.version.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.required_features.to_le_bytes());
        for (i, kind) in SectionKind::ALL.iter().enumerate() {
            let s = self.section(*kind);
            let at = 0x10 + i * 16;
            b[at..at + 8].copy_from_slice(&s.off.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&s.len.to_le_bytes());
        }
        b[0x70..0x78].copy_from_slice(&self.header_hash.to_le_bytes());
        b[0x78..0x80].copy_from_slice(&self.dir_hash.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        Envelope {
            version: 2,
            flags: 0,
            required_features: feature::TENSOR_DIR,
            header: Section { off: 128, len: 100 },
            directory: Section { off: 228, len: 16 },
            data: Section { off: 4096, len: 64 },
            ..Default::default()
        }
    }

    #[test]
    fn round_trip() {
        let e = sample();
        let b = e.to_bytes();
        assert_eq!(Envelope::parse(&b, 4160).unwrap(), e);
    }

    #[test]
    fn each_rule_has_its_kind() {
        use crate::format::ErrorKind::*;
        let kind = |b: &[u8], len| Envelope::parse(b, len).unwrap_err().kind();
        let good = sample().to_bytes();
        let mut b = good;
        b[0] = b'X';
        assert_eq!(kind(&b, 4160), InvalidMagic);
        let mut b = good;
        b[4] = 1;
        assert_eq!(kind(&b, 4160), UnsupportedVersion);
        let mut b = good;
        b[12] |= 1 << 3;
        assert_eq!(kind(&b, 4160), UnsupportedFeature);
        assert_eq!(kind(&good, 4159), Bounds);
        let mut e = sample();
        e.data.off = 4000;
        assert_eq!(kind(&e.to_bytes(), 8192), Bounds);
        let mut e = sample();
        e.directory.len = 4000; // runs into data
        assert_eq!(kind(&e.to_bytes(), 8192), Bounds);
        let mut e = sample();
        e.masks = Section {
            off: u64::MAX,
            len: 2,
        };
        assert_eq!(kind(&e.to_bytes(), 8192), Bounds);
        assert_eq!(kind(&good[..50], 50), Bounds);
        assert_eq!(kind(b"CM", 2), InvalidMagic);
    }
}
