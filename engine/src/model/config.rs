//! The engine's view of `header.arch` (§2): every number a forward pass needs, checked
//! once. Fields the spec leaves to the converter (`rope_scaling`, `sliding_window`,
//! `hidden_act`, Gemma's `embed_multiplier`, `query_pre_attn_scalar`, soft-capping,
//! `rope_local_base_freq`) are read from the arch's extra keys, spelled as Hugging Face
//! spells them.

use serde_json::{Map, Value};

use super::ModelError;
use crate::format::header::{Arch, NormStyle};

/// How a layer mixes tokens, from `arch.layer_types`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    FullAttention,
    SlidingAttention,
    LinearAttention,
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x·σ(x)` (SwiGLU): llama, mistral, qwen.
    Silu,
    /// `gelu_pytorch_tanh`: Gemma.
    GeluTanh,
    /// Exact erf GeLU.
    Gelu,
}

/// RoPE frequency scaling (`rope_scaling` / `rope_parameters` with a `rope_type`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        /// Multiplies cos and sin (`attention_factor`, or derived from `mscale`).
        attention_factor: f64,
        truncate: bool,
    },
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub hidden: usize,
    pub intermediate: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub eps: f32,
    /// `x̂·(1+w)` (Gemma, Qwen3.5) rather than `x̂·w`.
    pub zero_centred_norm: bool,
    pub rope_theta: f64,
    /// Sliding-window layers' RoPE base (Gemma 3), when it differs.
    pub rope_local_theta: Option<f64>,
    pub partial_rotary: f64,
    pub rope_scaling: RopeScaling,
    pub max_positions: usize,
    pub layer_kinds: Vec<LayerKind>,
    pub sliding_window: Option<usize>,
    pub activation: Activation,
    pub embed_multiplier: Option<f32>,
    /// Attention scores are scaled by `query_pre_attn_scalar^-½` instead of `head_dim^-½`.
    pub query_pre_attn_scalar: Option<f64>,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// `arch.moe` (§2.2): which layers are MoE is decided by the router's presence.
    pub moe: Option<super::moe::MoeConfig>,
    /// Gated DeltaNet key heads and their dimension (`linear_num_key_heads`,
    /// `linear_key_head_dim`); the other sizes come from the tensors.
    pub linear_key_heads: Option<usize>,
    pub linear_key_head_dim: Option<usize>,
    /// `arch.mtp.num_layers` (§2.1), when the file declares an MTP head.
    pub mtp_layers: Option<usize>,
}

fn bad(field: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Config {
        field: field.into(),
        reason: reason.into(),
    }
}

fn positive(field: &str, v: Option<u64>) -> Result<usize, ModelError> {
    let v = v.ok_or_else(|| bad(field, "missing: the engine needs it"))?;
    if v == 0 || v > (1 << 24) {
        return Err(bad(field, format!("{v} is out of range")));
    }
    Ok(v as usize)
}

fn f64_of(extra: &Map<String, Value>, key: &str) -> Option<f64> {
    extra.get(key).and_then(Value::as_f64)
}

fn rope_scaling(extra: &Map<String, Value>, max_pos: usize) -> Result<RopeScaling, ModelError> {
    let Some(r) = extra.get("rope_scaling").filter(|v| !v.is_null()) else {
        return Ok(RopeScaling::None);
    };
    let kind = r
        .get("rope_type")
        .or_else(|| r.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |k: &str| r.get(k).and_then(Value::as_f64);
    let factor = || {
        num("factor")
            .filter(|f| f.is_finite() && *f > 0.0)
            .ok_or_else(|| bad("rope_scaling.factor", "missing or not positive"))
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: num("low_freq_factor").unwrap_or(1.0),
            high_freq_factor: num("high_freq_factor").unwrap_or(4.0),
            original_max_position_embeddings: num("original_max_position_embeddings")
                .unwrap_or(8192.0),
        },
        "yarn" => {
            let factor = factor()?;
            let get_mscale = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let attention_factor = match (
                num("attention_factor"),
                num("mscale"),
                num("mscale_all_dim"),
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    get_mscale(factor, m) / get_mscale(factor, all)
                }
                _ => get_mscale(factor, 1.0),
            };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: num("original_max_position_embeddings")
                    .unwrap_or(max_pos as f64),
                beta_fast: num("beta_fast").unwrap_or(32.0),
                beta_slow: num("beta_slow").unwrap_or(1.0),
                attention_factor,
                truncate: r.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            }
        }
        other => {
            return Err(ModelError::Unsupported(format!(
                "RoPE scaling type {other:?}"
            )))
        }
    })
}

impl ModelConfig {
    pub fn from_arch(a: &Arch) -> Result<ModelConfig, ModelError> {
        let hidden = positive("hidden_size", Some(a.hidden_size))?;
        let n_layers = positive("num_layers", Some(a.num_layers))?;
        let n_heads = positive("num_attention_heads", a.num_attention_heads)?;
        let n_kv_heads = positive("num_kv_heads", a.num_kv_heads.or(a.num_attention_heads))?;
        if n_heads % n_kv_heads != 0 {
            return Err(bad(
                "num_kv_heads",
                format!("{n_kv_heads} does not divide num_attention_heads {n_heads}"),
            ));
        }
        let head_dim = match a.head_dim {
            Some(d) => positive("head_dim", Some(d))?,
            None if hidden % n_heads == 0 => hidden / n_heads,
            None => {
                return Err(bad(
                    "head_dim",
                    "missing and hidden_size / heads is not whole",
                ))
            }
        };
        let layer_kinds = match &a.layer_types {
            Some(lt) => {
                if lt.len() != n_layers {
                    return Err(bad(
                        "layer_types",
                        format!("{} entries for {n_layers} layers", lt.len()),
                    ));
                }
                lt.iter()
                    .map(|t| match t.as_str() {
                        "FullAttention" => Ok(LayerKind::FullAttention),
                        "SlidingAttention" => Ok(LayerKind::SlidingAttention),
                        "LinearAttention" => Ok(LayerKind::LinearAttention),
                        other => Err(bad("layer_types", format!("unknown layer type {other:?}"))),
                    })
                    .collect::<Result<_, _>>()?
            }
            None => vec![LayerKind::FullAttention; n_layers],
        };
        let x = &a.extra;
        // A context of 0 positions is a broken file, not a model of one position: every
        // command would fail later with a misleading "fills the context" message.
        if a.max_position_embeddings == Some(0) {
            return Err(bad(
                "max_position_embeddings",
                "0: a model must hold at least one position",
            ));
        }
        let max_positions = a.max_position_embeddings.unwrap_or(4096).min(1 << 24) as usize;
        let activation = match x.get("hidden_act").and_then(Value::as_str) {
            None | Some("silu") | Some("swish") => Activation::Silu,
            Some("gelu_tanh") | Some("gelu_pytorch_tanh") | Some("gelu_new") => {
                Activation::GeluTanh
            }
            Some("gelu") => Activation::Gelu,
            Some(other) => return Err(ModelError::Unsupported(format!("hidden_act {other:?}"))),
        };
        let sliding_window =
            match x.get("sliding_window") {
                Some(Value::Number(n)) => Some(n.as_u64().filter(|&w| w > 0).ok_or_else(|| {
                    bad("sliding_window", format!("{n} is not a positive integer"))
                })? as usize),
                _ => None,
            };
        let softcap = |k: &str| f64_of(x, k).filter(|c| *c > 0.0).map(|c| c as f32);
        let eps = a.rms_norm_eps.unwrap_or(1e-6);
        if !(eps.is_finite() && eps > 0.0) {
            return Err(bad("rms_norm_eps", format!("{eps} is not positive")));
        }
        let rope_theta = a.rope_theta.unwrap_or(10000.0);
        if !(rope_theta.is_finite() && rope_theta > 1.0) {
            return Err(bad("rope_theta", format!("{rope_theta} must be above 1")));
        }
        let partial_rotary = a.partial_rotary_factor.unwrap_or(1.0);
        if !(partial_rotary > 0.0 && partial_rotary <= 1.0) {
            return Err(bad(
                "partial_rotary_factor",
                format!("{partial_rotary} is not in (0, 1]"),
            ));
        }
        Ok(ModelConfig {
            hidden,
            intermediate: a.intermediate_size.unwrap_or(0) as usize,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab: positive("vocab_size", Some(a.vocab_size))?,
            eps: eps as f32,
            zero_centred_norm: match a.norm_style {
                Some(NormStyle::Gemma) => true,
                Some(NormStyle::Qwen) => false,
                None => return Err(bad("norm_style", "missing: the engine needs it (§2)")),
            },
            rope_theta,
            rope_local_theta: f64_of(x, "rope_local_base_freq"),
            partial_rotary,
            rope_scaling: rope_scaling(x, max_positions)?,
            max_positions,
            layer_kinds,
            sliding_window,
            activation,
            embed_multiplier: f64_of(x, "embed_multiplier").map(|m| m as f32),
            query_pre_attn_scalar: f64_of(x, "query_pre_attn_scalar"),
            attn_softcap: softcap("attn_logit_softcapping"),
            final_softcap: softcap("final_logit_softcapping"),
            moe: match &a.moe {
                Some(m) => Some(super::moe::MoeConfig {
                    num_experts: positive("moe.num_experts", Some(m.num_experts))?,
                    top_k: positive("moe.top_k", Some(m.top_k))?,
                    norm_topk_prob: m.norm_topk_prob.unwrap_or(true),
                }),
                None => None,
            },
            linear_key_heads: a
                .linear_num_key_heads
                .map(|v| positive("linear_num_key_heads", Some(v)))
                .transpose()?,
            linear_key_head_dim: x
                .get("linear_key_head_dim")
                .and_then(Value::as_u64)
                .map(|v| positive("linear_key_head_dim", Some(v)))
                .transpose()?,
            mtp_layers: match &a.mtp {
                Some(m) => Some(positive("mtp.num_layers", Some(m.num_layers))?),
                None => None,
            },
        })
    }

    /// Rotated dimensions per head (`partial_rotary_factor`), even.
    pub fn rotary_dim(&self) -> usize {
        let d = (self.head_dim as f64 * self.partial_rotary) as usize;
        d & !1
    }
}
