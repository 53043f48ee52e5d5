//! Choosing the next token from logits, in Hugging Face's order: repetition penalty, then
//! temperature, top-k, top-p, min-p. Temperature 0 is greedy (argmax after the penalty).
//! All buffers are allocated once per sampler, so sampling allocates nothing per token.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off: drop tokens whose probability is below `min_p · p_max`.
    pub min_p: f32,
    /// 1 = off: logits of tokens already in the context are divided (positive) or
    /// multiplied (negative) by it.
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl SamplingParams {
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Checks ranges; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature {} must be ≥ 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p {} must be in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min-p {} must be in [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(format!(
                "repetition penalty {} must be > 0",
                self.repetition_penalty
            ));
        }
        Ok(())
    }
}

pub struct Sampler {
    pub params: SamplingParams,
    rng: StdRng,
    /// (logit or probability, token) candidates, vocab-sized.
    cand: Vec<(f32, u32)>,
    /// Tokens of the context, for the repetition penalty (vocab-sized).
    seen: Vec<bool>,
}

impl Sampler {
    pub fn new(params: SamplingParams, vocab: usize) -> Sampler {
        Sampler {
            rng: StdRng::seed_from_u64(params.seed),
            params,
            cand: Vec::with_capacity(vocab),
            seen: vec![false; vocab],
        }
    }

    /// The next token. `logits` is modified (penalty, temperature); `context` is every
    /// token the model has seen (prompt and generated).
    pub fn sample(&mut self, logits: &mut [f32], context: &[u32]) -> u32 {
        if self.params.is_greedy() {
            self.penalise(logits, context);
            return argmax(logits) as u32;
        }
        self.distribution(logits, context);
        self.draw()
    }

    /// The distribution the next token is drawn from, after every transform (penalty,
    /// temperature, top-k, top-p, min-p): `(probability, token)` pairs, most likely
    /// first, summing to 1 (greedy: the argmax alone). Speculative decoding's acceptance
    /// rule needs it. `logits` is modified.
    pub fn distribution(&mut self, logits: &mut [f32], context: &[u32]) -> &[(f32, u32)] {
        self.penalise(logits, context);
        let p = &self.params;
        self.cand.clear();
        if p.is_greedy() {
            self.cand.push((1.0, argmax(logits) as u32));
            return &self.cand;
        }
        let inv_t = 1.0 / p.temperature;
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| (l * inv_t, i as u32)),
        );
        if self.cand.is_empty() {
            self.cand.push((1.0, 0));
            return &self.cand;
        }
        let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if p.top_k > 0 && p.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(p.top_k - 1, desc);
            self.cand.truncate(p.top_k);
        }
        self.cand.sort_unstable_by(desc);
        // Softmax over the survivors.
        let max = self.cand[0].0;
        let mut sum = 0.0;
        for c in self.cand.iter_mut() {
            c.0 = (c.0 - max).exp();
            sum += c.0;
        }
        for c in self.cand.iter_mut() {
            c.0 /= sum;
        }
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = self.cand.len();
            for (i, c) in self.cand.iter().enumerate() {
                cum += c.0;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let floor = p.min_p * self.cand[0].0;
            let keep = self.cand.iter().take_while(|c| c.0 >= floor).count();
            self.cand.truncate(keep.max(1));
        }
        let total: f32 = self.cand.iter().map(|c| c.0).sum();
        for c in self.cand.iter_mut() {
            c.0 /= total;
        }
        &self.cand
    }

    /// A token drawn from the last [`Sampler::distribution`].
    pub fn draw(&mut self) -> u32 {
        let mut r = self.rng.random::<f32>();
        for c in &self.cand {
            r -= c.0;
            if r <= 0.0 {
                return c.1;
            }
        }
        self.cand.last().map_or(0, |c| c.1)
    }

    /// A uniform number in [0, 1) from the sampler's stream.
    pub fn uniform(&mut self) -> f32 {
        self.rng.random::<f32>()
    }

    /// A token drawn from `weights` (non-negative, not necessarily normalised, indexed by
    /// token id); `None` if they are all zero.
    pub fn draw_from(&mut self, weights: &[f32]) -> Option<u32> {
        let total: f32 = weights.iter().sum();
        if total.is_nan() || total <= 0.0 {
            return None;
        }
        let mut r = self.rng.random::<f32>() * total;
        let mut last = None;
        for (i, &w) in weights.iter().enumerate() {
            if w > 0.0 {
                last = Some(i as u32);
                r -= w;
                if r <= 0.0 {
                    return last;
                }
            }
        }
        last
    }

    fn penalise(&mut self, logits: &mut [f32], context: &[u32]) {
        let p = &self.params;
        if p.repetition_penalty == 1.0 {
            return;
        }
        for &id in context {
            if let Some(s) = self.seen.get_mut(id as usize) {
                *s = true;
            }
        }
        for &id in context {
            let i = id as usize;
            if i < logits.len() && self.seen[i] {
                self.seen[i] = false;
                let l = &mut logits[i];
                *l = if *l < 0.0 {
                    *l * p.repetition_penalty
                } else {
                    *l / p.repetition_penalty
                };
            }
        }
    }
}

/// Index of the largest value; the lowest index wins ties (torch.argmax); NaN never wins.
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &x) in v.iter().enumerate() {
        if x > best_v {
            best = i;
            best_v = x;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            ..SamplingParams::greedy()
        }
    }

    #[test]
    fn greedy_and_penalty() {
        let mut s = Sampler::new(params(0.0), 4);
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.9, f32::NAN], &[]), 1);
        let mut s = Sampler::new(
            SamplingParams {
                repetition_penalty: 1.5,
                ..params(0.0)
            },
            4,
        );
        // 3.0 / 1.5 = 2.0 < 2.9; a repeated id is penalised once.
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.9, -1.0], &[1, 1]), 2);
    }

    #[test]
    fn filters_and_seed() {
        let logits = [1.0f32, 2.0, 3.0, 4.0, 0.0];
        let draw = |p: SamplingParams, n: usize| {
            let mut s = Sampler::new(p, 5);
            (0..n)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        let top2 = draw(
            SamplingParams {
                top_k: 2,
                ..params(1.0)
            },
            200,
        );
        assert!(top2.iter().all(|&t| t == 3 || t == 2));
        assert!(top2.contains(&2) && top2.contains(&3));
        // top-p 0.5: p(4.0) = 0.64 alone covers it.
        let nucleus = draw(
            SamplingParams {
                top_p: 0.5,
                ..params(1.0)
            },
            100,
        );
        assert!(nucleus.iter().all(|&t| t == 3));
        // min-p 0.3: tokens with p ≥ 0.3·p_max stay: 3 and 2 (e^-1 = 0.37), not 1 (e^-2).
        let minp = draw(
            SamplingParams {
                min_p: 0.3,
                ..params(1.0)
            },
            200,
        );
        assert!(minp.iter().all(|&t| t == 3 || t == 2), "{minp:?}");
        // The same seed, the same draws; another seed, other draws.
        let a = draw(params(1.0), 50);
        assert_eq!(a, draw(params(1.0), 50));
        let b = draw(
            SamplingParams {
                seed: 7,
                ..params(1.0)
            },
            50,
        );
        assert_ne!(a, b);
    }
}
