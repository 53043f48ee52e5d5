//! Tests of the `q1t` kernels ([`super::q1t_kernel`]): every kernel this CPU runs, every
//! precision, against the scalar reference and against decode-then-dot, on payloads
//! built by hand (every byte value, the non-canonical 243..=255 included; random finite
//! f16 scales of every magnitude and sign; rows with and without overlay entries,
//! repeated columns) and by the encoder, on awkward shapes (cols 32, 96, 160, 576, 928;
//! rows not multiples of 4).
//!
//! Tolerances are rigorous bounds, as in `kernel_tests`: a sum of `m` f32 terms is within
//! `m·2⁻²⁴·Σ|term|` of the exact value. `Exact` adds, per row, the base products (each
//! weight as decoded: `0` or `±s`) and, per overlay entry, `(value − base)·x` (two more
//! roundings); so the bound is `(n + 4 + 3·entries)·2⁻²⁴·M` with `M = Σ|base·x| +
//! Σ_entries (|value·x| + 2·|base·x|)`. `Fast` is the same sum over the dequantized
//! activations `x̂ = q·d` (exact integer group dots, scaled by `s·d`), so it is checked
//! against `Σ w·x̂` with the same bound; `Balanced` likewise with `x̂ = (256·q + q₂)·d'`.
//!
//! Speed is measured by the example `q1t_speed` (see there), not here.

use super::kernel::{ActOrder, IntRowsScalar, Kernel, QuantizedActs, RowsScalar};
use super::matrix::{
    matmul_rows_with, matmul_with, matvec_multi, matvec_rows_with, matvec_with, planes_run_on,
    q1t_overlay, Matrix, MatvecPart, Precision,
};
use super::q1t_kernel::{Q1tRows, DIV};
use super::*;
use half::f16;

/// The tests' draws, from the crate's deterministic xorshift ([`crate::synth::Rng`]).
struct Rng(crate::synth::Rng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(crate::synth::Rng::new(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        2.0 * self.0.unit() - 1.0
    }
    /// Random finite f16 bits: every exponent (subnormals and zero included), both signs.
    fn f16_bits(&mut self) -> u16 {
        loop {
            let b = self.next() as u16;
            if f16::from_bits(b).is_finite() {
                return b;
            }
        }
    }
}

/// How many overlay entries the rows of a hand-made payload get.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Overlay {
    None,
    /// 0–3 per row (some rows none), distinct columns.
    Some,
    /// As `Some`, plus repeated columns (the later entry wins).
    Repeats,
    /// Up to 40 per row (several 16-entry chunks of the SIMD overlay), with repeats.
    Dense,
}

/// A `q1t` payload built by hand: random bytes (all 256 values), random finite scales,
/// and an overlay per `ov`. Group 0 of row 0 holds the non-canonical bytes 243..=249.
fn payload(rows: usize, cols: usize, ov: Overlay, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed | 1);
    let mut b = Vec::new();
    for g in 0..rows * cols / 32 {
        b.extend_from_slice(&rng.f16_bits().to_le_bytes());
        for j in 0..7 {
            b.push(if g == 0 { 243 + j } else { rng.next() as u8 });
        }
    }
    let mut entries: Vec<Vec<(u16, u16)>> = vec![Vec::new(); rows];
    if ov != Overlay::None {
        for (r, e) in entries.iter_mut().enumerate() {
            let n = match (ov, r % 3) {
                (_, 1) => 0,
                (Overlay::Dense, _) => 1 + rng.below(40),
                _ => 1 + rng.below(3),
            };
            let mut cols_used = Vec::new();
            while cols_used.len() < n.min(cols) {
                let c = rng.below(cols) as u16;
                if !cols_used.contains(&c) {
                    cols_used.push(c);
                }
            }
            for &c in &cols_used {
                let v = f16::from_f32(rng.unit() * 8.0).to_bits();
                e.push((c, v));
            }
            if matches!(ov, Overlay::Repeats | Overlay::Dense) && !cols_used.is_empty() {
                // Repeat a column (the later value must win), once or twice.
                for _ in 0..1 + rng.below(2) {
                    let c = cols_used[rng.below(cols_used.len())];
                    e.push((c, f16::from_f32(rng.unit() * 8.0).to_bits()));
                }
            }
        }
    }
    let mut ptr = 0u32;
    for e in &entries {
        b.extend_from_slice(&ptr.to_le_bytes());
        ptr += e.len() as u32;
    }
    b.extend_from_slice(&ptr.to_le_bytes());
    for e in entries.iter().flatten() {
        b.extend_from_slice(&e.0.to_le_bytes());
        b.extend_from_slice(&e.1.to_le_bytes());
    }
    validate(DType::Q1t, &[rows as u64, cols as u64], &b).unwrap();
    b
}

/// Activations: roughly normal, some exact zeros, one large value per 97.
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed ^ 0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|i| match rng.below(11) {
            0 => 0.0,
            _ if i % 97 == 5 => 40.0 * rng.unit(),
            _ => (rng.unit() + rng.unit() + rng.unit()) * 1.5,
        })
        .collect()
}

/// Base values (overlay ignored) and overlay entries `(col, value)` of row `r` that
/// `decode` applies (the last of each column).
fn base_and_overlay(g: Geom, b: &[u8], r: usize) -> (Vec<f32>, Vec<(usize, f32)>) {
    let l = q1::validate_q1t(g, b).unwrap();
    let mut base = vec![0.0; g.cols];
    let d = Q1tRows::<1>::new_at(g, b, [r]);
    let mut w = [0f32; 32];
    for blk in 0..g.cols / 32 {
        d.decode32(0, blk, &mut w);
        base[blk * 32..(blk + 1) * 32].copy_from_slice(&w);
    }
    let rd = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    let (lo, hi) = (rd(l.row_ptr + 4 * r), rd(l.row_ptr + 4 * r + 4));
    let mut ov: Vec<(usize, f32)> = Vec::new();
    for e in lo..hi {
        let at = l.entries + 4 * e;
        let col = u16::from_le_bytes([b[at], b[at + 1]]) as usize;
        let v = f16::from_le_bytes([b[at + 2], b[at + 3]]).to_f32();
        ov.retain(|&(c, _)| c != col);
        ov.push((col, v));
    }
    (base, ov)
}

/// Per (token, row) of `x` (`[t, cols]`): the exact product with the decoded weights and
/// the rigorous f32 bound of the module doc.
fn reference(g: Geom, b: &[u8], x: &[f32], t: usize) -> Vec<(f64, f64)> {
    let w = decode(DType::Q1t, &[g.rows as u64, g.cols as u64], b).unwrap();
    let rows: Vec<_> = (0..g.rows).map(|r| base_and_overlay(g, b, r)).collect();
    let all_entries = |r: usize| {
        let l = q1::validate_q1t(g, b).unwrap();
        let rd = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
        rd(l.row_ptr + 4 * r + 4) - rd(l.row_ptr + 4 * r)
    };
    let mut out = Vec::with_capacity(t * g.rows);
    for j in 0..t {
        let xj = &x[j * g.cols..(j + 1) * g.cols];
        for (r, (base, ov)) in rows.iter().enumerate() {
            let exact: f64 = (0..g.cols)
                .map(|c| w[r * g.cols + c] as f64 * xj[c] as f64)
                .sum();
            let mut mag: f64 = (0..g.cols).map(|c| (base[c] * xj[c]).abs() as f64).sum();
            for &(c, v) in ov {
                mag += (v * xj[c]).abs() as f64 + 2.0 * (base[c] * xj[c]).abs() as f64;
            }
            let m = (g.cols + 4 + 3 * all_entries(r)) as f64;
            out.push((exact, m * (f32::EPSILON as f64 / 2.0) * mag + m * 1e-44));
        }
    }
    out
}

/// The activations the integer paths of precision `p` multiply: `q·d` per group of 32
/// (`Fast`), `(256·q + q₂)·d'` (`Balanced`, `d' = d/256`); `x` itself for `Exact`.
fn dequantized(x: &[f32], t: usize, cols: usize, p: Precision) -> Vec<f32> {
    if p == Precision::Exact {
        return x.to_vec();
    }
    let split = p == Precision::Balanced;
    let mut qa = QuantizedActs::default();
    qa.fill(x, t, cols, None, ActOrder::Natural, split, true);
    (0..t)
        .flat_map(|j| {
            let tk = qa.token(j);
            (0..cols)
                .map(|c| {
                    let q2 = if split { tk.q2[c] as i32 } else { 0 };
                    let v = if split {
                        256 * tk.q[c] as i32 + q2
                    } else {
                        tk.q[c] as i32
                    };
                    v as f32 * tk.d[c / 32]
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn check(what: &str, got: &[f32], want: &[(f64, f64)]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (e, (&y, &(v, tol))) in got.iter().zip(want).enumerate() {
        let err = (y as f64 - v).abs();
        assert!(
            err <= tol,
            "{what}: entry {e}: got {y}, exact {v} (error {err:e} > bound {tol:e})"
        );
    }
}

/// `got` against another computation `other` of the same values `want`: both within the
/// bound of the same value, so within twice of each other.
fn check_near(what: &str, got: &[f32], other: &[f32], want: &[(f64, f64)]) {
    let twice: Vec<_> = other
        .iter()
        .zip(want)
        .map(|(&v, &(_, tol))| (v as f64, 2.0 * tol))
        .collect();
    check(what, got, &twice);
}

fn matrix(g: Geom, b: &[u8], k: Kernel) -> Matrix {
    let mut m = Matrix::new(DType::Q1t, &[g.rows as u64, g.cols as u64], b).unwrap();
    m.set_kernel(k).unwrap();
    m
}

fn geom(rows: usize, cols: usize) -> Geom {
    Geom {
        numel: rows * cols,
        rows,
        cols,
    }
}

const COLS: [usize; 5] = [32, 96, 160, 576, 896 + 32];
const ROWS: [usize; 6] = [1, 3, 5, 7, 13, 67];
const OVERLAYS: [Overlay; 4] = [
    Overlay::None,
    Overlay::Some,
    Overlay::Repeats,
    Overlay::Dense,
];

#[test]
fn digits_by_multiplication_follow_the_formula() {
    for b in 0..=255u32 {
        for (a, &m) in DIV.iter().enumerate() {
            let got = (((b * m as u32) & 0xFFFF) * 3) >> 16;
            assert_eq!(got, (b / 3u32.pow(a as u32)) % 3, "byte {b} digit {a}");
        }
    }
}

/// One row whose group `v` has all 7 code bytes `v` (every byte value); random scales of
/// every magnitude (`wild`) or in [1, 2).
fn every_byte_row(wild: bool) -> (Geom, Vec<u8>) {
    let g = geom(1, 32 * 256);
    let mut rng = Rng::new(42);
    let mut b = Vec::new();
    for v in 0..256 {
        let s = if wild {
            rng.f16_bits()
        } else {
            f16::from_f32(1.5 + 0.5 * rng.unit()).to_bits()
        };
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&[v as u8; 7]);
    }
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    (g, b)
}

#[test]
fn simd_tiles_decode_like_the_scalar_reference() {
    let (g, b) = every_byte_row(true);
    let d = Q1tRows::<1>::new_at(g, &b, [0]);
    let (mut want, mut codes) = ([0f32; 32], [0i8; 32]);
    for blk in 0..256 {
        d.decode32(0, blk, &mut want);
        d.codes32(0, blk, &mut codes);
        let s = d.group_scale(0, blk);
        for k in 0..32 {
            assert_eq!(
                want[k],
                [0.0, s, -s][[0, 1, -1].iter().position(|&c| c == codes[k]).unwrap()]
            );
        }
        #[cfg(target_arch = "x86_64")]
        unsafe {
            use super::kernel::{IntRowsSimd, RowsAvx2, RowsAvx512};
            use std::arch::x86_64::*;
            let same = |got: [f32; 32], level: &str| {
                let (got, want) = (got.map(f32::to_bits), want.map(f32::to_bits));
                assert_eq!(got, want, "{level} byte {blk}");
            };
            if Kernel::Avx2.is_available() {
                let mut got = [0f32; 32];
                for (v, o) in d.load_avx2(0, blk).iter().zip(got.chunks_exact_mut(8)) {
                    _mm256_storeu_ps(o.as_mut_ptr(), *v);
                }
                same(got, "avx2");
                let mut c = [0i8; 32];
                _mm256_storeu_si256(c.as_mut_ptr() as *mut __m256i, d.load_u8(0, blk));
                assert_eq!(c, codes, "avx2 codes, byte {blk}");
            }
            if Kernel::Avx512.is_available() {
                let mut got = [0f32; 32];
                for (v, o) in d.load_avx512(0, blk).iter().zip(got.chunks_exact_mut(16)) {
                    _mm512_storeu_ps(o.as_mut_ptr(), *v);
                }
                same(got, "avx512");
            }
        }
    }
}

#[test]
fn every_byte_value_in_products_of_every_kernel() {
    // The digit-major kernel has its own digit tables: a product over a row holding
    // every byte value, against several activations, finds a wrong digit.
    let (g, b) = every_byte_row(false);
    for seed in 0..4 {
        let x = activations(g.cols, seed);
        for p in Precision::ALL {
            let want = reference(g, &b, &dequantized(&x, 1, g.cols, p), 1);
            for k in Kernel::available() {
                let m = matrix(g, &b, k);
                let mut y = [f32::NAN];
                matvec_with(&m, &b, &x, &mut y, p);
                check(&format!("{p:?} {k:?}"), &y, &want);
            }
        }
    }
}

#[test]
fn exact_products_match_decode_then_dot() {
    for (ci, &cols) in COLS.iter().enumerate() {
        for (ri, &rows) in ROWS.iter().enumerate() {
            for (oi, &ov) in OVERLAYS.iter().enumerate() {
                let seed = (1000 * ci + 10 * ri + oi) as u64;
                let g = geom(rows, cols);
                let b = payload(rows, cols, ov, seed);
                for t in [1usize, 2, 3, 5, 9] {
                    let x = activations(t * cols, seed + t as u64);
                    let want = reference(g, &b, &x, t);
                    for k in Kernel::available() {
                        let m = matrix(g, &b, k);
                        let mut y = vec![f32::NAN; t * rows];
                        matmul_with(&m, &b, &x, t, &mut y, Precision::Exact);
                        check(&format!("{rows}x{cols} {ov:?} t={t} {k:?}"), &y, &want);
                    }
                }
            }
        }
    }
}

/// `Fast` and `Balanced`: every kernel against `Σ w·x̂` over the activations they
/// quantize, and against the scalar kernel.
fn int_products_match_the_dequantized_activations(p: Precision, salt: usize) {
    for (ci, &cols) in COLS.iter().enumerate() {
        for (ri, &rows) in ROWS.iter().enumerate() {
            for (oi, &ov) in OVERLAYS.iter().enumerate() {
                let seed = (1000 * ci + 10 * ri + oi + salt) as u64;
                let g = geom(rows, cols);
                let b = payload(rows, cols, ov, seed);
                for t in [1usize, 2, 3, 5, 9] {
                    let x = activations(t * cols, seed + t as u64);
                    let want = reference(g, &b, &dequantized(&x, t, cols, p), t);
                    let mut ys = vec![f32::NAN; t * rows];
                    let scalar = matrix(g, &b, Kernel::Scalar);
                    matmul_with(&scalar, &b, &x, t, &mut ys, p);
                    for k in Kernel::available() {
                        let m = matrix(g, &b, k);
                        let mut y = vec![f32::NAN; t * rows];
                        matmul_with(&m, &b, &x, t, &mut y, p);
                        let what = format!("{p:?} {rows}x{cols} {ov:?} t={t} {k:?}");
                        check(&what, &y, &want);
                        check_near(&format!("{what} vs scalar"), &y, &ys, &want);
                    }
                }
            }
        }
    }
}

#[test]
fn fast_products_match_the_dequantized_activations() {
    int_products_match_the_dequantized_activations(Precision::Fast, 50000);
}

#[test]
fn balanced_products_match_the_dequantized_activations() {
    int_products_match_the_dequantized_activations(Precision::Balanced, 70000);
}

#[test]
fn balanced_uses_the_residual_level() {
    // A group with an outlier: one level rounds the other elements to a few steps of
    // `absmax/127`, two levels keep them within about `absmax/65000`. Balanced must land
    // far nearer the exact product than Fast on every kernel (a kernel that dropped the
    // residual, or computed Exact, would fail one side or the other).
    let (rows, cols) = (13usize, 576usize);
    let g = geom(rows, cols);
    let b = payload(rows, cols, Overlay::Some, 11);
    let mut x = activations(cols, 12);
    for v in x.iter_mut().step_by(32) {
        *v = 300.0;
    }
    let exact = reference(g, &b, &x, 1);
    for k in Kernel::available() {
        let m = matrix(g, &b, k);
        let err = |p: Precision| {
            let mut y = vec![f32::NAN; rows];
            matvec_with(&m, &b, &x, &mut y, p);
            let e: f64 = y
                .iter()
                .zip(&exact)
                .map(|(&y, &(v, _))| (y as f64 - v).abs())
                .sum();
            (e, y)
        };
        let ((fast, _), (balanced, yb), (_, ye)) = (
            err(Precision::Fast),
            err(Precision::Balanced),
            err(Precision::Exact),
        );
        assert!(
            balanced * 50.0 < fast,
            "{k:?}: balanced error {balanced:e}, fast {fast:e}"
        );
        assert!(yb != ye, "{k:?}: balanced computed the exact path");
    }
}

/// Whether a product of `m` over `t` tokens at precision `p` runs in the packed panels
/// ([`super::panel`]), which add the same exact group terms in another order.
fn in_panels(m: &Matrix, p: Precision, t: usize) -> bool {
    super::panel::applies_to(m, p == Precision::Balanced, t).is_some()
}

#[test]
fn matmul_is_t_matvecs_bit_for_bit() {
    // Except in the panels: there, both within the bound of the same value.
    for (cols, rows) in [(96usize, 13usize), (576, 7), (928, 5)] {
        for ov in OVERLAYS {
            let g = geom(rows, cols);
            let b = payload(rows, cols, ov, cols as u64);
            for k in Kernel::available() {
                let m = matrix(g, &b, k);
                for p in Precision::ALL {
                    for t in [2usize, 3, 4, 5, 7, 8, 9, 15, 17] {
                        let x = activations(t * cols, t as u64);
                        let mut y = vec![f32::NAN; t * rows];
                        matmul_with(&m, &b, &x, t, &mut y, p);
                        let want = reference(g, &b, &dequantized(&x, t, cols, p), t);
                        for j in 0..t {
                            let mut yj = vec![f32::NAN; rows];
                            matvec_with(&m, &b, &x[j * cols..(j + 1) * cols], &mut yj, p);
                            let row = &y[j * rows..(j + 1) * rows];
                            let what = format!("{rows}x{cols} {ov:?} {k:?} {p:?} t={t} token {j}");
                            if !in_panels(&m, p, t) {
                                assert!(
                                    row.iter().zip(&yj).all(|(a, b)| a.to_bits() == b.to_bits()),
                                    "{what}: {row:?} vs {yj:?}"
                                );
                                continue;
                            }
                            let want = &want[j * rows..(j + 1) * rows];
                            check_near(&format!("{what} vs matvec"), row, &yj, want);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn prefill_panels_with_overlays_agree_with_the_reference() {
    // The panels' sizes: one and several token passes (928 columns take 102 tokens a
    // pass; 2080 take 42 on AVX-512, whose overlay then runs in windows of 128 tokens, the
    // last one overlapping the one before), panels of 32 rows with live rows below 16 and
    // above, a row selection, every overlay kind (dense: every row has entries; repeated
    // columns).
    let p = Precision::Balanced;
    for (rows, cols) in [(37usize, 96usize), (70, 928), (13, 160), (45, 2080)] {
        for ov in OVERLAYS {
            let g = geom(rows, cols);
            let b = payload(rows, cols, ov, (rows + cols) as u64);
            let subset: Vec<u32> = (0..rows as u32).filter(|r| r % 3 != 1).collect();
            for t in [super::panel::Q1T_MIN_TOKENS, 11, 23, 130] {
                let x = activations(t * cols, 40 + t as u64);
                let want = reference(g, &b, &dequantized(&x, t, cols, p), t);
                let mut ys = vec![f32::NAN; t * rows];
                matmul_with(&matrix(g, &b, Kernel::Scalar), &b, &x, t, &mut ys, p);
                let mut avx2_bits = None;
                for k in Kernel::available() {
                    let m = matrix(g, &b, k);
                    let mut y = vec![f32::NAN; t * rows];
                    matmul_with(&m, &b, &x, t, &mut y, p);
                    let what = format!("{rows}x{cols} {ov:?} t={t} {k:?}");
                    // AVX-VNNI's panels sum the same group integers as AVX2's.
                    let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                    match k {
                        Kernel::Avx2 => avx2_bits = Some(bits),
                        Kernel::AvxVnni => assert!(avx2_bits == Some(bits), "{what} vs avx2"),
                        _ => {}
                    }
                    check(&what, &y, &want);
                    check_near(&format!("{what} vs scalar"), &y, &ys, &want);
                    let mut yp = vec![f32::NAN; t * subset.len()];
                    matmul_rows_with(&m, &b, &x, t, &subset, &mut yp, p);
                    for j in 0..t {
                        for (s, &r) in subset.iter().enumerate() {
                            let (got, full) = (yp[j * subset.len() + s], y[j * rows + r as usize]);
                            assert_eq!(got.to_bits(), full.to_bits(), "{what}: rows {subset:?}");
                        }
                    }
                }
            }
        }
    }
}

/// The panels build the overlay's activation columns once for products of one input (q/k/v,
/// gate/up): products of two matrices over the same activations, then over activations
/// that differ in the last token only, each agree with the reference.
#[test]
fn overlay_columns_follow_the_activations() {
    let p = Precision::Balanced;
    let (rows, cols, t) = (40usize, 928usize, 23usize);
    let g = geom(rows, cols);
    let (b1, b2) = (
        payload(rows, cols, Overlay::Dense, 5),
        payload(rows, cols, Overlay::Some, 6),
    );
    let x1 = activations(t * cols, 12);
    let mut x2 = x1.clone();
    x2[(t - 1) * cols..].iter_mut().for_each(|v| *v = 0.5 - *v);
    for k in Kernel::available() {
        let (m1, m2) = (matrix(g, &b1, k), matrix(g, &b2, k));
        for (m, b, x) in [
            (&m1, &b1, &x1),
            (&m2, &b2, &x1),
            (&m1, &b1, &x2),
            (&m1, &b1, &x1),
        ] {
            let want = reference(g, b, &dequantized(x, t, cols, p), t);
            let mut y = vec![f32::NAN; t * rows];
            matmul_with(m, b, x, t, &mut y, p);
            check(&format!("{k:?}"), &y, &want);
        }
    }
}

/// Rows paired differently (as selected rows, the pairs of the full product shift) give the
/// same values: 160 columns end in a partial step of 5 tiles (one row at a time), 96 and 352
/// in one of 3 (two rows' tails share a vector).
#[test]
fn row_selections_equal_the_full_product() {
    for cols in [160usize, 96, 352] {
        row_selection_equals_the_full_product(cols);
    }
}

fn row_selection_equals_the_full_product(cols: usize) {
    let rows = 67usize;
    let g = geom(rows, cols);
    let b = payload(rows, cols, Overlay::Dense, 9);
    let sel: Vec<u32> = vec![0, 2, 3, 7, 8, 9, 12, 30, 31, 32, 33, 50, 66];
    for k in Kernel::available() {
        let m = matrix(g, &b, k);
        for p in Precision::ALL {
            for t in [1usize, 3, 6] {
                let x = activations(t * cols, 77);
                let mut full = vec![0.0; t * rows];
                matmul_with(&m, &b, &x, t, &mut full, p);
                let mut y = vec![f32::NAN; t * sel.len()];
                if t == 1 {
                    matvec_rows_with(&m, &b, &x, &sel, &mut y, p);
                } else {
                    matmul_rows_with(&m, &b, &x, t, &sel, &mut y, p);
                }
                for j in 0..t {
                    for (i, &r) in sel.iter().enumerate() {
                        let (a, f) = (y[j * sel.len() + i], full[j * rows + r as usize]);
                        let at = format!("{k:?} {p:?} cols={cols} t={t} row {r}");
                        assert_eq!(a.to_bits(), f.to_bits(), "{at}");
                    }
                }
            }
        }
    }
}

#[test]
fn repeated_overlay_columns_later_wins() {
    // One row, s = 1, all codes +1 (byte 121 = 11111 in base 3, byte 6: 4 = 11): Σx over
    // x = 1 is 32. Column 3 gets 5.0 then −2.0; the later wins: 32 − 1 − 2 = 29.
    let mut b = Vec::new();
    b.extend_from_slice(&f16::from_f32(1.0).to_le_bytes());
    b.extend_from_slice(&[121, 121, 121, 121, 121, 121, 4]);
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&2u32.to_le_bytes());
    for v in [5.0f32, -2.0] {
        b.extend_from_slice(&3u16.to_le_bytes());
        b.extend_from_slice(&f16::from_f32(v).to_le_bytes());
    }
    assert_eq!(decode(DType::Q1t, &[1, 32], &b).unwrap()[3], -2.0);
    for k in Kernel::available() {
        let m = matrix(geom(1, 32), &b, k);
        for p in Precision::ALL {
            let mut y = [0.0];
            matvec_with(&m, &b, &[1.0; 32], &mut y, p);
            assert_eq!(y, [29.0], "{k:?} {p:?}");
        }
    }
}

#[test]
fn fused_parts_equal_separate_products() {
    // q/k/v-like parts sharing one input (two `q1t`, one `q8_row`: all read the same
    // quantized activations under `Fast` and `Balanced`) equal their separate products bit for bit.
    let cols = 576;
    let (g1, g2) = (geom(67, cols), geom(13, cols));
    let (b1, b2) = (
        payload(67, cols, Overlay::Some, 1),
        payload(13, cols, Overlay::None, 2),
    );
    let w3: Vec<f32> = activations(9 * cols, 3);
    let b3 = encode(
        DType::Q8Row,
        &[9, cols as u64],
        &w3,
        &EncodeOptions::default(),
    )
    .unwrap();
    let x = activations(cols, 4);
    for k in Kernel::available() {
        let m1 = matrix(g1, &b1, k);
        let m2 = matrix(g2, &b2, k);
        let mut m3 = Matrix::new(DType::Q8Row, &[9, cols as u64], &b3).unwrap();
        m3.set_kernel(k).unwrap();
        for p in Precision::ALL {
            let (mut y1, mut y2, mut y3) = (vec![0.0; 67], vec![0.0; 13], vec![0.0; 9]);
            let mut parts = [
                MatvecPart {
                    m: &m1,
                    bytes: &b1,
                    rows: None,
                    y: &mut y1,
                },
                MatvecPart {
                    m: &m2,
                    bytes: &b2,
                    rows: None,
                    y: &mut y2,
                },
                MatvecPart {
                    m: &m3,
                    bytes: &b3,
                    rows: None,
                    y: &mut y3,
                },
            ];
            matvec_multi(&mut parts, &x, p);
            for (m, b, y) in [(&m1, &b1, &y1), (&m2, &b2, &y2), (&m3, &b3, &y3)] {
                let mut alone = vec![0.0; y.len()];
                matvec_with(m, b, &x, &mut alone, p);
                let same = alone
                    .iter()
                    .zip(y.iter())
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{k:?} {p:?} {}: {y:?} vs {alone:?}", m.dtype);
            }
        }
    }
}

#[test]
fn encoded_payloads_and_an_odd_pool() {
    // The encoder's payloads (sorted overlays, canonical bytes), many tokens (several
    // token blocks), rows not a multiple of the task chunk, a 3-thread pool.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for (rows, cols) in [(37usize, 928usize), (150, 96)] {
        let shape = [rows as u64, cols as u64];
        let mut rng = Rng::new(rows as u64);
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| {
                if i % 89 == 3 {
                    9.0 * rng.unit()
                } else {
                    rng.unit()
                }
            })
            .collect();
        let opts = EncodeOptions {
            outlier_fraction: Some(0.02),
            ..Default::default()
        };
        let b = encode(DType::Q1t, &shape, &v, &opts).unwrap();
        let g = geom(rows, cols);
        let t = 71;
        let x = activations(t * cols, 8);
        for p in Precision::ALL {
            let want = reference(g, &b, &dequantized(&x, t, cols, p), t);
            for k in Kernel::available() {
                let m = matrix(g, &b, k);
                let mut y = vec![f32::NAN; t * rows];
                pool.install(|| matmul_with(&m, &b, &x, t, &mut y, p));
                check(&format!("{rows}x{cols} {p:?} {k:?}"), &y, &want);
            }
        }
    }
}

#[test]
fn the_bound_catches_one_wrong_weight() {
    // The checks have teeth: flip one code byte of a row (a few weights change) and the
    // product of the intact payload no longer passes against the damaged reference.
    let (rows, cols) = (8usize, 576usize);
    let g = geom(rows, cols);
    let mut b = payload(rows, cols, Overlay::Some, 3);
    for t in 0..rows * cols / 32 {
        b[9 * t..9 * t + 2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
    }
    let x = activations(cols, 5);
    let m = matrix(g, &b, Kernel::detect());
    let mut y = vec![0.0; rows];
    matvec_with(&m, &b, &x, &mut y, Precision::Exact);
    let mut caught = 0;
    for r in 0..rows {
        let mut bad = b.clone();
        // Group 5 of row r, code byte 2: change its lowest digit.
        let at = (r * cols / 32 + 5) * 9 + 2 + 2;
        bad[at] = match (bad[at] % 3, bad[at]) {
            (1, v) => v + 1,
            (2, v) | (0, v @ 255) => v - 1,
            (_, v) => v + 1,
        };
        let want = reference(g, &bad, &x, 1);
        if (y[r] as f64 - want[r].0).abs() > want[r].1 {
            caught += 1;
        }
    }
    assert!(
        caught >= rows - 2,
        "only {caught} of {rows} damaged rows caught"
    );
}

/// A matrix repacked at load (`Matrix::new_repacked` at the levels of the digit-major
/// kernels, AVX-512 VBMI + VNNI and AVX2: the planes kernels, its overlay copied) and the
/// same matrix cold (`Matrix::new_cold`: the digit-major kernel over the file's tiles)
/// compute within the bound of the same values at every precision, decode the same rows
/// bit for bit, and only the repacked one leaves its payload unread. Each level this CPU
/// has runs: on AVX-512 the repacked matrix forced down to AVX2 runs the AVX2 planes
/// kernel, and forced down to scalar the shared loops over the repacked rows (whose codes
/// under the overlay's entries are cleared, the entries adding their values). Columns
/// from 1 tile to 29, a whole half step (4 tiles) and past it.
#[test]
fn repacked_and_cold_matrices_agree() {
    let shape = |g: Geom| [g.rows as u64, g.cols as u64];
    let planes = planes_run_on(Kernel::detect());
    let mut levels = vec![Kernel::detect()];
    if Kernel::Avx2.is_available() && !levels.contains(&Kernel::Avx2) {
        levels.push(Kernel::Avx2);
    }
    if !levels.contains(&Kernel::Scalar) {
        levels.push(Kernel::Scalar);
    }
    for (ci, &cols) in COLS.iter().chain(&[128, 384]).enumerate() {
        for (ri, &rows) in [1usize, 3, 7, 67].iter().enumerate() {
            for (level, (oi, &ov)) in levels
                .iter()
                .flat_map(|&k| OVERLAYS.iter().enumerate().map(move |o| (k, o)))
            {
                let seed = (5000 + 1000 * ci + 10 * ri + oi) as u64;
                let g = geom(rows, cols);
                let b = payload(rows, cols, ov, seed);
                let mut hot = Matrix::new_repacked(DType::Q1t, &shape(g), &b).unwrap();
                let mut cold = Matrix::new_cold(DType::Q1t, &shape(g), &b).unwrap();
                assert_eq!(hot.payload_unread(), planes, "{rows}x{cols}");
                assert!(!cold.payload_unread());
                // What a product streams: the repacked rows (a code word and a scale per
                // tile) and the overlay's copy, or the payload.
                let count = super::q1::validate_q1t(g, &b).unwrap().count;
                let repacked = 10 * rows * (cols / 32) + 4 * (rows + 1) + 4 * count;
                let streamed = if planes { repacked } else { b.len() };
                assert_eq!(hot.streamed_bytes(), streamed, "{rows}x{cols} repacked");
                assert_eq!(cold.streamed_bytes(), b.len(), "{rows}x{cols} cold");
                // Corrections: a repacked matrix needs none, a cold one not before its
                // first product.
                let computed = |m: &Matrix| q1t_overlay(m).unwrap().deltas_computed();
                assert_eq!(computed(&hot), !planes, "{rows}x{cols} repacked");
                assert!(!computed(&cold), "{rows}x{cols} cold, at load");
                hot.set_kernel(level).unwrap();
                cold.set_kernel(level).unwrap();
                let (mut a, mut c) = (vec![0f32; cols], vec![0f32; cols]);
                for r in 0..rows {
                    hot.row(&b, r, &mut a);
                    cold.row(&b, r, &mut c);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&c), "{rows}x{cols} {ov:?} row {r}");
                }
                for p in [Precision::Balanced, Precision::Fast, Precision::Exact] {
                    for t in [1usize, 2, 3, 9] {
                        let x = activations(t * cols, seed + t as u64);
                        let want = reference(g, &b, &dequantized(&x, t, cols, p), t);
                        let (mut yh, mut yc) = (vec![f32::NAN; t * rows], vec![f32::NAN; t * rows]);
                        matmul_with(&hot, &b, &x, t, &mut yh, p);
                        matmul_with(&cold, &b, &x, t, &mut yc, p);
                        let what = format!("{level:?} {p:?} {rows}x{cols} {ov:?} t={t}");
                        check(&format!("{what} repacked"), &yh, &want);
                        check(&format!("{what} cold"), &yc, &want);
                        assert_eq!(computed(&hot), !planes, "{what} repacked");
                        assert!(computed(&cold), "{what} cold, multiplied");
                        if in_panels(&hot, p, t) {
                            continue;
                        }
                        // Below the panels, a product of t tokens is t products of one.
                        for j in 0..t {
                            let mut y1 = vec![f32::NAN; rows];
                            matvec_with(&hot, &b, &x[j * cols..(j + 1) * cols], &mut y1, p);
                            let bits =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&y1),
                                bits(&yh[j * rows..(j + 1) * rows]),
                                "{what} token {j}"
                            );
                        }
                    }
                }
            }
        }
    }
}
