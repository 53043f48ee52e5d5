//! Rewrites of an existing CMF file into a new one — the authoring tools of §11, §11.1, §5
//! and §3.1: [`defrag`] (dead FFN neurons removed), [`experts`] (`moe-defrag`: experts
//! dropped; `moe-mask`: an expert mask added) and [`requant`] (chosen tensors re-encoded).
//!
//! Each reads the source through its mmap and streams the output through
//! `format::writer` one tensor at a time (temporary file + rename, so a failed rewrite
//! leaves nothing behind, and the writer recomputes every hash). A tensor a rewrite does
//! not change is copied byte for byte; one it changes is decoded a block of rows at a
//! time and re-encoded on all threads (`quant::rows`), so no tensor's f32 values need to
//! exist whole.

pub mod defrag;
pub mod experts;
pub mod requant;

use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::format::directory::TensorEntry;
use crate::format::dtype::{DType, Size};
use crate::format::header::Header;
use crate::format::layers::LAYER_PREFIX;
use crate::format::masks::MaskView;
use crate::format::writer::{StreamWriter, TensorPlan, WriteSpec, WriteSummary};
use crate::format::{escape_str, CmfFile, FormatError};
use crate::quant::{self, rows::Decision, EncodeOptions, Geom};

/// Why a rewrite did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// A task the file has no mask for.
    #[error("{}", unknown_task_message(task, available))]
    UnknownTask {
        task: String,
        available: Vec<String>,
    },
    /// The request cannot be carried out on this file as asked (a mask that turns off
    /// heads, route stats of another model, a layer left without neurons): a usage
    /// error, exit 2.
    #[error("{0}")]
    Refused(String),
    /// The file contradicts itself (shapes, payloads): exit 1.
    #[error("{0}")]
    Invalid(String),
    /// Reading or writing failed (the writer's I/O errors, exit 2).
    #[error(transparent)]
    Format(#[from] FormatError),
}

pub type Result<T> = std::result::Result<T, RewriteError>;

fn unknown_task_message(task: &str, available: &[String]) -> String {
    if available.is_empty() {
        format!("unknown task {:?}: the file has no masks", escape_str(task))
    } else {
        format!(
            "unknown task {:?}; available tasks: {}",
            escape_str(task),
            available
                .iter()
                .map(|s| escape_str(s))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

pub(crate) fn refused(m: impl Into<String>) -> RewriteError {
    RewriteError::Refused(m.into())
}

pub(crate) fn invalid(m: impl Into<String>) -> RewriteError {
    RewriteError::Invalid(m.into())
}

/// The task mask `task` of `file`, or [`RewriteError::UnknownTask`] naming the file's tasks.
pub fn find_task<'a>(file: &'a CmfFile, task: &str) -> Result<MaskView<'a>> {
    file.mask_by_name(task)
        .ok_or_else(|| RewriteError::UnknownTask {
            task: task.to_string(),
            available: file
                .masks
                .iter()
                .flat_map(|m| m.meta.masks.iter().map(|r| r.name.clone()))
                .collect(),
        })
}

/// Refuses what no rewrite here handles: a standalone skill file (§9.1: not a model) and
/// one shard of a sharded model (§10: a rewrite needs every layer in one file).
pub(crate) fn check_source(file: &CmfFile) -> Result<()> {
    if file.is_skill_file() {
        return Err(refused(
            "a standalone skill file (SKILL_FILE, §9.1) is not a model: apply it to its base first (cortiq skill apply)",
        ));
    }
    if file.header.shard.is_some_and(|s| s.count > 1) {
        return Err(refused(
            "one shard of a sharded model (§10): this rewrite needs the whole model in one file",
        ));
    }
    Ok(())
}

/// The number of decoder layers, from `arch`.
pub(crate) fn num_layers(file: &CmfFile) -> Result<u64> {
    file.header
        .arch
        .as_ref()
        .map(|a| a.num_layers)
        .ok_or_else(|| invalid("the header has no arch"))
}

/// `model.layers.{l}.{rest}` → `(l, rest)`.
pub fn layer_of(name: &str) -> Option<(u64, &str)> {
    let (l, rest) = name.strip_prefix(LAYER_PREFIX)?.split_once('.')?;
    if l.is_empty() || !l.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((l.parse().ok()?, rest))
}

/// The base tensor a skill tensor `skill.{id}.{base}` replaces, for the longest id of the
/// file's registry that matches; the name itself for a base tensor.
pub(crate) fn base_name<'a>(file: &CmfFile, name: &'a str) -> &'a str {
    file.header
        .skills
        .iter()
        .flatten()
        .filter_map(|s| crate::format::skills::replaced_name(name, &s.id).map(|b| (s.id.len(), b)))
        .filter(|(_, b)| !b.is_empty())
        .max_by_key(|(n, _)| *n)
        .map_or(name, |(_, b)| b)
}

/// Rows of a stored tensor decoded one at a time, O(row) each whatever the dtype: `vbit`
/// (no offset table) gets its row starts once, `q1s` (one flat overlay list) is decoded
/// whole once. The payload is validated up front.
pub(crate) struct StoredRows<'a> {
    dtype: DType,
    shape: &'a [u64],
    bytes: &'a [u8],
    pub g: Geom,
    how: How,
}

enum How {
    Direct,
    Starts(Vec<usize>),
    Whole(Vec<f32>),
}

impl<'a> StoredRows<'a> {
    pub(crate) fn new(e: &'a TensorEntry, bytes: &'a [u8]) -> Result<StoredRows<'a>> {
        let bad = |m: String| invalid(format!("tensor {}: {m}", escape_str(&e.name)));
        quant::validate(e.dtype, &e.shape, bytes).map_err(|x| bad(x.to_string()))?;
        let g = quant::geometry(e.dtype, &e.shape).map_err(|x| bad(x.to_string()))?;
        let how = match e.dtype {
            DType::Vbit => How::Starts(quant::vbit::row_starts(g, bytes).map_err(bad)?),
            DType::Q1s => {
                How::Whole(quant::decode(e.dtype, &e.shape, bytes).map_err(|x| bad(x.to_string()))?)
            }
            _ => How::Direct,
        };
        Ok(StoredRows {
            dtype: e.dtype,
            shape: &e.shape,
            bytes,
            g,
            how,
        })
    }

    /// Decodes row `r` into `out` (`g.cols` values).
    pub(crate) fn read(&self, r: usize, out: &mut [f32]) -> std::result::Result<(), String> {
        match &self.how {
            How::Direct => quant::decode_row(self.dtype, self.shape, self.bytes, r, out)
                .map_err(|e| e.to_string()),
            How::Starts(s) => {
                quant::vbit::decode_row_from(self.dtype, self.g, self.bytes, r, s[r], out)
            }
            How::Whole(v) => {
                out.copy_from_slice(&v[r * self.g.cols..(r + 1) * self.g.cols]);
                Ok(())
            }
        }
    }

    /// Decodes the source rows `rows` (in that order) into `out`, one after the other.
    pub(crate) fn read_rows(
        &self,
        rows: impl Iterator<Item = usize>,
        out: &mut [f32],
    ) -> std::result::Result<(), String> {
        for (r, o) in rows.zip(out.chunks_exact_mut(self.g.cols.max(1))) {
            self.read(r, o)?;
        }
        Ok(())
    }
}

/// Encodes a `dtype` tensor of `shape` whose rows `fill(rows, values)` produces: a block of
/// rows at a time on all threads where the codec allows (`quant::rows`), else all values
/// at once. `decision` fixes what a codec would otherwise decide from all rows (`vbit`
/// widths, the `q8_2f` column field).
pub(crate) fn encode_rows(
    dtype: DType,
    shape: &[u64],
    opts: &EncodeOptions,
    decision: Option<Decision>,
    fill: impl Fn(Range<usize>, &mut [f32]) -> std::result::Result<(), String> + Sync,
) -> std::result::Result<Vec<u8>, String> {
    let streamed = quant::rows::encode_row_blocks(
        dtype,
        shape,
        opts,
        decision,
        &fill,
        |_, _, _| Ok(()),
        |e| e.to_string(),
    )?;
    if let Some(p) = streamed {
        return Ok(p);
    }
    let g = quant::geometry(dtype, shape).map_err(|e| e.to_string())?;
    let mut values = Vec::new();
    values
        .try_reserve_exact(g.numel)
        .map_err(|_| format!("cannot allocate {} values", g.numel))?;
    values.resize(g.numel, 0f32);
    fill(0..g.rows, &mut values)?;
    quant::encode(dtype, shape, &values, opts).map_err(|e| e.to_string())
}

/// How to re-encode (part of) a stored tensor in its own dtype so that what its encoder
/// chose survives: `vbit` keeps the width of each source row in `rows` (the output's rows,
/// as source indices), `q1s`/`q1t` keep their overlay fraction. Other codecs decide
/// nothing beyond the values.
pub(crate) fn same_choices(
    e: &TensorEntry,
    bytes: &[u8],
    rows: impl Iterator<Item = usize>,
) -> (EncodeOptions, Option<Decision>) {
    let mut opts = EncodeOptions::default();
    match e.dtype {
        DType::Vbit | DType::VbitRo => {
            let bits: Option<Vec<u8>> = rows.map(|r| bytes.get(r).copied()).collect();
            return (opts, bits.map(Decision::Bits));
        }
        DType::Q1s | DType::Q1t => {
            let entry = if e.dtype == DType::Q1s { 6 } else { 4 };
            let numel = crate::format::dtype::numel(&e.shape).unwrap_or(0);
            if let (Ok(Size::AtLeast(min)), true) = (e.dtype.size_for(&e.shape), numel > 0) {
                let n = (bytes.len() as u64).saturating_sub(min) / entry;
                opts.outlier_fraction = Some((n as f64 / numel as f64).min(1.0) as f32);
            }
        }
        _ => {}
    }
    (opts, None)
}

pub(crate) fn rewrite_err_at(e: &TensorEntry) -> impl Fn(String) -> RewriteError + '_ {
    move |m| invalid(format!("rewriting {}: {m}", escape_str(&e.name)))
}

/// The options that keep the source's own choices when `plan` keeps its dtype.
fn choices_for(
    e: &TensorEntry,
    bytes: &[u8],
    plan: &TensorPlan,
    rows: impl Iterator<Item = usize>,
) -> (EncodeOptions, Option<Decision>) {
    if plan.dtype == e.dtype {
        same_choices(e, bytes, rows)
    } else {
        (EncodeOptions::default(), None)
    }
}

/// Rows `keep` of stored tensor `e` (in that order), re-encoded as `plan` (a row gather:
/// defrag's gate/up, moe-defrag's router).
pub(crate) fn gather_rows(
    e: &TensorEntry,
    bytes: &[u8],
    plan: &TensorPlan,
    keep: &[usize],
) -> Result<Vec<u8>> {
    let src = StoredRows::new(e, bytes)?;
    let (opts, decision) = choices_for(e, bytes, plan, keep.iter().copied());
    encode_rows(plan.dtype, &plan.shape, &opts, decision, |rows, out| {
        src.read_rows(keep[rows].iter().copied(), out)
    })
    .map_err(rewrite_err_at(e))
}

/// Columns `keep` of every row of stored tensor `e`, re-encoded as `plan` (defrag's
/// down_proj, and gate/up biases as one row).
pub(crate) fn gather_cols(
    e: &TensorEntry,
    bytes: &[u8],
    plan: &TensorPlan,
    keep: &[usize],
) -> Result<Vec<u8>> {
    let src = StoredRows::new(e, bytes)?;
    let (opts, decision) = choices_for(e, bytes, plan, 0..src.g.rows);
    let cols = src.g.cols;
    encode_rows(plan.dtype, &plan.shape, &opts, decision, |rows, out| {
        let mut row = vec![0f32; cols];
        for (r, o) in rows.zip(out.chunks_exact_mut(keep.len().max(1))) {
            src.read(r, &mut row)?;
            for (x, &c) in o.iter_mut().zip(keep) {
                *x = row[c];
            }
        }
        Ok(())
    })
    .map_err(rewrite_err_at(e))
}

/// Stored tensor `e` re-encoded whole as `plan` (requant), with `decision` when given.
pub(crate) fn reencode(
    e: &TensorEntry,
    bytes: &[u8],
    plan: &TensorPlan,
    opts: &EncodeOptions,
    decision: Option<Decision>,
) -> Result<Vec<u8>> {
    let src = StoredRows::new(e, bytes)?;
    encode_rows(plan.dtype, &plan.shape, opts, decision, |rows, out| {
        src.read_rows(rows, out)
    })
    .map_err(rewrite_err_at(e))
}

/// Whether `dtype` quantizes in groups of 32 along a row: a matrix whose row length is
/// not a multiple of 32 then has groups straddling rows (or is refused outright), so a
/// narrowed `down_proj` leaves it for `q8_2f` (§11).
pub(crate) fn grouped(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4Block
            | DType::Q4Tiled
            | DType::Q4tp
            | DType::Vbit
            | DType::VbitRo
            | DType::Q1
            | DType::Q1s
            | DType::Q1t
    )
}

/// `cortiq <command> <version>`, the `tool` of a provenance record.
pub(crate) fn tool(command: &str) -> String {
    format!("cortiq {command} {}", env!("CARGO_PKG_VERSION"))
}

/// Sets `provenance.{key}` to `value` (an object); a record already there (the file was
/// rewritten this way before) moves into `value.previous`, so the history survives.
pub(crate) fn record_provenance(header: &mut Header, key: &str, mut value: Value) {
    let mut prov = match header.provenance.take() {
        Some(Value::Object(m)) => m,
        Some(other) => Map::from_iter([("original".to_string(), other)]),
        None => Map::new(),
    };
    if let (Some(prev), Some(obj)) = (prov.remove(key), value.as_object_mut()) {
        obj.insert("previous".into(), prev);
    }
    prov.insert(key.into(), value);
    header.provenance = Some(Value::Object(prov));
}

/// The source's identity in a provenance record: its file name and directory hash.
pub(crate) fn source_identity(file: &CmfFile) -> Value {
    json!({
        "file": file.path.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()),
        "dir_hash": crate::format::hash64::hex16(file.directory_hash()),
    })
}

/// Streams `spec` into `out`, asking `payload(i)` for planned tensor `i`'s bytes in order.
pub(crate) fn write_streamed<'a>(
    out: &Path,
    spec: WriteSpec,
    mut payload: impl FnMut(usize) -> Result<Cow<'a, [u8]>>,
) -> Result<WriteSummary> {
    let n = spec.tensors.len();
    let mut w = StreamWriter::create(out, spec)?;
    for i in 0..n {
        let p = payload(i)?;
        w.write_tensor(&p)?;
    }
    Ok(w.finish()?)
}

/// The smallest set of experts whose routing mass reaches `cover` of the layer's total
/// (§11.1): experts ranked by mass, ties by count, then the lower index first; returned in
/// index order. `None` when the layer saw no mass at all. Masses must be finite and
/// non-negative (checked by the callers).
pub fn top_cover(mass: &[f64], counts: &[u64], cover: f64) -> Option<Vec<usize>> {
    let total: f64 = mass.iter().sum();
    if total <= 0.0 || !total.is_finite() {
        return None;
    }
    let count = |e: usize| counts.get(e).copied().unwrap_or(0);
    let mut order: Vec<usize> = (0..mass.len()).collect();
    order.sort_by(|&a, &b| {
        mass[b]
            .total_cmp(&mass[a])
            .then(count(b).cmp(&count(a)))
            .then(a.cmp(&b))
    });
    // A relative slack for the summation order: cover 1.0 must stop at the last expert
    // with mass, not run on into the never-routed ones.
    let target = cover * total * (1.0 - 1e-12);
    let mut kept = Vec::new();
    let mut acc = 0.0;
    for e in order {
        if acc >= target {
            break;
        }
        acc += mass[e];
        kept.push(e);
    }
    kept.sort_unstable();
    Some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cover_sets() {
        let mass = [0.1, 0.4, 0.0, 0.4, 0.1];
        let counts = [1, 3, 0, 4, 2];
        // 0.4 (expert 3 wins the tie on count), then 0.4: 0.8 ≥ 0.75.
        assert_eq!(top_cover(&mass, &counts, 0.75), Some(vec![1, 3]));
        assert_eq!(top_cover(&mass, &counts, 0.4), Some(vec![3]));
        // 0.85: one of the 0.1 experts more; expert 4 has the higher count.
        assert_eq!(top_cover(&mass, &counts, 0.85), Some(vec![1, 3, 4]));
        // Everything with mass, never the unrouted expert.
        assert_eq!(top_cover(&mass, &counts, 1.0), Some(vec![0, 1, 3, 4]));
        // Equal mass and count: the lower index first.
        assert_eq!(top_cover(&[0.5, 0.5], &[1, 1], 0.5), Some(vec![0]));
        assert_eq!(top_cover(&[0.0, 0.0], &[0, 0], 0.5), None);
    }

    #[test]
    fn layer_names() {
        assert_eq!(
            layer_of("model.layers.12.mlp.up_proj.weight"),
            Some((12, "mlp.up_proj.weight"))
        );
        assert_eq!(layer_of("model.layers.+1.mlp"), None);
        assert_eq!(layer_of("model.norm.weight"), None);
    }

    #[test]
    fn provenance_history() {
        let mut h = Header::default();
        record_provenance(&mut h, "defrag", json!({"task": "a"}));
        record_provenance(&mut h, "defrag", json!({"task": "b"}));
        let p = h.provenance.unwrap();
        assert_eq!(p["defrag"]["task"], "b");
        assert_eq!(p["defrag"]["previous"]["task"], "a");
    }
}
