//! RMSNorm in both `norm_style`s (§2): `x̂·w` or the zero-centred `x̂·(1+w)`, computed in
//! f32 as Hugging Face does.

use super::ModelError;
use crate::exec::PARALLEL_ELEMENTS;
use rayon::prelude::*;

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

    /// Normalises every `dim`-long row of `x` [n, dim] into `out` [n, dim]. A prefill's
    /// rows (from [`PARALLEL_ELEMENTS`]) go over the pool, each computed as alone: serial on
    /// the calling thread they were 2% of a 64-token SmolLM2 prefill, with the other
    /// threads waiting.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let d = self.scale.len();
        let row = |(xr, or): (&[f32], &mut [f32])| {
            let inv = self.inv_rms(xr);
            for ((o, &v), &s) in or.iter_mut().zip(xr).zip(&self.scale) {
                *o = v * inv * s;
            }
        };
        if x.len() >= PARALLEL_ELEMENTS {
            x.par_chunks_exact(d)
                .zip(out.par_chunks_exact_mut(d))
                .for_each(row);
        } else {
            x.chunks_exact(d).zip(out.chunks_exact_mut(d)).for_each(row);
        }
    }

    /// In place over every `dim`-long row of `x` (per-head q/k norms); over the pool as
    /// [`RmsNorm::forward`].
    pub fn forward_inplace(&self, x: &mut [f32]) {
        let d = self.scale.len();
        let row = |xr: &mut [f32]| {
            let inv = self.inv_rms(xr);
            for (v, &s) in xr.iter_mut().zip(&self.scale) {
                *v = *v * inv * s;
            }
        };
        if x.len() >= PARALLEL_ELEMENTS {
            x.par_chunks_exact_mut(d).for_each(row);
        } else {
            x.chunks_exact_mut(d).for_each(row);
        }
    }

    /// `1 / √(mean(x²) + eps)`, the squares summed in order.
    #[inline]
    fn inv_rms(&self, xr: &[f32]) -> f32 {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / xr.len() as f32;
        1.0 / (ss + self.eps).sqrt()
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

    /// Past [`PARALLEL_ELEMENTS`] the rows go over the pool; each equals the row normalised
    /// alone, bit for bit (an awkward width, 96, and a row count that splits unevenly).
    #[test]
    fn a_prefills_rows_over_the_pool_equal_each_row_alone() {
        let d = 96;
        let rows = PARALLEL_ELEMENTS / d + 7;
        let w: Vec<f32> = (0..d).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
        let n = RmsNorm::new(w, 1e-6, false);
        let x: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 7919) % 2003) as f32 * 0.01 - 10.0)
            .collect();
        let mut all = vec![0.0; x.len()];
        n.forward(&x, &mut all);
        let mut inplace = x.clone();
        n.forward_inplace(&mut inplace);
        for (r, xr) in x.chunks_exact(d).enumerate() {
            let mut one = vec![0.0; d];
            n.forward(xr, &mut one);
            let got = &all[r * d..(r + 1) * d];
            assert!(
                one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "row {r}"
            );
            let got = &inplace[r * d..(r + 1) * d];
            assert!(
                one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "row {r}"
            );
        }
    }

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
