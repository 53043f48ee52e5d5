//! The integer kernels on AArch64 with Advanced SIMD (NEON, which every AArch64 CPU has):
//! [`Kernel::Neon`](super::kernel::Kernel::Neon).
//!
//! They are [`super::kernel::int_scalar`] and the scalar `run_wide` with each group's dot
//! product in NEON: `smull` / `smull2` of 16 weight codes by 16 activation codes into
//! int16 products (each at most `128·128`, so never saturating), `sadalp` pairing them into
//! int32 lanes, one `addv` per group. The sums are exact integers, the same as the scalar
//! loop's, and everything after them (the f32 multiply-adds with the group and token
//! scales, in the same order) is the scalar code's, so the values are the scalar kernels'
//! bit for bit, which the kernel tests check under emulation (`scripts/test-aarch64.sh`).
//!
//! The weight codes come from each layout's scalar `codes32`, which the compiler inlines
//! into this loop (a copy for `q8`, a nibble split for `q4`). The float paths (`exact`
//! precision, attention, norms) run the portable code. Not measured on AArch64 hardware
//! yet: this project's machines are x86-64; see docs/bench/inference.md.

#[cfg(target_arch = "aarch64")]
use std::arch::aarch64::*;

#[cfg(target_arch = "aarch64")]
use super::kernel::{IntRowsScalar, QToken, SPLIT_SHIFT, STEP};

/// `Σ w·x` over 32 codes: `w0`, `w1` the weight codes 0..16 and 16..32, `x` 32 activation
/// codes.
///
/// # Safety
/// NEON (every AArch64 CPU); `x` points to 32 readable codes.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn dot32(w0: int8x16_t, w1: int8x16_t, x: *const i8) -> i32 {
    let (x0, x1) = (vld1q_s8(x), vld1q_s8(x.add(16)));
    let mut acc = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
    acc = vpadalq_s16(acc, vmull_high_s8(w0, x0));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
    acc = vpadalq_s16(acc, vmull_high_s8(w1, x1));
    vaddvq_s32(acc)
}

/// [`super::kernel::int_scalar`] with NEON dots: `out[i][j] = row_i · token_j`, the same
/// values bit for bit.
///
/// # Panics
/// Unless every token holds `ceil(cols/32)·32` codes per level it carries (checked by
/// `run_int`, which calls this) and a scale per group.
#[cfg(target_arch = "aarch64")]
pub(crate) fn int_neon<D: IntRowsScalar, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    let groups = d.cols().div_ceil(STEP);
    for x in xs {
        assert!(x.q.len() >= groups * STEP && x.d.len() >= groups);
        assert!(!x.split() || x.q2.len() >= groups * STEP);
    }
    let mut acc = [[0f32; T]; R];
    let mut c = [0i8; STEP];
    for blk in 0..groups {
        let at = blk * STEP;
        for (i, acc_i) in acc.iter_mut().enumerate() {
            d.codes32(i, blk, &mut c);
            let s = d.group_scale(i, blk);
            // SAFETY: NEON is part of AArch64; `c` holds 32 codes, and each token's levels
            // `at + 32 ≤ groups·32` codes (asserted above).
            unsafe {
                let (w0, w1) = (vld1q_s8(c.as_ptr()), vld1q_s8(c.as_ptr().add(16)));
                for (a, x) in acc_i.iter_mut().zip(xs) {
                    let mut dot = dot32(w0, w1, x.q.as_ptr().add(at));
                    if x.split() {
                        dot = (dot << SPLIT_SHIFT) + dot32(w0, w1, x.q2.as_ptr().add(at));
                    }
                    *a += dot as f32 * s * x.d[blk];
                }
            }
        }
    }
    for (i, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
        let p = d.int_post(i);
        for (o, a) in o.iter_mut().zip(a) {
            *o = a * p;
        }
    }
}

/// The scalar `wide_scalar` with NEON dots: per row and token the exact `Σ c·k` of the
/// signed weight codes against the int16 codes `k = 256·q + q₂`. A group's 32 products
/// (each below `128·2¹⁵ = 2²²`) sum in int32 lanes without overflow (8 per lane), and the
/// groups add up in i64, so the sums equal the scalar ones.
///
/// # Panics
/// Unless every token holds `ceil(cols/32)·32` int16 codes (checked by `run_int`).
#[cfg(target_arch = "aarch64")]
pub(crate) fn wide_neon<D: IntRowsScalar, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
) -> [[i64; T]; R] {
    let groups = d.cols().div_ceil(STEP);
    for x in xs {
        assert!(x.k.len() >= groups * STEP);
    }
    let mut sums = [[0i64; T]; R];
    let mut c = [0i8; STEP];
    for blk in 0..groups {
        for (i, s) in sums.iter_mut().enumerate() {
            d.codes32(i, blk, &mut c);
            // SAFETY: NEON is part of AArch64; `c` holds 32 codes and each token's `k`
            // `blk·32 + 32 ≤ groups·32` (asserted above).
            unsafe {
                let w0 = vld1q_s8(c.as_ptr());
                let w1 = vld1q_s8(c.as_ptr().add(16));
                let w = [
                    vmovl_s8(vget_low_s8(w0)),
                    vmovl_high_s8(w0),
                    vmovl_s8(vget_low_s8(w1)),
                    vmovl_high_s8(w1),
                ];
                for (s, x) in s.iter_mut().zip(xs) {
                    let k = x.k.as_ptr().add(blk * STEP);
                    let mut acc = vdupq_n_s32(0);
                    for (v, w) in w.iter().enumerate() {
                        let kv = vld1q_s16(k.add(8 * v));
                        acc = vmlal_s16(acc, vget_low_s16(*w), vget_low_s16(kv));
                        acc = vmlal_high_s16(acc, *w, kv);
                    }
                    *s += vaddlvq_s32(acc);
                }
            }
        }
    }
    sums
}
