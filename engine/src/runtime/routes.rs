//! What a MoE model's router chose, position by position: the [`RouteLog`] a session keeps
//! when asked (the routing view and `run --route-stats` read it), and the per-layer
//! [`RouteStats`] summary with its JSON form.
//!
//! A position's routes are those of the forward that took its token as input (so the
//! last generated token, never run, has none). The log follows the session's state: a
//! prefix reused by the next prompt keeps its routes, a rolled-back draft loses its own.
//!
//! `--route-stats FILE.json` (format `cortiq-route-stats`, version 1):
//! ```json
//! {"format": "cortiq-route-stats", "version": 1, "model": "…", "tokens": 123,
//!  "layers": [{"layer": 1, "experts": 8, "top_k": 2,
//!              "counts": [..one per expert..], "mass": [..one per expert..]}]}
//! ```
//! `tokens` counts the positions routed; per layer, `counts[e]` is how many of them chose
//! expert `e` among their top-k and `mass[e]` the sum of the weights it received (after
//! renormalisation), so `Σ counts = tokens·top_k` and, with `norm_topk_prob`,
//! `Σ mass = tokens`.

use serde::{Deserialize, Serialize};

use crate::model::moe::{LayerRoutes, NO_EXPERT};
use crate::model::Model;

/// One MoE layer's choices over the logged positions.
#[derive(Clone, Debug)]
pub struct LayerLog {
    pub layer: usize,
    pub experts: usize,
    pub k: usize,
    /// `[positions, k]` expert ids, best first.
    pub chosen: Vec<u32>,
    /// `[positions, k]` their weights.
    pub weights: Vec<f32>,
}

/// Routes of every position of a session's state (MoE layers only).
#[derive(Clone, Debug)]
pub struct RouteLog {
    pub layers: Vec<LayerLog>,
    pub len: usize,
}

impl RouteLog {
    /// An empty log for `model`'s MoE layers with room for `capacity` positions
    /// (allocated now, so logging allocates nothing per token).
    pub fn new(model: &Model, capacity: usize) -> RouteLog {
        RouteLog {
            layers: model
                .layers
                .iter()
                .enumerate()
                .filter_map(|(i, l)| l.moe().map(|m| (i, m)))
                .map(|(i, m)| LayerLog {
                    layer: i,
                    experts: m.num_experts(),
                    k: m.top_k,
                    chosen: Vec::with_capacity(capacity * m.top_k),
                    weights: Vec::with_capacity(capacity * m.top_k),
                })
                .collect(),
            len: 0,
        }
    }

    /// Appends rows `rows` of the last forward's routes (`routes` is the workspace's,
    /// one entry per layer).
    pub fn push(&mut self, routes: &[LayerRoutes], rows: std::ops::Range<usize>) {
        for l in &mut self.layers {
            let r = &routes[l.layer];
            let span = rows.start * r.k..rows.end * r.k;
            l.chosen.extend_from_slice(&r.experts[span.clone()]);
            l.weights.extend_from_slice(&r.weights[span]);
        }
        self.len += rows.len();
    }

    /// Forgets positions from `len` on.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for l in &mut self.layers {
            l.chosen.truncate(len * l.k);
            l.weights.truncate(len * l.k);
        }
        self.len = len;
    }

    /// The experts and weights position `pos` chose in each MoE layer:
    /// `(layer, experts, weights)`.
    pub fn at(&self, pos: usize) -> impl Iterator<Item = (usize, &[u32], &[f32])> + '_ {
        self.layers
            .iter()
            .filter(move |_| pos < self.len)
            .map(move |l| {
                let r = pos * l.k..(pos + 1) * l.k;
                // A task that leaves fewer experts than top_k pads the slots.
                let n = l.chosen[r.clone()]
                    .iter()
                    .take_while(|&&e| e != NO_EXPERT)
                    .count();
                (
                    l.layer,
                    &l.chosen[r.start..r.start + n],
                    &l.weights[r.start..r.start + n],
                )
            })
    }

    /// Per-layer counts and weight mass over positions `range`.
    pub fn stats(&self, range: std::ops::Range<usize>) -> RouteStats {
        let range = range.start.min(self.len)..range.end.min(self.len);
        RouteStats {
            format: RouteStats::FORMAT.into(),
            version: 1,
            model: None,
            tokens: range.len() as u64,
            layers: self
                .layers
                .iter()
                .map(|l| {
                    let mut s = LayerStats {
                        layer: l.layer,
                        experts: l.experts,
                        top_k: l.k,
                        counts: vec![0; l.experts],
                        mass: vec![0.0; l.experts],
                    };
                    let span = range.start * l.k..range.end * l.k;
                    for (&e, &w) in l.chosen[span.clone()].iter().zip(&l.weights[span]) {
                        if e == NO_EXPERT {
                            continue;
                        }
                        s.counts[e as usize] += 1;
                        s.mass[e as usize] += f64::from(w);
                    }
                    s
                })
                .collect(),
        }
    }
}

/// One layer's selection counts and weight mass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerStats {
    pub layer: usize,
    pub experts: usize,
    pub top_k: usize,
    pub counts: Vec<u64>,
    pub mass: Vec<f64>,
}

impl LayerStats {
    /// Normalised entropy of the count distribution (1 = perfectly balanced, 0 = one
    /// expert takes everything; 0 with no tokens).
    pub fn balance_entropy(&self) -> f64 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 || self.experts < 2 {
            return 0.0;
        }
        let h: f64 = self
            .counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / total as f64;
                -p * p.ln()
            })
            .sum();
        h / (self.experts as f64).ln()
    }

    /// The busiest expert's count over the mean count (1 = balanced).
    pub fn max_over_mean(&self) -> f64 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let max = self.counts.iter().copied().max().unwrap_or(0);
        max as f64 / (total as f64 / self.experts as f64)
    }

    /// Experts never chosen.
    pub fn unused(&self) -> Vec<usize> {
        (0..self.experts).filter(|&e| self.counts[e] == 0).collect()
    }

    /// How many experts (the heaviest first) carry `share` of the weight mass.
    pub fn experts_for_mass(&self, share: f64) -> usize {
        let total: f64 = self.mass.iter().sum();
        if total <= 0.0 {
            return 0;
        }
        let mut m = self.mass.clone();
        m.sort_by(|a, b| b.total_cmp(a));
        let mut acc = 0.0;
        for (i, v) in m.iter().enumerate() {
            acc += v;
            if acc >= share * total - 1e-12 {
                return i + 1;
            }
        }
        m.len()
    }
}

/// `--route-stats` JSON (see the module comment).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteStats {
    pub format: String,
    pub version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub tokens: u64,
    pub layers: Vec<LayerStats>,
}

impl RouteStats {
    pub const FORMAT: &'static str = "cortiq-route-stats";

    /// Adds `other`'s counts (the same model's layers).
    pub fn merge(&mut self, other: &RouteStats) {
        self.tokens += other.tokens;
        for (a, b) in self.layers.iter_mut().zip(&other.layers) {
            for (x, y) in a.counts.iter_mut().zip(&b.counts) {
                *x += y;
            }
            for (x, y) in a.mass.iter_mut().zip(&b.mass) {
                *x += y;
            }
        }
    }

    /// Parses and checks a route-stats document.
    pub fn from_json(text: &str) -> Result<RouteStats, String> {
        let s: RouteStats = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if s.format != Self::FORMAT || s.version != 1 {
            return Err(format!(
                "not a {} v1 document (format {:?}, version {})",
                Self::FORMAT,
                s.format,
                s.version
            ));
        }
        for l in &s.layers {
            if l.counts.len() != l.experts || l.mass.len() != l.experts {
                return Err(format!(
                    "layer {}: {} experts but {} counts and {} masses",
                    l.layer,
                    l.experts,
                    l.counts.len(),
                    l.mass.len()
                ));
            }
        }
        Ok(s)
    }
}
