//! Skills (spec §9, §9.1): the registry in the header, replacement tensors named
//! `skill.{id}.{base name}`, append-only growth of a file, and standalone skill files
//! (`SKILL_FILE`) bound to their base by the hash of its directory.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use super::directory::{Directory, TensorEntry};
use super::dtype::{DType, Size};
use super::envelope::{feature, Section, SectionKind, TENSOR_ALIGN};
use super::error::{bounds, parse, FormatError, Result};
use super::file::CmfFile;
use super::hash64::{hash64, hex16, parse_hex16};
use super::header::SkillRecord;
use super::writer::{write_file, TensorPlan, WriteSpec, WriteSummary};

pub const PREFIX: &str = "skill.";

/// `skill.{id}.{base}`.
pub fn skill_tensor_name(id: &str, base: &str) -> String {
    format!("{PREFIX}{id}.{base}")
}

/// The base tensor name a skill tensor replaces, if `name` belongs to skill `id`.
pub fn replaced_name<'a>(name: &'a str, id: &str) -> Option<&'a str> {
    name.strip_prefix(PREFIX)?
        .strip_prefix(id)?
        .strip_prefix('.')
}

/// The directory entries of skill `id` with the base names they replace (a prefix filter:
/// the per-skill delta index of §9 is the directory itself).
pub fn skill_tensors<'a>(file: &'a CmfFile, id: &str) -> Vec<(&'a TensorEntry, &'a str)> {
    file.directory
        .iter()
        .filter_map(|e| replaced_name(&e.name, id).map(|b| (e, b)))
        .collect()
}

/// The `skill.*` entries of a file given to the registry records that own them (same
/// index as `skills`), and those no record claims. When ids nest (`a` and `a.b`), the
/// longest id wins, so no tensor is counted twice.
pub struct SkillOwnership<'a> {
    pub per_skill: Vec<Vec<&'a TensorEntry>>,
    pub orphans: Vec<&'a TensorEntry>,
}

pub fn assign_tensors<'a>(file: &'a CmfFile, skills: &[SkillRecord]) -> SkillOwnership<'a> {
    let mut per_skill = vec![Vec::new(); skills.len()];
    let mut orphans = Vec::new();
    for e in file.directory.iter().filter(|e| e.name.starts_with(PREFIX)) {
        let owner = skills
            .iter()
            .enumerate()
            .filter(|(_, s)| replaced_name(&e.name, &s.id).is_some_and(|b| !b.is_empty()))
            .max_by_key(|(_, s)| s.id.len());
        match owner {
            Some((i, _)) => per_skill[i].push(e),
            None => orphans.push(e),
        }
    }
    SkillOwnership { per_skill, orphans }
}

/// A replacement tensor to add: the base name it replaces and its encoded payload.
pub struct SkillTensor<'a> {
    pub base_name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub bytes: &'a [u8],
}

fn check_new_skill(file: &CmfFile, record: &SkillRecord, tensors: &[SkillTensor]) -> Result<()> {
    if file.is_skill_file() {
        return Err(FormatError::UnsupportedFeature(
            "skills are added to a model, not to a standalone skill file".into(),
        ));
    }
    if record.id.is_empty() || record.id.contains(|c: char| c == '.' || c.is_control()) {
        return Err(parse(format!(
            "skill id {:?} must be non-empty, without dots",
            record.id
        )));
    }
    if record.base_dir_hash.is_some() {
        return Err(parse("a skill added to a model carries no base_dir_hash (that marks a standalone skill file)"));
    }
    if file
        .header
        .skills
        .iter()
        .flatten()
        .any(|s| s.id == record.id)
    {
        return Err(parse(format!(
            "skill {:?} is already in the registry",
            record.id
        )));
    }
    if tensors.is_empty() {
        return Err(parse("a skill needs at least one replacement tensor"));
    }
    for t in tensors {
        let base = file.directory.get(&t.base_name).ok_or_else(|| {
            parse(format!(
                "skill tensor replaces {:?}, which the file does not have",
                t.base_name
            ))
        })?;
        if base.shape != t.shape {
            return Err(parse(format!(
                "skill tensor for {:?} has shape {:?}, the base tensor {:?} (replacements are full-shape)",
                t.base_name, t.shape, base.shape
            )));
        }
        let fits = match t.dtype.size_for(&t.shape).map_err(parse)? {
            Size::Exact(n) => t.bytes.len() as u64 == n,
            Size::AtLeast(n) => t.bytes.len() as u64 >= n,
            Size::Opaque => false,
        };
        if !fits {
            return Err(bounds(format!(
                "skill tensor for {:?}: payload size does not fit {}",
                t.base_name, t.dtype
            )));
        }
        if file
            .directory
            .get(&skill_tensor_name(&record.id, &t.base_name))
            .is_some()
        {
            return Err(parse(format!(
                "tensor {:?} already exists",
                skill_tensor_name(&record.id, &t.base_name)
            )));
        }
    }
    Ok(())
}

/// Bytes an in-place append writes between two [`crash_point`]s.
const APPEND_CHUNK: usize = 64 << 10;

/// Test hook for the promise of [`append_skill_in_place`]: with `CORTIQ_CRASH_AT=N` in
/// the environment the process aborts (no unwinding, no destructors: what a kill leaves)
/// at the N-th step of an append, so a test can stop it at every point and check that
/// the file is still valid. Without the variable it costs one relaxed load.
fn crash_point() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    static STEPS: AtomicU64 = AtomicU64::new(0);
    let at = AT.get_or_init(|| {
        std::env::var("CORTIQ_CRASH_AT")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if let Some(n) = *at {
        if STEPS.fetch_add(1, Ordering::Relaxed) + 1 == n {
            std::process::abort();
        }
    }
}

/// Append-only growth (§9, claim 11) of the file at `path`, in place: new tensors at the
/// tail, then masks/vocab/index/header/directory re-emitted after them, then the envelope
/// rewritten last. Bytes and offsets of existing tensors never change, and until the final
/// 128-byte envelope write the old envelope still describes a valid file, so an
/// interrupted append loses nothing. The data section grows to cover the new tensors; old
/// metadata sections become dead bytes.
pub fn append_skill_in_place(
    path: &Path,
    record: SkillRecord,
    tensors: &[SkillTensor],
) -> Result<u64> {
    let file = CmfFile::open(path)?;
    check_new_skill(&file, &record, tensors)?;
    let env = file.envelope.clone();
    let mut entries = file.directory.entries.clone();
    let old_count = entries.len();
    let mut header = file.header.clone();
    header
        .skills
        .get_or_insert_with(Vec::new)
        .push(record.clone());
    let keep = |k: SectionKind| {
        file.envelope
            .section(k)
            .is_present()
            .then(|| file.section_bytes(k).to_vec())
    };
    let (masks, vocab, index) = (
        keep(SectionKind::Masks),
        keep(SectionKind::Vocab),
        keep(SectionKind::Index),
    );
    let mut pos = file.len();
    drop(file); // unmap before writing

    let ioe = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |e| FormatError::io(what, e)
    };
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(ioe("open for append"))?;
    f.seek(SeekFrom::Start(pos)).map_err(ioe("seek"))?;
    let write_at =
        |f: &mut std::fs::File, pos: &mut u64, align: u64, bytes: &[u8]| -> Result<u64> {
            let start = pos.next_multiple_of(align);
            f.write_all(&vec![0u8; (start - *pos) as usize])
                .map_err(ioe("write"))?;
            crash_point();
            for chunk in bytes.chunks(APPEND_CHUNK) {
                f.write_all(chunk).map_err(ioe("write"))?;
                crash_point();
            }
            *pos = start + bytes.len() as u64;
            Ok(start)
        };
    for t in tensors {
        let start = write_at(&mut f, &mut pos, TENSOR_ALIGN, t.bytes)?;
        entries.push(TensorEntry {
            name: skill_tensor_name(&record.id, &t.base_name),
            dtype: t.dtype,
            shape: t.shape.clone(),
            off: start - env.data.off,
            nbytes: t.bytes.len() as u64,
            hash: hash64(t.bytes),
        });
    }
    let data = Section {
        off: env.data.off,
        len: pos - env.data.off,
    };
    let mut new_env = env.clone();
    new_env.data = data;
    let put = |f: &mut std::fs::File, pos: &mut u64, bytes: Option<&Vec<u8>>| -> Result<Section> {
        match bytes {
            Some(b) => Ok(Section {
                off: write_at(f, pos, 8, b)?,
                len: b.len() as u64,
            }),
            None => Ok(Section::default()),
        }
    };
    new_env.masks = put(&mut f, &mut pos, masks.as_ref())?;
    new_env.vocab = put(&mut f, &mut pos, vocab.as_ref())?;
    new_env.index = put(&mut f, &mut pos, index.as_ref())?;
    let dir_bytes = Directory::new(entries)?.to_bytes();
    // Strong digests carried on: the old tensors' as recorded (verify checks them), the
    // new tensors' and the new directory's computed here. A file without them (or with
    // malformed ones) stays without: nothing here could vouch for its old tensors.
    match super::digests::StrongDigests::of_header(&header) {
        Some(Ok(mut d)) if d.tensors.len() == old_count => {
            d.tensors
                .extend(tensors.iter().map(|t| super::digests::digest(t.bytes)));
            d.directory = super::digests::digest(&dir_bytes);
            d.put(&mut header);
        }
        None => {}
        Some(_) => {
            header.extra.remove(super::digests::KEY);
        }
    }
    let header_bytes = header.to_bytes();
    new_env.header = put(&mut f, &mut pos, Some(&header_bytes))?;
    new_env.directory = put(&mut f, &mut pos, Some(&dir_bytes))?;
    new_env.header_hash = hash64(&header_bytes);
    new_env.dir_hash = hash64(&dir_bytes);
    if tensors.iter().any(|t| t.dtype.needs_quant_2f()) {
        new_env.required_features |= feature::QUANT_2F;
    }
    f.sync_all().map_err(ioe("sync"))?;
    crash_point();
    f.seek(SeekFrom::Start(0)).map_err(ioe("seek"))?;
    f.write_all(&new_env.to_bytes())
        .map_err(ioe("write the envelope of"))?;
    crash_point();
    f.sync_all().map_err(ioe("sync"))?;
    // Re-open to prove the result is valid before reporting success.
    CmfFile::open(path)?;
    Ok(pos)
}

/// Like [`append_skill_in_place`], but on a copy: `src` is copied to a temporary file
/// beside `out`, grown there, and renamed onto `out`. The input is never touched.
pub fn add_skill_to_copy(
    src: &Path,
    out: &Path,
    record: SkillRecord,
    tensors: &[SkillTensor],
) -> Result<u64> {
    let tmp = super::writer::TempTarget::new(out)?;
    std::fs::copy(src, tmp.path())
        .map_err(|e| FormatError::io(format!("copy {}", src.display()), e))?;
    let end = append_skill_in_place(tmp.path(), record, tensors)?;
    tmp.commit()?;
    Ok(end)
}

/// `skill export`: a standalone skill file (§9.1) holding skill `id` of `skilled`, bound to
/// `base` (the file it will be applied to) by `base`'s directory hash.
pub fn export_skill(
    skilled: &CmfFile,
    id: &str,
    base: &CmfFile,
    out: &Path,
) -> Result<WriteSummary> {
    let record = skilled
        .header
        .skills
        .iter()
        .flatten()
        .find(|s| s.id == id)
        .ok_or_else(|| parse(format!("no skill {id:?} in the registry")))?;
    let tensors = skill_tensors(skilled, id);
    if tensors.is_empty() {
        return Err(parse(format!(
            "skill {id:?} has no tensors in the directory"
        )));
    }
    for (e, b) in &tensors {
        match base.directory.get(b) {
            Some(be) if be.shape == e.shape => {}
            Some(be) => {
                return Err(parse(format!(
                    "base tensor {b:?} has shape {:?}, the skill {:?}",
                    be.shape, e.shape
                )))
            }
            None => {
                return Err(parse(format!(
                    "the base has no tensor {b:?} for the skill to replace"
                )))
            }
        }
    }
    let mut rec = record.clone();
    rec.base_dir_hash = Some(hex16(base.directory_hash()));
    rec.base_arch = base.header.arch.as_ref().map(|a| a.arch_name.clone());
    if rec.task.is_none() {
        rec.task = rec.input_mask_task.clone();
    }
    let mut prov = serde_json::Map::new();
    if let Some(p) = &skilled.path {
        prov.insert(
            "cut_from".into(),
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .into(),
        );
    }
    prov.insert("tensors".into(), tensors.len().into());
    rec.provenance = Some(serde_json::Value::Object(prov));
    let mut header = base.header.clone();
    header.skills = Some(vec![rec]);
    header.shard = None;
    let spec = WriteSpec {
        header,
        tensors: tensors
            .iter()
            .map(|(e, _)| TensorPlan {
                name: e.name.clone(),
                dtype: e.dtype,
                shape: e.shape.clone(),
            })
            .collect(),
        masks: None,
        vocab: None,
        index: None,
        extra_features: feature::SKILL_FILE,
    };
    write_file(
        out,
        spec,
        tensors.iter().map(|(e, _)| skilled.tensor_bytes(e)),
    )
}

/// Why `skill apply` refuses this pair as given, before looking inside the skill: the
/// roles swapped (the skill argument is no skill file, the base is one), or, without
/// `force`, a skill cut for another base (§9.1). These are the caller's choices; what
/// [`apply_skill`] finds wrong after them is in the files.
pub fn apply_refusal(base: &CmfFile, skill: &CmfFile, force: bool) -> Option<String> {
    if !skill.is_skill_file() {
        return Some(
            "the skill argument is not a standalone skill file (SKILL_FILE is not set); \
             `skill export` makes one"
                .into(),
        );
    }
    if base.is_skill_file() {
        return Some("the base is itself a skill file".into());
    }
    let cut_for = skill
        .header
        .skills
        .as_deref()
        .and_then(|r| r.first())
        .and_then(|r| r.base_dir_hash.as_deref())
        .and_then(parse_hex16);
    let have = base.directory_hash();
    cut_for.filter(|&want| want != have && !force).map(|want| {
        format!(
            "the skill was cut for a base whose directory hash is {}, this base's is {} (use \
             --force to apply anyway; the result is outside the spec)",
            hex16(want),
            hex16(have)
        )
    })
}

/// `skill apply`: `base` plus the tensors and registry record of the standalone skill file
/// `skill`, written to `out`. Refuses when the skill was cut for another base (directory
/// hash differs) unless `force`.
pub fn apply_skill(
    base: &CmfFile,
    skill: &CmfFile,
    out: &Path,
    force: bool,
) -> Result<WriteSummary> {
    if let Some(why) = apply_refusal(base, skill, force) {
        return Err(parse(why));
    }
    let records = skill.header.skills.as_deref().unwrap_or_default();
    let [record] = records else {
        return Err(parse(format!(
            "a skill file carries one registry record, this one has {}",
            records.len()
        )));
    };
    // The binding itself was compared in `apply_refusal`; here it must at least exist.
    record
        .base_dir_hash
        .as_deref()
        .and_then(parse_hex16)
        .ok_or_else(|| parse("skill record has no valid base_dir_hash"))?;
    let mut applied = record.clone();
    applied.base_dir_hash = None;
    let mut tensors = Vec::new();
    for e in skill.directory.iter() {
        let b = replaced_name(&e.name, &record.id).ok_or_else(|| {
            parse(format!(
                "tensor {:?} is not named skill.{}.*",
                super::escape_str(&e.name),
                record.id
            ))
        })?;
        tensors.push(SkillTensor {
            base_name: b.to_string(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            bytes: skill.tensor_bytes(e),
        });
    }
    check_new_skill(base, &applied, &tensors)?;
    let mut spec = super::writer::spec_of(base);
    spec.header
        .skills
        .get_or_insert_with(Vec::new)
        .push(applied);
    for t in &tensors {
        spec.tensors.push(TensorPlan {
            name: skill_tensor_name(&record.id, &t.base_name),
            dtype: t.dtype,
            shape: t.shape.clone(),
        });
    }
    let payloads = base
        .directory
        .iter()
        .map(|e| base.tensor_bytes(e))
        .chain(tensors.iter().map(|t| t.bytes));
    write_file(out, spec, payloads)
}
