//! Recon-argmin skill routing (§9): each skill's `selection` is an affine subspace
//! (`mean`, an orthonormal `basis` of `rank` rows) of the hidden states at layer
//! `phi_layer`; a prompt's φ there is scored by its reconstruction error
//! `E = ‖r − BᵀB·r‖² / ‖φ‖²` with `r = φ − mean`, and the skill of least E is chosen.
//!
//! φ is the mean over the prompt's tokens of the output of layer `phi_layer` (0-based;
//! transformers' `hidden_states[phi_layer + 1]`), computed by the backbone. The prompt is
//! scored as given (raw tokens, no chat template): it is what the user asks about, and a
//! template's fixed frame would pull every prompt's φ toward the same point. This is what
//! the reference implementation's `route` reports, to its rounding: on
//! `qwen3-skills.cmf` six prompts agree within 1 % (`INSERT INTO t VALUES (1, 2);`
//! 0.0006 both, `hello world` 1.629 vs 1.619), one within 23 % (0.135 vs 0.110).

use crate::format::header::Selection;
use crate::model::select::blend_weights;
use crate::model::{Logits, Model, ModelError};

/// One skill's routing score.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SkillScore {
    pub id: String,
    /// The registry index.
    pub index: u16,
    pub phi_layer: Option<usize>,
    /// The reconstruction error E, when the skill has a usable selection.
    pub error: Option<f32>,
    /// Why it is not scored (no selection, inconsistent sizes).
    pub problem: Option<String>,
}

/// Every skill's score for one prompt, and the choice.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Routing {
    pub scores: Vec<SkillScore>,
    /// The scored skill of least E.
    pub choice: Option<u16>,
    /// Prompt tokens scored.
    pub tokens: usize,
}

impl Routing {
    /// Soft-mix weights `softmax(−E/T)` over every skill (unscored skills get 0).
    pub fn blend(&self, temperature: f32) -> Vec<f32> {
        let scored: Vec<(usize, f32)> = self
            .scores
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.error.map(|e| (i, e)))
            .collect();
        let w = blend_weights(
            &scored.iter().map(|&(_, e)| e).collect::<Vec<_>>(),
            temperature,
        );
        let mut out = vec![0.0; self.scores.len()];
        for ((i, _), w) in scored.into_iter().zip(w) {
            out[i] = w;
        }
        out
    }
}

/// A skill's subspace, decoded and checked against the model.
struct Subspace {
    layer: usize,
    mean: Vec<f32>,
    /// `[rank, hidden]`.
    basis: Vec<f32>,
}

fn subspace(sel: &Selection, model: &Model) -> Result<Subspace, String> {
    let h = model.config.hidden;
    let layer = usize::try_from(sel.phi_layer).unwrap_or(usize::MAX);
    if layer >= model.layers.len() {
        return Err(format!(
            "phi_layer {} is past the model's {} layers",
            sel.phi_layer,
            model.layers.len()
        ));
    }
    let mean = Selection::decode_f16(&sel.mean).map_err(|e| format!("mean: {e}"))?;
    if mean.len() != h {
        return Err(format!("mean has {} values, hidden is {h}", mean.len()));
    }
    let basis = Selection::decode_f16(&sel.basis).map_err(|e| format!("basis: {e}"))?;
    if basis.is_empty() || basis.len() % h != 0 {
        return Err(format!(
            "basis has {} values, not a whole number of rows of {h}",
            basis.len()
        ));
    }
    if let Some(rank) = sel.rank {
        if rank as usize * h != basis.len() {
            return Err(format!(
                "rank {rank} but the basis has {} rows",
                basis.len() / h
            ));
        }
    }
    if mean.iter().chain(&basis).any(|v| !v.is_finite()) {
        return Err("the subspace has non-finite values".into());
    }
    Ok(Subspace { layer, mean, basis })
}

/// `E = ‖r − BᵀB·r‖² / ‖φ‖²`, `r = φ − mean` (computed in f64).
fn recon_error(phi: &[f32], s: &Subspace) -> f32 {
    let r: Vec<f64> = phi
        .iter()
        .zip(&s.mean)
        .map(|(&p, &m)| f64::from(p) - f64::from(m))
        .collect();
    let mut res = r.clone();
    for b in s.basis.chunks_exact(phi.len()) {
        let c: f64 = b.iter().zip(&r).map(|(&bv, &rv)| f64::from(bv) * rv).sum();
        for (x, &bv) in res.iter_mut().zip(b) {
            *x -= c * f64::from(bv);
        }
    }
    let num: f64 = res.iter().map(|v| v * v).sum();
    let den: f64 = phi.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    if den > 0.0 {
        (num / den) as f32
    } else {
        f32::INFINITY
    }
}

/// The mean over `tokens` of the output of each layer of `layers`, from one forward of
/// the backbone (no task, no skill).
pub fn phi(model: &Model, tokens: &[u32], layers: &[usize]) -> Result<Vec<Vec<f32>>, ModelError> {
    let h = model.config.hidden;
    let mut state = model.new_state(tokens.len().max(1));
    let mut ws = model.new_workspace(crate::runtime::session::PREFILL_CHUNK);
    let mut sums = vec![vec![0f64; h]; layers.len()];
    let mut hs = Vec::new();
    for chunk in tokens.chunks(ws.t_max) {
        hs.clear();
        model.forward(chunk, &mut state, &mut ws, Logits::None, Some(&mut hs))?;
        let t = chunk.len();
        for (sum, &l) in sums.iter_mut().zip(layers) {
            // `hs` holds the embedding output, then each layer's.
            let rows = &hs[(l + 1) * t * h..(l + 2) * t * h];
            for row in rows.chunks_exact(h) {
                for (acc, &v) in sum.iter_mut().zip(row) {
                    *acc += f64::from(v);
                }
            }
        }
    }
    let n = tokens.len().max(1) as f64;
    Ok(sums
        .into_iter()
        .map(|s| s.into_iter().map(|v| (v / n) as f32).collect())
        .collect())
}

/// Scores every skill of `model` for `tokens` and picks the one of least E.
pub fn route(model: &Model, tokens: &[u32]) -> Result<Routing, ModelError> {
    let records = model.file.header().skills.clone().unwrap_or_default();
    let mut scores = Vec::new();
    let mut spaces = Vec::new();
    for (i, rec) in records.iter().enumerate().take(u16::MAX as usize) {
        let mut score = SkillScore {
            id: rec.id.clone(),
            index: i as u16,
            phi_layer: rec.selection.as_ref().map(|s| s.phi_layer as usize),
            error: None,
            problem: None,
        };
        let engine_problem = model.skills.get(i).and_then(|s| s.problem.clone());
        match (&rec.selection, engine_problem) {
            (_, Some(p)) => score.problem = Some(p),
            (None, None) => score.problem = Some("no selection subspace".into()),
            (Some(sel), None) => match subspace(sel, model) {
                Ok(s) => spaces.push((scores.len(), s)),
                Err(e) => score.problem = Some(e),
            },
        }
        scores.push(score);
    }
    if tokens.is_empty() {
        return Err(ModelError::Config {
            field: "prompt".into(),
            reason: "no tokens to route".into(),
        });
    }
    if !spaces.is_empty() {
        let mut layers: Vec<usize> = spaces.iter().map(|(_, s)| s.layer).collect();
        layers.sort_unstable();
        layers.dedup();
        let phis = phi(model, tokens, &layers)?;
        for (at, s) in &spaces {
            let k = layers
                .binary_search(&s.layer)
                .expect("the layer was listed");
            scores[*at].error = Some(recon_error(&phis[k], s));
        }
    }
    let choice = scores
        .iter()
        .filter_map(|s| s.error.map(|e| (s.index, e)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i);
    Ok(Routing {
        scores,
        choice,
        tokens: tokens.len(),
    })
}
