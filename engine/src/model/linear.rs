//! A weight matrix in the mmap, in its stored dtype, with an optional bias.

use std::sync::Arc;

use super::ModelError;
use crate::format::shards::CmfModel;
use crate::quant::matrix::{self, Matrix, Precision};

/// `y = x·Wᵀ (+ b)` with `W` [out, in] read in place from the file.
#[derive(Clone, Debug)]
pub struct Linear {
    pub name: String,
    pub m: Matrix,
    file: Arc<CmfModel>,
    shard: usize,
    range: std::ops::Range<usize>,
    pub bias: Option<Vec<f32>>,
    /// How activations enter the product (exact f32, or int8 for speed).
    pub precision: Precision,
}

impl Linear {
    /// The matrix `name`, checked to be `[out, in]`.
    pub fn load(
        file: &Arc<CmfModel>,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Linear, ModelError> {
        let (shard, e) = file
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        let bytes = file.shards[shard].tensor_bytes(e);
        let m = Matrix::new(e.dtype, &e.shape, bytes).map_err(|err| ModelError::Tensor {
            name: name.into(),
            reason: err.to_string(),
        })?;
        if m.rows != out_dim || m.cols != in_dim || e.shape.len() != 2 {
            return Err(ModelError::Shape {
                name: name.into(),
                reason: format!("is {:?}, expected [{out_dim}, {in_dim}]", e.shape),
            });
        }
        let start = bytes.as_ptr() as usize - file.shards[shard].bytes().as_ptr() as usize;
        Ok(Linear {
            name: name.into(),
            m,
            file: file.clone(),
            shard,
            range: start..start + bytes.len(),
            bias: None,
            precision: Precision::Exact,
        })
    }

    pub fn out_dim(&self) -> usize {
        self.m.rows
    }

    pub fn in_dim(&self) -> usize {
        self.m.cols
    }

    pub fn bytes(&self) -> &[u8] {
        &self.file.shards[self.shard].bytes()[self.range.clone()]
    }

    /// `x` [t, in] → `y` [t, out].
    pub fn forward(&self, x: &[f32], t: usize, y: &mut [f32]) {
        let bytes = self.bytes();
        if t == 1 {
            matrix::matvec_with(&self.m, bytes, x, y, self.precision);
        } else {
            matrix::matmul_with(&self.m, bytes, x, t, y, self.precision);
        }
        self.add_bias(y);
    }

    /// Several linears of the same input `x` [t, in] at once (q/k/v, gate/up): for one
    /// token a single parallel section with one activation quantization; for a batch,
    /// one after the other (each product is already large enough).
    pub fn forward_many<const N: usize>(
        lins: [&Linear; N],
        x: &[f32],
        t: usize,
        ys: [&mut [f32]; N],
    ) {
        if t == 1 && lins.iter().all(|l| l.precision == lins[0].precision) {
            let mut parts: [matrix::MatvecPart; N] = {
                let mut ys = ys.into_iter();
                std::array::from_fn(|i| matrix::MatvecPart {
                    m: &lins[i].m,
                    bytes: lins[i].bytes(),
                    y: ys.next().expect("one output per linear"),
                })
            };
            matrix::matvec_multi(&mut parts, x, lins[0].precision);
            for (l, part) in lins.iter().zip(parts.iter_mut()) {
                l.add_bias(part.y);
            }
        } else {
            for (l, y) in lins.iter().zip(ys) {
                l.forward(x, t, y);
            }
        }
    }

    /// Adds the bias (if any) to `y` [t, out], as [`Linear::forward`] does.
    pub fn add_bias_to(&self, y: &mut [f32]) {
        self.add_bias(y)
    }

    fn add_bias(&self, y: &mut [f32]) {
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(b.len()) {
                for (v, bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            }
        }
    }

    /// Row `r` of `W` decoded (an embedding lookup).
    pub fn row(&self, r: usize, out: &mut [f32]) {
        self.m.row(self.bytes(), r, out)
    }
}
