//! `vbit` (id 8) and `vbit_ro` (id 10): a bit width per row, f16 scales per group of 32.
//! 2-D only, `cols % 32 == 0`, `gpr = cols / 32`.
//!
//! ```text
//! vbit   : [u8 bits: rows][f16 scale: rows·gpr][packed rows]
//! vbit_ro: [u8 bits: rows][f16 scale: rows·gpr][u32 offsets: rows+1][packed rows]
//! ```
//!
//! Row r is one continuous MSB-first stream of `b_r`-bit codes `u` (the first code in the
//! high bits of the first byte), padded with zero bits to a whole byte, so it takes
//! `ceil(cols·b_r/8)` bytes; rows follow each other without gaps. `vbit_ro` offsets are
//! relative to the start of the packed rows: `offsets[0] = 0`,
//! `offsets[r+1] = offsets[r] + ceil(cols·b_r/8)`, `offsets[rows]` = packed length.
//! `w = (u − L)·scale[r, g]`, `L = 2^(b−1) − 1`, `b ∈ {3, 4, 5, 6, 8}`.

use super::{absmax, rd_f16, rd_u32, round_scale, step_error_bound, Geom, QuantError};
use crate::format::dtype::DType;

/// Bit widths the format allows (3 is the floor, 7 is not a width).
pub const ALLOWED_BITS: [u8; 5] = [3, 4, 5, 6, 8];
const GROUP: usize = crate::format::dtype::GROUP as usize;

/// The zero point `L = 2^(b−1) − 1` of width `b` (also the encoder's largest magnitude).
pub const fn zero_point(b: u8) -> i32 {
    (1 << (b - 1)) - 1
}

/// Bytes of a packed row of `cols` codes of `b` bits.
pub fn row_bytes(cols: usize, b: u8) -> Option<usize> {
    Some(cols.checked_mul(b as usize)?.div_ceil(8))
}

/// Byte offsets of a `vbit` / `vbit_ro` payload.
#[derive(Clone, Copy, Debug)]
pub struct VbitLayout {
    /// Groups (scales) per row.
    pub gpr: usize,
    /// Start of the f16 scales (= `rows`).
    pub scales: usize,
    /// Start of the `u32` offsets (`vbit_ro` only).
    pub offsets: Option<usize>,
    /// Start of the packed rows.
    pub packed: usize,
}

impl VbitLayout {
    pub fn new(dtype: DType, g: Geom) -> Option<VbitLayout> {
        let gpr = g.cols / GROUP;
        let head = g
            .rows
            .checked_add(g.rows.checked_mul(gpr)?.checked_mul(2)?)?;
        let (offsets, packed) = if dtype == DType::VbitRo {
            (
                Some(head),
                head.checked_add(g.rows.checked_add(1)?.checked_mul(4)?)?,
            )
        } else {
            (None, head)
        };
        Some(VbitLayout {
            gpr,
            scales: g.rows,
            offsets,
            packed,
        })
    }
}

fn bits_of(bytes: &[u8], r: usize) -> Result<u8, String> {
    let b = *bytes.get(r).ok_or("bit widths lie outside the payload")?;
    if ALLOWED_BITS.contains(&b) {
        Ok(b)
    } else {
        Err(format!("row {r} has bit width {b}; allowed: 3, 4, 5, 6, 8"))
    }
}

/// Checks every bit width, and that the packed rows (and `vbit_ro` offsets) account for
/// exactly the rest of the payload.
pub(super) fn validate(dtype: DType, g: Geom, bytes: &[u8]) -> Result<VbitLayout, String> {
    let l = VbitLayout::new(dtype, g).ok_or("layout offsets overflow")?;
    if l.packed > bytes.len() {
        return Err(format!("header needs {} bytes", l.packed));
    }
    let mut total = 0u64;
    for r in 0..g.rows {
        let b = bits_of(bytes, r)?;
        let len = row_bytes(g.cols, b).ok_or("row length overflows")? as u64;
        if let Some(off) = l.offsets {
            let start = rd_u32(bytes, off + 4 * r).ok_or("offsets lie outside the payload")? as u64;
            let end =
                rd_u32(bytes, off + 4 * r + 4).ok_or("offsets lie outside the payload")? as u64;
            if start != total {
                return Err(format!(
                    "offsets[{r}] = {start}, the rows before it take {total} bytes"
                ));
            }
            if end != start + len {
                return Err(format!(
                    "offsets[{}] = {end}, expected {} for a {b}-bit row of {} codes",
                    r + 1,
                    start + len,
                    g.cols
                ));
            }
        }
        total += len;
    }
    if let (Some(off), 0) = (l.offsets, g.rows) {
        if rd_u32(bytes, off) != Some(0) {
            return Err("offsets[0] must be 0".into());
        }
    }
    let expected = l.packed as u64 + total;
    if bytes.len() as u64 != expected {
        return Err(format!("bit widths imply {expected} bytes"));
    }
    Ok(l)
}

/// The `b`-bit codes `u` of an MSB-first stream, in order (zero bits past its end): the
/// one reader of packed rows, for decoding and for the kernels' scalar reference.
pub(crate) struct MsbCodes<'a> {
    bytes: std::slice::Iter<'a, u8>,
    acc: u64,
    have: u32,
    b: u32,
}

impl<'a> MsbCodes<'a> {
    pub(crate) fn new(src: &'a [u8], b: u8) -> Self {
        MsbCodes {
            bytes: src.iter(),
            acc: 0,
            have: 0,
            b: b as u32,
        }
    }
}

impl Iterator for MsbCodes<'_> {
    type Item = u32;
    #[inline]
    fn next(&mut self) -> Option<u32> {
        while self.have < self.b {
            self.acc = (self.acc << 8) | *self.bytes.next().unwrap_or(&0) as u64;
            self.have += 8;
        }
        self.have -= self.b;
        Some(((self.acc >> self.have) & ((1 << self.b) - 1)) as u32)
    }
}

/// Decodes one packed row (`src` = its bytes) with the row's scales (`scales` = its f16s).
fn unpack_row(b: u8, src: &[u8], scales: &[u8], out: &mut [f32]) {
    let l = zero_point(b);
    let mut codes = MsbCodes::new(src, b);
    for (o, s) in out.chunks_mut(GROUP).zip(scales.chunks_exact(2)) {
        let s = half::f16::from_le_bytes([s[0], s[1]]).to_f32();
        for (x, u) in o.iter_mut().zip(&mut codes) {
            *x = (u as i32 - l) as f32 * s;
        }
    }
}

fn decode_one(
    g: Geom,
    l: VbitLayout,
    bytes: &[u8],
    r: usize,
    b: u8,
    start: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let len = row_bytes(g.cols, b).ok_or("row length overflows")?;
    let at = l.packed.checked_add(start).ok_or("row offset overflows")?;
    let src = bytes
        .get(at..at.checked_add(len).ok_or("row end overflows")?)
        .ok_or_else(|| format!("row {r} lies outside the payload"))?;
    let s0 = l.scales + 2 * r * l.gpr;
    let scales = bytes
        .get(s0..s0 + 2 * l.gpr)
        .ok_or("scales lie outside the payload")?;
    unpack_row(b, src, scales, out);
    Ok(())
}

pub(super) fn decode(dtype: DType, g: Geom, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    let l = validate(dtype, g, bytes)?;
    let mut start = 0usize;
    for r in 0..g.rows {
        let b = bits_of(bytes, r)?;
        decode_one(
            g,
            l,
            bytes,
            r,
            b,
            start,
            &mut out[r * g.cols..(r + 1) * g.cols],
        )?;
        start += row_bytes(g.cols, b).ok_or("row length overflows")?;
    }
    Ok(())
}

/// `vbit`: validates the payload (O(rows)) and sums the widths of the rows before `r`.
/// `vbit_ro`: O(1), checks only this row's width and offsets.
pub(super) fn decode_row(
    dtype: DType,
    g: Geom,
    bytes: &[u8],
    r: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let b = bits_of(bytes, r)?;
    let len = row_bytes(g.cols, b).ok_or("row length overflows")?;
    let (l, start) = if dtype == DType::VbitRo {
        let l = VbitLayout::new(dtype, g).ok_or("layout offsets overflow")?;
        let off = l.offsets.unwrap_or(0);
        let start = rd_u32(bytes, off + 4 * r).ok_or("offsets lie outside the payload")?;
        let end = rd_u32(bytes, off + 4 * r + 4).ok_or("offsets lie outside the payload")?;
        if (end as u64) != start as u64 + len as u64 || (r == 0 && start != 0) {
            return Err(format!(
                "offsets of row {r} ({start}..{end}) disagree with its {b}-bit width"
            ));
        }
        (l, start as usize)
    } else {
        let l = validate(dtype, g, bytes)?;
        let mut start = 0usize;
        for j in 0..r {
            start += row_bytes(g.cols, bits_of(bytes, j)?).ok_or("row length overflows")?;
        }
        (l, start)
    };
    decode_one(g, l, bytes, r, b, start, out)
}

/// Start of every packed row, relative to the packed area, then its end (`rows + 1`
/// values). `vbit` has no offset table, so a row's start is a prefix sum over the widths:
/// computed once per matrix (O(rows)), it lets every later row decode in O(row).
pub(crate) fn row_starts(g: Geom, bytes: &[u8]) -> Result<Vec<usize>, String> {
    let mut starts = Vec::with_capacity(g.rows + 1);
    let mut at = 0usize;
    starts.push(0);
    for r in 0..g.rows {
        at = at
            .checked_add(row_bytes(g.cols, bits_of(bytes, r)?).ok_or("row length overflows")?)
            .ok_or("row offset overflows")?;
        starts.push(at);
    }
    Ok(starts)
}

/// Decodes row `r`, whose packed bytes start `start` bytes into the packed area (from
/// [`row_starts`]): O(row).
pub(crate) fn decode_row_from(
    dtype: DType,
    g: Geom,
    bytes: &[u8],
    r: usize,
    start: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let l = VbitLayout::new(dtype, g).ok_or("layout offsets overflow")?;
    decode_one(g, l, bytes, r, bits_of(bytes, r)?, start, out)
}

/// Per-element bounds (see `quant::error_bounds`); the payload is validated.
pub(super) fn bounds(dtype: DType, g: Geom, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    let l = validate(dtype, g, bytes)?;
    for r in 0..g.rows {
        let qmax = zero_point(bits_of(bytes, r)?) as f32;
        for gi in 0..l.gpr {
            let s = rd_f16(bytes, l.scales + 2 * (r * l.gpr + gi))
                .ok_or("scale outside the payload")?;
            let at = r * g.cols + gi * GROUP;
            out[at..at + GROUP].fill(step_error_bound(s, qmax));
        }
    }
    Ok(())
}

fn snap(x: f64) -> u8 {
    let r = x.round();
    if r <= 3.0 {
        3
    } else if r >= 8.0 {
        8
    } else if r == 7.0 {
        // 7 is not a width: below 7 take 6, from 7 on take 8 (keeps b monotone in x).
        if x < 7.0 {
            6
        } else {
            8
        }
    } else {
        r as u8
    }
}

/// Water-filling of row bit widths toward a mean budget (§3.2): with `a_r` a row's
/// magnitude, `b_r = snap(c + log2 a_r)` where `snap` rounds, clamps to [3, 8] and maps 7
/// to 6 or 8: one more bit per doubling of a row's magnitude, the rate-distortion optimum
/// when a row's squared error is `∝ a_r²·4^(−b_r)`. `c` is found by bisection (100 steps, a
/// deterministic function of the input) as the largest value whose mean width does not
/// exceed `budget`; since `b` only grows with `c`, that is the closest mean from below.
/// All-zero rows get 3 bits.
pub fn allocate_bits(rms: &[f64], budget: f64) -> Vec<u8> {
    let logs: Vec<Option<f64>> = rms.iter().map(|&a| (a > 0.0).then(|| a.log2())).collect();
    let at = |c: f64| -> Vec<u8> { logs.iter().map(|l| l.map_or(3, |l| snap(c + l))).collect() };
    let (lmin, lmax) = logs
        .iter()
        .flatten()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &l| {
            (a.min(l), b.max(l))
        });
    if !lmin.is_finite() {
        return vec![3; rms.len()];
    }
    let fits = |c: f64| {
        let sum: u64 = logs
            .iter()
            .map(|l| l.map_or(3, |l| snap(c + l)) as u64)
            .sum();
        sum as f64 <= budget * rms.len() as f64
    };
    // At lo every row has 3 bits, at hi every non-zero row has 8.
    let (mut lo, mut hi) = (2.0 - lmax, 9.0 - lmin);
    if fits(hi) {
        return at(hi);
    }
    if !fits(lo) {
        return at(lo);
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    at(lo)
}

/// Joint allocation over a family of tensors that share one budget (§3.2: a layer's routed
/// experts of one projection): [`allocate_bits`] over all members' rows at once, split back
/// per member. With `weights` (one per member), each member's row magnitudes are multiplied
/// by its weight first — the B-field, the router's selection frequency of that expert,
/// so `b ∝ log2(A·B)`: a frequently chosen expert gets more bits, one never chosen
/// (weight 0) is held at the floor. Only ratios of weights matter (the water level absorbs
/// a common factor).
pub fn allocate_family(members: &[Vec<f64>], weights: Option<&[f64]>, budget: f64) -> Vec<Vec<u8>> {
    let weight = |i: usize| weights.and_then(|w| w.get(i)).copied().unwrap_or(1.0);
    let all: Vec<f64> = members
        .iter()
        .enumerate()
        .flat_map(|(i, m)| m.iter().map(move |a| a * weight(i)))
        .collect();
    let mut bits = allocate_bits(&all, budget).into_iter();
    members
        .iter()
        .map(|m| bits.by_ref().take(m.len()).collect())
        .collect()
}

/// The magnitude `a_r` of each row of `values` (`[rows, cols]`) that [`allocate_bits`]
/// water-fills on: `sqrt(mean over the row's groups of absmax²)` — the step of a group is
/// `absmax/L`, so this is the magnitude that sets the row's error (on the fixture weights
/// it beats the plain row RMS by ~2.5% MSE at equal size).
pub fn row_magnitudes(values: &[f32], cols: usize) -> Vec<f64> {
    values
        .chunks_exact(cols.max(1))
        .map(|row| {
            let ss: f64 = row
                .chunks_exact(GROUP)
                .map(|grp| (absmax(grp) as f64).powi(2))
                .sum();
            (ss / (row.len() / GROUP).max(1) as f64).sqrt()
        })
        .collect()
}

/// Encoder: widths by [`allocate_bits`] over [`row_magnitudes`], then
/// [`encode_with_bits`].
pub(super) fn encode(
    dtype: DType,
    g: Geom,
    values: &[f32],
    budget: f64,
    out: &mut Vec<u8>,
) -> Result<(), QuantError> {
    let bits = allocate_bits(&row_magnitudes(values, g.cols), budget);
    encode_with_bits(dtype, g, values, &bits, out)
}

/// Encodes `values` with the row widths `bits` (one per row, each in [`ALLOWED_BITS`]):
/// per group `scale = f16(absmax/L)` and `u = clamp(round_ties_even(w/scale) + L, 0,
/// 2^b − 1)` with the rounded scale (`u = L` for a zero group). Widths decided elsewhere
/// (a budget shared by a layer's experts, §3.2) come in here.
pub(super) fn encode_with_bits(
    dtype: DType,
    g: Geom,
    values: &[f32],
    bits: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), QuantError> {
    if bits.len() != g.rows || bits.iter().any(|b| !ALLOWED_BITS.contains(b)) {
        return Err(QuantError::InvalidArgument {
            dtype,
            reason: format!(
                "{} row widths for {} rows, each one of {ALLOWED_BITS:?}",
                bits.len(),
                g.rows
            ),
        });
    }
    out.extend_from_slice(bits);
    let mut packed = Vec::new();
    let mut offsets = Vec::with_capacity(if dtype == DType::VbitRo {
        4 * (g.rows + 1)
    } else {
        0
    });
    for (r, &b) in bits.iter().enumerate() {
        if dtype == DType::VbitRo {
            let off = u32::try_from(packed.len()).map_err(|_| QuantError::OutOfRange {
                dtype,
                reason: "packed rows exceed the 4 GiB reach of u32 offsets".into(),
            })?;
            offsets.extend_from_slice(&off.to_le_bytes());
        }
        let l = zero_point(b);
        let umax = ((1u32 << b) - 1) as f32;
        let (mut acc, mut have) = (0u64, 0u32);
        for grp in values[r * g.cols..(r + 1) * g.cols].chunks_exact(GROUP) {
            let s = round_scale(dtype, absmax(grp) / l as f32, l as f32)?;
            out.extend_from_slice(&s.to_le_bytes());
            let s = s.to_f32();
            for &w in grp {
                let u = if s > 0.0 {
                    ((w / s).round_ties_even() + l as f32).clamp(0.0, umax) as u64
                } else {
                    l as u64
                };
                acc = (acc << b) | u;
                have += b as u32;
                while have >= 8 {
                    have -= 8;
                    packed.push((acc >> have) as u8);
                }
            }
        }
        if have > 0 {
            packed.push((acc << (8 - have)) as u8);
        }
    }
    if dtype == DType::VbitRo {
        let end = u32::try_from(packed.len()).map_err(|_| QuantError::OutOfRange {
            dtype,
            reason: "packed rows exceed the 4 GiB reach of u32 offsets".into(),
        })?;
        offsets.extend_from_slice(&end.to_le_bytes());
        out.extend_from_slice(&offsets);
    }
    out.extend_from_slice(&packed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{decode, encode, validate, EncodeOptions};

    #[test]
    fn msb_first_packing() {
        // One 3-bit row of 32 codes: code sequence u = 0,1,...,7,0,1,... packs MSB-first.
        let mut bytes = vec![3u8];
        bytes.extend_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
        let mut packed = vec![0u8; 12];
        for i in 0..32usize {
            let u = (i % 8) as u8;
            for k in 0..3 {
                let bit = (u >> (2 - k)) & 1;
                let p = 3 * i + k;
                packed[p / 8] |= bit << (7 - p % 8);
            }
        }
        assert_eq!(packed[0], 0b0000_0101); // codes 000, 001, then the top bits 01 of 010
        bytes.extend_from_slice(&packed);
        let d = decode(DType::Vbit, &[1, 32], &bytes).unwrap();
        let want: Vec<f32> = (0..32).map(|i| (i % 8) as f32 - 3.0).collect();
        assert_eq!(d, want);
    }

    #[test]
    fn allocation_respects_budget_and_order() {
        let rms: Vec<f64> = (0..100).map(|i| 0.01 * 1.05f64.powi(i)).collect();
        for budget in [3.0, 3.7, 4.0, 4.5, 5.5, 7.0, 8.0] {
            let b = allocate_bits(&rms, budget);
            let mean = b.iter().map(|&x| x as f64).sum::<f64>() / b.len() as f64;
            assert!(mean <= budget + 1e-12, "budget {budget}: mean {mean}");
            assert!(
                mean > budget - 1.0,
                "budget {budget}: mean {mean} too far below"
            );
            assert!(
                b.windows(2).all(|w| w[0] <= w[1]),
                "larger rows never get fewer bits"
            );
            assert!(b.iter().all(|x| ALLOWED_BITS.contains(x)));
        }
        assert_eq!(allocate_bits(&[0.0, 0.0], 5.0), vec![3, 3]);
    }

    #[test]
    fn vbit_ro_offsets_and_rejections() {
        let v: Vec<f32> = (0..4 * 64)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * (1 + i / 64) as f32)
            .collect();
        let b = encode(DType::VbitRo, &[4, 64], &v, &EncodeOptions::default()).unwrap();
        validate(DType::VbitRo, &[4, 64], &b).unwrap();
        let off = 4 + 4 * 2 * 2;
        assert_eq!(&b[off..off + 4], &[0, 0, 0, 0]);
        let mut bad = b.clone();
        bad[0] = 7;
        assert!(validate(DType::VbitRo, &[4, 64], &bad).is_err());
        let mut bad = b.clone();
        bad[off + 4] ^= 1;
        assert!(validate(DType::VbitRo, &[4, 64], &bad).is_err());
        assert!(validate(DType::VbitRo, &[4, 64], &b[..b.len() - 1]).is_err());
    }
}
