//! 4-bit codecs: `q4_block` (id 4), `q4_tiled` (id 11), `q4tp` (id 15).
//!
//! All three store a group of 32 weights as 16 nibble bytes: byte `k` of a group holds
//! element `2k` in its low nibble and `2k+1` in its high nibble, and `w = (q − 8)·scale`.
//! They differ in where the scale lives:
//!
//! ```text
//! q4_block: [nibbles: G·16][f16 scale: G]          G = ceil(numel/32), flattened, zero padded
//! q4_tiled: G × [f16 scale][16 nibble bytes]       (18-byte tiles, same grouping)
//! q4tp    : [nibbles: rows·gpr·16]                 2-D, cols % 32 == 0, gpr = cols/32,
//!           [per row: f16 lo, f16 step]            tile (r,g) at (r·gpr + g)·16
//!           [per row: ceil(5·gpr/8) bytes]         5-bit codes, LSB first, code g at bit 5g
//! ```
//!
//! `q4tp` scale of group g of row r: `t[code]` of the row's 32-rung ladder
//! `t[0] = 2^lo`, `t[c] = t[c−1]·2^step`, evaluated iteratively in f32.
//!
//! Encoders: `q4_block`/`q4_tiled` use `scale = f16(absmax/7)`; nibbles are
//! `clamp(round_ties_even(w/scale) + 8, 0, 15)` with the rounded scale; a zero group has
//! scale 0 and nibbles 8; padding elements of the last group are nibble 8.

use super::kernel::{IntRowsScalar, RowsScalar, STEP};
use super::{absmax, rd_f16, round_scale, step_error_bound, Geom, QuantError, BOUND_SLACK};
use crate::format::dtype::DType;
use half::f16;

/// Elements per group.
pub const GROUP: usize = crate::format::dtype::GROUP as usize;
/// Nibble bytes per group.
pub const NIBBLE_BYTES: usize = GROUP / 2;
/// Bytes per `q4_tiled` tile: f16 scale + 16 nibble bytes.
pub const TILE_BYTES: usize = 2 + NIBBLE_BYTES;
/// Largest positive code magnitude (`q − 8` for `q = 15`): scales are `absmax / 7`.
pub const Q4_MAX: f32 = 7.0;
/// Rungs of a `q4tp` scale ladder (5-bit codes).
pub const LADDER: usize = 32;

/// Quantizes up to 32 values with step `t` into nibble bytes (missing elements → 8).
fn pack_nibbles(vals: &[f32], t: f32) -> [u8; NIBBLE_BYTES] {
    let mut out = [0x88u8; NIBBLE_BYTES];
    if !(t > 0.0 && t.is_finite()) {
        return out;
    }
    for (k, &w) in vals.iter().enumerate().take(GROUP) {
        let q = ((w / t).round_ties_even() + 8.0).clamp(0.0, 15.0) as u8;
        let shift = 4 * (k % 2);
        out[k / 2] = (out[k / 2] & !(0xF << shift)) | (q << shift);
    }
    out
}

/// Decodes the 32 nibbles of `nib` (16 bytes) with step `t`.
fn unpack_nibbles(nib: &[u8], t: f32, out: &mut [f32; GROUP]) {
    for (k, &b) in nib.iter().enumerate().take(NIBBLE_BYTES) {
        out[2 * k] = ((b & 0xF) as i32 - 8) as f32 * t;
        out[2 * k + 1] = ((b >> 4) as i32 - 8) as f32 * t;
    }
}

/// `q4_block` / `q4_tiled` encoder (flattened groups of 32).
pub(super) fn encode_grouped(
    dtype: DType,
    values: &[f32],
    out: &mut Vec<u8>,
) -> Result<(), QuantError> {
    let groups = values.len().div_ceil(GROUP);
    let mut scales = Vec::with_capacity(if dtype == DType::Q4Block {
        2 * groups
    } else {
        0
    });
    for grp in values.chunks(GROUP) {
        let s = round_scale(dtype, absmax(grp) / Q4_MAX, Q4_MAX)?;
        let nib = pack_nibbles(grp, s.to_f32());
        if dtype == DType::Q4Block {
            out.extend_from_slice(&nib);
            scales.extend_from_slice(&s.to_le_bytes());
        } else {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&nib);
        }
    }
    out.extend_from_slice(&scales);
    Ok(())
}

/// Scale and nibble bytes of group `gi` of a `q4_block` / `q4_tiled` payload.
fn group_of(dtype: DType, bytes: &[u8], groups: usize, gi: usize) -> Option<(f32, &[u8])> {
    if dtype == DType::Q4Block {
        let nib = bytes
            .get(gi.checked_mul(NIBBLE_BYTES)?..)?
            .get(..NIBBLE_BYTES)?;
        let s = rd_f16(
            bytes,
            groups
                .checked_mul(NIBBLE_BYTES)?
                .checked_add(gi.checked_mul(2)?)?,
        )?;
        Some((s, nib))
    } else {
        let tile = bytes
            .get(gi.checked_mul(TILE_BYTES)?..)?
            .get(..TILE_BYTES)?;
        Some((rd_f16(tile, 0)?, &tile[2..]))
    }
}

/// Decodes flat elements `start .. start + out.len()` of a `q4_block` / `q4_tiled` tensor,
/// touching only the groups they fall in.
pub(super) fn decode_range(
    dtype: DType,
    g: Geom,
    bytes: &[u8],
    start: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let groups = g.numel.div_ceil(GROUP);
    let mut tmp = [0.0f32; GROUP];
    let mut pos = start;
    let mut done = 0;
    while done < out.len() {
        let gi = pos / GROUP;
        let (s, nib) = group_of(dtype, bytes, groups, gi)
            .ok_or_else(|| format!("group {gi} lies outside the payload"))?;
        unpack_nibbles(nib, s, &mut tmp);
        let from = pos % GROUP;
        let take = (GROUP - from).min(out.len() - done);
        out[done..done + take].copy_from_slice(&tmp[from..from + take]);
        done += take;
        pos += take;
    }
    Ok(())
}

// ---- q4tp --------------------------------------------------------------------------------

/// Byte offsets of a `q4tp` payload.
#[derive(Clone, Copy, Debug)]
pub struct Q4tpLayout {
    /// Groups per row (`cols / 32`).
    pub gpr: usize,
    /// Start of the per-row `(f16 lo, f16 step)` pairs (= `rows·gpr·16`).
    pub params: usize,
    /// Start of the per-row code bytes (= `params + 4·rows`).
    pub codes: usize,
    /// Code bytes per row: `ceil(5·gpr/8)`.
    pub code_bytes: usize,
}

impl Q4tpLayout {
    pub fn new(g: Geom) -> Q4tpLayout {
        // Only used once size_for(shape) is known to fit in memory (validated payload or
        // allocated output), so these products cannot overflow.
        let gpr = g.cols / GROUP;
        let params = g.rows * gpr * NIBBLE_BYTES;
        Q4tpLayout {
            gpr,
            params,
            codes: params + 4 * g.rows,
            code_bytes: (5 * gpr).div_ceil(8),
        }
    }
}

/// The 32-rung scale ladder of a row, computed exactly as §3.2 prescribes: `t[0] = 2^lo`,
/// `t[c] = t[c−1]·2^step`, iteratively in f32. Encoder and decoder both call this, so the
/// scales they use are bit-identical.
pub fn ladder(lo: f16, step: f16) -> [f32; LADDER] {
    let mut t = [0.0f32; LADDER];
    t[0] = lo.to_f32().exp2();
    let m = step.to_f32().exp2();
    for c in 1..LADDER {
        t[c] = t[c - 1] * m;
    }
    t
}

/// Reads 5-bit code `gi` from a row's code bytes (LSB first, may straddle two bytes).
fn read_code(codes: &[u8], gi: usize) -> Option<usize> {
    let p = 5 * gi;
    let lo = *codes.get(p / 8)? as u16;
    let hi = codes.get(p / 8 + 1).copied().unwrap_or(0) as u16;
    Some((((hi << 8) | lo) >> (p % 8)) as usize & 31)
}

fn write_code(codes: &mut [u8], gi: usize, code: u8) {
    let p = 5 * gi;
    let v = (code as u16 & 31) << (p % 8);
    codes[p / 8] |= v as u8;
    if let Some(b) = codes.get_mut(p / 8 + 1) {
        *b |= (v >> 8) as u8;
    }
}

/// Smallest f16 ≥ `x` (x ≥ 0, small): rounding the step up guarantees the top rung reaches
/// the row's largest ideal scale, so no group is forced onto a rung below what it needs.
fn f16_round_up(x: f64) -> f16 {
    let h = f16::from_f64(x);
    if h.to_f64() < x {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

fn sse(grp: &[f32], t: f32) -> f64 {
    let nib = pack_nibbles(grp, t);
    let mut dec = [0.0f32; GROUP];
    unpack_nibbles(&nib, if t.is_finite() { t } else { 0.0 }, &mut dec);
    grp.iter()
        .zip(&dec)
        .map(|(&w, &d)| ((w - d) as f64).powi(2))
        .sum()
}

/// The rung of `t` for a group with largest magnitude `amax`.
///
/// Rungs with `7.5·t ≥ amax` are "feasible": every element then rounds to within half a
/// step (the largest positive one may round to code 8 and clamp to 7, which still misses by
/// at most `t/2`). Among the first three feasible rungs we keep the one with the lowest
/// squared error (ties → lower code): the smallest feasible rung is usually best, but the
/// rounding pattern of a particular group can favour the next one. If no rung is feasible
/// (only possible when the ladder underflows to f32 subnormals) the lowest-SSE rung wins.
fn choose_rung(grp: &[f32], amax: f32, t: &[f32; LADDER]) -> usize {
    if amax == 0.0 {
        return 0;
    }
    let ok = |k: usize| t[k].is_finite() && t[k] > 0.0 && 7.5 * t[k] as f64 >= amax as f64;
    let first = (0..LADDER).find(|&k| ok(k));
    let (from, to) = match first {
        Some(k0) => (k0, (k0 + 2).min(LADDER - 1)),
        None => (0, LADDER - 1),
    };
    let mut best = (f64::INFINITY, from);
    for (k, &step) in t.iter().enumerate().take(to + 1).skip(from) {
        if !step.is_finite() || (first.is_some() && !ok(k)) {
            continue;
        }
        let e = sse(grp, step);
        if e < best.0 {
            best = (e, k);
        }
    }
    best.1
}

/// `q4tp` encoder. Per row: the ideal group scales `s_g = absmax_g / 7`; `lo` = the exact
/// minimum of `log2 s_g` over the non-zero groups rounded to the nearest f16; `step` =
/// `(max log2 s_g − lo) / 31` rounded *up* to f16 (§3.2: both rounded before any code is
/// chosen); then each group's rung by [`choose_rung`] on the ladder the decoder will build,
/// and its nibbles with that rung. An all-zero row stores `lo = step = 0`, codes 0,
/// nibbles 8.
pub(super) fn encode_q4tp(g: Geom, values: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    let l = Q4tpLayout::new(g);
    let mut params = Vec::with_capacity(4 * g.rows);
    let mut codes = vec![0u8; g.rows * l.code_bytes];
    let mut amax = vec![0.0f32; l.gpr];
    for r in 0..g.rows {
        let row = &values[r * g.cols..(r + 1) * g.cols];
        for (m, grp) in amax.iter_mut().zip(row.chunks_exact(GROUP)) {
            *m = absmax(grp);
        }
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        for &m in amax.iter().filter(|&&m| m > 0.0) {
            let lg = (m as f64 / 7.0).log2();
            min = min.min(lg);
            max = max.max(lg);
        }
        let (lo, step) = if min.is_finite() {
            let lo = f16::from_f64(min);
            (lo, f16_round_up(((max - lo.to_f64()) / 31.0).max(0.0)))
        } else {
            (f16::ZERO, f16::ZERO)
        };
        let t = ladder(lo, step);
        let row_codes = &mut codes[r * l.code_bytes..(r + 1) * l.code_bytes];
        for (gi, grp) in row.chunks_exact(GROUP).enumerate() {
            let k = choose_rung(grp, amax[gi], &t);
            write_code(row_codes, gi, k as u8);
            let step = if amax[gi] == 0.0 { 0.0 } else { t[k] };
            out.extend_from_slice(&pack_nibbles(grp, step));
        }
        params.extend_from_slice(&lo.to_le_bytes());
        params.extend_from_slice(&step.to_le_bytes());
    }
    out.extend_from_slice(&params);
    out.extend_from_slice(&codes);
    Ok(())
}

/// Ladder and code bytes of row `r`.
fn q4tp_row_params(
    bytes: &[u8],
    l: Q4tpLayout,
    r: usize,
) -> Result<([f32; LADDER], &[u8]), String> {
    let p = l.params + 4 * r;
    let lo = bytes
        .get(p..p + 2)
        .ok_or("row parameters lie outside the payload")?;
    let st = bytes
        .get(p + 2..p + 4)
        .ok_or("row parameters lie outside the payload")?;
    let t = ladder(
        f16::from_le_bytes([lo[0], lo[1]]),
        f16::from_le_bytes([st[0], st[1]]),
    );
    let c = l.codes + r * l.code_bytes;
    let codes = bytes
        .get(c..c + l.code_bytes)
        .ok_or("row codes lie outside the payload")?;
    Ok((t, codes))
}

pub(super) fn decode_q4tp_row(
    g: Geom,
    bytes: &[u8],
    r: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let l = Q4tpLayout::new(g);
    let (t, codes) = q4tp_row_params(bytes, l, r)?;
    let mut tmp = [0.0f32; GROUP];
    for (gi, o) in out.chunks_exact_mut(GROUP).enumerate().take(l.gpr) {
        let code = read_code(codes, gi).ok_or("code lies outside the payload")?;
        let at = (r * l.gpr + gi) * NIBBLE_BYTES;
        let nib = bytes
            .get(at..at + NIBBLE_BYTES)
            .ok_or("nibbles lie outside the payload")?;
        unpack_nibbles(nib, t[code], &mut tmp);
        o.copy_from_slice(&tmp);
    }
    Ok(())
}

pub(super) fn decode_q4tp(g: Geom, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    for r in 0..g.rows {
        decode_q4tp_row(g, bytes, r, &mut out[r * g.cols..(r + 1) * g.cols])?;
    }
    Ok(())
}

/// Per-element bounds (see `quant::error_bounds`); the payload is validated.
pub(super) fn bounds(dtype: DType, g: Geom, bytes: &[u8], out: &mut [f32]) {
    if dtype == DType::Q4tp {
        let l = Q4tpLayout::new(g);
        for r in 0..g.rows {
            let Ok((t, codes)) = q4tp_row_params(bytes, l, r) else {
                continue;
            };
            for gi in 0..l.gpr {
                let step = read_code(codes, gi).map_or(f32::INFINITY, |c| t[c]);
                // 2^-120: an f32-subnormal ladder (only for |w| < ~1e-36) is not analysed.
                let b = (step * 0.5).max(f32::from_bits(7 << 23)) * (1.0 + BOUND_SLACK);
                out[r * g.cols + gi * GROUP..r * g.cols + (gi + 1) * GROUP].fill(b);
            }
        }
    } else {
        let groups = g.numel.div_ceil(GROUP);
        for (gi, o) in out.chunks_mut(GROUP).enumerate() {
            let s = group_of(dtype, bytes, groups, gi).map_or(f32::INFINITY, |(s, _)| s);
            o.fill(step_error_bound(s, Q4_MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{decode, decode_row, encode, EncodeOptions};

    #[test]
    fn nibble_order_low_then_high() {
        // absmax 7 → scale 1: element 0 = −8+? → choose values giving nibbles 1 and 15.
        let mut v = vec![0.0f32; 32];
        v[0] = -7.0; // q = 1
        v[1] = 7.0; // q = 15
        let b = encode(DType::Q4Block, &[32], &v, &EncodeOptions::default()).unwrap();
        assert_eq!(b.len(), 18);
        assert_eq!(b[0], 0xF1);
        assert_eq!(b[1], 0x88);
        assert_eq!(f16::from_le_bytes([b[16], b[17]]).to_f32(), 1.0);
        let t = encode(DType::Q4Tiled, &[32], &v, &EncodeOptions::default()).unwrap();
        assert_eq!(&t[..2], &b[16..18]);
        assert_eq!(&t[2..], &b[..16]);
    }

    #[test]
    fn partial_last_group_is_padded() {
        let v: Vec<f32> = (0..40).map(|i| i as f32 - 20.0).collect();
        let b = encode(DType::Q4Block, &[40], &v, &EncodeOptions::default()).unwrap();
        assert_eq!(b.len(), 36);
        // group 1 holds elements 32..40; the rest are padding nibbles 8.
        assert!(b[16 + 4..32].iter().all(|&x| x == 0x88));
        let d = decode(DType::Q4Block, &[40], &b).unwrap();
        assert_eq!(d.len(), 40);
    }

    /// Every row block's ladders, built side by side, equal §3.2's iterative ladder of
    /// each row, bit for bit (for blocks of 8, 16 and 1 rows, any rows).
    #[test]
    fn q4tp_block_ladders_are_the_rows_ladders() {
        let (rows, cols) = (19usize, 96usize);
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * (1.0 + (i / cols) as f32 * 0.7))
            .collect();
        let shape = [rows as u64, cols as u64];
        let b = encode(DType::Q4tp, &shape, &v, &EncodeOptions::default()).unwrap();
        let g = crate::quant::geometry(DType::Q4tp, &shape).unwrap();
        let l = Q4tpLayout::new(g);
        let want = |r: usize| q4tp_row_params(&b, l, r).unwrap().0;
        fn check<const R: usize>(
            rows: &Q4tpRows<'_, R>,
            rs: [usize; R],
            want: &dyn Fn(usize) -> [f32; LADDER],
        ) {
            for (i, &r) in rs.iter().enumerate() {
                let t = want(r);
                for (c, (rung, want)) in rows.ladder.iter().zip(t).enumerate() {
                    assert_eq!(rung[i].to_bits(), want.to_bits(), "R={R} row {r} rung {c}");
                }
            }
        }
        let rs8 = [1, 2, 3, 5, 8, 13, 17, 18];
        check(&Q4tpRows::<8>::new_at(g, &b, rs8), rs8, &want);
        let rs16: [usize; 16] = std::array::from_fn(|i| i + 3);
        check(&Q4tpRows::<16>::new_at(g, &b, rs16), rs16, &want);
        check(&Q4tpRows::<1>::new_at(g, &b, [7]), [7], &want);
        // From a matrix's bases: consecutive rows (read as slices, up to the last row)
        // and scattered ones (one at a time).
        let bases = Q4tpBases::new(g, &b);
        let from_bases = |rs: [usize; 8]| {
            let [lo, mult] = bases.pick(rs);
            Q4tpRows::<8>::with_bases(g, &b, rs, lo, mult)
        };
        for rs in [
            rs8,
            std::array::from_fn(|i| i + 11),
            std::array::from_fn(|i| i),
        ] {
            check(&from_bases(rs), rs, &want);
        }
    }

    #[test]
    fn q4tp_codes_straddle_bytes() {
        let mut codes = [0u8; 5]; // 8 codes × 5 bits
        for gi in 0..8 {
            write_code(&mut codes, gi, (gi * 4 + 3) as u8 & 31);
        }
        for gi in 0..8 {
            assert_eq!(read_code(&codes, gi), Some((gi * 4 + 3) & 31));
        }
        // Code 1 starts at bit 5: its low 3 bits are bits 5..8 of byte 0.
        let mut c = [0u8; 2];
        write_code(&mut c, 1, 0b10111);
        assert_eq!(c, [0b1110_0000, 0b0000_0010]);
    }

    #[test]
    fn q4tp_ladder_and_zero_rows() {
        let mut v = vec![0.0f32; 2 * 64];
        for (i, x) in v[64..].iter_mut().enumerate() {
            *x = (i as f32 - 31.5) * if i < 32 { 0.01 } else { 1.0 };
        }
        let b = encode(DType::Q4tp, &[2, 64], &v, &EncodeOptions::default()).unwrap();
        let d = decode(DType::Q4tp, &[2, 64], &b).unwrap();
        assert!(d[..64].iter().all(|&x| x == 0.0));
        let bounds = crate::quant::error_bounds(DType::Q4tp, &[2, 64], &b).unwrap();
        for i in 0..128 {
            assert!(
                (d[i] - v[i]).abs() <= bounds[i],
                "{i}: {} vs {}",
                d[i],
                v[i]
            );
        }
        let mut row = vec![0.0; 64];
        decode_row(DType::Q4tp, &[2, 64], &b, 1, &mut row).unwrap();
        assert_eq!(row, d[64..]);
    }
}

// ---- row-dot kernels ---------------------------------------------------------------------
//
// One step of the kernels is one group: 16 nibble bytes and one scale. The nibbles are
// split (`& 0xF`, `>> 4`), re-interleaved into element order with a byte unpack (low
// nibble = even element, high = odd), re-centred (`− 8`) while still bytes, widened to
// i32, converted, and multiplied by the scale: `(q − 8)·scale` is exact in f32 (4-bit
// times 11-bit significand), so each weight enters the dot exactly as `decode` yields it.
// Only rows that start on a group boundary (`cols % 32 == 0`) take this path; `q4_block`
// and `q4_tiled` tensors of other shapes, whose groups straddle rows, are decoded row by
// row into scratch by `matrix`.

/// `R` consecutive group-aligned rows of a `q4_block` (`TILED = false`) or `q4_tiled`
/// (`TILED = true`) payload.
pub(crate) struct Q4Rows<'a, const R: usize, const TILED: bool> {
    /// `q4_block`: the row's nibble bytes; `q4_tiled`: the row's 18-byte tiles.
    data: [&'a [u8]; R],
    /// `q4_block`: the row's f16 scales; `q4_tiled`: unused (empty).
    scales: [&'a [u8]; R],
    cols: usize,
}

impl<'a, const R: usize, const TILED: bool> Q4Rows<'a, R, TILED> {
    /// Rows `rs` (any `R` rows, e.g. a task mask's live neurons) of a validated payload
    /// with `cols % 32 == 0`.
    #[inline]
    pub fn new_at(g: Geom, bytes: &'a [u8], rs: [usize; R]) -> Self {
        debug_assert_eq!(g.cols % GROUP, 0);
        let gpr = g.cols / GROUP;
        let groups = g.numel / GROUP;
        let (stride, sc) = if TILED {
            (TILE_BYTES, 0)
        } else {
            (NIBBLE_BYTES, groups * NIBBLE_BYTES)
        };
        Q4Rows {
            data: std::array::from_fn(|i| &bytes[rs[i] * gpr * stride..(rs[i] + 1) * gpr * stride]),
            scales: std::array::from_fn(|i| {
                if TILED {
                    &[][..]
                } else {
                    &bytes[sc + rs[i] * gpr * 2..sc + (rs[i] + 1) * gpr * 2]
                }
            }),
            cols: g.cols,
        }
    }

    /// The 16 nibble bytes and the f16 scale bits of group `blk` of row `i`.
    #[inline(always)]
    fn group(&self, i: usize, blk: usize) -> (&[u8], u16) {
        if TILED {
            let t = &self.data[i][blk * TILE_BYTES..(blk + 1) * TILE_BYTES];
            (&t[2..], super::kernel::le16(t, 0))
        } else {
            (
                &self.data[i][blk * NIBBLE_BYTES..(blk + 1) * NIBBLE_BYTES],
                super::kernel::le16(self.scales[i], 2 * blk),
            )
        }
    }

    /// [`Q4Rows::group`] without bounds checks: the nibble bytes' address and the scale
    /// bits. The SIMD kernels call this for every group of every row; the checks cost
    /// about a tenth of the integer kernel (measured on a 4864×896 matvec).
    ///
    /// # Safety
    /// `i < R` and `blk < cols / 32`: `new` sliced every row to exactly `cols / 32`
    /// groups (and as many scales).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn group_unchecked(&self, i: usize, blk: usize) -> (*const u8, u16) {
        let data = self.data.get_unchecked(i).as_ptr();
        if TILED {
            let t = data.add(blk * TILE_BYTES);
            (t.add(2), u16::from_le_bytes([*t, *t.add(1)]))
        } else {
            let s = self.scales.get_unchecked(i).as_ptr().add(2 * blk);
            (
                data.add(blk * NIBBLE_BYTES),
                u16::from_le_bytes([*s, *s.add(1)]),
            )
        }
    }
}

impl<const R: usize, const TILED: bool> RowsScalar for Q4Rows<'_, R, TILED> {
    fn cols(&self) -> usize {
        self.cols
    }
    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]) {
        let (nib, s) = self.group(i, blk);
        unpack_nibbles(nib, super::kernel::h2f_scalar(s), out);
    }
}

/// Row `r`'s ladder start and factor, `2^lo` and `2^step` (the f16 parameters in f32,
/// then `exp2`): what [`Q4tpRows`] multiplies out into the row's 32 scales.
pub(crate) fn q4tp_ladder_base(g: Geom, bytes: &[u8], r: usize) -> [f32; 2] {
    let l = Q4tpLayout::new(g);
    let param =
        |k: usize| f16::from_bits(super::kernel::le16(bytes, l.params + 4 * r + 2 * k)).to_f32();
    [param(0).exp2(), param(1).exp2()]
}

/// Every row's [`q4tp_ladder_base`] of a `q4tp` matrix, computed at load (two `exp2` per
/// row and product were half of a decode's time), as two columns, so that a block of
/// consecutive rows reads each with one load. Picked from `[lo, mult]` pairs on the
/// stack, the values came out by loads that straddled two 8-byte stores, which the CPU
/// does not forward (paired, SmolLM2 `q4tp` decode: 1.01–1.05 at `avx512`, 1.03 at `avx2`).
#[derive(Clone, Debug)]
pub(crate) struct Q4tpBases {
    lo: Vec<f32>,
    mult: Vec<f32>,
}

impl Q4tpBases {
    pub fn new(g: Geom, bytes: &[u8]) -> Self {
        let (lo, mult) = (0..g.rows)
            .map(|r| {
                let [lo, mult] = q4tp_ladder_base(g, bytes, r);
                (lo, mult)
            })
            .unzip();
        Q4tpBases { lo, mult }
    }

    /// `[lo, mult]` of rows `rs` (ascending, as every row selection is): slices of the
    /// columns when the rows are consecutive, else one row at a time.
    #[inline(always)]
    pub fn pick<const R: usize>(&self, rs: [usize; R]) -> [[f32; R]; 2] {
        let first = rs[0];
        if rs[R - 1].wrapping_sub(first) == R - 1 {
            if let (Some(lo), Some(mult)) = (
                self.lo.get(first..first + R),
                self.mult.get(first..first + R),
            ) {
                return [
                    lo.try_into().expect("R values"),
                    mult.try_into().expect("R values"),
                ];
            }
        }
        [rs.map(|r| self.lo[r]), rs.map(|r| self.mult[r])]
    }
}

/// `R` consecutive rows of a `q4tp` payload, with their ladders evaluated once.
pub(crate) struct Q4tpRows<'a, const R: usize> {
    nib: [&'a [u8]; R],
    codes: [&'a [u8]; R],
    /// `ladder[rung][row]`.
    ladder: [[f32; R]; LADDER],
    cols: usize,
}

impl<'a, const R: usize> Q4tpRows<'a, R> {
    /// Rows `rs` (any `R` rows, e.g. a task mask's live neurons) of a validated payload.
    /// The `R` ladders are built side by side (`R` independent multiplication chains
    /// instead of one chain of `31·R`), each with exactly the operations of [`ladder`].
    pub fn new_at(g: Geom, bytes: &'a [u8], rs: [usize; R]) -> Self {
        let bases = rs.map(|r| q4tp_ladder_base(g, bytes, r));
        Self::with_bases(g, bytes, rs, bases.map(|b| b[0]), bases.map(|b| b[1]))
    }

    /// [`Q4tpRows::new_at`] with each row's [`q4tp_ladder_base`] already at hand
    /// ([`Q4tpBases`]): ladder starts `lo`, factors `mult`.
    #[inline]
    pub fn with_bases(
        g: Geom,
        bytes: &'a [u8],
        rs: [usize; R],
        lo: [f32; R],
        mult: [f32; R],
    ) -> Self {
        let l = Q4tpLayout::new(g);
        let mut rows = Q4tpRows {
            nib: std::array::from_fn(|i| {
                let at = rs[i] * l.gpr * NIBBLE_BYTES;
                &bytes[at..at + l.gpr * NIBBLE_BYTES]
            }),
            codes: std::array::from_fn(|i| {
                let at = l.codes + rs[i] * l.code_bytes;
                &bytes[at..at + l.code_bytes]
            }),
            ladder: [[0f32; R]; LADDER],
            cols: g.cols,
        };
        // Rung-major, so that a rung of all `R` rows is one vector multiply; in place (a
        // ladder built aside was copied into the rows, 1 KiB per block of 8).
        let ladder = &mut rows.ladder;
        ladder[0] = lo;
        for c in 1..LADDER {
            let (done, rest) = ladder.split_at_mut(c);
            for ((t, p), m) in rest[0].iter_mut().zip(&done[c - 1]).zip(&mult) {
                *t = p * m;
            }
        }
        rows
    }

    /// The 5-bit scale codes of row `i` from group `blk`'s on, in the low bits: at least
    /// 20 (four groups' when `blk` is a multiple of 4, whose codes start at bit 0 or 4 of
    /// a byte; two groups' otherwise), zero past the row's codes.
    #[inline(always)]
    fn code_bits(&self, i: usize, blk: usize) -> u32 {
        let c = self.codes[i];
        let (p, at) = (5 * blk, 5 * blk / 8);
        // One 4-byte read where the row's codes go on that far (all but its last groups;
        // a bounds check per byte was a fifth of a cache-warm product), else byte by byte.
        (match c.get(at..at + 4) {
            Some(four) => u32::from_le_bytes([four[0], four[1], four[2], four[3]]),
            None => {
                let b = |k: usize| c.get(at + k).copied().unwrap_or(0) as u32;
                b(0) | b(1) << 8 | b(2) << 16
            }
        }) >> (p % 8)
    }

    /// The scales of groups `blk` and `blk + 1` of row `i`: both 5-bit codes from one
    /// read of the (at most three) bytes that hold them.
    #[inline(always)]
    fn pair_scales(&self, i: usize, blk: usize) -> [f32; 2] {
        let w = self.code_bits(i, blk);
        let t = &self.ladder;
        [t[w as usize & 31][i], t[(w >> 5) as usize & 31][i]]
    }

    /// The scales of groups `blk .. blk + 4` of row `i` (`blk` a multiple of 4): one read.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn quad_scales(&self, i: usize, blk: usize) -> [f32; 4] {
        debug_assert_eq!(blk % 4, 0);
        let w = self.code_bits(i, blk);
        let t = &self.ladder;
        std::array::from_fn(|k| t[(w >> (5 * k)) as usize & 31][i])
    }

    /// Nibble bytes and scale of group `blk` of row `i`.
    #[inline(always)]
    fn group(&self, i: usize, blk: usize) -> (&[u8], f32) {
        let c = self.codes[i];
        let p = 5 * blk;
        let lo = c[p / 8] as u16;
        let hi = c.get(p / 8 + 1).copied().unwrap_or(0) as u16;
        let code = (((hi << 8) | lo) >> (p % 8)) as usize & 31;
        (
            &self.nib[i][blk * NIBBLE_BYTES..(blk + 1) * NIBBLE_BYTES],
            self.ladder[code][i],
        )
    }
}

impl<const R: usize> RowsScalar for Q4tpRows<'_, R> {
    fn cols(&self) -> usize {
        self.cols
    }
    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]) {
        let (nib, t) = self.group(i, blk);
        unpack_nibbles(nib, t, out);
    }
}

/// Codes `nibble − 8` of a group, low nibbles (even elements) first, then high ones: the
/// order of [`super::kernel::ActOrder::NibblePairs`].
fn pair_codes(nib: &[u8], out: &mut [i8; STEP]) {
    for (k, &b) in nib.iter().enumerate().take(NIBBLE_BYTES) {
        out[k] = (b & 0xF) as i8 - 8;
        out[NIBBLE_BYTES + k] = (b >> 4) as i8 - 8;
    }
}

impl<const R: usize, const TILED: bool> IntRowsScalar for Q4Rows<'_, R, TILED> {
    const GROUP_SCALES: bool = true;
    fn cols(&self) -> usize {
        self.cols
    }
    fn codes32(&self, i: usize, blk: usize, out: &mut [i8; STEP]) {
        pair_codes(self.group(i, blk).0, out);
    }
    fn group_scale(&self, i: usize, blk: usize) -> f32 {
        super::kernel::h2f_scalar(self.group(i, blk).1)
    }
    fn int_post(&self, _i: usize) -> f32 {
        1.0
    }
}

impl<const R: usize> IntRowsScalar for Q4tpRows<'_, R> {
    const GROUP_SCALES: bool = true;
    fn cols(&self) -> usize {
        self.cols
    }
    fn codes32(&self, i: usize, blk: usize, out: &mut [i8; STEP]) {
        pair_codes(self.group(i, blk).0, out);
    }
    fn group_scale(&self, i: usize, blk: usize) -> f32 {
        self.group(i, blk).1
    }
    fn int_post(&self, _i: usize) -> f32 {
        1.0
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::kernel::{
        h2f, h2f8, pair_vector, prefetch_ahead, IntRowsSimd, RowsAvx2, RowsAvx512,
    };
    use super::{Q4Rows, Q4tpRows};
    use std::arch::x86_64::*;

    /// The 32 nibbles of a group as bytes (`code + 8`): low nibbles, then high nibbles.
    #[inline(always)]
    unsafe fn nibbles_u8(nib: &[u8]) -> __m256i {
        nibbles_u8_at(nib[..16].as_ptr())
    }

    /// [`nibbles_u8`] reading the 16 nibble bytes at `nib`.
    ///
    /// # Safety
    /// AVX2; `nib` points at 16 readable bytes.
    #[inline(always)]
    unsafe fn nibbles_u8_at(nib: *const u8) -> __m256i {
        let b = _mm_loadu_si128(nib as *const __m128i);
        let both = _mm256_set_m128i(_mm_srli_epi16::<4>(b), b);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
    }

    /// [`nibbles_u8_at`] widened to int16 ([`IntRowsSimd::load_i16`]): the 16 bytes
    /// zero-extended to 16-bit lanes by the load, then the low nibbles masked and the high
    /// ones shifted down, three instructions. The load is written out: from the intrinsic
    /// (`_mm256_cvtepu8_epi16`) the compiler moves the mask and the shift before the
    /// widening, in 128 bits, and then widens each half (five instructions and a load).
    ///
    /// # Safety
    /// AVX2; `nib` points at 16 readable bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn nibbles_i16_at(nib: *const u8) -> [__m256i; 2] {
        let w: __m256i;
        std::arch::asm!(
            "vpmovzxbw {w}, xmmword ptr [{p}]",
            p = in(reg) nib,
            w = lateout(ymm_reg) w,
            options(pure, readonly, nostack, preserves_flags),
        );
        [
            _mm256_and_si256(w, _mm256_set1_epi16(0x0F)),
            _mm256_srli_epi16::<4>(w),
        ]
    }

    /// Two groups' 32 nibble bytes at `nib` as two [`nibbles_u8`]: loaded once, placed in
    /// 128-bit lanes `[g0, g0, g1, g1]`, the high nibbles shifted down in lanes 1 and 3.
    ///
    /// # Safety
    /// AVX-512 F/BW; `nib` points at 32 readable bytes.
    #[inline(always)]
    unsafe fn nibble_pair_at(nib: *const u8) -> __m512i {
        let z = _mm512_castsi256_si512(_mm256_loadu_si256(nib as *const __m256i));
        let lanes = _mm512_shuffle_i64x2::<0b01_01_00_00>(z, z);
        let nib = _mm512_mask_srli_epi16::<4>(lanes, 0xFF00_FF00, lanes);
        _mm512_and_si512(nib, _mm512_set1_epi8(0x0F))
    }

    /// Word `k` of the 18 words of two `q4_tiled` tiles (`[f16 s][16 nibble bytes]` each)
    /// that word `w` of [`tile_pair_at`]'s vector takes: the first tile's nibble bytes
    /// (words 1–8) in 128-bit lanes 0 and 1, the second's (words 10–17) in lanes 2 and 3.
    static TILE_PAIR_WORDS: [u16; 32] = [
        1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, //
        10, 11, 12, 13, 14, 15, 16, 17, 10, 11, 12, 13, 14, 15, 16, 17,
    ];

    /// [`nibble_pair_at`] for two `q4_tiled` tiles at `t` (36 contiguous bytes): one masked
    /// load of exactly those bytes, one word permute to lanes `[g0, g0, g1, g1]` (the nibble
    /// bytes start at even offsets, so AVX-512 BW's `vpermw` does it), then the same
    /// shift and mask. Replaces two group loads, their unpacking and an insert.
    ///
    /// # Safety
    /// AVX-512 F/BW; `t` points at 36 readable bytes.
    #[inline(always)]
    unsafe fn tile_pair_at(t: *const u8) -> __m512i {
        let v = _mm512_maskz_loadu_epi16(0x3_FFFF, t as *const i16);
        let idx = _mm512_loadu_si512(TILE_PAIR_WORDS.as_ptr() as *const _);
        let lanes = _mm512_permutexvar_epi16(idx, v);
        let nib = _mm512_mask_srli_epi16::<4>(lanes, 0xFF00_FF00, lanes);
        _mm512_and_si512(nib, _mm512_set1_epi8(0x0F))
    }

    /// The prefetch of a nibble plane (`q4_block`, `q4tp`: 16 bytes a group, four to a
    /// line): one per 64-byte line, at the first group starting in it, into L2 two blocks
    /// of rows ahead, and the row's next line into L1. The second made `q4_block` matrix-vector
    /// products 1–5% faster in cache on Zen 3 (the fastest of 20 000 calls,
    /// 576×2048 / 2048×2048 / 1536×576, 1 thread) and its decode 1.02–1.03× (SmolLM2-135M,
    /// Qwen2.5-Coder-0.5B, 6–8 paired rounds); `q4tp` stayed level, and the same line
    /// ahead slowed the `q8` rows by 8–17%.
    ///
    /// # Safety
    /// As [`prefetch_ahead`].
    #[inline(always)]
    unsafe fn prefetch_nibble_plane<const R: usize>(nib: &[u8], blk: usize) {
        if (blk * super::NIBBLE_BYTES).is_multiple_of(64) {
            prefetch_ahead::<R>(nib, blk * super::NIBBLE_BYTES, 1);
            let next = nib.as_ptr().wrapping_add(blk * super::NIBBLE_BYTES + 64);
            _mm_prefetch::<_MM_HINT_T0>(next as *const i8);
        }
    }

    impl<const R: usize, const TILED: bool> IntRowsSimd for Q4Rows<'_, R, TILED> {
        const CODE_OFFSET: u8 = 8;

        #[inline(always)]
        unsafe fn load_u8(&self, i: usize, blk: usize) -> __m256i {
            // In bounds: the kernel calls this for `i < R`, `blk < cols / 32`.
            nibbles_u8_at(self.group_unchecked(i, blk).0)
        }

        #[inline(always)]
        unsafe fn load_i16(&self, i: usize, blk: usize) -> [__m256i; 2] {
            // In bounds: as `load_u8`.
            nibbles_i16_at(self.group_unchecked(i, blk).0)
        }

        /// Row data is contiguous: row `i` two blocks on is `2·R` rows further.
        #[inline(always)]
        unsafe fn prefetch_next(&self, i: usize, blk: usize) {
            if !TILED {
                prefetch_nibble_plane::<R>(self.data[i], blk);
                if blk.is_multiple_of(32) {
                    prefetch_ahead::<R>(self.scales[i], 2 * blk, 1);
                }
                return;
            }
            // Every 8 tiles (144 bytes), the 3 lines from the first: 1.33 prefetches per
            // line where one every other tile (36 bytes apart) made 1.78. SmolLM2-135M
            // `q4_tiled` decode ran 4–21% faster (interleaved rounds, median ratio of
            // pairs), Qwen2.5-Coder-0.5B's within ±2%; 5 lines every 16 tiles gained as
            // much on SmolLM2 but lost 8% on Qwen, 2 every 4 gained 6%. (The first-tile
            // test of 18-byte tiles, `blk·18 mod 64 < 18`, was a multiply, a compare and an
            // irregular branch per row and group.)
            if blk.is_multiple_of(8) {
                prefetch_ahead::<R>(self.data[i], blk * super::TILE_BYTES, 3);
            }
        }

        /// `q4_tiled`: every other tile (36 bytes apart, so no line is skipped), as the
        /// decode prefetch was before its bursts: a packer's 16 rows × 3 lines at once
        /// made 64-token prefill 2% slower on both models.
        #[inline(always)]
        unsafe fn prefetch_pack(&self, i: usize, blk: usize) {
            if !TILED {
                return self.prefetch_next(i, blk);
            }
            if blk % 2 == 1 {
                return;
            }
            prefetch_ahead::<R>(self.data[i], blk * super::TILE_BYTES, 1);
        }

        #[inline(always)]
        unsafe fn group_scale_simd(&self, i: usize, blk: usize) -> f32 {
            h2f(self.group_unchecked(i, blk).1)
        }

        /// The eight f16 scales gathered into one vector, one conversion.
        #[inline(always)]
        unsafe fn group_scales8(&self, blk: usize) -> __m256 {
            debug_assert!(R >= 8);
            h2f8(std::array::from_fn(|i| self.group_unchecked(i, blk).1))
        }

        /// `q4_block`: a row's two groups are 32 contiguous bytes ([`nibble_pair_at`]);
        /// `q4_tiled`: two tiles are 36 ([`tile_pair_at`]).
        #[inline(always)]
        unsafe fn load_pair_u8(&self, i: usize, blk: usize) -> __m512i {
            if TILED {
                // In bounds: tiles `blk` and `blk + 1` of row `i`.
                let t = self
                    .data
                    .get_unchecked(i)
                    .as_ptr()
                    .add(blk * super::TILE_BYTES);
                return tile_pair_at(t);
            }
            // In bounds: groups `blk` and `blk + 1` of row `i` (the caller's contract).
            nibble_pair_at(self.group_unchecked(i, blk).0)
        }

        /// `q4_block`: a row's two scales are 4 contiguous bytes, converted at once;
        /// `q4_tiled`: the words that start two tiles, joined and converted at once.
        #[inline(always)]
        unsafe fn pair_scales(&self, i: usize, blk: usize) -> __m512 {
            let two = _mm_cvtph_ps(_mm_cvtsi32_si128(self.scale_pair_bits(i, blk)));
            let spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
            _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(two))
        }

        /// As [`IntRowsSimd::pair_scales`]: one load and one conversion.
        #[inline(always)]
        unsafe fn scale_pair_256(&self, i: usize, blk: usize) -> [__m256; 2] {
            let two = _mm_cvtph_ps(_mm_cvtsi32_si128(self.scale_pair_bits(i, blk)));
            [
                _mm256_broadcastss_ps(two),
                _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), _mm256_set1_epi32(1)),
            ]
        }

        const NIBBLE_PAIRS: bool = true;

        #[inline(always)]
        unsafe fn nibbles(&self, i: usize, blk: usize) -> __m128i {
            // In bounds: the caller's contract (`i < R`, `blk < cols / 32`).
            _mm_loadu_si128(self.group_unchecked(i, blk).0 as *const __m128i)
        }

        /// `q4_block`: the two groups' 32 contiguous bytes, one load; `q4_tiled`: the 16
        /// nibble bytes of each tile, two.
        #[inline(always)]
        unsafe fn nibble_pair(&self, i: usize, blk: usize) -> __m256i {
            // In bounds: groups `blk` and `blk + 1` of row `i` (the caller's contract).
            let g0 = self.group_unchecked(i, blk).0;
            if TILED {
                let g1 = self.group_unchecked(i, blk + 1).0;
                return _mm256_loadu2_m128i(g1 as *const __m128i, g0 as *const __m128i);
            }
            _mm256_loadu_si256(g0 as *const __m256i)
        }

        /// `q4_block`: the four scales are 8 contiguous bytes, one load and one
        /// conversion; `q4_tiled`: two pairs of tile words, joined, one conversion.
        #[inline(always)]
        unsafe fn scale_quad(&self, i: usize, blk: usize) -> __m128 {
            if TILED {
                let (a, b) = (
                    self.scale_pair_bits(i, blk),
                    self.scale_pair_bits(i, blk + 2),
                );
                return _mm_cvtph_ps(_mm_setr_epi32(a, b, 0, 0));
            }
            // In bounds: scales `blk .. blk + 4` of row `i` (the caller's contract).
            let p = self.scales.get_unchecked(i).as_ptr().add(2 * blk);
            _mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i))
        }
    }

    impl<const R: usize, const TILED: bool> Q4Rows<'_, R, TILED> {
        /// The f16 scales of groups `blk` and `blk + 1` of row `i` in the low and high
        /// halves: `q4_block`'s are 4 contiguous bytes, `q4_tiled`'s the words that start
        /// two tiles.
        ///
        /// # Safety
        /// `i < R`, `blk + 1 < cols / 32`.
        #[inline(always)]
        unsafe fn scale_pair_bits(&self, i: usize, blk: usize) -> i32 {
            if TILED {
                // In bounds: tiles `blk` and `blk + 1` of row `i`.
                let t = self
                    .data
                    .get_unchecked(i)
                    .as_ptr()
                    .add(blk * super::TILE_BYTES);
                let t1 = t.add(super::TILE_BYTES);
                let (s0, s1) = ([*t, *t.add(1)], [*t1, *t1.add(1)]);
                i32::from_le_bytes([s0[0], s0[1], s1[0], s1[1]])
            } else {
                // In bounds: scales `blk` and `blk + 1` of row `i`.
                let p = self.scales.get_unchecked(i).as_ptr().add(2 * blk);
                (p as *const i32).read_unaligned()
            }
        }
    }

    impl<const R: usize> IntRowsSimd for Q4tpRows<'_, R> {
        const CODE_OFFSET: u8 = 8;

        #[inline(always)]
        unsafe fn load_u8(&self, i: usize, blk: usize) -> __m256i {
            nibbles_u8(self.group(i, blk).0)
        }

        #[inline(always)]
        unsafe fn load_i16(&self, i: usize, blk: usize) -> [__m256i; 2] {
            let at = blk * super::NIBBLE_BYTES;
            nibbles_i16_at(self.nib[i][at..at + super::NIBBLE_BYTES].as_ptr())
        }

        /// Both rungs from one read of the codes ([`Q4tpRows::pair_scales`]).
        #[inline(always)]
        unsafe fn scale_pair_256(&self, i: usize, blk: usize) -> [__m256; 2] {
            let [s0, s1] = Q4tpRows::pair_scales(self, i, blk);
            [_mm256_set1_ps(s0), _mm256_set1_ps(s1)]
        }

        const NIBBLE_PAIRS: bool = true;

        #[inline(always)]
        unsafe fn nibbles(&self, i: usize, blk: usize) -> __m128i {
            let at = blk * super::NIBBLE_BYTES;
            _mm_loadu_si128(self.nib[i][at..at + super::NIBBLE_BYTES].as_ptr() as *const __m128i)
        }

        /// The nibble plane holds a row's groups side by side: one load.
        #[inline(always)]
        unsafe fn nibble_pair(&self, i: usize, blk: usize) -> __m256i {
            let at = blk * super::NIBBLE_BYTES;
            // In bounds: groups `blk` and `blk + 1` of row `i` (the caller's contract).
            let p = self.nib.get_unchecked(i).as_ptr().add(at);
            _mm256_loadu_si256(p as *const __m256i)
        }

        /// All four rungs from one read of the codes ([`Q4tpRows::quad_scales`]).
        #[inline(always)]
        unsafe fn scale_quad(&self, i: usize, blk: usize) -> __m128 {
            let [a, b, c, d] = Q4tpRows::quad_scales(self, i, blk);
            _mm_setr_ps(a, b, c, d)
        }

        #[inline(always)]
        unsafe fn pair_scales(&self, i: usize, blk: usize) -> __m512 {
            let [s0, s1] = Q4tpRows::pair_scales(self, i, blk);
            pair_vector(s0, s1)
        }

        /// The nibble plane holds a row's groups side by side ([`nibble_pair_at`]).
        #[inline(always)]
        unsafe fn load_pair_u8(&self, i: usize, blk: usize) -> __m512i {
            let at = blk * super::NIBBLE_BYTES;
            nibble_pair_at(self.nib[i][at..at + 2 * super::NIBBLE_BYTES].as_ptr())
        }

        /// The nibble plane is `q4_block`'s: row `i` two blocks on is `2·R` rows further.
        /// (Without this, decode waited on every group's load.)
        #[inline(always)]
        unsafe fn prefetch_next(&self, i: usize, blk: usize) {
            prefetch_nibble_plane::<R>(self.nib[i], blk);
        }
    }

    /// The 32 codes `q − 8` of a group in element order, as i8: elements 0..16 and 16..32.
    #[inline(always)]
    unsafe fn centred(nib: &[u8]) -> (__m128i, __m128i) {
        let b = _mm_loadu_si128(nib[..16].as_ptr() as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(b, m);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m);
        let eight = _mm_set1_epi8(8);
        (
            _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight),
            _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight),
        )
    }

    #[inline(always)]
    unsafe fn group_avx2(nib: &[u8], s: f32) -> [__m256; 4] {
        let (a, b) = centred(nib);
        let s = _mm256_set1_ps(s);
        [
            scaled8(a, s),
            scaled8(_mm_unpackhi_epi64(a, a), s),
            scaled8(b, s),
            scaled8(_mm_unpackhi_epi64(b, b), s),
        ]
    }

    /// The low 8 i8 lanes of `v`, as f32, times `s`.
    #[inline(always)]
    unsafe fn scaled8(v: __m128i, s: __m256) -> __m256 {
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), s)
    }

    /// AVX-512: a table lookup instead of convert-and-scale. The 16 possible weights of a
    /// group, `(k − 8)·s`, fit one register; `vpermps` picks them by index and reads only
    /// the low 4 bits of each index lane, so interleaving the bytes with themselves shifted
    /// right by 4 (`b0, b0>>4, b1, b1>>4, …`, garbage above bit 3) and zero-extending to
    /// 32 bits yields the indices of elements 0..16 and 16..32 without masking.
    #[inline(always)]
    unsafe fn group_avx512(nib: &[u8], s: f32) -> [__m512; 2] {
        group_avx512_at(nib[..16].as_ptr(), s)
    }

    /// [`group_avx512`] reading the 16 nibble bytes at `nib`.
    ///
    /// # Safety
    /// AVX-512 F/BW; `nib` points at 16 readable bytes.
    #[inline(always)]
    unsafe fn group_avx512_at(nib: *const u8, s: f32) -> [__m512; 2] {
        let b = _mm_loadu_si128(nib as *const __m128i);
        let h = _mm_srli_epi16::<4>(b);
        let table = _mm512_mul_ps(
            _mm512_setr_ps(
                -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0,
                7.0,
            ),
            _mm512_set1_ps(s),
        );
        [
            _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, h)), table),
            _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(b, h)), table),
        ]
    }

    impl<const R: usize, const TILED: bool> RowsAvx2 for Q4Rows<'_, R, TILED> {
        #[inline(always)]
        unsafe fn prefetch_next_f(&self, i: usize, blk: usize) {
            self.prefetch_next(i, blk)
        }

        #[inline(always)]
        unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4] {
            let (nib, s) = self.group(i, blk);
            group_avx2(nib, h2f(s))
        }
    }

    impl<const R: usize, const TILED: bool> RowsAvx512 for Q4Rows<'_, R, TILED> {
        #[inline(always)]
        unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2] {
            // In bounds: the kernel calls this for `i < R`, `blk < cols / 32`.
            let (nib, s) = self.group_unchecked(i, blk);
            group_avx512_at(nib, h2f(s))
        }
    }

    impl<const R: usize> RowsAvx2 for Q4tpRows<'_, R> {
        #[inline(always)]
        unsafe fn prefetch_next_f(&self, i: usize, blk: usize) {
            self.prefetch_next(i, blk)
        }

        #[inline(always)]
        unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4] {
            let (nib, t) = self.group(i, blk);
            group_avx2(nib, t)
        }
    }

    impl<const R: usize> RowsAvx512 for Q4tpRows<'_, R> {
        #[inline(always)]
        unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2] {
            let (nib, t) = self.group(i, blk);
            group_avx512(nib, t)
        }
    }
}
