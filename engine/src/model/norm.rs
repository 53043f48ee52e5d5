//! RMSNorm in both `norm_style`s (§2): `x̂·w` or the zero-centred `x̂·(1+w)`, computed in
//! f32 as Hugging Face does.

use super::ModelError;

/// Config: the weight is folded at load (`1+w` precomputed for zero-centred norms), so
/// `forward` is the same multiply for both styles.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    scale: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    /// `weight`: the stored norm weight, decoded (norms are small 1-D tensors).
    pub fn new(weight: Vec<f32>, eps: f32, zero_centred: bool) -> RmsNorm {
        let scale = if zero_centred {
            weight.iter().map(|w| 1.0 + w).collect()
        } else {
            weight
        };
        RmsNorm { scale, eps }
    }

    pub fn dim(&self) -> usize {
        self.scale.len()
    }

    /// Normalises every `dim`-long row of `x` [n, dim] into `out` [n, dim].
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let d = self.scale.len();
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ss + self.eps).sqrt();
            for ((o, &v), &s) in or.iter_mut().zip(xr).zip(&self.scale) {
                *o = v * inv * s;
            }
        }
    }

    /// In place over every `dim`-long row of `x` (per-head q/k norms).
    pub fn forward_inplace(&self, x: &mut [f32]) {
        let d = self.scale.len();
        for xr in x.chunks_exact_mut(d) {
            let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ss + self.eps).sqrt();
            for (v, &s) in xr.iter_mut().zip(&self.scale) {
                *v = *v * inv * s;
            }
        }
    }

    pub fn check_dim(&self, name: &str, want: usize) -> Result<(), ModelError> {
        if self.scale.len() != want {
            return Err(ModelError::Shape {
                name: name.into(),
                reason: format!("has {} values, expected {want}", self.scale.len()),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_styles() {
        let x = [1.0f32, -2.0, 3.0, -4.0];
        let rms = ((1.0 + 4.0 + 9.0 + 16.0) / 4.0f32 + 1e-6).sqrt();
        let mut out = [0.0; 4];
        RmsNorm::new(vec![0.5; 4], 1e-6, false).forward(&x, &mut out);
        assert!((out[1] - (-2.0 / rms * 0.5)).abs() < 1e-6);
        RmsNorm::new(vec![0.5; 4], 1e-6, true).forward(&x, &mut out);
        assert!((out[1] - (-2.0 / rms * 1.5)).abs() < 1e-6);
    }
}
