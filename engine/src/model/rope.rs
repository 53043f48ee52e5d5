//! Rotary position embedding, Hugging Face's "rotate half" convention: within the first
//! `rotary_dim` dims of a head, element `i` pairs with `i + rotary_dim/2`. Frequencies for
//! the default, linear, llama3 and YaRN variants follow transformers'
//! `rope_init_fn`s; the rest of a head (partial rotary) passes through.

use super::config::RopeScaling;

#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f64>,
    rotary_dim: usize,
    /// YaRN multiplies cos and sin by this.
    attention_factor: f64,
}

impl Rope {
    pub fn new(theta: f64, rotary_dim: usize, scaling: &RopeScaling) -> Rope {
        let half = rotary_dim / 2;
        // transformers computes base^(2i/dim) in f32; the small difference from f64 is far
        // below the parity tolerance, and f64 keeps long positions accurate.
        let base: Vec<f64> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / rotary_dim as f64))
            .collect();
        let mut attention_factor = 1.0;
        let inv_freq = match *scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: old,
                beta_fast,
                beta_slow,
                attention_factor: af,
                truncate,
            } => {
                attention_factor = af;
                let dim = rotary_dim as f64;
                let correction_dim = |rot: f64| {
                    dim * (old / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
                if truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let high = high.min(dim - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                base.iter()
                    .enumerate()
                    .map(|(i, &extrapolation)| {
                        let interpolation = extrapolation / factor;
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation_weight = 1.0 - ramp;
                        interpolation * (1.0 - extrapolation_weight)
                            + extrapolation * extrapolation_weight
                    })
                    .collect()
            }
        };
        Rope {
            inv_freq,
            rotary_dim,
            attention_factor,
        }
    }

    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// Writes cos and sin (each `rotary_dim/2` long) of position `pos`.
    pub fn angles(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            // HF multiplies in f32: position · inv_freq, then cos/sin.
            let a = (pos as f32 * f as f32) as f64;
            cos[i] = (a.cos() * self.attention_factor) as f32;
            sin[i] = (a.sin() * self.attention_factor) as f32;
        }
    }

    /// Rotates every `head_dim`-long head of `x` (one token) with the given angles.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = self.rotary_dim / 2;
        for head in x.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos[i] - b * sin[i];
                head[i + half] = b * cos[i] + a * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let r = Rope::new(10000.0, 8, &RopeScaling::None);
        let (mut c, mut s) = (vec![0.0; 4], vec![0.0; 4]);
        let x0: Vec<f32> = (0..16).map(|i| i as f32 - 3.0).collect();
        let mut x = x0.clone();
        r.angles(0, &mut c, &mut s);
        r.apply(&mut x, 16, &c, &s);
        assert_eq!(x, x0);
        r.angles(7, &mut c, &mut s);
        r.apply(&mut x, 16, &c, &s);
        assert_ne!(x, x0);
        // Partial rotary: dims 8..16 untouched; the norm of the rotated part is kept.
        assert_eq!(x[8..], x0[8..]);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x[..8]) - n(&x0[..8])).abs() < 1e-3);
    }

    #[test]
    fn scaled_variants() {
        let none = Rope::new(500000.0, 64, &RopeScaling::None);
        let lin = Rope::new(500000.0, 64, &RopeScaling::Linear { factor: 4.0 });
        assert!((lin.inv_freq[5] * 4.0 - none.inv_freq[5]).abs() < 1e-12);
        let l3 = Rope::new(
            500000.0,
            64,
            &RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            },
        );
        // High frequencies are kept, the lowest are divided by the factor.
        assert_eq!(l3.inv_freq[0], none.inv_freq[0]);
        assert!((l3.inv_freq[31] * 8.0 - none.inv_freq[31]).abs() < 1e-15);
        let yarn = Rope::new(
            10000.0,
            64,
            &RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 4096.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 1.1386,
                truncate: true,
            },
        );
        assert_eq!(yarn.inv_freq[0], none_of(10000.0).inv_freq[0]);
        assert!((yarn.inv_freq[31] * 4.0 - none_of(10000.0).inv_freq[31]).abs() < 1e-12);
        let (mut c, mut s) = (vec![0.0; 32], vec![0.0; 32]);
        yarn.angles(0, &mut c, &mut s);
        assert!((c[0] - 1.1386).abs() < 1e-6);
    }

    fn none_of(theta: f64) -> Rope {
        Rope::new(theta, 64, &RopeScaling::None)
    }
}
