//! Softmax attention with grouped KV heads (GQA): optional q/k/v biases and per-head q/k
//! RMSNorm (by tensor presence), RoPE (partial rotary included), a sliding window,
//! Gemma 2's logit soft-capping, and Qwen3-Next / Qwen3.5's output gate: a `q_proj` of
//! twice the width carries, per head, the query then a gate, and the attention output is
//! multiplied by `σ(gate)` before `o_proj`.

use std::cell::RefCell;

use rayon::prelude::*;

use super::attend::{self, KEY_TILE};
use super::config::{self, LayerKind, ModelConfig};
use super::linear::{Linear, SkillSel};
use super::norm::RmsNorm;
use super::rope::Rope;
use super::scope::Scope;
use super::ModelError;
use crate::model::kv_cache::LayerKv;
use crate::quant::kernel::Kernel;

#[derive(Clone, Debug)]
pub struct AttentionConfig {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies q·k: `head_dim^-½` or `query_pre_attn_scalar^-½`.
    pub scale: f32,
    /// Keys older than this many positions are masked (sliding-window layers).
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

#[derive(Clone, Debug)]
pub struct Attention {
    pub cfg: AttentionConfig,
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub rope: Rope,
    /// `q_proj` holds `[q_h; gate_h]` per head (the output gate).
    pub output_gate: bool,
    /// SIMD level of the loops over the cache.
    pub kernel: Kernel,
}

/// Buffers for one forward of up to `t_max` tokens, allocated once per session.
#[derive(Debug)]
pub struct AttentionScratch {
    /// `q_proj`'s output when it carries the gate: [t, heads, 2·head_dim].
    qg: Vec<f32>,
    gate: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl AttentionScratch {
    /// The last forward's per-head outputs (o_proj's input), `[t, heads·head_dim]`.
    pub fn heads_out(&self, n: usize) -> &[f32] {
        &self.att[..n]
    }

    /// `gated`: some layer has the output gate.
    pub fn new(cfg: &AttentionConfig, t_max: usize, gated: bool) -> AttentionScratch {
        let q = t_max * cfg.n_heads * cfg.head_dim;
        let kv = t_max * cfg.n_kv_heads * cfg.head_dim;
        let g = if gated { q } else { 0 };
        AttentionScratch {
            qg: vec![0.0; 2 * g],
            gate: vec![0.0; g],
            q: vec![0.0; q],
            k: vec![0.0; kv],
            v: vec![0.0; kv],
            att: vec![0.0; q],
            cos: vec![0.0; cfg.head_dim],
            sin: vec![0.0; cfg.head_dim],
        }
    }
}

/// Most query heads per KV head that [`Attention::attend_group`] takes at once (more run
/// one by one).
const MAX_GROUP: usize = 8;

thread_local! {
    /// Attention scores of one token's query heads of a KV head, a row each; sized by
    /// [`reserve_scores`] for the context, so decoding allocates nothing.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Sizes every engine thread's score buffer for `positions`, so that decoding up to
/// that context never grows it (no allocation per token).
pub fn reserve_scores(positions: usize) {
    crate::exec::pool().broadcast(|_| {
        SCORES.with(|cell| {
            let mut s = cell.borrow_mut();
            // Whole tiles: a span starting inside one is read from its first position.
            // For a group of heads ([`Attention::attend_group`]), each its own row.
            let room = MAX_GROUP * (positions.next_multiple_of(KEY_TILE) + KEY_TILE);
            if s.len() < room {
                s.resize(room, 0.0);
            }
        })
    });
}

impl Attention {
    /// Loads `q_proj`, `k_proj`, `v_proj`, `o_proj` (biases and `q_norm` / `k_norm` when
    /// present) from `s` (`model.layers.{i}.self_attn`). A `q_proj` of `2·heads·head_dim`
    /// rows carries the output gate.
    pub fn load(s: &Scope, c: &ModelConfig, kind: LayerKind) -> Result<Attention, ModelError> {
        let (h, hd) = (c.hidden, c.head_dim);
        let sliding = kind == LayerKind::SlidingAttention;
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
        let q_rows = s.rows("q_proj.weight")?;
        let output_gate = q_rows == 2 * c.n_heads * hd;
        Ok(Attention {
            cfg: AttentionConfig {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                scale: (c.query_pre_attn_scalar.unwrap_or(hd as f64)).powf(-0.5) as f32,
                window: if sliding { c.sliding_window } else { None },
                softcap: c.attn_softcap,
            },
            q_proj: s.linear(
                "q_proj",
                if output_gate { q_rows } else { c.n_heads * hd },
                h,
                true,
            )?,
            k_proj: s.linear("k_proj", c.n_kv_heads * hd, h, true)?,
            v_proj: s.linear("v_proj", c.n_kv_heads * hd, h, true)?,
            o_proj: s.linear("o_proj", h, c.n_heads * hd, true)?,
            q_norm: s.norm_opt("q_norm", hd)?,
            k_norm: s.norm_opt("k_norm", hd)?,
            rope: Rope::new(theta, c.rotary_dim(), &scaling),
            output_gate,
            kernel: Kernel::detect(),
        })
    }

    /// The weight matrices (for precision and masks).
    pub fn linears_mut(&mut self) -> [&mut Linear; 4] {
        [
            &mut self.q_proj,
            &mut self.k_proj,
            &mut self.v_proj,
            &mut self.o_proj,
        ]
    }

    /// `h` [t, hidden] (normed input) at positions `pos0..pos0+t` → `out` [t, hidden].
    /// The new keys and values are appended to `kv` at those positions. Weights come from
    /// the source `sel` picks; with `heads`, a dead head (false) is not computed and
    /// contributes nothing (its `o_proj` input is zero).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        h: &[f32],
        t: usize,
        pos0: usize,
        kv: &mut LayerKv,
        s: &mut AttentionScratch,
        out: &mut [f32],
        sel: SkillSel,
        heads: Option<&[bool]>,
    ) {
        let c = &self.cfg;
        let (hd, nq, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
        let q = &mut s.q[..t * nq * hd];
        let k = &mut s.k[..t * nkv * hd];
        let v = &mut s.v[..t * nkv * hd];
        if self.output_gate {
            let qg = &mut s.qg[..2 * t * nq * hd];
            let lins = [&self.q_proj, &self.k_proj, &self.v_proj];
            Linear::forward_many(sel, lins, None, h, t, [qg, k, v]);
            for (j, pair) in s.qg[..2 * t * nq * hd].chunks_exact(2 * hd).enumerate() {
                q[j * hd..(j + 1) * hd].copy_from_slice(&pair[..hd]);
                s.gate[j * hd..(j + 1) * hd].copy_from_slice(&pair[hd..]);
            }
        } else {
            let lins = [&self.q_proj, &self.k_proj, &self.v_proj];
            Linear::forward_many(sel, lins, None, h, t, [q, k, v]);
        }
        if let Some(n) = &self.q_norm {
            n.forward_inplace(q);
        }
        if let Some(n) = &self.k_norm {
            n.forward_inplace(k);
        }
        let rope =
            |i: usize, (q, k): (&mut [f32], &mut [f32]), cos: &mut [f32], sin: &mut [f32]| {
                self.rope.angles(pos0 + i, cos, sin);
                self.rope.apply(q, hd, cos, sin);
                self.rope.apply(k, hd, cos, sin);
            };
        let (qs, ks) = (&mut q[..t * nq * hd], &mut k[..t * nkv * hd]);
        if t >= crate::exec::PARALLEL_TOKENS {
            // A prefill's tokens over the pool (their angles and rotations were 3% of a
            // 64-token SmolLM2 prefill on the calling thread), each with angles of its own.
            let n = s.cos.len();
            qs.par_chunks_exact_mut(nq * hd)
                .zip(ks.par_chunks_exact_mut(nkv * hd))
                .enumerate()
                .for_each_init(
                    || (vec![0f32; n], vec![0f32; n]),
                    |(cos, sin), (i, qk)| rope(i, qk, cos, sin),
                );
        } else {
            let qk = qs
                .chunks_exact_mut(nq * hd)
                .zip(ks.chunks_exact_mut(nkv * hd));
            for (i, qk) in qk.enumerate() {
                rope(i, qk, &mut s.cos, &mut s.sin);
            }
        }
        kv.store(pos0, k, v);

        let att = &mut s.att[..t * nq * hd];
        let q = &s.q[..t * nq * hd];
        let kv = &*kv;
        let head = |i: usize, hq: usize, o: &mut [f32]| {
            if heads.is_some_and(|live| !live[hq]) {
                o.fill(0.0);
                return;
            }
            let qh = &q[(i * nq + hq) * hd..(i * nq + hq + 1) * hd];
            self.attend(qh, pos0 + i, hq / (nq / nkv), kv, o);
        };
        // Token `i`'s heads, the query heads of a KV head together where all of them are
        // live (their scores and weighted values then share each key's loads).
        let g = nq / nkv;
        let kv_head = |i: usize, kvh: usize, outs: &mut [f32]| {
            let heads_of = kvh * g..(kvh + 1) * g;
            if (2..=MAX_GROUP).contains(&g)
                && heads.is_none_or(|live| live[heads_of.clone()].iter().all(|&l| l))
            {
                let qs = &q[(i * nq + heads_of.start) * hd..(i * nq + heads_of.end) * hd];
                self.attend_group(qs, g, pos0 + i, kvh, kv, outs);
            } else {
                for (hq, o) in heads_of.zip(outs.chunks_exact_mut(hd)) {
                    head(i, hq, o);
                }
            }
        };
        if t > 1 {
            att.par_chunks_mut(nq * hd)
                .enumerate()
                .for_each(|(i, row)| {
                    for (kvh, outs) in row.chunks_exact_mut(g * hd).enumerate() {
                        kv_head(i, kvh, outs)
                    }
                });
        } else if (pos0 + 1) * nq * hd < 1 << 12 {
            // The first few positions are less work than a parallel loop.
            for (kvh, outs) in att.chunks_exact_mut(g * hd).enumerate() {
                kv_head(0, kvh, outs)
            }
        } else {
            // One token: its KV heads (each with its query heads) over the pool.
            crate::exec::for_each_chunk_mut(att, g * hd, |kvh, outs| kv_head(0, kvh, outs));
        }
        if self.output_gate {
            for (a, &g) in att.iter_mut().zip(&s.gate[..t * nq * hd]) {
                *a *= 1.0 / (1.0 + (-g).exp());
            }
        }
        self.o_proj.view(sel).forward(att, t, out);
    }

    /// One query head at absolute position `pos` over the cached keys `lo..=pos`.
    /// Head output `o` of query `qh` at position `pos` over KV head `kvh`: the keys in
    /// the window up to `pos`, a softmax, the weighted values (see [`super::attend`]).
    fn attend(&self, qh: &[f32], pos: usize, kvh: usize, kv: &LayerKv, o: &mut [f32]) {
        self.attend_group(qh, 1, pos, kvh, kv, o)
    }

    /// [`Attention::attend`] of the `g ≤ MAX_GROUP` query heads `qs` (`[g, head_dim]`)
    /// that share KV head `kvh`, into `outs` (`[g, head_dim]`): their scores and weighted
    /// values are computed together ([`attend::scores_group`],
    /// [`attend::weighted_values_group`]), each head's the same as alone.
    fn attend_group(
        &self,
        qs: &[f32],
        g: usize,
        pos: usize,
        kvh: usize,
        kv: &LayerKv,
        outs: &mut [f32],
    ) {
        let c = &self.cfg;
        let hd = c.head_dim;
        let k = self.kernel;
        let lo = c.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let (b0, b1) = (lo / KEY_TILE, pos / KEY_TILE + 1);
        let (tiles, values) = kv.head(kvh);
        SCORES.with(|cell| {
            let mut scores = cell.borrow_mut();
            let room = (b1 - b0) * KEY_TILE;
            if scores.len() < g * room {
                scores.resize(g * room, 0.0);
            }
            attend::scores_group(k, tiles, hd, qs, g, b0, b1, &mut scores[..g * room], room);
            let (from, n) = (lo - b0 * KEY_TILE, pos + 1 - lo);
            let mut invs = [0f32; MAX_GROUP];
            let invs = &mut invs[..g];
            for (h, inv) in invs.iter_mut().enumerate() {
                let sc = &mut scores[h * room + from..h * room + from + n];
                let max = scale_and_max(sc, c.scale, c.softcap);
                *inv = 1.0 / attend::softmax_exp(k, sc, max);
            }
            let values = &values[lo * hd..(pos + 1) * hd];
            let w = attend::GroupProbs {
                p: &scores[from..],
                stride: room,
                n,
                invs,
            };
            attend::weighted_values_group(k, values, hd, &w, &mut outs[..g * hd]);
        });
    }
}

/// Scales the scores `sc` (and soft-caps them) and returns the largest, NaN ignored as
/// by `f32::max`. The largest is taken in 16 lanes, which the compiler vectorises: a
/// running `f32::max` is one serial chain of compares, 8% of a 512-token prefill.
fn scale_and_max(sc: &mut [f32], scale: f32, softcap: Option<f32>) -> f32 {
    for v in sc.iter_mut() {
        *v *= scale;
    }
    if let Some(cap) = softcap {
        for v in sc.iter_mut() {
            *v = (*v / cap).tanh() * cap;
        }
    }
    // `v > m` is false for a NaN `v`: it never enters a lane.
    let step = |m: &mut f32, v: f32| *m = if v > *m { v } else { *m };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = sc.chunks_exact(16);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            step(m, v);
        }
    }
    for &v in chunks.remainder() {
        step(&mut lanes[0], v);
    }
    lanes.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::scale_and_max;

    /// The serial form it replaces.
    fn serial(sc: &mut [f32], scale: f32, softcap: Option<f32>) -> f32 {
        let mut max = f32::NEG_INFINITY;
        for v in sc.iter_mut() {
            *v *= scale;
            if let Some(cap) = softcap {
                *v = (*v / cap).tanh() * cap;
            }
            max = max.max(*v);
        }
        max
    }

    #[test]
    fn scale_and_max_matches_the_serial_fold() {
        for n in [0usize, 1, 7, 15, 16, 17, 33, 95, 257] {
            for cap in [None, Some(30.0)] {
                for nan_at in [None, Some(0), Some(n / 2), Some(n.saturating_sub(1))] {
                    let mut a: Vec<f32> = (0..n)
                        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
                        .collect();
                    if let Some(i) = nan_at.filter(|&i| i < n) {
                        a[i] = f32::NAN;
                    }
                    let mut b = a.clone();
                    let (m, want) = (
                        scale_and_max(&mut a, 0.102, cap),
                        serial(&mut b, 0.102, cap),
                    );
                    assert_eq!(
                        m.to_bits(),
                        want.to_bits(),
                        "n {n} cap {cap:?} nan {nan_at:?}"
                    );
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b));
                }
            }
        }
        assert_eq!(
            scale_and_max(&mut [f32::NAN; 20], 1.0, None),
            f32::NEG_INFINITY
        );
    }
}
