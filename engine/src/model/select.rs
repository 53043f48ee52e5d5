//! What a forward runs under: a task mask (§5) and a skill (§9), chosen between steps.
//!
//! A [`TaskMask`] is a file's mask decoded once for the model it runs on: per layer the
//! live FFN neurons (as row indices, so products read only their rows), the live
//! attention heads, the layer gate and the routable experts. An [`Active`] pairs it with
//! the skill choice: none, one skill (pointers into the same mmap), or a soft [`Blend`].
//! The session puts its `Active` in the workspace; every block reads its part of it
//! through a [`LayerSel`].

use std::sync::Arc;

use super::block::{FeedForward, TokenMixer};
use super::linear::{Blend, Linear, OwnedWeight, SkillSel};
use super::{Model, ModelError};
use crate::format::dtype::DType;
use crate::format::masks::MaskView;
use crate::quant::matrix::Matrix;

/// One layer's part of a task mask. `None` fields restrict nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerMask {
    /// The layer gate is off: the layer is skipped (the residual passes through).
    pub skip: bool,
    /// Live FFN neurons, ascending (a dense layer with some neuron masked out).
    pub ffn: Option<Vec<u32>>,
    /// The live columns of `down_proj`, packed in its own dtype, where that is exact
    /// (row-scaled layouts; see [`crate::quant::gather_columns`]): the masked product then
    /// reads only them. Group-quantized layouts read the whole matrix with zero inputs.
    pub down: Option<PackedDown>,
    /// The live rows of gate_proj and up_proj, packed in their own dtype where rows are
    /// self-contained ([`crate::quant::gather_rows`]): one contiguous stream instead of
    /// scattered rows (measured: on Qwen2.5-0.5B's q8_row FFN, scattered live rows ran at
    /// ~60 % of the dense read bandwidth). The task's forwards then read none of the
    /// file's FFN pages.
    pub gate_up: Option<(PackedDown, PackedDown)>,
    /// Live query heads (an attention layer with some head masked out).
    pub heads: Option<Vec<bool>>,
    /// Routable experts, one flag per expert present (a MoE layer narrowed by the task).
    pub experts: Option<Vec<bool>>,
}

/// A packed `down_proj` (see [`LayerMask::down`]); equal when it is the same packing.
#[derive(Clone, Debug)]
pub struct PackedDown(pub Arc<OwnedWeight>);

impl PartialEq for PackedDown {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl PackedDown {
    /// The live rows of `lin` (`live` ascending), if its dtype packs them.
    fn rows_of(lin: &Linear, live: &[u32]) -> Option<PackedDown> {
        let shape = [lin.out_dim() as u64, lin.in_dim() as u64];
        let bytes = crate::quant::gather_rows(lin.m.dtype, &shape, lin.bytes(), live)?;
        let m = Matrix::new(lin.m.dtype, &[live.len() as u64, shape[1]], &bytes).ok()?;
        let bias = lin
            .bias
            .as_ref()
            .map(|b| live.iter().map(|&j| b[j as usize]).collect());
        Some(PackedDown(Arc::new(OwnedWeight { m, bytes, bias })))
    }

    /// The live columns of `down` (`live` ascending), if the dtype packs exactly.
    fn of(down: &Linear, live: &[u32]) -> Option<PackedDown> {
        let shape = [down.out_dim() as u64, down.in_dim() as u64];
        let bytes = crate::quant::gather_columns(down.m.dtype, &shape, down.bytes(), live)?;
        let m = Matrix::new(down.m.dtype, &[shape[0], live.len() as u64], &bytes).ok()?;
        Some(PackedDown(Arc::new(OwnedWeight {
            m,
            bytes,
            bias: down.bias.clone(),
        })))
    }
}

/// A task mask resolved against a model.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskMask {
    pub name: String,
    /// Index of the mask in the file's masks section.
    pub index: usize,
    pub layers: Vec<LayerMask>,
    /// Whether the mask's `quality` is measured (not JSON null).
    pub measured: bool,
    /// Share of the dense layers' FFN neurons that stay live.
    pub ffn_live: f64,
}

impl TaskMask {
    /// Decodes `view` (mask `index` of the model's file) for `model`: checks each field
    /// against the layer it masks and turns the bits into what the blocks read.
    pub fn new(model: &Model, view: &MaskView, index: usize) -> Result<TaskMask, ModelError> {
        let name = view.record.name.clone();
        let bad = |reason: String| {
            ModelError::Task(format!(
                "task {}: {reason}",
                crate::format::escape_str(&name)
            ))
        };
        let l = view.layout;
        let n_layers = model.layers.len();
        if l.visits != n_layers as u64 {
            return Err(bad(format!(
                "the mask has {} FFN rows ({} passes per layer; LOOP_MASKS) but the model \
                 runs each of its {n_layers} layers once",
                l.visits,
                l.visits as f64 / n_layers.max(1) as f64
            )));
        }
        let gates = view.gates();
        let (mut live_total, mut dense_total) = (0u64, 0u64);
        let mut layers = Vec::with_capacity(n_layers);
        for (i, layer) in model.layers.iter().enumerate() {
            let v = i as u64;
            let ffn = view.ffn(v);
            let heads = view.heads(v);
            let mut m = LayerMask {
                skip: !gates.get(v),
                ..LayerMask::default()
            };
            match &layer.ff {
                FeedForward::Dense(mlp) => {
                    let width = mlp.intermediate() as u64;
                    if let Some(extra) = ffn.ones().find(|&j| j >= width) {
                        return Err(bad(format!(
                            "layer {i}: FFN neuron {extra} is live but the layer has {width}"
                        )));
                    }
                    let live: Vec<u32> = ffn.ones().map(|j| j as u32).collect();
                    live_total += live.len() as u64;
                    dense_total += width;
                    if (live.len() as u64) < width {
                        m.down = PackedDown::of(&mlp.down, &live);
                        m.gate_up = PackedDown::rows_of(&mlp.gate, &live)
                            .zip(PackedDown::rows_of(&mlp.up, &live));
                        m.ffn = Some(live);
                    }
                }
                FeedForward::Moe(moe) => {
                    if ffn.count_ones() != ffn.bits {
                        return Err(bad(format!(
                            "layer {i} is a mixture of experts: its FFN bits must all be set \
                             (experts are narrowed by expert fields)"
                        )));
                    }
                    if let Some(field) = view.experts(v) {
                        let n = moe.num_experts() as u64;
                        if let Some(extra) = field.ones().find(|&e| e >= n) {
                            return Err(bad(format!(
                                "layer {i}: expert {extra} is routable but the layer has {n}"
                            )));
                        }
                        let open: Vec<bool> = (0..n).map(|e| field.get(e)).collect();
                        // §5: a row of all ones restricts nothing.
                        if field.count_ones() != field.bits {
                            if !open.contains(&true) {
                                return Err(bad(format!("layer {i}: no expert is routable")));
                            }
                            m.experts = Some(open);
                        }
                    }
                }
            }
            let n_heads = heads.bits;
            if heads.count_ones() != n_heads {
                match &layer.mixer {
                    TokenMixer::Attention(a) if a.cfg.n_heads as u64 == n_heads => {
                        m.heads = Some((0..n_heads).map(|h| heads.get(h)).collect());
                    }
                    TokenMixer::Attention(a) => {
                        return Err(bad(format!(
                            "layer {i}: the head field has {n_heads} bits, the layer {} heads",
                            a.cfg.n_heads
                        )))
                    }
                    TokenMixer::GatedDeltaNet(_) => {
                        return Err(ModelError::Unsupported(format!(
                            "task {}: layer {i} is a linear-attention layer, whose heads a \
                             head field does not address",
                            crate::format::escape_str(&name)
                        )))
                    }
                }
            }
            layers.push(m);
        }
        Ok(TaskMask {
            name,
            index,
            layers,
            measured: view.record.quality.as_ref().is_some_and(|q| !q.is_null()),
            ffn_live: if dense_total == 0 {
                1.0
            } else {
                live_total as f64 / dense_total as f64
            },
        })
    }

    /// Bytes of the packed live neurons this task holds (the only weights a task adds;
    /// see [`LayerMask::down`] and [`LayerMask::gate_up`]).
    pub fn packed_bytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| {
                let gu = l.gate_up.as_ref().map(|(g, u)| [g, u]);
                l.down.iter().chain(gu.into_iter().flatten())
            })
            .map(|d| d.0.bytes.len())
            .sum()
    }

    /// The mask named `name` of the model's file.
    pub fn by_name(model: &Model, name: &str) -> Result<TaskMask, ModelError> {
        let file = model.file.primary();
        let masks = file.masks.as_ref();
        let index = masks.and_then(|m| m.find(name)).ok_or_else(|| {
            let names: Vec<String> = masks
                .map(|m| m.meta.masks.iter().map(|r| r.name.clone()).collect())
                .unwrap_or_default();
            ModelError::UnknownChoice(if names.is_empty() {
                format!("no task {name:?}: the file has no task masks")
            } else {
                format!("no task {name:?}; the file's tasks: {}", names.join(", "))
            })
        })?;
        let view = file.mask_view(index).expect("a listed mask has a view");
        TaskMask::new(model, &view, index)
    }
}

/// The skill a forward reads.
#[derive(Clone, Debug, Default)]
pub enum SkillChoice {
    /// The backbone.
    #[default]
    None,
    /// Skill `i` of the registry.
    One(u16),
    /// A soft mix of every skill with weights `w` (softmax of −E/T).
    Blend {
        weights: Vec<f32>,
        blend: Arc<Blend>,
    },
}

/// The task mask and skill a session's forwards run under.
#[derive(Clone, Debug, Default)]
pub struct Active {
    pub task: Option<Arc<TaskMask>>,
    pub skill: SkillChoice,
}

impl Active {
    /// Layer `i`'s part.
    pub fn layer(&self, i: usize) -> LayerSel<'_> {
        LayerSel {
            skill: self.skill_sel(),
            mask: self.task.as_ref().map(|t| &t.layers[i]),
        }
    }

    pub fn skill_sel(&self) -> SkillSel<'_> {
        match &self.skill {
            SkillChoice::None => SkillSel::Base,
            SkillChoice::One(k) => SkillSel::Skill(*k),
            SkillChoice::Blend { blend, .. } => SkillSel::Blend(blend),
        }
    }

    /// Whether nothing is restricted or replaced.
    pub fn is_plain(&self) -> bool {
        self.task.is_none() && matches!(self.skill, SkillChoice::None)
    }
}

/// What one layer's blocks read of the [`Active`] choice.
#[derive(Clone, Copy, Debug, Default)]
pub struct LayerSel<'a> {
    pub skill: SkillSel<'a>,
    pub mask: Option<&'a LayerMask>,
}

impl LayerSel<'_> {
    pub fn skip(&self) -> bool {
        self.mask.is_some_and(|m| m.skip)
    }
    pub fn ffn(&self) -> Option<FfnSel<'_>> {
        self.mask.and_then(|m| {
            m.ffn.as_deref().map(|live| FfnSel {
                live,
                down: m.down.as_ref().map(|d| &*d.0),
                gate_up: m.gate_up.as_ref().map(|(g, u)| (&*g.0, &*u.0)),
            })
        })
    }
    pub fn heads(&self) -> Option<&[bool]> {
        self.mask.and_then(|m| m.heads.as_deref())
    }
    pub fn experts(&self) -> Option<&[bool]> {
        self.mask.and_then(|m| m.experts.as_deref())
    }
}

/// A dense layer's live neurons and its packed `down_proj`, as the MLP reads them.
#[derive(Clone, Copy, Debug)]
pub struct FfnSel<'a> {
    pub live: &'a [u32],
    pub down: Option<&'a OwnedWeight>,
    pub gate_up: Option<(&'a OwnedWeight, &'a OwnedWeight)>,
}

/// `softmax(−E/T)`: a soft mix's weights from routing errors `e` at temperature `temp`.
pub fn blend_weights(e: &[f32], temp: f32) -> Vec<f32> {
    let temp = temp.max(1e-6);
    let max = e
        .iter()
        .map(|&v| -v / temp)
        .fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f32> = e.iter().map(|&v| (-v / temp - max).exp()).collect();
    let sum: f32 = w.iter().sum();
    w.into_iter().map(|v| v / sum).collect()
}

/// Materialises the soft mix `Σ wᵢ·Tᵢ` (claim 14) of every tensor some skill replaces:
/// `Tᵢ` is skill `i`'s replacement, or the backbone's tensor where skill `i` has none.
/// Only those tensors are held (in f32); every other weight stays in the mmap.
pub fn build_blend(model: &Model, weights: &[f32]) -> Blend {
    let mut out: Vec<Option<OwnedWeight>> = Vec::new();
    for lin in model.linears() {
        let Some(slot) = lin.slot else { continue };
        let slot = slot as usize;
        if out.len() <= slot {
            out.resize_with(slot + 1, || None);
        }
        if out[slot].is_some() {
            continue; // a tied embedding is the same linear twice
        }
        let (rows, cols) = (lin.out_dim(), lin.in_dim());
        let mut mix = vec![0f32; rows * cols];
        let mut bias: Option<Vec<f32>> = None;
        let mut row = vec![0f32; cols];
        for (i, &w) in weights.iter().enumerate() {
            let (m, bytes, b) = lin.source_of(Some(i as u16));
            for r in 0..rows {
                m.row(bytes, r, &mut row);
                for (acc, &v) in mix[r * cols..(r + 1) * cols].iter_mut().zip(&row) {
                    *acc += w * v;
                }
            }
            if let Some(b) = b {
                let acc = bias.get_or_insert_with(|| vec![0.0; rows]);
                for (a, &v) in acc.iter_mut().zip(b) {
                    *a += w * v;
                }
            }
        }
        let bytes: Vec<u8> = mix.iter().flat_map(|v| v.to_le_bytes()).collect();
        let m = Matrix::new(DType::F32, &[rows as u64, cols as u64], &bytes)
            .expect("an f32 matrix of the right size is valid");
        out[slot] = Some(OwnedWeight { m, bytes, bias });
    }
    Blend { weights: out }
}
