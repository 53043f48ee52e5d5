//! One decoder layer: pre-norm attention and MLP with residuals. Gemma's sandwich norms are
//! chosen by tensor presence: with `pre_feedforward_layernorm`, `post_attention_layernorm`
//! normalises the attention output (and `post_feedforward_layernorm` the MLP output);
//! without it, `post_attention_layernorm` is the MLP's input norm (llama, qwen).

use super::attention::{Attention, AttentionScratch};
use super::mlp::{Mlp, MlpScratch};
use super::norm::RmsNorm;
use crate::model::kv_cache::LayerKv;

#[derive(Clone, Debug)]
pub struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub attn: Attention,
    /// Gemma: normalises the attention output before the residual add.
    pub post_attn_norm: Option<RmsNorm>,
    pub pre_mlp_norm: RmsNorm,
    pub mlp: Mlp,
    /// Gemma: normalises the MLP output before the residual add.
    pub post_mlp_norm: Option<RmsNorm>,
}

#[derive(Debug)]
pub struct LayerScratch {
    pub h: Vec<f32>,
    pub o: Vec<f32>,
    pub attn: AttentionScratch,
    pub mlp: MlpScratch,
}

impl DecoderLayer {
    /// `x` [t, hidden], the residual stream, updated in place.
    pub fn forward(
        &self,
        x: &mut [f32],
        t: usize,
        pos0: usize,
        kv: &mut LayerKv,
        s: &mut LayerScratch,
    ) {
        let n = x.len();
        let (h, o) = (&mut s.h[..n], &mut s.o[..n]);
        self.input_norm.forward(x, h);
        self.attn.forward(h, t, pos0, kv, &mut s.attn, o);
        if let Some(norm) = &self.post_attn_norm {
            norm.forward_inplace(o);
        }
        add(x, o);
        self.pre_mlp_norm.forward(x, h);
        self.mlp.forward(h, t, &mut s.mlp, o);
        if let Some(norm) = &self.post_mlp_norm {
            norm.forward_inplace(o);
        }
        add(x, o);
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
