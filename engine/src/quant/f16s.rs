//! `f32` (id 0), `f16` (id 1), `bf16` (id 2): plain little-endian floats, row-major, any
//! shape. `nbytes = numel · {4, 2, 2}`.
//!
//! Encoding rounds to nearest, ties to even (the `half` crate's conversion). A finite value
//! that would round to infinity in the narrower type is refused rather than stored as ±∞.

use super::kernel::{RowsScalar, STEP};
use super::QuantError;
use crate::format::dtype::DType;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Bytes per element.
pub const fn elem_size(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 4,
        _ => 2,
    }
}

pub(super) fn encode(dtype: DType, values: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    let overflow = |index: usize, v: f32| QuantError::OutOfRange {
        dtype,
        reason: format!("value {v:e} at flat index {index} overflows {dtype} to infinity"),
    };
    match dtype {
        DType::F32 => {
            for v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for (i, &v) in values.iter().enumerate() {
                let h = f16::from_f32(v);
                if !h.is_finite() {
                    return Err(overflow(i, v));
                }
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
        _ => {
            for (i, &v) in values.iter().enumerate() {
                let h = bf16::from_f32(v);
                if !h.is_finite() {
                    return Err(overflow(i, v));
                }
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
    }
    Ok(())
}

/// Decodes elements `start .. start + out.len()`.
pub(super) fn decode_range(
    dtype: DType,
    bytes: &[u8],
    start: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let size = elem_size(dtype);
    let range = start
        .checked_mul(size)
        .and_then(|a| Some((a, a.checked_add(out.len().checked_mul(size)?)?)))
        .ok_or("element range overflows")?;
    let src = bytes
        .get(range.0..range.1)
        .ok_or("element range lies outside the payload")?;
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            // Through an aligned buffer so `half` can use its vectorised (F16C) path.
            let mut buf = [f16::ZERO; 256];
            for (o, c) in out.chunks_mut(256).zip(src.chunks(512)) {
                let h = &mut buf[..o.len()];
                for (x, b) in h.iter_mut().zip(c.chunks_exact(2)) {
                    *x = f16::from_le_bytes([b[0], b[1]]);
                }
                h.convert_to_f32_slice(o);
            }
        }
        _ => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
    Ok(())
}

/// Bound on the rounding error of a value that decoded to `decoded`: half an ulp of the
/// decoded value's binade (`|ŵ|·2⁻ᵖ` covers it, p = 11 for f16, 8 for bf16), floored at
/// half the smallest subnormal.
pub(super) fn rounding_bound(dtype: DType, decoded: f32) -> f32 {
    let b = match dtype {
        DType::F32 => return 0.0,
        DType::F16 => (decoded.abs() / 2048.0).max(1.0 / 33_554_432.0),
        _ => (decoded.abs() / 256.0).max(f32::from_bits(1 << 16) / 2.0), // bf16 min subnormal 2^-133
    };
    b * (1.0 + super::BOUND_SLACK)
}

// ---- row-dot kernels ---------------------------------------------------------------------
//
// A float row needs no scale: decoding is a widening (f16, bf16) or nothing (f32), and
// every decoded value is exact, so the kernels only differ from "decode, then f32 dot" in
// the order of the sum.

/// `R` consecutive rows of an `f32`, `f16` or `bf16` matrix: `rows[i]` is row `i`'s bytes.
pub(crate) struct FloatRows<'a, const R: usize, const SIZE: usize> {
    pub rows: [&'a [u8]; R],
    pub cols: usize,
}

/// `f32` rows (4 bytes per element, little-endian).
pub(crate) type F32Rows<'a, const R: usize> = FloatRows<'a, R, 4>;
/// `f16` / `bf16` rows (2 bytes per element): the two differ in the decoder (type below).
pub(crate) struct HalfRows<'a, const R: usize, const BF16: bool> {
    pub rows: [&'a [u8]; R],
    pub cols: usize,
}

/// Rows `rs` of a float payload whose rows are `cols` long.
fn row_bytes<const R: usize>(bytes: &[u8], size: usize, cols: usize, rs: [usize; R]) -> [&[u8]; R] {
    std::array::from_fn(|i| &bytes[rs[i] * cols * size..(rs[i] + 1) * cols * size])
}

impl<'a, const R: usize> F32Rows<'a, R> {
    /// Rows `rs` (any `R` rows) of the payload.
    pub fn new_at(bytes: &'a [u8], cols: usize, rs: [usize; R]) -> Self {
        FloatRows {
            rows: row_bytes(bytes, 4, cols, rs),
            cols,
        }
    }
}

impl<'a, const R: usize, const BF16: bool> HalfRows<'a, R, BF16> {
    /// Rows `rs` (any `R` rows) of the payload.
    pub fn new_at(bytes: &'a [u8], cols: usize, rs: [usize; R]) -> Self {
        HalfRows {
            rows: row_bytes(bytes, 2, cols, rs),
            cols,
        }
    }
}

impl<const R: usize> RowsScalar for FloatRows<'_, R, 4> {
    fn cols(&self) -> usize {
        self.cols
    }
    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]) {
        out.fill(0.0);
        let src = &self.rows[i][(blk * STEP * 4).min(self.rows[i].len())..];
        for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
}

impl<const R: usize, const BF16: bool> RowsScalar for HalfRows<'_, R, BF16> {
    fn cols(&self) -> usize {
        self.cols
    }
    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]) {
        out.fill(0.0);
        let src = &self.rows[i][(blk * STEP * 2).min(self.rows[i].len())..];
        for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
            let h = u16::from_le_bytes([c[0], c[1]]);
            *o = if BF16 {
                f32::from_bits((h as u32) << 16)
            } else {
                super::kernel::h2f_scalar(h)
            };
        }
    }
}

/// Rows already decoded to f32 (the per-thread scratch of the dtypes without a fused
/// kernel): the same loops as `f32` weights, reading native floats.
pub(crate) struct DecodedRows<'a, const R: usize> {
    pub rows: [&'a [f32]; R],
    pub cols: usize,
}

impl<const R: usize> RowsScalar for DecodedRows<'_, R> {
    fn cols(&self) -> usize {
        self.cols
    }
    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]) {
        out.fill(0.0);
        let src = &self.rows[i][(blk * STEP).min(self.cols)..];
        let n = src.len().min(STEP);
        out[..n].copy_from_slice(&src[..n]);
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::kernel::{prefetch_ahead, RowsAvx2, RowsAvx512, STEP};
    use super::{DecodedRows, FloatRows, HalfRows};
    use std::arch::x86_64::*;

    impl<const R: usize> RowsAvx2 for FloatRows<'_, R, 4> {
        /// As for [`HalfRows`]: a group of 32 floats is two lines.
        #[inline(always)]
        unsafe fn prefetch_next_f(&self, i: usize, blk: usize) {
            prefetch_ahead::<R>(self.rows.get_unchecked(i), blk * STEP * 4, 2)
        }

        #[inline(always)]
        unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4] {
            let p = self.rows[i][blk * STEP * 4..(blk + 1) * STEP * 4].as_ptr() as *const f32;
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        }
    }

    impl<const R: usize> RowsAvx512 for FloatRows<'_, R, 4> {
        #[inline(always)]
        unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2] {
            let p = self.rows[i][blk * STEP * 4..(blk + 1) * STEP * 4].as_ptr() as *const f32;
            [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
        }
    }

    impl<const R: usize> RowsAvx2 for DecodedRows<'_, R> {
        #[inline(always)]
        unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4] {
            let p = self.rows[i][blk * STEP..(blk + 1) * STEP].as_ptr();
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        }
    }

    impl<const R: usize> RowsAvx512 for DecodedRows<'_, R> {
        #[inline(always)]
        unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2] {
            let p = self.rows[i][blk * STEP..(blk + 1) * STEP].as_ptr();
            [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
        }
    }

    /// Eight f16 / bf16 values to f32.
    #[inline(always)]
    unsafe fn half8<const BF16: bool>(h: __m128i) -> __m256 {
        if BF16 {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        } else {
            _mm256_cvtph_ps(h)
        }
    }

    /// f16: `vcvtph2ps`; bf16: zero-extend to 32 bits and shift into the high half
    /// (bf16 is the top half of an f32).
    impl<const R: usize, const BF16: bool> RowsAvx2 for HalfRows<'_, R, BF16> {
        /// A group of 32 halves is one 64-byte line.
        #[inline(always)]
        unsafe fn prefetch_next_f(&self, i: usize, blk: usize) {
            prefetch_ahead::<R>(self.rows.get_unchecked(i), blk * STEP * 2, 1)
        }

        #[inline(always)]
        unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4] {
            let p = self.rows[i][blk * STEP * 2..(blk + 1) * STEP * 2].as_ptr();
            let q = p as *const __m128i;
            [
                half8::<BF16>(_mm_loadu_si128(q)),
                half8::<BF16>(_mm_loadu_si128(q.add(1))),
                half8::<BF16>(_mm_loadu_si128(q.add(2))),
                half8::<BF16>(_mm_loadu_si128(q.add(3))),
            ]
        }
    }

    impl<const R: usize, const BF16: bool> RowsAvx512 for HalfRows<'_, R, BF16> {
        #[inline(always)]
        unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2] {
            let p = self.rows[i][blk * STEP * 2..(blk + 1) * STEP * 2].as_ptr();
            let q = p as *const __m256i;
            let (a, b) = (_mm256_loadu_si256(q), _mm256_loadu_si256(q.add(1)));
            if BF16 {
                [
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(a))),
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b))),
                ]
            } else {
                [_mm512_cvtph_ps(a), _mm512_cvtph_ps(b)]
            }
        }
    }
}
