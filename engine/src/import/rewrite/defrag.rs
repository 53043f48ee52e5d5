//! `defrag` (§11): a task mask's dead FFN neurons physically removed. For every dense
//! layer `l` the live set `L` is the set bits of the mask's FFN row `l`; `gate_proj` and
//! `up_proj` keep rows `L` (and their biases the elements `L`), `down_proj` keeps columns
//! `L`. Each is decoded, gathered and re-encoded on its smaller shape in its own dtype —
//! except `down_proj` in a codec grouped by 32 along a row when `|L|` is not a multiple
//! of 32: that one becomes `q8_2f`. Skill tensors that replace those projections are
//! gathered the same way. Everything else is copied byte for byte.
//!
//! The output is an ordinary, smaller dense model: its shapes say each layer's width
//! (`arch.intermediate_size` becomes the nominal maximum), it has no masks section (the
//! mask is the identity now, and with it goes the §7 index that describes masks), and
//! `provenance.defrag` records the task, the source's directory hash and every layer's
//! kept width.
//!
//! Refused (nothing is written): a task that turns off attention heads or layer gates —
//! head and layer pruning are out of scope (§11) — unless [`DefragOptions::ffn_only`] asks
//! to apply the FFN bits alone; a MoE layer whose FFN bits are not all ones, or whose
//! experts the task restricts (that is `moe-defrag --task`); a LOOP_MASKS mask (one FFN row
//! per pass, not per layer); a layer the mask leaves without any neuron.

use std::borrow::Cow;
use std::path::Path;

use serde::Serialize;
use serde_json::json;

use super::{
    base_name, check_source, find_task, gather_cols, gather_rows, grouped, invalid, layer_of,
    num_layers, record_provenance, refused, source_identity, tool, write_streamed, Result,
};
use crate::format::directory::TensorEntry;
use crate::format::dtype::DType;
use crate::format::writer::{TensorPlan, WriteSpec, WriteSummary};
use crate::format::{escape_str, CmfFile, SectionKind};

#[derive(Clone, Debug, Default)]
pub struct DefragOptions {
    pub task: String,
    /// Apply only the mask's FFN bits: heads and layers it turns off are kept and run.
    pub ffn_only: bool,
}

/// What happened to one decoder layer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerDefrag {
    pub layer: u64,
    /// `dense`, `moe` (untouched) or `none` (no feed-forward tensors).
    pub kind: &'static str,
    pub width_before: Option<u64>,
    pub width_after: Option<u64>,
    /// `down_proj`'s dtype before and after (it changes for the `q8_2f` fallback).
    pub down_dtype_before: Option<DType>,
    pub down_dtype_after: Option<DType>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DefragSummary {
    pub write: WriteSummary,
    pub task: String,
    pub layers: Vec<LayerDefrag>,
    /// The output's `arch.intermediate_size`.
    pub intermediate_size: Option<u64>,
    /// Mask fields not applied (with `ffn_only`): `heads`, `layer_gates`.
    pub ignored: Vec<&'static str>,
    /// Tensors decoded, gathered and re-encoded.
    pub rewritten: usize,
}

/// What the writer does with one source tensor.
enum Action {
    Copy,
    /// Keep these rows (gate/up weights).
    Rows(Vec<usize>),
    /// Keep these columns of every row (down weights; gate/up biases, one row).
    Cols(Vec<usize>),
}

/// One dense layer's projections and live neurons.
struct DenseLayer {
    width: u64,
    live: Vec<usize>,
    down_before: DType,
    down_after: DType,
}

impl DenseLayer {
    fn changes(&self) -> bool {
        self.live.len() as u64 != self.width
    }
}

const GATE: &str = "mlp.gate_proj.weight";
const UP: &str = "mlp.up_proj.weight";
const DOWN: &str = "mlp.down_proj.weight";

/// Defragments `file` by the mask of `opts.task` into `out`.
pub fn defrag(file: &CmfFile, out: &Path, opts: &DefragOptions) -> Result<DefragSummary> {
    check_source(file)?;
    let layers = num_layers(file)?;
    let arch = file
        .header
        .arch
        .as_ref()
        .ok_or_else(|| invalid("no arch"))?;
    let hidden = arch.hidden_size;
    let mask = find_task(file, &opts.task)?;
    let task = escape_str(&opts.task);
    let layout = mask.layout;
    if layout.visits != layers {
        return Err(refused(format!(
            "task {task:?} is a LOOP_MASKS mask ({} FFN rows for {layers} layers): defrag needs one row per layer",
            layout.visits
        )));
    }

    // Heads and layer gates: out of scope (§11), unless the caller asks to ignore them.
    let heads_off: Vec<u64> = (0..layers)
        .filter(|&l| mask.heads(l).count_ones() != layout.heads)
        .collect();
    let gates_off: Vec<u64> = (0..layers).filter(|&l| !mask.gates().get(l)).collect();
    let mut ignored = Vec::new();
    if !heads_off.is_empty() || !gates_off.is_empty() {
        if !opts.ffn_only {
            let mut what = Vec::new();
            if !heads_off.is_empty() {
                what.push(format!("attention heads in layers {heads_off:?}"));
            }
            if !gates_off.is_empty() {
                what.push(format!("layers {gates_off:?} (layer gates)"));
            }
            return Err(refused(format!(
                "task {task:?} turns off {}: defrag removes FFN neurons only, head and layer pruning are out of scope (§11); --ffn-only removes its dead FFN neurons and keeps every head and layer",
                what.join(" and ")
            )));
        }
        if !heads_off.is_empty() {
            ignored.push("heads");
        }
        if !gates_off.is_empty() {
            ignored.push("layer_gates");
        }
    }

    let entry = |l: u64, rest: &str| file.directory.get(&format!("model.layers.{l}.{rest}"));
    let mut dense: Vec<Option<DenseLayer>> = Vec::new();
    let mut report = Vec::new();
    for l in 0..layers {
        let row = mask.ffn(l);
        if let Some(router) = entry(l, "mlp.gate.weight") {
            if row.count_ones() != layout.intermediate {
                return Err(refused(format!(
                    "task {task:?} turns off FFN neurons of MoE layer {l}: §11 defrag covers dense FFN neurons; experts are moe-defrag's"
                )));
            }
            let present = router.shape.first().copied().unwrap_or(0);
            if let Some(ex) = mask.experts(l) {
                if (0..present).any(|e| !ex.get(e)) {
                    return Err(refused(format!(
                        "task {task:?} restricts the experts of layer {l}: use moe-defrag --task to drop them"
                    )));
                }
            }
            dense.push(None);
            report.push(LayerDefrag {
                layer: l,
                kind: "moe",
                width_before: None,
                width_after: None,
                down_dtype_before: None,
                down_dtype_after: None,
            });
            continue;
        }
        let (gate, up, down) = (entry(l, GATE), entry(l, UP), entry(l, DOWN));
        let (gate, up, down) = match (gate, up, down) {
            (None, None, None) => {
                dense.push(None);
                report.push(LayerDefrag {
                    layer: l,
                    kind: "none",
                    width_before: None,
                    width_after: None,
                    down_dtype_before: None,
                    down_dtype_after: None,
                });
                continue;
            }
            (Some(g), Some(u), Some(d)) => (g, u, d),
            _ => {
                return Err(invalid(format!(
                    "layer {l} has some of gate_proj, up_proj, down_proj but not all three"
                )))
            }
        };
        let width = gate.shape.first().copied().unwrap_or(0);
        if gate.shape != [width, hidden]
            || up.shape != [width, hidden]
            || down.shape != [hidden, width]
        {
            return Err(invalid(format!(
                "layer {l}: gate {:?}, up {:?}, down {:?} do not form an FFN of hidden {hidden}",
                gate.shape, up.shape, down.shape
            )));
        }
        if width > layout.intermediate {
            return Err(invalid(format!(
                "layer {l} has {width} FFN neurons but arch.intermediate_size (the mask's row) is {}",
                layout.intermediate
            )));
        }
        // Bits at or past the layer's own width name no neuron of it.
        let live: Vec<usize> = row
            .ones()
            .take_while(|&i| i < width)
            .map(|i| i as usize)
            .collect();
        if live.is_empty() {
            return Err(refused(format!(
                "task {task:?} keeps no FFN neuron of layer {l}: a zero-width layer cannot be written"
            )));
        }
        let kept = live.len() as u64;
        let narrow_groups = grouped(down.dtype) && !kept.is_multiple_of(32);
        let down_after =
            if kept != width && (narrow_groups || down.dtype.size_for(&[hidden, kept]).is_err()) {
                DType::Q8_2f
            } else {
                down.dtype
            };
        report.push(LayerDefrag {
            layer: l,
            kind: "dense",
            width_before: Some(width),
            width_after: Some(kept),
            down_dtype_before: Some(down.dtype),
            down_dtype_after: Some(down_after),
        });
        dense.push(Some(DenseLayer {
            width,
            live,
            down_before: down.dtype,
            down_after,
        }));
    }

    // The plan: every tensor in source order, FFN projections of changed layers reshaped.
    let mut tensors = Vec::with_capacity(file.directory.len());
    let mut actions = Vec::with_capacity(file.directory.len());
    for e in file.directory.iter() {
        let (plan, action) = plan_tensor(file, e, hidden, &dense)?;
        tensors.push(plan);
        actions.push(action);
    }

    let mut header = file.header.clone();
    let widths: Vec<u64> = dense
        .iter()
        .flatten()
        .map(|d| d.live.len() as u64)
        .collect();
    let intermediate = widths.iter().copied().max().or(arch.intermediate_size);
    if let Some(a) = header.arch.as_mut() {
        a.intermediate_size = intermediate;
    }
    let fallback: Vec<u64> = report
        .iter()
        .filter(|r| r.down_dtype_after != r.down_dtype_before)
        .map(|r| r.layer)
        .collect();
    record_provenance(
        &mut header,
        "defrag",
        json!({
            "tool": tool("defrag"),
            "task": opts.task,
            "source": source_identity(file),
            "kept_widths": report.iter().map(|r| r.width_after).collect::<Vec<_>>(),
            "widths_before": report.iter().map(|r| r.width_before).collect::<Vec<_>>(),
            "down_proj_q8_2f": fallback,
            "ignored": ignored,
        }),
    );
    let vocab = file
        .envelope
        .vocab
        .is_present()
        .then(|| file.section_bytes(SectionKind::Vocab).to_vec());
    let spec = WriteSpec {
        header,
        tensors: tensors.clone(),
        masks: None,
        vocab,
        index: None,
        extra_features: 0,
    };
    let entries: Vec<&TensorEntry> = file.directory.iter().collect();
    let rewritten = actions
        .iter()
        .filter(|a| !matches!(a, Action::Copy))
        .count();
    let write = write_streamed(out, spec, |i| {
        let (e, bytes) = (entries[i], file.tensor_bytes(entries[i]));
        let plan = &tensors[i];
        let gathered = match &actions[i] {
            Action::Copy => return Ok(Cow::Borrowed(bytes)),
            Action::Rows(keep) => gather_rows(e, bytes, plan, keep),
            Action::Cols(keep) => gather_cols(e, bytes, plan, keep),
        };
        gathered.map(Cow::Owned)
    })?;
    Ok(DefragSummary {
        write,
        task: opts.task.clone(),
        layers: report,
        intermediate_size: intermediate,
        ignored,
        rewritten,
    })
}

/// The output plan and action of one source tensor.
fn plan_tensor(
    file: &CmfFile,
    e: &TensorEntry,
    hidden: u64,
    dense: &[Option<DenseLayer>],
) -> Result<(TensorPlan, Action)> {
    let keep = |dtype: DType| {
        (
            TensorPlan {
                name: e.name.clone(),
                dtype,
                shape: e.shape.clone(),
            },
            Action::Copy,
        )
    };
    let base = base_name(file, &e.name);
    let Some((l, rest)) = layer_of(base) else {
        return Ok(keep(e.dtype));
    };
    let Some(Some(d)) = dense.get(l as usize) else {
        return Ok(keep(e.dtype));
    };
    if !d.changes() {
        return Ok(keep(e.dtype));
    }
    let w = d.width;
    let k = d.live.len() as u64;
    let mismatch = |want: &[u64]| {
        invalid(format!(
            "{}: shape {:?}, the layer's projections need {want:?}",
            escape_str(&e.name),
            e.shape
        ))
    };
    let (dtype, shape, action) = match rest {
        GATE | UP => {
            if e.shape != [w, hidden] {
                return Err(mismatch(&[w, hidden]));
            }
            (e.dtype, vec![k, hidden], Action::Rows(d.live.clone()))
        }
        DOWN => {
            if e.shape != [hidden, w] {
                return Err(mismatch(&[hidden, w]));
            }
            // A skill's down_proj follows the same rule as the base's.
            let dtype = if e.dtype == d.down_before {
                d.down_after
            } else if grouped(e.dtype) && !k.is_multiple_of(32) {
                DType::Q8_2f
            } else {
                e.dtype
            };
            (dtype, vec![hidden, k], Action::Cols(d.live.clone()))
        }
        "mlp.gate_proj.bias" | "mlp.up_proj.bias" => {
            if e.shape != [w] {
                return Err(mismatch(&[w]));
            }
            (e.dtype, vec![k], Action::Cols(d.live.clone()))
        }
        _ => return Ok(keep(e.dtype)),
    };
    Ok((
        TensorPlan {
            name: e.name.clone(),
            dtype,
            shape,
        },
        action,
    ))
}
