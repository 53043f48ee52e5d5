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

use rayon::prelude::*;

/// Elements decoded per step: the group size of the quantized layouts.
pub const STEP: usize = 32;

/// Instruction set a [`super::matrix::Matrix`] multiplies with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kernel {
    /// Portable scalar code: the reference the SIMD kernels are tested against.
    Scalar,
    /// AArch64 Advanced SIMD, which every AArch64 CPU has: the integer kernels' dots
    /// ([`super::neon`]); the float paths run the portable code.
    Neon,
    /// x86-64 AVX2 + FMA + F16C, 8 lanes.
    Avx2,
    /// [`Kernel::Avx2`] with AVX-VNNI: `vpdpbusd` / `vpdpwssd` on 256 bits, as on a CPU
    /// with AVX-VNNI but no AVX-512 (Intel's client cores since Alder Lake, its E-core
    /// Xeons). Prefill's packed panels multiply-add bytes and int16 pairs in one
    /// instruction ([`super::panel`]); everything else runs [`Kernel::Avx2`]'s code.
    AvxVnni,
    /// x86-64 AVX-512 F/BW/VL (+ AVX2, FMA, F16C), 16 lanes.
    Avx512,
}

impl Kernel {
    /// The fastest kernel this CPU runs (detected at run time), or a lower one when
    /// `CORTIQ_SIMD=scalar|neon|avx2|avxvnni|avx512` (or its older name `CORTIQ_KERNEL`) asks
    /// for it, to measure each SIMD level on one machine; a level the CPU lacks is never
    /// chosen (the next lower one it has is).
    pub fn detect() -> Kernel {
        // Read once: every matrix of a model asks at load.
        static CAP: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        let cap = *CAP.get_or_init(|| {
            let asked = std::env::var("CORTIQ_SIMD").or_else(|_| std::env::var("CORTIQ_KERNEL"));
            match asked.as_deref() {
                Ok("scalar") => Kernel::Scalar,
                Ok("neon") => Kernel::Neon,
                Ok("avx2") => Kernel::Avx2,
                Ok("avxvnni") => Kernel::AvxVnni,
                _ => Kernel::Avx512,
            }
        });
        Kernel::ALL
            .into_iter()
            .rev()
            .find(|&k| k <= cap && k.is_available())
            .unwrap_or(Kernel::Scalar)
    }

    /// Every level, lowest first (a CPU has either NEON or the x86 levels).
    const ALL: [Kernel; 5] = [
        Kernel::Scalar,
        Kernel::Neon,
        Kernel::Avx2,
        Kernel::AvxVnni,
        Kernel::Avx512,
    ];

    /// Whether this level runs [`Kernel::Avx2`]'s code (AVX2 + FMA + F16C, 8 lanes), with
    /// or without AVX-VNNI's panels.
    pub fn is_avx2(self) -> bool {
        matches!(self, Kernel::Avx2 | Kernel::AvxVnni)
    }

    /// Whether this CPU can run the kernel (detected once, then one atomic load).
    pub fn is_available(self) -> bool {
        let bit = match self {
            Kernel::Scalar => return true,
            Kernel::Neon => return cfg!(target_arch = "aarch64"),
            Kernel::Avx2 => F_AVX2,
            Kernel::AvxVnni => F_AVX_VNNI,
            Kernel::Avx512 => F_AVX512,
        };
        features() & bit != 0
    }

    /// The level's name as `CORTIQ_SIMD` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Neon => "neon",
            Kernel::Avx2 => "avx2",
            Kernel::AvxVnni => "avxvnni",
            Kernel::Avx512 => "avx512",
        }
    }

    /// Whether the integer kernels of this level use AVX-512 VNNI (`vpdpbusd`).
    pub fn has_vnni(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self == Kernel::Avx512 && has_vnni()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Whether the integer kernels of this level may also use AVX-512 VBMI (byte permutes
    /// and multishifts: `vbit` unpacking, `q1t`'s digit-major kernel): VNNI and VBMI both
    /// present.
    pub fn has_vbmi(self) -> bool {
        self.has_vnni() && avx512_vbmi()
    }

    /// Every kernel this CPU runs, scalar first.
    pub fn available() -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }
}

const F_AVX2: u8 = 1;
const F_AVX512: u8 = 2;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const F_VNNI: u8 = 4;
const F_VBMI: u8 = 8;
/// AVX-VNNI (with AVX2, FMA and F16C): [`Kernel::AvxVnni`].
const F_AVX_VNNI: u8 = 16;
const F_DETECTED: u8 = 128;

/// The instruction sets of this CPU as bits, detected on first use.
fn features() -> u8 {
    use std::sync::atomic::{AtomicU8, Ordering};
    static CACHE: AtomicU8 = AtomicU8::new(0);
    let f = CACHE.load(Ordering::Relaxed);
    if f & F_DETECTED != 0 {
        return f;
    }
    #[allow(unused_mut)]
    let mut f = F_DETECTED;
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            f |= F_AVX2;
            if is_x86_feature_detected!("avxvnni") {
                f |= F_AVX_VNNI;
            }
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
            {
                f |= F_AVX512;
                if is_x86_feature_detected!("avx512vnni") {
                    f |= F_VNNI;
                }
                if is_x86_feature_detected!("avx512vbmi") {
                    f |= F_VBMI;
                }
            }
        }
    }
    CACHE.store(f, Ordering::Relaxed);
    f
}

/// Whether the CPU runs [`Kernel::Avx512`] and has AVX-512 VBMI (detected once).
pub(crate) fn avx512_vbmi() -> bool {
    features() & (F_AVX512 | F_VBMI) == F_AVX512 | F_VBMI
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

    /// As [`IntRowsSimd::prefetch_next`], for the f32-activation kernels (AVX2 and
    /// AVX-512).
    ///
    /// # Safety
    /// As [`RowsAvx2::load_avx2`]; the address may lie outside the payload.
    #[inline(always)]
    unsafe fn prefetch_next_f(&self, _i: usize, _blk: usize) {}
}

/// AVX-512 decode of a whole step as two 16-lane vectors.
#[cfg(target_arch = "x86_64")]
pub(crate) trait RowsAvx512: RowsAvx2 {
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
        // SAFETY: the CPU has the kernel's features (checked in the guard) and the
        // activation lengths were checked just above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if k.is_available() => unsafe { fused_avx512::<D, R, T>(d, xs, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 | Kernel::AvxVnni if k.is_available() => unsafe {
            fused_avx2::<D, R, T>(d, xs, out)
        },
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
#[cfg(target_arch = "x86_64")]
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
            d.prefetch_next_f(i, blk);
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
pub(crate) unsafe fn hsum256(v: __m256) -> f32 {
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
            d.prefetch_next_f(i, blk);
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

/// Eight f16 bits to f32 with F16C (exact), gathered in a register (`vpinsrw`): eight
/// narrow stores read back by one wide load can stall on store forwarding (see
/// [`f16_scales`]); in the AVX2 int16 packer the two forms measured alike.
///
/// # Safety
/// The CPU supports F16C and AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn h2f8(b: [u16; 8]) -> __m256 {
    let [b0, b1, b2, b3, b4, b5, b6, b7] = b.map(|x| x as i16);
    _mm256_cvtph_ps(_mm_setr_epi16(b0, b1, b2, b3, b4, b5, b6, b7))
}

/// Asks the cache (L2, as the kernels' row prefetches) for byte `at` of `b`, if `b` has it;
/// nothing elsewhere than x86-64. A hint: it never faults and changes no result.
#[inline(always)]
pub(crate) fn prefetch_l2(b: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if at < b.len() {
        // SAFETY: SSE is part of x86-64; `at` is inside `b`.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(b.as_ptr().add(at) as *const i8) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (b, at);
}

/// `[f(0), …, f(N − 1)]`, as `std::array::from_fn` builds it, in a plain loop that inlines
/// into the caller. `from_fn` calls `f` through `core::ops::try_trait::Wrapped`, and in the
/// large target-feature functions of the `q1t` kernels that wrapper stayed out of line,
/// a call per tile (`perf`: 7% of a SmolLM2-135M `q1t` decode at AVX-512, with `f`'s own
/// work). Here `f` is inlined or not by the compiler's usual measure (a row's overlay
/// lookup stays a call): decode 1.02–1.04×, paired, on both models.
#[inline(always)]
pub(crate) fn array_of<T: Copy, const N: usize>(mut f: impl FnMut(usize) -> T) -> [T; N] {
    let mut a = [const { std::mem::MaybeUninit::<T>::uninit() }; N];
    for (i, x) in a.iter_mut().enumerate() {
        x.write(f(i));
    }
    // SAFETY: every element was written above; `[MaybeUninit<T>; N]` and `[T; N]` have
    // the same layout.
    unsafe { std::mem::transmute_copy(&a) }
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

/// The f16 values at `bytes[at + 2·r]` for each row `r` of `rs` (a block's row scales),
/// in f32: where the rows are 8 consecutive ones (every block of a product without a
/// row selection) and the CPU has F16C, one 16-byte load and one conversion. A block of
/// rows is built outside the kernels' target features, where `half`'s slice conversion
/// was a call, a feature check and a loop per block, and a gather of the 8 values through
/// the stack stalled on store forwarding (3–4% of a SmolLM2 `q8_row` decode together).
/// The conversion is exact either way.
#[inline(always)]
pub(crate) fn f16_scales<const R: usize>(bytes: &[u8], at: usize, rs: &[usize; R]) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    if R == 8 && Kernel::Avx2.is_available() && rs[R - 1] == rs[0] + (R - 1) {
        let from = at + 2 * rs[0];
        let src = &bytes[from..from + 16];
        let mut out = [0f32; R];
        // SAFETY: the AVX2 level includes F16C; `src` holds 16 bytes and `out` 8 floats
        // (`R == 8`).
        unsafe { cvt8_f16c(src.as_ptr(), out.as_mut_ptr()) };
        return out;
    }
    std::array::from_fn(|i| h2f_scalar(le16(bytes, at + 2 * rs[i])))
}

/// 8 f16 values at `src` into 8 f32 at `out`, by `vcvtph2ps`.
///
/// # Safety
/// The CPU supports F16C and AVX; `src` has 16 readable bytes, `out` room for 8 floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn cvt8_f16c(src: *const u8, out: *mut f32) {
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(src as *const __m128i)));
}

// ---- quantized activations (the `Fast` path) ---------------------------------------------
//
// Activations are quantized per group of 32 to int8 with an f32 scale, `x ≈ xq·d`,
// `d = absmax/127`, codes rounded to nearest: each activation moves by at most `d/2`.
// A weight group then needs one integer dot product (exact in i32) and one f32
// multiply-add: `y = post · Σ_g (dot_g · scale_g) · d_g`.

/// Element order of the quantized activations within a group, matched to the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActOrder {
    /// Elements 0..32 (`q8` codes are stored in this order).
    Natural,
    /// Elements 0..32, with the `−128·Σx` lanes (`c`, `c2`) for rows whose codes come
    /// offset by 128 ([`IntRowsSimd::CODE_OFFSET`]: `vbit` on AVX-512 VBMI).
    NaturalOffset,
    /// Even elements, then odd ones: the order of "low nibbles, then high nibbles" of a
    /// `q4` group, so the weights need no re-interleaving.
    NibblePairs,
}

impl ActOrder {
    /// The offset of the weight codes this order serves (see [`QuantizedActs::c`]).
    fn offset(self) -> i32 {
        match self {
            ActOrder::Natural => 0,
            ActOrder::NibblePairs => 8,
            ActOrder::NaturalOffset => 128,
        }
    }
}

/// Activations `[t, cols]` quantized for the integer kernels; reused across calls.
///
/// One level (`Precision::Fast`): `x ≈ d·q`, `q` in `-127..=127`, `d = absmax/127` per
/// group of 32. A group holding an activation outlier (a channel tens of times larger
/// than the rest, as real models have) then rounds its other elements to a few levels,
/// or to zero. Two levels (`Precision::Balanced`, [`QuantizedActs::fill`] with `split`)
/// take one scale per token, `d = absmax/127` over the whole row, and also quantize the
/// rounding residual: `x ≈ d·(q + q₂/256)`, `q₂ = round(256·(x − d·q)/d)` in
/// `-127..=127`, so an element moves by at most about `d/512`, some 15 bits of the token's
/// range. That is the int16 code `k = 256·q + q₂` (`|k| ≤ 32639`). One scale per token
/// lets a row-scaled (`q8`) product sum the whole row in integers and scale once
/// (`vpdpwssd`/`vpmaddwd` on `k`); a `q4` product dots both byte levels against the
/// nibbles and combines them exactly per group (`256·Σc·q + Σc·q₂`). Per-token against
/// per-group scales measured on the real models (mean KL to `exact` over the fixture
/// passage): SmolLM2-135M q8_row 1.4e-5 against 5.9e-7, q8_2f 6.6e-5 against 1.9e-6;
/// Qwen2.5-Coder-0.5B ≤ 2.4e-7: within DESIGN.md's 1e-3, for a kernel with a third of the
/// instructions.
#[derive(Clone, Debug, Default)]
pub(crate) struct QuantizedActs {
    /// Groups per token (`ceil(cols / 32)`); the last group is zero padded.
    groups: usize,
    /// Whether the residual level `q2` / `c2` is filled.
    split: bool,
    /// `[t, groups·32]` codes in `-127..=127`.
    q: Vec<i8>,
    /// `[t, groups·32]` residual codes (empty unless `split`).
    q2: Vec<i8>,
    /// `[t, groups·32]` int16 codes `256·q + q₂`, in the order of `q` (filled when `split`
    /// and asked for: the row-scaled kernels sum them, and so do the grouped ones without
    /// VNNI, [`int16_avx2_target`], and the `q4` row kernels at every level,
    /// [`nibble_pairs_avx2`] and [`nibble_pairs_avx512`]; else empty).
    k: Vec<i16>,
    /// `[t, groups rounded up to 8]` the sum of each group's `k = 256·q + q₂`, zero padded
    /// (filled on request for split tokens, [`QuantizedActs::fill_group_sums`]): a kernel
    /// may take unsigned codes `u = c + o` with an offset `o` of its row's own,
    /// `Σ c·k = Σ u·k − o·Σ k`, 8 groups per load (the `vbit` row kernels).
    ks: Vec<i32>,
    /// `[t, groups·32]` the int16 codes `k` of each group in [`ActOrder::NibblePairs`]
    /// order, even elements then odd ones (filled on request, [`QuantizedActs::fill_pairs16`]):
    /// the order in which `vbit`'s 4-bit rows widen their bytes to codes.
    kp: Vec<i16>,
    /// `[t, groups]` scales: `d` per group, or when `split` the token's `d/256` (the unit
    /// of the combined sum) in every group.
    d: Vec<f32>,
    /// `[t, groups, 8]`: `−o ·` the sum of each 4 consecutive codes, the 8 lanes of a
    /// 256-bit integer dot (`o` = 8 in the `q4` order, 128 in [`ActOrder::NaturalOffset`];
    /// not filled in [`ActOrder::Natural`]). A `q4` group is `Σ (u − 8)·x = Σ u·x − 8·Σ x`
    /// with `u` its unsigned nibbles: starting the dot from these lanes spares the kernels
    /// the sign juggling of signed codes (see [`IntRowsSimd::CODE_OFFSET`]).
    c: Vec<i32>,
    /// The same lanes for `q2` (empty unless `split`).
    c2: Vec<i32>,
    /// `q8_2f`: one token times the column field, reused.
    scaled: Vec<f32>,
}

/// One token's part of each [`QuantizedActs`] buffer.
pub(super) struct TokenCodes<'a> {
    pub q: &'a mut [i8],
    pub q2: &'a mut [i8],
    pub k: &'a mut [i16],
    pub d: &'a mut [f32],
    pub c: &'a mut [i32],
    pub c2: &'a mut [i32],
}

impl TokenCodes<'_> {
    /// Panics unless the buffers are sized as [`QuantizedActs::fill`] sizes them for a
    /// token of `len` activations (the SIMD quantizers write through raw pointers).
    fn check(&self, len: usize, split: bool) {
        let groups = self.d.len();
        assert!(groups * STEP >= len && len + STEP > groups * STEP);
        assert!(self.q.len() == groups * STEP && self.c.len() == groups * LANES);
        assert!(!split || (self.q2.len() == groups * STEP && self.c2.len() == groups * LANES));
        assert!(self.k.is_empty() || self.k.len() == groups * STEP);
    }
}

/// A group's step `d` and its inverse, from the token's one scale when split, else from
/// the group's `amax`; `None` for a group that cannot be scaled (zero or non-finite: it
/// stays zero, and the model's own non-finite checks see the f32 activations it came
/// from). Stores the scale the kernels read into `dg` (`d/256` when split).
#[inline(always)]
fn group_step(amax: f32, token: Option<(f32, f32)>, dg: &mut f32) -> Option<(f32, f32)> {
    if !(amax > 0.0 && amax.is_finite()) {
        return None;
    }
    let (dd, inv) = token.unwrap_or((amax / 127.0, 127.0 / amax));
    *dg = if token.is_some() { dd / 256.0 } else { dd };
    Some((dd, inv))
}

/// Writes a group's codes `qa` (and, when split, the residual codes `qb`), 32 bytes in
/// natural order, in `order` at group `g`, with their offset lanes, and the int16 codes
/// `256·qa + qb` in the same order when `k` is filled.
///
/// # Safety
/// AVX2; `q`, `c` (and `q2`, `c2` when `qb` is given, `k` when not empty) hold group `g`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn store_group(
    g: usize,
    order: ActOrder,
    qa: __m256i,
    qb: Option<__m256i>,
    q: &mut [i8],
    q2: &mut [i8],
    k: &mut [i16],
    c: &mut [i32],
    c2: &mut [i32],
) {
    // (No closures or `Option::map` around intrinsics: they may stay out of line, without
    // the caller's target features.)
    let offset = order.offset();
    let qa = in_order(order, qa);
    _mm256_storeu_si256(q.as_mut_ptr().add(g * STEP) as *mut __m256i, qa);
    if offset != 0 {
        offset_lanes_256(qa, offset, c.as_mut_ptr().add(g * LANES));
    }
    if let Some(qb) = qb {
        let qb = in_order(order, qb);
        _mm256_storeu_si256(q2.as_mut_ptr().add(g * STEP) as *mut __m256i, qb);
        if offset != 0 {
            offset_lanes_256(qb, offset, c2.as_mut_ptr().add(g * LANES));
        }
        if !k.is_empty() {
            // `256·a + b` per element (|k| ≤ 32639: no wrap), both already in `order`.
            let wide = |a: __m128i, b: __m128i| {
                _mm256_add_epi16(
                    _mm256_slli_epi16::<8>(_mm256_cvtepi8_epi16(a)),
                    _mm256_cvtepi8_epi16(b),
                )
            };
            let at = k.as_mut_ptr().add(g * STEP);
            let lo = wide(_mm256_castsi256_si128(qa), _mm256_castsi256_si128(qb));
            let hi = wide(
                _mm256_extracti128_si256::<1>(qa),
                _mm256_extracti128_si256::<1>(qb),
            );
            _mm256_storeu_si256(at as *mut __m256i, lo);
            _mm256_storeu_si256(at.add(16) as *mut __m256i, hi);
        }
    }
}

/// Quantizes one token `xr` into `out` (see [`QuantizedActs::fill`]), with the loops
/// compiled for the SIMD level the kernels run at (AVX-512 or AVX2): the quantizer runs
/// once per product on the calling thread, and in scalar code it took half of a 64-token
/// prefill product (AVX2 code still 11% of a 512-token one on an AVX-512 machine).
fn quantize_token(xr: &[f32], order: ActOrder, split: bool, out: TokenCodes) {
    // The level `CORTIQ_SIMD` asks for, as the kernels use, so that each level is measured
    // whole; every level gives the same codes.
    #[cfg(target_arch = "x86_64")]
    match Kernel::detect() {
        // SAFETY: `detect` returns a level only where the CPU has it (AVX-512 F/BW/VL
        // with AVX2, FMA and F16C; AVX2 with FMA and F16C).
        Kernel::Avx512 => return unsafe { quantize_token_avx512(xr, order, split, out) },
        Kernel::Avx2 | Kernel::AvxVnni => {
            return unsafe { quantize_token_avx2(xr, order, split, out) }
        }
        Kernel::Scalar | Kernel::Neon => {}
    }
    quantize_token_body(xr, order, split, out)
}

/// A group's 32 codes (natural order) in `order`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn in_order(order: ActOrder, y: __m256i) -> __m256i {
    match order {
        ActOrder::Natural | ActOrder::NaturalOffset => y,
        ActOrder::NibblePairs => nibble_pairs_256(y),
    }
}

/// A group's 32 codes in the nibble-pair order: even bytes then odd ones within each
/// 128-bit lane, then the lanes' halves gathered.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn nibble_pairs_256(y: __m256i) -> __m256i {
    let pairs = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5,
        7, 9, 11, 13, 15,
    );
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(y, pairs))
}

/// [`offset_lanes`] of a group's 32 codes into `out` (8 lanes).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn offset_lanes_256(codes: __m256i, offset: i32, out: *mut i32) {
    let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), codes);
    let sums = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    let neg = _mm256_mullo_epi32(sums, _mm256_set1_epi32(-offset));
    _mm256_storeu_si256(out as *mut __m256i, neg);
}

/// [`quantize_token_body`] in AVX2 by hand, as [`quantize_token_avx512`] in four 8-lane
/// vectors per group (the compiler's version was 7% of a SmolLM2 q4_block 64-token
/// prefill at this level): the same operations per element, so the same codes, scales
/// and lanes bit for bit.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `out` is sized as [`QuantizedActs::fill`] sizes it for
/// `xr`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_token_avx2(
    xr: &[f32],
    order: ActOrder,
    split: bool,
    out: TokenCodes,
) {
    out.check(xr.len(), split);
    let TokenCodes { q, q2, k, d, c, c2 } = out;
    let sign = _mm256_set1_epi32(i32::MAX);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    // `packs` interleaves 128-bit lanes; this puts the four 8-code pieces back in order.
    let unlace = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let token_amax = if split { Some(absmax_of(xr)) } else { None };
    let token_scale = token_amax.map(|a| (a / 127.0, 127.0 / a));
    // The zero-padded copy of the one partial group (the last), if any.
    let mut buf = [0f32; STEP];
    for (g, dg) in d.iter_mut().enumerate() {
        let from = g * STEP;
        let n = STEP.min(xr.len() - from);
        let p = if n == STEP {
            xr.as_ptr().add(from)
        } else {
            buf[..n].copy_from_slice(&xr[from..]);
            buf.as_ptr()
        };
        let v: [__m256; 4] = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let amax = match token_amax {
            Some(a) => a,
            None => {
                let mut nan = _mm256_setzero_ps();
                let mut m = _mm256_setzero_ps();
                for v in v {
                    nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                    let a = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), sign));
                    m = _mm256_max_ps(m, a);
                }
                if _mm256_movemask_ps(nan) != 0 {
                    continue;
                }
                let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                let m = _mm_max_ss(m, _mm_movehdup_ps(m));
                _mm_cvtss_f32(m)
            }
        };
        let Some((dd, inv)) = group_step(amax, token_scale, dg) else {
            continue;
        };
        // As in the AVX-512 quantizer: a NaN passes the clamp, converts to 0x8000_0000
        // and leaves the body's code 0; rounding first keeps MXCSR out of it.
        let code = |v: __m256| {
            let c = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(c);
            let r = _mm256_cvttps_epi32(r);
            _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(r))
        };
        let inv_v = _mm256_set1_ps(inv);
        let a: [__m256i; 4] = [
            code(_mm256_mul_ps(v[0], inv_v)),
            code(_mm256_mul_ps(v[1], inv_v)),
            code(_mm256_mul_ps(v[2], inv_v)),
            code(_mm256_mul_ps(v[3], inv_v)),
        ];
        let b: [__m256i; 4] = if split {
            let (dd_v, inv2) = (_mm256_set1_ps(dd), _mm256_set1_ps(256.0 * inv));
            let r = |v: __m256, a: __m256i| {
                let back = _mm256_mul_ps(dd_v, _mm256_cvtepi32_ps(a));
                code(_mm256_mul_ps(_mm256_sub_ps(v, back), inv2))
            };
            [r(v[0], a[0]), r(v[1], a[1]), r(v[2], a[2]), r(v[3], a[3])]
        } else {
            [_mm256_setzero_si256(); 4]
        };
        let bytes = |x: &[__m256i; 4]| {
            let w = _mm256_packs_epi16(
                _mm256_packs_epi32(x[0], x[1]),
                _mm256_packs_epi32(x[2], x[3]),
            );
            _mm256_permutevar8x32_epi32(w, unlace)
        };
        let qb = if split { Some(bytes(&b)) } else { None };
        store_group(g, order, bytes(&a), qb, q, q2, k, c, c2);
    }
}

/// [`quantize_token_body`] in AVX-512 by hand: a group is two 16-lane vectors, its codes
/// rounded by one conversion (nearest, ties to even, as [`round_code`]) and narrowed by
/// `vpmovdb`, the nibble-pair order by a byte shuffle, the offset lanes by `vpmaddubsw`.
/// The compiler's vectorisation of the body kept the group in 8-element pieces and a
/// scalar division per group; this was 9% of a SmolLM2 64-token prefill. Same operations
/// in the same order per element as the body (no fused multiply-adds), so the same codes
/// and scales bit for bit (`quantize_simd_equals_the_scalar_body`).
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VL, AVX2 and FMA; `out` is sized as
/// [`QuantizedActs::fill`] sizes it for `xr`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn quantize_token_avx512(
    xr: &[f32],
    order: ActOrder,
    split: bool,
    out: TokenCodes,
) {
    out.check(xr.len(), split);
    let TokenCodes { q, q2, k, d, c, c2 } = out;
    let sign = _mm512_set1_epi32(i32::MAX);
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    // Split: one scale for the token (the body computes the same values per group). Not
    // in a closure: `absmax_of` must inline into this function's target features.
    let token_amax = if split { Some(absmax_of(xr)) } else { None };
    let token_scale = token_amax.map(|a| (a / 127.0, 127.0 / a));
    for (g, dg) in d.iter_mut().enumerate() {
        let from = g * STEP;
        let n = STEP.min(xr.len() - from);
        let m = if n == STEP { u32::MAX } else { (1u32 << n) - 1 };
        let p = xr.as_ptr().add(from);
        let v = [
            _mm512_maskz_loadu_ps(m as u16, p),
            _mm512_maskz_loadu_ps((m >> 16) as u16, p.wrapping_add(16)),
        ];
        let amax = match token_amax {
            Some(a) => a,
            None => {
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[0], v[0])
                    | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[1], v[1]);
                if nan != 0 {
                    continue;
                }
                let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v[0]), sign));
                let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v[1]), sign));
                _mm512_reduce_max_ps(_mm512_max_ps(a0, a1))
            }
        };
        let Some((dd, inv)) = group_step(amax, token_scale, dg) else {
            continue;
        };
        // `round_code`: a NaN (0·∞ when the scale overflows) passes the clamp (vmaxps
        // returns its second operand then) and converts to 0x8000_0000, whose low byte
        // is the body's 0; the sign extension keeps the 32-bit code equal to the byte.
        let code = |v: __m512| {
            let c = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
            let r =
                _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(c);
            _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(r))
        };
        let inv_v = _mm512_set1_ps(inv);
        let a = [
            code(_mm512_mul_ps(v[0], inv_v)),
            code(_mm512_mul_ps(v[1], inv_v)),
        ];
        let b = if split {
            let (dd_v, inv2) = (_mm512_set1_ps(dd), _mm512_set1_ps(256.0 * inv));
            let r = |v: __m512, a: __m512i| {
                let back = _mm512_mul_ps(dd_v, _mm512_cvtepi32_ps(a));
                code(_mm512_mul_ps(_mm512_sub_ps(v, back), inv2))
            };
            [r(v[0], a[0]), r(v[1], a[1])]
        } else {
            [_mm512_setzero_si512(); 2]
        };
        let bytes = |x: [__m512i; 2]| {
            _mm256_set_m128i(_mm512_cvtepi32_epi8(x[1]), _mm512_cvtepi32_epi8(x[0]))
        };
        let qb = if split { Some(bytes(b)) } else { None };
        store_group(g, order, bytes(a), qb, q, q2, k, c, c2);
    }
}

/// The largest magnitude in `v` (0 for none; NaN if `v` holds one), in lanes the compiler
/// vectorises.
#[inline(always)]
fn absmax_of(v: &[f32]) -> f32 {
    // Not `f32::max`, whose NaN rule keeps the loop scalar: a NaN, once met, stays in
    // its lane (`a != a`, and no later `a > NaN` holds).
    let step = |m: &mut f32, x: &f32| {
        let a = x.abs();
        *m = if a > *m || a.is_nan() { a } else { *m };
    };
    let mut lanes = [0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (m, x) in lanes.iter_mut().zip(c) {
            step(m, x);
        }
    }
    for x in chunks.remainder() {
        step(&mut lanes[0], x);
    }
    let mut m = 0f32;
    for l in &lanes {
        step(&mut m, l);
    }
    m
}

#[inline(always)]
pub(super) fn quantize_token_body(xr: &[f32], order: ActOrder, split: bool, out: TokenCodes) {
    let TokenCodes { q, q2, k, d, c, c2 } = out;
    let token_amax = split.then(|| absmax_of(xr));
    for (g, dg) in d.iter_mut().enumerate() {
        let from = g * STEP;
        let n = STEP.min(xr.len() - from);
        let mut buf = [0f32; STEP];
        buf[..n].copy_from_slice(&xr[from..from + n]);
        let amax = token_amax.unwrap_or_else(|| absmax_of(&buf));
        let span = from..from + STEP;
        // The token's scale when split: the same values as each group's from its amax.
        let token = split.then(|| (amax / 127.0, 127.0 / amax));
        let Some((dd, inv)) = group_step(amax, token, dg) else {
            continue;
        };
        let mut qa = [0i8; STEP];
        for (o, v) in qa.iter_mut().zip(&buf) {
            *o = round_code(v * inv);
        }
        let mut ra = [0i8; STEP];
        if split {
            let inv2 = 256.0 * inv;
            for ((o, v), &a) in ra.iter_mut().zip(&buf).zip(&qa) {
                *o = round_code((v - dd * a as f32) * inv2);
            }
        }
        place(&qa, order, &mut q[span.clone()]);
        if split {
            place(&ra, order, &mut q2[span.clone()]);
        }
        if !k.is_empty() {
            let mut ka = [0i16; STEP];
            for ((o, &a), &b) in ka.iter_mut().zip(&qa).zip(&ra) {
                *o = 256 * a as i16 + b as i16;
            }
            place(&ka, order, &mut k[span.clone()]);
        }
        // Only the kernels of offset codes (`q4`, `vbit` on VBMI) start from these lanes.
        let offset = order.offset();
        if offset != 0 {
            let lanes = g * LANES..(g + 1) * LANES;
            offset_lanes(&q[span.clone()], offset, &mut c[lanes.clone()]);
            if split {
                offset_lanes(&q2[span], offset, &mut c2[lanes]);
            }
        }
    }
}

/// Codes of one group in `order`: as they are, or even elements then odd ones.
#[inline(always)]
fn place<C: Copy>(codes: &[C; STEP], order: ActOrder, out: &mut [C]) {
    match order {
        ActOrder::Natural | ActOrder::NaturalOffset => out.copy_from_slice(codes),
        ActOrder::NibblePairs => {
            let (even, odd) = out.split_at_mut(STEP / 2);
            for (i, (e, o)) in even.iter_mut().zip(odd).enumerate() {
                *e = codes[2 * i];
                *o = codes[2 * i + 1];
            }
        }
    }
}

/// Lanes of a 256-bit integer dot (8 × i32), each summing 4 byte products.
const LANES: usize = 8;

/// Weight of the first level against the residual one in a split dot (`2⁸`).
pub(crate) const SPLIT_SHIFT: i32 = 8;

/// One token of [`QuantizedActs`].
#[derive(Clone, Copy, Default)]
pub(crate) struct QToken<'a> {
    pub q: &'a [i8],
    /// Residual codes (empty for one level).
    pub q2: &'a [i8],
    /// int16 codes `256·q + q₂` (see [`QuantizedActs::k`]; empty unless filled).
    pub k: &'a [i16],
    /// Per group, the sum of its `k = 256·q + q₂`, zero padded to a multiple of 8 groups
    /// (empty unless [`QuantizedActs::fill_group_sums`] filled it).
    pub ks: &'a [i32],
    /// `k` in nibble-pair order (empty unless [`QuantizedActs::fill_pairs16`] filled it).
    pub kp: &'a [i16],
    /// Per group: `d`, or `d/256` when split (then one value for the whole token).
    pub d: &'a [f32],
    pub c: &'a [i32],
    pub c2: &'a [i32],
}

impl QToken<'_> {
    /// Whether the token carries the residual level.
    #[inline]
    pub fn split(&self) -> bool {
        !self.q2.is_empty()
    }
}

impl QuantizedActs {
    /// Makes room for `t` tokens of `cols` activations with both levels, so `fill` does
    /// not allocate.
    pub fn reserve(&mut self, cols: usize, t: usize) {
        let groups = cols.div_ceil(STEP);
        for v in [&mut self.q, &mut self.q2] {
            v.reserve((t * groups * STEP).saturating_sub(v.len()));
        }
        self.k
            .reserve((t * groups * STEP).saturating_sub(self.k.len()));
        self.ks
            .reserve((t * groups.next_multiple_of(8)).saturating_sub(self.ks.len()));
        self.kp
            .reserve((t * groups * STEP).saturating_sub(self.kp.len()));
        self.scaled.reserve(cols.saturating_sub(self.scaled.len()));
        self.d.reserve((t * groups).saturating_sub(self.d.len()));
        for v in [&mut self.c, &mut self.c2] {
            v.reserve((t * groups * LANES).saturating_sub(v.len()));
        }
    }

    /// Quantizes `x` (`[t, cols]`), multiplied elementwise by the column field `col`
    /// first when given (`q8_2f`: `Σ q·col·x = Σ q·(col·x)`); per group with one level,
    /// or per token with the residual level when `split`, then with the int16 codes `k`
    /// too when `int16`.
    #[allow(clippy::too_many_arguments)]
    pub fn fill(
        &mut self,
        x: &[f32],
        t: usize,
        cols: usize,
        col: Option<&[f32]>,
        order: ActOrder,
        split: bool,
        int16: bool,
    ) {
        let groups = cols.div_ceil(STEP);
        self.groups = groups;
        self.split = split;
        let wide = split && int16;
        let n = t * groups * STEP;
        let (n2, l2) = if split {
            (n, t * groups * LANES)
        } else {
            (0, 0)
        };
        // Every buffer is rewritten in full below; clearing first only keeps `resize` from
        // copying old contents.
        for (v, len) in [(&mut self.q, n), (&mut self.q2, n2)] {
            v.clear();
            v.resize(len, 0);
        }
        self.k.clear();
        self.k.resize(if wide { n } else { 0 }, 0);
        self.d.clear();
        self.d.resize(t * groups, 0.0);
        for (v, len) in [(&mut self.c, t * groups * LANES), (&mut self.c2, l2)] {
            v.clear();
            v.resize(len, 0);
        }
        // Token `j` into `token`; `scaled` is scratch for the column field.
        let one = |j: usize, token: TokenCodes, scaled: &mut Vec<f32>| {
            let mut xr = &x[j * cols..(j + 1) * cols];
            if let Some(col) = col {
                scaled.clear();
                scaled.extend(xr.iter().zip(col).map(|(v, c)| v * c));
                xr = scaled;
            }
            quantize_token(xr, order, split, token);
        };
        // Each token's share of every buffer (empty ones: none).
        fn per_token<T>(v: &mut [T], t: usize) -> impl Iterator<Item = &mut [T]> {
            let len = v.len() / t.max(1);
            let (some, none) = if len == 0 { (0, t) } else { (t, 0) };
            v.chunks_mut(len.max(1))
                .take(some)
                .chain(std::iter::repeat_with(|| &mut [][..]).take(none))
        }
        let tokens = per_token(&mut self.q, t)
            .zip(per_token(&mut self.q2, t))
            .zip(per_token(&mut self.k, t))
            .zip(per_token(&mut self.d, t))
            .zip(per_token(&mut self.c, t))
            .zip(per_token(&mut self.c2, t))
            .map(|(((((q, q2), k), d), c), c2)| TokenCodes { q, q2, k, d, c, c2 });
        if t >= crate::exec::PARALLEL_TOKENS {
            // A prefill's tokens over the pool: on the calling thread alone this was 5% of
            // a 512-token prefill with the other threads waiting.
            let tokens: Vec<_> = tokens.enumerate().collect();
            tokens
                .into_par_iter()
                .for_each_init(Vec::new, |scaled, (j, token)| one(j, token, scaled));
        } else {
            let mut scaled = std::mem::take(&mut self.scaled);
            for (j, token) in tokens.enumerate() {
                one(j, token, &mut scaled);
            }
            self.scaled = scaled;
        }
        self.ks.clear();
        self.kp.clear();
    }

    /// Fills [`QuantizedActs::ks`] from the codes of the last [`QuantizedActs::fill`]
    /// (nothing unless split): the `vbit` row kernels' `L·Σ k`.
    pub fn fill_group_sums(&mut self) {
        let (groups, t) = (self.groups, self.d.len() / self.groups.max(1));
        self.ks.clear();
        if !self.split || groups == 0 {
            return;
        }
        let g8 = groups.next_multiple_of(8);
        self.ks.resize(t * g8, 0);
        let n = groups * STEP;
        let one = |(ks, (q, q2)): (&mut [i32], (&[i8], &[i8]))| {
            let groups = q.chunks_exact(STEP).zip(q2.chunks_exact(STEP));
            for (s, (a, b)) in ks.iter_mut().zip(groups) {
                *s = a
                    .iter()
                    .zip(b)
                    .map(|(&a, &b)| 256 * i32::from(a) + i32::from(b))
                    .sum();
            }
        };
        let (q, q2) = (&self.q, &self.q2);
        if t >= crate::exec::PARALLEL_TOKENS {
            // A prefill's tokens over the pool, as their quantization.
            self.ks
                .par_chunks_exact_mut(g8)
                .zip(q.par_chunks_exact(n).zip(q2.par_chunks_exact(n)))
                .for_each(one);
        } else {
            self.ks
                .chunks_exact_mut(g8)
                .zip(q.chunks_exact(n).zip(q2.chunks_exact(n)))
                .for_each(one);
        }
    }

    /// Fills [`QuantizedActs::kp`] from the int16 codes `k` of the last
    /// [`QuantizedActs::fill`] (nothing without them).
    pub fn fill_pairs16(&mut self) {
        self.kp.clear();
        self.kp.resize(self.k.len(), 0);
        for (kp, k) in self
            .kp
            .chunks_exact_mut(STEP)
            .zip(self.k.chunks_exact(STEP))
        {
            let k: &[i16; STEP] = k.try_into().expect("whole groups");
            place(k, ActOrder::NibblePairs, kp);
        }
    }

    /// Every token's int16 codes `k` (`[t, groups·32]`; empty unless filled) and how many
    /// a token has: for kernels that address them per token without a [`QToken`].
    pub(super) fn codes16(&self) -> (&[i16], usize) {
        (&self.k, self.groups * STEP)
    }

    /// The first `t` tokens' codes, residual codes and scales as stored: what decides
    /// every value derived from them (for a cache keyed on their content).
    pub(super) fn levels(&self, t: usize) -> (&[i8], &[i8], &[f32]) {
        let codes = t * self.groups * STEP;
        let q2 = if self.split { &self.q2[..codes] } else { &[] };
        (&self.q[..codes], q2, &self.d[..t * self.groups])
    }

    /// Whether the tokens carry the residual level (one scale per token).
    pub fn is_split(&self) -> bool {
        self.split
    }

    /// Token `j`.
    pub fn token(&self, j: usize) -> QToken<'_> {
        let g = self.groups;
        let codes = j * g * STEP..(j + 1) * g * STEP;
        let lanes = j * g * LANES..(j + 1) * g * LANES;
        QToken {
            q: &self.q[codes.clone()],
            q2: if self.split {
                &self.q2[codes.clone()]
            } else {
                &[]
            },
            k: if self.k.is_empty() {
                &[]
            } else {
                &self.k[codes.clone()]
            },
            ks: if self.ks.is_empty() {
                &[]
            } else {
                let g8 = g.next_multiple_of(8);
                &self.ks[j * g8..(j + 1) * g8]
            },
            kp: if self.kp.is_empty() {
                &[]
            } else {
                &self.kp[codes.clone()]
            },
            d: &self.d[j * g..(j + 1) * g],
            c: &self.c[lanes.clone()],
            c2: if self.split { &self.c2[lanes] } else { &[] },
        }
    }
}

/// `v` (at most 127.5 in magnitude) rounded to the nearest code, ties to even, by the
/// 1.5·2²³ trick: `v + 1.5·2²³` holds the rounded integer in its low mantissa bits. Read
/// off as bits, it vectorises where `round_ties_even` would be a libm call and a
/// saturating `as i8` a scalar conversion per element.
#[inline(always)]
fn round_code(v: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    let r = (v.clamp(-127.0, 127.0) + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32;
    r as i8
}

/// The `−offset·Σ` lanes of one group's codes (see [`QuantizedActs::c`]).
fn offset_lanes(q: &[i8], offset: i32, lanes: &mut [i32]) {
    for (c, four) in lanes.iter_mut().zip(q.chunks_exact(4)) {
        *c = -offset * four.iter().map(|&v| v as i32).sum::<i32>();
    }
}

/// `R` weight rows as the integer kernels see them.
pub(crate) trait IntRowsScalar {
    /// `q4` layouts: a scale per group (`q8`: per row, in [`IntRowsScalar::int_post`]).
    const GROUP_SCALES: bool;
    fn cols(&self) -> usize;
    /// Signed codes of group `blk` of row `i` in the activation order (`q8`: `q`, zero
    /// padded past `cols`; `q4`: `nibble − 8`, low nibbles then high ones).
    fn codes32(&self, i: usize, blk: usize, out: &mut [i8; STEP]);
    /// Scale of group `blk` of row `i` (`q4`); 1 for `q8`, whose scale is per row.
    fn group_scale(&self, i: usize, blk: usize) -> f32;
    /// Factor of row `i`'s finished sum (`q8`: the row scale).
    fn int_post(&self, i: usize) -> f32;
}

/// SIMD loads of a whole group for the integer kernels.
#[cfg(target_arch = "x86_64")]
pub(crate) trait IntRowsSimd: IntRowsScalar {
    /// Nonzero `o`: codes come as unsigned `u = code + o` (the `q4` nibbles, `o` = 8;
    /// `vbit` on VBMI, `o` = 128): [`load_u8`] returns `u` and the dot starts from the
    /// activations' `−o·Σx` lanes ([`QToken::c`]), exactly `Σ code·x` with one
    /// multiply-add and no sign fix-up. Those lanes are filled for
    /// [`ActOrder::NibblePairs`] (`o` = 8) and [`ActOrder::NaturalOffset`] (`o` = 128)
    /// activations. 0: signed codes, their signs moved onto the activations. An offset
    /// above 8 needs VNNI (`vpmaddubsw` pairs would saturate).
    ///
    /// [`load_u8`]: IntRowsSimd::load_u8
    const CODE_OFFSET: u8 = 0;

    /// The rows' loads use AVX-512 VBMI: the AVX-512 integer kernel then runs in an
    /// instantiation compiled with it. Only rows built where [`Kernel::has_vbmi`] set it.
    const VBMI: bool = false;

    /// The 32 codes of [`IntRowsScalar::codes32`] in the activation order: signed, or
    /// `code + o` (`q4`: the nibbles as stored, low nibbles first) for a nonzero
    /// [`IntRowsSimd::CODE_OFFSET`] `o`.
    ///
    /// # Safety
    /// The CPU supports AVX2; `blk < cols / 32`, `i < R`.
    unsafe fn load_u8(&self, i: usize, blk: usize) -> __m256i;

    /// The 32 codes of [`IntRowsSimd::load_u8`] widened to int16: its bytes 0..16 and
    /// 16..32 (offset codes as there), for [`int16_avx2_target`]. Layouts that can load
    /// them straight from their bytes override it.
    ///
    /// # Safety
    /// As [`IntRowsSimd::load_u8`].
    #[inline(always)]
    unsafe fn load_i16(&self, i: usize, blk: usize) -> [__m256i; 2] {
        widen_codes::<Self>(self.load_u8(i, blk))
    }

    /// The scales of groups `blk` and `blk + 1` of row `i`, each in all 8 lanes (for
    /// [`int16_avx2_target`]). Layouts that store the two side by side override it with
    /// one load and one conversion.
    ///
    /// # Safety
    /// As [`IntRowsSimd::load_u8`], with `blk + 1 < cols / 32`.
    #[inline(always)]
    unsafe fn scale_pair_256(&self, i: usize, blk: usize) -> [__m256; 2] {
        [
            _mm256_set1_ps(self.group_scale_simd(i, blk)),
            _mm256_set1_ps(self.group_scale_simd(i, blk + 1)),
        ]
    }

    /// Asks the cache for what row `i` of the row block after next needs at group `blk`
    /// (two blocks ahead measured faster than one or four). Every register tile asks,
    /// whatever its tokens: a product's first tile streams its rows from DRAM as decode
    /// does, and the later tiles' prefetches of lines already cached cost little.
    /// (Only decode asked until 2026-12-06: a 2-token product cost as much as a 3-token
    /// one, whose last tile is 1 token wide, and asking in every tile ran 2-, 4- and
    /// 8-token prefill 1.2–1.7× faster, `q8` on AVX2 and the exact path; 64-token exact
    /// prefill 1.01–1.07×, the one-level path's 0.95–1.06×; a runtime flag for a
    /// product's first tile only slowed the kernels 6–12%.)
    /// Short rows (a few hundred bytes) end before the hardware prefetcher has learnt
    /// their stream; matrix-vector products stream from DRAM and wait on every load
    /// without this. Into L2 (`_MM_HINT_T1`), not L1: weights are read once per token,
    /// and pulling them into L1 evicted the activations every row reuses (T0 measured
    /// 30–40% slower decode on SmolLM2 and Qwen2.5 at 8 bits). Every layout with an
    /// integer kernel implements it; `vbit`, whose rows differ in length, finds the row
    /// ahead through its row index. The kernels call it for every group (the paired ones
    /// for both groups of a pair; [`nibble_pairs_avx2`] for the first and third of each
    /// four, 64 `q4` nibble bytes); layouts whose groups are under 64 bytes act on even
    /// groups only (`blk % 2`, a test the paired kernels drop) or on the first group in a
    /// line where that test is a power-of-two mask (`q4_block`): a per-line test on
    /// 9- or 18-byte groups cost a multiply and an irregular branch per row and group.
    ///
    /// # Safety
    /// As [`IntRowsSimd::load_u8`] (the address may lie outside the payload: a prefetch
    /// never faults).
    #[inline(always)]
    unsafe fn prefetch_next(&self, _i: usize, _blk: usize) {}

    /// [`IntRowsSimd::prefetch_next`] for the prefill packers of [`super::panel`], which
    /// read 16 rows a group at a time: the same unless a layout spaces its decode
    /// prefetches out in bursts that a packer's 16 rows would pile up.
    ///
    /// # Safety
    /// As [`IntRowsSimd::prefetch_next`].
    #[inline(always)]
    unsafe fn prefetch_pack(&self, i: usize, blk: usize) {
        self.prefetch_next(i, blk)
    }

    /// [`IntRowsScalar::group_scale`], free to use F16C.
    ///
    /// # Safety
    /// As [`IntRowsSimd::load_u8`].
    #[inline(always)]
    unsafe fn group_scale_simd(&self, i: usize, blk: usize) -> f32 {
        self.group_scale(i, blk)
    }

    /// Group `blk`'s scales of rows 0–7 ([`IntRowsSimd::group_scale_simd`] each), for the
    /// AVX2 int16 packer; layouts with plain f16 scales convert all eight at once.
    ///
    /// # Safety
    /// As [`IntRowsSimd::load_u8`] for rows 0–7 (the rows hold at least 8).
    #[inline(always)]
    unsafe fn group_scales8(&self, blk: usize) -> __m256 {
        let s: [f32; 8] = std::array::from_fn(|i| self.group_scale_simd(i, blk));
        _mm256_loadu_ps(s.as_ptr())
    }

    /// The rows bring their own kernel of the two-level AVX-512 VNNI products, a row at a
    /// time ([`IntRowsSimd::row_dot_vnni`]), which [`int_body512`] runs instead of its loop.
    const ROW_DOT_VNNI: bool = false;

    /// [`IntRowsSimd::row_dot_i16`] against the tokens' two byte levels `q`, `q₂` with AVX-512
    /// VNNI (and whatever else the rows' loads need). Only for [`IntRowsSimd::ROW_DOT_VNNI`]
    /// layouts.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C (and the rows' own features); `i < R`, the
    /// tokens are split and hold `cols` codes per level.
    #[inline(always)]
    unsafe fn row_dot_vnni<const T: usize>(&self, _i: usize, _xs: &[QToken; T]) -> [f32; T] {
        unreachable!("row_dot_vnni of a layout without ROW_DOT_VNNI")
    }

    /// The rows bring their own kernel of the int16 products, a row at a time
    /// ([`IntRowsSimd::row_dot_i16`]), which [`int16_avx2_target`] runs instead of its
    /// loop over groups.
    const ROW_DOT_I16: bool = false;

    /// Row `i` against the split tokens `xs` (their int16 codes [`QToken::k`]): per token,
    /// the sum over the row's groups of the group's scale times its exact integer
    /// `Σ code·k`, before the token's scale and [`IntRowsScalar::int_post`]. Each token
    /// sees the same operations whatever `T`, so `matmul` stays equal to its `matvec`s.
    /// Only for [`IntRowsSimd::ROW_DOT_I16`] layouts.
    ///
    /// With `VNNI`, each multiply-add of int16 pairs into a sum is AVX-VNNI's one
    /// `vpdpwssd` where AVX2 takes `vpmaddwd` and `vpaddd` (the same integers).
    ///
    /// # Safety
    /// AVX2, FMA and F16C, and AVX-VNNI when `VNNI`; `i < R`, every token's `k` holds
    /// `cols` codes.
    #[inline(always)]
    unsafe fn row_dot_i16<const T: usize, const VNNI: bool>(
        &self,
        _i: usize,
        _xs: &[QToken; T],
    ) -> [f32; T] {
        unreachable!("row_dot_i16 of a layout without ROW_DOT_I16")
    }

    /// The rows are `q4` nibbles (16 bytes a group, byte `j` holding codes `j` and
    /// `j + 16` offset by 8): [`IntRowsSimd::nibble_pair`] is implemented, and the int16
    /// products run [`nibble_pairs_avx2`] (AVX2, or AVX-512 without VNNI) instead of
    /// [`int16_avx2_target`], or [`nibble_pairs_avx512`] (AVX-512 VNNI) instead of
    /// [`int_body512`].
    const NIBBLE_PAIRS: bool = false;

    /// The 16 nibble bytes of group `blk` of row `i` in the low 128 bits, those of group
    /// `blk + 1` in the high 128 bits. Only for [`IntRowsSimd::NIBBLE_PAIRS`] layouts.
    ///
    /// # Safety
    /// As [`IntRowsSimd::scale_pair_256`].
    #[inline(always)]
    unsafe fn nibble_pair(&self, _i: usize, _blk: usize) -> __m256i {
        unreachable!("nibble_pair of a layout without NIBBLE_PAIRS")
    }

    /// The 16 nibble bytes of group `blk` of row `i`. Only for
    /// [`IntRowsSimd::NIBBLE_PAIRS`] layouts.
    ///
    /// # Safety
    /// As [`IntRowsSimd::load_u8`].
    #[inline(always)]
    unsafe fn nibbles(&self, _i: usize, _blk: usize) -> __m128i {
        unreachable!("nibbles of a layout without NIBBLE_PAIRS")
    }

    /// The scales of groups `blk .. blk + 4` of row `i`. Layouts that store them side by
    /// side override it with one load and one conversion.
    ///
    /// # Safety
    /// As [`IntRowsSimd::load_u8`], with `blk + 3 < cols / 32`.
    #[inline(always)]
    unsafe fn scale_quad(&self, i: usize, blk: usize) -> __m128 {
        _mm_setr_ps(
            self.group_scale_simd(i, blk),
            self.group_scale_simd(i, blk + 1),
            self.group_scale_simd(i, blk + 2),
            self.group_scale_simd(i, blk + 3),
        )
    }

    /// Groups `blk` and `blk + 1` of row `i` as [`IntRowsSimd::load_u8`] gives them, in the
    /// low and the high 256 bits. Layouts that store the two side by side override it with
    /// one load (decode is bound by these instructions, not by memory, at 4 bits).
    ///
    /// # Safety
    /// As [`IntRowsSimd::load_u8`], with AVX-512 F/BW and `blk + 1 < cols / 32`.
    #[inline(always)]
    unsafe fn load_pair_u8(&self, i: usize, blk: usize) -> __m512i {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(self.load_u8(i, blk)),
            self.load_u8(i, blk + 1),
        )
    }

    /// The scales of groups `blk` and `blk + 1` of row `i`
    /// ([`IntRowsSimd::group_scale_simd`]) in lanes 0–7 and 8–15.
    ///
    /// # Safety
    /// As [`IntRowsSimd::load_pair_u8`].
    #[inline(always)]
    unsafe fn pair_scales(&self, i: usize, blk: usize) -> __m512 {
        pair_vector(
            self.group_scale_simd(i, blk),
            self.group_scale_simd(i, blk + 1),
        )
    }
}

/// A group's 32 codes as [`IntRowsSimd::load_u8`] gives them, widened to two vectors of 16
/// int16 (zero-extended when offset, else sign-extended).
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn widen_codes<D: IntRowsSimd + ?Sized>(raw: __m256i) -> [__m256i; 2] {
    let (lo, hi) = (
        _mm256_castsi256_si128(raw),
        _mm256_extracti128_si256::<1>(raw),
    );
    if D::CODE_OFFSET != 0 {
        [_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi)]
    } else {
        [_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi)]
    }
}

/// Asks L2 for `lines` cache lines from byte `at` of the row `2·R` rows after `row`: the
/// row block after next, for layouts whose rows are contiguous and equally long (the
/// float payloads, the `q4` nibble planes, tiles and scales, `q1t`'s repacked words).
///
/// # Safety
/// SSE (a prefetch never faults, so the address may lie past the payload).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead<const R: usize>(row: &[impl Copy], at: usize, lines: usize) {
    let p = (row.as_ptr() as *const u8).wrapping_add(at + 2 * R * std::mem::size_of_val(row));
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * l) as *const i8);
    }
}

/// `s0` in lanes 0–7 and `s1` in lanes 8–15 ([`IntRowsSimd::pair_scales`]).
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn pair_vector(s0: f32, s1: f32) -> __m512 {
    // `insertf32x8` would need AVX-512 DQ; the 64-bit form is AVX-512 F.
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castps_pd(_mm512_castps256_ps512(_mm256_set1_ps(s0))),
        _mm256_castps_pd(_mm256_set1_ps(s1)),
    ))
}

/// Everything an integer row block must implement on this target.
#[cfg(target_arch = "x86_64")]
pub(crate) trait IntRows: IntRowsSimd {}
#[cfg(target_arch = "x86_64")]
impl<D: IntRowsSimd> IntRows for D {}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) trait IntRows: IntRowsScalar {}
#[cfg(not(target_arch = "x86_64"))]
impl<D: IntRowsScalar> IntRows for D {}

/// Whether the CPU runs [`Kernel::Avx512`] and has AVX-512 VNNI (`vpdpbusd` on 256-bit
/// registers).
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    features() & (F_AVX512 | F_VNNI) == F_AVX512 | F_VNNI
}

/// `out[i][j] = row_i · token_j` with quantized activations.
#[inline]
pub(crate) fn run_int<D: IntRows, const R: usize, const T: usize>(
    k: Kernel,
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    let groups = d.cols().div_ceil(STEP);
    let split = xs.first().is_some_and(|x| x.split());
    let (n2, l2) = if split {
        (groups * STEP, groups * LANES)
    } else {
        (0, 0)
    };
    for x in xs {
        assert!(x.q.len() == groups * STEP && x.d.len() == groups && x.c.len() == groups * LANES);
        assert!(
            x.q2.len() == n2 && x.c2.len() == l2,
            "tokens of one block split alike"
        );
        // The row kernels read the per-group sums 8 at a time.
        #[cfg(target_arch = "x86_64")]
        assert!(
            !(split && (D::ROW_DOT_I16 || D::ROW_DOT_VNNI))
                || x.ks.len() == groups.next_multiple_of(8),
            "split products of row-kernel layouts take the per-group sums"
        );
    }
    if split && !D::GROUP_SCALES {
        for x in xs {
            assert_eq!(
                x.k.len(),
                groups * STEP,
                "row-scaled split products take int16 codes"
            );
        }
        return run_wide::<D, R, T>(k, d, xs, out);
    }
    // Split tokens with their int16 codes: the kernels that sum those (per level below).
    let int16 = split && xs.iter().all(|x| x.k.len() == groups * STEP);
    match k {
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon => super::neon::int_neon::<D, R, T>(d, xs, out),
        // SAFETY: AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C are present (checked in the
        // guard), the activation lengths were checked above and the int16 codes are there
        // (`int16`).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if has_vnni() && int16 && D::NIBBLE_PAIRS => unsafe {
            nibble_pairs_avx512::<D, R, T>(d, xs, out)
        },
        // SAFETY: AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C are present (checked in the
        // guard), and the activation lengths were checked above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if has_vnni() => unsafe {
            if split {
                int_avx::<D, R, T, true, true>(d, xs, out)
            } else {
                int_avx::<D, R, T, true, false>(d, xs, out)
            }
        },
        // SAFETY: `AvxVnni` is a level this CPU has (AVX2, FMA, F16C and AVX-VNNI), and the
        // int16 codes are there (`int16`).
        #[cfg(target_arch = "x86_64")]
        Kernel::AvxVnni if Kernel::AvxVnni.is_available() && int16 && D::ROW_DOT_I16 => unsafe {
            row_dot_i16_avxvnni_target::<D, R, T>(d, xs, out)
        },
        // SAFETY: AVX2/FMA/F16C are present (checked in the guard; `Avx512` implies them),
        // and so are the int16 codes (`int16`).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 | Kernel::Avx2 | Kernel::AvxVnni
            if Kernel::Avx2.is_available() && int16 && D::GROUP_SCALES && D::CODE_OFFSET <= 8 =>
        unsafe {
            if D::NIBBLE_PAIRS {
                nibble_pairs_avx2::<D, R, T>(d, xs, out)
            } else {
                int16_avx2_target::<D, R, T>(d, xs, out)
            }
        },
        // SAFETY: AVX2/FMA/F16C are present (checked in the guard; `Avx512` implies them).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 | Kernel::Avx2 | Kernel::AvxVnni if Kernel::Avx2.is_available() => unsafe {
            if split {
                int_avx::<D, R, T, false, true>(d, xs, out)
            } else {
                int_avx::<D, R, T, false, false>(d, xs, out)
            }
        },
        _ => int_scalar::<D, R, T>(d, xs, out),
    }
}

/// The scalar reference of the integer kernels.
pub(crate) fn int_scalar<D: IntRowsScalar, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    int_rows_with::<D, R, T>(d, xs, out, |c, q| {
        c.iter().zip(q).map(|(&w, &v)| w as i32 * v as i32).sum()
    })
}

/// [`int_scalar`]'s loop with each group's exact dot `dot(codes, activation codes)`
/// supplied: the scalar one, or a SIMD one that gives the same integers
/// ([`super::neon`]), so that everything around the sums, and so the values, are the
/// scalar kernel's.
#[inline(always)]
pub(crate) fn int_rows_with<D: IntRowsScalar, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
    dot: impl Fn(&[i8; STEP], &[i8; STEP]) -> i32,
) {
    let mut acc = [[0f32; T]; R];
    let mut c = [0i8; STEP];
    for blk in 0..d.cols().div_ceil(STEP) {
        for (i, acc_i) in acc.iter_mut().enumerate() {
            d.codes32(i, blk, &mut c);
            let s = d.group_scale(i, blk);
            for (a, x) in acc_i.iter_mut().zip(xs) {
                let codes = blk * STEP..(blk + 1) * STEP;
                let level = |q: &[i8]| dot(&c, q[codes.clone()].try_into().expect("32 codes"));
                let mut sum = level(x.q);
                if x.split() {
                    sum = (sum << SPLIT_SHIFT) + level(x.q2);
                }
                *a += sum as f32 * s * x.d[blk];
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

/// AVX2 / AVX-512 VNNI integer kernel, 8 lanes, one group per step. The rows of a step
/// are loaded first, then each token's codes meet the `R` rows.
///
/// The instructions multiply unsigned by signed bytes, so `Σ c·xq = Σ |c|·sign(xq, c)`
/// puts the weight codes `c` (`q8`: `q`; `q4`: `nibble − 8`) in the unsigned operand:
/// `|−128|` fits a u8, and `−xq` cannot overflow as `|xq| ≤ 127`. (Using unsigned nibbles
/// and subtracting `8·Σxq` would save an op, but the lanes would then carry large
/// cancelling values whose f32 rounding no longer scales with `Σ|w·x|`.) The products
/// are `vpdpbusd` (VNNI) or `vpmaddubsw` + `vpmaddwd` (AVX2; a pair of u8·i8 products is
/// at most 2·128·127 < 2¹⁵, so the i16 step never saturates). Lane sums stay below 2²⁴,
/// so their conversion to f32 is exact.
///
/// # Safety
/// The CPU supports AVX2 + FMA + F16C, and AVX-512 F/BW/VL/VNNI when `VNNI`; the token
/// lengths match `d` (checked by [`run_int`]).
macro_rules! int_body512_target {
    ($(#[$attr:meta])* $name:ident, $features:literal) => {
        $(#[$attr])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<D: IntRowsSimd, const R: usize, const T: usize, const SPLIT: bool>(
            d: &D,
            xs: &[QToken; T],
            out: &mut [[f32; T]; R],
        ) {
            int_body512::<D, R, T, SPLIT>(d, xs, out)
        }
    };
}

int_body512_target!(
    /// [`int_body512`] compiled for AVX-512 VNNI (see the macro above for the kernel).
    int_avx512_vnni_target,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
int_body512_target!(
    /// [`int_avx512_vnni_target`] for rows whose loads use AVX-512 VBMI
    /// ([`IntRowsSimd::VBMI`]): the same body, in an instantiation of its own, because the
    /// compiler may emit VBMI anywhere in a function compiled with it and CPUs with VNNI
    /// but no VBMI (Cascade Lake) run the other one. Safety: as there, and VBMI present.
    int_avx512_vbmi_target,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c"
);

/// See [`int_avx512_vnni_target`].
///
/// # Safety
/// As [`int_avx512_vnni_target`] without VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int_avx2_target<D: IntRowsSimd, const R: usize, const T: usize, const SPLIT: bool>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    int_body::<D, R, T, false, SPLIT>(d, xs, out)
}

/// Dispatch to the two target-feature instantiations.
///
/// # Safety
/// See [`int_avx512_vnni_target`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn int_avx<
    D: IntRowsSimd,
    const R: usize,
    const T: usize,
    const VNNI: bool,
    const SPLIT: bool,
>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    debug_assert!(VNNI || D::CODE_OFFSET <= 8, "offset codes past 8 need VNNI");
    if VNNI && D::VBMI {
        int_avx512_vbmi_target::<D, R, T, SPLIT>(d, xs, out)
    } else if VNNI {
        int_avx512_vnni_target::<D, R, T, SPLIT>(d, xs, out)
    } else {
        int_avx2_target::<D, R, T, SPLIT>(d, xs, out)
    }
}

/// The body of the integer kernels; inlined into a target-feature function.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn int_body<
    D: IntRowsSimd,
    const R: usize,
    const T: usize,
    const VNNI: bool,
    const SPLIT: bool,
>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    let n = d.cols();
    let full = n / STEP;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut raw = [_mm256_setzero_si256(); R];
    for blk in 0..full {
        for (i, r) in raw.iter_mut().enumerate() {
            *r = d.load_u8(i, blk);
            d.prefetch_next(i, blk);
        }
        int_step::<D, R, T, VNNI, SPLIT>(d, xs, blk, &raw, &mut acc);
    }
    if full * STEP < n {
        // A partial last group (`q8` only: `q4` rows are whole groups), outside the loop
        // so that its call does not force the accumulators out of registers.
        for (i, r) in raw.iter_mut().enumerate() {
            *r = partial_codes(d, i, full);
        }
        int_step::<D, R, T, VNNI, SPLIT>(d, xs, full, &raw, &mut acc);
    }
    int_sums::<D, R, T, SPLIT>(d, xs, &acc, out);
}

/// The outputs of the 8-lane integer kernels: each accumulator's lanes summed, times the
/// token's remaining scale and the row's post factor.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn int_sums<D: IntRowsSimd, const R: usize, const T: usize, const SPLIT: bool>(
    d: &D,
    xs: &[QToken; T],
    acc: &[[__m256; T]; R],
    out: &mut [[f32; T]; R],
) {
    for (i, (o, a)) in out.iter_mut().zip(acc).enumerate() {
        let p = d.int_post(i);
        for ((o, a), x) in o.iter_mut().zip(a).zip(xs) {
            *o = hsum256(*a) * token_scale::<SPLIT>(x) * p;
        }
    }
}

/// [`int16_avx2_target`]'s row kernels ([`IntRowsSimd::ROW_DOT_I16`]) with AVX-VNNI's
/// `vpdpwssd` (`vbit` decode at the `avxvnni` level).
///
/// # Safety
/// AVX2, FMA, F16C and AVX-VNNI; `D::ROW_DOT_I16`, and every token split with its int16
/// codes (checked by [`run_int`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn row_dot_i16_avxvnni_target<D: IntRowsSimd, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    for (i, o) in out.iter_mut().enumerate() {
        row_outputs(d, i, d.row_dot_i16::<T, true>(i, xs), xs, o);
    }
}

/// The two-level grouped kernel without VNNI: a token's int16 codes `k = 256·q + q₂`
/// against the weight codes widened to int16, one `vpmaddwd` per 16 codes. A group's
/// integer `Σ c·k = 256·Σ c·q + Σ c·q₂` is the one [`int_step`] forms from both byte
/// levels (two `vpmaddubsw`, two `vpmaddwd`, a shift), here in two multiplies: the
/// multiplier ports bound this loop in decode (AVX2 `q4_block` decode ran at a third of
/// the DRAM bandwidth on one core; `q4` rows now run [`nibble_pairs_avx2`], which shares
/// [`int16_step`] for an odd last group). Offset codes (`q4`: `u = c + 8`) start from
/// `−8·Σ k`, two more `vpmaddwd` per token and group, shared by the `R` rows. A lane sums
/// four products: |c·k| ≤ 128·32639, so lanes stay below 2²⁴ and convert to f32
/// exactly; each (row, token) pair sees the same operations whatever `R` and `T`.
///
/// # Safety
/// AVX2, FMA and F16C; `D::GROUP_SCALES`, `D::CODE_OFFSET ≤ 8`, and every token split
/// with its int16 codes (checked by [`run_int`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int16_avx2_target<D: IntRowsSimd, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    if D::ROW_DOT_I16 {
        for (i, o) in out.iter_mut().enumerate() {
            row_outputs(d, i, d.row_dot_i16::<T, false>(i, xs), xs, o);
        }
        return;
    }
    let full = d.cols() / STEP;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    // Two groups per step: a row's two scales come from one load where the layout keeps
    // them together. Each accumulator still adds group `blk`, then `blk + 1`.
    let pairs = full / 2;
    for pair in 0..pairs {
        let blk = 2 * pair;
        let mut tok = [[[_mm256_setzero_si256(); 3]; 2]; T];
        for (t, x) in tok.iter_mut().zip(xs) {
            *t = [token_i16::<D>(x, blk), token_i16::<D>(x, blk + 1)];
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            let w = [d.load_i16(i, blk), d.load_i16(i, blk + 1)];
            d.prefetch_next(i, blk);
            d.prefetch_next(i, blk + 1);
            let s = d.scale_pair_256(i, blk);
            for (a, t) in acc.iter_mut().zip(&tok) {
                for h in 0..2 {
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_i16(w[h], t[h])), s[h], *a);
                }
            }
        }
    }
    let mut w = [[_mm256_setzero_si256(); 2]; R];
    for blk in 2 * pairs..full {
        for (i, w) in w.iter_mut().enumerate() {
            *w = d.load_i16(i, blk);
            d.prefetch_next(i, blk);
        }
        int16_step::<D, R, T>(d, xs, blk, &w, &mut acc);
    }
    if full * STEP < d.cols() {
        // A partial last group, outside the loop (see `int_body`).
        for (i, w) in w.iter_mut().enumerate() {
            *w = widen_codes::<D>(partial_codes(d, i, full));
        }
        int16_step::<D, R, T>(d, xs, full, &w, &mut acc);
    }
    int_sums::<D, R, T, true>(d, xs, &acc, out);
}

/// [`int16_avx2_target`] for `q4` nibble rows ([`IntRowsSimd::NIBBLE_PAIRS`]), with a
/// pair of groups in each vector: decode at 4 bits was bound by instructions, not memory
/// (a cache-warm 2048×2048 product streamed 10 GiB/s per core on Zen 2, under the DRAM's
/// share), and the one-group-per-vector kernel spent a conversion, an FMA and two scale
/// broadcasts per group, plus its row overhead.
///
/// A pair's 32 nibble bytes (group `g` in 128-bit lane `g`) unpack to words with zero,
/// which keeps the lanes: words `[g₀ bytes 0–7 | g₁ bytes 0–7]` and `[g₀ 8–15 | g₁ 8–15]`,
/// each masked (codes `j`) and shifted (codes `j + 16`) ([`nibble_words`]). The tokens'
/// int16 codes are permuted to match once per pair and block of rows
/// ([`pair_token_i16`]), so each `vpmaddwd` serves both groups: lanes 0–3 hold group
/// `blk`'s products and lanes 4–7 group `blk + 1`'s, one conversion and one FMA against
/// `[s₀ ×4 | s₁ ×4]` finish the pair, and a row's four scales come from one load. A lane
/// sums eight products `(u − 8)·k`: |·| ≤ 8·8·32639 < 2²⁴, exact in f32 as in
/// [`int16_avx2_target`]. Each (row, token) pair sees the same operations whatever `R`
/// and `T`, so short products (under [`super::panel`]'s `q4` minimum) equal their
/// matrix-vector products bit for bit.
///
/// # Safety
/// As [`int16_avx2_target`], and `D::NIBBLE_PAIRS`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_pairs_avx2<D: IntRowsSimd, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    debug_assert!(D::NIBBLE_PAIRS && D::CODE_OFFSET == 8);
    debug_assert_eq!(d.cols() % STEP, 0, "q4 rows are whole groups");
    let full = d.cols() / STEP;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    // Four groups per row and step: 64 nibble bytes (one line) and one load of scales.
    let quads = full / 4;
    let (lo_pair, hi_pair) = (
        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
        _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
    );
    for quad in 0..quads {
        let blk = 4 * quad;
        let mut tok = [[[_mm256_setzero_si256(); 5]; 2]; T];
        for (t, x) in tok.iter_mut().zip(xs) {
            *t = [pair_token_i16(x, blk), pair_token_i16(x, blk + 2)];
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            d.prefetch_next(i, blk);
            d.prefetch_next(i, blk + 2);
            let s = _mm256_castps128_ps256(d.scale_quad(i, blk));
            for (h, idx) in [lo_pair, hi_pair].into_iter().enumerate() {
                let s = _mm256_permutevar8x32_ps(s, idx);
                let t = std::array::from_fn(|j| tok[j][h]);
                pair_step(d, i, blk + 2 * h, s, &t, acc);
            }
        }
    }
    let mut blk = 4 * quads;
    if blk + 2 <= full {
        let mut tok = [[_mm256_setzero_si256(); 5]; T];
        for (t, x) in tok.iter_mut().zip(xs) {
            *t = pair_token_i16(x, blk);
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            let [s0, s1] = d.scale_pair_256(i, blk);
            pair_step(d, i, blk, _mm256_blend_ps::<0xF0>(s0, s1), &tok, acc);
        }
        blk += 2;
    }
    if blk < full {
        let mut w = [[_mm256_setzero_si256(); 2]; R];
        for (i, w) in w.iter_mut().enumerate() {
            *w = d.load_i16(i, blk);
        }
        int16_step::<D, R, T>(d, xs, blk, &w, &mut acc);
    }
    int_sums::<D, R, T, true>(d, xs, &acc, out);
}

/// [`nibble_pairs_avx2`] on 512 bits with AVX-512 VNNI: the two-level `q4` row kernels'
/// products as one `vpdpwssd` per 32 nibbles against the tokens' int16 codes
/// `k = 256·q + q₂`, where [`int_body512`] spends two `vpdpbusd` (one per byte level), a
/// shift and an add: the same exact integers `Σ c·k`, so the same values up to the order
/// of the lanes' f32 rounding. A pair's 32 nibble bytes widen to words in one
/// `vpmovzxbw` (group `blk` in words 0–15, group `blk + 1` in 16–31), masked for the low
/// nibbles (codes `0..16`) and shifted for the high ones (codes `16..32`); the token's
/// codes are arranged to match once per pair and block of rows (two 128-bit shuffles,
/// [`pair_token_512`]), with the `−8·Σ k` lanes the dot starts from. Lanes 0–7 then hold
/// group `blk`'s sums and lanes 8–15 group `blk + 1`'s, one conversion and one FMA against
/// [`IntRowsSimd::pair_scales`] finish the pair. A lane sums four products `(u − 8)·k`:
/// |·| ≤ 4·8·32639 < 2²⁴, exact in f32. Four groups per step: their scales come from one
/// load and one conversion, spread to each pair by a permute, where a conversion and a
/// permute per pair kept the port of the conversions and multiply-adds busier (SmolLM2-135M
/// decode 1.07–1.10× on the three `q4` layouts, Qwen2.5-Coder-0.5B 0.99–1.11×). Each
/// (row, token) pair sees the same operations whatever `R` and `T`, so short products
/// equal their matrix-vector products bit for bit.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `D::NIBBLE_PAIRS`, and every token split
/// with its int16 codes (checked by [`run_int`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibble_pairs_avx512<D: IntRowsSimd, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    debug_assert!(D::NIBBLE_PAIRS && D::CODE_OFFSET == 8);
    debug_assert_eq!(d.cols() % STEP, 0, "q4 rows are whole groups");
    let full = d.cols() / STEP;
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    // Four groups per row and step: their scales in one conversion ([`IntRowsSimd::scale_quad`]),
    // spread to each pair's lanes by one permute.
    let spread = [
        _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
        _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
    ];
    for quad in 0..full / 4 {
        let blk = 4 * quad;
        let mut tok = [[[_mm512_setzero_si512(); 3]; 2]; T];
        for (t, x) in tok.iter_mut().zip(xs) {
            *t = [pair_token_512(x, blk), pair_token_512(x, blk + 2)];
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            for g in blk..blk + 4 {
                d.prefetch_next(i, g);
            }
            let s4 = _mm512_castps128_ps512(d.scale_quad(i, blk));
            for (h, spread) in spread.into_iter().enumerate() {
                let s = _mm512_permutexvar_ps(spread, s4);
                let t = std::array::from_fn(|j| tok[j][h]);
                pair_step512(d, i, blk + 2 * h, s, &t, acc);
            }
        }
    }
    let mut blk = 4 * (full / 4);
    if blk + 2 <= full {
        let mut tok = [[_mm512_setzero_si512(); 3]; T];
        for (t, x) in tok.iter_mut().zip(xs) {
            *t = pair_token_512(x, blk);
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            d.prefetch_next(i, blk);
            d.prefetch_next(i, blk + 1);
            pair_step512(d, i, blk, d.pair_scales(i, blk), &tok, acc);
        }
        blk += 2;
    }
    // The odd last group, 8 lanes at a time.
    let mut acc8 = [[_mm256_setzero_ps(); T]; R];
    if blk < full {
        let mut w = [[_mm256_setzero_si256(); 2]; R];
        for (i, w) in w.iter_mut().enumerate() {
            *w = d.load_i16(i, full - 1);
        }
        int16_step::<D, R, T>(d, xs, full - 1, &w, &mut acc8);
    }
    for (i, (o, (a, a8))) in out.iter_mut().zip(acc.iter().zip(&acc8)).enumerate() {
        let p = d.int_post(i);
        for ((o, (a, a8)), x) in o.iter_mut().zip(a.iter().zip(a8)).zip(xs) {
            *o = (_mm512_reduce_add_ps(*a) + hsum256(*a8)) * token_scale::<true>(x) * p;
        }
    }
}

/// One pair of groups of [`nibble_pairs_avx512`]: groups `blk` and `blk + 1` of row `i`,
/// scaled by `s` (`[s₀ ×8 | s₁ ×8]`), against the `T` tokens' [`pair_token_512`].
///
/// # Safety
/// As [`nibble_pairs_avx512`], with `blk + 1 < cols / 32`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pair_step512<D: IntRowsSimd, const T: usize>(
    d: &D,
    i: usize,
    blk: usize,
    s: __m512,
    tok: &[[__m512i; 3]; T],
    acc: &mut [__m512; T],
) {
    let w = _mm512_cvtepu8_epi16(d.nibble_pair(i, blk));
    let (lo, hi) = (
        _mm512_and_si512(w, _mm512_set1_epi16(0x0F)),
        _mm512_srli_epi16::<4>(w),
    );
    for (a, [ka, kb, start]) in acc.iter_mut().zip(tok) {
        let dot = dpwssd512(dpwssd512(*start, lo, *ka), hi, *kb);
        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, *a);
    }
}

/// `vpdpwssd` as one instruction (`acc + Σ a·b` over each 32-bit lane's two int16 pairs),
/// written out: from the intrinsic the compiler emits `vpmaddwd` + `vpaddd` wherever the
/// sum it adds to comes from another multiply-add (the `q4` kernel's start lanes shared by
/// the rows, the first product of a `vbit` group): two instructions where the CPU runs
/// one. The AVX-512 `q4` decode ran no faster than the byte levels until this (0.97–0.98);
/// `vbit`'s AVX-VNNI kernel kept 176 of its 1038 (`objdump`). Where the sum is a loop's
/// own accumulator (the panels, the `q8` row kernels) the intrinsic stays one instruction.
macro_rules! dpwssd_asm {
    ($(#[$doc:meta])* $vis:vis $name:ident, $ty:ty, $reg:ident, $features:literal, $insn:literal) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        #[inline]
        $vis unsafe fn $name(acc: $ty, a: $ty, b: $ty) -> $ty {
            let mut r = acc;
            std::arch::asm!(
                $insn,
                r = inout($reg) r,
                a = in($reg) a,
                b = in($reg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
            r
        }
    };
}

dpwssd_asm!(
    /// [`dpwssd_asm`] on 512 bits (the `q4` row kernels at AVX-512 VNNI).
    ///
    /// # Safety
    /// AVX-512 F/VNNI.
    dpwssd512, __m512i, zmm_reg, "avx512f,avx512vnni", "vpdpwssd {r}, {a}, {b}"
);
dpwssd_asm!(
    /// [`dpwssd_asm`] on 256 bits with AVX-VNNI (the `vbit` row kernels at `avxvnni`).
    ///
    /// # Safety
    /// AVX2 and AVX-VNNI.
    pub(crate) dpwssd256, __m256i, ymm_reg, "avx2,avxvnni", "{{vex}} vpdpwssd {r}, {a}, {b}"
);

/// Groups `blk` and `blk + 1` of token `x` for [`nibble_pairs_avx512`]: the int16 codes
/// `0..16` of both groups (group `blk`'s in the low 256 bits), codes `16..32` of both,
/// and the `−8·Σ k` lanes of the pair's dot.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `x.k` holds groups `blk` and `blk + 1`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pair_token_512(x: &QToken, blk: usize) -> [__m512i; 3] {
    let at = x.k.as_ptr().add(blk * STEP);
    let (g0, g1) = (
        _mm512_loadu_si512(at as *const _),
        _mm512_loadu_si512(at.add(STEP) as *const _),
    );
    let ka = _mm512_shuffle_i64x2::<0b01_00_01_00>(g0, g1);
    let kb = _mm512_shuffle_i64x2::<0b11_10_11_10>(g0, g1);
    let o = _mm512_set1_epi16(-8);
    let start = _mm512_dpwssd_epi32(_mm512_madd_epi16(ka, o), kb, o);
    [ka, kb, start]
}

/// One pair of groups of [`nibble_pairs_avx2`]: groups `blk` and `blk + 1` of row `i`,
/// scaled by `s` (`[s₀ ×4 | s₁ ×4]`), against the `T` tokens' [`pair_token_i16`].
///
/// # Safety
/// As [`nibble_pairs_avx2`], with `blk + 1 < cols / 32`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pair_step<D: IntRowsSimd, const T: usize>(
    d: &D,
    i: usize,
    blk: usize,
    s: __m256,
    tok: &[[__m256i; 5]; T],
    acc: &mut [__m256; T],
) {
    let w = nibble_words(d.nibble_pair(i, blk));
    for (a, t) in acc.iter_mut().zip(tok) {
        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair_dot(&w, t)), s, *a);
    }
}

/// Groups `blk` and `blk + 1` of token `x` for [`pair_dot`]: its int16 codes in the
/// order of [`nibble_words`] (codes 0–7, 16–23, 8–15, 24–31, each with group `blk`'s in
/// the low 128 bits and group `blk + 1`'s in the high), and the `−8·Σ k` lanes the dot
/// starts from (lanes 0–3 group `blk`, 4–7 group `blk + 1`).
///
/// # Safety
/// AVX2; `x.k` holds groups `blk` and `blk + 1`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pair_token_i16(x: &QToken, blk: usize) -> [__m256i; 5] {
    let at = x.k.as_ptr().add(blk * STEP);
    let load = |o: usize| _mm256_loadu_si256(at.add(o) as *const __m256i);
    let (a0, b0, a1, b1) = (load(0), load(16), load(STEP), load(STEP + 16));
    let k = [
        _mm256_permute2x128_si256::<0x20>(a0, a1),
        _mm256_permute2x128_si256::<0x20>(b0, b1),
        _mm256_permute2x128_si256::<0x31>(a0, a1),
        _mm256_permute2x128_si256::<0x31>(b0, b1),
    ];
    let o = _mm256_set1_epi16(-8);
    let start = _mm256_add_epi32(
        _mm256_add_epi32(_mm256_madd_epi16(k[0], o), _mm256_madd_epi16(k[1], o)),
        _mm256_add_epi32(_mm256_madd_epi16(k[2], o), _mm256_madd_epi16(k[3], o)),
    );
    [k[0], k[1], k[2], k[3], start]
}

/// A pair of groups' nibble bytes ([`IntRowsSimd::nibble_pair`]) as four vectors of
/// int16 codes `u = c + 8`: codes 0–7, 16–23, 8–15 and 24–31, group `blk`'s in the low
/// 128 bits and group `blk + 1`'s in the high.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn nibble_words(raw: __m256i) -> [__m256i; 4] {
    let zero = _mm256_setzero_si256();
    let mask = _mm256_set1_epi16(0x0F);
    let (lo, hi) = (
        _mm256_unpacklo_epi8(raw, zero),
        _mm256_unpackhi_epi8(raw, zero),
    );
    [
        _mm256_and_si256(lo, mask),
        _mm256_srli_epi16::<4>(lo),
        _mm256_and_si256(hi, mask),
        _mm256_srli_epi16::<4>(hi),
    ]
}

/// The exact integer `Σ c·k` of a pair of groups ([`nibble_words`] `w` against
/// [`pair_token_i16`] `t`): group `blk`'s in lanes 0–3, group `blk + 1`'s in 4–7.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pair_dot(w: &[__m256i; 4], t: &[__m256i; 5]) -> __m256i {
    let p = _mm256_add_epi32(_mm256_madd_epi16(w[0], t[0]), _mm256_madd_epi16(w[1], t[1]));
    let q = _mm256_add_epi32(_mm256_madd_epi16(w[2], t[2]), _mm256_madd_epi16(w[3], t[3]));
    _mm256_add_epi32(_mm256_add_epi32(p, q), t[4])
}

/// One group of [`int16_avx2_target`]: the int16 codes `w` of the `R` rows against the
/// `T` tokens.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn int16_step<D: IntRowsSimd, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    blk: usize,
    w: &[[__m256i; 2]; R],
    acc: &mut [[__m256; T]; R],
) {
    let mut ws = [_mm256_setzero_ps(); R];
    for (i, ws) in ws.iter_mut().enumerate() {
        *ws = _mm256_set1_ps(d.group_scale_simd(i, blk));
    }
    for (j, x) in xs.iter().enumerate() {
        let t = token_i16::<D>(x, blk);
        for i in 0..R {
            let f = _mm256_cvtepi32_ps(dot_i16(w[i], t));
            acc[i][j] = _mm256_fmadd_ps(f, ws[i], acc[i][j]);
        }
    }
}

/// Group `blk` of token `x` for [`dot_i16`]: its int16 codes (two vectors) and the lanes
/// the dot starts from, `−o·Σ k` for codes offset by `o` (else zero).
///
/// # Safety
/// AVX2; `x.k` holds group `blk` (checked by [`run_int`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn token_i16<D: IntRowsSimd>(x: &QToken, blk: usize) -> [__m256i; 3] {
    let at = x.k.as_ptr().add(blk * STEP);
    let ka = _mm256_loadu_si256(at as *const __m256i);
    let kb = _mm256_loadu_si256(at.add(16) as *const __m256i);
    let start = if D::CODE_OFFSET != 0 {
        let o = _mm256_set1_epi16(-i16::from(D::CODE_OFFSET));
        _mm256_add_epi32(_mm256_madd_epi16(ka, o), _mm256_madd_epi16(kb, o))
    } else {
        _mm256_setzero_si256()
    };
    [ka, kb, start]
}

/// A group's exact integer `Σ c·k` in 8 lanes: the weight codes `w` ([`IntRowsSimd::load_i16`])
/// against a token's [`token_i16`].
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot_i16(w: [__m256i; 2], [ka, kb, start]: [__m256i; 3]) -> __m256i {
    _mm256_add_epi32(
        _mm256_add_epi32(start, _mm256_madd_epi16(w[0], ka)),
        _mm256_madd_epi16(w[1], kb),
    )
}

/// Row `i`'s outputs from a row kernel's sums (split tokens): each times its token's scale
/// and the row's [`IntRowsScalar::int_post`].
#[inline(always)]
fn row_outputs<D: IntRowsScalar, const T: usize>(
    d: &D,
    i: usize,
    sums: [f32; T],
    xs: &[QToken; T],
    o: &mut [f32; T],
) {
    for ((o, s), x) in o.iter_mut().zip(sums).zip(xs) {
        *o = s * token_scale::<true>(x) * d.int_post(i);
    }
}

/// The factor a finished sum still needs from token `x`: its one scale when split (the
/// per-group terms then carry only the weights' scales; 0 for a token without groups),
/// else 1 (applied per group).
#[inline(always)]
fn token_scale<const SPLIT: bool>(x: &QToken) -> f32 {
    if SPLIT {
        x.d.first().copied().unwrap_or(0.0)
    } else {
        1.0
    }
}

/// One group of the integer kernels: codes `raw` of the `R` rows against the `T` tokens.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn int_step<
    D: IntRowsSimd,
    const R: usize,
    const T: usize,
    const VNNI: bool,
    const SPLIT: bool,
>(
    d: &D,
    xs: &[QToken; T],
    blk: usize,
    raw: &[__m256i; R],
    acc: &mut [[__m256; T]; R],
) {
    let mut u = [_mm256_setzero_si256(); R];
    let mut ws = [_mm256_set1_ps(1.0); R];
    for i in 0..R {
        // Unsigned operand of the u8·i8 dot: the offset `code + o`, or |code| with the
        // sign moved onto the activations below.
        u[i] = if D::CODE_OFFSET != 0 {
            raw[i]
        } else {
            _mm256_abs_epi8(raw[i])
        };
        if D::GROUP_SCALES {
            ws[i] = _mm256_set1_ps(d.group_scale_simd(i, blk));
        }
    }
    for (j, x) in xs.iter().enumerate() {
        // In bounds: `run_int` checked `q.len() = groups·32`, `d.len() = groups` (and
        // so `c.len() = groups·8`).
        let xq = _mm256_loadu_si256(x.q.as_ptr().add(blk * STEP) as *const __m256i);
        // Split tokens have one scale, applied once at the end (see `token_scale`).
        let dj = if SPLIT {
            _mm256_set1_ps(1.0)
        } else {
            _mm256_set1_ps(*x.d.get_unchecked(blk))
        };
        let start = if D::CODE_OFFSET != 0 {
            _mm256_loadu_si256(x.c.as_ptr().add(blk * LANES) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        // In bounds when `SPLIT`: `run_int` checked `q2.len() = groups·32` and
        // `c2.len() = groups·8` for every token.
        let (xq2, start2) = if SPLIT {
            (
                _mm256_loadu_si256(x.q2.as_ptr().add(blk * STEP) as *const __m256i),
                if D::CODE_OFFSET != 0 {
                    _mm256_loadu_si256(x.c2.as_ptr().add(blk * LANES) as *const __m256i)
                } else {
                    _mm256_setzero_si256()
                },
            )
        } else {
            (_mm256_setzero_si256(), _mm256_setzero_si256())
        };
        for i in 0..R {
            // (Without VNNI, two-level products of few tokens run in `int16_avx2_target`;
            // this path takes the rest, whose int16 codes were not asked for.)
            let dot = if SPLIT {
                // `256·Σc·q + Σc·q₂`: lanes of at most 4·128·127·257 < 2²⁴ (exact in
                // f32 below), the integer form of `Σc·(q + q₂/256)`.
                let dot = int_dot::<D, VNNI>(start, u[i], xq, raw[i]);
                let lo = int_dot::<D, VNNI>(start2, u[i], xq2, raw[i]);
                _mm256_add_epi32(_mm256_slli_epi32::<SPLIT_SHIFT>(dot), lo)
            } else {
                int_dot::<D, VNNI>(start, u[i], xq, raw[i])
            };
            let f = _mm256_cvtepi32_ps(dot);
            acc[i][j] = match (SPLIT, D::GROUP_SCALES) {
                (true, true) => _mm256_fmadd_ps(f, ws[i], acc[i][j]),
                (true, false) => _mm256_add_ps(f, acc[i][j]),
                (false, true) => _mm256_fmadd_ps(_mm256_mul_ps(f, ws[i]), dj, acc[i][j]),
                (false, false) => _mm256_fmadd_ps(f, dj, acc[i][j]),
            };
        }
    }
}

/// The activations as the signed operand of a u8·i8 dot against the codes `raw`: as
/// they are for offset codes, else with the codes' signs (see [`int_step`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn signed_acts<D: IntRowsSimd>(xq: __m256i, raw: __m256i) -> __m256i {
    if D::CODE_OFFSET != 0 {
        xq
    } else {
        _mm256_sign_epi8(xq, raw)
    }
}

/// `start + Σ c·xq` in 8 lanes of 4 products, the weight codes `c` given as `u` (the
/// unsigned operand, see [`int_step`]) and `raw` (their signed form).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn int_dot<D: IntRowsSimd, const VNNI: bool>(
    start: __m256i,
    u: __m256i,
    xq: __m256i,
    raw: __m256i,
) -> __m256i {
    let v = signed_acts::<D>(xq, raw);
    // AVX2: u ≤ 128 (|code| ≤ 128, or a nibble ≤ 15), so a pair of u8·i8 products is at
    // most 2·128·127 < 2¹⁵ and `maddubs` never saturates.
    if VNNI {
        _mm256_dpbusd_epi32(start, u, v)
    } else {
        _mm256_add_epi32(
            start,
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1)),
        )
    }
}

/// The AVX-512 VNNI body: two groups per step in 16-lane registers (`vpdpbusd` on 512
/// bits does the work of two 256-bit ones in one instruction, and so do the conversion
/// and the multiply-adds that follow it), the odd last group and a partial one through
/// [`int_step`]. Each (weight row, token) pair still sees the same operations whatever
/// `R` and `T`, so prefill and decode agree bit for bit.
///
/// AVX-512 BW has no byte `sign`: the sign of the `q8` codes moves onto the activations
/// with a masked subtraction (`0 − x` where the code is negative), the mask taken once per
/// row and step.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the token lengths match `d` (checked by
/// [`run_int`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn int_body512<D: IntRowsSimd, const R: usize, const T: usize, const SPLIT: bool>(
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    if SPLIT && D::ROW_DOT_VNNI {
        for (i, o) in out.iter_mut().enumerate() {
            row_outputs(d, i, d.row_dot_vnni(i, xs), xs, o);
        }
        return;
    }
    let n = d.cols();
    let full = n / STEP;
    let pairs = full / 2;
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut u = [_mm512_setzero_si512(); R];
    let mut neg = [0u64; R];
    let mut ws = [_mm512_set1_ps(1.0); R];
    // Lane `l` of a 16-lane scale vector takes group `l / 8` of the pair.
    let spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for pair in 0..pairs {
        let blk = 2 * pair;
        for i in 0..R {
            let raw = d.load_pair_u8(i, blk);
            d.prefetch_next(i, blk);
            d.prefetch_next(i, blk + 1);
            if D::CODE_OFFSET != 0 {
                u[i] = raw;
            } else {
                u[i] = _mm512_abs_epi8(raw);
                neg[i] = _mm512_movepi8_mask(raw);
            }
            if D::GROUP_SCALES {
                ws[i] = d.pair_scales(i, blk);
            }
        }
        for (j, x) in xs.iter().enumerate() {
            // In bounds: `run_int` checked `q.len() = groups·32`, `d.len() = groups`,
            // `c.len() = groups·8` (and the same for `q2`, `c2` when `SPLIT`), and
            // `blk + 1 < groups`.
            let xq = _mm512_loadu_si512(x.q.as_ptr().add(blk * STEP) as *const _);
            let dj = if SPLIT {
                _mm512_set1_ps(1.0)
            } else {
                let pair_d = _mm_castpd_ps(_mm_load_sd(x.d.as_ptr().add(blk) as *const f64));
                _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(pair_d))
            };
            let start = if D::CODE_OFFSET != 0 {
                _mm512_loadu_si512(x.c.as_ptr().add(blk * LANES) as *const _)
            } else {
                _mm512_setzero_si512()
            };
            let (xq2, start2) = if SPLIT {
                (
                    _mm512_loadu_si512(x.q2.as_ptr().add(blk * STEP) as *const _),
                    if D::CODE_OFFSET != 0 {
                        _mm512_loadu_si512(x.c2.as_ptr().add(blk * LANES) as *const _)
                    } else {
                        _mm512_setzero_si512()
                    },
                )
            } else {
                (_mm512_setzero_si512(), _mm512_setzero_si512())
            };
            for i in 0..R {
                let signed = |v: __m512i| {
                    if D::CODE_OFFSET != 0 {
                        v
                    } else {
                        _mm512_mask_sub_epi8(v, neg[i], _mm512_setzero_si512(), v)
                    }
                };
                let mut dot = _mm512_dpbusd_epi32(start, u[i], signed(xq));
                if SPLIT {
                    // As in `int_step`: `256·Σc·q + Σc·q₂`, lanes below 2²⁴.
                    let lo = _mm512_dpbusd_epi32(start2, u[i], signed(xq2));
                    dot = _mm512_add_epi32(_mm512_slli_epi32::<{ SPLIT_SHIFT as u32 }>(dot), lo);
                }
                let f = _mm512_cvtepi32_ps(dot);
                acc[i][j] = match (SPLIT, D::GROUP_SCALES) {
                    (true, true) => _mm512_fmadd_ps(f, ws[i], acc[i][j]),
                    (true, false) => _mm512_add_ps(f, acc[i][j]),
                    (false, true) => _mm512_fmadd_ps(_mm512_mul_ps(f, ws[i]), dj, acc[i][j]),
                    (false, false) => _mm512_fmadd_ps(f, dj, acc[i][j]),
                };
            }
        }
    }
    // The odd last whole group and a partial one, 8 lanes at a time.
    let mut acc8 = [[_mm256_setzero_ps(); T]; R];
    let mut raw8 = [_mm256_setzero_si256(); R];
    if full % 2 == 1 {
        for (i, r) in raw8.iter_mut().enumerate() {
            *r = d.load_u8(i, full - 1);
        }
        int_step::<D, R, T, true, SPLIT>(d, xs, full - 1, &raw8, &mut acc8);
    }
    if full * STEP < n {
        for (i, r) in raw8.iter_mut().enumerate() {
            *r = partial_codes(d, i, full);
        }
        int_step::<D, R, T, true, SPLIT>(d, xs, full, &raw8, &mut acc8);
    }
    for (i, (o, (a, a8))) in out.iter_mut().zip(acc.iter().zip(&acc8)).enumerate() {
        let p = d.int_post(i);
        for ((o, (a, a8)), x) in o.iter_mut().zip(a.iter().zip(a8)).zip(xs) {
            *o = (_mm512_reduce_add_ps(*a) + hsum256(*a8)) * token_scale::<SPLIT>(x) * p;
        }
    }
}

/// Groups summed in i32 lanes before the lanes are added up in i64: a lane takes at most
/// 4 products `|c·k| ≤ 128·32639` per group (two on 512 bits), so 64 groups stay below
/// 2³¹ (about 1.07·10⁹); the sum of a row's lanes need not, hence i64.
const WIDE_CHUNK: usize = 64;

/// The groups of a `cols`-wide row, [`WIDE_CHUNK`] at a time.
#[inline(always)]
fn wide_chunks(cols: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let groups = cols.div_ceil(STEP);
    (0..groups)
        .step_by(WIDE_CHUNK)
        .map(move |b| b..(b + WIDE_CHUNK).min(groups))
}

/// `out[i][j] = post_i · d_j · Σ c·k` for row-scaled weights (`q8`) and split activations:
/// the int16 codes `k = 256·q + q₂` ([`QToken::k`]) against the signed weight codes, the
/// whole row summed in integers (i32 lanes, i64 per [`WIDE_CHUNK`] groups) and scaled
/// once. The sum is exact, so every kernel gives the same value bit for bit, whatever `R`
/// and `T`.
fn run_wide<D: IntRows, const R: usize, const T: usize>(
    k: Kernel,
    d: &D,
    xs: &[QToken; T],
    out: &mut [[f32; T]; R],
) {
    let sums = match k {
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon => super::neon::wide_neon::<D, R, T>(d, xs),
        // SAFETY: AVX-512 F/BW/VL/VNNI and AVX2 are present (checked in the guard);
        // `run_int` checked the token lengths.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if has_vnni() => unsafe { wide_avx512_target::<D, R, T>(d, xs) },
        // SAFETY: AVX2 is present (checked in the guard).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 | Kernel::Avx2 | Kernel::AvxVnni if Kernel::Avx2.is_available() => unsafe {
            wide_avx2_target::<D, R, T>(d, xs)
        },
        _ => wide_scalar::<D, R, T>(d, xs),
    };
    for (i, (o, s)) in out.iter_mut().zip(&sums).enumerate() {
        let p = d.int_post(i);
        for ((o, &s), x) in o.iter_mut().zip(s).zip(xs) {
            *o = s as f32 * token_scale::<true>(x) * p;
        }
    }
}

/// The scalar reference of [`run_wide`]: the same exact integer sums.
fn wide_scalar<D: IntRowsScalar, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
) -> [[i64; T]; R] {
    wide_with::<D, R, T>(d, xs, |c, k| {
        c.iter().zip(k).map(|(&w, &v)| w as i64 * v as i64).sum()
    })
}

/// [`wide_scalar`]'s loop with each group's exact `Σ c·k` (32 weight codes against 32
/// int16 codes) supplied, as [`int_rows_with`] takes its dot.
#[inline(always)]
pub(crate) fn wide_with<D: IntRowsScalar, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
    dot: impl Fn(&[i8; STEP], &[i16; STEP]) -> i64,
) -> [[i64; T]; R] {
    let mut sums = [[0i64; T]; R];
    let mut c = [0i8; STEP];
    for blk in 0..d.cols().div_ceil(STEP) {
        for (i, s) in sums.iter_mut().enumerate() {
            d.codes32(i, blk, &mut c);
            for (s, x) in s.iter_mut().zip(xs) {
                let k = &x.k[blk * STEP..(blk + 1) * STEP];
                *s += dot(&c, k.try_into().expect("a group of 32 codes"));
            }
        }
    }
    sums
}

/// [`run_wide`] on AVX-512 VNNI: `vpdpwssd`, 32 int16 products per instruction, one
/// group per step; the weight bytes sign-extended once per row and group.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and AVX2; the token lengths match `d` (checked by [`run_int`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn wide_avx512_target<D: IntRowsSimd, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
) -> [[i64; T]; R] {
    debug_assert!(D::CODE_OFFSET == 0, "row-scaled codes are signed");
    let full = d.cols() / STEP;
    let mut sums = [[0i64; T]; R];
    for chunk in wide_chunks(d.cols()) {
        let mut acc = [[_mm512_setzero_si512(); T]; R];
        let step = |acc: &mut [[__m512i; T]; R], b: usize| {
            let mut w = [_mm512_setzero_si512(); R];
            for (i, w) in w.iter_mut().enumerate() {
                *w = _mm512_cvtepi8_epi16(wide_codes::<D>(d, i, b, full));
            }
            for (j, x) in xs.iter().enumerate() {
                // In bounds: `run_int` checked `k.len() = groups·32`.
                let k = _mm512_loadu_si512(x.k.as_ptr().add(b * STEP) as *const _);
                for i in 0..R {
                    acc[i][j] = _mm512_dpwssd_epi32(acc[i][j], w[i], k);
                }
            }
        };
        // The whole groups, then a partial last one outside the loop: its call (in the
        // loop, even untaken) kept the accumulators in memory, a load and a store around
        // every `vpdpwssd`.
        for b in chunk.start..chunk.end.min(full) {
            step(&mut acc, b);
        }
        if chunk.end > full {
            step(&mut acc, full);
        }
        for (s, a) in sums.iter_mut().zip(&acc) {
            for (s, a) in s.iter_mut().zip(a) {
                // In i64: the lanes fit i32, their sum need not.
                let wide = _mm512_add_epi64(
                    _mm512_cvtepi32_epi64(_mm512_castsi512_si256(*a)),
                    _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(*a)),
                );
                *s += _mm512_reduce_add_epi64(wide);
            }
        }
    }
    sums
}

/// The signed codes of group `b` of row `i` (zero padded past `cols` when `b == full`),
/// the next rows' bytes asked for (as every tile does, see [`IntRowsSimd::prefetch_next`]).
///
/// # Safety
/// AVX2; `b <= full`, and `b < full` unless the last group is partial.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn wide_codes<D: IntRowsSimd>(d: &D, i: usize, b: usize, full: usize) -> __m256i {
    d.prefetch_next(i, b);
    if b < full {
        d.load_u8(i, b)
    } else {
        partial_codes(d, i, b)
    }
}

/// [`run_wide`] on AVX2: `vpmaddwd` (pairs of int16 products into i32 lanes), one group
/// per step in two halves.
///
/// # Safety
/// AVX2; the token lengths match `d` (checked by [`run_int`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn wide_avx2_target<D: IntRowsSimd, const R: usize, const T: usize>(
    d: &D,
    xs: &[QToken; T],
) -> [[i64; T]; R] {
    debug_assert!(D::CODE_OFFSET == 0, "row-scaled codes are signed");
    let full = d.cols() / STEP;
    let mut sums = [[0i64; T]; R];
    for chunk in wide_chunks(d.cols()) {
        let mut acc = [[_mm256_setzero_si256(); T]; R];
        // Row by row, each row's widened codes straight into its products with every
        // token: the live registers are one row's codes and the accumulators (holding all
        // `R` rows' widened codes spilled them on AVX2's 16 registers). The tokens' codes
        // are reloaded per row, from L1.
        let step = |acc: &mut [[__m256i; T]; R], b: usize| {
            for (i, acc) in acc.iter_mut().enumerate() {
                let w = widen_codes::<D>(wide_codes::<D>(d, i, b, full));
                for (a, x) in acc.iter_mut().zip(xs) {
                    // In bounds: `run_int` checked `k.len() = groups·32`.
                    *a = _mm256_add_epi32(*a, dot_i16(w, token_i16::<D>(x, b)));
                }
            }
        };
        // A partial last group outside the loop (see `wide_avx512_target`).
        for b in chunk.start..chunk.end.min(full) {
            step(&mut acc, b);
        }
        if chunk.end > full {
            step(&mut acc, full);
        }
        fold_wide(&mut sums, &acc);
    }
    sums
}

/// Adds each accumulator's i32 lanes to its i64 sum.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn fold_wide<const R: usize, const T: usize>(
    sums: &mut [[i64; T]; R],
    acc: &[[__m256i; T]; R],
) {
    for (s, a) in sums.iter_mut().zip(acc) {
        for (s, a) in s.iter_mut().zip(a) {
            // In i64: the lanes fit i32, their sum need not.
            let h = _mm256_add_epi64(
                _mm256_cvtepi32_epi64(_mm256_castsi256_si128(*a)),
                _mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(*a)),
            );
            let h = _mm_add_epi64(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            *s += _mm_cvtsi128_si64(h) + _mm_extract_epi64::<1>(h);
        }
    }
}

/// The codes of the partial last group `blk` of row `i` as [`IntRowsSimd::load_u8`]
/// would give them (`q8` only: `q4` rows are whole groups).
///
/// # Safety
/// AVX2; `i < R`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn partial_codes<D: IntRowsSimd>(d: &D, i: usize, blk: usize) -> __m256i {
    let mut c = [0i8; STEP];
    d.codes32(i, blk, &mut c);
    for v in &mut c {
        *v = v.wrapping_add(D::CODE_OFFSET as i8);
    }
    _mm256_loadu_si256(c.as_ptr() as *const __m256i)
}
