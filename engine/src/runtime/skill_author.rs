//! Authoring skills (§9) with measured quality: `skill add` (replacement tensors from a
//! same-architecture donor, a .cmf or a Hugging Face checkpoint) and `skill bake` (a
//! precision skill: chosen layers re-encoded at a higher precision from a source of the
//! backbone's own weights, so that a skill needs no donor).
//!
//! The pieces, in the order a command uses them:
//! - [`Source::open`] reads a donor or precision source (a directory is a Hugging Face
//!   checkpoint, read as the converter reads it; anything else a CMF file or shard set);
//! - [`plan`] picks the backbone tensors of the chosen layers that the engine switches
//!   (matrices and their biases: `Model::linears`) and encodes their replacements —
//!   a .cmf donor's own bytes, an HF donor's values in the backbone tensor's dtype, or for
//!   a precision skill the source's values in the asked dtype; tensors that would not
//!   change anything are left to the backbone;
//! - [`selection`] fits the routing subspace to the prompts' φ;
//! - [`measure`] grows a temporary copy by the skill, loads it and measures held-out
//!   perplexity with the skill applied at run time against the backbone, so the record
//!   written last carries a measured `quality` (never an invented one);
//! - [`write`] grows a copy (`-o`) or the base itself, append-only (§9, claim 11).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::calibrate::{f16_base64, fit_subspace, skill_quality};
use super::load::{load_verified, LoadError, LoadOptions};
use crate::format::header::{Selection, SkillRecord};
use crate::format::skills::{self, SkillTensor};
use crate::format::{CmfFile, CmfModel, DType, FormatError};
use crate::import::hf::{Checkpoint, HfError};
use crate::import::rewrite::layer_of;
use crate::model::select::{Active, SkillChoice};
use crate::model::{Model, ModelError};
use crate::quant::{self, EncodeOptions, QuantError};

/// Why a skill cannot be authored.
#[derive(Debug, thiserror::Error)]
pub enum AuthorError {
    /// The request does not fit the files (another architecture, an unknown layer, a
    /// skill id already taken): the user's to fix.
    #[error("{0}")]
    Request(String),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Hf(#[from] HfError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("encoding {tensor}: {source}")]
    Quant { tensor: String, source: QuantError },
}

const MTP_PREFIX: &str = "model.mtp.";

fn request(msg: impl Into<String>) -> AuthorError {
    AuthorError::Request(msg.into())
}

/// Where replacement tensors come from.
pub enum Source {
    /// A CMF file (or shard set).
    Cmf(CmfModel),
    /// A Hugging Face checkpoint directory.
    Hf(Box<Checkpoint>),
}

impl Source {
    /// A directory is a Hugging Face checkpoint; a file a CMF file.
    pub fn open(path: &Path) -> Result<Source, AuthorError> {
        if path.is_dir() {
            Ok(Source::Hf(Box::new(Checkpoint::open(path)?)))
        } else {
            Ok(Source::Cmf(CmfModel::open(path)?))
        }
    }

    /// `cmf` or `hf`.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Cmf(_) => "cmf",
            Source::Hf(_) => "hf",
        }
    }

    fn shape(&self, name: &str) -> Option<Vec<u64>> {
        match self {
            Source::Cmf(m) => m.get(name).map(|(_, e)| e.shape.clone()),
            Source::Hf(ck) => ck.tensor(name).map(|t| t.shape.clone()),
        }
    }

    /// A CMF source's stored dtype and payload.
    fn stored(&self, name: &str) -> Option<(DType, &[u8])> {
        match self {
            Source::Cmf(m) => m
                .get(name)
                .map(|(s, e)| (e.dtype, m.shards[s].tensor_bytes(e))),
            Source::Hf(_) => None,
        }
    }

    /// The tensor's values, row-major f32.
    fn values(&self, name: &str) -> Result<Vec<f32>, AuthorError> {
        match self {
            Source::Cmf(m) => {
                let (s, e) = m
                    .get(name)
                    .ok_or_else(|| request(format!("the source has no tensor {name}")))?;
                quant::decode(e.dtype, &e.shape, m.shards[s].tensor_bytes(e)).map_err(|source| {
                    AuthorError::Quant {
                        tensor: name.into(),
                        source,
                    }
                })
            }
            Source::Hf(ck) => {
                let t = ck
                    .tensor(name)
                    .ok_or_else(|| request(format!("the source has no tensor {name}")))?;
                let v = ck.values(t);
                ck.release(t);
                Ok(v?)
            }
        }
    }
}

/// How replacements are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// A donor's tensors: a .cmf donor's own bytes (its dtype), a Hugging Face donor's
    /// values encoded in the backbone tensor's dtype (what converting the donor at the
    /// backbone's dtypes would write).
    Donor,
    /// A precision skill: the source's values encoded in this dtype (`q8_row` where it
    /// cannot hold a shape), only where that stores more bits per weight than the
    /// backbone does.
    Precision(DType),
}

/// One replacement tensor, encoded.
pub struct Replacement<'a> {
    pub base_name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub bytes: Cow<'a, [u8]>,
}

/// A tensor left to the backbone, and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Skipped {
    pub tensor: String,
    pub reason: String,
    /// The engine could switch it, but the replacement would change nothing.
    pub unchanged: bool,
}

/// A replacement written in another dtype than asked for, and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Fallback {
    pub tensor: String,
    pub dtype: DType,
    pub reason: String,
}

/// What [`plan`] chose.
pub struct Plan<'a> {
    pub tensors: Vec<Replacement<'a>>,
    /// Tensors of the chosen layers the skill leaves to the backbone.
    pub skipped: Vec<Skipped>,
    pub fallbacks: Vec<Fallback>,
}

impl Plan<'_> {
    /// The replacements as the format's append functions take them.
    pub fn skill_tensors(&self) -> Vec<SkillTensor<'_>> {
        self.tensors
            .iter()
            .map(|t| SkillTensor {
                base_name: t.base_name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                bytes: &t.bytes,
            })
            .collect()
    }

    /// The layers the replacements belong to, ascending.
    pub fn layers(&self) -> Vec<u64> {
        let set: BTreeSet<u64> = self
            .tensors
            .iter()
            .filter_map(|t| layer_of(&t.base_name).map(|(l, _)| l))
            .collect();
        set.into_iter().collect()
    }

    pub fn bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes.len() as u64).sum()
    }
}

/// The backbone tensors a skill can replace so that the engine reads the replacement:
/// every matrix it reads through a linear and that matrix's bias (norms and other
/// vectors are read once at load and cannot be switched between tokens; nor can the MTP
/// head's matrices).
pub fn switchable(model: &Model) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for lin in model.linears().filter(|l| !l.name.starts_with(MTP_PREFIX)) {
        let stem = lin.name.strip_suffix(".weight").unwrap_or(&lin.name);
        out.insert(format!("{stem}.bias"));
        out.insert(lin.name.clone());
    }
    out
}

/// Replacement tensors for the backbone tensors of `layers` (decoder layers
/// `model.layers.{l}.*`) that `switchable` admits — with `embeddings` also those of no
/// layer (the token embedding and the LM head) — from `source`, encoded as `encoding`
/// says. A tensor whose replacement would equal the backbone's is left out; so, for a
/// precision skill, is one the backbone already stores at as many bits per weight. The
/// source must have every such tensor with the backbone's shape (the same architecture).
pub fn plan<'s>(
    base: &CmfFile,
    switchable: &dyn Fn(&str) -> bool,
    source: &'s Source,
    layers: &BTreeSet<u64>,
    embeddings: bool,
    encoding: Encoding,
) -> Result<Plan<'s>, AuthorError> {
    let n_layers = base.header.arch.as_ref().map_or(0, |a| a.num_layers);
    if let Some(&l) = layers.iter().find(|&&l| l >= n_layers) {
        return Err(request(format!(
            "layer {l} is past the model's {n_layers} layers"
        )));
    }
    if let Encoding::Precision(q) = encoding {
        if q.is_reserved() {
            return Err(request(format!(
                "dtype {q} is reserved and cannot be written"
            )));
        }
    }
    let candidates: Vec<_> = base
        .directory
        .iter()
        .filter(|e| !e.name.starts_with(skills::PREFIX))
        .filter(|e| match layer_of(&e.name) {
            Some((l, _)) => layers.contains(&l),
            None => embeddings && !e.name.starts_with(MTP_PREFIX) && switchable(&e.name),
        })
        .collect();
    let mut skipped = Vec::new();
    let mut work = Vec::new();
    for e in candidates {
        if !switchable(&e.name) {
            skipped.push(Skipped {
                tensor: e.name.clone(),
                reason: "the engine reads it only at load (a norm or vector): kept from \
                         the backbone"
                    .into(),
                unchanged: false,
            });
            continue;
        }
        match source.shape(&e.name) {
            None => {
                return Err(request(format!(
                    "the source has no tensor {} (it must be of the backbone's architecture)",
                    e.name
                )))
            }
            Some(s) if s != e.shape => {
                return Err(request(format!(
                    "the source's {} is {s:?}, the backbone's {:?} (it must be of the \
                     backbone's architecture)",
                    e.name, e.shape
                )))
            }
            Some(_) => work.push(e),
        }
    }
    let base_bytes = |e: &crate::format::TensorEntry| base.tensor_bytes(e);
    let encoded: Vec<Result<Encoded<'s>, AuthorError>> = {
        use rayon::prelude::*;
        work.par_iter()
            .map(|e| encode_one(e, base_bytes(e), source, encoding))
            .collect()
    };
    let mut tensors = Vec::new();
    let mut fallbacks = Vec::new();
    for (e, r) in work.iter().zip(encoded) {
        match r? {
            Encoded::Same(reason) => skipped.push(Skipped {
                tensor: e.name.clone(),
                reason,
                unchanged: true,
            }),
            Encoded::New(t, fallback) => {
                fallbacks.extend(fallback);
                tensors.push(t);
            }
        }
    }
    Ok(Plan {
        tensors,
        skipped,
        fallbacks,
    })
}

enum Encoded<'s> {
    /// Left to the backbone.
    Same(String),
    New(Replacement<'s>, Option<Fallback>),
}

fn encode_one<'s>(
    e: &crate::format::TensorEntry,
    base: &[u8],
    source: &'s Source,
    encoding: Encoding,
) -> Result<Encoded<'s>, AuthorError> {
    let enc = |dtype: DType, values: &[f32]| {
        quant::encode(dtype, &e.shape, values, &EncodeOptions::default()).map_err(|source| {
            AuthorError::Quant {
                tensor: e.name.clone(),
                source,
            }
        })
    };
    let same = |dtype: DType, bytes: &[u8]| dtype == e.dtype && bytes == base;
    let new = |dtype, bytes, fallback| {
        Encoded::New(
            Replacement {
                base_name: e.name.clone(),
                dtype,
                shape: e.shape.clone(),
                bytes,
            },
            fallback,
        )
    };
    match encoding {
        Encoding::Donor => {
            if let Some((dtype, bytes)) = source.stored(&e.name) {
                if same(dtype, bytes) {
                    return Ok(Encoded::Same("the donor's tensor is the backbone's".into()));
                }
                quant::validate(dtype, &e.shape, bytes).map_err(|source| AuthorError::Quant {
                    tensor: e.name.clone(),
                    source,
                })?;
                return Ok(new(dtype, Cow::Borrowed(bytes), None));
            }
            let bytes = enc(e.dtype, &source.values(&e.name)?)?;
            if same(e.dtype, &bytes) {
                return Ok(Encoded::Same(format!(
                    "the donor's tensor encodes to the backbone's bytes in {}",
                    e.dtype
                )));
            }
            Ok(new(e.dtype, Cow::Owned(bytes), None))
        }
        Encoding::Precision(q) => {
            if let Some((dtype, bytes)) = source.stored(&e.name) {
                if same(dtype, bytes) {
                    return Ok(Encoded::Same(
                        "the source stores the backbone's own bytes".into(),
                    ));
                }
                if bytes.len() <= base.len() {
                    return Ok(Encoded::Same(format!(
                        "the source's {dtype} stores no more bits per weight than the \
                         backbone's {}",
                        e.dtype
                    )));
                }
            }
            let (dtype, fallback) = if q.size_for(&e.shape).is_ok() {
                (q, None)
            } else {
                let fb = if DType::Q8Row.size_for(&e.shape).is_ok() {
                    DType::Q8Row
                } else {
                    DType::F16
                };
                let reason = format!("{q} cannot hold shape {:?}", e.shape);
                (fb, Some(reason))
            };
            let bytes = enc(dtype, &source.values(&e.name)?)?;
            // Bits per weight: the payload sizes of the same shape.
            if bytes.len() <= base.len() {
                return Ok(Encoded::Same(format!(
                    "the backbone's {} already stores as many bits per weight as {dtype}",
                    e.dtype
                )));
            }
            let fallback = fallback.map(|reason| Fallback {
                tensor: e.name.clone(),
                dtype,
                reason,
            });
            Ok(new(dtype, Cow::Owned(bytes), fallback))
        }
    }
}

/// A skill's routing subspace (§9 `selection`, metric `mse`) fitted to the backbone's φ
/// of `prompts` at `phi_layer`, with `rank` principal directions (fewer when the prompts
/// span fewer).
pub fn selection(
    model: &Model,
    prompts: &[Vec<u32>],
    phi_layer: usize,
    rank: usize,
) -> Result<Selection, AuthorError> {
    if prompts.iter().all(Vec::is_empty) {
        return Err(request("the prompts have no tokens"));
    }
    let (mean, basis) = fit_subspace(model, prompts, phi_layer, rank)?;
    let h = model.config.hidden.max(1);
    let rows = basis.len() / h;
    if rows == 0 || mean.iter().chain(&basis).any(|v| !v.is_finite()) {
        return Err(request(
            "the prompts' hidden states give no usable subspace (non-finite or empty)",
        ));
    }
    Ok(Selection {
        metric: "mse".into(),
        phi_layer: phi_layer as u64,
        mean: f16_base64(&mean),
        basis: f16_base64(&basis),
        rank: Some(rows as u64),
        ..Default::default()
    })
}

/// What [`measure`] measures on.
pub struct Heldout<'a> {
    /// The held-out text's tokens (as `ppl --text-file` tokenizes it).
    pub ids: &'a [u32],
    /// The held-out file's bytes (`dataset_sha256`).
    pub bytes: &'a [u8],
    /// Perplexity window (as `ppl`: the context).
    pub window: usize,
}

/// The skill's `quality` (§9): `base` is copied into a temporary directory in
/// `scratch_dir`, grown by `record` + `tensors`, loaded (with `load`'s overrides and
/// precision; its hash chain is the one just written) and the held-out perplexity
/// measured with the skill applied at run time against the backbone. The copy is removed.
pub fn measure(
    base: &Path,
    scratch_dir: &Path,
    record: &SkillRecord,
    tensors: &[SkillTensor],
    heldout: &Heldout,
    load: &LoadOptions,
) -> Result<Value, AuthorError> {
    if heldout.ids.len() < 2 {
        return Err(request(
            "the held-out text needs at least 2 tokens (the first is only context)",
        ));
    }
    let dir = tempfile::Builder::new()
        .prefix(".cortiq-skill-")
        .tempdir_in(scratch_dir)
        .map_err(|e| {
            FormatError::io(
                format!("create a directory in {}", scratch_dir.display()),
                e,
            )
        })?;
    let grown = dir.path().join("measure.cmf");
    let mut rec = record.clone();
    rec.quality = None;
    skills::add_skill_to_copy(base, &grown, rec, tensors)?;
    let opts = LoadOptions {
        skip_verify: true,
        ..load.clone()
    };
    let model = load_verified(&grown, &opts)?;
    let k = model
        .skill_index(&record.id)
        .ok_or_else(|| request(format!("the grown copy has no skill {:?}", record.id)))?;
    if let Some(p) = &model.skills[k as usize].problem {
        return Err(request(format!(
            "the engine cannot apply skill {:?}: {p}",
            record.id
        )));
    }
    let active = Active {
        task: None,
        skill: SkillChoice::One(k),
    };
    let window = heldout.window.min(heldout.ids.len()).max(2);
    let q = skill_quality(&model, &active, heldout.ids, heldout.bytes, window)?;
    drop(model);
    Ok(q)
}

/// Where the grown model goes.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// A new file (the base is copied, then grown; the output appears when complete).
    Copy(&'a Path),
    /// The base itself, append-only: existing bytes never change and the envelope is
    /// written last, so an interrupted append leaves the previous file valid.
    InPlace,
}

/// Grows `base` by the skill into `target`; returns the path written.
pub fn write(
    base: &Path,
    target: Target,
    record: SkillRecord,
    tensors: &[SkillTensor],
) -> Result<PathBuf, AuthorError> {
    match target {
        Target::Copy(out) => {
            skills::add_skill_to_copy(base, out, record, tensors)?;
            Ok(out.to_path_buf())
        }
        Target::InPlace => {
            skills::append_skill_in_place(base, record, tensors)?;
            Ok(base.to_path_buf())
        }
    }
}

/// Checks a new skill id against the base's registry before any work is done (the format
/// checks it again when it writes).
pub fn check_id(base: &CmfFile, id: &str) -> Result<(), AuthorError> {
    if id.is_empty() || id.contains(|c: char| c == '.' || c.is_control() || c.is_whitespace()) {
        return Err(request(format!(
            "skill id {:?} must be non-empty, without dots, spaces or control characters",
            crate::format::escape_str(id)
        )));
    }
    if base.is_skill_file() {
        return Err(request(
            "skills are added to a model, not to a standalone skill file (§9.1)",
        ));
    }
    if base.header.skills.iter().flatten().any(|s| s.id == id) {
        return Err(request(format!(
            "the base already has a skill {:?}",
            crate::format::escape_str(id)
        )));
    }
    Ok(())
}
