//! ggml tensor types and scalar reference dequantizers.
//!
//! Each block type stores `block` consecutive elements of a row in `block_bytes` bytes.
//! Layouts (all multi-byte fields little-endian, `f16` = IEEE half):
//!
//! ```text
//! Q4_0   (32, 18):  f16 d | u8 qs[16]                     x = (q − 8)·d
//! Q4_1   (32, 20):  f16 d | f16 m | u8 qs[16]             x = q·d + m
//! Q5_0   (32, 22):  f16 d | u32 qh | u8 qs[16]            x = (q − 16)·d, bit 4 of q from qh
//! Q5_1   (32, 24):  f16 d | f16 m | u32 qh | u8 qs[16]    x = q·d + m
//! Q8_0   (32, 34):  f16 d | i8 qs[32]                     x = q·d
//! IQ4_NL (32, 18):  f16 d | u8 qs[16]                     x = d·KVALUES[q]
//!   (in these 32-blocks element j < 16 is the low nibble of qs[j], element j + 16 the
//!   high nibble; Q5's qh bit j is the fifth bit of element j)
//! Q2_K  (256, 84):  u8 scales[16] | u8 qs[64] | f16 d | f16 dmin
//! Q3_K  (256,110):  u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d
//! Q4_K  (256,144):  f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//! Q5_K  (256,176):  f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
//! Q6_K  (256,210):  u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
//! IQ4_XS(256,136):  f16 d | u16 scales_h | u8 scales_l[4] | u8 qs[128]
//! ```
//!
//! The k-quant bit walks are spelled out in each function. Arithmetic is f32 in the order
//! ggml's reference dequantizers use (`(d·sc)·q − dmin·m`), so results agree with them to
//! the last bit or very nearly.

use half::{bf16, f16};

/// ggml tensor types this importer knows (ids are ggml's `enum ggml_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    IQ4NL,
    IQ4XS,
    BF16,
}

/// Elements per super-block of the k-quants and IQ4_XS.
pub const QK_K: usize = 256;
/// Elements per block of the legacy quants and IQ4_NL.
pub const QK: usize = 32;

/// The 16 non-uniform levels of IQ4_NL / IQ4_XS.
pub const IQ4_KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            20 => GgmlType::IQ4NL,
            23 => GgmlType::IQ4XS,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::IQ4NL => 20,
            GgmlType::IQ4XS => 23,
            GgmlType::BF16 => 30,
        }
    }

    /// ggml's type name (`Q4_K`, `IQ4_NL`, ...), as the fixtures spell it.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::IQ4NL => "IQ4_NL",
            GgmlType::IQ4XS => "IQ4_XS",
            GgmlType::BF16 => "BF16",
        }
    }

    /// `(elements per block, bytes per block)`.
    pub fn block(self) -> (u64, u64) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::IQ4NL => (32, 18),
            GgmlType::Q2K => (256, 84),
            GgmlType::Q3K => (256, 110),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
            GgmlType::IQ4XS => (256, 136),
        }
    }
}

/// Why a payload cannot be dequantized.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{ty:?}: {reason}")]
pub struct DequantError {
    pub ty: GgmlType,
    pub reason: String,
}

fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// Dequantizes `numel` elements stored as `ty` in `data` (exactly the tensor's bytes).
pub fn dequantize(ty: GgmlType, data: &[u8], numel: u64) -> Result<Vec<f32>, DequantError> {
    let err = |reason: String| DequantError { ty, reason };
    let (block, block_bytes) = ty.block();
    if !numel.is_multiple_of(block) {
        return Err(err(format!(
            "{numel} elements are not whole blocks of {block}"
        )));
    }
    let need = (numel / block)
        .checked_mul(block_bytes)
        .ok_or_else(|| err("byte size overflows".into()))?;
    if need != data.len() as u64 {
        return Err(err(format!(
            "{numel} elements need {need} bytes, the payload has {}",
            data.len()
        )));
    }
    let n = usize::try_from(numel).map_err(|_| err("too many elements".into()))?;
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| err(format!("cannot allocate {n} values")))?;
    out.resize(n, 0.0);
    dequantize_into(ty, data, &mut out);
    Ok(out)
}

/// Dequantizes elements `start .. start + out.len()` of a tensor stored as `ty` in `data`
/// (the whole tensor's bytes): both ends must fall on block boundaries. This is how an
/// import reads a large tensor a block of rows at a time.
pub fn dequantize_range(
    ty: GgmlType,
    data: &[u8],
    start: usize,
    out: &mut [f32],
) -> Result<(), DequantError> {
    let err = |reason: String| DequantError { ty, reason };
    let (block, block_bytes) = ty.block();
    let (block, block_bytes) = (block as usize, block_bytes as usize);
    let end = start
        .checked_add(out.len())
        .ok_or_else(|| err("element range overflows".into()))?;
    if !start.is_multiple_of(block) || !end.is_multiple_of(block) {
        return Err(err(format!(
            "elements {start}..{end} do not fall on blocks of {block}"
        )));
    }
    let bytes = (start / block)
        .checked_mul(block_bytes)
        .zip((end / block).checked_mul(block_bytes))
        .and_then(|(a, b)| data.get(a..b))
        .ok_or_else(|| {
            err(format!(
                "elements {start}..{end} lie beyond the {}-byte payload",
                data.len()
            ))
        })?;
    dequantize_into(ty, bytes, out);
    Ok(())
}

/// Dequantizes whole blocks; `out.len()` must be `data.len() / block_bytes · block`
/// (checked by [`dequantize`]).
fn dequantize_into(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    let (block, block_bytes) = ty.block();
    let (block, block_bytes) = (block as usize, block_bytes as usize);
    for (b, y) in data
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(block))
    {
        match ty {
            GgmlType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            GgmlType::F16 => y[0] = f16_at(b, 0),
            GgmlType::BF16 => y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            GgmlType::Q4_0 => q4_0(b, y),
            GgmlType::Q4_1 => q4_1(b, y),
            GgmlType::Q5_0 => q5_0(b, y),
            GgmlType::Q5_1 => q5_1(b, y),
            GgmlType::Q8_0 => q8_0(b, y),
            GgmlType::IQ4NL => iq4_nl(b, y),
            GgmlType::Q2K => q2_k(b, y),
            GgmlType::Q3K => q3_k(b, y),
            GgmlType::Q4K => q4_k(b, y),
            GgmlType::Q5K => q5_k(b, y),
            GgmlType::Q6K => q6_k(b, y),
            GgmlType::IQ4XS => iq4_xs(b, y),
        }
    }
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        y[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
        y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        y[j] = (b[4 + j] & 0xF) as f32 * d + m;
        y[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
    }
}

/// The fifth bits of a Q5 block: bit j of `qh` belongs to element j.
fn q5_high(qh: u32, j: usize) -> (u8, u8) {
    (
        ((qh >> j) & 1) as u8 * 16,
        ((qh >> (j + 16)) & 1) as u8 * 16,
    )
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let (h0, h1) = q5_high(qh, j);
        y[j] = (((b[6 + j] & 0xF) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((b[6 + j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        let (h0, h1) = q5_high(qh, j);
        y[j] = ((b[8 + j] & 0xF) | h0) as f32 * d + m;
        y[j + 16] = ((b[8 + j] >> 4) | h1) as f32 * d + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        y[j] = (b[2 + j] as i8) as f32 * d;
    }
}

fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        y[j] = d * IQ4_KVALUES[(b[2 + j] & 0xF) as usize] as f32;
        y[j + 16] = d * IQ4_KVALUES[(b[2 + j] >> 4) as usize] as f32;
    }
}

/// Q2_K: 16 sub-blocks of 16; `scales[i]` low nibble scales by `d`, high nibble is the
/// min (by `dmin`). 2-bit codes: the 64 `qs` bytes are two halves of 32; within a half,
/// shift `2k` of byte `l` is element `32k + l` of that 128-element half.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    let mut is = 0;
    let mut out = 0;
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for k in 0..4 {
            let shift = 2 * k;
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0xF) as f32;
                let ml = dmin * (sc >> 4) as f32;
                for l in 0..16 {
                    y[out] = dl * ((q[16 * part + l] >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

/// Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (`− 32`). Scale `i`: low 4 bits
/// from `scales[i % 8]` (low nibble for i < 8, high for i ≥ 8), high 2 bits from
/// `scales[8 + i % 4] >> (2·(i / 4))`. Codes: 2 low bits laid out as in Q2_K, and a high
/// bit in `hmask` (bit `k` of byte `l` for element `32k + l`); a cleared high bit
/// subtracts 4.
fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = f16_at(b, 108);
    let mut scales = [0i32; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let low = if i < 8 { sc[i] & 0xF } else { sc[i - 8] >> 4 };
        let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (low | (high << 4)) as i32 - 32;
    }
    let mut is = 0;
    let mut out = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for k in 0..4 {
            let shift = 2 * k;
            for part in 0..2 {
                let dl = d * scales[is] as f32;
                is += 1;
                for l in 0..16 {
                    let idx = 16 * part + l;
                    let low = ((q[idx] >> shift) & 3) as i32;
                    let sub = if hmask[idx] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (low - sub) as f32;
                    out += 1;
                }
            }
            m <<= 1;
        }
    }
}

/// The 6-bit (scale, min) pair `j` (0..8) of the 12 packed bytes of Q4_K / Q5_K: pairs
/// 0–3 are the low 6 bits of bytes `j` and `j + 4`; pairs 4–7 take their low nibbles from
/// byte `j + 4` and their top 2 bits from the top bits of bytes `j − 4` and `j`.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K: 8 sub-blocks of 32; each 64-element chunk uses 32 `qs` bytes, low nibbles for
/// the first 32 elements, high nibbles for the next 32.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let sc = &b[4..16];
    let qs = &b[16..144];
    for chunk in 0..4 {
        let q = &qs[32 * chunk..32 * chunk + 32];
        let (s1, m1) = scale_min_k4(2 * chunk, sc);
        let (s2, m2) = scale_min_k4(2 * chunk + 1, sc);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let y = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// Q5_K: Q4_K plus a fifth bit per element in `qh`: chunk `c` uses bit `2c` of `qh[l]`
/// for its first 32 elements and bit `2c + 1` for the next 32.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let sc = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for chunk in 0..4 {
        let q = &qs[32 * chunk..32 * chunk + 32];
        let (s1, m1) = scale_min_k4(2 * chunk, sc);
        let (s2, m2) = scale_min_k4(2 * chunk + 1, sc);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * chunk), 1u8 << (2 * chunk + 1));
        let y = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0xF) + h1) as f32 - m1;
            y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// Q6_K: two halves of 128; per half 64 `ql` bytes, 32 `qh` bytes, 8 scales. Element
/// `l + 32k` (k = 0..4) takes its low nibble from `ql[l]` (k = 0, 2: low/high nibble) or
/// `ql[l + 32]` (k = 1, 3), its top 2 bits from `qh[l] >> 2k`, and scale `l/16 + 2k`.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql_all = &b[0..128];
    let qh_all = &b[128..192];
    let sc_all = &b[192..208];
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &ql_all[64 * half..64 * half + 64];
        let qh = &qh_all[32 * half..32 * half + 32];
        let sc = &sc_all[8 * half..8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| d * (sc[is + 2 * k] as i8) as f32;
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(1) * q2 as f32;
            y[l + 64] = s(2) * q3 as f32;
            y[l + 96] = s(3) * q4 as f32;
        }
    }
}

/// IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (`− 32`): low 4 bits from nibble
/// `ib % 2` of `scales_l[ib / 2]`, high 2 bits from `scales_h >> 2·ib`; each sub-block's
/// 16 `qs` bytes are laid out as IQ4_NL.
fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..8];
    let qs = &b[8..136];
    for ib in 0..8 {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
        let q = &qs[16 * ib..16 * ib + 16];
        let y = &mut y[32 * ib..32 * ib + 32];
        for j in 0..16 {
            y[j] = dl * IQ4_KVALUES[(q[j] & 0xF) as usize] as f32;
            y[j + 16] = dl * IQ4_KVALUES[(q[j] >> 4) as usize] as f32;
        }
    }
}

/// Reorders one Q4_0 block into a CMF `q4_tiled` tile (same f16 scale, same `q − 8`
/// codes): ggml keeps element `j` in the low nibble of byte `j` and element `j + 16` in
/// its high nibble; CMF keeps elements `2k`, `2k + 1` in the low/high nibbles of byte `k`.
pub fn q4_0_block_to_q4_tiled(block: &[u8; 18]) -> [u8; 18] {
    let mut codes = [0u8; 32];
    for j in 0..16 {
        codes[j] = block[2 + j] & 0xF;
        codes[j + 16] = block[2 + j] >> 4;
    }
    let mut tile = [0u8; 18];
    tile[0] = block[0];
    tile[1] = block[1];
    for k in 0..16 {
        tile[2 + k] = codes[2 * k] | (codes[2 * k + 1] << 4);
    }
    tile
}

/// A whole Q4_0 payload as `q4_tiled` bytes (same length: 18 bytes per 32 elements).
pub fn q4_0_to_q4_tiled(data: &[u8]) -> Option<Vec<u8>> {
    if !data.len().is_multiple_of(18) {
        return None;
    }
    let mut out = Vec::with_capacity(data.len());
    for b in data.chunks_exact(18) {
        let mut blk = [0u8; 18];
        blk.copy_from_slice(b);
        out.extend_from_slice(&q4_0_block_to_q4_tiled(&blk));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::gguf::Gguf;

    const TYPES: [&str; 14] = [
        "BF16", "F16", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K_M", "Q4_0", "Q4_1", "Q4_K_M", "Q5_0",
        "Q5_1", "Q5_K_M", "Q6_K", "Q8_0",
    ];

    fn fixture(name: &str) -> Vec<u8> {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/gguf/");
        let path = format!("{p}{name}");
        std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {path} is missing: {e}"))
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs()) + 1e-30
    }

    /// Every tensor of every fixture dequantizes to the `gguf` package's values: first 16
    /// to 1e-6 relative; sum, sum of squares and max |x| to 1e-5 relative.
    #[test]
    fn every_fixture_tensor_matches_the_reference_dequantization() {
        let mut seen = std::collections::BTreeSet::new();
        let mut checked = 0;
        for ty in TYPES {
            let bytes = fixture(&format!("tiny-{ty}.gguf"));
            let json: serde_json::Value =
                serde_json::from_slice(&fixture(&format!("tiny-{ty}.dequant.json"))).unwrap();
            let refs = json.as_object().unwrap();
            let g = Gguf::parse(&bytes).unwrap();
            assert_eq!(g.tensors.len(), refs.len(), "{ty}: tensor count");
            for t in &g.tensors {
                let r = &refs[&t.name];
                assert_eq!(
                    r["type"].as_str().unwrap(),
                    t.ggml_type.name(),
                    "{ty} {}",
                    t.name
                );
                let shape: Vec<u64> = r["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                assert_eq!(shape, t.dims, "{ty} {}", t.name);
                seen.insert(t.ggml_type.name());
                let v =
                    dequantize(t.ggml_type, g.tensor_data(&bytes, t).unwrap(), t.numel()).unwrap();
                for (i, want) in r["first16"].as_array().unwrap().iter().enumerate() {
                    let want = want.as_f64().unwrap();
                    assert!(
                        close(v[i] as f64, want, 1e-6),
                        "{ty} {} [{i}]: {} vs {want}",
                        t.name,
                        v[i]
                    );
                }
                let sum: f64 = v.iter().map(|&x| x as f64).sum();
                let sumsq: f64 = v.iter().map(|&x| (x as f64) * (x as f64)).sum();
                let maxabs = v.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
                let rs = r["sum"].as_f64().unwrap();
                assert!(close(sum, rs, 1e-5), "{ty} {} sum {sum} vs {rs}", t.name);
                let rq = r["sumsq"].as_f64().unwrap();
                assert!(
                    close(sumsq, rq, 1e-5),
                    "{ty} {} sumsq {sumsq} vs {rq}",
                    t.name
                );
                let rm = r["maxabs"].as_f64().unwrap();
                assert!(close(maxabs, rm, 1e-6), "{ty} {} maxabs", t.name);
                checked += 1;
            }
        }
        assert!(checked >= 14 * 21, "{checked} tensors checked");
        for name in [
            "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
            "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
        ] {
            assert!(seen.contains(name), "no fixture tensor of type {name}");
        }
    }

    /// Q4_0 → q4_tiled is exact: CMF's decoder reproduces ggml's values bit for bit.
    #[test]
    fn q4_0_to_q4_tiled_is_bit_exact() {
        use crate::format::DType;
        let bytes = fixture("tiny-Q4_0.gguf");
        let g = Gguf::parse(&bytes).unwrap();
        let mut n = 0;
        for t in g.tensors.iter().filter(|t| t.ggml_type == GgmlType::Q4_0) {
            let data = g.tensor_data(&bytes, t).unwrap();
            let want = dequantize(GgmlType::Q4_0, data, t.numel()).unwrap();
            let tiled = q4_0_to_q4_tiled(data).unwrap();
            let got = crate::quant::decode(DType::Q4Tiled, &t.shape_row_major(), &tiled).unwrap();
            assert_eq!(want.len(), got.len());
            for (a, b) in want.iter().zip(&got) {
                assert_eq!(a.to_bits(), b.to_bits(), "{}", t.name);
            }
            n += 1;
        }
        assert!(n > 0);
    }

    #[test]
    fn wrong_sizes_are_errors() {
        assert!(dequantize(GgmlType::Q4K, &[0; 143], 256).is_err());
        assert!(dequantize(GgmlType::Q4_0, &[0; 18], 31).is_err());
        assert!(dequantize(GgmlType::F32, &[0; 8], 2).is_ok());
    }
}
