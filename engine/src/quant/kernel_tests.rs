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
//!
//! The `Fast` path (activations quantized per group of 32, `d = absmax/127`, codes
//! rounded to nearest) moves each activation by at most `d/2`, so its error against the
//! exact product is at most `Σ|w|·d/2` on top of the f32 rounding: [`fast_bound`].

use super::kernel::Kernel;
use super::matrix::{matmul, matmul_with, matvec, matvec_with, Matrix, Precision};
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

/// `array_of` builds what `std::array::from_fn` does, in order, at several lengths (the
/// kernels' rows and tokens: 1, 2, 4; and an odd one), calling `f` once per element.
#[test]
fn array_of_equals_from_fn() {
    fn both<const N: usize>() {
        let mut calls = Vec::new();
        let got: [(usize, u64); N] = super::kernel::array_of(|i| {
            calls.push(i);
            (i, 3 * i as u64 + 7)
        });
        let want: [(usize, u64); N] = std::array::from_fn(|i| (i, 3 * i as u64 + 7));
        assert_eq!(got, want);
        assert_eq!(calls, (0..N).collect::<Vec<_>>());
    }
    both::<0>();
    both::<1>();
    both::<2>();
    both::<4>();
    both::<7>();
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
        // The integer row kernels (one level: no panels) take the tokens in blocks of at
        // most 32, resolved per task: every token's values are still its matvec's.
        if dtype == DType::F16 {
            continue;
        }
        let p = Precision::Fast;
        pool.install(|| matmul_with(&m, &bytes, &x, t, &mut y, p));
        for i in 0..t {
            let mut yi = vec![f32::NAN; g.rows];
            matvec_with(&m, &bytes, &x[i * g.cols..(i + 1) * g.cols], &mut yi, p);
            let row = &y[i * g.rows..(i + 1) * g.rows];
            assert_eq!(bits(row), bits(&yi), "{dtype} {p:?} t={t} token {i}");
        }
    }
}

#[test]
fn rows_longer_than_the_cache_blocks() {
    // 70 000 f32 columns: a row is larger than the 256 KiB that sizes task chunks and
    // activation blocks (both must stay ≥ 1), and both products still agree.
    for dtype in [DType::F32, DType::Q8Row] {
        let shape = [3u64, 70_000];
        let (bytes, w, g) = encoded(dtype, &shape, 8);
        let m = Matrix::new(dtype, &shape, &bytes).unwrap();
        let t = 3;
        let x = activations(t * g.cols, 6);
        let mut y = vec![f32::NAN; t * g.rows];
        matmul(&m, &bytes, &x, t, &mut y);
        let want = reference(&w, g.rows, g.cols, &x, t);
        check(&format!("{dtype} long rows"), &y, &want, g.cols).unwrap();
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

/// Dtypes with an integer (`Fast`) kernel.
const FAST: [DType; 7] = [
    DType::Q8Row,
    DType::Q8_2f,
    DType::Q4Block,
    DType::Q4Tiled,
    DType::Q4tp,
    DType::Vbit,
    DType::VbitRo,
];

/// What the `Fast` path multiplies: weights `w'` and activations `v` with `Σ w'·v` the
/// exact product. For `q8_2f`, `w' = q·scale` (read from the payload) and `v = col·x` in
/// f32 (the column field is folded into the activations); otherwise the decoded weights
/// and `x`.
fn fast_operands(
    dtype: DType,
    g: Geom,
    bytes: &[u8],
    w: &[f32],
    x: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    if dtype != DType::Q8_2f {
        return (w.to_vec(), x.to_vec());
    }
    let l = q8::Q8Layout::new(g);
    let col: Vec<f32> = (0..g.cols)
        .map(|c| rd_f16(bytes, l.col_field + 2 * c).unwrap())
        .collect();
    let mut wq = Vec::with_capacity(g.numel);
    for r in 0..g.rows {
        let s = rd_f16(bytes, l.scales + 2 * r).unwrap();
        wq.extend((0..g.cols).map(|c| bytes[r * g.cols + c] as i8 as f32 * s));
    }
    let t = x.len() / g.cols.max(1);
    let v = (0..t * g.cols).map(|k| x[k] * col[k % g.cols]).collect();
    (wq, v)
}

/// The integer precisions.
const INT_PRECISIONS: [Precision; 2] = [Precision::Fast, Precision::Balanced];

/// How far an activation may move under `p`, in units of its group's `d = absmax/127`:
/// half a step (`Fast`), or half a step of the residual level, `d/256`, at most a whole
/// one where the residual's code is clamped to 127 (`Balanced`).
fn step_error(p: Precision) -> f64 {
    match p {
        Precision::Fast => 0.5,
        Precision::Balanced => 1.0 / 256.0,
        Precision::Exact => 0.0,
    }
}

/// Per entry of `W'·V` (`v` is `[t, cols]`): the exact value, and the bound on the `Fast`
/// error: `Σ_k |w'_k|·d_k/2` (quantization, `d` the group's `absmax/127`, with a little
/// slack for the f32 `v·(127/absmax)`) plus the f32 [`tolerance`] of a sum of
/// `Σ|w'|·(|v| + d/2)` (the magnitude of the terms the kernel adds).
fn fast_bound(w: &[f32], rows: usize, cols: usize, v: &[f32], t: usize) -> Vec<(f64, f64)> {
    int_bound(w, rows, cols, v, t, Precision::Fast)
}

/// [`fast_bound`] for the integer precision `p` (see [`step_error`]).
fn int_bound(
    w: &[f32],
    rows: usize,
    cols: usize,
    v: &[f32],
    t: usize,
    p: Precision,
) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(t * rows);
    for j in 0..t {
        let x = &v[j * cols..(j + 1) * cols];
        let absmax = |g: &[f32]| g.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
        // Balanced takes one scale per token, Fast one per group.
        let d: Vec<f64> = if p == Precision::Balanced {
            vec![absmax(x); cols.div_ceil(32)]
        } else {
            x.chunks(32).map(absmax).collect()
        };
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let (mut exact, mut quant, mut mag) = (0f64, 0f64, 0f64);
            for c in 0..cols {
                let (a, b, h) = (wr[c] as f64, x[c] as f64, d[c / 32] * step_error(p));
                exact += a * b;
                quant += a.abs() * h * (1.0 + 1e-6);
                mag += a.abs() * (b.abs() + h);
            }
            out.push((exact, quant + tolerance(cols, mag)));
        }
    }
    out
}

fn fast_shapes(dtype: DType) -> Vec<Vec<u64>> {
    let mut s = vec![
        vec![1u64, 32],
        vec![5, 64],
        vec![9, 96],
        vec![67, 2080],
        vec![6, 4096],
    ];
    if !dtype.requires_cols_multiple_of_group() {
        s.extend([vec![5, 7], vec![9, 33], vec![13, 100], vec![3, 2059]]);
    }
    s
}

#[test]
fn int_paths_are_within_the_activation_quantization_bound() {
    for p in INT_PRECISIONS {
        for dtype in FAST {
            for (si, shape) in fast_shapes(dtype).iter().enumerate() {
                let (bytes, w, g) = encoded(dtype, shape, 40 + si as u64);
                let x = activations(g.cols, 70 + si as u64);
                let (wq, v) = fast_operands(dtype, g, &bytes, &w, &x);
                let want = int_bound(&wq, g.rows, g.cols, &v, 1, p);
                for k in Kernel::available() {
                    let mut m = Matrix::new(dtype, shape, &bytes).unwrap();
                    m.set_kernel(k).unwrap();
                    let mut y = vec![f32::NAN; g.rows];
                    matvec_with(&m, &bytes, &x, &mut y, p);
                    for (r, (&yv, &(e, b))) in y.iter().zip(&want).enumerate() {
                        let err = (yv as f64 - e).abs();
                        assert!(
                            err <= b,
                            "{p:?} {dtype} {shape:?} {k:?} row {r}: {yv} vs {e} (err {err:e} > {b:e})"
                        );
                    }
                }
            }
        }
    }
}

/// Activations whose every group holds one element 300× the others: the outliers of
/// real models' FFN inputs.
fn outlier_activations(n: usize, seed: u64) -> Vec<f32> {
    let mut x = activations(n, seed);
    for (g, chunk) in x.chunks_mut(32).enumerate() {
        let at = (g * 7) % chunk.len();
        chunk[at] = if g % 2 == 0 { 600.0 } else { -600.0 };
    }
    x
}

#[test]
fn balanced_keeps_the_rest_of_a_group_with_an_outlier() {
    // With one int8 level the other 31 elements of each group round to a few steps of
    // 600/127 ≈ 4.7, i.e. mostly to zero; the residual level keeps them. Balanced must be
    // within its bound, and Fast must miss that bound (the test can fail).
    for dtype in FAST {
        let shape = [21u64, 288];
        let (bytes, w, g) = encoded(dtype, &shape, 77);
        let x = outlier_activations(g.cols, 78);
        let (wq, v) = fast_operands(dtype, g, &bytes, &w, &x);
        let tight = int_bound(&wq, g.rows, g.cols, &v, 1, Precision::Balanced);
        for k in Kernel::available() {
            let mut m = Matrix::new(dtype, &shape, &bytes).unwrap();
            m.set_kernel(k).unwrap();
            let (mut yb, mut yf) = (vec![f32::NAN; g.rows], vec![f32::NAN; g.rows]);
            matvec_with(&m, &bytes, &x, &mut yb, Precision::Balanced);
            matvec_with(&m, &bytes, &x, &mut yf, Precision::Fast);
            let mut fast_misses = 0;
            for r in 0..g.rows {
                let (e, b) = tight[r];
                let err = (yb[r] as f64 - e).abs();
                assert!(
                    err <= b,
                    "{dtype} {k:?} row {r}: balanced err {err:e} > {b:e}"
                );
                fast_misses += usize::from((yf[r] as f64 - e).abs() > b);
            }
            assert!(
                fast_misses > g.rows / 2,
                "{dtype} {k:?}: fast within the tight bound"
            );
        }
    }
}

#[test]
fn fast_path_bound_is_tight_enough_to_fail() {
    // Activations rounded to 4 bits per group (`absmax/7`) instead of 8 must break the
    // bound: the check has teeth. (The bound is a worst case, linear in `cols`, while
    // random rounding errors grow like its square root, so this uses one group per row.)
    let shape = [16u64, 32];
    let (_, w, g) = encoded(DType::Q8Row, &shape, 1);
    let x = activations(g.cols, 9);
    let want = fast_bound(&w, g.rows, g.cols, &x, 1);
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 7.0;
    let coarse: Vec<f32> = x.iter().map(|v| (v / d).round() * d).collect();
    let got = reference(&w, g.rows, g.cols, &coarse, 1);
    let broken = (0..g.rows)
        .filter(|&r| (got[r].0 - want[r].0).abs() > want[r].1)
        .count();
    assert!(
        broken > 0,
        "4-bit activations should exceed the 8-bit bound"
    );
}

#[test]
fn int_simd_agrees_with_int_scalar_and_matmul_is_t_matvecs() {
    for p in INT_PRECISIONS {
        int_simd_agrees_with_int_scalar(p);
    }
}

fn int_simd_agrees_with_int_scalar(p: Precision) {
    for dtype in FAST {
        for shape in [
            vec![13u64, 96],
            vec![6, 2080],
            vec![5, 33],
            vec![9, 224],
            vec![11, 128],
        ] {
            if dtype.requires_cols_multiple_of_group() && shape[1] % 32 != 0 {
                continue;
            }
            let (bytes, w, g) = encoded(dtype, &shape, 23);
            let mut scalar = Matrix::new(dtype, &shape, &bytes).unwrap();
            scalar.set_kernel(Kernel::Scalar).unwrap();
            for t in [1usize, 2, 3, 5, 8, 9] {
                let x = activations(t * g.cols, 100 + t as u64);
                let (wq, v) = fast_operands(dtype, g, &bytes, &w, &x);
                // The magnitude of the terms the kernels add is the one-level bound's,
                // whatever `p` (the residual level moves values, not their size).
                let bound = fast_bound(&wq, g.rows, g.cols, &v, t);
                let mut ys = vec![0.0; t * g.rows];
                matmul_with(&scalar, &bytes, &x, t, &mut ys, p);
                for k in Kernel::available() {
                    let mut m = scalar.clone();
                    m.set_kernel(k).unwrap();
                    let mut y = vec![f32::NAN; t * g.rows];
                    matmul_with(&m, &bytes, &x, t, &mut y, p);
                    // Both compute the same exact integer group sums; they differ only in
                    // the f32 order of the per-group terms (magnitude ≤ the bound's).
                    let groups = g.cols.div_ceil(32);
                    for (e, (&a, &b)) in y.iter().zip(&ys).enumerate() {
                        let mag = bound[e].1 + bound[e].0.abs();
                        let tol = 2.0 * tolerance(groups + 8, mag * 4.0);
                        assert!(
                            (a as f64 - b as f64).abs() <= tol,
                            "{p:?} {dtype} {shape:?} {k:?} t={t} entry {e}: {a} vs scalar {b}"
                        );
                    }
                    // The packed panels add the group terms in another order (checked
                    // against the matvecs in `grouped_prefill_agrees_...`).
                    if super::panel::applies_to(&m, p == Precision::Balanced, t).is_some() {
                        assert!(k != Kernel::Scalar && p == Precision::Balanced);
                        continue;
                    }
                    for i in 0..t {
                        let mut yi = vec![f32::NAN; g.rows];
                        let xi = &x[i * g.cols..(i + 1) * g.cols];
                        matvec_with(&m, &bytes, xi, &mut yi, p);
                        let row = &y[i * g.rows..(i + 1) * g.rows];
                        let same = row.iter().zip(&yi).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{dtype} {k:?} t={t} token {i}: {row:?} vs {yi:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn int_paths_fall_back_to_exact_without_an_integer_kernel() {
    for dtype in [
        DType::F32,
        DType::Bf16,
        DType::Q1,
        DType::Q1s,
        DType::Q4Block,
    ] {
        // q4_block with cols % 32 != 0 has no integer kernel either.
        let shape = if dtype == DType::Q4Block {
            vec![5u64, 40]
        } else {
            vec![5, 64]
        };
        let (bytes, _, g) = encoded(dtype, &shape, 2);
        let m = Matrix::new(dtype, &shape, &bytes).unwrap();
        let x = activations(3 * g.cols, 4);
        let (mut a, mut b) = (vec![0.0; 3 * g.rows], vec![0.0; 3 * g.rows]);
        matmul(&m, &bytes, &x, 3, &mut a);
        for p in INT_PRECISIONS {
            matmul_with(&m, &bytes, &x, 3, &mut b, p);
            assert_eq!(a, b, "{p:?} {dtype}");
        }
    }
}

#[test]
fn precision_names_round_trip() {
    assert_eq!(Precision::default(), Precision::Balanced);
    for p in Precision::ALL {
        assert_eq!(Precision::parse(p.name()), Some(p));
    }
    assert_eq!(Precision::parse("int4"), None);
}

#[test]
fn balanced_row_scaled_sums_are_exact_and_do_not_overflow() {
    // All weights and activations at full scale: every product is the largest the codes
    // allow (127·32512), so a row's sum passes i32 from 17 groups on and lanes summing
    // many groups would wrap. Past two chunks of groups (4160 columns) the sum must still
    // be `cols`, and
    // every kernel must give the scalar's value bit for bit (the sums are exact).
    for dtype in [DType::Q8Row, DType::Q8_2f] {
        for cols in [96u64, 2080, 4160, 4133] {
            let shape = [5u64, cols];
            let ones = vec![1f32; (5 * cols) as usize];
            let bytes = encode(dtype, &shape, &ones, &EncodeOptions::default()).unwrap();
            // 3 tokens: the row kernels; 33: on AVX-512 VNNI the packed panels.
            for t in [3usize, 33] {
                let x = vec![1f32; t * cols as usize];
                let mut want: Option<Vec<u32>> = None;
                for k in Kernel::available() {
                    let mut m = Matrix::new(dtype, &shape, &bytes).unwrap();
                    m.set_kernel(k).unwrap();
                    let mut y = vec![f32::NAN; t * 5];
                    matmul_with(&m, &bytes, &x, t, &mut y, Precision::Balanced);
                    for v in &y {
                        assert!(
                            (*v as f64 - cols as f64).abs() <= 1e-3 * cols as f64,
                            "{dtype} {k:?} cols {cols}: {v}"
                        );
                    }
                    let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(*want.get_or_insert(bits.clone()), bits, "{dtype} {k:?}");
                }
            }
        }
    }
}

/// The `q8` prefill products at the default precision (from `panel`'s fewest tokens at each
/// level the packed-panel kernel) against one matrix-vector product per token, bit for
/// bit: rows across and short of a 32-row panel, columns not a multiple of 4 or 32, token
/// counts around the 6-token tile and across passes, all rows or a scattered subset.
#[test]
fn q8_prefill_equals_its_matvecs_bit_for_bit() {
    use super::matrix::{matmul_rows_with, matvec_rows_with};
    for dtype in [DType::Q8Row, DType::Q8_2f] {
        for shape in [
            vec![37u64, 70],
            vec![70, 96],
            vec![33, 2081],
            vec![64, 4133],
            vec![5, 7],
        ] {
            let (bytes, _, g) = encoded(dtype, &shape, 41);
            let subset: Vec<u32> = (0..g.rows as u32).filter(|r| r % 3 != 1).collect();
            for k in Kernel::available() {
                let mut m = Matrix::new(dtype, &shape, &bytes).unwrap();
                m.set_kernel(k).unwrap();
                for t in [2usize, 4, 8, 13, 16, 32, 37, 45] {
                    let x = activations(t * g.cols, 7 * t as u64);
                    let p = Precision::Balanced;
                    let mut y = vec![f32::NAN; t * g.rows];
                    matmul_with(&m, &bytes, &x, t, &mut y, p);
                    let mut ys = vec![f32::NAN; t * subset.len()];
                    matmul_rows_with(&m, &bytes, &x, t, &subset, &mut ys, p);
                    for i in 0..t {
                        let xi = &x[i * g.cols..(i + 1) * g.cols];
                        let mut yi = vec![f32::NAN; g.rows];
                        matvec_with(&m, &bytes, xi, &mut yi, p);
                        let row = &y[i * g.rows..(i + 1) * g.rows];
                        let what = format!("{dtype} {shape:?} {k:?} t={t} token {i}");
                        assert_eq!(bits(row), bits(&yi), "{what}");
                        let mut ysi = vec![f32::NAN; subset.len()];
                        matvec_rows_with(&m, &bytes, xi, &subset, &mut ysi, p);
                        let part = &ys[i * subset.len()..(i + 1) * subset.len()];
                        assert_eq!(bits(part), bits(&ysi), "{what}, a subset of rows");
                    }
                }
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `q4` and `vbit` prefill products at the default precision with enough tokens for the
/// packed-panel kernel (on AVX-512 VNNI; `q4` on AVX2 too): within the scalar reference's
/// f32 bound of it and of one matrix-vector product per token (the per-group terms are
/// added in another order), and within the activation-quantization bound of the exact
/// product; rows across and short of a panel, an odd number of groups, all rows or a
/// subset; `vbit` also built by hand, every width with codes over its whole range.
#[test]
fn grouped_prefill_agrees_with_its_matvecs_and_the_scalar_reference() {
    use super::matrix::matmul_rows_with;
    let p = Precision::Balanced;
    let mut cases = Vec::new();
    for dtype in [
        DType::Q4Block,
        DType::Q4Tiled,
        DType::Q4tp,
        DType::Vbit,
        DType::VbitRo,
    ] {
        for shape in [vec![37u64, 96], vec![70, 64], vec![33, 2080]] {
            let (bytes, w, _) = encoded(dtype, &shape, 77);
            cases.push((dtype, shape, bytes, w));
        }
    }
    for dtype in [DType::Vbit, DType::VbitRo] {
        for (si, shape) in [vec![37u64, 96], vec![45, 2080]].into_iter().enumerate() {
            let (rows, cols) = (shape[0] as usize, shape[1] as usize);
            let bytes = super::vbit_kernel::hostile_payload(dtype, rows, cols, 90 + si as u64);
            let w = decode(dtype, &shape, &bytes).unwrap();
            cases.push((dtype, shape, bytes, w));
        }
    }
    for (dtype, shape, bytes, w) in cases {
        let g = geometry(dtype, &shape).unwrap();
        let subset: Vec<u32> = (0..g.rows as u32).filter(|r| r % 4 != 2).collect();
        let mut scalar = Matrix::new(dtype, &shape, &bytes).unwrap();
        scalar.set_kernel(Kernel::Scalar).unwrap();
        // From the fewest tokens the panels take (on AVX2 `vbit` from 12: below, the row
        // kernels, held to the same bounds), through partial and whole 6-token tiles (on
        // AVX2 4-token ones: 13, 14 and 23 end in tiles of 1, 2 and 3).
        for t in [super::panel::Q4_MIN_TOKENS, 5, 13, 14, 16, 23, 40] {
            let x = activations(t * g.cols, 300 + t as u64);
            let bound = int_bound(&w, g.rows, g.cols, &x, t, p);
            // The size of the terms the kernels add: the one-level bound's.
            let size = fast_bound(&w, g.rows, g.cols, &x, t);
            let mut ys = vec![0.0; t * g.rows];
            matmul_with(&scalar, &bytes, &x, t, &mut ys, p);
            let groups = g.cols / 32;
            let mut avx2_bits = None;
            for k in Kernel::available() {
                let mut m = scalar.clone();
                m.set_kernel(k).unwrap();
                let mut y = vec![f32::NAN; t * g.rows];
                matmul_with(&m, &bytes, &x, t, &mut y, p);
                // AVX-VNNI's panels sum the same group integers as AVX2's.
                match k {
                    Kernel::Avx2 => avx2_bits = Some(bits(&y)),
                    Kernel::AvxVnni => assert!(
                        avx2_bits == Some(bits(&y)),
                        "{dtype} {shape:?} t={t}: avxvnni vs avx2"
                    ),
                    _ => {}
                }
                let mut yv = vec![f32::NAN; t * g.rows];
                for i in 0..t {
                    let xi = &x[i * g.cols..(i + 1) * g.cols];
                    matvec_with(&m, &bytes, xi, &mut yv[i * g.rows..(i + 1) * g.rows], p);
                }
                let mut yp = vec![f32::NAN; t * subset.len()];
                matmul_rows_with(&m, &bytes, &x, t, &subset, &mut yp, p);
                for e in 0..t * g.rows {
                    let (exact, quant) = bound[e];
                    let tol = 2.0 * tolerance(groups + 8, (size[e].1 + exact.abs()) * 4.0);
                    let what = format!("{dtype} {shape:?} {k:?} t={t} entry {e}");
                    assert!(
                        (y[e] as f64 - ys[e] as f64).abs() <= tol,
                        "{what}: {} vs scalar {}",
                        y[e],
                        ys[e]
                    );
                    assert!(
                        (y[e] as f64 - yv[e] as f64).abs() <= tol,
                        "{what}: {} vs matvec {}",
                        y[e],
                        yv[e]
                    );
                    assert!(
                        (y[e] as f64 - exact).abs() <= quant,
                        "{what}: {} vs exact {exact}",
                        y[e]
                    );
                    let (j, r) = (e / g.rows, e % g.rows);
                    if let Ok(s) = subset.binary_search(&(r as u32)) {
                        let got = yp[j * subset.len() + s];
                        assert_eq!(got.to_bits(), y[e].to_bits(), "{what}: a subset of rows");
                    }
                }
            }
        }
    }
}

/// `vbit` payloads built by hand ([`super::vbit_kernel::hostile_payload`]: every width,
/// codes over the whole range, the 8-bit `u = 255` the encoder never writes): every
/// precision and kernel against the exact product of the decoded weights, the SIMD
/// kernels against the scalar one, and `matmul` against its `matvec`s bit for bit.
#[test]
fn vbit_products_on_every_width_and_code() {
    for dtype in [DType::Vbit, DType::VbitRo] {
        for (si, &(rows, cols)) in [(5usize, 32usize), (9, 96), (13, 160), (7, 2080)]
            .iter()
            .enumerate()
        {
            let shape = [rows as u64, cols as u64];
            let bytes = super::vbit_kernel::hostile_payload(dtype, rows, cols, 50 + si as u64);
            let w = decode(dtype, &shape, &bytes).unwrap();
            let t = 3;
            let x = activations(t * cols, 60 + si as u64);
            let scalar = {
                let mut m = Matrix::new(dtype, &shape, &bytes).unwrap();
                m.set_kernel(Kernel::Scalar).unwrap();
                m
            };
            for p in Precision::ALL {
                let want = match p {
                    Precision::Exact => reference(&w, rows, cols, &x, t),
                    _ => int_bound(&w, rows, cols, &x, t, p),
                };
                let mut ys = vec![f32::NAN; t * rows];
                matmul_with(&scalar, &bytes, &x, t, &mut ys, p);
                for k in Kernel::available() {
                    let mut m = scalar.clone();
                    m.set_kernel(k).unwrap();
                    let mut y = vec![f32::NAN; t * rows];
                    matmul_with(&m, &bytes, &x, t, &mut y, p);
                    let what = format!("{dtype} {shape:?} {p:?} {k:?}");
                    if p == Precision::Exact {
                        check(&what, &y, &want, cols).unwrap();
                    } else {
                        for (e, (&yv, &(exact, b))) in y.iter().zip(&want).enumerate() {
                            let err = (yv as f64 - exact).abs();
                            assert!(
                                err <= b,
                                "{what} entry {e}: {yv} vs {exact} ({err:e} > {b:e})"
                            );
                            // The same exact integer group sums as the scalar kernel, in
                            // another f32 order.
                            let tol = 2.0 * tolerance(cols / 32 + 8, 4.0 * (b + exact.abs()));
                            assert!(
                                (yv as f64 - ys[e] as f64).abs() <= tol,
                                "{what} entry {e}: {yv} vs scalar {}",
                                ys[e]
                            );
                        }
                    }
                    for i in 0..t {
                        let mut yi = vec![f32::NAN; rows];
                        matvec_with(&m, &bytes, &x[i * cols..(i + 1) * cols], &mut yi, p);
                        assert_eq!(
                            bits(&y[i * rows..(i + 1) * rows]),
                            bits(&yi),
                            "{what} token {i}"
                        );
                    }
                }
            }
        }
    }
}

/// `matvec_multi` of parts that cannot share one quantization (`q8_2f` folds its own
/// column field into the activations, `q4_block` takes another order, `f16` none), one of
/// them on a task mask's rows: each part equals its own `matvec`, bit for bit, at every
/// precision and level (96 columns, row counts that split unevenly).
#[test]
fn matvec_multi_of_parts_quantized_apart() {
    use super::matrix::{matvec_multi, matvec_rows_with, MatvecPart};
    let cols = 96usize;
    let dtypes = [DType::Q8_2f, DType::Q8_2f, DType::Q4Block, DType::F16];
    let rows = [37usize, 11, 19, 7];
    let payloads: Vec<Vec<u8>> = dtypes
        .iter()
        .zip(rows)
        .enumerate()
        .map(|(i, (&d, r))| {
            let w = activations(r * cols, 90 + i as u64);
            encode(d, &[r as u64, cols as u64], &w, &EncodeOptions::default()).unwrap()
        })
        .collect();
    let x = activations(cols, 7);
    let live: Vec<u32> = (0..19).filter(|r| r % 3 != 1).collect();
    for k in Kernel::available() {
        let ms: Vec<Matrix> = dtypes
            .iter()
            .zip(rows)
            .zip(&payloads)
            .map(|((&d, r), b)| {
                let mut m = Matrix::new(d, &[r as u64, cols as u64], b).unwrap();
                m.set_kernel(k).unwrap();
                m
            })
            .collect();
        for p in Precision::ALL {
            let mut ys: Vec<Vec<f32>> = rows.iter().map(|&r| vec![f32::NAN; r]).collect();
            ys[2] = vec![f32::NAN; live.len()];
            {
                let mut it = ys.iter_mut();
                let mut parts: Vec<MatvecPart> = ms
                    .iter()
                    .zip(&payloads)
                    .enumerate()
                    .map(|(i, (m, b))| MatvecPart {
                        m,
                        bytes: b,
                        rows: (i == 2).then_some(&live[..]),
                        y: it.next().unwrap(),
                    })
                    .collect();
                matvec_multi(&mut parts, &x, p);
            }
            for (i, ((m, b), y)) in ms.iter().zip(&payloads).zip(&ys).enumerate() {
                let mut alone = vec![f32::NAN; y.len()];
                if i == 2 {
                    matvec_rows_with(m, b, &x, &live, &mut alone, p);
                } else {
                    matvec_with(m, b, &x, &mut alone, p);
                }
                assert_eq!(bits(y), bits(&alone), "{k:?} {p:?} part {i} ({})", m.dtype);
            }
        }
    }
}

/// `matmul_each` of jobs where runs share one input (a MoE expert's gate and up, a decode
/// step's experts reading one token), beside jobs whose same input must be quantized apart
/// (another dtype, `q8_2f`'s column field): each job equals its own `matmul_with`, bit for
/// bit, at every precision and level, in a prefill-like call (3 and 5 tokens: the row
/// kernels and the panels) and a decode-like one (one token: the flat loop), from inside
/// the engine's pool as a forward pass calls it.
#[test]
fn matmul_each_with_shared_inputs_equals_each_alone() {
    use super::matrix::{matmul_each, MatmulJob};
    let cols = 96usize;
    let specs: [(DType, usize, usize); 7] = [
        // (dtype, rows, input): inputs 0 and 1 have 5 and 3 tokens.
        (DType::Q4Block, 37, 0),
        (DType::Q4Block, 19, 0),
        (DType::Q8Row, 11, 0),
        (DType::Q8_2f, 13, 0),
        (DType::Q8_2f, 13, 0),
        (DType::Q4Tiled, 23, 1),
        (DType::Q4Tiled, 7, 1),
    ];
    let payloads: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, &(d, r, _))| {
            let w = activations(r * cols, 300 + i as u64);
            encode(d, &[r as u64, cols as u64], &w, &EncodeOptions::default()).unwrap()
        })
        .collect();
    let prefill = [activations(5 * cols, 31), activations(3 * cols, 32)];
    let decode = [activations(cols, 33), activations(cols, 33)];
    for k in Kernel::available() {
        let ms: Vec<Matrix> = specs
            .iter()
            .zip(&payloads)
            .map(|(&(d, r, _), b)| {
                let mut m = Matrix::new(d, &[r as u64, cols as u64], b).unwrap();
                m.set_kernel(k).unwrap();
                m
            })
            .collect();
        for p in Precision::ALL {
            for xs in [&prefill, &decode] {
                let tokens = |i: usize| xs[specs[i].2].len() / cols;
                let mut ys: Vec<Vec<f32>> = (0..specs.len())
                    .map(|i| vec![f32::NAN; tokens(i) * specs[i].1])
                    .collect();
                {
                    let mut jobs: Vec<MatmulJob> = ys
                        .iter_mut()
                        .enumerate()
                        .map(|(i, y)| MatmulJob {
                            m: &ms[i],
                            bytes: &payloads[i],
                            x: &xs[specs[i].2],
                            t: tokens(i),
                            y,
                        })
                        .collect();
                    crate::exec::step(|| matmul_each(&mut jobs, p));
                }
                for (i, y) in ys.iter().enumerate() {
                    let mut alone = vec![f32::NAN; y.len()];
                    matmul_with(
                        &ms[i],
                        &payloads[i],
                        &xs[specs[i].2],
                        tokens(i),
                        &mut alone,
                        p,
                    );
                    assert_eq!(
                        bits(y),
                        bits(&alone),
                        "{k:?} {p:?} job {i} ({}, {} tokens)",
                        ms[i].dtype,
                        tokens(i)
                    );
                }
            }
        }
    }
}

/// A `vbit` row whose last step is partial reads the scales that follow its own (the next
/// row's, or the packed codes after the last row's) and must mask them: here they are f16
/// NaNs and infinities, which `0 ×` would turn into NaN. Rows before a non-finite row
/// stay finite and equal the scalar kernel's; the 4-bit row (nibble-pair path) and the
/// 3-bit one both end in a partial step (96 columns: 3 groups).
#[test]
fn vbit_partial_steps_mask_the_scales_that_follow() {
    for dtype in [DType::Vbit, DType::VbitRo] {
        let (rows, cols) = (5usize, 96usize);
        let shape = [rows as u64, cols as u64];
        let mut bytes = super::vbit_kernel::hostile_payload(dtype, rows, cols, 77);
        let gpr = cols / 32;
        // Rows 0..5 have widths 3, 4, 5, 6, 8; rows 1, 3 and 4 get non-finite scales.
        for (r, bits) in [(1usize, 0x7E00u16), (3, 0x7C00), (4, 0xFC00)] {
            for g in 0..gpr {
                let at = rows + 2 * (r * gpr + g);
                bytes[at..at + 2].copy_from_slice(&bits.to_le_bytes());
            }
        }
        let x = activations(cols, 5);
        let p = Precision::Balanced;
        let scalar = {
            let mut m = Matrix::new(dtype, &shape, &bytes).unwrap();
            m.set_kernel(Kernel::Scalar).unwrap();
            m
        };
        let mut want = vec![f32::NAN; rows];
        matvec_with(&scalar, &bytes, &x, &mut want, p);
        for k in Kernel::available() {
            let mut m = scalar.clone();
            m.set_kernel(k).unwrap();
            let mut y = vec![f32::NAN; rows];
            matvec_with(&m, &bytes, &x, &mut y, p);
            for r in [0usize, 2] {
                assert!(y[r].is_finite(), "{dtype} {k:?} row {r}: {}", y[r]);
                let tol = 1e-4 * (1.0 + want[r].abs());
                assert!(
                    (y[r] - want[r]).abs() <= tol,
                    "{dtype} {k:?} row {r}: {} vs {}",
                    y[r],
                    want[r]
                );
            }
        }
    }
}

/// The hand-written AVX2 and AVX-512 quantizers give the scalar body's codes, scales and offset
/// lanes bit for bit: every order, one and two levels, rows with a partial last group,
/// outliers, zero, subnormal, infinite and NaN groups.
#[cfg(target_arch = "x86_64")]
#[test]
fn quantize_simd_equals_the_scalar_body() {
    use super::kernel::{quantize_token_avx2, quantize_token_avx512};
    use super::kernel::{quantize_token_body, ActOrder, TokenCodes, STEP};
    let levels: Vec<Kernel> = [Kernel::Avx2, Kernel::Avx512]
        .into_iter()
        .filter(|k| k.is_available())
        .collect();
    if levels.is_empty() {
        eprintln!("no AVX2 on this CPU: only the scalar quantizer runs here");
        return;
    }
    let mut rng = crate::synth::Rng::new(0x9e37);
    let mut checked = 0;
    for len in [1usize, 5, 31, 32, 33, 64, 96, 100, 576, 577, 1000] {
        for case in 0..6 {
            let mut x: Vec<f32> = (0..len).map(|_| rng.normal() * 0.3).collect();
            match case {
                1 => x[len / 2] = 40.0,
                2 => x[..len.min(32)].fill(0.0),
                3 => x.iter_mut().for_each(|v| *v *= 1e-39),
                4 => x[len - 1] = f32::INFINITY,
                5 => x[0] = f32::NAN,
                _ => {}
            }
            for order in [
                ActOrder::Natural,
                ActOrder::NaturalOffset,
                ActOrder::NibblePairs,
            ] {
                for split in [false, true] {
                    let groups = len.div_ceil(STEP);
                    let wide = split;
                    let run = |simd: Kernel| {
                        let mut q = vec![0i8; groups * STEP];
                        let mut q2 = vec![0i8; if split { groups * STEP } else { 0 }];
                        let mut k = vec![0i16; if wide { groups * STEP } else { 0 }];
                        let mut d = vec![0f32; groups];
                        let mut c = vec![0i32; groups * 8];
                        let mut c2 = vec![0i32; if split { groups * 8 } else { 0 }];
                        let out = TokenCodes {
                            q: &mut q,
                            q2: &mut q2,
                            k: &mut k,
                            d: &mut d,
                            c: &mut c,
                            c2: &mut c2,
                        };
                        match simd {
                            // SAFETY: each level is in `levels` only where the CPU has
                            // it; buffers sized as `fill` does.
                            Kernel::Avx512 => unsafe {
                                quantize_token_avx512(&x, order, split, out)
                            },
                            Kernel::Avx2 | Kernel::AvxVnni => unsafe {
                                quantize_token_avx2(&x, order, split, out)
                            },
                            Kernel::Scalar | Kernel::Neon => {
                                quantize_token_body(&x, order, split, out)
                            }
                        }
                        let d: Vec<u32> = d.iter().map(|v| v.to_bits()).collect();
                        (q, q2, k, d, c, c2)
                    };
                    let scalar = run(Kernel::Scalar);
                    for &level in &levels {
                        assert!(
                            run(level) == scalar,
                            "{level:?}: len {len}, case {case}, {order:?}, split {split}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, 11 * 6 * 3 * 2 * levels.len());
}

/// The block conversion of row scales equals the scalar one on every f16 bit pattern
/// (NaNs as NaNs): 8 consecutive rows (one load), 8 rows out of order and 3 rows.
#[test]
fn f16_block_conversion_equals_the_scalar_one() {
    use super::kernel::{f16_scales, h2f_scalar};
    let bytes: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for base in (0..=u16::MAX as usize).step_by(8) {
        let at = 2 * (base % 3);
        let rs: [usize; 8] = std::array::from_fn(|i| (base + i).min(65535 - 3));
        let shuffled: [usize; 8] = std::array::from_fn(|i| rs[(i * 3) % 8]);
        let three = [rs[0], rs[5], rs[2]];
        let check = |rs: &[usize], got: &[f32]| {
            for (&r, &f) in rs.iter().zip(got) {
                let want = h2f_scalar(u16::from_le_bytes([
                    bytes[at + 2 * r],
                    bytes[at + 2 * r + 1],
                ]));
                assert!(same(f, want), "row {r} at {at}");
            }
        };
        check(&rs, &f16_scales(&bytes, at, &rs));
        check(&shuffled, &f16_scales(&bytes, at, &shuffled));
        check(&three, &f16_scales(&bytes, at, &three));
    }
}

/// Two-level products of few tokens sum the int16 codes (`nibble_pairs_avx2`, and with
/// AVX-512 VNNI `nibble_pairs_avx512`); the others (tokens quantized without them) dot
/// both byte levels (`int_step`, `int_body512`). All form the scalar reference's exact
/// group integers, so they agree within the f32 bound of the per-group terms, at each
/// level the CPU has, over every `q4` layout, odd and even numbers of groups, and a
/// partial row block's worth of tokens. A kernel that dropped the `−8·Σk` start, or
/// paired a weight with the wrong activation, fails.
#[test]
fn two_level_products_agree_with_and_without_int16_codes() {
    use super::kernel::{run_int, ActOrder, IntRows, QuantizedActs};
    use super::q4::{Q4Rows, Q4tpRows};
    if !Kernel::Avx2.is_available() {
        eprintln!("no AVX2 on this CPU: the int16 kernel does not run here");
        return;
    }
    fn product<D: IntRows, const T: usize>(
        k: Kernel,
        d: &D,
        x: &[f32],
        cols: usize,
        int16: bool,
    ) -> [[f32; T]; 8] {
        let mut qa = QuantizedActs::default();
        qa.fill(x, T, cols, None, ActOrder::NibblePairs, true, int16);
        let xs = std::array::from_fn(|j| qa.token(j));
        let mut out = [[f32::NAN; T]; 8];
        run_int::<D, 8, T>(k, d, &xs, &mut out);
        out
    }
    fn agree<D: IntRows, const T: usize>(what: &str, d: &D, w: &[f32], g: Geom, rs: [usize; 8]) {
        let x = activations(T * g.cols, 31 + T as u64);
        let scalar = product::<D, T>(Kernel::Scalar, d, &x, g.cols, false);
        let wr: Vec<f32> = rs
            .iter()
            .flat_map(|&r| w[r * g.cols..(r + 1) * g.cols].to_vec())
            .collect();
        let bound = int_bound(&wr, 8, g.cols, &x, T, Precision::Balanced);
        let levels = [Kernel::Avx2, Kernel::Avx512]
            .into_iter()
            .filter(|k| k.is_available());
        for (level, int16) in levels.flat_map(|k| [(k, false), (k, true)]) {
            let simd = product::<D, T>(level, d, &x, g.cols, int16);
            for (i, (a, b)) in simd.iter().zip(&scalar).enumerate() {
                for (j, (&a, &b)) in a.iter().zip(b).enumerate() {
                    let (exact, err) = bound[j * 8 + i];
                    // Each sum rounds its per-group (or per-lane) terms, whose magnitudes
                    // add up to about Σ|w·x| (the quantized activations within 1% of
                    // `x`): a bound on a cancelling sum, which its own size is not. The
                    // 16-lane kernels add a reduction of 16 lanes and one of 8.
                    let mag: f64 = (0..g.cols)
                        .map(|c| (wr[i * g.cols + c] as f64 * x[j * g.cols + c] as f64).abs())
                        .sum();
                    let tol = 2.0 * tolerance(g.cols / 32 + 24, 1.01 * mag + err);
                    assert!(
                        (a as f64 - b as f64).abs() <= tol,
                        "{what} {level:?} int16 {int16} row {i} token {j}: {a} vs scalar {b}"
                    );
                    // And both near the exact product (the quantization bound).
                    assert!(
                        (a as f64 - exact).abs() <= err,
                        "{what}: {a} vs exact {exact}"
                    );
                }
            }
        }
    }
    for cols in [96u64, 160, 192, 2080] {
        for dtype in [DType::Q4Block, DType::Q4Tiled, DType::Q4tp] {
            let shape = [11u64, cols];
            let (bytes, w, g) = encoded(dtype, &shape, 41 + cols);
            let rs = [10, 0, 3, 4, 5, 9, 7, 1];
            let what = format!("{dtype} {shape:?}");
            match dtype {
                DType::Q4Block => {
                    let d = Q4Rows::<8, false>::new_at(g, &bytes, rs);
                    agree::<_, 1>(&what, &d, &w, g, rs);
                    agree::<_, 3>(&what, &d, &w, g, rs);
                }
                DType::Q4Tiled => {
                    let d = Q4Rows::<8, true>::new_at(g, &bytes, rs);
                    agree::<_, 1>(&what, &d, &w, g, rs);
                    agree::<_, 3>(&what, &d, &w, g, rs);
                }
                _ => {
                    let d = Q4tpRows::<8>::new_at(g, &bytes, rs);
                    agree::<_, 1>(&what, &d, &w, g, rs);
                    agree::<_, 3>(&what, &d, &w, g, rs);
                }
            }
        }
    }
}
