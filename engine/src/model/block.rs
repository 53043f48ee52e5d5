//! One decoder layer: a token mixer ([`TokenMixer`]: softmax attention or Gated DeltaNet)
//! and a feed-forward ([`FeedForward`]: dense or MoE), each pre-normed, with residuals.
//! Which blocks a layer has is decided by the tensors present (§2): `linear_attn.*` makes a
//! Gated DeltaNet layer, a router `mlp.gate` a MoE layer (per layer, as Qwen2-MoE's
//! `mlp_only_layers` mixes them). Gemma's sandwich norms are chosen the same way: with
//! `pre_feedforward_layernorm`, `post_attention_layernorm` normalises the mixer's output
//! (and `post_feedforward_layernorm` the feed-forward's); without it,
//! `post_attention_layernorm` is the feed-forward's input norm (llama, qwen).

use super::attention::{Attention, AttentionScratch};
use super::config::{LayerKind, ModelConfig};
use super::gated_deltanet::{Form, GatedDeltaNet, GdnScratch};
use super::linear::Linear;
use super::mlp::{Mlp, MlpScratch};
use super::moe::{LayerRoutes, Moe, MoeScratch};
use super::norm::RmsNorm;
use super::scope::Scope;
use super::select::LayerSel;
use super::state::{LayerKv, LayerState};
use super::ModelError;

// One per layer, built once: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum TokenMixer {
    Attention(Attention),
    GatedDeltaNet(GatedDeltaNet),
}

// One per layer, built once: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum FeedForward {
    Dense(Mlp),
    Moe(Moe),
}

#[derive(Clone, Debug)]
pub struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub mixer: TokenMixer,
    /// Gemma: normalises the mixer output before the residual add.
    pub post_attn_norm: Option<RmsNorm>,
    pub pre_mlp_norm: RmsNorm,
    pub ff: FeedForward,
    /// Gemma: normalises the feed-forward output before the residual add.
    pub post_mlp_norm: Option<RmsNorm>,
}

/// Every buffer a layer's forward needs, sized for the widest layer of the model.
#[derive(Debug)]
pub struct LayerScratch {
    pub h: Vec<f32>,
    pub o: Vec<f32>,
    pub attn: AttentionScratch,
    pub gdn: Option<GdnScratch>,
    pub mlp: MlpScratch,
    pub moe: Option<MoeScratch>,
}

impl DecoderLayer {
    /// Layer `i` from `s` (`model.layers.{i}`); `kind` is the arch's layer type (sliding
    /// or not; a linear-attention type with no `linear_attn` tensors is an error).
    pub fn load(
        s: &Scope,
        i: usize,
        kind: LayerKind,
        c: &ModelConfig,
    ) -> Result<DecoderLayer, ModelError> {
        let h = c.hidden;
        let mixer = if s.has("linear_attn.in_proj_qkv.weight") {
            TokenMixer::GatedDeltaNet(GatedDeltaNet::load(
                &s.pp("linear_attn"),
                h,
                c.linear_key_heads,
                c.linear_key_head_dim,
                c.eps,
            )?)
        } else if kind == LayerKind::LinearAttention {
            return Err(ModelError::MissingTensor(
                s.name("linear_attn.in_proj_qkv.weight"),
            ));
        } else {
            TokenMixer::Attention(Attention::load(&s.pp("self_attn"), c, kind)?)
        };
        let ff = if s.has("mlp.gate.weight") {
            let cfg = c.moe.as_ref().ok_or_else(|| ModelError::Config {
                field: "moe".into(),
                reason: format!("layer {i} has a router (mlp.gate) but the arch has no moe"),
            })?;
            FeedForward::Moe(Moe::load(&s.pp("mlp"), i, h, cfg, c.activation)?)
        } else {
            FeedForward::Dense(Mlp::load(&s.pp("mlp"), h, c.activation)?)
        };
        let sandwich = s.has("pre_feedforward_layernorm.weight");
        Ok(DecoderLayer {
            input_norm: s.norm("input_layernorm", h)?,
            mixer,
            post_attn_norm: if sandwich {
                Some(s.norm("post_attention_layernorm", h)?)
            } else {
                None
            },
            pre_mlp_norm: s.norm(
                if sandwich {
                    "pre_feedforward_layernorm"
                } else {
                    "post_attention_layernorm"
                },
                h,
            )?,
            ff,
            post_mlp_norm: s.norm_opt("post_feedforward_layernorm", h)?,
        })
    }

    /// This layer's state for a context of `capacity` positions.
    pub fn new_state(&self, capacity: usize) -> LayerState {
        match &self.mixer {
            TokenMixer::Attention(a) => {
                LayerState::Kv(LayerKv::new(capacity, a.cfg.n_kv_heads, a.cfg.head_dim))
            }
            TokenMixer::GatedDeltaNet(g) => LayerState::Recurrent(g.new_state()),
        }
    }

    /// The feed-forward's widest product (a MoE layer's widest expert).
    pub fn ff_width(&self) -> usize {
        match &self.ff {
            FeedForward::Dense(m) => m.intermediate(),
            FeedForward::Moe(m) => m.widest(),
        }
    }

    pub fn is_linear_attention(&self) -> bool {
        matches!(self.mixer, TokenMixer::GatedDeltaNet(_))
    }

    pub fn moe(&self) -> Option<&Moe> {
        match &self.ff {
            FeedForward::Moe(m) => Some(m),
            FeedForward::Dense(_) => None,
        }
    }

    /// Every weight matrix of the layer.
    pub fn linears(&self) -> Vec<&Linear> {
        let mut v: Vec<&Linear> = match &self.mixer {
            TokenMixer::Attention(a) => vec![&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj],
            TokenMixer::GatedDeltaNet(g) => {
                vec![&g.in_qkv, &g.in_z, &g.in_b, &g.in_a, &g.out_proj]
            }
        };
        match &self.ff {
            FeedForward::Dense(m) => v.extend([&m.gate, &m.up, &m.down]),
            FeedForward::Moe(m) => {
                v.push(&m.router);
                for e in m.experts.iter().chain(m.shared.iter()) {
                    v.extend([&e.gate, &e.up, &e.down]);
                }
                v.extend(m.shared_gate.iter());
            }
        }
        v
    }

    /// Every weight matrix of the layer (precision and skills apply to all of them).
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v: Vec<&mut Linear> = match &mut self.mixer {
            TokenMixer::Attention(a) => a.linears_mut().into_iter().collect(),
            TokenMixer::GatedDeltaNet(g) => g.linears_mut().into_iter().collect(),
        };
        match &mut self.ff {
            FeedForward::Dense(m) => v.extend(m.linears_mut()),
            FeedForward::Moe(m) => v.extend(m.linears_mut()),
        }
        v
    }

    /// `x` [t, hidden], the residual stream, updated in place; `state` advances by `t`
    /// positions from `pos0`; a MoE layer's choices go to `routes`. `sel` is the task
    /// mask's part for this layer and the skill whose weights it reads.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        x: &mut [f32],
        t: usize,
        pos0: usize,
        state: &mut LayerState,
        s: &mut LayerScratch,
        routes: &mut LayerRoutes,
        form: Form,
        sel: LayerSel,
    ) -> Result<(), ModelError> {
        let n = x.len();
        let (h, o) = (&mut s.h[..n], &mut s.o[..n]);
        self.input_norm.forward(x, h);
        let sk = sel.skill;
        match &self.mixer {
            TokenMixer::Attention(a) => {
                a.forward(h, t, pos0, state.kv(), &mut s.attn, o, sk, sel.heads())
            }
            TokenMixer::GatedDeltaNet(g) => {
                let scratch = s
                    .gdn
                    .as_mut()
                    .expect("the workspace has Gated DeltaNet buffers");
                g.forward(h, t, state.recurrent(), scratch, o, form, sk)
            }
        }
        if let Some(norm) = &self.post_attn_norm {
            norm.forward_inplace(o);
        }
        add(x, o);
        self.pre_mlp_norm.forward(x, h);
        match &self.ff {
            FeedForward::Dense(m) => m.forward(h, t, &mut s.mlp, o, sk, sel.ffn()),
            FeedForward::Moe(m) => {
                let scratch = s.moe.as_mut().expect("the workspace has MoE buffers");
                m.forward(h, t, scratch, routes, o, sk, sel.experts())?
            }
        }
        if let Some(norm) = &self.post_mlp_norm {
            norm.forward_inplace(o);
        }
        add(x, o);
        Ok(())
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
