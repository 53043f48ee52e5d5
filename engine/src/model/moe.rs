//! Mixture-of-Experts feed-forward (§2.2), as transformers' Qwen2-MoE / Qwen3-MoE /
//! Qwen3.5-MoE compute it: softmax over all router logits → top-k (ties to the lower
//! index, torch.topk's order) → renormalised over the k when `norm_topk_prob` →
//! `Σ wₑ·FFNₑ(x)`; the shared expert, when present, is added with weight
//! `σ(shared_expert_gate·x)`.
//!
//! Experts stay in the mmap, each in its own dtype; a token reads only its k experts'
//! pages. Experts are enumerated by presence (§11.1: a defragmented layer keeps a prefix
//! `experts.0 … experts.{n−1}`, and its router has exactly `n` rows); `top_k` shrinks to
//! the experts present.
//!
//! A forward of `t` tokens groups them by expert: one matrix-matrix product per expert
//! over the tokens routed to it, experts in index order. Each token's sum runs over its
//! experts in index order whatever `t` is, and a matrix product gives bit for bit the
//! values of separate matrix-vector products, so a batch and token-by-token decoding
//! agree exactly (speculative decoding relies on it).

use smallvec::SmallVec;

use super::config::Activation;
use super::linear::Linear;
use super::mlp::{activate, Mlp, MlpScratch};
use super::scope::Scope;
use super::ModelError;
use crate::quant::matrix::{self, MatvecJob};

/// What the arch says of a layer's experts (`arch.moe`).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// The nominal number of experts (an upper bound on those present).
    pub num_experts: usize,
    pub top_k: usize,
    pub norm_topk_prob: bool,
}

#[derive(Clone, Debug)]
pub struct Moe {
    /// The layer's index (errors name it).
    pub layer: usize,
    /// `[experts, hidden]`.
    pub router: Linear,
    pub experts: Vec<Mlp>,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub shared: Option<Mlp>,
    /// `[1, hidden]`: the shared expert's weight is `σ(shared_expert_gate·x)`.
    pub shared_gate: Option<Linear>,
}

/// The experts each token of the last forward chose in one MoE layer, and their
/// weights (after renormalisation): token `i`'s are `experts[i·k..(i+1)·k]`, best first.
#[derive(Clone, Debug, Default)]
pub struct LayerRoutes {
    pub layer: usize,
    pub k: usize,
    pub tokens: usize,
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

impl LayerRoutes {
    pub fn new(layer: usize, k: usize, t_max: usize) -> LayerRoutes {
        LayerRoutes {
            layer,
            k,
            tokens: 0,
            experts: vec![0; k * t_max],
            weights: vec![0.0; k * t_max],
        }
    }

    /// Token `i`'s experts and weights.
    pub fn token(&self, i: usize) -> (&[u32], &[f32]) {
        let r = i * self.k..(i + 1) * self.k;
        (&self.experts[r.clone()], &self.weights[r])
    }
}

/// Buffers for one forward of up to `t_max` tokens, sized for the widest MoE layer.
#[derive(Debug)]
pub struct MoeScratch {
    logits: Vec<f32>,
    probs: Vec<f32>,
    /// Per expert, how many (token, slot) pairs chose it, then start offsets.
    counts: Vec<usize>,
    cursor: Vec<usize>,
    /// (token, weight) pairs grouped by expert.
    order: Vec<(u32, f32)>,
    xin: Vec<f32>,
    yout: Vec<f32>,
    gate: Vec<f32>,
    mlp: MlpScratch,
    /// One token's experts (and the shared expert) side by side: `[k + 1, widest]`
    /// gate and up outputs, `[k + 1, hidden]` down outputs.
    g1: Vec<f32>,
    u1: Vec<f32>,
    y1: Vec<f32>,
}

impl MoeScratch {
    pub fn new(experts: usize, top_k: usize, widest: usize, hidden: usize, t_max: usize) -> Self {
        MoeScratch {
            logits: vec![0.0; experts * t_max],
            probs: vec![0.0; experts],
            counts: vec![0; experts + 1],
            cursor: vec![0; experts],
            order: vec![(0, 0.0); top_k * t_max],
            xin: vec![0.0; hidden * t_max],
            yout: vec![0.0; hidden * t_max],
            gate: vec![0.0; t_max],
            mlp: MlpScratch::new(widest, t_max),
            g1: vec![0.0; (top_k + 1) * widest],
            u1: vec![0.0; (top_k + 1) * widest],
            y1: vec![0.0; (top_k + 1) * hidden],
        }
    }
}

impl Moe {
    /// Loads the router `gate`, the experts present (`experts.{e}.*`, a prefix of at most
    /// `cfg.num_experts`) and the shared expert from `s` (`model.layers.{i}.mlp`).
    pub fn load(
        s: &Scope,
        layer: usize,
        hidden: usize,
        cfg: &MoeConfig,
        act: Activation,
    ) -> Result<Moe, ModelError> {
        let mut experts = Vec::new();
        while experts.len() < cfg.num_experts
            && s.has(&format!("experts.{}.gate_proj.weight", experts.len()))
        {
            experts.push(Mlp::load(
                &s.pp(format!("experts.{}", experts.len())),
                hidden,
                act,
            )?);
        }
        if experts.is_empty() {
            return Err(ModelError::MissingTensor(
                s.name("experts.0.gate_proj.weight"),
            ));
        }
        if s.has(&format!("experts.{}.gate_proj.weight", experts.len())) {
            return Err(ModelError::Config {
                field: "moe.num_experts".into(),
                reason: format!("{} but layer {layer} has more experts", cfg.num_experts),
            });
        }
        let n = experts.len();
        let router = s.linear("gate", n, hidden, false).map_err(|e| match e {
            ModelError::Shape { name, reason } => ModelError::Shape {
                name,
                reason: format!("{reason} (the router has one row per expert present: {n})"),
            },
            e => e,
        })?;
        if cfg.top_k == 0 {
            return Err(ModelError::Config {
                field: "moe.top_k".into(),
                reason: "0 experts per token".into(),
            });
        }
        let shared = if s.has("shared_expert.gate_proj.weight") {
            Some(Mlp::load(&s.pp("shared_expert"), hidden, act)?)
        } else {
            None
        };
        let shared_gate = if shared.is_some() && s.has("shared_expert_gate.weight") {
            Some(s.linear("shared_expert_gate", 1, hidden, false)?)
        } else {
            None
        };
        Ok(Moe {
            layer,
            router,
            top_k: cfg.top_k.min(n),
            norm_topk_prob: cfg.norm_topk_prob,
            experts,
            shared,
            shared_gate,
        })
    }

    pub fn num_experts(&self) -> usize {
        self.experts.len()
    }

    /// The widest expert (or shared expert) of the layer.
    pub fn widest(&self) -> usize {
        self.experts
            .iter()
            .chain(self.shared.iter())
            .map(Mlp::intermediate)
            .max()
            .unwrap_or(0)
    }

    pub fn linears_mut(&mut self) -> impl Iterator<Item = &mut Linear> {
        std::iter::once(&mut self.router)
            .chain(self.experts.iter_mut().flat_map(|e| e.linears_mut()))
            .chain(self.shared.iter_mut().flat_map(|e| e.linears_mut()))
            .chain(self.shared_gate.iter_mut())
    }

    /// One token's feed-forward (`h`, `out` [hidden]) over its experts `chosen` (in
    /// expert order, with their weights): every expert's gate and up products (and the
    /// shared expert's, and its gate) in one parallel section, every down product in
    /// another, instead of two per expert. Bit for bit what the grouped path computes.
    fn forward_one(&self, h: &[f32], chosen: &[(u32, f32)], s: &mut MoeScratch, out: &mut [f32]) {
        let hidden = h.len();
        let widest = s.g1.len() / (s.y1.len() / hidden);
        let mut mlps: SmallVec<[&Mlp; 17]> = chosen
            .iter()
            .map(|&(e, _)| &self.experts[e as usize])
            .collect();
        mlps.extend(self.shared.iter());
        let precision = self.router.precision;
        {
            let mut jobs: SmallVec<[MatvecJob; 36]> = SmallVec::new();
            let mut gs = s.g1.chunks_exact_mut(widest);
            let mut us = s.u1.chunks_exact_mut(widest);
            for m in &mlps {
                let n = m.intermediate();
                for (l, y) in [(&m.gate, gs.next()), (&m.up, us.next())] {
                    jobs.push(MatvecJob {
                        m: &l.m,
                        bytes: l.bytes(),
                        x: h,
                        y: &mut y.expect("a buffer per expert")[..n],
                    });
                }
            }
            if let Some(g) = &self.shared_gate {
                jobs.push(MatvecJob {
                    m: &g.m,
                    bytes: g.bytes(),
                    x: h,
                    y: &mut s.gate[..1],
                });
            }
            matrix::matvec_each(&mut jobs, precision);
        }
        for (i, m) in mlps.iter().enumerate() {
            let n = m.intermediate();
            let (g, u) = (
                &mut s.g1[i * widest..i * widest + n],
                &mut s.u1[i * widest..i * widest + n],
            );
            m.gate.add_bias_to(g);
            m.up.add_bias_to(u);
            for (gv, &uv) in g.iter_mut().zip(u.iter()) {
                *gv = activate(m.act, *gv) * uv;
            }
        }
        {
            let mut jobs: SmallVec<[MatvecJob; 17]> = SmallVec::new();
            let mut ys = s.y1.chunks_exact_mut(hidden);
            for (i, m) in mlps.iter().enumerate() {
                jobs.push(MatvecJob {
                    m: &m.down.m,
                    bytes: m.down.bytes(),
                    x: &s.g1[i * widest..i * widest + m.intermediate()],
                    y: ys.next().expect("a buffer per expert"),
                });
            }
            matrix::matvec_each(&mut jobs, precision);
        }
        out[..hidden].fill(0.0);
        for (i, &(_, w)) in chosen.iter().enumerate() {
            let y = &mut s.y1[i * hidden..(i + 1) * hidden];
            mlps[i].down.add_bias_to(y);
            for (o, &v) in out.iter_mut().zip(y.iter()) {
                *o += w * v;
            }
        }
        if self.shared.is_some() {
            let i = chosen.len();
            let y = &mut s.y1[i * hidden..(i + 1) * hidden];
            mlps[i].down.add_bias_to(y);
            let gate = match &self.shared_gate {
                Some(g) => {
                    let mut v = s.gate[0];
                    if let Some(b) = &g.bias {
                        v += b[0];
                    }
                    1.0 / (1.0 + (-v).exp())
                }
                None => 1.0,
            };
            for (o, &v) in out.iter_mut().zip(y.iter()) {
                *o += gate * v;
            }
        }
    }

    /// `h` [t, hidden] → `out` [t, hidden]; the choices go to `routes`.
    pub fn forward(
        &self,
        h: &[f32],
        t: usize,
        s: &mut MoeScratch,
        routes: &mut LayerRoutes,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let n = self.experts.len();
        let k = self.top_k;
        let hidden = self.router.in_dim();
        let logits = &mut s.logits[..t * n];
        self.router.forward(h, t, logits);

        // Routing: softmax → top-k → renormalise.
        routes.layer = self.layer;
        routes.k = k;
        routes.tokens = t;
        let counts = &mut s.counts[..n + 1];
        counts.fill(0);
        for i in 0..t {
            let l = &logits[i * n..(i + 1) * n];
            if let Some(e) = l.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::Numeric(format!(
                    "layer {}: router logit of expert {e} is {} at token {i}",
                    self.layer, l[e]
                )));
            }
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let p = &mut s.probs[..n];
            let mut sum = 0.0f32;
            for (pv, &lv) in p.iter_mut().zip(l) {
                *pv = (lv - max).exp();
                sum += *pv;
            }
            p.iter_mut().for_each(|v| *v /= sum);
            let ex = &mut routes.experts[i * k..(i + 1) * k];
            let wt = &mut routes.weights[i * k..(i + 1) * k];
            for slot in 0..k {
                // The largest not yet taken; ties go to the lower index.
                let mut best = usize::MAX;
                for (e, &pv) in p.iter().enumerate() {
                    if pv >= 0.0 && (best == usize::MAX || pv > p[best]) {
                        best = e;
                    }
                }
                ex[slot] = best as u32;
                wt[slot] = p[best];
                p[best] = -1.0;
                counts[best + 1] += 1;
            }
            if self.norm_topk_prob {
                let total: f32 = wt.iter().sum();
                wt.iter_mut().for_each(|w| *w /= total);
            }
        }
        // Group (token, weight) by expert: counts become start offsets.
        for e in 0..n {
            counts[e + 1] += counts[e];
        }
        let order = &mut s.order[..t * k];
        let cursor = &mut s.cursor[..n];
        cursor.copy_from_slice(&counts[..n]);
        for i in 0..t {
            let (ex, wt) = routes.token(i);
            for (&e, &w) in ex.iter().zip(wt) {
                let at = &mut cursor[e as usize];
                order[*at] = (i as u32, w);
                *at += 1;
            }
        }

        if t == 1 {
            // The token's experts in index order, as the grouped path sums them.
            let (ex, wt) = routes.token(0);
            let mut chosen: SmallVec<[(u32, f32); 16]> =
                ex.iter().copied().zip(wt.iter().copied()).collect();
            chosen.sort_unstable_by_key(|&(e, _)| e);
            self.forward_one(h, &chosen, s, out);
            return Ok(());
        }
        // One product per expert over its tokens, accumulated in expert order.
        out[..t * hidden].fill(0.0);
        for (e, expert) in self.experts.iter().enumerate() {
            let group = &order[counts[e]..counts[e + 1]];
            if group.is_empty() {
                continue;
            }
            let m = group.len();
            for (r, &(tok, _)) in group.iter().enumerate() {
                let tok = tok as usize;
                s.xin[r * hidden..(r + 1) * hidden]
                    .copy_from_slice(&h[tok * hidden..(tok + 1) * hidden]);
            }
            let (xin, yout) = (&s.xin[..m * hidden], &mut s.yout[..m * hidden]);
            expert.forward(xin, m, &mut s.mlp, yout);
            for (r, &(tok, w)) in group.iter().enumerate() {
                let tok = tok as usize;
                for (o, &y) in out[tok * hidden..(tok + 1) * hidden]
                    .iter_mut()
                    .zip(&yout[r * hidden..(r + 1) * hidden])
                {
                    *o += w * y;
                }
            }
        }
        if let Some(shared) = &self.shared {
            let yout = &mut s.yout[..t * hidden];
            shared.forward(h, t, &mut s.mlp, yout);
            let gate = &mut s.gate[..t];
            match &self.shared_gate {
                Some(g) => {
                    g.forward(h, t, gate);
                    gate.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp()));
                }
                None => gate.fill(1.0),
            }
            for i in 0..t {
                for (o, &y) in out[i * hidden..(i + 1) * hidden]
                    .iter_mut()
                    .zip(&yout[i * hidden..(i + 1) * hidden])
                {
                    *o += gate[i] * y;
                }
            }
        }
        Ok(())
    }
}
