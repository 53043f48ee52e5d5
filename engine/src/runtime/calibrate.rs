//! Authoring masks and skills with measured quality (§5.1, §9): activation statistics
//! over prompts, a task mask kept from them, held-out perplexity under any choice (the
//! `quality` contract: measured, never declared), and a skill's routing subspace fitted
//! to the φ of its prompts.

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::session::PREFILL_CHUNK;
use super::skill_route::phi;
use crate::model::block::{FeedForward, TokenMixer};
use crate::model::probe::Probe;
use crate::model::select::Active;
use crate::model::{Logits, Model, ModelError};

/// Per-token negative log-likelihood of `ids` (teacher-forced) under `active`, in
/// consecutive windows of at most `window` tokens, each starting fresh.
pub fn text_nll(
    model: &Model,
    ids: &[u32],
    window: usize,
    active: &Active,
) -> Result<Vec<f64>, ModelError> {
    let window = window.clamp(2, model.config.max_positions.max(2));
    let v = model.config.vocab;
    let mut cache = model.new_state(window);
    let mut ws = model.new_workspace(PREFILL_CHUNK);
    ws.active = active.clone();
    let mut nlls = Vec::with_capacity(ids.len().saturating_sub(1));
    for win in ids.chunks(window) {
        cache.truncate(0);
        let mut pos = 0;
        for chunk in win.chunks(PREFILL_CHUNK) {
            model.forward(chunk, &mut cache, &mut ws, Logits::All, None)?;
            for i in 0..chunk.len() {
                if let Some(&target) = win.get(pos + i + 1) {
                    nlls.push(super::metrics::nll(&ws.logits[i * v..(i + 1) * v], target));
                }
            }
            pos += chunk.len();
        }
    }
    Ok(nlls)
}

/// `exp(mean nll)`.
pub fn perplexity(nlls: &[f64]) -> f64 {
    (nlls.iter().sum::<f64>() / nlls.len().max(1) as f64).exp()
}

/// Lowercase hex SHA-256 of `bytes` (the `dataset_sha256` of a quality record).
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A task mask's `quality` (§5.1): the held-out perplexity ratio of the masked model to
/// the dense one.
pub fn mask_quality(
    model: &Model,
    task: &Active,
    heldout: &[u32],
    heldout_bytes: &[u8],
    window: usize,
) -> Result<Value, ModelError> {
    let dense = perplexity(&text_nll(model, heldout, window, &Active::default())?);
    let nll = text_nll(model, heldout, window, task)?;
    let masked = perplexity(&nll);
    Ok(json!({
        "metric": "heldout_ppl_ratio",
        "value": masked / dense,
        "masked": masked,
        "baseline_dense": dense,
        "n_samples": nll.len(),
        "dataset_sha256": sha256_hex(heldout_bytes),
    }))
}

/// A skill's `quality` (§9): held-out perplexity of the backbone and with the skill.
pub fn skill_quality(
    model: &Model,
    skill: &Active,
    heldout: &[u32],
    heldout_bytes: &[u8],
    window: usize,
) -> Result<Value, ModelError> {
    let backbone = perplexity(&text_nll(model, heldout, window, &Active::default())?);
    let nll = text_nll(model, heldout, window, skill)?;
    Ok(json!({
        "metric": "ppl",
        "backbone": backbone,
        "overlaid": perplexity(&nll),
        "n_samples": nll.len(),
        "dataset_sha256": sha256_hex(heldout_bytes),
    }))
}

/// Runs every prompt (each from a fresh state, under the backbone) and returns what the
/// probe saw; `progress(done, total)` after each prompt.
pub fn activation_stats(
    model: &Model,
    prompts: &[Vec<u32>],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Probe, ModelError> {
    let mut ws = model.new_workspace(PREFILL_CHUNK);
    ws.probe = Some(Probe::new(&model.layers));
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
    let mut state = model.new_state(longest.min(model.config.max_positions).max(1));
    for (i, p) in prompts.iter().enumerate() {
        state.truncate(0);
        for chunk in p[..p.len().min(state.capacity)].chunks(PREFILL_CHUNK) {
            model.forward(chunk, &mut state, &mut ws, Logits::None, None)?;
        }
        progress(i + 1, prompts.len());
    }
    Ok(ws.probe.take().expect("the probe was set"))
}

/// The indices of the `n` largest values (ties to the lower index), ascending.
fn top(values: &[f64], n: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(n);
    idx.sort_unstable();
    idx
}

/// A task mask blob (§5 layout, no expert fields) keeping, in every dense layer, the
/// `keep` fraction of FFN neurons with the most activation mass (weighting it by the norm
/// of the neuron's down_proj column was tried: on SmolLM2 at keep 0.5 the held-out
/// perplexity ratio went from ×2.06 to ×4.71) and, in every
/// attention layer, the `keep_heads` fraction of heads with the most importance (at least
/// one of each). `field_width` is the FFN field's width (`arch.intermediate_size`).
/// Returns the blob and its FFN sparsity (share of the dense layers' neurons masked out).
pub fn mask_from_stats(
    model: &Model,
    probe: &Probe,
    keep: f64,
    keep_heads: f64,
    field_width: usize,
) -> Result<(Vec<u8>, f64), ModelError> {
    let layers = model.layers.len();
    let heads = model.config.n_heads;
    let bits = |n: usize, on: &[usize]| {
        let mut b = vec![0u8; n.div_ceil(8)];
        for &i in on {
            b[i / 8] |= 1 << (i % 8);
        }
        b
    };
    let (mut ffn, mut head_rows) = (Vec::new(), Vec::new());
    let (mut kept, mut total) = (0usize, 0usize);
    for (i, layer) in model.layers.iter().enumerate() {
        let on: Vec<usize> = match &layer.ff {
            FeedForward::Dense(m) => {
                let w = m.intermediate();
                if w > field_width {
                    return Err(ModelError::Task(format!(
                        "layer {i} is {w} wide, wider than the mask field ({field_width})"
                    )));
                }
                let n = ((keep * w as f64).ceil() as usize).clamp(1, w);
                kept += n;
                total += w;
                top(&probe.ffn[i], n)
            }
            // Experts are narrowed by expert fields, not neuron bits.
            FeedForward::Moe(_) => (0..field_width).collect(),
        };
        ffn.extend(bits(field_width, &on));
        let on: Vec<usize> = match &layer.mixer {
            TokenMixer::Attention(a) if a.cfg.n_heads == heads => {
                let n = ((keep_heads * heads as f64).ceil() as usize).clamp(1, heads);
                top(&probe.heads[i], n)
            }
            _ => (0..heads).collect(),
        };
        head_rows.extend(bits(heads, &on));
    }
    let mut blob = ffn;
    blob.extend(head_rows);
    blob.extend(bits(layers, &(0..layers).collect::<Vec<_>>()));
    let sparsity = if total == 0 {
        0.0
    } else {
        1.0 - kept as f64 / total as f64
    };
    Ok((blob, sparsity))
}

/// f16 little-endian base64, as a `selection` stores its vectors.
pub fn f16_base64(values: &[f32]) -> String {
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A skill's routing subspace (§9 `selection`): the mean of the prompts' φ at layer
/// `phi_layer` and an orthonormal basis of their top `rank` principal directions (power
/// iteration with deflation on the centred φ, in f64). Returns `(mean, basis)`.
pub fn fit_subspace(
    model: &Model,
    prompts: &[Vec<u32>],
    phi_layer: usize,
    rank: usize,
) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
    let h = model.config.hidden;
    if prompts.is_empty() || rank == 0 || phi_layer >= model.layers.len() {
        return Err(ModelError::Config {
            field: "selection".into(),
            reason: format!(
                "needs prompts, a rank ≥ 1 and a phi_layer below {} layers",
                model.layers.len()
            ),
        });
    }
    let phis: Vec<Vec<f64>> = prompts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| phi(model, p, &[phi_layer]).map(|v| v[0].iter().map(|&x| f64::from(x)).collect()))
        .collect::<Result<_, _>>()?;
    let n = phis.len().max(1) as f64;
    let mean: Vec<f64> = (0..h)
        .map(|j| phis.iter().map(|p| p[j]).sum::<f64>() / n)
        .collect();
    let centred: Vec<Vec<f64>> = phis
        .iter()
        .map(|p| p.iter().zip(&mean).map(|(a, b)| a - b).collect())
        .collect();
    let mut basis: Vec<Vec<f64>> = Vec::new();
    for k in 0..rank.min(h) {
        // Start from a fixed, non-degenerate vector; deflate the rows found so far.
        let mut v: Vec<f64> = (0..h)
            .map(|j| 1.0 + ((j * 7 + k * 13) % 11) as f64)
            .collect();
        for _ in 0..200 {
            let mut next = vec![0f64; h];
            for c in &centred {
                let d: f64 = c.iter().zip(&v).map(|(a, b)| a * b).sum();
                for (x, &cv) in next.iter_mut().zip(c) {
                    *x += d * cv;
                }
            }
            for b in &basis {
                let d: f64 = b.iter().zip(&next).map(|(a, c)| a * c).sum();
                for (x, &bv) in next.iter_mut().zip(b) {
                    *x -= d * bv;
                }
            }
            let norm = next.iter().map(|x| x * x).sum::<f64>().sqrt();
            if norm < 1e-12 {
                break;
            }
            v = next.into_iter().map(|x| x / norm).collect();
        }
        // Orthonormal to the rows already chosen (also when the data ran out of rank).
        for b in &basis {
            let d: f64 = b.iter().zip(&v).map(|(a, c)| a * c).sum();
            for (x, &bv) in v.iter_mut().zip(b) {
                *x -= d * bv;
            }
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm < 1e-9 {
            break;
        }
        basis.push(v.into_iter().map(|x| x / norm).collect());
    }
    Ok((
        mean.into_iter().map(|x| x as f32).collect(),
        basis.into_iter().flatten().map(|x| x as f32).collect(),
    ))
}

/// Writes a copy of `file` to `out` with one more task mask `record` + `blob` (its
/// offsets are assigned here). The file's other masks stay as they are; a mask of the
/// same name is an error unless `replace`. `intermediate` sets `arch.intermediate_size`
/// when the file has none (masks are sized by it).
pub fn write_with_mask(
    file: &crate::format::CmfFile,
    out: &std::path::Path,
    record: crate::format::masks::MaskRecord,
    blob: Vec<u8>,
    replace: bool,
    intermediate: Option<u64>,
) -> crate::format::Result<crate::format::writer::WriteSummary> {
    write_with_masks(file, out, vec![(record, blob)], replace, intermediate)
}

/// [`write_with_mask`] for several masks at once (one rewrite).
pub fn write_with_masks(
    file: &crate::format::CmfFile,
    out: &std::path::Path,
    new: Vec<(crate::format::masks::MaskRecord, Vec<u8>)>,
    replace: bool,
    intermediate: Option<u64>,
) -> crate::format::Result<crate::format::writer::WriteSummary> {
    use crate::format::error::parse;
    use crate::format::SectionKind;
    let mut spec = crate::format::writer::spec_of(file);
    if let (Some(arch), Some(n)) = (spec.header.arch.as_mut(), intermediate) {
        arch.intermediate_size.get_or_insert(n);
    }
    let section = file.section_bytes(SectionKind::Masks);
    let (mut records, mut blobs): (Vec<_>, Vec<_>) = file
        .masks
        .iter()
        .flat_map(|m| m.meta.masks.iter())
        .map(|r| {
            let b = section[r.blob_off as usize..(r.blob_off + r.blob_len) as usize].to_vec();
            (r.clone(), b)
        })
        .unzip();
    let default_task = file
        .masks
        .as_ref()
        .and_then(|m| m.meta.default_task.clone());
    for (mut record, blob) in new {
        match records.iter().position(|r| r.name == record.name) {
            Some(i) if replace => {
                record.task_id = records[i].task_id;
                records[i] = record;
                blobs[i] = blob;
            }
            Some(_) => {
                return Err(parse(format!(
                    "the file already has a task {:?} (--replace replaces it)",
                    crate::format::escape_str(&record.name)
                )))
            }
            None => {
                record.task_id = records.iter().map(|r| r.task_id).max().map_or(1, |m| m + 1);
                records.push(record);
                blobs.push(blob);
            }
        }
    }
    spec.masks = Some(crate::format::masks::build_section(
        default_task,
        records,
        &blobs,
    ));
    crate::format::writer::write_file(
        out,
        spec,
        file.directory.iter().map(|e| file.tensor_bytes(e)),
    )
}

/// What [`task_mask`] is asked for.
pub struct TaskSpec<'a> {
    pub name: &'a str,
    /// The task's prompts, tokenized as they will be run.
    pub prompts: &'a [Vec<u32>],
    pub keep: f64,
    pub keep_heads: f64,
    /// Held-out text (its tokens and its bytes, for `dataset_sha256`) for the quality.
    pub heldout: Option<(&'a [u32], &'a [u8])>,
    /// Perplexity window.
    pub window: usize,
}

/// A calibrated task mask: its record (sparsity, measured quality or null, the
/// calibration's provenance), its blob, and the probe's token count.
pub fn task_mask(
    model: &Model,
    spec: &TaskSpec,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(crate::format::masks::MaskRecord, Vec<u8>, u64), ModelError> {
    use crate::format::masks::{build_section, MaskRecord, Masks, Priority};
    let probe = activation_stats(model, spec.prompts, progress)?;
    let arch = model.file.header().arch.clone().ok_or(ModelError::NoArch)?;
    let field = arch
        .intermediate_size
        .map_or(model.config.intermediate, |n| n as usize);
    let (blob, sparsity) = mask_from_stats(model, &probe, spec.keep, spec.keep_heads, field)?;
    let quality = match spec.heldout {
        None => Value::Null,
        Some((ids, bytes)) => {
            // The mask as the runtime reads it, checked by the same rules.
            let record = MaskRecord {
                name: spec.name.into(),
                ..MaskRecord::default()
            };
            let section = build_section(None, vec![record], std::slice::from_ref(&blob));
            let mut arch = arch.clone();
            arch.intermediate_size.get_or_insert(field as u64);
            let masks = Masks::parse(&section, Some(&arch), false)
                .map_err(|e| ModelError::Task(format!("the calibrated mask: {e}")))?;
            let task = crate::model::select::TaskMask::new(model, &masks.view(&section, 0), 0)?;
            let active = Active {
                task: Some(std::sync::Arc::new(task)),
                skill: Default::default(),
            };
            mask_quality(model, &active, ids, bytes, spec.window)?
        }
    };
    let record = MaskRecord {
        name: spec.name.into(),
        sparsity: Some(sparsity),
        quality: (!quality.is_null()).then_some(quality),
        priority: Some(Priority::Normal),
        extra: serde_json::Map::from_iter([(
            "calibration".to_string(),
            json!({"prompts": spec.prompts.len(), "tokens": probe.tokens, "keep": spec.keep,
                   "heads": spec.keep_heads, "tool": "cortiq mask calibrate"}),
        )]),
        ..MaskRecord::default()
    };
    Ok((record, blob, probe.tokens))
}
