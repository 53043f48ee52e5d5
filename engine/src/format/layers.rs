//! What each decoder layer is made of, from the tensor directory alone: the token mixer
//! (Gated DeltaNet "linear attention", full or sliding softmax attention, with or without
//! the output gate) and the feed-forward (dense, or MoE with its experts and shared
//! expert), plus the MTP head (§2, §2.1, §2.2). As the spec demands, the kind is decided
//! per layer by which tensors are present, never by the model's name; the header only
//! adds what names cannot say (sliding vs full from `arch.layer_types`, top-k from
//! `arch.moe`). Pure and display-oriented: the engine's loader stays the authority on what
//! runs; this reads no tensor byte and needs no model code.

use std::collections::{BTreeMap, BTreeSet};

use super::directory::TensorEntry;
use super::header::Arch;

/// Decoder layers: `model.layers.{i}.…` (§2's canonical names).
pub const LAYER_PREFIX: &str = "model.layers.";
/// The MTP head: `model.mtp.…`, its blocks under `model.mtp.layers.{i}.…` (§2.1).
pub const MTP_PREFIX: &str = "model.mtp.";

/// How a layer mixes tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mixer {
    /// Gated DeltaNet (`linear_attn.*`).
    LinearAttention,
    /// Softmax attention (`self_attn.*`) over the whole context.
    FullAttention,
    /// Softmax attention that `arch.layer_types` declares sliding-window.
    SlidingAttention,
    /// Neither `linear_attn.*` nor `self_attn.*` tensors.
    None,
}

impl Mixer {
    /// The JSON spelling (`cortiq info --json`).
    pub fn key(self) -> &'static str {
        match self {
            Mixer::LinearAttention => "linear_attention",
            Mixer::FullAttention => "full_attention",
            Mixer::SlidingAttention => "sliding_attention",
            Mixer::None => "none",
        }
    }

    /// The one-word form of a layer label (`linear·MoE 8e`).
    pub fn short(self) -> &'static str {
        match self {
            Mixer::LinearAttention => "linear",
            Mixer::FullAttention => "full",
            Mixer::SlidingAttention => "sliding",
            Mixer::None => "no mixer",
        }
    }

    fn is_attention(self) -> bool {
        matches!(self, Mixer::FullAttention | Mixer::SlidingAttention)
    }
}

/// A layer's feed-forward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ffn {
    /// `mlp.{gate,up,down}_proj`; `width` is the intermediate size when a projection says.
    Dense { width: Option<u64> },
    /// A router `mlp.gate` and/or `mlp.experts.*`.
    Moe(MoeLayer),
    /// No feed-forward tensors.
    None,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeLayer {
    /// Experts present in the directory (distinct `experts.{e}` indices, or the leading
    /// dimension of a fused `experts.*` tensor): after an expert defrag (§11.1) this may
    /// be fewer than `arch.moe.num_experts`.
    pub experts: u64,
    /// Rows of the router `mlp.gate.weight` (one per expert), when there is one.
    pub router_rows: Option<u64>,
    /// `arch.moe.top_k`.
    pub top_k: Option<u64>,
    /// Intermediate size of the first expert.
    pub expert_width: Option<u64>,
    /// `mlp.shared_expert.*` present.
    pub shared_expert: bool,
    pub shared_width: Option<u64>,
    /// `mlp.shared_expert_gate.weight` present.
    pub shared_gate: bool,
}

/// One decoder layer (or one block of the MTP head).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerBlocks {
    pub index: u64,
    pub mixer: Mixer,
    /// Attention whose `q_proj` has twice the rows `o_proj` reads (`2·heads·head_dim`):
    /// it carries the output gate (Qwen3-Next / Qwen3.5).
    pub gated: bool,
    pub ffn: Ffn,
    /// `arch.layer_types[index]`, when the header lists it.
    pub declared: Option<String>,
    pub tensors: u64,
    pub bytes: u64,
}

impl LayerBlocks {
    /// `linear·MoE 8e`, `full(gated)·dense 128`, `full·MoE 7e+shared`.
    pub fn label(&self) -> String {
        let mut s = self.mixer.short().to_string();
        if self.gated {
            s.push_str("(gated)");
        }
        s.push('·');
        match &self.ffn {
            Ffn::Dense { width: Some(w) } => s.push_str(&format!("dense {w}")),
            Ffn::Dense { width: None } => s.push_str("dense"),
            Ffn::Moe(m) => {
                s.push_str(&format!("MoE {}e", m.experts));
                if m.shared_expert {
                    s.push_str("+shared");
                }
            }
            Ffn::None => s.push_str("no FFN"),
        }
        s
    }

    pub fn moe(&self) -> Option<&MoeLayer> {
        match &self.ffn {
            Ffn::Moe(m) => Some(m),
            _ => None,
        }
    }

    /// The tensors say linear attention where `arch.layer_types` says attention, or the
    /// other way round (the engine refuses a declared linear layer without its tensors).
    pub fn contradicts_declared(&self) -> bool {
        let Some(d) = &self.declared else {
            return false;
        };
        match self.mixer {
            Mixer::LinearAttention => d != "LinearAttention",
            Mixer::FullAttention | Mixer::SlidingAttention => d == "LinearAttention",
            Mixer::None => false,
        }
    }
}

/// The MTP head (§2.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MtpHead {
    /// Its blocks (`model.mtp.layers.{i}`), classified like decoder layers.
    pub layers: Vec<LayerBlocks>,
    /// `arch.mtp.num_layers`, when declared.
    pub declared_layers: Option<u64>,
    /// Every `model.mtp.*` tensor.
    pub tensors: u64,
    pub bytes: u64,
}

/// Every decoder layer with tensors in the directory, in index order, and the MTP head.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerMap {
    pub layers: Vec<LayerBlocks>,
    /// Present when `model.mtp.*` tensors exist or `arch.mtp` declares a head.
    pub mtp: Option<MtpHead>,
}

/// What one layer's tensors say, gathered in one pass.
#[derive(Default)]
struct Acc {
    tensors: u64,
    bytes: u64,
    linear: bool,
    attention: bool,
    q_rows: Option<u64>,
    o_cols: Option<u64>,
    dense: bool,
    dense_width: Option<u64>,
    router_rows: Option<u64>,
    expert_ids: BTreeSet<u64>,
    fused_experts: Option<u64>,
    expert_width: Option<u64>,
    shared: bool,
    shared_width: Option<u64>,
    shared_gate: bool,
}

fn rows(e: &TensorEntry) -> Option<u64> {
    (e.shape.len() >= 2).then(|| e.shape[0])
}

fn cols(e: &TensorEntry) -> Option<u64> {
    (e.shape.len() == 2).then(|| e.shape[1])
}

/// `"12.rest"` → `(12, "rest")`.
fn split_index(s: &str) -> Option<(u64, &str)> {
    let (digits, rest) = s.split_once('.')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, rest))
}

impl Acc {
    /// `rest`: the name after `…layers.{i}.`.
    fn add(&mut self, rest: &str, e: &TensorEntry) {
        self.tensors += 1;
        self.bytes = self.bytes.saturating_add(e.nbytes);
        if rest.starts_with("linear_attn.") {
            self.linear = true;
        } else if let Some(a) = rest.strip_prefix("self_attn.") {
            self.attention = true;
            match a {
                "q_proj.weight" => self.q_rows = rows(e),
                "o_proj.weight" => self.o_cols = cols(e),
                _ => {}
            }
        } else if let Some(m) = rest.strip_prefix("mlp.") {
            if m == "gate.weight" {
                self.router_rows = rows(e).or(e.shape.first().copied());
            } else if let Some(x) = m.strip_prefix("experts.") {
                match split_index(x) {
                    Some((id, p)) => {
                        self.expert_ids.insert(id);
                        if self.expert_width.is_none() {
                            self.expert_width = width_of(p, e);
                        }
                    }
                    // A fused bank (`experts.gate_up_proj` [E, 2I, H]): E experts.
                    None if e.shape.len() == 3 => {
                        self.fused_experts = Some(self.fused_experts.unwrap_or(0).max(e.shape[0]))
                    }
                    None => {}
                }
            } else if let Some(p) = m.strip_prefix("shared_expert.") {
                self.shared = true;
                if self.shared_width.is_none() {
                    self.shared_width = width_of(p, e);
                }
            } else if m == "shared_expert_gate.weight" {
                self.shared_gate = true;
            } else if m.ends_with("_proj.weight") {
                self.dense = true;
                if self.dense_width.is_none() {
                    self.dense_width = width_of(m, e);
                }
            }
        }
    }

    fn finish(self, index: u64, arch: Option<&Arch>) -> LayerBlocks {
        let declared = arch
            .and_then(|a| a.layer_types.as_ref())
            .and_then(|t| t.get(index as usize))
            .cloned();
        let mixer = if self.linear {
            // The engine's choice too: `linear_attn` wins over a stray `self_attn`.
            Mixer::LinearAttention
        } else if self.attention {
            if declared.as_deref() == Some("SlidingAttention") {
                Mixer::SlidingAttention
            } else {
                Mixer::FullAttention
            }
        } else {
            Mixer::None
        };
        // What o_proj reads is heads·head_dim; without it, the header's numbers.
        let attn_width = self.o_cols.or_else(|| {
            let a = arch?;
            let heads = a.num_attention_heads?;
            let hd = a.head_dim.or_else(|| a.hidden_size.checked_div(heads))?;
            heads.checked_mul(hd)
        });
        let gated = mixer.is_attention()
            && matches!((self.q_rows, attn_width), (Some(q), Some(w)) if w > 0 && q == 2 * w);
        let experts = (self.expert_ids.len() as u64).max(self.fused_experts.unwrap_or(0));
        let ffn = if self.router_rows.is_some() || experts > 0 {
            Ffn::Moe(MoeLayer {
                experts,
                router_rows: self.router_rows,
                top_k: arch.and_then(|a| a.moe.as_ref()).map(|m| m.top_k),
                expert_width: self.expert_width,
                shared_expert: self.shared,
                shared_width: self.shared_width,
                shared_gate: self.shared_gate,
            })
        } else if self.dense {
            Ffn::Dense {
                width: self.dense_width,
            }
        } else {
            Ffn::None
        };
        LayerBlocks {
            index,
            mixer,
            gated,
            ffn,
            declared,
            tensors: self.tensors,
            bytes: self.bytes,
        }
    }
}

/// The intermediate size a projection shows: rows of `gate_proj` / `up_proj` (fused
/// `gate_up_proj`: half), columns of `down_proj`.
fn width_of(proj: &str, e: &TensorEntry) -> Option<u64> {
    match proj {
        "gate_proj.weight" | "up_proj.weight" => rows(e),
        "gate_up_proj.weight" => rows(e).map(|r| r / 2),
        "down_proj.weight" => cols(e),
        _ => None,
    }
}

/// Classifies every layer of `entries` (a directory, or a sharded model's merged one).
pub fn classify<'a>(
    entries: impl IntoIterator<Item = &'a TensorEntry>,
    arch: Option<&Arch>,
) -> LayerMap {
    let mut layers: BTreeMap<u64, Acc> = BTreeMap::new();
    let mut mtp_layers: BTreeMap<u64, Acc> = BTreeMap::new();
    let (mut mtp_tensors, mut mtp_bytes) = (0u64, 0u64);
    for e in entries {
        if let Some((i, rest)) = e.name.strip_prefix(LAYER_PREFIX).and_then(split_index) {
            layers.entry(i).or_default().add(rest, e);
        } else if let Some(m) = e.name.strip_prefix(MTP_PREFIX) {
            mtp_tensors += 1;
            mtp_bytes = mtp_bytes.saturating_add(e.nbytes);
            if let Some((i, rest)) = m.strip_prefix("layers.").and_then(split_index) {
                mtp_layers.entry(i).or_default().add(rest, e);
            }
        }
    }
    let declared_layers = arch.and_then(|a| a.mtp.as_ref()).map(|m| m.num_layers);
    let mtp = (mtp_tensors > 0 || declared_layers.is_some()).then(|| MtpHead {
        // MTP blocks have no entry in `layer_types`.
        layers: mtp_layers
            .into_iter()
            .map(|(i, a)| LayerBlocks {
                declared: None,
                ..a.finish(i, arch)
            })
            .collect(),
        declared_layers,
        tensors: mtp_tensors,
        bytes: mtp_bytes,
    });
    LayerMap {
        layers: layers.into_iter().map(|(i, a)| a.finish(i, arch)).collect(),
        mtp,
    }
}

/// `n thing` / `n things`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `8` or `7–8`.
fn range(values: impl Iterator<Item = u64>) -> Option<String> {
    let v: Vec<u64> = values.collect();
    let (lo, hi) = (*v.iter().min()?, *v.iter().max()?);
    Some(if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}–{hi}")
    })
}

impl LayerMap {
    pub fn moe_layers(&self) -> impl Iterator<Item = (&LayerBlocks, &MoeLayer)> {
        self.layers.iter().filter_map(|l| l.moe().map(|m| (l, m)))
    }

    /// The layer with `index`, if it has tensors.
    pub fn get(&self, index: u64) -> Option<&LayerBlocks> {
        self.layers
            .binary_search_by_key(&index, |l| l.index)
            .ok()
            .map(|k| &self.layers[k])
    }

    /// One line: `hybrid: 3 linear-attention + 1 full-attention layers (output gate on
    /// 1); 4 MoE layers of 8 experts (top-2, shared expert)`. `None` without layers.
    pub fn summary(&self) -> Option<String> {
        if self.layers.is_empty() {
            return None;
        }
        let n =
            |f: &dyn Fn(&LayerBlocks) -> bool| self.layers.iter().filter(|l| f(l)).count() as u64;
        let linear = n(&|l| l.mixer == Mixer::LinearAttention);
        let full = n(&|l| l.mixer == Mixer::FullAttention);
        let sliding = n(&|l| l.mixer == Mixer::SlidingAttention);
        let none = n(&|l| l.mixer == Mixer::None);
        let gated = n(&|l| l.gated);
        let mut kinds: Vec<String> = Vec::new();
        for (c, name) in [
            (linear, "linear-attention"),
            (full, "full-attention"),
            (sliding, "sliding-attention"),
            (none, "mixer-less"),
        ] {
            if c > 0 {
                kinds.push(format!("{c} {name}"));
            }
        }
        let total = self.layers.len() as u64;
        let mut mixer = format!(
            "{}{} {}",
            if linear > 0 && full + sliding > 0 {
                "hybrid: "
            } else {
                ""
            },
            kinds.join(" + "),
            if total == 1 { "layer" } else { "layers" }
        );
        if gated > 0 {
            mixer.push_str(&format!(" (output gate on {gated})"));
        }

        let mut ffn: Vec<String> = Vec::new();
        let moe: Vec<&MoeLayer> = self.moe_layers().map(|(_, m)| m).collect();
        if !moe.is_empty() {
            let experts = range(moe.iter().map(|m| m.experts)).unwrap_or_default();
            let mut notes = Vec::new();
            if let Some(k) = range(moe.iter().filter_map(|m| m.top_k)) {
                notes.push(format!("top-{k}"));
            }
            let shared = moe.iter().filter(|m| m.shared_expert).count();
            if shared == moe.len() {
                notes.push("shared expert".into());
            } else if shared > 0 {
                notes.push(format!("shared expert in {shared}"));
            }
            let mut s = format!(
                "{} of {experts} experts",
                count(moe.len() as u64, "MoE layer", "MoE layers")
            );
            if !notes.is_empty() {
                s.push_str(&format!(" ({})", notes.join(", ")));
            }
            ffn.push(s);
        }
        let dense: Vec<Option<u64>> = self
            .layers
            .iter()
            .filter_map(|l| match l.ffn {
                Ffn::Dense { width } => Some(width),
                _ => None,
            })
            .collect();
        if !dense.is_empty() {
            let mut s = count(dense.len() as u64, "dense layer", "dense layers");
            if let Some(w) = range(dense.iter().flatten().copied()) {
                s.push_str(&format!(" (width {w})"));
            }
            ffn.push(s);
        }
        let no_ffn = n(&|l| l.ffn == Ffn::None);
        if no_ffn > 0 {
            ffn.push(format!("{no_ffn} without a feed-forward"));
        }
        Some(format!("{mixer}; {}", ffn.join(" + ")))
    }

    /// `MTP head: 1 layer (full·dense 144)`; `None` without a head.
    /// Where `arch.layer_types` contradicts the tensors, as a sentence naming the layers.
    pub fn contradiction(&self) -> Option<String> {
        let odd: Vec<String> = self
            .layers
            .iter()
            .filter(|l| l.contradicts_declared())
            .map(|l| format!("L{}", l.index))
            .collect();
        (!odd.is_empty()).then(|| {
            format!(
                "arch.layer_types disagrees with the tensors on {}",
                odd.join(", ")
            )
        })
    }

    pub fn mtp_summary(&self) -> Option<String> {
        let m = self.mtp.as_ref()?;
        if m.tensors == 0 {
            return Some(format!(
                "MTP head: arch.mtp declares {} but the directory has no model.mtp.* tensors",
                count(m.declared_layers.unwrap_or(0), "layer", "layers")
            ));
        }
        let n = m.layers.len() as u64;
        let mut s = format!("MTP head: {}", count(n, "layer", "layers"));
        let kinds: Vec<String> = runs(&m.layers).into_iter().map(|r| r.label).collect();
        let mut notes = Vec::new();
        if !kinds.is_empty() {
            notes.push(kinds.join(", "));
        }
        match m.declared_layers {
            Some(d) if d != n => notes.push(format!("arch.mtp says {d}")),
            None => notes.push("not declared in arch.mtp".into()),
            _ => {}
        }
        if !notes.is_empty() {
            s.push_str(&format!(" ({})", notes.join("; ")));
        }
        Some(s)
    }
}

/// Consecutive layers of the same kind, folded (`L0–2 linear·MoE 8e`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerRun {
    pub first: u64,
    pub last: u64,
    pub label: String,
}

impl LayerRun {
    /// `L3` or `L0–2`.
    pub fn name(&self) -> String {
        if self.first == self.last {
            format!("L{}", self.first)
        } else {
            format!("L{}–{}", self.first, self.last)
        }
    }
}

/// Folds runs of adjacent indices with equal labels.
pub fn runs(layers: &[LayerBlocks]) -> Vec<LayerRun> {
    let mut out: Vec<LayerRun> = Vec::new();
    for l in layers {
        let label = l.label();
        match out.last_mut() {
            Some(r) if r.label == label && r.last + 1 == l.index => r.last = l.index,
            _ => out.push(LayerRun {
                first: l.index,
                last: l.index,
                label,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dtype::DType;
    use crate::format::header::{Moe, Mtp};

    fn t(name: &str, shape: &[u64]) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            dtype: DType::F16,
            shape: shape.to_vec(),
            off: 0,
            nbytes: 2 * shape.iter().product::<u64>(),
            hash: 0,
        }
    }

    /// Hidden 72, 3 heads of 24: nothing a power of two.
    fn arch(layer_types: Option<&[&str]>) -> Arch {
        Arch {
            arch_name: "anything-at-all".into(),
            hidden_size: 72,
            num_layers: 4,
            num_attention_heads: Some(3),
            num_kv_heads: Some(1),
            head_dim: Some(24),
            vocab_size: 259,
            layer_types: layer_types.map(|v| v.iter().map(|s| s.to_string()).collect()),
            moe: Some(Moe {
                num_experts: 7,
                top_k: 3,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn attention(p: &str, q_rows: u64, out: &mut Vec<TensorEntry>) {
        out.push(t(&format!("{p}self_attn.q_proj.weight"), &[q_rows, 72]));
        out.push(t(&format!("{p}self_attn.k_proj.weight"), &[24, 72]));
        out.push(t(&format!("{p}self_attn.v_proj.weight"), &[24, 72]));
        out.push(t(&format!("{p}self_attn.o_proj.weight"), &[72, 72]));
    }

    fn gdn(p: &str, out: &mut Vec<TensorEntry>) {
        for n in ["in_proj_qkv.weight", "in_proj_z.weight", "out_proj.weight"] {
            out.push(t(&format!("{p}linear_attn.{n}"), &[168, 72]));
        }
        out.push(t(&format!("{p}linear_attn.A_log"), &[6]));
    }

    /// `{p}gate_proj`, `up_proj`, `down_proj` of intermediate size `width`.
    fn projections(p: &str, width: u64, out: &mut Vec<TensorEntry>) {
        out.push(t(&format!("{p}gate_proj.weight"), &[width, 72]));
        out.push(t(&format!("{p}up_proj.weight"), &[width, 72]));
        out.push(t(&format!("{p}down_proj.weight"), &[72, width]));
    }

    fn dense(p: &str, width: u64, out: &mut Vec<TensorEntry>) {
        projections(&format!("{p}mlp."), width, out);
    }

    fn moe(p: &str, experts: u64, shared: Option<u64>, out: &mut Vec<TensorEntry>) {
        out.push(t(&format!("{p}mlp.gate.weight"), &[experts, 72]));
        for e in 0..experts {
            projections(&format!("{p}mlp.experts.{e}."), 40, out);
        }
        if let Some(s) = shared {
            projections(&format!("{p}mlp.shared_expert."), s, out);
            out.push(t(&format!("{p}mlp.shared_expert_gate.weight"), &[1, 72]));
        }
    }

    /// TinySpec::hybrid's shapes: GDN+MoE(shared), gated attention+dense,
    /// GDN+dense, plain attention+MoE.
    fn hybrid() -> Vec<TensorEntry> {
        let mut v = vec![t("model.embed_tokens.weight", &[259, 72])];
        gdn("model.layers.0.", &mut v);
        moe("model.layers.0.", 7, Some(56), &mut v);
        attention("model.layers.1.", 144, &mut v);
        dense("model.layers.1.", 120, &mut v);
        gdn("model.layers.2.", &mut v);
        dense("model.layers.2.", 96, &mut v);
        attention("model.layers.3.", 72, &mut v);
        moe("model.layers.3.", 7, None, &mut v);
        v.push(t("lm_head.weight", &[259, 72]));
        v
    }

    #[test]
    fn every_block_kind_is_told_apart_by_its_tensors() {
        let a = arch(Some(&[
            "LinearAttention",
            "FullAttention",
            "LinearAttention",
            "FullAttention",
        ]));
        let m = classify(&hybrid(), Some(&a));
        let labels: Vec<String> = m.layers.iter().map(|l| l.label()).collect();
        assert_eq!(
            labels,
            [
                "linear·MoE 7e+shared",
                "full(gated)·dense 120",
                "linear·dense 96",
                "full·MoE 7e"
            ]
        );
        let l0 = m.layers[0].moe().unwrap();
        assert_eq!(
            *l0,
            MoeLayer {
                experts: 7,
                router_rows: Some(7),
                top_k: Some(3),
                expert_width: Some(40),
                shared_expert: true,
                shared_width: Some(56),
                shared_gate: true,
            }
        );
        assert!(!m.layers[3].moe().unwrap().shared_expert);
        assert_eq!(m.layers[1].tensors, 7);
        assert!(m.layers.iter().all(|l| !l.contradicts_declared()));
        assert_eq!(m.mtp, None);
        assert_eq!(
            m.summary().unwrap(),
            "hybrid: 2 linear-attention + 2 full-attention layers (output gate on 1); \
             2 MoE layers of 7 experts (top-3, shared expert in 1) + 2 dense layers (width 96–120)"
        );
        let r: Vec<String> = runs(&m.layers).iter().map(|r| r.name()).collect();
        assert_eq!(r, ["L0", "L1", "L2", "L3"]);
    }

    #[test]
    fn the_model_name_and_missing_header_change_nothing_but_what_only_the_header_says() {
        // No arch: kinds from tensors alone; no top-k; gating from o_proj's width.
        let m = classify(&hybrid(), None);
        assert_eq!(m.layers[1].label(), "full(gated)·dense 120");
        assert_eq!(m.layers[0].moe().unwrap().top_k, None);
        assert!(m.summary().unwrap().contains("(shared expert in 1)"));
        // layer_types saying "sliding" turns attention sliding, never linear.
        let a = arch(Some(&["SlidingAttention"; 4]));
        let m = classify(&hybrid(), Some(&a));
        let mixers: Vec<Mixer> = m.layers.iter().map(|l| l.mixer).collect();
        assert_eq!(
            mixers,
            [
                Mixer::LinearAttention,
                Mixer::SlidingAttention,
                Mixer::LinearAttention,
                Mixer::SlidingAttention
            ]
        );
        assert!(m.layers[0].contradicts_declared());
        assert!(m
            .summary()
            .unwrap()
            .starts_with("hybrid: 2 linear-attention + 2 sliding-attention layers"));
    }

    #[test]
    fn the_output_gate_is_twice_what_o_proj_reads() {
        // 5 heads of 13 = 65 (odd, not a power of two); q_proj 130 rows = gated.
        let v = vec![
            t("model.layers.0.self_attn.q_proj.weight", &[130, 72]),
            t("model.layers.0.self_attn.o_proj.weight", &[72, 65]),
            t("model.layers.1.self_attn.q_proj.weight", &[65, 72]),
            t("model.layers.1.self_attn.o_proj.weight", &[72, 65]),
            // Without o_proj the header's heads × head_dim decide (3 × 24 = 72).
            t("model.layers.2.self_attn.q_proj.weight", &[144, 72]),
            t("model.layers.3.self_attn.q_proj.weight", &[144, 72]),
        ];
        let a = arch(None);
        let m = classify(&v, Some(&a));
        let gated: Vec<bool> = m.layers.iter().map(|l| l.gated).collect();
        assert_eq!(gated, [true, false, true, true]);
        // Without either, nothing is claimed.
        let m = classify(&v, None);
        assert!(!m.layers[2].gated);
        // head_dim absent: hidden / heads.
        let a = Arch {
            head_dim: None,
            ..arch(None)
        };
        assert!(classify(&v, Some(&a)).layers[3].gated);
        assert_eq!(m.layers[0].ffn, Ffn::None);
        assert_eq!(
            m.summary().unwrap(),
            "4 full-attention layers (output gate on 1); 4 without a feed-forward"
        );
    }

    #[test]
    fn experts_are_counted_as_present_and_only_canonical_layers_count() {
        let mut v = Vec::new();
        attention("model.layers.10.", 72, &mut v);
        // A defragmented layer: 3 of 7 experts, ids with gaps; no router.
        for e in [0u64, 4, 6] {
            projections(&format!("model.layers.10.mlp.experts.{e}."), 33, &mut v);
        }
        // A fused bank: 12 experts in one tensor.
        attention("model.layers.2.", 72, &mut v);
        v.push(t("model.layers.2.mlp.gate.weight", &[12, 72]));
        v.push(t("model.layers.2.mlp.experts.gate_up_proj", &[12, 66, 72]));
        v.push(t("model.layers.2.mlp.experts.down_proj", &[12, 72, 33]));
        // Skill tensors and other prefixes that merely contain `layers.N.`: not layers.
        v.push(t("skill.sql.model.layers.2.mlp.gate_proj.weight", &[5, 72]));
        v.push(t("vision.layers.0.mlp.gate_proj.weight", &[5, 72]));
        v.push(t("model.layers.x.mlp.gate_proj.weight", &[5, 72]));
        v.push(t("model.layers.", &[1]));
        let m = classify(&v, None);
        let idx: Vec<u64> = m.layers.iter().map(|l| l.index).collect();
        assert_eq!(idx, [2, 10], "numeric order, only model.layers.N.");
        assert_eq!(m.layers[0].moe().unwrap().experts, 12);
        assert_eq!(m.layers[0].moe().unwrap().router_rows, Some(12));
        let l10 = m.get(10).unwrap().moe().unwrap();
        assert_eq!(
            (l10.experts, l10.router_rows, l10.expert_width),
            (3, None, Some(33))
        );
        assert_eq!(m.get(2).unwrap().tensors, 7);
        assert!(m.get(3).is_none());
        assert_eq!(
            m.summary().unwrap(),
            "2 full-attention layers; 2 MoE layers of 3–12 experts"
        );
    }

    #[test]
    fn the_mtp_head_is_its_own_and_not_layer_0() {
        let mut v = hybrid();
        for n in ["enorm", "hnorm", "norm"] {
            v.push(t(&format!("model.mtp.{n}.weight"), &[72]));
        }
        v.push(t("model.mtp.eh_proj.weight", &[72, 144]));
        attention("model.mtp.layers.0.", 72, &mut v);
        dense("model.mtp.layers.0.", 144, &mut v);
        let mut a = arch(None);
        a.mtp = Some(Mtp {
            num_layers: 1,
            ..Default::default()
        });
        let m = classify(&v, Some(&a));
        assert_eq!(m.layers.len(), 4);
        assert_eq!(
            m.layers[0].label(),
            "linear·MoE 7e+shared",
            "layer 0 is untouched"
        );
        let h = m.mtp.as_ref().unwrap();
        assert_eq!((h.tensors, h.layers.len()), (11, 1));
        assert_eq!(h.layers[0].label(), "full·dense 144");
        assert_eq!(
            m.mtp_summary().unwrap(),
            "MTP head: 1 layer (full·dense 144)"
        );
        // Declared otherwise, or not at all: said.
        a.mtp = Some(Mtp {
            num_layers: 2,
            ..Default::default()
        });
        assert_eq!(
            classify(&v, Some(&a)).mtp_summary().unwrap(),
            "MTP head: 1 layer (full·dense 144; arch.mtp says 2)"
        );
        assert!(classify(&v, None)
            .mtp_summary()
            .unwrap()
            .ends_with("; not declared in arch.mtp)"));
        // Declared without tensors.
        let m = classify(&hybrid(), Some(&a));
        assert!(m.mtp_summary().unwrap().contains("no model.mtp.* tensors"));
        assert_eq!(classify(&hybrid(), None).mtp_summary(), None);
    }

    #[test]
    fn runs_fold_equal_neighbours_only() {
        let mut v = Vec::new();
        for i in 0..3 {
            gdn(&format!("model.layers.{i}."), &mut v);
            moe(&format!("model.layers.{i}."), 8, None, &mut v);
        }
        attention("model.layers.3.", 144, &mut v);
        moe("model.layers.3.", 8, None, &mut v);
        // A gap: layer 5 looks like layer 3, but 4 is missing.
        attention("model.layers.5.", 144, &mut v);
        moe("model.layers.5.", 8, None, &mut v);
        let m = classify(&v, Some(&arch(None)));
        let r: Vec<String> = runs(&m.layers)
            .iter()
            .map(|r| format!("{} {}", r.name(), r.label))
            .collect();
        assert_eq!(
            r,
            [
                "L0–2 linear·MoE 8e",
                "L3 full(gated)·MoE 8e",
                "L5 full(gated)·MoE 8e"
            ]
        );
        assert_eq!(
            m.summary().unwrap(),
            "hybrid: 3 linear-attention + 2 full-attention layers (output gate on 2); \
             5 MoE layers of 8 experts (top-3)"
        );
        assert_eq!(classify(&[], None).summary(), None);
        let one = classify(&v[..4], None);
        assert_eq!(
            one.summary().unwrap(),
            "1 linear-attention layer; 1 without a feed-forward"
        );
    }
}
