//! The integer kernels on AArch64 with Advanced SIMD (NEON, which every AArch64 CPU has):
//! [`Kernel::Neon`](super::kernel::Kernel::Neon).
//!
//! They are the scalar kernels' loops ([`super::kernel::int_rows_with`],
//! [`super::kernel::wide_with`]) with each group's dot product in NEON: `smull` / `smull2`
//! of 16 weight codes by 16 activation codes into int16 products (each at most `128·128`,
//! so never saturating), `sadalp` pairing them into int32 lanes, one `addv` per group; for
//! the row-scaled `q8` sums, the codes widened to int16 and `smlal` against the int16
//! activation codes. The sums are exact integers, the same as the scalar loop's, and
//! everything around them is the scalar code, so the values are the scalar kernels' bit for
//! bit, which the kernel tests check under emulation (`scripts/test-aarch64.sh`).
//!
//! The weight codes come from each layout's scalar `codes32`, which the compiler inlines
//! into the loop (a copy for `q8`, a nibble split for `q4`). The float paths (`exact`
//! precision, attention, norms) run the portable code. Not measured on AArch64 hardware
//! yet: this project's machines are x86-64; see docs/bench/inference.md.

#[cfg(target_arch = "aarch64")]
use std::arch::aarch64::*;

#[cfg(target_arch = "aarch64")]
use super::kernel::{int_rows_with, wide_with, IntRowsScalar, QToken, STEP};

/// `Σ w·x` over a group's 32 weight codes `w` and 32 activation codes `x`.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn dot32(w: &[i8; STEP], x: &[i8; STEP]) -> i32 {
    // SAFETY: NEON is part of AArch64; `w` and `x` hold 32 codes each.
    unsafe {
        let (w0, w1) = (vld1q_s8(w.as_ptr()), vld1q_s8(w.as_ptr().add(16)));
        let (x0, x1) = (vld1q_s8(x.as_ptr()), vld1q_s8(x.as_ptr().add(16)));
        let mut acc = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
        acc = vpadalq_s16(acc, vmull_high_s8(w0, x0));
        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
        acc = vpadalq_s16(acc, vmull_high_s8(w1, x1));
        vaddvq_s32(acc)
    }
}

/// `Σ w·k` over a group's 32 weight codes and 32 int16 activation codes. Each product is
/// below `128·2¹⁵ = 2²²` and an int32 lane sums 8 of them, so the sum is exact.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn dot32_wide(w: &[i8; STEP], k: &[i16; STEP]) -> i64 {
    // SAFETY: NEON is part of AArch64; `w` and `k` hold 32 codes each.
    unsafe {
        let (w0, w1) = (vld1q_s8(w.as_ptr()), vld1q_s8(w.as_ptr().add(16)));
        let w = [
            vmovl_s8(vget_low_s8(w0)),
            vmovl_high_s8(w0),
            vmovl_s8(vget_low_s8(w1)),
            vmovl_high_s8(w1),
        ];
        let mut acc = vdupq_n_s32(0);
        for (v, w) in w.iter().enumerate() {
            let kv = vld1q_s16(k.as_ptr().add(8 * v));
            acc = vmlal_s16(acc, vget_low_s16(*w), vget_low_s16(kv));
            acc = vmlal_high_s16(acc, *w, kv);
        }
        vaddlvq_s32(acc)
    }
}

/// [`super::kernel::int_scalar`] with NEON dots: `out[i][j] = row_i · token_j`, the same
/// values bit for bit.
#[cfg(target_arch = "aarch64")]
pub(crate) fn int_neon<D: IntRowsScalar, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    int_rows_with::<D, R, T>(d, xs, out, dot32)
}

/// The scalar `wide_scalar` with NEON dots: per row and token the exact `Σ c·k` of the
/// signed weight codes against the int16 codes `k = 256·q + q₂`, the same sums.
#[cfg(target_arch = "aarch64")]
pub(crate) fn wide_neon<D: IntRowsScalar, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
) -> [[i64; T]; R] {
    wide_with::<D, R, T>(d, xs, dot32_wide)
}
