//! What a calibration measures during forwards (`mask calibrate`): per layer, the
//! activation mass of every FFN neuron (`Σ |act(gate)·up|` over the tokens seen, the
//! input down_proj gets from it) and the importance of every attention head (`Σ ‖o_h‖₂`,
//! the norm of the head's output before o_proj).

use super::block::{DecoderLayer, FeedForward, LayerScratch, TokenMixer};

/// Accumulated statistics, one row per layer (empty for a MoE layer's FFN or a linear-
/// attention layer's heads).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Probe {
    pub ffn: Vec<Vec<f64>>,
    pub heads: Vec<Vec<f64>>,
    /// Tokens observed.
    pub tokens: u64,
}

impl Probe {
    pub fn new(layers: &[DecoderLayer]) -> Probe {
        Probe {
            ffn: layers
                .iter()
                .map(|l| match &l.ff {
                    FeedForward::Dense(m) => vec![0.0; m.intermediate()],
                    FeedForward::Moe(_) => Vec::new(),
                })
                .collect(),
            heads: layers
                .iter()
                .map(|l| match &l.mixer {
                    TokenMixer::Attention(a) => vec![0.0; a.cfg.n_heads],
                    TokenMixer::GatedDeltaNet(_) => Vec::new(),
                })
                .collect(),
            tokens: 0,
        }
    }

    /// Adds layer `i`'s last forward of `t` tokens (`live`: the neurons a mask left).
    pub fn observe(
        &mut self,
        i: usize,
        layer: &DecoderLayer,
        s: &LayerScratch,
        t: usize,
        live: Option<&[u32]>,
    ) {
        if i == 0 {
            self.tokens += t as u64;
        }
        if let FeedForward::Dense(m) = &layer.ff {
            let width = live.map_or(m.intermediate(), |l| l.len());
            let acts = s.mlp.acts(width * t);
            let mass = &mut self.ffn[i];
            for row in acts.chunks_exact(width.max(1)) {
                for (k, &a) in row.iter().enumerate() {
                    let j = live.map_or(k, |l| l[k] as usize);
                    mass[j] += f64::from(a.abs());
                }
            }
        }
        if let TokenMixer::Attention(a) = &layer.mixer {
            let (nq, hd) = (a.cfg.n_heads, a.cfg.head_dim);
            let out = s.attn.heads_out(t * nq * hd);
            let imp = &mut self.heads[i];
            for row in out.chunks_exact(nq * hd) {
                for (h, o) in row.chunks_exact(hd).enumerate() {
                    imp[h] += f64::from(o.iter().map(|v| v * v).sum::<f32>().sqrt());
                }
            }
        }
    }
}
