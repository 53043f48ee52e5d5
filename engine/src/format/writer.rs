//! Writing CMF files: a streaming writer (tensors arrive one at a time, memory bounded by
//! one tensor), `compact` (a plain tight rewrite), sharded output (§10) and the atomic
//! write helper. Every writer writes a temporary file beside the target and renames it
//! into place only when complete, so a failed or interrupted write leaves nothing behind.
//!
//! Layout: envelope, header, directory, zero padding to a 4096 boundary, tensors each at
//! a 64-byte boundary, then masks, vocab, index (each at an 8-byte boundary). The header
//! and directory sizes are known up front (names, dtypes and shapes are planned before the
//! data; the directory's variable fields are fixed width), so the directory is written
//! into its reserved slot at the end and the envelope last.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::digests::{self, StrongDigests};
use super::directory::{Directory, TensorEntry, RECORD_LEN};
use super::dtype::{DType, Size};
use super::envelope::{
    feature, Envelope, Section, SectionKind, DATA_ALIGN, ENVELOPE_LEN, TENSOR_ALIGN, VERSION,
};
use super::error::{bounds, parse, FormatError, Result};
use super::file::CmfFile;
use super::hash64::{hash64, hex16, Hash64};
use super::header::{Header, SectionHashes, ShardInfo};

/// A tensor to be written: its directory identity; bytes come later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

/// Everything but the tensor bytes.
#[derive(Clone, Debug, Default)]
pub struct WriteSpec {
    /// `section_hashes` is recomputed by the writer; everything else is written as given.
    pub header: Header,
    pub tensors: Vec<TensorPlan>,
    /// A complete masks section (see [`super::masks::build_section`]).
    pub masks: Option<Vec<u8>>,
    /// `tokenizer.json` bytes.
    pub vocab: Option<Vec<u8>>,
    /// A sparse index section to carry through unchanged (the spec deprecates writing new ones).
    pub index: Option<Vec<u8>>,
    /// Feature bits the content itself does not imply (LOOP_MASKS, SKILL_FILE).
    pub extra_features: u32,
}

/// What a finished write produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WriteSummary {
    pub path: PathBuf,
    pub bytes: u64,
    pub tensors: usize,
    pub data_off: u64,
    pub header_hash: u64,
    pub dir_hash: u64,
}

fn io(path: &Path, what: &str) -> impl FnOnce(std::io::Error) -> FormatError {
    let what = format!("{what} {}", path.display());
    move |e| FormatError::io(what, e)
}

/// A temporary file in the target's directory, renamed onto the target by `commit`.
pub(crate) struct TempTarget {
    tmp: tempfile::NamedTempFile,
    target: PathBuf,
}

impl TempTarget {
    pub(crate) fn new(target: &Path) -> Result<TempTarget> {
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".cortiq-")
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(io(dir, "create a temporary file in"))?;
        Ok(TempTarget {
            tmp,
            target: target.to_path_buf(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        self.tmp.path()
    }

    pub(crate) fn commit(self) -> Result<()> {
        self.tmp
            .as_file()
            .sync_all()
            .map_err(io(&self.target, "sync"))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // tempfile creates 0600; a model file is an ordinary readable file.
            std::fs::set_permissions(self.tmp.path(), std::fs::Permissions::from_mode(0o644))
                .map_err(io(&self.target, "set permissions on"))?;
        }
        let target = self.target.clone();
        self.tmp
            .persist(&target)
            .map_err(|e| FormatError::io(format!("rename onto {}", target.display()), e.error))?;
        sync_parent_dir(&target)
    }
}

/// Makes a rename onto `target` durable: the new directory entry lives in the directory,
/// which a crash can lose unless it is synced too (the file's own `fsync` does not cover
/// it). Unix only; elsewhere the rename is left to the system.
pub(crate) fn sync_parent_dir(target: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir, "sync the directory"))?;
    }
    #[cfg(not(unix))]
    let _ = target;
    Ok(())
}

/// A complete file still under its temporary name; dropping it deletes it.
pub struct PendingFile(TempTarget);

impl PendingFile {
    /// Renames the file into place.
    pub fn commit(self) -> Result<()> {
        self.0.commit()
    }
}

/// Writes `bytes` to `path` atomically (temporary file + rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let t = TempTarget::new(path)?;
    t.tmp
        .as_file()
        .write_all(bytes)
        .map_err(io(path, "write"))?;
    t.commit()
}

/// Streams one CMF file. Call [`StreamWriter::write_tensor`] once per planned tensor, in
/// plan order, then [`StreamWriter::finish`].
pub struct StreamWriter {
    out: ChunkWriter<File>,
    target: TempTarget,
    plan: Vec<TensorPlan>,
    entries: Vec<TensorEntry>,
    /// The header, written first with placeholder strong digests ([`digests`]) that
    /// `finish` fills in (the same length, so nothing after it moves).
    header: Header,
    digests: StrongDigests,
    header_bytes: Vec<u8>,
    dir_off: u64,
    dir_len: u64,
    data_off: u64,
    /// Absolute position of the next byte.
    pos: u64,
    masks: Option<Vec<u8>>,
    vocab: Option<Vec<u8>>,
    index: Option<Vec<u8>>,
    extra_features: u32,
}

impl StreamWriter {
    pub fn create(path: &Path, mut spec: WriteSpec) -> Result<StreamWriter> {
        for p in &spec.tensors {
            if p.shape.is_empty() || p.shape.len() > 6 {
                return Err(parse(format!("tensor {:?}: ndim must be 1..=6", p.name)));
            }
            if p.shape.iter().any(|&d| d > u32::MAX as u64) {
                return Err(bounds(format!(
                    "tensor {:?}: a dimension exceeds u32",
                    p.name
                )));
            }
            if p.name.len() > u16::MAX as usize {
                return Err(bounds(format!(
                    "tensor name of {} bytes exceeds u16",
                    p.name.len()
                )));
            }
            if p.dtype.is_reserved() {
                return Err(FormatError::UnsupportedFeature(format!(
                    "tensor {:?}: dtype {} is reserved by the spec and cannot be written",
                    p.name, p.dtype
                )));
            }
            p.dtype
                .size_for(&p.shape)
                .map_err(|e| parse(format!("tensor {:?}: {e}", p.name)))?;
        }
        let names: std::collections::HashSet<&str> =
            spec.tensors.iter().map(|p| p.name.as_str()).collect();
        if names.len() != spec.tensors.len() {
            return Err(parse("two planned tensors share a name"));
        }
        // Section hashes: recomputed from the bytes being written, other keys kept.
        let mut sh = spec.header.section_hashes.take().unwrap_or_default();
        sh.masks = spec.masks.as_deref().map(|b| hex16(hash64(b)));
        sh.vocab = spec.vocab.as_deref().map(|b| hex16(hash64(b)));
        sh.index = spec.index.as_deref().map(|b| hex16(hash64(b)));
        let empty = SectionHashes::default();
        spec.header.section_hashes = (sh != empty).then_some(sh);
        let strong = |b: &Option<Vec<u8>>| b.as_deref().map(digests::digest);
        let digests = StrongDigests {
            alg: digests::ALG.into(),
            directory: digests::placeholder(),
            masks: strong(&spec.masks),
            vocab: strong(&spec.vocab),
            index: strong(&spec.index),
            tensors: Vec::with_capacity(spec.tensors.len()),
        };
        let mut placeheld = digests.clone();
        placeheld.tensors = vec![digests::placeholder(); spec.tensors.len()];
        placeheld.put(&mut spec.header);
        let header_bytes = spec.header.to_bytes();

        let names_len: u64 = spec.tensors.iter().map(|p| p.name.len() as u64).sum();
        let dir_len = 16 + RECORD_LEN * spec.tensors.len() as u64 + names_len;
        let dir_off = ENVELOPE_LEN + header_bytes.len() as u64;
        let data_off = (dir_off + dir_len).next_multiple_of(DATA_ALIGN);

        let target = TempTarget::new(path)?;
        let file = target.tmp.reopen().map_err(io(path, "open"))?;
        let mut out = ChunkWriter::new(file);
        // Envelope and directory are placeholders until `finish`.
        out.write_all(&[0u8; ENVELOPE_LEN as usize])
            .map_err(io(path, "write"))?;
        out.write_all(&header_bytes).map_err(io(path, "write"))?;
        write_zeros(&mut out, data_off - dir_off).map_err(io(path, "write"))?;
        Ok(StreamWriter {
            out,
            target,
            plan: spec.tensors,
            entries: Vec::new(),
            header: spec.header,
            digests,
            header_bytes,
            dir_off,
            dir_len,
            data_off,
            pos: data_off,
            masks: spec.masks,
            vocab: spec.vocab,
            index: spec.index,
            extra_features: spec.extra_features,
        })
    }

    /// The plan entry the next `write_tensor` call is for.
    pub fn next_plan(&self) -> Option<&TensorPlan> {
        self.plan.get(self.entries.len())
    }

    /// Writes the next planned tensor's payload.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        self.write_tensor_parts(&[bytes])
    }

    /// Writes the next planned tensor from several pieces (e.g. a codec's sections).
    pub fn write_tensor_parts(&mut self, parts: &[&[u8]]) -> Result<()> {
        let i = self.entries.len();
        let plan = self
            .plan
            .get(i)
            .ok_or_else(|| bounds("more tensors written than planned"))?
            .clone();
        let nbytes: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let fits = match plan.dtype.size_for(&plan.shape).map_err(parse)? {
            Size::Exact(n) => nbytes == n,
            Size::AtLeast(n) => nbytes >= n,
            Size::Opaque => true,
        };
        if !fits {
            return Err(bounds(format!(
                "tensor {:?}: {} payload of {nbytes} bytes does not fit {} {:?}",
                plan.name, plan.dtype, plan.dtype, plan.shape
            )));
        }
        let path = self.target.target.clone();
        let start = self.pos.next_multiple_of(TENSOR_ALIGN);
        write_zeros(&mut self.out, start - self.pos).map_err(io(&path, "write"))?;
        let mut h = Hash64::new();
        let mut strong = blake3::Hasher::new();
        for p in parts {
            h.update(p);
            strong.update(p);
            self.out.write_all(p).map_err(io(&path, "write"))?;
        }
        self.digests
            .tensors
            .push(strong.finalize().to_hex().to_string());
        self.pos = start + nbytes;
        self.entries.push(TensorEntry {
            name: plan.name,
            dtype: plan.dtype,
            shape: plan.shape,
            off: start - self.data_off,
            nbytes,
            hash: h.finish(),
        });
        Ok(())
    }

    /// Writes the trailing sections, the directory and the envelope; renames into place.
    pub fn finish(self) -> Result<WriteSummary> {
        let (summary, pending) = self.finish_pending()?;
        pending.commit()?;
        Ok(summary)
    }

    /// Like [`StreamWriter::finish`], but leaves the complete file under its temporary name
    /// until [`PendingFile::commit`]: a set of files (shards) then appears all at once or
    /// not at all.
    pub fn finish_pending(mut self) -> Result<(WriteSummary, PendingFile)> {
        let path = self.target.target.clone();
        if self.entries.len() != self.plan.len() {
            return Err(bounds(format!(
                "{} of {} planned tensors were written",
                self.entries.len(),
                self.plan.len()
            )));
        }
        let data = Section {
            off: self.data_off,
            len: self.pos - self.data_off,
        };
        let section = |bytes: &Option<Vec<u8>>,
                       out: &mut ChunkWriter<File>,
                       pos: &mut u64|
         -> Result<Section> {
            match bytes {
                Some(b) if !b.is_empty() => {
                    let start = pos.next_multiple_of(8);
                    write_zeros(out, start - *pos).map_err(io(&path, "write"))?;
                    out.write_all(b).map_err(io(&path, "write"))?;
                    *pos = start + b.len() as u64;
                    Ok(Section {
                        off: start,
                        len: b.len() as u64,
                    })
                }
                _ => Ok(Section::default()),
            }
        };
        let mut pos = self.pos;
        let masks = section(&self.masks, &mut self.out, &mut pos)?;
        let vocab = section(&self.vocab, &mut self.out, &mut pos)?;
        let index = section(&self.index, &mut self.out, &mut pos)?;

        let dir_bytes = Directory::new(std::mem::take(&mut self.entries))?.to_bytes();
        debug_assert_eq!(dir_bytes.len() as u64, self.dir_len);
        self.digests.directory = digests::digest(&dir_bytes);
        self.digests.put(&mut self.header);
        let header_bytes = self.header.to_bytes();
        if header_bytes.len() != self.header_bytes.len() {
            // Equal-length hex strings in place of the placeholders cannot change it.
            return Err(bounds(format!(
                "the header changed length ({} -> {} bytes) when its digests were filled in",
                self.header_bytes.len(),
                header_bytes.len()
            )));
        }
        self.header_bytes = header_bytes;
        let mut features = feature::TENSOR_DIR | self.extra_features;
        let dir = Directory::parse(&dir_bytes, data.len)?;
        if masks.is_present() {
            features |= feature::BINARY_MASKS;
        }
        if dir.iter().any(|e| e.dtype.needs_quant_2f()) {
            features |= feature::QUANT_2F;
        }
        let env = Envelope {
            version: VERSION,
            flags: 0,
            required_features: features,
            header: Section {
                off: ENVELOPE_LEN,
                len: self.header_bytes.len() as u64,
            },
            directory: Section {
                off: self.dir_off,
                len: self.dir_len,
            },
            data,
            masks,
            vocab,
            index,
            header_hash: hash64(&self.header_bytes),
            dir_hash: hash64(&dir_bytes),
        };
        self.out.flush().map_err(io(&path, "write"))?;
        let file = self.out.into_inner().map_err(io(&path, "write"))?;
        (&file)
            .seek(SeekFrom::Start(ENVELOPE_LEN))
            .map_err(io(&path, "seek"))?;
        (&file)
            .write_all(&self.header_bytes)
            .map_err(io(&path, "write"))?;
        debug_assert_eq!(ENVELOPE_LEN + self.header_bytes.len() as u64, self.dir_off);
        (&file).write_all(&dir_bytes).map_err(io(&path, "write"))?;
        (&file)
            .seek(SeekFrom::Start(0))
            .map_err(io(&path, "seek"))?;
        (&file)
            .write_all(&env.to_bytes())
            .map_err(io(&path, "write"))?;
        drop(file);
        let summary = WriteSummary {
            path: path.clone(),
            bytes: pos,
            tensors: dir.len(),
            data_off: self.data_off,
            header_hash: env.header_hash,
            dir_hash: env.dir_hash,
        };
        Ok((summary, PendingFile(self.target)))
    }
}

/// Bytes per write of a [`ChunkWriter`]: the 2 MiB of a huge page.
const CHUNK: usize = 2 << 20;

/// A buffered writer from offset 0 whose writes end at multiples of [`CHUNK`]: whole
/// chunks at 2 MiB offsets, except what a [`Write::flush`] writes early (the next write
/// then fills up to the boundary) and the last. Linux sizes the page-cache folios of a
/// buffered write by the write, so a file written this way is cached in 2 MiB folios,
/// which a reader's mapping maps as huge pages (see `CmfFile::open`). `std::io::BufWriter`
/// flushes whatever it holds when the next write does not fit, at offsets that drift: a
/// model written through it was cached in small folios (12 of 72 MiB mapped in huge
/// pages), and decoding it ran at the speed of 4 KiB pages until the page cache dropped it.
struct ChunkWriter<W: Write> {
    inner: W,
    buf: Vec<u8>,
    /// Bytes handed to `inner` so far.
    written: u64,
}

impl<W: Write> ChunkWriter<W> {
    fn new(inner: W) -> Self {
        ChunkWriter {
            inner,
            buf: Vec::with_capacity(CHUNK),
            written: 0,
        }
    }

    /// Writes out what is buffered and hands back the inner writer.
    fn into_inner(mut self) -> std::io::Result<W> {
        self.flush()?;
        Ok(self.inner)
    }

    /// Bytes from the end of the buffer to the next multiple of [`CHUNK`].
    fn room(&self) -> usize {
        CHUNK - (self.written as usize + self.buf.len()) % CHUNK
    }

    fn write_buffered(&mut self) -> std::io::Result<()> {
        self.inner.write_all(&self.buf)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

impl<W: Write> Write for ChunkWriter<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = self.room();
        let take = data.len().min(room);
        self.buf.extend_from_slice(&data[..take]);
        if take == room {
            self.write_buffered()?;
        }
        Ok(take)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.write_buffered()?;
        self.inner.flush()
    }
}

fn write_zeros(out: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    const Z: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(Z.len() as u64) as usize;
        out.write_all(&Z[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Writes a whole file from a spec and the tensor payloads in plan order.
pub fn write_file<'a>(
    path: &Path,
    spec: WriteSpec,
    payloads: impl IntoIterator<Item = &'a [u8]>,
) -> Result<WriteSummary> {
    let mut w = StreamWriter::create(path, spec)?;
    for p in payloads {
        w.write_tensor(p)?;
    }
    w.finish()
}

/// The spec that rewrites `file` as it is: header, tensors in directory order, masks,
/// vocab and index sections carried through, LOOP_MASKS and SKILL_FILE kept.
pub fn spec_of(file: &CmfFile) -> WriteSpec {
    let section = |k: SectionKind| {
        file.envelope
            .section(k)
            .is_present()
            .then(|| file.section_bytes(k).to_vec())
    };
    WriteSpec {
        header: file.header.clone(),
        tensors: file
            .directory
            .iter()
            .map(|e| TensorPlan {
                name: e.name.clone(),
                dtype: e.dtype,
                shape: e.shape.clone(),
            })
            .collect(),
        masks: section(SectionKind::Masks),
        vocab: section(SectionKind::Vocab),
        index: section(SectionKind::Index),
        extra_features: file.envelope.required_features
            & (feature::LOOP_MASKS | feature::SKILL_FILE),
    }
}

/// `compact`: a plain tight rewrite of `file` into `out` (dead bytes and gaps dropped).
pub fn compact(file: &CmfFile, out: &Path) -> Result<WriteSummary> {
    let spec = spec_of(file);
    write_file(
        out,
        spec,
        file.directory.iter().map(|e| file.tensor_bytes(e)),
    )
}

/// `{base}-{no:05}-of-{count:05}.cmf` for an output path `base.cmf`.
pub fn shard_name(out: &Path, no: u32, count: u32) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!("{stem}-{no:05}-of-{count:05}.cmf"))
}

/// Splits the plan greedily in order: a new shard starts when the next tensor would take
/// the current one past `max_bytes` of rough f32 size (§10). Returns index ranges.
pub fn plan_shards(tensors: &[TensorPlan], max_bytes: u64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut acc = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let sz = super::dtype::numel(&t.shape)
            .unwrap_or(u64::MAX)
            .saturating_mul(4);
        if i > start && acc.saturating_add(sz) > max_bytes {
            out.push(start..i);
            start = i;
            acc = 0;
        }
        acc = acc.saturating_add(sz);
    }
    if start < tensors.len() || out.is_empty() {
        out.push(start..tensors.len());
    }
    out
}

/// Writes `spec` as shards of at most `max_bytes` (rough f32 size) each. Shard 1 carries
/// masks, vocab, index, the chat bundle and the skills registry; the others carry their own
/// tensors only. `payload(i)` returns the bytes of plan entry `i`. With one shard the
/// output is a plain file at `out`. The shards appear together, when all are complete.
pub fn write_sharded<'a>(
    out: &Path,
    spec: WriteSpec,
    max_bytes: u64,
    mut payload: impl FnMut(usize) -> Result<std::borrow::Cow<'a, [u8]>>,
) -> Result<Vec<WriteSummary>> {
    let ranges = plan_shards(&spec.tensors, max_bytes);
    if ranges.len() == 1 {
        let mut w = StreamWriter::create(out, spec)?;
        for i in 0..w.plan.len() {
            let p = payload(i)?;
            w.write_tensor(&p)?;
        }
        return Ok(vec![w.finish()?]);
    }
    let count = ranges.len() as u32;
    let mut summaries = Vec::new();
    let mut pending = Vec::new();
    for (k, range) in ranges.into_iter().enumerate() {
        let no = k as u32 + 1;
        let mut header = spec.header.clone();
        header.shard = Some(ShardInfo { no, count });
        let first = no == 1;
        if !first {
            header.tokenizer_config = None;
            header.skills = None;
        }
        let shard_spec = WriteSpec {
            header,
            tensors: spec.tensors[range.clone()].to_vec(),
            masks: if first { spec.masks.clone() } else { None },
            vocab: if first { spec.vocab.clone() } else { None },
            index: if first { spec.index.clone() } else { None },
            extra_features: spec.extra_features & !if first { 0 } else { feature::SKILL_FILE },
        };
        let mut w = StreamWriter::create(&shard_name(out, no, count), shard_spec)?;
        for i in range {
            let p = payload(i)?;
            w.write_tensor(&p)?;
        }
        let (summary, file) = w.finish_pending()?;
        summaries.push(summary);
        pending.push(file);
    }
    // Every shard is complete: only now do they take their names, so a failure part-way
    // leaves no partial set behind.
    for file in pending {
        file.commit()?;
    }
    Ok(summaries)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the length of each write it is given.
    #[derive(Default)]
    struct Recorder {
        bytes: Vec<u8>,
        writes: Vec<usize>,
    }

    impl Write for Recorder {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.bytes.extend_from_slice(data);
            self.writes.push(data.len());
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn chunk_writer_writes_whole_aligned_chunks() {
        // Awkward pieces: small ones, one spanning several chunks, an early flush after
        // the fourth, then one ending on a boundary, an empty one, small ones.
        let head = 1 + 4095 + (3 * CHUNK + 17) + 5;
        let sizes = [1usize, 4095, 3 * CHUNK + 17, 5, 4 * CHUNK - head, 999, 0, 7];
        let mut w = ChunkWriter::new(Recorder::default());
        let mut want = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let piece: Vec<u8> = (0..n).map(|k| (k * 31 + i * 7) as u8).collect();
            w.write_all(&piece).unwrap();
            want.extend_from_slice(&piece);
            if i == 3 {
                w.flush().unwrap();
            }
        }
        let r = w.into_inner().unwrap();
        assert_eq!(r.bytes, want);
        // Every write ends at a multiple of CHUNK, but the flushed one and the last, and
        // none crosses one: three whole chunks, the flushed rest, its fill to 4·CHUNK.
        let mut at = 0;
        for (k, &n) in r.writes.iter().enumerate() {
            let end = at + n;
            assert!(
                n > 0 && n <= CHUNK - at % CHUNK,
                "write {k}: {:?}",
                r.writes
            );
            assert!(
                end % CHUNK == 0 || end == head || end == want.len(),
                "write {k} ends at {end}: {:?}",
                r.writes
            );
            at = end;
        }
        let ends: Vec<usize> = r
            .writes
            .iter()
            .scan(0, |at, &n| {
                *at += n;
                Some(*at)
            })
            .collect();
        assert_eq!(
            ends,
            [CHUNK, 2 * CHUNK, 3 * CHUNK, head, 4 * CHUNK, want.len()]
        );
    }
}
