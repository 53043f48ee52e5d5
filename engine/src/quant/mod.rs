//! Quantization codecs of CMF v2: every writable dtype of spec §3.1 with the byte layouts
//! of §3.2, as pinned down by `shared/spec/NOTES.md` ("Dtype layouts").
//!
//! One module per dtype family:
//! - [`f16s`]: `f32`, `f16`, `bf16` (plain little-endian floats);
//! - [`q8`]: `q8_row`, `q8_2f` (int8 codes, per-row scale, optional column field);
//! - [`q4`]: `q4_block`, `q4_tiled`, `q4tp` (nibbles in groups of 32);
//! - [`vbit`]: `vbit`, `vbit_ro` (per-row bit width 3–8, MSB-first bit packing);
//! - [`q1`]: `q1`, `q1s`, `q1t` (binary / ternary tiles, sparse f16 overlays).
//!
//! Each family module also holds its row-dot kernels (decode 32 weights in registers,
//! scalar and x86-64 SIMD); [`kernel`] has their shared loop and the run-time choice of
//! instruction set, [`matrix`] the products the inference engine calls.
//!
//! The API works on a tensor's `(dtype, shape, bytes)` exactly as the directory records
//! them. Nothing here panics on hostile input: a payload is checked by [`validate`] (which
//! every decoder runs first) and all offsets are computed with checked arithmetic.
//!
//! Rows: a 2-D tensor `[rows, cols]` has `rows = shape[0]`. For dtypes that accept any
//! shape, a 1-D tensor (and a scalar) is a single row, and a tensor of more dimensions has
//! `rows = shape[0]`, `cols =` the product of the others. Dtypes whose layout is defined
//! for 2-D tensors only (`DType::requires_2d`) refuse every other shape.
//!
//! Encoders share one rule (the "f16-rounding trap" of §3.2): every scale is rounded to its
//! stored precision first, and the codes are chosen with the rounded (reconstructed) scale,
//! so that what the decoder computes is exactly what the encoder measured.

// Off x86-64 the x86 kernels' helpers (the panels, `q1t`'s digit-major tiles, `vbit`'s
// tables, the rows' SIMD hints) are compiled but unused: x86 builds keep those lints.
mod arena;
pub mod f16s;
#[cfg_attr(not(target_arch = "x86_64"), allow(unused))]
pub mod kernel;
#[cfg_attr(not(target_arch = "x86_64"), allow(unused))]
pub mod matrix;
pub(crate) mod neon;
#[cfg_attr(not(target_arch = "x86_64"), allow(unused))]
mod panel;
pub mod q1;
#[cfg_attr(not(target_arch = "x86_64"), allow(unused))]
mod q1t_kernel;
mod q1t_planes;
#[cfg_attr(not(target_arch = "x86_64"), allow(unused))]
pub mod q4;
pub mod q8;
pub mod rows;
pub mod vbit;
#[cfg_attr(not(target_arch = "x86_64"), allow(unused))]
mod vbit_kernel;

/// The byte layouts of every codec in one place: offset structs, constants, and
/// [`validate`], which checks a payload against them.
pub mod layout {
    pub use super::q1::{Q1sLayout, Q1tLayout, Q1S_ENTRY, Q1T_ENTRY, Q1T_TILE, Q1_TILE};
    pub use super::q4::{Q4tpLayout, LADDER, NIBBLE_BYTES, TILE_BYTES};
    pub use super::q8::Q8Layout;
    pub use super::validate;
    pub use super::vbit::{VbitLayout, ALLOWED_BITS};
}

#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod q1t_kernel_tests;

use crate::format::dtype::{numel, DType, Size};
use half::f16;

/// `vbit` encoder default: mean code bits per weight over the rows of a tensor. With the
/// f16 group scales (0.5 bit/weight) this lands at the footprint of `q4_block` (4.5).
pub const DEFAULT_VBIT_MEAN_BITS: f32 = 4.0;

/// `q1s` / `q1t` encoder default: fraction of the elements kept as f16 overlay entries.
pub const DEFAULT_OUTLIER_FRACTION: f32 = 0.005;

/// Why a tensor cannot be encoded, decoded or accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// Ids 5, 6, 7: listed by §3.1 but given no layout.
    #[error(
        "dtype {dtype} (id {}) is reserved by the CMF v2 spec (§3.1): it has no layout, \
         so it can be neither decoded nor written",
        dtype.id()
    )]
    Reserved { dtype: DType },
    /// The codec is not defined for this shape (not 2-D, `cols % 32 != 0`, too large).
    #[error("{dtype} does not support shape {shape:?}: {reason}")]
    UnsupportedShape {
        dtype: DType,
        shape: Vec<u64>,
        reason: String,
    },
    /// The payload does not match what its dtype and shape require.
    #[error("{dtype} payload for shape {shape:?} ({nbytes} bytes) is inconsistent: {reason}")]
    Inconsistent {
        dtype: DType,
        shape: Vec<u64>,
        nbytes: usize,
        reason: String,
    },
    /// An encoder input is NaN or infinite.
    #[error("cannot encode {dtype}: input value {value} at flat index {index} is not finite")]
    NonFinite {
        dtype: DType,
        index: usize,
        value: f32,
    },
    /// A finite input whose magnitude the dtype cannot store (an f16 scale above 65504).
    #[error("cannot encode {dtype}: {reason}")]
    OutOfRange { dtype: DType, reason: String },
    /// Caller errors: wrong number of values, row out of range, bad option.
    #[error("{dtype}: {reason}")]
    InvalidArgument { dtype: DType, reason: String },
}

/// Encoder knobs; `Default` gives the documented defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EncodeOptions {
    /// `vbit` / `vbit_ro`: target mean code bits per weight, in `[3, 8]`
    /// (default [`DEFAULT_VBIT_MEAN_BITS`]). The allocation never exceeds it when it can
    /// be met (3 is the floor of the format).
    pub mean_bits: Option<f32>,
    /// `q1s` / `q1t`: fraction of all elements stored as f16 overlays, in `[0, 1]`
    /// (default [`DEFAULT_OUTLIER_FRACTION`]).
    pub outlier_fraction: Option<f32>,
}

/// Row view of a tensor as the codecs see it. `numel = rows · cols` always holds, except
/// for tensors with a zero dimension where both sides are 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geom {
    pub numel: usize,
    pub rows: usize,
    pub cols: usize,
}

fn to_usize(x: u64) -> Option<usize> {
    usize::try_from(x).ok()
}

/// The row geometry of `shape` for `dtype`, refusing shapes the layout does not define.
pub fn geometry(dtype: DType, shape: &[u64]) -> Result<Geom, QuantError> {
    let unsupported = |reason: String| QuantError::UnsupportedShape {
        dtype,
        shape: shape.to_vec(),
        reason,
    };
    if dtype.is_reserved() {
        return Err(QuantError::Reserved { dtype });
    }
    // size_for enforces 2-D / cols % 32 and rejects overflowing shapes.
    dtype.size_for(shape).map_err(unsupported)?;
    let n = numel(shape).ok_or_else(|| unsupported("shape product overflows".into()))?;
    let (rows, cols) = match shape.len() {
        0 => (1, 1),
        1 => (1, shape[0]),
        _ => {
            let rest =
                numel(&shape[1..]).ok_or_else(|| unsupported("shape product overflows".into()))?;
            (shape[0], rest)
        }
    };
    let too_big = || unsupported("shape does not fit this platform's address space".into());
    Ok(Geom {
        numel: to_usize(n).ok_or_else(too_big)?,
        rows: to_usize(rows).ok_or_else(too_big)?,
        cols: to_usize(cols).ok_or_else(too_big)?,
    })
}

/// [`validate`] as `format::verify` takes it (a [`crate::format::verify::VerifyOptions`]
/// payload check): the variable-length layouts that opening a file does not read.
pub fn payload_check(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<(), String> {
    validate(dtype, shape, bytes).map_err(|e| e.to_string())
}

/// Checks that `bytes` is exactly a payload of `dtype` for `shape`: the byte count of
/// fixed-size layouts, and for variable ones every count, offset, index and bit width
/// (see each codec's `validate`). It does not inspect the numeric values of scales or
/// the padding bits of the last group / byte: those cannot make a decoder misbehave.
pub fn validate(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<(), QuantError> {
    let g = geometry(dtype, shape)?;
    check_size(dtype, shape, bytes)?;
    let bad = |reason: String| inconsistent(dtype, shape, bytes, reason);
    match dtype {
        DType::Vbit | DType::VbitRo => vbit::validate(dtype, g, bytes).map(|_| ()),
        DType::Q1s => q1::validate_q1s(g, bytes).map(|_| ()),
        DType::Q1t => q1::validate_q1t(g, bytes).map(|_| ()),
        _ => Ok(()),
    }
    .map_err(bad)
}

fn inconsistent(dtype: DType, shape: &[u64], bytes: &[u8], reason: String) -> QuantError {
    QuantError::Inconsistent {
        dtype,
        shape: shape.to_vec(),
        nbytes: bytes.len(),
        reason,
    }
}

/// The byte count `dtype.size_for(shape)` demands: exact for fixed layouts, a minimum for
/// variable ones (whose exact length the codec's own `validate` checks).
fn check_size(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<(), QuantError> {
    let n = bytes.len() as u64;
    match dtype.size_for(shape) {
        Ok(Size::Exact(want)) if n != want => Err(inconsistent(
            dtype,
            shape,
            bytes,
            format!("expected exactly {want} bytes"),
        )),
        Ok(Size::AtLeast(min)) if n < min => Err(inconsistent(
            dtype,
            shape,
            bytes,
            format!("expected at least {min} bytes"),
        )),
        Ok(Size::Opaque) => Err(QuantError::Reserved { dtype }),
        Err(reason) => Err(QuantError::UnsupportedShape {
            dtype,
            shape: shape.to_vec(),
            reason,
        }),
        Ok(_) => Ok(()),
    }
}

/// Decodes a whole tensor to f32 (row-major), after [`validate`].
pub fn decode(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<Vec<f32>, QuantError> {
    validate(dtype, shape, bytes)?;
    let g = geometry(dtype, shape)?;
    let mut out = alloc_f32(dtype, g.numel)?;
    decode_validated(dtype, shape, g, bytes, &mut out)?;
    Ok(out)
}

/// [`decode`] into a caller's buffer (`out.len()` must be the element count), so that
/// repeated decodes (a UI's tensor statistics) reuse one allocation.
pub fn decode_into(
    dtype: DType,
    shape: &[u64],
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    validate(dtype, shape, bytes)?;
    let g = geometry(dtype, shape)?;
    if out.len() != g.numel {
        return Err(QuantError::InvalidArgument {
            dtype,
            reason: format!(
                "output holds {} values, the tensor has {}",
                out.len(),
                g.numel
            ),
        });
    }
    decode_validated(dtype, shape, g, bytes, out)
}

fn decode_validated(
    dtype: DType,
    shape: &[u64],
    g: Geom,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    match dtype {
        DType::F32 | DType::F16 | DType::Bf16 => f16s::decode_range(dtype, bytes, 0, out),
        DType::Q8Row => q8::decode_q8_row(g, bytes, out),
        DType::Q8_2f => q8::decode_q8_2f(g, bytes, out),
        DType::Q4Block | DType::Q4Tiled => q4::decode_range(dtype, g, bytes, 0, out),
        DType::Q4tp => q4::decode_q4tp(g, bytes, out),
        DType::Vbit | DType::VbitRo => vbit::decode(dtype, g, bytes, out),
        DType::Q1 | DType::Q1s => q1::decode_q1_family(dtype, g, bytes, out),
        DType::Q1t => q1::decode_q1t(g, bytes, out),
        DType::Mix8_4 | DType::U8 | DType::Q4Col => return Err(QuantError::Reserved { dtype }),
    }
    .map_err(|reason| inconsistent(dtype, shape, bytes, reason))
}

/// Decodes row `row` into `out` (`out.len()` must be the row length), reading only that
/// row's bytes where the layout allows: everything but `vbit` (whose row start is a prefix
/// sum over the bit widths) and `q1s` (whose overlay is one flat list) is O(row).
/// Fixed-size layouts only check the total byte count; `vbit_ro` and `q1t` check the
/// offsets of this row, not of the whole tensor.
pub fn decode_row(
    dtype: DType,
    shape: &[u64],
    bytes: &[u8],
    row: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let g = geometry(dtype, shape)?;
    if row >= g.rows {
        return Err(QuantError::InvalidArgument {
            dtype,
            reason: format!("row {row} out of range: the tensor has {} rows", g.rows),
        });
    }
    if out.len() != g.cols {
        return Err(QuantError::InvalidArgument {
            dtype,
            reason: format!("output holds {} values, a row has {}", out.len(), g.cols),
        });
    }
    check_size(dtype, shape, bytes)?;
    let start = row * g.cols; // < numel: cannot overflow
    match dtype {
        DType::F32 | DType::F16 | DType::Bf16 => f16s::decode_range(dtype, bytes, start, out),
        DType::Q8Row => q8::decode_q8_row_row(g, bytes, row, out),
        DType::Q8_2f => q8::decode_q8_2f_row(g, bytes, row, out),
        DType::Q4Block | DType::Q4Tiled => q4::decode_range(dtype, g, bytes, start, out),
        DType::Q4tp => q4::decode_q4tp_row(g, bytes, row, out),
        DType::Vbit | DType::VbitRo => vbit::decode_row(dtype, g, bytes, row, out),
        DType::Q1 => q1::decode_q1_range(bytes, start, out),
        DType::Q1s => q1::decode_q1s_row(g, bytes, row, out),
        DType::Q1t => q1::decode_q1t_row(g, bytes, row, out),
        DType::Mix8_4 | DType::U8 | DType::Q4Col => return Err(QuantError::Reserved { dtype }),
    }
    .map_err(|reason| inconsistent(dtype, shape, bytes, reason))
}

/// Encodes row-major f32 `values` of `shape` into the exact payload of `dtype`.
pub fn encode(
    dtype: DType,
    shape: &[u64],
    values: &[f32],
    opts: &EncodeOptions,
) -> Result<Vec<u8>, QuantError> {
    let g = geometry(dtype, shape)?;
    if values.len() != g.numel {
        return Err(QuantError::InvalidArgument {
            dtype,
            reason: format!(
                "shape {shape:?} has {} elements, got {} values",
                g.numel,
                values.len()
            ),
        });
    }
    if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(QuantError::NonFinite {
            dtype,
            index,
            value,
        });
    }
    let size = match dtype.size_for(shape) {
        Ok(Size::Exact(n)) | Ok(Size::AtLeast(n)) => n,
        _ => return Err(QuantError::Reserved { dtype }),
    };
    // Fail politely (not abort) when the output cannot be allocated.
    let capacity = to_usize(size).ok_or_else(|| QuantError::InvalidArgument {
        dtype,
        reason: format!("a {size}-byte payload does not fit in memory"),
    })?;
    let mut out = alloc_bytes(dtype, capacity)?;
    match dtype {
        DType::F32 | DType::F16 | DType::Bf16 => f16s::encode(dtype, values, &mut out)?,
        DType::Q8Row => q8::encode_q8_row(g, values, &mut out)?,
        DType::Q8_2f => q8::encode_q8_2f(g, values, &mut out)?,
        DType::Q4Block | DType::Q4Tiled => q4::encode_grouped(dtype, values, &mut out)?,
        DType::Q4tp => q4::encode_q4tp(g, values, &mut out)?,
        DType::Vbit | DType::VbitRo => {
            vbit::encode(dtype, g, values, vbit_budget(dtype, opts)?, &mut out)?
        }
        DType::Q1 | DType::Q1s | DType::Q1t => {
            let fraction = outlier_fraction(dtype, opts)?;
            match dtype {
                DType::Q1 => q1::encode_q1(g, values, &mut out)?,
                DType::Q1s => q1::encode_q1s(g, values, fraction, &mut out)?,
                _ => q1::encode_q1t(g, values, fraction, &mut out)?,
            }
        }
        DType::Mix8_4 | DType::U8 | DType::Q4Col => return Err(QuantError::Reserved { dtype }),
    }
    Ok(out)
}

/// The `q1s`/`q1t` overlay fraction of `opts`, checked.
pub(crate) fn outlier_fraction(dtype: DType, opts: &EncodeOptions) -> Result<f64, QuantError> {
    option_in(
        dtype,
        "outlier_fraction",
        opts.outlier_fraction,
        DEFAULT_OUTLIER_FRACTION,
        0.0,
        1.0,
    )
}

/// The `vbit` mean bit budget of `opts`, checked.
pub fn vbit_budget(dtype: DType, opts: &EncodeOptions) -> Result<f64, QuantError> {
    option_in(
        dtype,
        "mean_bits",
        opts.mean_bits,
        DEFAULT_VBIT_MEAN_BITS,
        3.0,
        8.0,
    )
}

/// An encoder option (`default` when unset) refused outside `[lo, hi]`.
fn option_in(
    dtype: DType,
    name: &str,
    value: Option<f32>,
    default: f32,
    lo: f32,
    hi: f32,
) -> Result<f64, QuantError> {
    let v = value.unwrap_or(default);
    if !(lo..=hi).contains(&v) {
        return Err(QuantError::InvalidArgument {
            dtype,
            reason: format!("{name} must lie in [{lo}, {hi}], got {v}"),
        });
    }
    Ok(v as f64)
}

/// Measured bits per weight: `8 · nbytes / numel` (0 for an empty tensor, NaN for a shape
/// whose product overflows).
pub fn bits_per_weight(_dtype: DType, shape: &[u64], bytes: &[u8]) -> f64 {
    match numel(shape) {
        None => f64::NAN,
        Some(0) => 0.0,
        Some(n) => bytes.len() as f64 * 8.0 / n as f64,
    }
}

/// Relative slack of every bound below: the f32 arithmetic of encoder and decoder (a
/// product `q·s·c`, a quotient `w/s`) adds a few ulps that the exact analysis ignores.
pub const BOUND_SLACK: f32 = 1.0 / 1024.0;

/// The bound on `|w − ŵ|` for an element quantized with step `step` by an encoder that
/// stores `step` as the nearest f16 of `absmax/qmax` and picks codes in `[−qmax, qmax]`
/// (or wider) with the rounded step.
///
/// In the normal f16 range the rounded step is within 2⁻¹¹ of `absmax/qmax`, so
/// `absmax/step ≤ qmax + 0.07` and no code clamps: the error is at most `step/2`. Below
/// 2⁻¹⁴ f16 spacing is an absolute 2⁻²⁴, the step may be rounded down by up to 2⁻²⁵ (to 0
/// for the tiniest groups) and the clamped largest element then misses by at most
/// `qmax·2⁻²⁵`. Hence `max(step/2, qmax·2⁻²⁵)`, plus [`BOUND_SLACK`].
pub fn step_error_bound(step: f32, qmax: f32) -> f32 {
    let floor = qmax * (1.0 / 33_554_432.0); // 2^-25
    (step.abs() * 0.5).max(floor) * (1.0 + BOUND_SLACK)
}

/// For every element, an upper bound on `|w − decode(encode(w))|` derived from the
/// scales stored in `bytes` (so it holds for any conforming encoder that rounds its scales
/// to nearest and quantizes with the rounded scale, not just ours):
///
/// | dtype | bound per element |
/// |---|---|
/// | `f32` | 0 |
/// | `f16` | `max(|ŵ|·2⁻¹¹, 2⁻²⁵)` (round to nearest) |
/// | `bf16` | `max(|ŵ|·2⁻⁸, 2⁻¹³⁴)` |
/// | `q8_row` | [`step_error_bound`]`(scale[row], 127)` |
/// | `q8_2f` | `step_error_bound(row[o]·col[i], 127)` with the f16 floor scaled by `col[i]` |
/// | `q4_block`, `q4_tiled` | `step_error_bound(scale[g], 7)` |
/// | `q4tp` | `max(t[code]/2, 2⁻¹²⁰)`: encoders pick a rung `t ≥ absmax/7.5`, so no element clamps by more than half a step (the fixture's reference encoder does too) |
/// | `vbit`, `vbit_ro` | `step_error_bound(scale[r,g], 2^(b−1)−1)` |
/// | `q1`, `q1s`, `q1t` | `+∞` for base values (a binary/ternary code has no scale-relative bound); overlay values: the `f16` bound |
///
/// All finite bounds include [`BOUND_SLACK`]. Runs [`validate`] first.
pub fn error_bounds(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<Vec<f32>, QuantError> {
    validate(dtype, shape, bytes)?;
    let g = geometry(dtype, shape)?;
    let mut out = alloc_f32(dtype, g.numel)?;
    // The decoded values are needed for the float dtypes and overlays.
    match dtype {
        DType::F32 | DType::F16 | DType::Bf16 => {
            f16s::decode_range(dtype, bytes, 0, &mut out)
                .map_err(|r| inconsistent(dtype, shape, bytes, r))?;
            for v in out.iter_mut() {
                *v = f16s::rounding_bound(dtype, *v);
            }
        }
        DType::Q8Row | DType::Q8_2f => q8::bounds(dtype, g, bytes, &mut out),
        DType::Q4Block | DType::Q4Tiled | DType::Q4tp => q4::bounds(dtype, g, bytes, &mut out),
        DType::Vbit | DType::VbitRo => vbit::bounds(dtype, g, bytes, &mut out)
            .map_err(|r| inconsistent(dtype, shape, bytes, r))?,
        DType::Q1 | DType::Q1s | DType::Q1t => q1::bounds(dtype, g, bytes, &mut out)
            .map_err(|r| inconsistent(dtype, shape, bytes, r))?,
        DType::Mix8_4 | DType::U8 | DType::Q4Col => return Err(QuantError::Reserved { dtype }),
    }
    Ok(out)
}

fn alloc_f32(dtype: DType, n: usize) -> Result<Vec<f32>, QuantError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| QuantError::InvalidArgument {
            dtype,
            reason: format!("cannot allocate {n} f32 values"),
        })?;
    v.resize(n, 0.0);
    Ok(v)
}

pub(crate) fn alloc_bytes(dtype: DType, n: usize) -> Result<Vec<u8>, QuantError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| QuantError::InvalidArgument {
            dtype,
            reason: format!("cannot allocate a {n}-byte payload"),
        })?;
    Ok(v)
}

// ---- helpers shared by the codecs -------------------------------------------------------

/// Reads a little-endian f16 at `off` as f32, `None` past the end.
pub(crate) fn rd_f16(b: &[u8], off: usize) -> Option<f32> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(f16::from_le_bytes([s[0], s[1]]).to_f32())
}

pub(crate) fn rd_u16(b: &[u8], off: usize) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

pub(crate) fn rd_u32(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Rounds a scale to f16 (nearest, ties to even), refusing one that overflows: a silently
/// saturated scale would decode the whole group wrongly.
pub(crate) fn round_scale(dtype: DType, x: f32, qmax: f32) -> Result<f16, QuantError> {
    let h = f16::from_f32(x);
    if h.is_finite() {
        Ok(h)
    } else {
        Err(QuantError::OutOfRange {
            dtype,
            reason: format!(
                "a scale of {x:e} exceeds the f16 maximum 65504 (this codec stores |w| up to about {:e})",
                65504.0 * qmax
            ),
        })
    }
}

pub(crate) fn absmax(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// The payload of the `[rows, cols.len()]` matrix made of columns `cols` (ascending) of
/// a `[rows, in]` matrix, in the same dtype, when gathering is exact: element and row-scale
/// layouts (`f32`, `f16`, `bf16`, `q8_row`, and `q8_2f` whose column field is gathered too).
/// `None` for group-quantized layouts, whose groups a gather would cut. A task mask packs
/// the live columns of `down_proj` this way, so that a masked forward reads only them.
pub fn gather_columns(dtype: DType, shape: &[u64], bytes: &[u8], cols: &[u32]) -> Option<Vec<u8>> {
    let g = geometry(dtype, shape).ok()?;
    validate(dtype, shape, bytes).ok()?;
    if cols.iter().any(|&c| c as usize >= g.cols) || shape.len() != 2 {
        return None;
    }
    let elem = match dtype {
        DType::F32 => 4,
        DType::F16 | DType::Bf16 => 2,
        DType::Q8Row | DType::Q8_2f => 1,
        _ => return None,
    };
    let n = cols.len();
    let mut out = Vec::with_capacity(g.rows * n * elem + 2 * g.rows + 2 * n);
    for r in 0..g.rows {
        let row = &bytes[r * g.cols * elem..(r + 1) * g.cols * elem];
        for &c in cols {
            let c = c as usize;
            out.extend_from_slice(&row[c * elem..(c + 1) * elem]);
        }
    }
    if matches!(dtype, DType::Q8Row | DType::Q8_2f) {
        let l = q8::Q8Layout::new(g);
        out.extend_from_slice(&bytes[l.scales..l.scales + 2 * g.rows]);
        if dtype == DType::Q8_2f {
            for &c in cols {
                let at = l.col_field + 2 * c as usize;
                out.extend_from_slice(&bytes[at..at + 2]);
            }
        }
    }
    Some(out)
}

/// The payload of the `[rows.len(), cols]` matrix made of rows `rows` (ascending) of a
/// `[rows, cols]` matrix, in the same dtype, when its rows are self-contained: element
/// and row-scale layouts (`f32`, `f16`, `bf16`, `q8_row`, `q8_2f` with its whole column
/// field) and the 4-bit groups of `q4_block` / `q4_tiled` when `cols % 32 == 0` (a row is
/// whole groups). `None` otherwise. A task mask packs the live rows of gate/up this way.
pub fn gather_rows(dtype: DType, shape: &[u64], bytes: &[u8], rows: &[u32]) -> Option<Vec<u8>> {
    let g = geometry(dtype, shape).ok()?;
    validate(dtype, shape, bytes).ok()?;
    if rows.iter().any(|&r| r as usize >= g.rows) || shape.len() != 2 {
        return None;
    }
    let copy_rows = |out: &mut Vec<u8>, area: &[u8], row_bytes: usize| {
        for &r in rows {
            let r = r as usize;
            out.extend_from_slice(&area[r * row_bytes..(r + 1) * row_bytes]);
        }
    };
    let mut out = Vec::new();
    match dtype {
        DType::F32 => copy_rows(&mut out, bytes, 4 * g.cols),
        DType::F16 | DType::Bf16 => copy_rows(&mut out, bytes, 2 * g.cols),
        DType::Q8Row | DType::Q8_2f => {
            let l = q8::Q8Layout::new(g);
            copy_rows(&mut out, &bytes[..l.scales], g.cols);
            copy_rows(&mut out, &bytes[l.scales..l.scales + 2 * g.rows], 2);
            if dtype == DType::Q8_2f {
                out.extend_from_slice(&bytes[l.col_field..l.col_field + 2 * g.cols]);
            }
        }
        DType::Q4Tiled if g.cols % 32 == 0 => copy_rows(&mut out, bytes, g.cols / 32 * 18),
        DType::Q4Block if g.cols % 32 == 0 => {
            let groups = g.numel / 32;
            let gpr = g.cols / 32;
            copy_rows(&mut out, &bytes[..groups * 16], gpr * 16);
            copy_rows(&mut out, &bytes[groups * 16..groups * 18], gpr * 2);
        }
        _ => return None,
    }
    Some(out)
}
