//! The multi-token-prediction head (§2.1, DeepSeek / Qwen style): from the main model's
//! final-normed hidden state `h_p` at position `p` and the next token `t_{p+1}`, a draft
//! of `t_{p+2}`:
//!
//! `x = eh_proj·[enorm(embed(t_{p+1})); hnorm(h_p)]` (the embedding first) → the head's
//! own transformer layers (`model.mtp.layers.{i}`, with their own KV cache, at position
//! `p`) → `model.mtp.norm` → the shared LM head.
//!
//! `h_p` is the hidden state the LM head reads (after the final norm), as vLLM feeds its
//! MTP heads.

use super::block::DecoderLayer;
use super::config::{LayerKind, ModelConfig};
use super::linear::Linear;
use super::norm::RmsNorm;
use super::scope::Scope;
use super::state::ModelState;
use super::{Model, ModelError, Workspace};

#[derive(Clone, Debug)]
pub struct MtpHead {
    pub enorm: RmsNorm,
    pub hnorm: RmsNorm,
    /// `[hidden, 2·hidden]`.
    pub eh_proj: Linear,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
}

/// Buffers for one head forward of up to `t_max` rows.
#[derive(Debug)]
pub struct MtpScratch {
    pub ws: Workspace,
    cat: Vec<f32>,
    row: Vec<f32>,
}

impl MtpHead {
    /// The head under `model.mtp`, if the file has one (by the presence of `eh_proj`);
    /// its layers are as many as `model.mtp.layers.{i}` present.
    pub fn load(root: &Scope, c: &ModelConfig) -> Result<Option<MtpHead>, ModelError> {
        let s = root.pp("model.mtp");
        if !s.has("eh_proj.weight") {
            return Ok(None);
        }
        let h = c.hidden;
        let mut layers = Vec::new();
        while s.has(&format!("layers.{}.input_layernorm.weight", layers.len())) {
            let i = layers.len();
            layers.push(DecoderLayer::load(
                &s.pp(format!("layers.{i}")),
                i,
                LayerKind::FullAttention,
                c,
            )?);
        }
        if layers.is_empty() {
            return Err(ModelError::MissingTensor(
                s.name("layers.0.input_layernorm.weight"),
            ));
        }
        Ok(Some(MtpHead {
            enorm: s.norm("enorm", h)?,
            hnorm: s.norm("hnorm", h)?,
            eh_proj: s.linear("eh_proj", h, 2 * h, false)?,
            layers,
            norm: s.norm("norm", h)?,
        }))
    }

    /// The head's own state (KV of its layers) for `capacity` positions.
    pub fn new_state(&self, capacity: usize) -> ModelState {
        ModelState::new(
            self.layers.iter().map(|l| l.new_state(capacity)).collect(),
            capacity,
        )
    }

    pub fn new_scratch(&self, c: &ModelConfig, t_max: usize) -> MtpScratch {
        MtpScratch {
            ws: Workspace::for_layers(c, &self.layers, t_max),
            cat: vec![0.0; t_max.max(1) * 2 * c.hidden],
            row: vec![0.0; c.hidden],
        }
    }

    /// Rows `p = state.len ..` of the head: `next[i]` is `t_{p+1}` and `hidden` row `i`
    /// is `h_p` ([t, hidden]). Leaves the last row's draft logits in `s.ws.logits`.
    pub fn forward(
        &self,
        model: &Model,
        next: &[u32],
        hidden: &[f32],
        state: &mut ModelState,
        s: &mut MtpScratch,
    ) -> Result<(), ModelError> {
        crate::exec::step(|| self.forward_in_pool(model, next, hidden, state, s))
    }

    fn forward_in_pool(
        &self,
        model: &Model,
        next: &[u32],
        hidden: &[f32],
        state: &mut ModelState,
        s: &mut MtpScratch,
    ) -> Result<(), ModelError> {
        let c = &model.config;
        let (t, h) = (next.len(), c.hidden);
        assert!(t >= 1 && t <= s.ws.t_max, "an MTP forward of {t} rows");
        let pos0 = state.len;
        if pos0 + t > state.capacity {
            return Err(ModelError::ContextFull {
                needed: pos0 + t,
                capacity: state.capacity,
            });
        }
        if let Some(&id) = next.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab: c.vocab });
        }
        for (i, &id) in next.iter().enumerate() {
            let cat = &mut s.cat[i * 2 * h..(i + 1) * 2 * h];
            model.embed_token(id, &mut s.row);
            let (e, hn) = cat.split_at_mut(h);
            self.enorm.forward(&s.row, e);
            self.hnorm.forward(&hidden[i * h..(i + 1) * h], hn);
        }
        let ws = &mut s.ws;
        let x = &mut ws.x[..t * h];
        self.eh_proj.forward(&s.cat[..t * 2 * h], t, x);
        for (i, layer) in self.layers.iter().enumerate() {
            let r = layer.forward(
                x,
                t,
                pos0,
                &mut state.layers[i],
                &mut ws.layer,
                &mut ws.routes[i],
                ws.form,
                super::select::LayerSel::default(),
            );
            if let Err(e) = r {
                state.truncate(0);
                return Err(e);
            }
        }
        state.len = pos0 + t;
        let last = &x[(t - 1) * h..t * h];
        let normed = &mut ws.layer.h[..h];
        self.norm.forward(last, normed);
        model.logits_of(normed, &mut ws.logits);
        Ok(())
    }
}
