//! Matrix products over weights in their stored dtype: the inference engine's only way to
//! touch a weight matrix. A [`Matrix`] is checked once (at model load) and then multiplies
//! straight from the mmapped bytes; nothing here makes a dequantized copy of a tensor.
//!
//! - [`matvec`]: `y = W·x` (decode, one token), rows split over the rayon pool;
//! - [`matmul`]: `Y = X·Wᵀ` for `t` activation rows (prefill), each weight row read once
//!   for all `t` activations;
//! - [`Matrix::row`]: one row decoded (embedding lookup).
//!
//! `W` is `[rows = out, cols = in]` as everywhere in CMF.

use rayon::prelude::*;

use super::{decode_row, geometry, validate, QuantError};
use crate::format::dtype::DType;

/// Owned description of a weight matrix, checked against its bytes once. It holds no
/// bytes itself: the caller passes the same bytes to every product.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub rows: usize,
    pub cols: usize,
    /// Byte length the matrix was validated with (guards against mixing up tensors).
    nbytes: usize,
}

impl Matrix {
    /// Validates `bytes` as a payload of `dtype` / `shape` (every offset of variable-length
    /// layouts included), so that the products below cannot fail.
    pub fn new(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<Matrix, QuantError> {
        validate(dtype, shape, bytes)?;
        let g = geometry(dtype, shape)?;
        Ok(Matrix {
            dtype,
            shape: shape.to_vec(),
            rows: g.rows,
            cols: g.cols,
            nbytes: bytes.len(),
        })
    }

    /// Decodes row `r` into `out` (`cols` values).
    pub fn row(&self, bytes: &[u8], r: usize, out: &mut [f32]) {
        debug_assert_eq!(bytes.len(), self.nbytes);
        decode_row(self.dtype, &self.shape, bytes, r, out)
            .expect("a validated matrix decodes every row");
    }
}

/// Rows per rayon task: enough work per task to amortise scheduling.
fn rows_per_task(m: &Matrix, t: usize) -> usize {
    let work_per_row = m.cols.max(1) * t.max(1);
    (16384 / work_per_row).clamp(1, 256)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for k in 0..8 {
            acc[k] += a[c * 8 + k] * b[c * 8 + k];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// `y[r] = Σ_c W[r, c]·x[c]`; `x.len() == cols`, `y.len() == rows`.
pub fn matvec(m: &Matrix, bytes: &[u8], x: &[f32], y: &mut [f32]) {
    matmul(m, bytes, x, 1, y)
}

/// `y[i, r] = Σ_c W[r, c]·x[i, c]` for `i < t`; `x` is `[t, cols]`, `y` is `[t, rows]`.
pub fn matmul(m: &Matrix, bytes: &[u8], x: &[f32], t: usize, y: &mut [f32]) {
    assert_eq!(x.len(), t * m.cols, "activations must be [t, cols]");
    assert_eq!(y.len(), t * m.rows, "output must be [t, rows]");
    debug_assert_eq!(bytes.len(), m.nbytes);
    let chunk = rows_per_task(m, t);
    // Output columns (rows of W) are split over tasks; each task writes a strided set of
    // y entries, so collect per task and scatter afterwards.
    let n_tasks = m.rows.div_ceil(chunk);
    let parts: Vec<(usize, Vec<f32>)> = (0..n_tasks)
        .into_par_iter()
        .map(|task| {
            let r0 = task * chunk;
            let r1 = (r0 + chunk).min(m.rows);
            let mut row = vec![0f32; m.cols];
            let mut out = vec![0f32; (r1 - r0) * t];
            for r in r0..r1 {
                m.row(bytes, r, &mut row);
                for i in 0..t {
                    out[(r - r0) * t + i] = dot(&row, &x[i * m.cols..(i + 1) * m.cols]);
                }
            }
            (r0, out)
        })
        .collect();
    for (r0, out) in parts {
        let n = out.len() / t.max(1);
        for k in 0..n {
            for i in 0..t {
                y[i * m.rows + r0 + k] = out[k * t + i];
            }
        }
    }
}
