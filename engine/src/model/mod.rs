//! The model: per-layer blocks chosen by which tensors are present (§2), over weights that
//! stay in the mmap in their stored dtype.
//!
//! [`Model::forward`] is the whole computation, top to bottom: embed → layers → final norm
//! → LM head. Sessions (`runtime`) own the KV cache and the [`Workspace`]; the model itself
//! is immutable and shared between threads.

pub mod attention;
pub mod block;
pub mod config;
pub mod kv_cache;
pub mod linear;
pub mod mlp;
pub mod norm;
pub mod rope;

use std::sync::Arc;

use self::attention::{Attention, AttentionConfig, AttentionScratch};
use self::block::{DecoderLayer, LayerScratch};
use self::config::{LayerKind, ModelConfig};
use self::linear::Linear;
use self::mlp::{Mlp, MlpScratch};
use self::norm::RmsNorm;
use self::rope::Rope;
use crate::format::shards::CmfModel;
use crate::model::kv_cache::KvCache;
pub use crate::quant::matrix::Precision;

/// Why a file cannot be run, or a forward refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// The file has no `arch` block.
    #[error("the file has no arch block: nothing to run")]
    NoArch,
    /// An arch field is missing or out of range.
    #[error("arch.{field}: {reason}")]
    Config { field: String, reason: String },
    /// A tensor the layer layout needs is absent.
    #[error("tensor {0} is missing")]
    MissingTensor(String),
    /// A tensor has the wrong shape for the arch.
    #[error("tensor {name} {reason}")]
    Shape { name: String, reason: String },
    /// A tensor's payload cannot be used (reserved dtype, inconsistent bytes).
    #[error("tensor {name}: {reason}")]
    Tensor { name: String, reason: String },
    /// The file needs a block this engine does not have yet.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// The context is full.
    #[error("context limit reached: {needed} positions needed, the session holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
}

pub struct Model {
    pub config: ModelConfig,
    pub file: Arc<CmfModel>,
    pub embed: Linear,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
    /// `lm_head.weight`, or the embedding when tied.
    pub lm_head: Linear,
    pub tied: bool,
    /// What the loader had to assume (shown to the user, never silently).
    pub warnings: Vec<String>,
}

/// Which positions' logits a forward computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's (generation).
    Last,
    /// Every position's (parity, perplexity).
    All,
    /// None (prefill of a chunk that is not the last).
    None,
}

/// Every buffer one forward of up to `t_max` tokens needs, allocated once.
#[derive(Debug)]
pub struct Workspace {
    pub t_max: usize,
    x: Vec<f32>,
    layer: LayerScratch,
    /// Logits of the last forward: [1, vocab] or [t, vocab].
    pub logits: Vec<f32>,
}

impl Workspace {
    pub fn new(c: &ModelConfig, t_max: usize) -> Workspace {
        let t_max = t_max.max(1);
        let attn = AttentionConfig {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: 0.0,
            window: None,
            softcap: None,
        };
        Workspace {
            t_max,
            x: vec![0.0; t_max * c.hidden],
            layer: LayerScratch {
                h: vec![0.0; t_max * c.hidden],
                o: vec![0.0; t_max * c.hidden],
                attn: AttentionScratch::new(&attn, t_max),
                mlp: MlpScratch::new(c.intermediate, t_max),
            },
            logits: vec![0.0; c.vocab],
        }
    }
}

fn decode_vector(file: &CmfModel, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let (shard, e) = file
        .get(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    let v = crate::quant::decode(e.dtype, &e.shape, file.shards[shard].tensor_bytes(e)).map_err(
        |err| ModelError::Tensor {
            name: name.into(),
            reason: err.to_string(),
        },
    )?;
    if v.len() != len {
        return Err(ModelError::Shape {
            name: name.into(),
            reason: format!("has {} values, expected {len}", v.len()),
        });
    }
    Ok(v)
}

impl Model {
    /// Builds the blocks of every layer from the tensors present. Reads only the small
    /// vectors (norms, biases); weight matrices stay in the mmap.
    pub fn load(file: Arc<CmfModel>) -> Result<Model, ModelError> {
        Model::load_with(file, &serde_json::Map::new())
    }

    /// [`Model::load`] with arch fields replaced or added first (`--arch key=value`): the
    /// way to run a file whose converter left out a field, such as the reference
    /// converter's Gemma 3 files, which carry no `sliding_window`.
    pub fn load_with(
        file: Arc<CmfModel>,
        overrides: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Model, ModelError> {
        let arch = file.header().arch.as_ref().ok_or(ModelError::NoArch)?;
        let arch = if overrides.is_empty() {
            arch.clone()
        } else {
            let mut v = serde_json::to_value(arch).expect("an arch serialises");
            let obj = v.as_object_mut().expect("an arch is an object");
            for (k, val) in overrides {
                obj.insert(k.clone(), val.clone());
            }
            serde_json::from_value(v).map_err(|e| ModelError::Config {
                field: "(override)".into(),
                reason: e.to_string(),
            })?
        };
        let c = ModelConfig::from_arch(&arch)?;
        let mut warnings = Vec::new();
        if c.layer_kinds.contains(&LayerKind::SlidingAttention) && c.sliding_window.is_none() {
            warnings.push(
                "the arch has sliding-window layers but no sliding_window: they attend to the \
                 whole context (set it with --arch sliding_window=N)"
                    .to_string(),
            );
        }
        let f = &file;
        let has = |n: &str| f.get(n).is_some();
        let norm = |n: &str, len: usize| -> Result<RmsNorm, ModelError> {
            Ok(RmsNorm::new(
                decode_vector(f, n, len)?,
                c.eps,
                c.zero_centred_norm,
            ))
        };
        let linear = |n: &str, out: usize, inp: usize, bias: bool| -> Result<Linear, ModelError> {
            let mut l = Linear::load(f, &format!("{n}.weight"), out, inp)?;
            let bias_name = format!("{n}.bias");
            if bias && has(&bias_name) {
                l.bias = Some(decode_vector(f, &bias_name, out)?);
            }
            Ok(l)
        };
        let (h, hd) = (c.hidden, c.head_dim);
        let embed = Linear::load(f, "model.embed_tokens.weight", c.vocab, h)?;
        let tied = !has("lm_head.weight");
        let lm_head = if tied {
            embed.clone()
        } else {
            Linear::load(f, "lm_head.weight", c.vocab, h)?
        };
        let mut layers = Vec::with_capacity(c.n_layers);
        for (i, kind) in c.layer_kinds.iter().enumerate() {
            let p = format!("model.layers.{i}");
            if *kind == LayerKind::LinearAttention {
                return Err(ModelError::Unsupported(format!(
                    "layer {i} is a linear-attention (Gated DeltaNet) layer"
                )));
            }
            if has(&format!("{p}.mlp.gate.weight")) {
                return Err(ModelError::Unsupported(format!(
                    "layer {i} is a mixture-of-experts layer"
                )));
            }
            let sliding = *kind == LayerKind::SlidingAttention;
            let theta = match (sliding, c.rope_local_theta) {
                (true, Some(local)) => local,
                _ => c.rope_theta,
            };
            // Gemma 3 scales only its global layers' RoPE; its local layers use the plain base.
            let scaling = if sliding && c.rope_local_theta.is_some() {
                config::RopeScaling::None
            } else {
                c.rope_scaling.clone()
            };
            let q_norm_name = format!("{p}.self_attn.q_norm.weight");
            let k_norm_name = format!("{p}.self_attn.k_norm.weight");
            let intermediate = f
                .get(&format!("{p}.mlp.gate_proj.weight"))
                .map(|(_, e)| e.shape.first().copied().unwrap_or(0) as usize)
                .ok_or_else(|| ModelError::MissingTensor(format!("{p}.mlp.gate_proj.weight")))?;
            let attn = Attention {
                cfg: AttentionConfig {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: hd,
                    scale: (c.query_pre_attn_scalar.unwrap_or(hd as f64)).powf(-0.5) as f32,
                    window: if sliding { c.sliding_window } else { None },
                    softcap: c.attn_softcap,
                },
                q_proj: linear(&format!("{p}.self_attn.q_proj"), c.n_heads * hd, h, true)?,
                k_proj: linear(&format!("{p}.self_attn.k_proj"), c.n_kv_heads * hd, h, true)?,
                v_proj: linear(&format!("{p}.self_attn.v_proj"), c.n_kv_heads * hd, h, true)?,
                o_proj: linear(&format!("{p}.self_attn.o_proj"), h, c.n_heads * hd, true)?,
                q_norm: has(&q_norm_name)
                    .then(|| norm(&q_norm_name, hd))
                    .transpose()?,
                k_norm: has(&k_norm_name)
                    .then(|| norm(&k_norm_name, hd))
                    .transpose()?,
                rope: Rope::new(theta, c.rotary_dim(), &scaling),
            };
            let pre_ff = format!("{p}.pre_feedforward_layernorm.weight");
            let post_attn = format!("{p}.post_attention_layernorm.weight");
            let post_ff = format!("{p}.post_feedforward_layernorm.weight");
            let sandwich = has(&pre_ff);
            layers.push(DecoderLayer {
                input_norm: norm(&format!("{p}.input_layernorm.weight"), h)?,
                attn,
                post_attn_norm: sandwich.then(|| norm(&post_attn, h)).transpose()?,
                pre_mlp_norm: norm(if sandwich { &pre_ff } else { &post_attn }, h)?,
                mlp: Mlp {
                    gate: linear(&format!("{p}.mlp.gate_proj"), intermediate, h, true)?,
                    up: linear(&format!("{p}.mlp.up_proj"), intermediate, h, true)?,
                    down: linear(&format!("{p}.mlp.down_proj"), h, intermediate, true)?,
                    act: c.activation,
                },
                post_mlp_norm: has(&post_ff).then(|| norm(&post_ff, h)).transpose()?,
            });
        }
        let final_norm = norm("model.norm.weight", h)?;
        let mut c = c;
        // The widest MLP decides the scratch size (intermediate_size may be absent).
        c.intermediate = layers
            .iter()
            .map(|l| l.mlp.gate.out_dim())
            .max()
            .unwrap_or(0);
        Ok(Model {
            warnings,
            norm: final_norm,
            embed,
            lm_head,
            tied,
            layers,
            file,
            config: c,
        })
    }

    /// Sets how every weight product takes its activations: [`Precision::Exact`] (the
    /// default; f32, the parity path) or [`Precision::Fast`] (activations quantized to
    /// int8 per group of 32 for the integer kernels of q8/q4 dtypes).
    /// The precision set by [`Model::set_precision`].
    pub fn precision(&self) -> Precision {
        self.embed.precision
    }

    pub fn set_precision(&mut self, p: Precision) {
        self.embed.precision = p;
        self.lm_head.precision = p;
        for l in &mut self.layers {
            for lin in [
                &mut l.attn.q_proj,
                &mut l.attn.k_proj,
                &mut l.attn.v_proj,
                &mut l.attn.o_proj,
                &mut l.mlp.gate,
                &mut l.mlp.up,
                &mut l.mlp.down,
            ] {
                lin.precision = p;
            }
        }
    }

    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let c = &self.config;
        KvCache::new(c.n_layers, capacity, c.n_kv_heads, c.head_dim)
    }

    pub fn new_workspace(&self, t_max: usize) -> Workspace {
        Workspace::new(&self.config, t_max)
    }

    /// Runs `tokens` (at most `ws.t_max`) at positions `cache.len..`, appends them to the
    /// cache and leaves the requested logits in `ws.logits`. With `hidden`, pushes the
    /// hidden states as transformers reports them: the embedding output, each layer's
    /// output but the last, and the final norm's output ([L+1] × [t, hidden]).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        ws: &mut Workspace,
        logits: Logits,
        hidden: Option<&mut Vec<f32>>,
    ) -> Result<(), ModelError> {
        crate::exec::pool().install(|| self.forward_in_pool(tokens, cache, ws, logits, hidden))
    }

    fn forward_in_pool(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        ws: &mut Workspace,
        logits: Logits,
        mut hidden: Option<&mut Vec<f32>>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let t = tokens.len();
        assert!(
            t <= ws.t_max,
            "forward of {t} tokens with a workspace for {}",
            ws.t_max
        );
        let pos0 = cache.len;
        if pos0 + t > cache.capacity {
            return Err(ModelError::ContextFull {
                needed: pos0 + t,
                capacity: cache.capacity,
            });
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab: c.vocab });
        }
        let h = c.hidden;
        let x = &mut ws.x[..t * h];

        // Embedding (Gemma scales it by √hidden).
        for (i, &id) in tokens.iter().enumerate() {
            let row = &mut x[i * h..(i + 1) * h];
            self.embed.row(id as usize, row);
            if let Some(m) = c.embed_multiplier {
                row.iter_mut().for_each(|v| *v *= m);
            }
        }
        if let Some(hs) = hidden.as_deref_mut() {
            hs.extend_from_slice(x);
        }

        // Decoder layers.
        for (i, layer) in self.layers.iter().enumerate() {
            layer.forward(x, t, pos0, &mut cache.layers[i], &mut ws.layer);
            if i + 1 < self.layers.len() {
                if let Some(hs) = hidden.as_deref_mut() {
                    hs.extend_from_slice(x);
                }
            }
        }
        cache.len = pos0 + t;

        // Final norm and LM head.
        let rows = match logits {
            Logits::None => {
                if let Some(hs) = hidden.as_deref_mut() {
                    let normed = &mut ws.layer.h[..t * h];
                    self.norm.forward(x, normed);
                    hs.extend_from_slice(normed);
                }
                return Ok(());
            }
            Logits::Last => t - 1..t,
            Logits::All => 0..t,
        };
        let normed = &mut ws.layer.h[..t * h];
        self.norm.forward(x, normed);
        if let Some(hs) = hidden {
            hs.extend_from_slice(normed);
        }
        let n = rows.len();
        if ws.logits.len() != n * c.vocab {
            ws.logits.resize(n * c.vocab, 0.0);
        }
        self.lm_head
            .forward(&normed[rows.start * h..rows.end * h], n, &mut ws.logits);
        if let Some(cap) = c.final_softcap {
            ws.logits
                .iter_mut()
                .for_each(|v| *v = (*v / cap).tanh() * cap);
        }
        Ok(())
    }
}
