//! Tests of the row-dot kernels and of `matrix`: every writable dtype, every kernel this
//! CPU runs, shapes with tails (rows not a multiple of a block or chunk, cols not a
//! multiple of 32 where the dtype allows it), against `decode` + an f64 product.
//!
//! Tolerance. The kernels use each weight exactly as `decode` yields it (a `q8` row scale
//! is applied after the sum, but `q·scale` and `q·col` are exact in f32, so the terms are
//! the same), and differ from the exact dot only by f32 rounding of the products and the
//! sum. A sum of `n` terms accumulated in lanes (each lane sequentially, then a reduction
//! tree) is within `γ_m·Σ|w·x|` of the exact value, `γ_m ≈ m·2⁻²⁴`, with `m` at most
//! `n + 2` (one lane: the scalar reference; the SIMD lanes have `n/8` or `n/16` terms plus
//! 3–4 reduction levels), plus one rounding for the scale. Hence [`tolerance`]:
//! `(n + 4)·2⁻²⁴·Σ|w·x|` (+ a subnormal floor). It is rigorous, so a pass is never luck,
//! and it is tight enough to fail when a single term is lost or doubled (checked by
//! `tolerance_catches_one_wrong_term`).

use super::kernel::Kernel;
use super::matrix::{matmul, matvec, Matrix};
use super::*;
use crate::format::dtype::WRITABLE;

/// Deterministic xorshift64* stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Roughly normal (sum of four uniforms).
    fn normal(&mut self) -> f32 {
        (self.unit() + self.unit() + self.unit() + self.unit()) * 0.87
    }
}

/// Weights with per-row magnitudes over five decades, a zero row, zero stretches (whole
/// zero groups) and a few large outliers (for the overlay codecs).
fn weights(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed | 1);
    let mut v = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let mag = 10f32.powf(rng.unit() * 2.5 - 0.5);
        for c in 0..cols {
            let w = if r == 1 || (c / 32) % 7 == 3 {
                0.0
            } else if rng.next().is_multiple_of(97) {
                20.0 * mag * rng.unit()
            } else {
                mag * rng.normal()
            };
            v.push(w);
        }
    }
    v
}

/// Activations: normal, some exact zeros.
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            if rng.next().is_multiple_of(11) {
                0.0
            } else {
                rng.normal() * 2.0
            }
        })
        .collect()
}

/// Shapes a dtype accepts, with tails everywhere it allows them.
fn shapes(dtype: DType) -> Vec<Vec<u64>> {
    let mut s: Vec<Vec<u64>> = vec![
        vec![1, 32],
        vec![5, 32],
        vec![7, 64],
        vec![9, 96],
        vec![3, 2080],
        vec![67, 2080],
        vec![1027, 32],
    ];
    if !dtype.requires_cols_multiple_of_group() {
        s.extend([
            vec![6, 1],
            vec![5, 7],
            vec![9, 33],
            vec![4, 45],
            vec![13, 100],
        ]);
        s.push(vec![2, 2059]);
    }
    if !dtype.requires_2d() {
        s.extend([vec![77], vec![], vec![2, 3, 40], vec![4, 0]]);
    }
    s
}

/// Rigorous bound on the f32 error of a dot product (see the module doc).
fn tolerance(n: usize, abs_sum: f64) -> f64 {
    (n as f64 + 4.0) * (f32::EPSILON as f64 / 2.0) * abs_sum + (n as f64 + 4.0) * 1e-44
}

/// Exact product of decoded `w` ([rows, cols]) and `x` ([t, cols]) in f64, with Σ|w·x|.
fn reference(w: &[f32], rows: usize, cols: usize, x: &[f32], t: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(t * rows);
    for i in 0..t {
        for r in 0..rows {
            let (mut s, mut a) = (0.0f64, 0.0f64);
            for c in 0..cols {
                let p = w[r * cols + c] as f64 * x[i * cols + c] as f64;
                s += p;
                a += p.abs();
            }
            out.push((s, a));
        }
    }
    out
}

fn check(what: &str, got: &[f32], want: &[(f64, f64)], cols: usize) -> Result<(), String> {
    assert_eq!(got.len(), want.len());
    for (k, (&g, &(s, a))) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - s).abs();
        if err.is_nan() || err > tolerance(cols, a) {
            return Err(format!(
                "{what}: entry {k}: got {g}, exact {s} (error {err:e} > tolerance {:e})",
                tolerance(cols, a)
            ));
        }
    }
    Ok(())
}

fn encoded(dtype: DType, shape: &[u64], seed: u64) -> (Vec<u8>, Vec<f32>, Geom) {
    let g = geometry(dtype, shape).unwrap();
    let v = weights(g.rows, g.cols, seed);
    let opts = EncodeOptions {
        outlier_fraction: Some(0.01),
        ..Default::default()
    };
    let bytes = encode(dtype, shape, &v, &opts).unwrap();
    let w = decode(dtype, shape, &bytes).unwrap();
    (bytes, w, g)
}

#[test]
fn matvec_matches_decode_for_every_dtype_kernel_and_shape() {
    for dtype in WRITABLE {
        for (si, shape) in shapes(dtype).iter().enumerate() {
            let (bytes, w, g) = encoded(dtype, shape, 7 + si as u64);
            let x = activations(g.cols, si as u64);
            let want = reference(&w, g.rows, g.cols, &x, 1);
            for k in Kernel::available() {
                let mut m = Matrix::new(dtype, shape, &bytes).unwrap();
                m.set_kernel(k).unwrap();
                let mut y = vec![f32::NAN; g.rows];
                matvec(&m, &bytes, &x, &mut y);
                check(&format!("{dtype} {shape:?} {k:?}"), &y, &want, g.cols).unwrap();
            }
        }
    }
}

#[test]
fn matmul_is_t_matvecs_bit_for_bit() {
    for dtype in WRITABLE {
        for shape in [vec![5u64, 64], vec![13, 96], vec![6, 2080]] {
            let (bytes, w, g) = encoded(dtype, &shape, 99);
            for k in Kernel::available() {
                let mut m = Matrix::new(dtype, &shape, &bytes).unwrap();
                m.set_kernel(k).unwrap();
                for t in [1usize, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 30] {
                    let x = activations(t * g.cols, t as u64);
                    let mut y = vec![f32::NAN; t * g.rows];
                    matmul(&m, &bytes, &x, t, &mut y);
                    let what = format!("{dtype} {shape:?} {k:?} t={t}");
                    check(&what, &y, &reference(&w, g.rows, g.cols, &x, t), g.cols).unwrap();
                    for i in 0..t {
                        let mut yi = vec![f32::NAN; g.rows];
                        matvec(&m, &bytes, &x[i * g.cols..(i + 1) * g.cols], &mut yi);
                        let row = &y[i * g.rows..(i + 1) * g.rows];
                        let same = row.iter().zip(&yi).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{what}: token {i}: {row:?} vs matvec {yi:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_with_many_tokens_and_an_odd_pool() {
    // More tokens than one activation block (2080 cols → 32 tokens per block), rows not a
    // multiple of the task chunk, and a 3-thread pool.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for dtype in [DType::Q8Row, DType::Q4Block, DType::Vbit, DType::F16] {
        let shape = [37u64, 2080];
        let (bytes, w, g) = encoded(dtype, &shape, 5);
        let m = Matrix::new(dtype, &shape, &bytes).unwrap();
        let t = 71;
        let x = activations(t * g.cols, 3);
        let mut y = vec![f32::NAN; t * g.rows];
        pool.install(|| matmul(&m, &bytes, &x, t, &mut y));
        check(
            &format!("{dtype} t={t}"),
            &y,
            &reference(&w, g.rows, g.cols, &x, t),
            g.cols,
        )
        .unwrap();
    }
}

#[test]
fn simd_kernels_agree_with_the_scalar_reference() {
    // Both are within `tolerance` of the exact value, so within twice of each other; this
    // compares them directly on the hot dtypes, entry by entry.
    for dtype in WRITABLE {
        for shape in [vec![9u64, 96], vec![11, 2080]] {
            let (bytes, w, g) = encoded(dtype, &shape, 3);
            let x = activations(g.cols, 1);
            let abs = reference(&w, g.rows, g.cols, &x, 1);
            let mut scalar = Matrix::new(dtype, &shape, &bytes).unwrap();
            scalar.set_kernel(Kernel::Scalar).unwrap();
            let mut ys = vec![0.0; g.rows];
            matvec(&scalar, &bytes, &x, &mut ys);
            for k in Kernel::available() {
                let mut m = scalar.clone();
                m.set_kernel(k).unwrap();
                let mut y = vec![0.0; g.rows];
                matvec(&m, &bytes, &x, &mut y);
                for r in 0..g.rows {
                    let d = (y[r] as f64 - ys[r] as f64).abs();
                    let tol = 2.0 * tolerance(g.cols, abs[r].1);
                    assert!(d <= tol, "{dtype} {k:?} row {r}: {} vs {}", y[r], ys[r]);
                }
            }
        }
    }
}

#[test]
fn tolerance_catches_one_wrong_term() {
    // The check must fail when the product is off by one weight: drop, in the reference,
    // the term of the largest |w·x| of each row.
    let shape = [8u64, 2080];
    let (bytes, mut w, g) = encoded(DType::Q8Row, &shape, 11);
    let x = activations(g.cols, 2);
    let m = Matrix::new(DType::Q8Row, &shape, &bytes).unwrap();
    let mut y = vec![0.0; g.rows];
    matvec(&m, &bytes, &x, &mut y);
    check("intact", &y, &reference(&w, g.rows, g.cols, &x, 1), g.cols).unwrap();
    for r in 0..g.rows {
        let row = &mut w[r * g.cols..(r + 1) * g.cols];
        if let Some(c) = (0..g.cols)
            .filter(|&c| row[c] != 0.0 && x[c] != 0.0)
            .max_by(|&a, &b| (row[a] * x[a]).abs().total_cmp(&(row[b] * x[b]).abs()))
        {
            row[c] = 0.0;
        }
    }
    let want = reference(&w, g.rows, g.cols, &x, 1);
    let caught = (0..g.rows)
        .filter(|&r| check("damaged", &y[r..r + 1], &want[r..r + 1], g.cols).is_err())
        .count();
    // Row 1 is all zeros (nothing to drop); every other row must be caught.
    assert_eq!(caught, g.rows - 1);
}

#[test]
fn rows_decode_like_decode() {
    for dtype in WRITABLE {
        for shape in [vec![7u64, 96], vec![3, 2080]] {
            let (bytes, w, g) = encoded(dtype, &shape, 17);
            let m = Matrix::new(dtype, &shape, &bytes).unwrap();
            let mut row = vec![0.0; g.cols];
            for r in 0..g.rows {
                m.row(&bytes, r, &mut row);
                assert_eq!(row, w[r * g.cols..(r + 1) * g.cols], "{dtype} row {r}");
            }
        }
    }
}

#[test]
fn q1s_duplicate_overlay_entries_later_wins_in_products() {
    // Two entries for flat index 40 (row 1, col 8): the later one (3.0) wins.
    let v = vec![0.5f32; 64];
    let mut b = encode(DType::Q1, &[2, 32], &v, &EncodeOptions::default()).unwrap();
    b.extend_from_slice(&2u32.to_le_bytes());
    for (idx, val) in [(40u32, -7.0f32), (40, 3.0)] {
        b.extend_from_slice(&idx.to_le_bytes());
        b.extend_from_slice(&half::f16::from_f32(val).to_le_bytes());
    }
    let w = decode(DType::Q1s, &[2, 32], &b).unwrap();
    assert_eq!(w[40], 3.0);
    let m = Matrix::new(DType::Q1s, &[2, 32], &b).unwrap();
    let x = vec![1.0f32; 32];
    let mut y = vec![0.0; 2];
    matvec(&m, &b, &x, &mut y);
    assert_eq!(y, [16.0, 15.5 + 3.0]);
}
