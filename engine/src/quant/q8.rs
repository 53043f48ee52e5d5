//! `q8_row` (id 3) and `q8_2f` (id 9): int8 codes with a per-row f16 scale, `q8_2f` adding
//! a per-column f16 field. Both are defined for 2-D `[rows = out, cols = in]` only.
//!
//! ```text
//! q8_row: [i8 q: rows·cols][f16 scale: rows]                    w = q[o,i]·scale[o]
//! q8_2f : [i8 q: rows·cols][f16 scale: rows][f16 col: cols]     w = q[o,i]·scale[o]·col[i]
//! ```
//!
//! Encoder (both): codes are `round_ties_even(w / step)` clamped to `[−128, 127]`, with the
//! step built from the *f16-rounded* stored factors. A row of zeros gets scale 0 and codes 0.

use super::kernel::{IntRowsScalar, RowsScalar, STEP};
use super::{absmax, rd_f16, round_scale, step_error_bound, Geom, QuantError};
use crate::format::dtype::DType;

/// Largest code magnitude the encoders produce (`absmax / 127`).
pub const Q8_MAX: f32 = 127.0;

/// Byte offsets of a `q8_row` / `q8_2f` payload.
#[derive(Clone, Copy, Debug)]
pub struct Q8Layout {
    /// Start of the f16 row scales (= `rows · cols`).
    pub scales: usize,
    /// Start of the f16 column field (`q8_2f` only; = `scales + 2·rows`).
    pub col_field: usize,
}

impl Q8Layout {
    pub fn new(g: Geom) -> Q8Layout {
        // validate() has checked that the payload (hence these sums) fits in memory.
        Q8Layout {
            scales: g.numel,
            col_field: g.numel + 2 * g.rows,
        }
    }
}

fn quantize_i8(row: &[f32], out: &mut Vec<u8>, step_of: impl Fn(usize) -> f32) {
    for (i, &w) in row.iter().enumerate() {
        let step = step_of(i);
        let q = if step > 0.0 {
            (w / step).round_ties_even().clamp(-128.0, 127.0) as i8
        } else {
            0
        };
        out.push(q as u8);
    }
}

pub(super) fn encode_q8_row(g: Geom, values: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    let mut scales = Vec::with_capacity(2 * g.rows);
    for r in 0..g.rows {
        let row = &values[r * g.cols..(r + 1) * g.cols];
        let s = round_scale(DType::Q8Row, absmax(row) / Q8_MAX, Q8_MAX)?;
        let step = s.to_f32();
        quantize_i8(row, out, |_| step);
        scales.extend_from_slice(&s.to_le_bytes());
    }
    out.extend_from_slice(&scales);
    Ok(())
}

/// The `q8_2f` column field chosen by our encoder:
/// `col[i] = sqrt(absmax(column i) / mean of the non-zero column absmaxes)`, clamped to
/// `[2⁻⁸, 2⁸]`, 1 for an all-zero column, rounded to f16.
///
/// Why: an input channel that is large in every row (the classic activation-outlier
/// channel) otherwise sets every row's scale. Full equalisation (`col ∝ absmax`) makes the
/// relative error uniform but spends precision on the small columns; the square root sits
/// between the two and gave the lowest weight MSE on the fixture weights with synthetic
/// outlier columns (≈1.2× lower than full equalisation, ≈17× lower than no column field).
/// Normalising by the mean keeps the field around 1, in the f16 normal range whatever the
/// tensor's magnitude, and leaves the magnitude to the row scale.
pub fn column_field(g: Geom, values: &[f32]) -> Vec<half::f16> {
    let mut colmax = vec![0.0f32; g.cols];
    column_absmax(values, &mut colmax);
    field_from_absmax(&colmax)
}

/// Folds the per-column largest |w| of `values` (rows of `colmax.len()`) into `colmax`.
pub fn column_absmax(values: &[f32], colmax: &mut [f32]) {
    for row in values.chunks_exact(colmax.len().max(1)) {
        for (m, w) in colmax.iter_mut().zip(row) {
            *m = m.max(w.abs());
        }
    }
}

/// [`column_field`] from the columns' largest magnitudes.
pub fn field_from_absmax(colmax: &[f32]) -> Vec<half::f16> {
    let (sum, count) = colmax
        .iter()
        .filter(|&&m| m > 0.0)
        .fold((0.0f64, 0usize), |(s, c), &m| (s + m as f64, c + 1));
    let mean = if count > 0 { sum / count as f64 } else { 1.0 };
    colmax
        .iter()
        .map(|&m| {
            let c = if m > 0.0 {
                (m as f64 / mean).sqrt().clamp(1.0 / 256.0, 256.0)
            } else {
                1.0
            };
            half::f16::from_f64(c)
        })
        .collect()
}

pub(super) fn encode_q8_2f(g: Geom, values: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    encode_q8_2f_with(g, values, &column_field(g, values), out)
}

/// `q8_2f` with a given column field (decided over all rows while `values` may be a block
/// of them).
pub(super) fn encode_q8_2f_with(
    g: Geom,
    values: &[f32],
    field: &[half::f16],
    out: &mut Vec<u8>,
) -> Result<(), QuantError> {
    if field.len() != g.cols {
        return Err(QuantError::InvalidArgument {
            dtype: DType::Q8_2f,
            reason: format!("a column field of {} for {} columns", field.len(), g.cols),
        });
    }
    let col: Vec<f32> = field.iter().map(|c| c.to_f32()).collect();
    let mut scales = Vec::with_capacity(2 * g.rows);
    for r in 0..g.rows {
        let row = &values[r * g.cols..(r + 1) * g.cols];
        // The largest code is set by the largest |w| / col, not the largest |w|.
        let m = row
            .iter()
            .zip(&col)
            .fold(0.0f32, |m, (w, c)| m.max(w.abs() / c));
        let s = round_scale(DType::Q8_2f, m / Q8_MAX, Q8_MAX)?;
        let sf = s.to_f32();
        quantize_i8(row, out, |i| sf * col[i]);
        scales.extend_from_slice(&s.to_le_bytes());
    }
    out.extend_from_slice(&scales);
    for c in field {
        out.extend_from_slice(&c.to_le_bytes());
    }
    Ok(())
}

fn row_scale(bytes: &[u8], l: Q8Layout, row: usize) -> Result<f32, String> {
    rd_f16(bytes, l.scales + 2 * row)
        .ok_or_else(|| format!("scale of row {row} lies outside the payload"))
}

fn row_codes(bytes: &[u8], g: Geom, row: usize) -> Result<&[u8], String> {
    bytes
        .get(row * g.cols..(row + 1) * g.cols)
        .ok_or_else(|| format!("codes of row {row} lie outside the payload"))
}

fn col_field(bytes: &[u8], g: Geom, l: Q8Layout) -> Result<Vec<f32>, String> {
    let src = bytes
        .get(l.col_field..l.col_field + 2 * g.cols)
        .ok_or("column field lies outside the payload")?;
    Ok(src
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect())
}

pub(super) fn decode_q8_row_row(
    g: Geom,
    bytes: &[u8],
    row: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let s = row_scale(bytes, Q8Layout::new(g), row)?;
    for (o, &q) in out.iter_mut().zip(row_codes(bytes, g, row)?) {
        *o = q as i8 as f32 * s;
    }
    Ok(())
}

pub(super) fn decode_q8_row(g: Geom, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    for r in 0..g.rows {
        decode_q8_row_row(g, bytes, r, &mut out[r * g.cols..(r + 1) * g.cols])?;
    }
    Ok(())
}

fn decode_2f_with(
    g: Geom,
    bytes: &[u8],
    col: &[f32],
    row: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let s = row_scale(bytes, Q8Layout::new(g), row)?;
    for ((o, &q), &c) in out.iter_mut().zip(row_codes(bytes, g, row)?).zip(col) {
        *o = q as i8 as f32 * s * c;
    }
    Ok(())
}

/// One row, reading the column field in place (no allocation).
pub(super) fn decode_q8_2f_row(
    g: Geom,
    bytes: &[u8],
    row: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let l = Q8Layout::new(g);
    let s = row_scale(bytes, l, row)?;
    let col = bytes
        .get(l.col_field..l.col_field + 2 * g.cols)
        .ok_or("column field lies outside the payload")?;
    for ((o, &q), c) in out
        .iter_mut()
        .zip(row_codes(bytes, g, row)?)
        .zip(col.chunks_exact(2))
    {
        *o = q as i8 as f32 * s * half::f16::from_le_bytes([c[0], c[1]]).to_f32();
    }
    Ok(())
}

pub(super) fn decode_q8_2f(g: Geom, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    let col = col_field(bytes, g, Q8Layout::new(g))?;
    for r in 0..g.rows {
        decode_2f_with(g, bytes, &col, r, &mut out[r * g.cols..(r + 1) * g.cols])?;
    }
    Ok(())
}

/// Per-element bounds (see `quant::error_bounds`); the payload is validated.
pub(super) fn bounds(dtype: DType, g: Geom, bytes: &[u8], out: &mut [f32]) {
    let l = Q8Layout::new(g);
    let col = if dtype == DType::Q8_2f {
        col_field(bytes, g, l).unwrap_or_default()
    } else {
        Vec::new()
    };
    for r in 0..g.rows {
        let s = row_scale(bytes, l, r).unwrap_or(f32::INFINITY);
        let row = &mut out[r * g.cols..(r + 1) * g.cols];
        if dtype == DType::Q8_2f {
            for (b, &c) in row.iter_mut().zip(&col) {
                // The f16 floor of the row scale is multiplied by the column factor.
                *b = step_error_bound(s, Q8_MAX) * c.abs();
            }
        } else {
            row.fill(step_error_bound(s, Q8_MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{decode, encode, EncodeOptions};

    #[test]
    fn q8_row_layout_codes_first_then_scales() {
        // Row 0 = [127·s, −64·s], s = 1/127 → absmax 1.
        let v = [1.0f32, -64.0 / 127.0, 0.0, 0.0];
        let b = encode(DType::Q8Row, &[2, 2], &v, &EncodeOptions::default()).unwrap();
        assert_eq!(b.len(), 4 + 4);
        assert_eq!(b[0] as i8, 127);
        assert_eq!(b[1] as i8, -64);
        assert_eq!(&b[2..4], &[0, 0]);
        assert_eq!(
            half::f16::from_le_bytes([b[4], b[5]]),
            half::f16::from_f32(1.0 / 127.0)
        );
        assert_eq!(&b[6..8], &[0, 0], "zero row → scale 0");
        let d = decode(DType::Q8Row, &[2, 2], &b).unwrap();
        assert_eq!(d[2..], [0.0, 0.0]);
    }

    #[test]
    fn q8_rounds_ties_to_even() {
        // s = 1 exactly (absmax 127): 2.5 → 2, 3.5 → 4, −2.5 → −2.
        let v = [127.0f32, 2.5, 3.5, -2.5];
        let b = encode(DType::Q8Row, &[1, 4], &v, &EncodeOptions::default()).unwrap();
        assert_eq!(
            b[..4].iter().map(|&x| x as i8).collect::<Vec<_>>(),
            vec![127, 2, 4, -2]
        );
    }

    #[test]
    fn q8_2f_zero_column_and_zero_tensor_are_finite() {
        let v = [0.0f32, 1.0, 0.0, -2.0, 0.0, 0.5];
        let b = encode(DType::Q8_2f, &[3, 2], &v, &EncodeOptions::default()).unwrap();
        let d = decode(DType::Q8_2f, &[3, 2], &b).unwrap();
        assert!(d.iter().all(|x| x.is_finite()));
        assert_eq!(d[0], 0.0);
        let z = encode(DType::Q8_2f, &[2, 2], &[0.0; 4], &EncodeOptions::default()).unwrap();
        assert_eq!(decode(DType::Q8_2f, &[2, 2], &z).unwrap(), vec![0.0; 4]);
    }

    #[test]
    fn q8_refuses_scale_overflow() {
        let e = encode(
            DType::Q8Row,
            &[1, 2],
            &[1e9, 0.0],
            &EncodeOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(e, QuantError::OutOfRange { .. }), "{e}");
    }
}

// ---- row-dot kernels ---------------------------------------------------------------------
//
// `q8_row`: the row scale is pulled out of the sum, `y = scale·Σ q·x`. `q8_2f`: likewise,
// `y = scale·Σ (q·col)·x`, where `q·col` (an 8-bit integer times an 11-bit f16
// significand) is exact in f32. Only the order and grouping of the f32 sum differ from
// "decode, then dot".

/// `R` consecutive rows of a `q8_row` (`COL = false`) or `q8_2f` (`COL = true`) payload.
pub(crate) struct Q8Rows<'a, const R: usize, const COL: bool> {
    codes: [&'a [u8]; R],
    scale: [f32; R],
    /// The f16 column field (`q8_2f`), empty for `q8_row`.
    col: &'a [u8],
    cols: usize,
}

impl<'a, const R: usize, const COL: bool> Q8Rows<'a, R, COL> {
    /// Rows `rs` (any `R` rows, e.g. a task mask's live neurons) of a validated payload.
    #[inline]
    pub fn new_at(g: Geom, bytes: &'a [u8], rs: [usize; R]) -> Self {
        let l = Q8Layout::new(g);
        // The row scales are a stream of their own, 2 bytes a row, which the kernels'
        // prefetch of the codes does not cover: ask for the scales 64 rows on (8 blocks of
        // lead). Without it, reading the scales here waited on DRAM once every 32 rows
        // (6% of a SmolLM2 q8_row decode, nearly all of it on that load).
        super::kernel::prefetch_l2(bytes, l.scales + 2 * (rs[0] + 64));
        let scale = super::kernel::f16_scales(bytes, l.scales, &rs);
        Q8Rows {
            codes: std::array::from_fn(|i| &bytes[rs[i] * g.cols..(rs[i] + 1) * g.cols]),
            scale,
            col: if COL {
                &bytes[l.col_field..l.col_field + 2 * g.cols]
            } else {
                &[]
            },
            cols: g.cols,
        }
    }
}

impl<const R: usize, const COL: bool> RowsScalar for Q8Rows<'_, R, COL> {
    fn cols(&self) -> usize {
        self.cols
    }
    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]) {
        out.fill(0.0);
        let k = (blk * STEP).min(self.cols);
        let n = (self.cols - k).min(STEP);
        for (e, o) in out[..n].iter_mut().enumerate() {
            let q = self.codes[i][k + e] as i8 as f32;
            *o = if COL {
                q * super::kernel::h2f_scalar(super::kernel::le16(self.col, 2 * (k + e)))
            } else {
                q
            };
        }
    }
    fn post(&self, i: usize) -> f32 {
        self.scale[i]
    }
}

/// The integer (`Fast`) kernels read the codes only: for `q8_2f` the column field is
/// folded into the activations before they are quantized (`Σ q·col·x = Σ q·(col·x)`), so
/// a `q8_2f` payload is read through `Q8Rows<R, false>` there.
impl<const R: usize, const COL: bool> IntRowsScalar for Q8Rows<'_, R, COL> {
    const GROUP_SCALES: bool = false;
    fn cols(&self) -> usize {
        self.cols
    }
    fn codes32(&self, i: usize, blk: usize, out: &mut [i8; STEP]) {
        out.fill(0);
        let k = (blk * STEP).min(self.cols);
        let n = (self.cols - k).min(STEP);
        for (o, &q) in out.iter_mut().zip(&self.codes[i][k..k + n]) {
            *o = q as i8;
        }
    }
    fn group_scale(&self, _i: usize, _blk: usize) -> f32 {
        1.0
    }
    fn int_post(&self, i: usize) -> f32 {
        self.scale[i]
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::kernel::{IntRowsSimd, RowsAvx2, RowsAvx512, STEP};
    use super::Q8Rows;
    use std::arch::x86_64::*;

    /// Row length from which [`IntRowsSimd::prefetch_next`] of `q8` rows follows each row
    /// instead of the block as one linear stream.
    const LINEAR_PREFETCH_MAX_COLS: usize = 2048;

    impl<const R: usize, const COL: bool> IntRowsSimd for Q8Rows<'_, R, COL> {
        #[inline(always)]
        unsafe fn load_u8(&self, i: usize, blk: usize) -> __m256i {
            _mm256_loadu_si256(
                self.codes[i][blk * STEP..(blk + 1) * STEP].as_ptr() as *const __m256i
            )
        }

        /// Two groups are 64 contiguous bytes.
        #[inline(always)]
        unsafe fn load_pair_u8(&self, i: usize, blk: usize) -> __m512i {
            _mm512_loadu_si512(self.codes[i][blk * STEP..(blk + 2) * STEP].as_ptr() as *const _)
        }

        /// Rows are contiguous, so the block after next is the `R·cols` bytes from
        /// `2·R·cols` on. Short rows: it is asked for as one linear stream, a line per
        /// call from the first `R/2` rows, as far into it as the kernel has read into its
        /// own block (`R·32` bytes per group). Long rows: each row's own bytes two blocks
        /// on (`R` streams, each line asked for twice). On AMD Zen 2 from DRAM (`q8_row`
        /// `matvec balanced`, 1 and 2 threads), the linear stream was 25–30% faster at
        /// 576 columns and 14–25% at 896, even at 1536, and 30% slower at 4864.
        #[inline(always)]
        unsafe fn prefetch_next(&self, i: usize, blk: usize) {
            let ahead = 2 * R * self.cols;
            if self.cols >= LINEAR_PREFETCH_MAX_COLS {
                let p = self.codes[i].as_ptr().wrapping_add(blk * STEP + ahead);
                _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
            } else if i < R / 2 {
                let p = self.codes[0]
                    .as_ptr()
                    .wrapping_add(ahead + blk * R * STEP + 64 * i);
                _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
            }
        }
    }

    /// Codes: sign-extend bytes to i32 and convert (`vpmovsxbd`, `vcvtdq2ps`); `q8_2f`
    /// multiplies by the converted column field.
    impl<const R: usize, const COL: bool> RowsAvx2 for Q8Rows<'_, R, COL> {
        #[inline(always)]
        unsafe fn prefetch_next_f(&self, i: usize, blk: usize) {
            self.prefetch_next(i, blk)
        }

        #[inline(always)]
        unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4] {
            let p = self.codes[i][blk * STEP..(blk + 1) * STEP].as_ptr();
            let mut w = [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                    p.add(8) as *const __m128i
                ))),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                    p.add(16) as *const __m128i
                ))),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                    p.add(24) as *const __m128i
                ))),
            ];
            if COL {
                let c = self.col[blk * STEP * 2..(blk + 1) * STEP * 2].as_ptr() as *const __m128i;
                w[0] = _mm256_mul_ps(w[0], _mm256_cvtph_ps(_mm_loadu_si128(c)));
                w[1] = _mm256_mul_ps(w[1], _mm256_cvtph_ps(_mm_loadu_si128(c.add(1))));
                w[2] = _mm256_mul_ps(w[2], _mm256_cvtph_ps(_mm_loadu_si128(c.add(2))));
                w[3] = _mm256_mul_ps(w[3], _mm256_cvtph_ps(_mm_loadu_si128(c.add(3))));
            }
            w
        }
    }

    impl<const R: usize, const COL: bool> RowsAvx512 for Q8Rows<'_, R, COL> {
        #[inline(always)]
        unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2] {
            let p = self.codes[i][blk * STEP..(blk + 1) * STEP].as_ptr() as *const __m128i;
            let mut w = [
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p))),
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(1)))),
            ];
            if COL {
                let c = self.col[blk * STEP * 2..(blk + 1) * STEP * 2].as_ptr() as *const __m256i;
                w[0] = _mm512_mul_ps(w[0], _mm512_cvtph_ps(_mm256_loadu_si256(c)));
                w[1] = _mm512_mul_ps(w[1], _mm512_cvtph_ps(_mm256_loadu_si256(c.add(1))));
            }
            w
        }
    }
}
