//! An open CMF file: the mmap plus everything validated at open (envelope, header,
//! directory, masks, sparse index). Opening reads no tensor byte.

use std::ops::Deref;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::directory::{Directory, TensorEntry};
use super::envelope::{feature, Envelope, Section, SectionKind, ENVELOPE_LEN};
use super::error::{parse, FormatError, Result};
use super::header::Header;
use super::index::{parse_index, IndexEntry};
use super::masks::{MaskView, Masks};

/// The file's bytes: a read-only mmap, or owned bytes (tests, fuzzing, in-memory builds).
pub enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// One `.cmf` file (a whole model, a shard, or a skill file).
pub struct CmfFile {
    pub path: Option<PathBuf>,
    bytes: Backing,
    pub envelope: Envelope,
    pub header: Header,
    /// The header as parsed JSON, unknown fields included, in file order.
    pub header_value: Value,
    pub directory: Directory,
    pub masks: Option<Masks>,
    pub index: Option<Vec<IndexEntry>>,
    /// Things that are legal but worth telling a user (reserved flags set, a hash for an
    /// absent section, feature bits that disagree with the content).
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for CmfFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmfFile")
            .field("path", &self.path)
            .field("tensors", &self.directory.len())
            .finish()
    }
}

/// Lets the kernel drop the mapped pages of `map[start..end]` once their contents were
/// copied out, so a process's resident memory does not hold bytes it no longer reads (an
/// importer's tensors once converted, a matrix the engine repacked at load). Only whole
/// pages inside the range are released; the pages are clean and file-backed, so a later
/// read faults them back in.
pub(crate) fn release_pages(map: &memmap2::Mmap, start: u64, end: u64) {
    #[cfg(unix)]
    {
        const PAGE: u64 = 4096;
        let (a, b) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
        if b > a && b <= map.len() as u64 {
            // SAFETY: MADV_DONTNEED on a private read-only file mapping only discards
            // page-table entries; the data stays in the file and reads see the same bytes.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    a as usize,
                    (b - a) as usize,
                )
            };
        }
    }
    #[cfg(not(unix))]
    let _ = (map, start, end);
}

/// Asks Linux to back the mapping with 2 MiB pages (`MADV_HUGEPAGE`), a hint that changes
/// no byte. Decode reads every weight once per token, so with 4 KiB pages each token walks
/// the page tables once per 4 KiB of weights, and in a VM (nested paging) a walk is dear.
/// With the hint, a page-cache miss reads a 2 MiB folio, which the mapping then maps as
/// one page: on the Intel Xeon VM of docs/bench/inference.md (Linux 6.18, ext4), the
/// page cache emptied before each run, Qwen2.5-Coder-0.5B `q8_row` decoded at 52.9–53.7
/// tok/s against 45.2 (`FilePmdMapped` 499–526 MiB of the 472 MiB of weights against
/// 22 MiB). Pages already cached stay as they were read or written: a `read()` of the
/// whole file leaves large folios, and so does this crate's writer (whole 2 MiB writes,
/// `writer::ChunkWriter`). The hint is ignored where transparent huge pages are off.
fn advise_huge_pages(map: &memmap2::Mmap) {
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

impl CmfFile {
    /// Opens and validates a file. The mapping is read-only; as with any mmap, a file
    /// truncated by another process while open may fault — the format gives no defence
    /// against concurrent writers, and `verify` re-reads everything it checks.
    pub fn open(path: impl AsRef<Path>) -> Result<CmfFile> {
        let path = path.as_ref();
        let file = std::fs::File::open(path)
            .map_err(|e| FormatError::io(format!("open {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| FormatError::io(format!("stat {}", path.display()), e))?
            .len();
        let bytes = if len < ENVELOPE_LEN {
            // Too short to be valid; read it so the error names what is there.
            Backing::Owned(
                std::fs::read(path)
                    .map_err(|e| FormatError::io(format!("read {}", path.display()), e))?,
            )
        } else {
            // SAFETY: read-only private mapping of a regular file; see the doc comment.
            let map = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| FormatError::io(format!("mmap {}", path.display()), e))?;
            advise_huge_pages(&map);
            Backing::Mmap(map)
        };
        let mut f = CmfFile::from_backing(bytes)?;
        f.path = Some(path.to_path_buf());
        Ok(f)
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<CmfFile> {
        CmfFile::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(bytes: Backing) -> Result<CmfFile> {
        let envelope = Envelope::parse(
            &bytes[..bytes.len().min(ENVELOPE_LEN as usize)],
            bytes.len() as u64,
        )?;
        let sec = |s: Section| &bytes[s.off as usize..s.end() as usize];
        let (header, header_value) = Header::parse(sec(envelope.header))?;
        let directory = Directory::parse(sec(envelope.directory), envelope.data.len)?;
        let masks = if envelope.masks.is_present() {
            let loop_masks = envelope.required_features & feature::LOOP_MASKS != 0;
            Some(Masks::parse(
                sec(envelope.masks),
                header.arch.as_ref(),
                loop_masks,
            )?)
        } else {
            None
        };
        let index = if envelope.index.is_present() {
            Some(parse_index(sec(envelope.index))?)
        } else {
            None
        };

        let mut warnings = Vec::new();
        let skill_file = envelope.required_features & feature::SKILL_FILE != 0;
        let bound = header
            .skills
            .iter()
            .flatten()
            .any(|s| s.base_dir_hash.is_some());
        if bound && !skill_file {
            return Err(parse(
                "a skill record carries base_dir_hash but required_features lacks SKILL_FILE",
            ));
        }
        if skill_file && !bound {
            return Err(parse(
                "SKILL_FILE is set but no skill record carries base_dir_hash",
            ));
        }
        if envelope.flags != 0 {
            warnings.push(format!(
                "envelope flags are 0x{:x}; the spec reserves them as 0",
                envelope.flags
            ));
        }
        let has_masks_bit = envelope.required_features & feature::BINARY_MASKS != 0;
        if has_masks_bit != masks.is_some() {
            warnings.push(format!(
                "BINARY_MASKS is {} but the masks section is {}",
                if has_masks_bit { "set" } else { "clear" },
                if masks.is_some() { "present" } else { "absent" }
            ));
        }
        let needs_2f = directory.iter().any(|e| e.dtype.needs_quant_2f());
        if needs_2f && envelope.required_features & feature::QUANT_2F == 0 {
            warnings.push("the directory has q8_2f/vbit tensors but QUANT_2F is not set".into());
        }
        let mut file = CmfFile {
            path: None,
            bytes,
            envelope,
            header,
            header_value,
            directory,
            masks,
            index,
            warnings,
        };
        for kind in [SectionKind::Masks, SectionKind::Vocab, SectionKind::Index] {
            if file.section_cut_out(kind) {
                file.warnings.push(format!(
                    "section_hashes records a hash for the {} section, but the envelope has \
                     none (verify fails it)",
                    kind.name()
                ));
            }
        }
        Ok(file)
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Lets the OS drop the mapped pages of `bytes()[range]` (whole pages inside it): for
    /// bytes nothing will read again, such as a matrix the engine repacked at load. A later
    /// read faults them back in from the file; a file read into memory keeps its bytes.
    pub fn release_pages(&self, range: std::ops::Range<usize>) {
        if let Backing::Mmap(map) = &self.bytes {
            release_pages(map, range.start as u64, range.end as u64);
        }
    }

    /// [`CmfFile::release_pages`] over `range` widened to the 2 MiB pages around it, for a
    /// load's peak: the mapping maps the file in 2 MiB pages, and unmapping part of one
    /// leaves the rest of it mapped, so a model repacked tensor by tensor would otherwise
    /// keep the neighbours' shares of each page until the end of the load. The
    /// neighbours' bytes stay in the file: a later read maps them back.
    pub fn release_pages_around(&self, range: std::ops::Range<usize>) {
        const HUGE: usize = 2 << 20;
        let end = range.end.next_multiple_of(HUGE).min(self.bytes.len());
        self.release_pages(range.start / HUGE * HUGE..end);
    }

    /// For bytes read a little at a time (an untied embedding, a row per token): asks
    /// Linux to map `bytes()[range]` in 4 KiB pages (`MADV_NOHUGEPAGE`) and drops what is
    /// mapped of it now ([`CmfFile::release_pages_around`]), so that each later read maps
    /// the small pages around it and not the 2 MiB page the file's mapping would otherwise
    /// map whole. (On the Zen 3 VM, a 128-token run of Qwen2.5-Coder-0.5B had 298 of its
    /// 343 MiB of `q4_block` mapped: most of the 130 MiB embedding, in 2 MiB pages.) Linux
    /// 6.18 still maps a read's whole page-cache folio (18.3 MiB of a `q1t` embedding
    /// mapped after a run, 22.0 MiB without the advice), so the model also drops the
    /// pages after each read (`model::linear::Linear::row_in`). A hint: no byte
    /// changes.
    pub fn read_sparsely(&self, range: std::ops::Range<usize>) {
        #[cfg(target_os = "linux")]
        if let Backing::Mmap(map) = &self.bytes {
            const PAGE: usize = 4096;
            let (a, b) = (range.start.next_multiple_of(PAGE), range.end / PAGE * PAGE);
            if b > a && b <= map.len() {
                let _ = map.advise_range(memmap2::Advice::NoHugePage, a, b - a);
            }
        }
        self.release_pages_around(range);
    }

    pub fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn section_bytes(&self, kind: SectionKind) -> &[u8] {
        let s = self.envelope.section(kind);
        &self.bytes[s.off as usize..s.end() as usize]
    }

    /// The stored bytes of a directory entry of this file (bounds checked at open).
    pub fn tensor_bytes(&self, e: &TensorEntry) -> &[u8] {
        let start = (self.envelope.data.off + e.off) as usize;
        &self.bytes[start..start + e.nbytes as usize]
    }

    pub fn tensor(&self, name: &str) -> Option<(&TensorEntry, &[u8])> {
        self.directory.get(name).map(|e| (e, self.tensor_bytes(e)))
    }

    /// The embedded `tokenizer.json` bytes (§6), if any.
    pub fn vocab_bytes(&self) -> Option<&[u8]> {
        self.envelope
            .vocab
            .is_present()
            .then(|| self.section_bytes(SectionKind::Vocab))
    }

    pub fn is_skill_file(&self) -> bool {
        self.envelope.required_features & feature::SKILL_FILE != 0
    }

    /// Whether the hashed header records a hash for section `kind` that the envelope
    /// does not have: the section was cut out (offset and length zeroed). Not for a
    /// standalone skill file, whose header is its base's and records the base's sections.
    pub fn section_cut_out(&self, kind: SectionKind) -> bool {
        let recorded = self
            .header
            .section_hashes
            .as_ref()
            .is_some_and(|h| match kind {
                SectionKind::Masks => h.masks.is_some(),
                SectionKind::Vocab => h.vocab.is_some(),
                SectionKind::Index => h.index.is_some(),
                _ => false,
            });
        recorded && !self.envelope.section(kind).is_present() && !self.is_skill_file()
    }

    /// hash64 of the directory section: the identity a standalone skill binds to (§9.1).
    pub fn directory_hash(&self) -> u64 {
        super::hash64(self.section_bytes(SectionKind::Directory))
    }

    pub fn mask_view(&self, i: usize) -> Option<MaskView<'_>> {
        let masks = self.masks.as_ref()?;
        (i < masks.len()).then(|| masks.view(self.section_bytes(SectionKind::Masks), i))
    }

    pub fn mask_by_name(&self, name: &str) -> Option<MaskView<'_>> {
        self.mask_view(self.masks.as_ref()?.find(name)?)
    }

    /// The §12 pipeline namespaces present (`te`, `dit`, `vae`, ...): prefixes that carry a
    /// `{prefix}.config_json` tensor.
    pub fn pipeline_components(&self) -> Vec<String> {
        self.directory
            .iter()
            .filter_map(|e| e.name.strip_suffix(".config_json").map(str::to_string))
            .collect()
    }
}
