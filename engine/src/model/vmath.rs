//! Vector math shared by the blocks: the SIMD level a [`Kernel`] resolves to, `exp` as a
//! polynomial every level computes with the same operations (so results agree bit for
//! bit across levels), a fixed-order 16-lane sum, and SiLU-and-multiply, the gated
//! feed-forward's activation.
//!
//! Hand-written: the standard library's `exp` is a scalar libm call per element (the
//! largest cost of a prefill's SiLU before this), and the SIMD versions must match the
//! scalar reference exactly.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::quant::kernel::Kernel;

/// The instruction set a [`Kernel`] resolves to on this CPU.
#[derive(Clone, Copy)]
pub(crate) enum Level {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Scalar,
}

pub(crate) fn level(k: Kernel) -> Level {
    match k {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if k.is_available() => Level::Avx512,
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 | Kernel::Avx2 | Kernel::AvxVnni if Kernel::Avx2.is_available() => {
            Level::Avx2
        }
        _ => Level::Scalar,
    }
}

/// Calls the function of `k`'s level: `simd_dispatch!(k, avx512(..), avx2(..), scalar(..))`,
/// the two SIMD ones `unsafe` target-feature functions whose safety conditions beyond the
/// level (lengths) the caller has checked.
macro_rules! simd_dispatch {
    ($k:expr, $avx512:expr, $avx2:expr, $scalar:expr) => {
        match $crate::model::vmath::level($k) {
            // SAFETY: the CPU has the level's features (`level` checked them); the caller
            // checked the lengths.
            #[cfg(target_arch = "x86_64")]
            $crate::model::vmath::Level::Avx512 => unsafe { $avx512 },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            $crate::model::vmath::Level::Avx2 => unsafe { $avx2 },
            $crate::model::vmath::Level::Scalar => $scalar,
        }
    };
}
pub(crate) use simd_dispatch;

/// `e^x` for the softmax (`x ≤ 0` there; any `x` is handled): `x = n·ln2 + r` with
/// `|r| ≤ ln2/2` (ln2 in two parts, so `r` is exact to f32), `e^r` by Cephes' degree-5
/// polynomial, `2ⁿ` put into the exponent. Below −87.3 it returns 0 (`e^x` is subnormal
/// there; a softmax loses nothing), NaN stays NaN. Within 2 ulp of `f32::exp` elsewhere.
#[inline(always)]
pub fn exp_poly(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x = x.clamp(EXP_LO, EXP_HI);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_C[0];
    for c in &EXP_C[1..] {
        p = p.mul_add(r, *c);
    }
    let r2 = r * r;
    let e = p.mul_add(r2, r + 1.0);
    let bits = ((n as i32 + 127) << 23) as u32;
    if x <= EXP_LO {
        0.0
    } else {
        e * f32::from_bits(bits)
    }
}

const EXP_LO: f32 = -87.3;
const EXP_HI: f32 = 88.3;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes `expf`: `e^r ≈ 1 + r + r²·P(r)`.
const EXP_C: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// The fixed order of a 16-lane sum: `l + l⁺⁸`, then `+ l⁺⁴`, `+ l⁺²`, `+ l⁺¹`.
#[inline(always)]
pub fn reduce16(l: &[f32; 16]) -> f32 {
    let a: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
    let b: [f32; 4] = std::array::from_fn(|i| a[i] + a[i + 4]);
    let c: [f32; 2] = std::array::from_fn(|i| b[i] + b[i + 2]);
    c[0] + c[1]
}

/// [`exp_poly`] on 16 lanes, op for op.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn exp512(x: __m512) -> __m512 {
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    let xc = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(EXP_LO)),
        _mm512_set1_ps(EXP_HI),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), xc);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_C[0]);
    for c in &EXP_C[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let e = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0)));
    let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    let v = _mm512_mul_ps(e, _mm512_castsi512_ps(bits));
    let under = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(xc, _mm512_set1_ps(EXP_LO));
    let v = _mm512_mask_mov_ps(v, under, _mm512_setzero_ps());
    _mm512_mask_mov_ps(v, nan, x)
}

/// [`exp_poly`] on 8 lanes, op for op.
///
/// # Safety
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp256(x: __m256) -> __m256 {
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
    let xc = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
        _mm256_set1_ps(EXP_HI),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), xc);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_C[0]);
    for c in &EXP_C[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let e = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let v = _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
    let under = _mm256_cmp_ps::<_CMP_LE_OQ>(xc, _mm256_set1_ps(EXP_LO));
    let v = _mm256_andnot_ps(under, v);
    _mm256_blendv_ps(v, x, nan)
}

/// Elements per task of a parallel [`silu_mul`]; a multiple of 16, so that every lane
/// group is the one a single call would form and the values do not depend on the split.
const SILU_CHUNK: usize = 1 << 14;

/// `g[i] = silu(g[i])·u[i]`, `silu(x) = x / (1 + e^(−x))` with [`exp_poly`]. A prefill's
/// (`[t, intermediate]`) is split over the pool: serial, it was 3% of a 512-token
/// Qwen2.5-Coder-0.5B prefill's samples, on one core while the other waited (split, the
/// two share it; the wall-clock gain, ~1.5%, is inside the machine's noise). A decode
/// step's stays on the calling thread.
pub fn silu_mul(k: Kernel, g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len());
    if g.len() >= 2 * SILU_CHUNK {
        use rayon::prelude::*;
        return g
            .par_chunks_mut(SILU_CHUNK)
            .zip(u.par_chunks(SILU_CHUNK))
            .for_each(|(g, u)| silu_mul_serial(k, g, u));
    }
    silu_mul_serial(k, g, u)
}

fn silu_mul_serial(k: Kernel, g: &mut [f32], u: &[f32]) {
    simd_dispatch!(
        k,
        silu_mul_avx512(g, u),
        silu_mul_avx2(g, u),
        silu_mul_scalar(g, u)
    )
}

fn silu_mul_scalar(g: &mut [f32], u: &[f32]) {
    for (g, &u) in g.iter_mut().zip(u) {
        *g = *g / (1.0 + exp_poly(-*g)) * u;
    }
}

/// # Safety
/// AVX-512 F; `g.len() == u.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn silu_mul_avx512(g: &mut [f32], u: &[f32]) {
    let one = _mm512_set1_ps(1.0);
    for (gc, uc) in g.chunks_mut(16).zip(u.chunks(16)) {
        let mask: __mmask16 = ((1u32 << gc.len()) - 1) as u16;
        let x = _mm512_maskz_loadu_ps(mask, gc.as_ptr());
        let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
        let r = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(mask, uc.as_ptr()));
        _mm512_mask_storeu_ps(gc.as_mut_ptr(), mask, r);
    }
}

/// # Safety
/// AVX2 and FMA; `g.len() == u.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(g: &mut [f32], u: &[f32]) {
    let one = _mm256_set1_ps(1.0);
    let mut gc = g.chunks_exact_mut(8);
    let mut uc = u.chunks_exact(8);
    for (gc, uc) in (&mut gc).zip(&mut uc) {
        let x = _mm256_loadu_ps(gc.as_ptr());
        let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(
            gc.as_mut_ptr(),
            _mm256_mul_ps(s, _mm256_loadu_ps(uc.as_ptr())),
        );
    }
    silu_mul_scalar(gc.into_remainder(), uc.remainder());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_poly_is_within_two_ulp_of_exp() {
        let mut worst = 0u32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp_poly(x), x.exp());
            let ulp = (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32;
            worst = worst.max(ulp);
            x += 0.0137;
        }
        assert!(worst <= 2, "exp_poly is {worst} ulp from exp");
        assert_eq!(exp_poly(0.0), 1.0);
        assert_eq!(exp_poly(-100.0), 0.0);
        assert_eq!(exp_poly(f32::NEG_INFINITY), 0.0);
        assert!(exp_poly(f32::NAN).is_nan());
    }

    #[test]
    fn silu_mul_agrees_across_levels_and_with_exp() {
        let g0: Vec<f32> = (0..203).map(|i| (i as f32 - 101.0) * 0.173).collect();
        let u: Vec<f32> = (0..203).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut want: Option<Vec<u32>> = None;
        for k in Kernel::available() {
            let mut g = g0.clone();
            silu_mul(k, &mut g, &u);
            for ((&x, &uv), &got) in g0.iter().zip(&u).zip(&g) {
                let exact = x as f64 / (1.0 + (-x as f64).exp()) * uv as f64;
                assert!(
                    (got as f64 - exact).abs() <= 1e-6 * exact.abs().max(1e-3),
                    "{k:?} silu({x})·{uv}: {got} vs {exact}"
                );
            }
            let bits: Vec<u32> = g.iter().map(|v| v.to_bits()).collect();
            assert_eq!(
                *want.get_or_insert(bits.clone()),
                bits,
                "{k:?} differs from scalar"
            );
        }
    }

    #[test]
    fn a_long_silu_mul_splits_over_the_pool_with_the_same_values() {
        // Past the split, with a tail that is not a whole chunk nor a whole vector.
        let n = 3 * SILU_CHUNK + 37;
        let g0: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 2001) as f32 * 0.01 - 10.0)
            .collect();
        let u: Vec<f32> = (0..n).map(|i| 0.5 + (i % 13) as f32 * 0.125).collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for k in Kernel::available() {
            let mut serial = g0.clone();
            silu_mul_serial(k, &mut serial, &u);
            let mut split = g0.clone();
            pool.install(|| silu_mul(k, &mut split, &u));
            assert!(
                serial
                    .iter()
                    .zip(&split)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{k:?}: the parallel silu_mul differs from the serial one"
            );
            assert!(
                split.iter().zip(&g0).any(|(a, b)| a != b),
                "{k:?}: nothing was computed"
            );
        }
    }
}
