//! Measures over logits that the CLI and the parity checks share: the negative
//! log-likelihood of a target (perplexity) and how far two logit sets are apart (the
//! quantized-activation contract of DESIGN.md: argmax agreement and mean KL).

use super::sampler::argmax;

/// `log Σ exp(x)`, in f64.
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    max + x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln()
}

/// `−log softmax(logits)[target]`.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    log_sum_exp(logits) - logits[target as usize] as f64
}

/// How closely `b` follows `a`, both `[positions, vocab]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agreement {
    /// Fraction of positions whose argmax is the same.
    pub argmax: f64,
    /// Mean over positions of KL(softmax(a) ‖ softmax(b)), in nats.
    pub mean_kl: f64,
}

pub fn agreement(a: &[f32], b: &[f32], vocab: usize) -> Agreement {
    assert_eq!(a.len(), b.len(), "logit sets of different sizes");
    let t = a.len() / vocab.max(1);
    let (mut same, mut kl) = (0usize, 0f64);
    for (p, q) in a.chunks_exact(vocab).zip(b.chunks_exact(vocab)) {
        same += (argmax(p) == argmax(q)) as usize;
        let (lp, lq) = (log_sum_exp(p), log_sum_exp(q));
        kl += p
            .iter()
            .zip(q)
            .map(|(&x, &y)| {
                let l = x as f64 - lp;
                l.exp() * (l - (y as f64 - lq))
            })
            .sum::<f64>();
    }
    Agreement {
        argmax: same as f64 / t.max(1) as f64,
        mean_kl: kl / t.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_and_agreement() {
        // Uniform over 4: nll = ln 4.
        assert!((nll(&[1.0; 4], 2) - 4f64.ln()).abs() < 1e-12);
        let a = [0.0, 1.0, 2.0, 2.0, 1.0, 0.0];
        let same = agreement(&a, &a, 3);
        assert_eq!(same.argmax, 1.0);
        assert!(same.mean_kl.abs() < 1e-12);
        let b = [0.0, 1.0, 2.0, 0.0, 1.0, 2.0];
        let half = agreement(&a, &b, 3);
        assert_eq!(half.argmax, 0.5);
        assert!(half.mean_kl > 0.1);
    }
}
