//! `f32` (id 0), `f16` (id 1), `bf16` (id 2): plain little-endian floats, row-major, any
//! shape. `nbytes = numel · {4, 2, 2}`.
//!
//! Encoding rounds to nearest, ties to even (the `half` crate's conversion). A finite value
//! that would round to infinity in the narrower type is refused rather than stored as ±∞.

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
