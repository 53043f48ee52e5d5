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
use super::linear::{Linear, SkillSel};
use super::mlp::Mlp;
use super::scope::Scope;
use super::ModelError;
use crate::quant::matrix::{self, MatmulJob};

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

/// An unused routing slot: a task mask left fewer routable experts than `top_k`.
pub const NO_EXPERT: u32 = u32::MAX;

/// The experts each token of the last forward chose in one MoE layer, and their
/// weights (after renormalisation): token `i`'s are `experts[i·k..(i+1)·k]`, best first;
/// slots a task mask leaves unused hold [`NO_EXPERT`] with weight 0.
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
    /// The routed rows in `order`'s order: inputs `[t·k, hidden]`, gate and up outputs
    /// `[t·k, widest]` (each expert's block `[n_e, width_e]` at its group's start),
    /// down outputs `[t·k, hidden]`.
    xin: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    y: Vec<f32>,
    /// The shared expert's: `[t, width]` gate and up, `[t, hidden]` down, `[t]` gate.
    sg: Vec<f32>,
    su: Vec<f32>,
    sy: Vec<f32>,
    gate: Vec<f32>,
}

impl MoeScratch {
    pub fn new(experts: usize, top_k: usize, widest: usize, hidden: usize, t_max: usize) -> Self {
        let rows = top_k * t_max;
        MoeScratch {
            logits: vec![0.0; experts * t_max],
            probs: vec![0.0; experts],
            counts: vec![0; experts + 1],
            cursor: vec![0; experts],
            order: vec![(0, 0.0); rows],
            xin: vec![0.0; rows * hidden],
            g: vec![0.0; rows * widest],
            u: vec![0.0; rows * widest],
            y: vec![0.0; rows * hidden],
            sg: vec![0.0; t_max * widest],
            su: vec![0.0; t_max * widest],
            sy: vec![0.0; t_max * hidden],
            gate: vec![0.0; t_max],
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

    /// The experts' products for the routed rows: `order` holds (token, weight) pairs
    /// grouped by expert, expert `e`'s at `counts[e]..counts[e + 1]`. Every expert's gate
    /// and up products (and the shared expert's, and its gate) run in one parallel
    /// section, every down product in another, instead of two sections per expert; each
    /// product is what `matmul_with` gives over that expert's rows, and each token sums
    /// its experts in index order, whatever `t` is.
    #[allow(clippy::too_many_arguments)]
    fn experts_forward(
        &self,
        h: &[f32],
        t: usize,
        order: &[(u32, f32)],
        counts: &[usize],
        s: &mut MoeScratch,
        out: &mut [f32],
        sel: SkillSel,
    ) {
        let hidden = self.router.in_dim();
        let rows = order.len();
        let widest = s.g.len() / (s.xin.len() / hidden).max(1);
        let precision = self.router.precision;
        // A prefill's experts read their tokens gathered; a decode step's all read its one
        // token, `h` itself, so that their products see one input and quantize it once
        // (`matrix::matmul_each`).
        let gathered = t > 1;
        if gathered {
            for (r, &(tok, _)) in order.iter().enumerate() {
                let tok = tok as usize;
                s.xin[r * hidden..(r + 1) * hidden]
                    .copy_from_slice(&h[tok * hidden..(tok + 1) * hidden]);
            }
        }
        // Gate and up: every expert with rows, the shared expert and its gate.
        {
            let mut jobs: SmallVec<[MatmulJob; 96]> = SmallVec::new();
            let (mut g_rest, mut u_rest) = (&mut s.g[..rows * widest], &mut s.u[..rows * widest]);
            let mut taken = 0;
            for (e, m) in self.experts.iter().enumerate() {
                let (r0, n) = (counts[e], counts[e + 1] - counts[e]);
                if n == 0 {
                    continue;
                }
                // Each group's block starts at its first row's offset.
                let skip = r0 * widest - taken;
                let (_, g) = std::mem::take(&mut g_rest).split_at_mut(skip);
                let (_, u) = std::mem::take(&mut u_rest).split_at_mut(skip);
                let (g, g_next) = g.split_at_mut(n * widest);
                let (u, u_next) = u.split_at_mut(n * widest);
                g_rest = g_next;
                u_rest = u_next;
                taken = (r0 + n) * widest;
                let w = m.intermediate();
                let x = if gathered {
                    &s.xin[r0 * hidden..(r0 + n) * hidden]
                } else {
                    &h[..hidden]
                };
                for (l, y) in [(&m.gate, g), (&m.up, u)] {
                    let v = l.view(sel);
                    jobs.push(MatmulJob {
                        m: v.m,
                        bytes: v.bytes,
                        x,
                        t: n,
                        y: &mut y[..n * w],
                    });
                }
            }
            if let Some(m) = &self.shared {
                let w = m.intermediate();
                let (gv, uv) = (m.gate.view(sel), m.up.view(sel));
                jobs.push(MatmulJob {
                    m: gv.m,
                    bytes: gv.bytes,
                    x: h,
                    t,
                    y: &mut s.sg[..t * w],
                });
                jobs.push(MatmulJob {
                    m: uv.m,
                    bytes: uv.bytes,
                    x: h,
                    t,
                    y: &mut s.su[..t * w],
                });
                if let Some(g) = &self.shared_gate {
                    let g = g.view(sel);
                    jobs.push(MatmulJob {
                        m: g.m,
                        bytes: g.bytes,
                        x: h,
                        t,
                        y: &mut s.gate[..t],
                    });
                }
            }
            matrix::matmul_each(&mut jobs, precision);
        }
        // Activations, in place of the gate outputs.
        let act = |m: &Mlp, g: &mut [f32], u: &mut [f32]| {
            m.gate.view(sel).add_bias_to(g);
            m.up.view(sel).add_bias_to(u);
            m.gated(g, u);
        };
        for (e, m) in self.experts.iter().enumerate() {
            let (r0, n) = (counts[e], counts[e + 1] - counts[e]);
            if n > 0 {
                let span = r0 * widest..r0 * widest + n * m.intermediate();
                act(m, &mut s.g[span.clone()], &mut s.u[span]);
            }
        }
        if let Some(m) = &self.shared {
            let w = m.intermediate();
            act(m, &mut s.sg[..t * w], &mut s.su[..t * w]);
        }
        // Down.
        {
            let mut jobs: SmallVec<[MatmulJob; 64]> = SmallVec::new();
            let mut y_rest = &mut s.y[..rows * hidden];
            for (e, m) in self.experts.iter().enumerate() {
                let (r0, n) = (counts[e], counts[e + 1] - counts[e]);
                if n == 0 {
                    continue;
                }
                let (y, rest) = std::mem::take(&mut y_rest).split_at_mut(n * hidden);
                y_rest = rest;
                let d = m.down.view(sel);
                jobs.push(MatmulJob {
                    m: d.m,
                    bytes: d.bytes,
                    x: &s.g[r0 * widest..r0 * widest + n * m.intermediate()],
                    t: n,
                    y,
                });
            }
            if let Some(m) = &self.shared {
                let d = m.down.view(sel);
                jobs.push(MatmulJob {
                    m: d.m,
                    bytes: d.bytes,
                    x: &s.sg[..t * m.intermediate()],
                    t,
                    y: &mut s.sy[..t * hidden],
                });
            }
            matrix::matmul_each(&mut jobs, precision);
        }
        // Σ wₑ·FFNₑ(x) per token, experts in index order, then the shared expert.
        out[..t * hidden].fill(0.0);
        for (e, m) in self.experts.iter().enumerate() {
            for (r, &(tok, w)) in order.iter().enumerate().take(counts[e + 1]).skip(counts[e]) {
                let y = &mut s.y[r * hidden..(r + 1) * hidden];
                m.down.view(sel).add_bias_to(y);
                let tok = tok as usize;
                for (o, &v) in out[tok * hidden..(tok + 1) * hidden]
                    .iter_mut()
                    .zip(y.iter())
                {
                    *o += w * v;
                }
            }
        }
        if let Some(m) = &self.shared {
            let sy = &mut s.sy[..t * hidden];
            m.down.view(sel).add_bias_to(sy);
            let gate = &mut s.gate[..t];
            match &self.shared_gate {
                Some(g) => {
                    g.view(sel).add_bias_to(gate);
                    gate.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp()));
                }
                None => gate.fill(1.0),
            }
            for i in 0..t {
                for (o, &v) in out[i * hidden..(i + 1) * hidden]
                    .iter_mut()
                    .zip(&sy[i * hidden..(i + 1) * hidden])
                {
                    *o += gate[i] * v;
                }
            }
        }
    }

    /// `h` [t, hidden] → `out` [t, hidden]; the choices go to `routes`. With `routable`
    /// (a task mask's expert field, one flag per expert present), only those experts can
    /// be chosen: the softmax runs over them alone (the masked experts' mass is
    /// renormalised away, whatever `norm_topk_prob` says, §5), and `top_k` shrinks to
    /// their number.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        h: &[f32],
        t: usize,
        s: &mut MoeScratch,
        routes: &mut LayerRoutes,
        out: &mut [f32],
        sel: SkillSel,
        routable: Option<&[bool]>,
    ) -> Result<(), ModelError> {
        let n = self.experts.len();
        let open = |e: usize| routable.is_none_or(|r| r[e]);
        let k = self.top_k.min((0..n).filter(|&e| open(e)).count());
        if k == 0 {
            return Err(ModelError::Task(format!(
                "the task routes no expert of layer {}",
                self.layer
            )));
        }
        let logits = &mut s.logits[..t * n];
        self.router.view(sel).forward(h, t, logits);

        // Routing: softmax over the routable experts → top-k → renormalise.
        let slots = self.top_k;
        routes.layer = self.layer;
        routes.k = slots;
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
            let max = (0..n)
                .filter(|&e| open(e))
                .map(|e| l[e])
                .fold(f32::NEG_INFINITY, f32::max);
            let p = &mut s.probs[..n];
            let mut sum = 0.0f32;
            for (e, (pv, &lv)) in p.iter_mut().zip(l).enumerate() {
                if open(e) {
                    *pv = (lv - max).exp();
                    sum += *pv;
                } else {
                    *pv = -1.0; // never taken
                }
            }
            p.iter_mut().filter(|v| **v >= 0.0).for_each(|v| *v /= sum);
            let ex = &mut routes.experts[i * slots..(i + 1) * slots];
            let wt = &mut routes.weights[i * slots..(i + 1) * slots];
            ex[k..].fill(NO_EXPERT);
            wt[k..].fill(0.0);
            let (ex, wt) = (&mut ex[..k], &mut wt[..k]);
            top_k_into(p, ex, wt);
            for &e in ex.iter() {
                counts[e as usize + 1] += 1;
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
            for (&e, &w) in ex.iter().zip(wt).filter(|(&e, _)| e != NO_EXPERT) {
                let at = &mut cursor[e as usize];
                order[*at] = (i as u32, w);
                *at += 1;
            }
        }

        // Out of the scratch while its other buffers are written (no allocation: the
        // vectors move and come back).
        let (order, counts) = (std::mem::take(&mut s.order), std::mem::take(&mut s.counts));
        self.experts_forward(h, t, &order[..t * k], &counts[..n + 1], s, out, sel);
        (s.order, s.counts) = (order, counts);
        Ok(())
    }
}

/// The `ex.len()` largest of the probabilities `p` (negative: not routable) into `ex`
/// (their indices) and `wt` (their values), largest first, ties to the lower index: what
/// `ex.len()` passes of "take the largest left" give, in one pass over `p` (those passes
/// cost 4% of a MoE prefill at 128 experts). An entry displaces only smaller ones. At
/// least `ex.len()` entries of `p` must be routable.
fn top_k_into(p: &[f32], ex: &mut [u32], wt: &mut [f32]) {
    let k = ex.len();
    debug_assert_eq!(wt.len(), k);
    if k == 0 {
        return;
    }
    let mut len = 0;
    for (e, &pv) in p.iter().enumerate() {
        if pv < 0.0 || (len == k && pv <= wt[k - 1]) {
            continue;
        }
        let mut at = len.min(k - 1);
        while at > 0 && wt[at - 1] < pv {
            at -= 1;
        }
        for j in (at..len.min(k - 1)).rev() {
            wt[j + 1] = wt[j];
            ex[j + 1] = ex[j];
        }
        (wt[at], ex[at]) = (pv, e as u32);
        len = (len + 1).min(k);
    }
    debug_assert_eq!(len, k, "fewer routable experts than slots");
}

#[cfg(test)]
mod tests {
    use super::top_k_into;

    /// `k` passes of "take the largest left, ties to the lower index".
    fn by_passes(p: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
        let mut p = p.to_vec();
        let (mut ex, mut wt) = (Vec::new(), Vec::new());
        for _ in 0..k {
            let mut best = usize::MAX;
            for (e, &pv) in p.iter().enumerate() {
                if pv >= 0.0 && (best == usize::MAX || pv > p[best]) {
                    best = e;
                }
            }
            ex.push(best as u32);
            wt.push(p[best]);
            p[best] = -1.0;
        }
        (ex, wt)
    }

    #[test]
    fn one_pass_top_k_equals_repeated_largest() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for &n in &[1usize, 3, 7, 60, 128, 129] {
            for k in 1..=n.min(10) {
                for levels in [3u64, 50, 1 << 20] {
                    // Few levels force ties; a quarter of the experts not routable.
                    let p: Vec<f32> = (0..n)
                        .map(|_| match next() % 4 {
                            0 => -1.0,
                            _ => (next() % levels) as f32 / levels as f32,
                        })
                        .collect();
                    if p.iter().filter(|v| **v >= 0.0).count() < k {
                        continue;
                    }
                    let (mut ex, mut wt) = (vec![0u32; k], vec![0f32; k]);
                    top_k_into(&p, &mut ex, &mut wt);
                    assert_eq!((ex, wt), by_passes(&p, k), "n {n} k {k} levels {levels}");
                }
            }
        }
    }
}
