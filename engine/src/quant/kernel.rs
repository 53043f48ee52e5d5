//! The shared loop of the row-dot kernels and the choice of instruction set.
//!
//! Every product of [`super::matrix`] is a set of blocks "`R` weight rows × `T` activation
//! rows": each weight row is decoded once per block, 32 elements at a time, straight from
//! its stored bytes (never materialised as a whole row), and dotted against the `T`
//! activations while the decoded elements are still in registers. What is specific to a
//! dtype is only "decode elements `32·blk .. 32·blk + 32` of row `i`", which each family
//! module implements for its layouts ([`RowsScalar`], and on x86-64 [`RowsAvx2`] and
//! [`RowsAvx512`]); the loops over blocks, rows and activations live here, once.
//!
//! Determinism: for a given [`Kernel`], the result for one (weight row, activation) pair
//! depends neither on `R` nor on `T` — each pair owns one accumulator that sees the same
//! operations in the same order — so a prefill (`matmul`, large `T`) computes bit for bit
//! the same values as the decode path (`matvec`, `T = 1`) would for each token.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Elements decoded per step: the group size of the quantized layouts.
pub const STEP: usize = 32;

/// Instruction set a [`super::matrix::Matrix`] multiplies with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Portable scalar code: the reference the SIMD kernels are tested against.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C, 8 lanes.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL (+ AVX2, FMA, F16C), 16 lanes.
    Avx512,
}

impl Kernel {
    /// The fastest kernel this CPU runs (detected at run time).
    pub fn detect() -> Kernel {
        if Kernel::Avx512.is_available() {
            Kernel::Avx512
        } else if Kernel::Avx2.is_available() {
            Kernel::Avx2
        } else {
            Kernel::Scalar
        }
    }

    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                Kernel::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every kernel this CPU runs, scalar first.
    pub fn available() -> Vec<Kernel> {
        [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512]
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }
}

/// `R` weight rows as the scalar loop sees them.
pub(crate) trait RowsScalar {
    /// Elements per row.
    fn cols(&self) -> usize;
    /// Elements `32·blk ..` of row `i` (`i < R`), at most 32, the rest of `out` zero.
    /// The values are the row's decoded weights divided by [`RowsScalar::post`].
    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]);
    /// Factor applied to row `i`'s finished dot product (a per-row scale pulled out of
    /// the loop); exactly 1 by default.
    fn post(&self, _i: usize) -> f32 {
        1.0
    }
}

/// AVX2 decode of a whole step: elements `32·blk .. 32·blk + 32` of row `i` as four
/// 8-lane vectors (same values as [`RowsScalar::decode32`]).
#[cfg(target_arch = "x86_64")]
pub(crate) trait RowsAvx2: RowsScalar {
    /// # Safety
    /// The CPU supports [`Kernel::Avx2`]; `blk < cols / 32`, `i < R`.
    unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4];
}

/// AVX-512 decode of a whole step as two 16-lane vectors.
#[cfg(target_arch = "x86_64")]
pub(crate) trait RowsAvx512: RowsScalar {
    /// # Safety
    /// The CPU supports [`Kernel::Avx512`]; `blk < cols / 32`, `i < R`.
    unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2];
}

/// Everything a row block must implement to run on every kernel of this target.
#[cfg(target_arch = "x86_64")]
pub(crate) trait Rows: RowsAvx2 + RowsAvx512 {}
#[cfg(target_arch = "x86_64")]
impl<D: RowsAvx2 + RowsAvx512> Rows for D {}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) trait Rows: RowsScalar {}
#[cfg(not(target_arch = "x86_64"))]
impl<D: RowsScalar> Rows for D {}

/// `out[i][j] = row_i · xs[j]` for the `R` rows of `d` and the `T` activations `xs`
/// (each `cols` long), with kernel `k`.
#[inline]
pub(crate) fn run<D: Rows, const R: usize, const T: usize>(
    k: Kernel,
    d: &D,
    xs: &[&[f32]; T],
    out: &mut [[f32; T]; R],
) {
    for x in xs {
        assert_eq!(x.len(), d.cols(), "activation length must equal cols");
    }
    match k {
        // SAFETY: a `Matrix` only holds a kernel that `is_available()` on this CPU, and
        // the activation lengths were checked just above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { fused_avx512::<D, R, T>(d, xs, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { fused_avx2::<D, R, T>(d, xs, out) },
        _ => fused_scalar::<D, R, T>(d, xs, out),
    }
}

/// The scalar reference: decode 32 elements, then one sequential sum per pair.
pub(crate) fn fused_scalar<D: RowsScalar, const R: usize, const T: usize>(
    d: &D,
    xs: &[&[f32]; T],
    out: &mut [[f32; T]; R],
) {
    let n = d.cols();
    let mut acc = [[0f32; T]; R];
    let mut w = [0f32; STEP];
    for blk in 0..n.div_ceil(STEP) {
        let k = blk * STEP;
        let len = STEP.min(n - k);
        for (i, acc_i) in acc.iter_mut().enumerate() {
            d.decode32(i, blk, &mut w);
            for (a, x) in acc_i.iter_mut().zip(xs) {
                let mut s = *a;
                for (wv, xv) in w[..len].iter().zip(&x[k..k + len]) {
                    s += wv * xv;
                }
                *a = s;
            }
        }
    }
    for (i, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
        let p = d.post(i);
        for (o, a) in o.iter_mut().zip(a) {
            *o = a * p;
        }
    }
}

/// The last, partial step of every activation, zero padded to 32.
fn tails<const T: usize>(xs: &[&[f32]; T], from: usize) -> [[f32; STEP]; T] {
    let mut xb = [[0f32; STEP]; T];
    for (b, x) in xb.iter_mut().zip(xs) {
        b[..x.len() - from].copy_from_slice(&x[from..]);
    }
    xb
}

/// AVX2: per step and row, four decoded vectors; each pair accumulates in one register
/// (the activations are loaded as FMA memory operands, so `R·T` accumulators plus four
/// weight vectors stay within the 16 registers for the shapes `matrix` uses). A partial
/// last step goes through zero-padded stack copies.
///
/// # Safety
/// The CPU supports [`Kernel::Avx2`]; every `xs[j].len() == d.cols()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fused_avx2<D: RowsAvx2, const R: usize, const T: usize>(
    d: &D,
    xs: &[&[f32]; T],
    out: &mut [[f32; T]; R],
) {
    let n = d.cols();
    let full = n / STEP;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for blk in 0..full {
        let k = blk * STEP;
        for (i, acc_i) in acc.iter_mut().enumerate() {
            let w = d.load_avx2(i, blk);
            for (a, x) in acc_i.iter_mut().zip(xs) {
                let p = x.as_ptr().add(k);
                let mut s = *a;
                for (v, wv) in w.iter().enumerate() {
                    s = _mm256_fmadd_ps(*wv, _mm256_loadu_ps(p.add(8 * v)), s);
                }
                *a = s;
            }
        }
    }
    if full * STEP < n {
        let xb = tails(xs, full * STEP);
        let mut wb = [0f32; STEP];
        for (i, acc_i) in acc.iter_mut().enumerate() {
            d.decode32(i, full, &mut wb);
            for (a, x) in acc_i.iter_mut().zip(&xb) {
                let mut s = *a;
                for v in 0..4 {
                    let wv = _mm256_loadu_ps(wb.as_ptr().add(8 * v));
                    s = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(8 * v)), s);
                }
                *a = s;
            }
        }
    }
    for (i, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
        let p = d.post(i);
        for (o, a) in o.iter_mut().zip(a) {
            *o = hsum256(*a) * p;
        }
    }
}

/// Horizontal sum of 8 lanes (fixed order: halves, then pairs).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// AVX-512: per step, the `R` rows are decoded first (two 16-lane vectors each), then each
/// activation is loaded once and meets the `R` rows: `2R` decoded vectors, `R·T`
/// accumulators and two activation vectors fit the 32 registers for `R, T ≤ 4`, and
/// activations are loaded once per `R` rows (register blocking, as in a GEMM
/// micro-kernel) rather than once per FMA.
///
/// # Safety
/// The CPU supports [`Kernel::Avx512`]; every `xs[j].len() == d.cols()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn fused_avx512<D: RowsAvx512, const R: usize, const T: usize>(
    d: &D,
    xs: &[&[f32]; T],
    out: &mut [[f32; T]; R],
) {
    let n = d.cols();
    let full = n / STEP;
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut w = [[_mm512_setzero_ps(); 2]; R];
    for blk in 0..full {
        let k = blk * STEP;
        for (i, w) in w.iter_mut().enumerate() {
            *w = d.load_avx512(i, blk);
        }
        for (j, x) in xs.iter().enumerate() {
            let p = x.as_ptr().add(k);
            let (x0, x1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            for (acc_i, w) in acc.iter_mut().zip(&w) {
                let s = _mm512_fmadd_ps(w[0], x0, acc_i[j]);
                acc_i[j] = _mm512_fmadd_ps(w[1], x1, s);
            }
        }
    }
    if full * STEP < n {
        let xb = tails(xs, full * STEP);
        let mut wb = [0f32; STEP];
        for (i, w) in w.iter_mut().enumerate() {
            d.decode32(i, full, &mut wb);
            *w = [
                _mm512_loadu_ps(wb.as_ptr()),
                _mm512_loadu_ps(wb.as_ptr().add(16)),
            ];
        }
        for (j, x) in xb.iter().enumerate() {
            let (x0, x1) = (
                _mm512_loadu_ps(x.as_ptr()),
                _mm512_loadu_ps(x.as_ptr().add(16)),
            );
            for (acc_i, w) in acc.iter_mut().zip(&w) {
                let s = _mm512_fmadd_ps(w[0], x0, acc_i[j]);
                acc_i[j] = _mm512_fmadd_ps(w[1], x1, s);
            }
        }
    }
    for (i, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
        let p = d.post(i);
        for (o, a) in o.iter_mut().zip(a) {
            *o = _mm512_reduce_add_ps(*a) * p;
        }
    }
}

/// f16 bits to f32 with F16C (exact).
///
/// # Safety
/// The CPU supports F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn h2f(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The little-endian u16 at `b[at..at + 2]`.
#[inline(always)]
pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// f16 bits to f32 (portable, exact).
#[inline(always)]
pub(crate) fn h2f_scalar(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}
