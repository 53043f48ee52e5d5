//! Hugging Face checkpoint → CMF v2 (`cortiq convert`).
//!
//! A checkpoint directory holds `config.json`, one `model.safetensors` or shards listed by
//! `model.safetensors.index.json`, and the tokenizer files. Safetensors files are memory
//! mapped and only their headers are parsed up front; each tensor is converted to f32,
//! encoded and written before the next one is touched, so memory is bounded by a few
//! tensors whatever the model's size.
//!
//! The header (spec §2) is built from `config.json` by [`build_arch`]: the arch fields the
//! reference converter writes, `norm_style` per family (`shared/spec/NOTES.md`), `moe`
//! (§2.2) and `mtp` (§2.1) when the checkpoint carries them.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::{json, Map, Value};

use crate::format::header::{Arch, Header, Moe, Mtp, NormStyle, TokenizerConfig};
use crate::format::writer::{self, TensorPlan, WriteSpec, WriteSummary};
use crate::format::DType;
use crate::quant::{self, EncodeOptions};

/// Why a checkpoint cannot be converted.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The checkpoint's content is not what a Hugging Face checkpoint holds.
    #[error("{0}")]
    Invalid(String),
    /// A request the converter cannot honour (a dtype it cannot write, a bad option).
    #[error("{0}")]
    Unsupported(String),
    #[error("encoding {tensor}: {source}")]
    Quant {
        tensor: String,
        source: quant::QuantError,
    },
    #[error(transparent)]
    Format(#[from] crate::format::FormatError),
}

pub type Result<T> = std::result::Result<T, HfError>;

fn invalid(msg: impl Into<String>) -> HfError {
    HfError::Invalid(msg.into())
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| HfError::Io {
        what: format!("read {}", path.display()),
        source,
    })
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = read_file(path)?;
    serde_json::from_slice(&bytes).map_err(|e| invalid(format!("{}: {e}", path.display())))
}

/// Element type of a source tensor; the converter reads floating-point weights only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceDType {
    F32,
    F16,
    Bf16,
}

impl SourceDType {
    fn from_st(d: StDtype) -> Option<SourceDType> {
        match d {
            StDtype::F32 => Some(SourceDType::F32),
            StDtype::F16 => Some(SourceDType::F16),
            StDtype::BF16 => Some(SourceDType::Bf16),
            _ => None,
        }
    }

    fn width(self) -> usize {
        match self {
            SourceDType::F32 => 4,
            SourceDType::F16 | SourceDType::Bf16 => 2,
        }
    }
}

/// One tensor of the checkpoint: where its bytes are, under its canonical CMF name.
#[derive(Clone, Debug)]
pub struct SourceTensor {
    /// The name written to the directory (prefixes normalised, see [`canonical_name`]).
    pub name: String,
    /// The name inside the safetensors file.
    pub source_name: String,
    pub dtype: SourceDType,
    pub shape: Vec<u64>,
    file: usize,
    /// Absolute byte range inside the mapped file.
    start: usize,
    end: usize,
    /// For a tensor cut out of a fused source tensor: which rows of the source (seen as a
    /// 2-D matrix of `cols` columns) form it, in order.
    gather: Option<RowGather>,
}

#[derive(Clone, Debug)]
struct RowGather {
    cols: usize,
    /// `(first row, row count)` ranges of the source matrix.
    ranges: Vec<(usize, usize)>,
    /// The source stores the matrix transposed (`[in, out]`, as fused experts of some
    /// checkpoints do): `ranges` then name columns of the source matrix, whose rows are
    /// `cols` (the input dimension) long and `stride` elements apart, starting at row
    /// `first`.
    transposed: Option<Transposed>,
}

#[derive(Clone, Copy, Debug)]
struct Transposed {
    first: usize,
    stride: usize,
}

/// A checkpoint directory with its safetensors files mapped.
pub struct Checkpoint {
    pub dir: PathBuf,
    /// The text model's configuration (`text_config` of a multimodal config, else the root).
    pub config: Value,
    pub tensors: Vec<SourceTensor>,
    /// Source tensors left out of the output (vision tower of a multimodal checkpoint).
    pub dropped: Vec<String>,
    maps: Vec<Mmap>,
    dir_files: Vec<PathBuf>,
}

/// The directory name of a tensor for a source name: the `model.language_model.` prefix
/// of multimodal checkpoints becomes `model.`, Qwen-style MTP heads (`mtp.*`) take the
/// canonical `model.mtp.*` names of §2.1; everything else keeps its Hugging Face name.
/// `None` for tensors that are not part of the text model.
pub fn canonical_name(source: &str) -> Option<String> {
    if source.starts_with("model.visual.")
        || source.starts_with("visual.")
        || source.starts_with("model.vision_tower.")
        || source.starts_with("vision_tower.")
        || source.starts_with("model.multi_modal_projector.")
        || source.starts_with("multi_modal_projector.")
    {
        return None;
    }
    let s = if let Some(rest) = source.strip_prefix("model.language_model.") {
        format!("model.{rest}")
    } else if let Some(rest) = source.strip_prefix("language_model.model.") {
        format!("model.{rest}")
    } else if let Some(rest) = source.strip_prefix("language_model.") {
        rest.to_string()
    } else {
        source.to_string()
    };
    if let Some(rest) = s.strip_prefix("mtp.") {
        let rest = match rest {
            "pre_fc_norm_embedding.weight" => "enorm.weight".to_string(),
            "pre_fc_norm_hidden.weight" => "hnorm.weight".to_string(),
            "fc.weight" => "eh_proj.weight".to_string(),
            other => other.to_string(),
        };
        return Some(format!("model.mtp.{rest}"));
    }
    Some(s)
}

impl Checkpoint {
    /// Opens `dir`: reads `config.json`, maps every safetensors file and parses its header.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        if !dir.is_dir() {
            return Err(invalid(format!("{} is not a directory", dir.display())));
        }
        let root = read_json(&dir.join("config.json"))?;
        let config = match root.get("text_config") {
            Some(tc) if tc.is_object() => tc.clone(),
            _ => root.clone(),
        };
        if !config.is_object() {
            return Err(invalid("config.json is not a JSON object"));
        }
        let files = safetensors_files(dir)?;
        let mut maps = Vec::new();
        let mut tensors = Vec::new();
        let mut dropped = Vec::new();
        for (fi, path) in files.iter().enumerate() {
            let f = File::open(path).map_err(|source| HfError::Io {
                what: format!("open {}", path.display()),
                source,
            })?;
            // SAFETY: the map is read-only; a checkpoint modified while we convert it can
            // give wrong values, never undefined behaviour in safe code reading bytes.
            let map = unsafe { Mmap::map(&f) }.map_err(|source| HfError::Io {
                what: format!("map {}", path.display()),
                source,
            })?;
            let (n, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
            let data_start = 8 + n;
            let mut names: Vec<(String, safetensors::tensor::TensorInfo)> = meta
                .tensors()
                .into_iter()
                .map(|(k, v)| (k, v.clone()))
                .collect();
            names.sort_by(|a, b| a.0.cmp(&b.0));
            for (source_name, info) in names {
                let Some(name) = canonical_name(&source_name) else {
                    dropped.push(source_name);
                    continue;
                };
                let dtype = SourceDType::from_st(info.dtype).ok_or_else(|| {
                    HfError::Unsupported(format!(
                        "{}: tensor {source_name} has dtype {:?}; only F32, F16 and BF16 \
                         checkpoints can be converted",
                        path.display(),
                        info.dtype
                    ))
                })?;
                let shape: Vec<u64> = info.shape.iter().map(|&d| d as u64).collect();
                tensors.push(SourceTensor {
                    name,
                    source_name,
                    dtype,
                    shape,
                    file: fi,
                    start: data_start + info.data_offsets.0,
                    end: data_start + info.data_offsets.1,
                    gather: None,
                });
            }
            maps.push(map);
        }
        let tensors = split_fused_experts(tensors, &config)?;
        let tensors = split_fused_linear_attention(tensors, &config)?;
        let mut seen = std::collections::HashSet::new();
        for t in &tensors {
            if !seen.insert(t.name.as_str()) {
                return Err(invalid(format!(
                    "two source tensors map to the name {}",
                    t.name
                )));
            }
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            tensors,
            dropped,
            maps,
            dir_files: files,
        })
    }

    /// The safetensors files read, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.dir_files
    }

    pub fn tensor(&self, name: &str) -> Option<&SourceTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor's values as row-major f32 (exact for every source dtype). A slice of a
    /// fused tensor costs its own size, not the fused tensor's.
    pub fn values(&self, t: &SourceTensor) -> Result<Vec<f32>> {
        // As one row of every element, or as its gathered rows.
        let (rows, cols) = match &t.gather {
            None => (1, (t.end - t.start) / t.dtype.width()),
            Some(g) => (g.ranges.iter().map(|r| r.1).sum::<usize>(), g.cols),
        };
        let mut out = Vec::new();
        out.try_reserve_exact(rows.saturating_mul(cols))
            .map_err(|_| invalid(format!("{}: cannot allocate its values", t.name)))?;
        out.resize(rows * cols, 0f32);
        self.read_rows(t, 0..rows, cols, &mut out)?;
        Ok(out)
    }

    /// Rows `rows` of `t` seen as a matrix of `cols` columns (the codec's geometry) into
    /// `out` (`rows.len() · cols` values), exact for every source dtype. The pages read are
    /// released at once (see [`Checkpoint::release`]): a converter reads each row once per
    /// pass.
    pub fn read_rows(
        &self,
        t: &SourceTensor,
        rows: std::ops::Range<usize>,
        cols: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let map = self.maps.get(t.file);
        let short = || invalid(format!("tensor {} lies outside its file", t.source_name));
        let w = t.dtype.width();
        // Absolute byte ranges of the wanted rows, in order.
        let spans: Vec<(usize, usize)> = match &t.gather {
            None => {
                let a = rows.start.checked_mul(cols).and_then(|e| e.checked_mul(w));
                let b = rows.end.checked_mul(cols).and_then(|e| e.checked_mul(w));
                vec![(a.ok_or_else(short)?, b.ok_or_else(short)?)]
            }
            Some(g) if g.transposed.is_some() => {
                return self.read_transposed(t, g, rows, cols, out);
            }
            Some(g) => {
                if g.cols != cols {
                    return Err(invalid(format!(
                        "{}: rows of {} columns read as {cols}",
                        t.name, g.cols
                    )));
                }
                let row_bytes = g.cols.checked_mul(w).ok_or_else(short)?;
                let mut spans = Vec::new();
                let mut first = 0usize; // gathered index of the range's first row
                for &(r0, n) in &g.ranges {
                    let lo = rows.start.max(first);
                    let hi = rows.end.min(first + n);
                    if lo < hi {
                        let src = r0 + (lo - first);
                        let a = src.checked_mul(row_bytes).ok_or_else(short)?;
                        let b = (src + (hi - lo)).checked_mul(row_bytes).ok_or_else(short)?;
                        spans.push((a, b));
                    }
                    first += n;
                }
                spans
            }
        };
        let mut at = 0;
        for (a, b) in spans {
            let (a, b) = (t.start + a, t.start + b);
            if b > t.end {
                return Err(short());
            }
            let bytes = map.and_then(|m| m.get(a..b)).ok_or_else(short)?;
            let n = bytes.len() / w;
            let asked = out.len();
            let dst = out
                .get_mut(at..at + n)
                .ok_or_else(|| invalid(format!("{}: {asked} values asked, more read", t.name)))?;
            to_f32_into(t.dtype, bytes, dst);
            at += n;
            if let Some(m) = map {
                super::release_pages(m, a as u64, b as u64);
            }
        }
        if at != out.len() {
            return Err(invalid(format!(
                "{}: rows {rows:?} of {cols} columns lie outside the tensor",
                t.name
            )));
        }
        Ok(())
    }

    /// [`Checkpoint::read_rows`] of a matrix stored transposed: output row `r` (an output
    /// feature) is column `r` of the stored `[in, out]` matrix, so a block of rows reads a
    /// block of columns of every stored row.
    fn read_transposed(
        &self,
        t: &SourceTensor,
        g: &RowGather,
        rows: std::ops::Range<usize>,
        cols: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let Some(tr) = g.transposed else {
            return Err(invalid(format!("{}: not a transposed tensor", t.name)));
        };
        let short = || invalid(format!("tensor {} lies outside its file", t.source_name));
        let (&[(c0, n)], true) = (g.ranges.as_slice(), g.cols == cols) else {
            return Err(invalid(format!("{}: unexpected transposed layout", t.name)));
        };
        if rows.end > n || out.len() != rows.len() * cols {
            return Err(invalid(format!(
                "{}: rows {rows:?} of {cols} columns lie outside the tensor",
                t.name
            )));
        }
        let w = t.dtype.width();
        let map = self.maps.get(t.file).ok_or_else(short)?;
        let mut col = vec![0f32; rows.len()];
        for i in 0..cols {
            // Stored row `first + i`, columns `c0 + rows`.
            let e0 = (tr.first + i)
                .checked_mul(tr.stride)
                .and_then(|e| e.checked_add(c0 + rows.start))
                .ok_or_else(short)?;
            let a = e0
                .checked_mul(w)
                .and_then(|a| a.checked_add(t.start))
                .ok_or_else(short)?;
            let b = a + rows.len() * w;
            if b > t.end {
                return Err(short());
            }
            let bytes = map.get(a..b).ok_or_else(short)?;
            to_f32_into(t.dtype, bytes, &mut col);
            for (r, v) in col.iter().enumerate() {
                out[r * cols + i] = *v;
            }
        }
        Ok(())
    }

    /// Lets the kernel drop the mapped source pages of `t` once its values are read, so
    /// resident memory does not grow with the model: the pages are file-backed and clean,
    /// and are read again from the file should a fused neighbour need them.
    pub fn release(&self, t: &SourceTensor) {
        if let Some(m) = self.maps.get(t.file) {
            super::release_pages(m, t.start as u64, t.end as u64);
        }
    }

    /// Text of a file of the checkpoint directory, `None` when it does not exist.
    fn optional_text(&self, name: &str) -> Result<Option<String>> {
        let p = self.dir.join(name);
        if !p.exists() {
            return Ok(None);
        }
        let bytes = read_file(&p)?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| invalid(format!("{} is not UTF-8", p.display())))
    }
}

fn to_f32_into(dtype: SourceDType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        SourceDType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        SourceDType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        SourceDType::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
}

/// `model.safetensors`, or the shards named by `model.safetensors.index.json`, or (for
/// checkpoints without an index) every `*.safetensors` of the directory except the
/// fixtures' `reference.safetensors`.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let v = read_json(&index)?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid(format!("{} has no weight_map", index.display())))?;
        let mut files: Vec<String> = Vec::new();
        for f in map.values() {
            let f = f
                .as_str()
                .ok_or_else(|| invalid("weight_map values must be file names"))?;
            if f.contains('/') || f.contains('\\') || f == ".." {
                return Err(invalid(format!(
                    "weight_map names a file outside the directory: {f}"
                )));
            }
            if !files.iter().any(|x| x == f) {
                files.push(f.to_string());
            }
        }
        files.sort();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| HfError::Io {
            what: format!("list {}", dir.display()),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "safetensors")
                && p.file_name().is_some_and(|n| n != "reference.safetensors")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(invalid(format!(
            "{}: no model.safetensors, no model.safetensors.index.json",
            dir.display()
        )));
    }
    Ok(files)
}

/// Checkpoints that store a layer's experts as one 3-D tensor (`mlp.experts.gate_up_proj
/// [E, 2·I, H]`, `mlp.experts.down_proj [E, H, I]`, the transformers ≥ 5 layout, or the
/// transposed `[E, H, 2·I]` / `[E, I, H]` of others) are split into one 2-D entry per
/// expert and role, under the per-expert HF names (§2.2). Which layout a tensor has is
/// read from its shape against `hidden_size` and `moe_intermediate_size`; a shape both
/// layouts explain (H = 2·I for `gate_up_proj`, H = I for `down_proj`) is taken as
/// transformers' `[E, out, in]`.
fn split_fused_experts(tensors: Vec<SourceTensor>, cfg: &Value) -> Result<Vec<SourceTensor>> {
    let hidden = get_u64(cfg, "hidden_size").map(|v| v as usize);
    let inter = get_u64(cfg, "moe_intermediate_size")
        .or_else(|| get_u64(cfg, "intermediate_size"))
        .map(|v| v as usize);
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let Some((prefix, role)) = fused_expert_role(&t.name) else {
            out.push(t);
            continue;
        };
        if t.shape.len() != 3 {
            return Err(invalid(format!(
                "fused expert tensor {} has shape {:?}, expected 3 dimensions",
                t.source_name, t.shape
            )));
        }
        let (e, a, b) = (
            t.shape[0] as usize,
            t.shape[1] as usize,
            t.shape[2] as usize,
        );
        let expected = e
            .checked_mul(a)
            .and_then(|x| x.checked_mul(b))
            .and_then(|x| x.checked_mul(t.dtype.width()));
        if expected != Some(t.end - t.start) {
            return Err(invalid(format!(
                "fused tensor {} has the wrong size",
                t.source_name
            )));
        }
        // The (out, in) of one expert's matrix as the config expects it.
        let want = match (role, hidden, inter) {
            ("gate_up_proj", Some(h), Some(i)) => Some((2 * i, h)),
            ("gate_proj" | "up_proj", Some(h), Some(i)) => Some((i, h)),
            ("down_proj", Some(h), Some(i)) => Some((h, i)),
            _ => None,
        };
        let transposed = match want {
            Some(w) if (a, b) == w => false,
            Some(w) if (b, a) == w => true,
            Some((o, i)) => {
                return Err(invalid(format!(
                    "fused expert tensor {} has shape {:?}: neither [E, {o}, {i}] nor \
                     [E, {i}, {o}] as hidden_size and moe_intermediate_size imply",
                    t.source_name, t.shape
                )))
            }
            None => false,
        };
        // Per expert: `(out, in)` and the rows of the stored matrix (or, transposed, its
        // columns) each role takes; gate rows come first, then up rows.
        let (rows_out, cols_in) = if transposed { (b, a) } else { (a, b) };
        let parts: Vec<(&str, usize, usize)> = match role {
            "gate_up_proj" => {
                if rows_out % 2 != 0 {
                    return Err(invalid(format!(
                        "{}: gate_up_proj outputs {rows_out} are not even",
                        t.source_name
                    )));
                }
                vec![
                    ("gate_proj", 0, rows_out / 2),
                    ("up_proj", rows_out / 2, rows_out),
                ]
            }
            _ => vec![(role, 0, rows_out)],
        };
        for expert in 0..e {
            for &(r, r0, r1) in &parts {
                let gather = if transposed {
                    RowGather {
                        cols: cols_in,
                        ranges: vec![(r0, r1 - r0)],
                        transposed: Some(Transposed {
                            first: expert * a,
                            stride: b,
                        }),
                    }
                } else {
                    RowGather {
                        cols: cols_in,
                        ranges: vec![(expert * a + r0, r1 - r0)],
                        transposed: None,
                    }
                };
                out.push(SourceTensor {
                    name: format!("{prefix}{expert}.{r}.weight"),
                    source_name: t.source_name.clone(),
                    dtype: t.dtype,
                    shape: vec![(r1 - r0) as u64, cols_in as u64],
                    file: t.file,
                    start: t.start,
                    end: t.end,
                    gather: Some(gather),
                });
            }
        }
    }
    Ok(out)
}

/// Qwen3-Next stores Gated DeltaNet's input projections fused and interleaved per key
/// head: `in_proj_qkvz` rows are, for each key head g, `[q_g (dk), k_g (dk), v_g (r·dv),
/// z_g (r·dv)]` with `r = value heads / key heads`, and `in_proj_ba` rows `[b_g (r), a_g
/// (r)]`. They are rewritten as Qwen3.5's separate `in_proj_qkv` (all q, all k, all v —
/// the order the conv1d channels follow), `in_proj_z`, `in_proj_b`, `in_proj_a`, so the
/// engine meets one layout.
fn split_fused_linear_attention(
    tensors: Vec<SourceTensor>,
    cfg: &Value,
) -> Result<Vec<SourceTensor>> {
    if !tensors.iter().any(|t| {
        t.name.ends_with(".linear_attn.in_proj_qkvz.weight")
            || t.name.ends_with(".linear_attn.in_proj_ba.weight")
    }) {
        return Ok(tensors);
    }
    let dims = [
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
    ]
    .map(|k| get_u64(cfg, k).map(|v| v as usize));
    let [Some(nk), Some(nv), Some(dk), Some(dv)] = dims else {
        return Err(invalid(
            "config.json: fused in_proj_qkvz/in_proj_ba need linear_num_key_heads, \
             linear_num_value_heads, linear_key_head_dim and linear_value_head_dim",
        ));
    };
    let too_big = || invalid("config.json: linear attention dimensions overflow");
    if nk == 0 || !nv.is_multiple_of(nk) {
        return Err(invalid(format!(
            "config.json: {nv} value heads are not a multiple of {nk} key heads"
        )));
    }
    let r = nv / nk;
    let mut out = Vec::with_capacity(tensors.len() + 8);
    for t in tensors {
        let (base, qkvz) = if let Some(b) = t.name.strip_suffix("in_proj_qkvz.weight") {
            (b.to_string(), true)
        } else if let Some(b) = t.name.strip_suffix("in_proj_ba.weight") {
            (b.to_string(), false)
        } else {
            out.push(t);
            continue;
        };
        // Rows per key head in the fused matrix.
        let group = if qkvz {
            r.checked_mul(dv)
                .and_then(|x| x.checked_add(dk))
                .and_then(|x| x.checked_mul(2))
                .ok_or_else(too_big)?
        } else {
            r.checked_mul(2).ok_or_else(too_big)?
        };
        if t.shape.len() != 2 || Some(t.shape[0] as usize) != nk.checked_mul(group) {
            return Err(invalid(format!(
                "{}: shape {:?} does not match {nk} key heads of {group} rows",
                t.source_name, t.shape
            )));
        }
        let cols = t.shape[1] as usize;
        let mut push = |name: &str, ranges: Vec<(usize, usize)>| {
            let rows: usize = ranges.iter().map(|r| r.1).sum();
            out.push(SourceTensor {
                name: format!("{base}{name}"),
                shape: vec![rows as u64, cols as u64],
                gather: Some(RowGather {
                    cols,
                    ranges,
                    transposed: None,
                }),
                ..t.clone()
            });
        };
        if qkvz {
            // q of every group, then k, then v.
            let mut qkv = Vec::new();
            for (off, n) in [(0, dk), (dk, dk), (2 * dk, r * dv)] {
                qkv.extend((0..nk).map(|g| (g * group + off, n)));
            }
            push("in_proj_qkv.weight", qkv);
            let z_off = 2 * dk + r * dv;
            push(
                "in_proj_z.weight",
                (0..nk).map(|g| (g * group + z_off, r * dv)).collect(),
            );
        } else {
            push(
                "in_proj_b.weight",
                (0..nk).map(|g| (g * group, r)).collect(),
            );
            push(
                "in_proj_a.weight",
                (0..nk).map(|g| (g * group + r, r)).collect(),
            );
        }
    }
    Ok(out)
}

/// `model.layers.3.mlp.experts.gate_up_proj` → (`model.layers.3.mlp.experts.`, `gate_up_proj`).
fn fused_expert_role(name: &str) -> Option<(String, &str)> {
    let base = name.strip_suffix(".weight").unwrap_or(name);
    for role in ["gate_up_proj", "gate_proj", "up_proj", "down_proj"] {
        if let Some(prefix) = base.strip_suffix(role) {
            if prefix.ends_with(".mlp.experts.") {
                return Some((prefix.to_string(), role));
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// Header

fn get<'a>(cfg: &'a Value, key: &str) -> Option<&'a Value> {
    cfg.get(key).filter(|v| !v.is_null())
}

fn get_u64(cfg: &Value, key: &str) -> Option<u64> {
    get(cfg, key).and_then(Value::as_u64)
}

fn get_f64(cfg: &Value, key: &str) -> Option<f64> {
    get(cfg, key).and_then(Value::as_f64)
}

fn need_u64(cfg: &Value, key: &str) -> Result<u64> {
    get_u64(cfg, key)
        .ok_or_else(|| invalid(format!("config.json: {key} is missing or not an integer")))
}

/// `rope_parameters` (transformers ≥ 5) or the older top-level fields; for configs with a
/// block per attention kind (Gemma 3), the block of `kind`.
fn rope_value(cfg: &Value, kind: &str, key: &str) -> Option<f64> {
    if let Some(rp) = get(cfg, "rope_parameters") {
        if let Some(v) = get_f64(rp, key) {
            return Some(v);
        }
        if let Some(v) = rp.get(kind).and_then(|b| get_f64(b, key)) {
            return Some(v);
        }
    }
    if let Some(rs) = get(cfg, "rope_scaling") {
        if let Some(v) = get_f64(rs, key) {
            return Some(v);
        }
    }
    get_f64(cfg, key)
}

/// The sliding layers' RoPE base: transformers 4's `rope_local_base_freq`, or the
/// `sliding_attention` block of `rope_parameters` (transformers ≥ 5), or Gemma 3's default
/// 10000. Not [`rope_value`]: its fallback to the top-level `rope_theta` (the global base
/// in transformers 4 configs) would give the local layers the global base.
fn rope_local_base(cfg: &Value, model_type: &str) -> Option<f64> {
    get_f64(cfg, "rope_local_base_freq")
        .or_else(|| {
            get(cfg, "rope_parameters")
                .and_then(|rp| get(rp, "sliding_attention"))
                .and_then(|b| get_f64(b, "rope_theta"))
        })
        .or(model_type.starts_with("gemma3").then_some(10_000.0))
}

/// Gemma's embedding scale √hidden, exactly as f32 arithmetic has it.
pub fn embed_scale(hidden: u64) -> f64 {
    (hidden as f32).sqrt() as f64
}

fn layer_type_name(hf: &str) -> Option<&'static str> {
    Some(match hf {
        "full_attention" => "FullAttention",
        "linear_attention" => "LinearAttention",
        "sliding_attention" => "SlidingAttention",
        _ => return None,
    })
}

fn is_gemma(model_type: &str) -> bool {
    model_type.starts_with("gemma")
}

/// Families whose Hugging Face RMSNorm is zero-centred (`x̂·(1+w)`), per NOTES.md.
fn zero_centred_norm(model_type: &str) -> bool {
    is_gemma(model_type)
        || model_type.starts_with("qwen3_5")
        || model_type.starts_with("qwen3_next")
}

fn layer_types(cfg: &Value, model_type: &str, n: u64) -> Result<Vec<String>> {
    if let Some(lt) = get(cfg, "layer_types").and_then(Value::as_array) {
        if lt.len() as u64 != n {
            return Err(invalid(format!(
                "config.json: layer_types has {} entries for {n} layers",
                lt.len()
            )));
        }
        return lt
            .iter()
            .map(|v| {
                v.as_str()
                    .and_then(layer_type_name)
                    .map(str::to_string)
                    .ok_or_else(|| invalid(format!("config.json: unknown layer type {v}")))
            })
            .collect();
    }
    let full = |i: u64, interval: u64| interval > 0 && (i + 1).is_multiple_of(interval);
    Ok((0..n)
        .map(|i| {
            let t = if let Some(k) = get_u64(cfg, "full_attention_interval") {
                if full(i, k) {
                    "FullAttention"
                } else {
                    "LinearAttention"
                }
            } else if model_type == "gemma2" {
                // Gemma 2 alternates, starting with a sliding layer.
                if i % 2 == 0 {
                    "SlidingAttention"
                } else {
                    "FullAttention"
                }
            } else if let Some(k) = get_u64(cfg, "sliding_window_pattern")
                .or_else(|| get_u64(cfg, "_sliding_window_pattern"))
                .filter(|_| is_gemma(model_type))
            {
                if full(i, k) {
                    "FullAttention"
                } else {
                    "SlidingAttention"
                }
            } else {
                "FullAttention"
            };
            t.to_string()
        })
        .collect())
}

/// `hidden_act` spelled as the reference writes it (`gelu_tanh`), `None` for SiLU.
fn hidden_act(cfg: &Value) -> Option<String> {
    let a = get(cfg, "hidden_activation")
        .or_else(|| get(cfg, "hidden_act"))
        .and_then(Value::as_str)?;
    match a {
        "silu" | "swish" => None,
        "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => Some("gelu_tanh".into()),
        other => Some(other.to_string()),
    }
}

/// The `arch` block of the header for `cfg` (the text model's config) and the tensors the
/// checkpoint actually holds (tied embeddings, MoE layers, MTP are decided by presence).
pub fn build_arch(cfg: &Value, tensor_names: &[&str]) -> Result<Arch> {
    let model_type = get(cfg, "model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("config.json: model_type is missing"))?
        .to_string();
    let hidden = need_u64(cfg, "hidden_size")?;
    let num_layers = need_u64(cfg, "num_hidden_layers")?;
    let heads = get_u64(cfg, "num_attention_heads");
    let has = |n: &str| tensor_names.contains(&n);
    let has_suffix = |s: &str| tensor_names.iter().any(|n| n.contains(s));
    let layer_types = layer_types(cfg, &model_type, num_layers)?;
    let mut arch = Arch {
        arch_name: model_type.clone(),
        hidden_size: hidden,
        intermediate_size: get_u64(cfg, "intermediate_size"),
        num_layers,
        num_attention_heads: heads,
        num_kv_heads: get_u64(cfg, "num_key_value_heads").or(heads),
        head_dim: get_u64(cfg, "head_dim").or_else(|| heads.filter(|&h| h > 0).map(|h| hidden / h)),
        vocab_size: need_u64(cfg, "vocab_size")?,
        layer_types: Some(layer_types.clone()),
        rms_norm_eps: get_f64(cfg, "rms_norm_eps").or_else(|| get_f64(cfg, "layer_norm_eps")),
        norm_style: Some(if zero_centred_norm(&model_type) {
            NormStyle::Gemma
        } else {
            NormStyle::Qwen
        }),
        rope_theta: rope_value(cfg, "full_attention", "rope_theta"),
        // Tensor-driven: without an lm_head the embedding is the output projection.
        tie_word_embeddings: Some(!has("lm_head.weight")),
        partial_rotary_factor: Some(
            rope_value(cfg, "full_attention", "partial_rotary_factor").unwrap_or(1.0),
        ),
        max_position_embeddings: get_u64(cfg, "max_position_embeddings"),
        ..Arch::default()
    };
    let x = &mut arch.extra;
    // Long-context RoPE variants (llama3, yarn, ...) change every rotation: carry their
    // parameters through as given.
    let rope = get(cfg, "rope_parameters").or_else(|| get(cfg, "rope_scaling"));
    if let Some(r) = rope.filter(|r| {
        r.get("rope_type")
            .or_else(|| r.get("type"))
            .and_then(Value::as_str)
            .is_some_and(|t| t != "default")
    }) {
        x.insert("rope_scaling".into(), r.clone());
    }
    if let Some(act) = hidden_act(cfg) {
        x.insert("hidden_act".into(), json!(act));
    }
    if is_gemma(&model_type) {
        // Gemma scales the embedding by √hidden: the f32 value, as transformers in f32 and
        // llama.cpp compute it (and as import-gguf writes it); bf16 rounding is an option
        // of `convert` ([`ConvertOptions::embed_scale_bf16`]).
        x.insert("embed_multiplier".into(), json!(embed_scale(hidden)));
        if let Some(q) = get_f64(cfg, "query_pre_attn_scalar") {
            x.insert("query_pre_attn_scalar".into(), json!(q));
        }
        for k in [
            "attn_logit_softcapping",
            "final_logit_softcapping",
            "sliding_window",
        ] {
            if let Some(v) = get(cfg, k) {
                x.insert(k.into(), v.clone());
            }
        }
        if let Some(local) = rope_local_base(cfg, &model_type) {
            x.insert("rope_local_base_freq".into(), json!(local));
        }
    } else if layer_types.iter().any(|t| t == "SlidingAttention") {
        if let Some(v) = get(cfg, "sliding_window") {
            x.insert("sliding_window".into(), v.clone());
        }
    }
    if layer_types.iter().any(|t| t == "LinearAttention") {
        arch.linear_conv_kernel_dim = get_u64(cfg, "linear_conv_kernel_dim");
        arch.linear_num_key_heads = get_u64(cfg, "linear_num_key_heads");
        arch.linear_num_value_heads = get_u64(cfg, "linear_num_value_heads");
        let x = &mut arch.extra;
        for k in ["linear_key_head_dim", "linear_value_head_dim"] {
            if let Some(v) = get_u64(cfg, k) {
                x.insert(k.into(), json!(v));
            }
        }
        x.insert(
            "linear_core".into(),
            json!({
                "kind": "gated_delta_net",
                "num_heads": arch.linear_num_value_heads,
                "value_head_dim": get_u64(cfg, "linear_value_head_dim"),
            }),
        );
    }
    if has_suffix(".mlp.gate.weight") {
        let num_experts = get_u64(cfg, "num_experts")
            .or_else(|| get_u64(cfg, "num_local_experts"))
            .ok_or_else(|| invalid("config.json: MoE router present but num_experts missing"))?;
        let top_k = need_u64(cfg, "num_experts_per_tok")?;
        if top_k > num_experts {
            return Err(invalid(format!(
                "config.json: num_experts_per_tok {top_k} exceeds num_experts {num_experts}"
            )));
        }
        // transformers' defaults: Qwen2-MoE and Qwen3-MoE do not renormalise the top-k
        // unless told; Qwen3-Next and Qwen3.5-MoE always do.
        let default_norm = !(model_type.starts_with("qwen2_moe") || model_type == "qwen3_moe");
        let shared = get_u64(cfg, "shared_expert_intermediate_size")
            .filter(|&s| s > 0 && has_suffix(".mlp.shared_expert."));
        arch.moe = Some(Moe {
            num_experts,
            top_k,
            moe_intermediate_size: get_u64(cfg, "moe_intermediate_size"),
            norm_topk_prob: Some(
                get(cfg, "norm_topk_prob")
                    .and_then(Value::as_bool)
                    .unwrap_or(default_norm),
            ),
            shared_expert_intermediate_size: shared,
            ..Moe::default()
        });
    }
    if tensor_names.iter().any(|n| n.starts_with("model.mtp.")) {
        let layers = get_u64(cfg, "mtp_num_hidden_layers")
            .or_else(|| get_u64(cfg, "num_nextn_predict_layers"))
            .unwrap_or_else(|| {
                let mut idx: Vec<&str> = tensor_names
                    .iter()
                    .filter_map(|n| n.strip_prefix("model.mtp.layers."))
                    .filter_map(|r| r.split('.').next())
                    .collect();
                idx.sort();
                idx.dedup();
                idx.len() as u64
            });
        arch.mtp = Some(Mtp {
            num_layers: layers,
            share_lm_head: Some(!has("model.mtp.lm_head.weight")),
            share_embed: Some(!has("model.mtp.embed_tokens.weight")),
            ..Mtp::default()
        });
    }
    Ok(arch)
}

fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .into_iter()
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

/// The chat bundle (§6.1): template from `chat_template.jinja` or `tokenizer_config.json`
/// (a string, or the `default` entry of a list of named templates); EOS ids from the
/// config, `generation_config.json` and the tokenizer's `eos_token`.
pub fn tokenizer_config(ck: &Checkpoint, root_config: &Value) -> Result<Option<TokenizerConfig>> {
    let tok_cfg: Option<Value> = match ck.optional_text("tokenizer_config.json")? {
        Some(t) => Some(
            serde_json::from_str(&t).map_err(|e| invalid(format!("tokenizer_config.json: {e}")))?,
        ),
        None => None,
    };
    let gen_cfg: Option<Value> = match ck.optional_text("generation_config.json")? {
        Some(t) => Some(
            serde_json::from_str(&t)
                .map_err(|e| invalid(format!("generation_config.json: {e}")))?,
        ),
        None => None,
    };
    let template = match ck.optional_text("chat_template.jinja")? {
        Some(t) => Some(t),
        None => tok_cfg
            .as_ref()
            .and_then(|tc| match tc.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|e| e.get("name").and_then(Value::as_str) == Some("default"))
                    .or_else(|| list.first())
                    .and_then(|e| e.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
                _ => None,
            }),
    };
    let cfg = &ck.config;
    let mut eos = ids_of(get(cfg, "eos_token_id").or_else(|| get(root_config, "eos_token_id")));
    for id in ids_of(gen_cfg.as_ref().and_then(|g| get(g, "eos_token_id"))) {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    // The tokenizer's eos_token, resolved through tokenizer.json's added tokens.
    let eos_token = tok_cfg.as_ref().and_then(|tc| match tc.get("eos_token") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    });
    if let (Some(tok), Some(text)) = (eos_token, ck.optional_text("tokenizer.json")?) {
        if let Ok(tj) = serde_json::from_str::<Value>(&text) {
            let id = tj
                .get("added_tokens")
                .and_then(Value::as_array)
                .and_then(|a| {
                    a.iter()
                        .find(|t| t.get("content").and_then(Value::as_str) == Some(tok.as_str()))
                })
                .and_then(|t| t.get("id"))
                .and_then(Value::as_u64)
                .and_then(|x| u32::try_from(x).ok());
            if let Some(id) = id {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
    }
    let id = |k: &str| {
        get(cfg, k)
            .or_else(|| get(root_config, k))
            .or_else(|| gen_cfg.as_ref().and_then(|g| get(g, k)))
            .and_then(Value::as_u64)
            .and_then(|x| u32::try_from(x).ok())
    };
    let bundle = TokenizerConfig {
        chat_template: template,
        eos_token_ids: eos,
        bos_token_id: id("bos_token_id"),
        pad_token_id: id("pad_token_id"),
        ..TokenizerConfig::default()
    };
    if bundle == TokenizerConfig::default() {
        return Ok(None);
    }
    Ok(Some(bundle))
}

// ---------------------------------------------------------------------------------------
// Dtype choice and order

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// The dtype of weight matrices (`--quant`).
    pub quant: DType,
    /// Encoder options (`--mean-bits` for vbit).
    pub encode: EncodeOptions,
    /// The dtype of a 2-D tensor that `quant` cannot hold; `None` = `q8_row`.
    pub fallback: Option<DType>,
    /// Write shards of at most this many bytes (rough f32 size, §10).
    pub shard_max_bytes: Option<u64>,
    /// Free-form text recorded as `provenance.source_model` (default: the directory).
    pub source_label: Option<String>,
    /// Round Gemma's √hidden embedding scale to bf16, as transformers does when it runs
    /// the model in bf16 (`--embed-scale-bf16`). Off: the exact f32 value, which
    /// transformers in f32 and llama.cpp use.
    pub embed_scale_bf16: bool,
    /// The §3.2 B-field (`--route-stats`): routed experts' selection frequencies, which
    /// scale their row magnitudes when a `vbit` family budget is water-filled.
    pub b_field: Option<super::bfield::BField>,
}

impl ConvertOptions {
    pub fn new(quant: DType) -> ConvertOptions {
        ConvertOptions {
            quant,
            encode: EncodeOptions::default(),
            fallback: None,
            shard_max_bytes: None,
            source_label: None,
            embed_scale_bf16: false,
            b_field: None,
        }
    }
}

/// A tensor written in another dtype than asked for, and why (recorded in provenance).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Fallback {
    pub tensor: String,
    pub dtype: DType,
    pub reason: String,
}

/// Tensors a quantizer must not touch: the MoE router and shared-expert gate decide which
/// weights run at all, and Gated DeltaNet's `a`/`b` projections drive its decay and
/// write strength; the reference converter keeps them f16 too.
pub(crate) fn precision_sensitive(name: &str) -> bool {
    name.ends_with(".mlp.gate.weight")
        || name.ends_with(".shared_expert_gate.weight")
        || name.ends_with(".linear_attn.in_proj_a.weight")
        || name.ends_with(".linear_attn.in_proj_b.weight")
        || name.ends_with(".linear_attn.in_proj_ba.weight")
}

/// The dtype of one tensor, and the fallback reason when it is not `opts.quant`.
pub fn choose_dtype(name: &str, shape: &[u64], opts: &ConvertOptions) -> (DType, Option<String>) {
    let q = opts.quant;
    if q == DType::F32 {
        return (DType::F32, None);
    }
    if crate::format::dtype::always_float(shape) {
        return (DType::F16, None);
    }
    if matches!(q, DType::F16 | DType::Bf16) {
        return (q, None);
    }
    if precision_sensitive(name) {
        return (DType::F16, Some("router/gate kept at f16".into()));
    }
    if shape.len() != 2 {
        return (
            DType::F16,
            Some(format!("{}-D tensor kept at f16", shape.len())),
        );
    }
    if q.size_for(shape).is_ok() {
        return (q, None);
    }
    let fb = opts.fallback.unwrap_or(DType::Q8Row);
    let reason = format!("{q} cannot hold cols = {} (needs cols % 32 == 0)", shape[1]);
    if fb.size_for(shape).is_ok() {
        (fb, Some(reason))
    } else {
        (DType::F16, Some(reason))
    }
}

/// Sort key: natural order of names (numbers compared as numbers), except that the experts
/// of one layer are grouped by role — all `gate_proj`, then all `up_proj`, then all
/// `down_proj`, experts in index order (§2.2).
fn order_key(name: &str) -> Vec<(u64, String)> {
    match expert_parts(name) {
        Some((prefix, e, role)) => {
            let role = ["gate_proj", "up_proj", "down_proj"]
                .iter()
                .position(|r| *r == role)
                .unwrap_or(0) as u64;
            let mut k = natural(prefix);
            k.push((role, String::new()));
            k.push((e, String::new()));
            k
        }
        None => natural(name),
    }
}

/// `model.layers.3.mlp.experts.7.up_proj.weight` → (`model.layers.3.mlp.experts.`, 7,
/// `up_proj`): a routed expert's matrix (gate, up or down), else `None`.
fn expert_parts(name: &str) -> Option<(&str, u64, &str)> {
    let at = name.find(".mlp.experts.")? + ".mlp.experts.".len();
    let (expert, tail) = name[at..].split_once('.')?;
    let role = tail.strip_suffix(".weight")?;
    matches!(role, "gate_proj" | "up_proj" | "down_proj")
        .then_some(())
        .and(expert.parse().ok())
        .map(|e| (&name[..at], e, role))
}

fn natural(s: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut num: Option<u64> = None;
    for c in s.chars() {
        if let Some(d) = c.to_digit(10) {
            if num.is_none() {
                out.push((u64::MAX, std::mem::take(&mut text)));
            }
            num = Some(num.unwrap_or(0).saturating_mul(10).saturating_add(d as u64));
        } else {
            if let Some(n) = num.take() {
                out.push((n, String::new()));
            }
            text.push(c);
        }
    }
    if let Some(n) = num {
        out.push((n, String::new()));
    }
    out.push((u64::MAX, text));
    out
}

/// Everything decided before the first byte is written.
pub struct ConvertPlan {
    pub spec: WriteSpec,
    /// For each planned tensor, its index in `Checkpoint::tensors`.
    pub sources: Vec<usize>,
    pub fallbacks: Vec<Fallback>,
}

/// Plans the output: header, tensor order and dtypes, vocab.
pub fn plan(ck: &Checkpoint, opts: &ConvertOptions) -> Result<ConvertPlan> {
    if opts.quant.is_reserved() {
        return Err(HfError::Unsupported(format!(
            "dtype {} is reserved and cannot be written",
            opts.quant
        )));
    }
    let root_config = read_json(&ck.dir.join("config.json"))?;
    let names: Vec<&str> = ck.tensors.iter().map(|t| t.name.as_str()).collect();
    let mut arch = build_arch(&ck.config, &names)?;
    if opts.embed_scale_bf16 {
        if let Some(m) = arch.extra.get_mut("embed_multiplier") {
            let exact = m.as_f64().unwrap_or_default() as f32;
            *m = json!(half::bf16::from_f32(exact).to_f32() as f64);
        }
    }
    let mut order: Vec<usize> = (0..ck.tensors.len()).collect();
    order.sort_by_cached_key(|&i| order_key(&ck.tensors[i].name));
    let mut tensors = Vec::with_capacity(order.len());
    let mut fallbacks = Vec::new();
    for &i in &order {
        let t = &ck.tensors[i];
        let (dtype, why) = choose_dtype(&t.name, &t.shape, opts);
        if let Some(reason) = why {
            fallbacks.push(Fallback {
                tensor: t.name.clone(),
                dtype,
                reason,
            });
        }
        tensors.push(TensorPlan {
            name: t.name.clone(),
            dtype,
            shape: t.shape.clone(),
        });
    }
    let mut options = Map::new();
    options.insert("quant".into(), json!(opts.quant.name()));
    if let Some(b) = opts.encode.mean_bits {
        options.insert("mean_bits".into(), json!(b));
    }
    if let Some(f) = opts.fallback {
        options.insert("fallback".into(), json!(f.name()));
    }
    if let Some(s) = opts.shard_max_bytes {
        options.insert("shard_max_bytes".into(), json!(s));
    }
    if opts.embed_scale_bf16 {
        options.insert("embed_scale_bf16".into(), json!(true));
    }
    if matches!(opts.quant, DType::Vbit | DType::VbitRo)
        && tensors.iter().any(|t| expert_family(&t.name).is_some())
    {
        options.insert(
            "vbit_budget".into(),
            json!("shared by the routed experts of each layer and projection (§3.2)"),
        );
        if let Some(b) = &opts.b_field {
            options.insert(
                "vbit_b_field".into(),
                json!({"source": "route stats", "tokens": b.tokens}),
            );
        }
    }
    let mut provenance = Map::new();
    provenance.insert("tool".into(), json!("cortiq convert"));
    provenance.insert(
        "source_model".into(),
        json!(opts
            .source_label
            .clone()
            .unwrap_or_else(|| ck.dir.display().to_string())),
    );
    provenance.insert("options".into(), Value::Object(options));
    if !fallbacks.is_empty() {
        provenance.insert(
            "fallbacks".into(),
            serde_json::to_value(&fallbacks).unwrap_or_default(),
        );
    }
    if !ck.dropped.is_empty() {
        provenance.insert("dropped_tensors".into(), json!(ck.dropped.len()));
    }
    let header = Header {
        format: Some("cmf".into()),
        version: Some(2),
        arch: Some(arch),
        quant_type: Some(opts.quant.quant_type_label().into()),
        provenance: Some(Value::Object(provenance)),
        tokenizer_config: tokenizer_config(ck, &root_config)?,
        ..Header::default()
    };
    let tok = ck.dir.join("tokenizer.json");
    let vocab = if tok.is_file() {
        Some(read_file(&tok)?)
    } else {
        None
    };
    Ok(ConvertPlan {
        spec: WriteSpec {
            header,
            tensors,
            vocab,
            ..WriteSpec::default()
        },
        sources: order,
        fallbacks,
    })
}

/// A routed expert's family (§3.2: layer × projection), e.g.
/// `("model.layers.3.mlp.experts.", "up_proj")`.
fn expert_family(name: &str) -> Option<(&str, &str)> {
    expert_parts(name).map(|(prefix, _, role)| (prefix, role))
}

/// The `vbit` row widths of every routed expert written as `vbit`/`vbit_ro`, decided per
/// family (§3.2): the budget is shared by all the family's rows, which is water-filling
/// over them jointly — a loud expert gets more bits, a quiet one is held at the floor.
/// One streamed first pass over the experts gathers their row magnitudes.
fn expert_widths(
    ck: &Checkpoint,
    plan: &ConvertPlan,
    opts: &ConvertOptions,
) -> Result<HashMap<usize, quant::rows::Decision>> {
    use rayon::prelude::*;
    let mut families: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for (i, t) in plan.spec.tensors.iter().enumerate() {
        if matches!(t.dtype, DType::Vbit | DType::VbitRo) {
            if let Some(f) = expert_family(&t.name) {
                families.entry(f).or_default().push(i);
            }
        }
    }
    let mut out = HashMap::new();
    for members in families.values() {
        let magnitudes: Vec<Vec<f64>> = members
            .par_iter()
            .map(|&i| -> Result<Vec<f64>> {
                let (t, src) = (&plan.spec.tensors[i], &ck.tensors[plan.sources[i]]);
                let quant_err = |source| HfError::Quant {
                    tensor: t.name.clone(),
                    source,
                };
                let g = quant::geometry(t.dtype, &t.shape).map_err(quant_err)?;
                let stats = quant::rows::first_pass(
                    t.dtype,
                    &t.shape,
                    |rows, v| ck.read_rows(src, rows, g.cols, v),
                    quant_err,
                )?;
                match stats {
                    Some(quant::rows::Stats::RowMagnitudes(m)) => Ok(m),
                    _ => Err(invalid(format!("{}: no row magnitudes for vbit", t.name))),
                }
            })
            .collect::<Result<_>>()?;
        let dtype = plan.spec.tensors[members[0]].dtype;
        let budget = quant::vbit_budget(dtype, &opts.encode).map_err(|source| HfError::Quant {
            tensor: plan.spec.tensors[members[0]].name.clone(),
            source,
        })?;
        let factors = match &opts.b_field {
            Some(b) => b
                .family_factors(members.iter().map(|&i| plan.spec.tensors[i].name.as_str()))
                .map_err(HfError::Unsupported)?,
            None => None,
        };
        let bits = quant::vbit::allocate_family(&magnitudes, factors.as_deref(), budget);
        for (&i, b) in members.iter().zip(bits) {
            out.insert(i, quant::rows::Decision::Bits(b));
        }
    }
    Ok(out)
}

/// Progress of a running conversion, one event per tensor written.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    pub done: usize,
    pub total: usize,
    pub name: &'a str,
    /// Source bytes of the tensor just written.
    pub source_bytes: u64,
}

/// What a finished conversion wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConvertSummary {
    pub files: Vec<WriteSummary>,
    pub tensors: usize,
    pub fallbacks: Vec<Fallback>,
    pub source_bytes: u64,
}

/// Converts the checkpoint `dir` into `out` (or shards of it), tensor by tensor.
pub fn convert(
    dir: &Path,
    out: &Path,
    opts: &ConvertOptions,
    on_progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConvertSummary> {
    let ck = Checkpoint::open(dir)?;
    let plan = plan(&ck, opts)?;
    let total = plan.spec.tensors.len();
    let dtypes: Vec<DType> = plan.spec.tensors.iter().map(|t| t.dtype).collect();
    let mut source_bytes = 0u64;
    let mut failure: Option<HfError> = None;
    let max = opts.shard_max_bytes.unwrap_or(u64::MAX);
    let widths = expert_widths(&ck, &plan, opts)?;
    // Encoding is the expensive part and tensors are independent: encode a batch ahead on
    // all threads, then hand the payloads to the writer in order. A tensor is read a block
    // of rows at a time where its codec allows (quant::rows), so its f32 values never
    // exist whole; the batch is bounded by what its tensors hold in memory.
    let encode_one = |i: usize| -> Result<Vec<u8>> {
        let src = &ck.tensors[plan.sources[i]];
        let dtype = dtypes[i];
        let quant_err = |source| HfError::Quant {
            tensor: src.name.clone(),
            source,
        };
        let g = quant::geometry(dtype, &src.shape).map_err(quant_err)?;
        let streamed = quant::rows::encode_row_blocks(
            dtype,
            &src.shape,
            &opts.encode,
            widths.get(&i).cloned(),
            |rows, out| ck.read_rows(src, rows, g.cols, out),
            |_, _, _| Ok(()),
            quant_err,
        )?;
        if let Some(payload) = streamed {
            // Rows read were released as they went, except for strided (transposed) reads.
            ck.release(src);
            return Ok(payload);
        }
        let values = ck.values(src);
        ck.release(src);
        quant::encode(dtype, &src.shape, &values?, &opts.encode).map_err(quant_err)
    };
    let working_set =
        |i: usize| quant::rows::encoding_bytes(dtypes[i], &ck.tensors[plan.sources[i]].shape);
    const BATCH_BYTES: u64 = 64 << 20;
    let mut ready: std::collections::VecDeque<(usize, Result<Vec<u8>>)> =
        std::collections::VecDeque::new();
    let result = writer::write_sharded(out, plan.spec, max, |i| {
        if ready.front().is_none_or(|(j, _)| *j != i) {
            ready.clear();
            let end = super::batch_end(i, total, BATCH_BYTES, working_set);
            use rayon::prelude::*;
            let batch: Vec<(usize, Result<Vec<u8>>)> = (i..end)
                .into_par_iter()
                .map(|k| (k, encode_one(k)))
                .collect();
            ready.extend(batch);
        }
        let (_, encoded) = ready.pop_front().expect("the batch holds tensor i");
        let src = &ck.tensors[plan.sources[i]];
        match encoded {
            Ok(bytes) => {
                let n = crate::format::dtype::numel(&src.shape)
                    .unwrap_or(0)
                    .saturating_mul(src.dtype.width() as u64);
                source_bytes += n;
                on_progress(Progress {
                    done: i + 1,
                    total,
                    name: &src.name,
                    source_bytes: n,
                });
                Ok(std::borrow::Cow::Owned(bytes))
            }
            Err(e) => {
                let msg = e.to_string();
                failure = Some(e);
                Err(crate::format::error::parse(msg))
            }
        }
    });
    let files = match result {
        Ok(f) => f,
        Err(e) => return Err(failure.unwrap_or(HfError::Format(e))),
    };
    Ok(ConvertSummary {
        files,
        tensors: total,
        fallbacks: plan.fallbacks,
        source_bytes,
    })
}
