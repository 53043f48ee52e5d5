//! Tensor dtypes of the directory (spec §3.1) and the byte size each layout takes (§3.2).
//!
//! The size rules live here, next to the ids, because the reader must reject a directory
//! record whose `nbytes` disagrees with its dtype and shape before anything else trusts it.
//! The arithmetic of each codec (encode, decode, dot products) lives in `crate::quant`.

use std::fmt;

/// Elements per quantization group in every grouped codec.
pub const GROUP: u64 = 32;

/// A directory dtype id. Ids are never reused; reserved ids parse but refuse to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
    /// `[int8 rows·cols][f16 scale rows]`.
    Q8Row = 3,
    /// Flattened groups of 32: `[u8 nibbles G·16][f16 scales G]`.
    Q4Block = 4,
    /// Reserved by the spec.
    Mix8_4 = 5,
    /// Reserved by the spec (the §12 pipeline container uses it for `config_json` bytes).
    U8 = 6,
    /// Reserved by the spec.
    Q4Col = 7,
    /// `[u8 bits rows][f16 scales rows·cols/32][MSB-first packed rows]`.
    Vbit = 8,
    /// `[int8 rows·cols][f16 row scale rows][f16 col field cols]`.
    Q8_2f = 9,
    /// `vbit` plus `u32 offsets[rows+1]` before the packed rows.
    VbitRo = 10,
    /// Tiles of `[f16 scale][16 nibble bytes]`, one per group of 32.
    Q4Tiled = 11,
    /// Tiles of `[f16 scale][4 sign bytes]`, one per group of 32.
    Q1 = 12,
    /// `q1` tiles, then `u32 count`, then `count × {u32 flat index, f16 value}`.
    Q1s = 13,
    /// Tiles of `[f16 scale][7 base-3 bytes]`, then `u32 row_ptr[rows+1]`, then
    /// `{u16 col, f16 value}` entries.
    Q1t = 14,
    /// q4_tiled nibbles with a per-row 5-bit scale ladder.
    Q4tp = 15,
}

pub const ALL_DTYPES: [DType; 16] = [
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::Q8Row,
    DType::Q4Block,
    DType::Mix8_4,
    DType::U8,
    DType::Q4Col,
    DType::Vbit,
    DType::Q8_2f,
    DType::VbitRo,
    DType::Q4Tiled,
    DType::Q1,
    DType::Q1s,
    DType::Q1t,
    DType::Q4tp,
];

/// Every dtype a writer may emit: all but the reserved ids.
pub const WRITABLE: [DType; 13] = [
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::Q8Row,
    DType::Q4Block,
    DType::Vbit,
    DType::Q8_2f,
    DType::VbitRo,
    DType::Q4Tiled,
    DType::Q1,
    DType::Q1s,
    DType::Q1t,
    DType::Q4tp,
];

/// How many bytes a tensor of a given dtype and shape occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// Fully determined by dtype and shape.
    Exact(u64),
    /// Variable-length payload (overlays, per-row bit widths): at least this many bytes;
    /// the exact length is known only by parsing the payload (see `crate::quant::layout`).
    AtLeast(u64),
    /// The dtype is reserved: the spec gives no layout, any length is accepted as opaque.
    Opaque,
}

impl DType {
    pub fn from_id(id: u8) -> Option<DType> {
        ALL_DTYPES.get(id as usize).copied()
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    /// The spec's name (`q8_row`, `vbit_ro`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::Q8Row => "q8_row",
            DType::Q4Block => "q4_block",
            DType::Mix8_4 => "mix8_4",
            DType::U8 => "u8",
            DType::Q4Col => "q4_col",
            DType::Vbit => "vbit",
            DType::Q8_2f => "q8_2f",
            DType::VbitRo => "vbit_ro",
            DType::Q4Tiled => "q4_tiled",
            DType::Q1 => "q1",
            DType::Q1s => "q1s",
            DType::Q1t => "q1t",
            DType::Q4tp => "q4tp",
        }
    }

    /// Parses a spec name or a converter alias (`q8`, `q4`, `q4t`).
    pub fn from_name(name: &str) -> Option<DType> {
        let n = name.to_ascii_lowercase();
        let alias = match n.as_str() {
            "q8" => Some(DType::Q8Row),
            "q4" => Some(DType::Q4Block),
            "q4t" => Some(DType::Q4Tiled),
            _ => None,
        };
        alias.or_else(|| ALL_DTYPES.iter().copied().find(|d| d.name() == n))
    }

    /// Reserved ids (5, 6, 7): listed, never decoded or written.
    pub fn is_reserved(self) -> bool {
        matches!(self, DType::Mix8_4 | DType::U8 | DType::Q4Col)
    }

    /// Dtypes that raise `required_features` bit 2 (`QUANT_2F`) when a writer emits them.
    pub fn needs_quant_2f(self) -> bool {
        matches!(self, DType::Vbit | DType::Q8_2f)
    }

    /// Whether the layout is defined only for 2-D `[rows, cols]` tensors.
    pub fn requires_2d(self) -> bool {
        matches!(
            self,
            DType::Q8Row | DType::Q8_2f | DType::Vbit | DType::VbitRo | DType::Q1t | DType::Q4tp
        )
    }

    /// Whether 2-D tensors of this dtype need `cols % 32 == 0`.
    pub fn requires_cols_multiple_of_group(self) -> bool {
        matches!(self, DType::Vbit | DType::VbitRo | DType::Q1t | DType::Q4tp)
    }

    /// The header's informational `quant_type` for a file quantized with this dtype.
    /// The reference reader parses `quant_type` as a closed set (`Q8_ROW`, `Q4_BLOCK`,
    /// `Q8_2F`, `VBIT`, `BF16`, `F16`, `F32`) and refuses other values, so newer dtypes take
    /// the label the reference converter gives them (q4 family → `Q4_BLOCK`, 1-bit family
    /// and vbit → `VBIT`). The directory's per-tensor dtype stays the truth.
    pub fn quant_type_label(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::Bf16 => "BF16",
            DType::Q8Row => "Q8_ROW",
            DType::Q8_2f => "Q8_2F",
            DType::Q4Block | DType::Q4Tiled | DType::Q4tp => "Q4_BLOCK",
            _ => "VBIT",
        }
    }

    /// Nominal bits per weight for display (variable codecs report their measured value
    /// from the payload instead).
    pub fn nominal_bits(self) -> Option<f64> {
        Some(match self {
            DType::F32 => 32.0,
            DType::F16 | DType::Bf16 => 16.0,
            DType::Q8Row | DType::Q8_2f => 8.0,
            DType::Q4Block | DType::Q4Tiled => 4.5,
            DType::Q4tp => 4.17,
            DType::Q1 => 1.5,
            DType::Q1t => 2.25,
            _ => return None,
        })
    }

    /// The byte size of a tensor of this dtype and `shape`, or why the shape is impossible.
    /// All arithmetic is checked: a hostile shape yields an error, never an overflow.
    pub fn size_for(self, shape: &[u64]) -> Result<Size, String> {
        let n = numel(shape).ok_or_else(|| "shape product overflows u64".to_string())?;
        let (rows, cols) = if self.requires_2d() {
            if shape.len() != 2 {
                return Err(format!(
                    "{} is defined for 2-D tensors only, shape has {} dims",
                    self.name(),
                    shape.len()
                ));
            }
            (shape[0], shape[1])
        } else {
            (0, 0)
        };
        if self.requires_cols_multiple_of_group() && cols % GROUP != 0 {
            return Err(format!(
                "{} needs cols % 32 == 0, cols = {cols}",
                self.name()
            ));
        }
        let groups = n.div_ceil(GROUP);
        let ovf = || "tensor byte size overflows u64".to_string();
        let m = |a: u64, b: u64| a.checked_mul(b).ok_or_else(ovf);
        let a = |x: u64, y: u64| x.checked_add(y).ok_or_else(ovf);
        Ok(match self {
            DType::F32 => Size::Exact(m(n, 4)?),
            DType::F16 | DType::Bf16 => Size::Exact(m(n, 2)?),
            DType::Q8Row => Size::Exact(a(n, m(rows, 2)?)?),
            DType::Q8_2f => Size::Exact(a(a(n, m(rows, 2)?)?, m(cols, 2)?)?),
            DType::Q4Block | DType::Q4Tiled => Size::Exact(m(groups, 18)?),
            DType::Q1 => Size::Exact(m(groups, 6)?),
            DType::Q1s => Size::AtLeast(a(m(groups, 6)?, 4)?),
            DType::Q1t => Size::AtLeast(a(m(groups, 9)?, m(a(rows, 1)?, 4)?)?),
            DType::Q4tp => {
                let gpr = cols / GROUP;
                let code_bytes = m(gpr, 5)?.div_ceil(8);
                Size::Exact(a(a(m(groups, 16)?, m(rows, 4)?)?, m(rows, code_bytes)?)?)
            }
            DType::Vbit | DType::VbitRo => {
                // bits + scales + the narrowest packing (3 bits per weight).
                let head = a(rows, m(groups, 2)?)?;
                let head = if self == DType::VbitRo {
                    a(head, m(a(rows, 1)?, 4)?)?
                } else {
                    head
                };
                Size::AtLeast(a(head, m(rows, m(cols, 3)?.div_ceil(8))?)?)
            }
            DType::Mix8_4 | DType::U8 | DType::Q4Col => Size::Opaque,
        })
    }
}

impl serde::Serialize for DType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Product of a shape's dimensions, `None` on overflow. The empty shape is a scalar (1).
pub fn numel(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// SPEC §3.2: 1-D tensors and tensors of fewer than 32 elements are always stored as
/// floats, never with a quantized layout.
pub fn always_float(shape: &[u64]) -> bool {
    shape.len() <= 1 || numel(shape).is_none_or(|n| n < 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for d in ALL_DTYPES {
            assert_eq!(DType::from_id(d.id()), Some(d));
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_id(16), None);
        assert_eq!(DType::from_id(255), None);
    }

    #[test]
    fn sizes_match_reference_files() {
        // lm_head [512, 64] in the fixtures of ../shared/fixtures/cmf
        let s = [512u64, 64];
        assert_eq!(DType::Q8Row.size_for(&s).unwrap(), Size::Exact(33792));
        assert_eq!(DType::Q4Block.size_for(&s).unwrap(), Size::Exact(18432));
        assert_eq!(DType::Q8_2f.size_for(&s).unwrap(), Size::Exact(33920));
        assert_eq!(DType::Q4tp.size_for(&s).unwrap(), Size::Exact(19456));
        assert_eq!(DType::Q1t.size_for(&s).unwrap(), Size::AtLeast(11268));
    }

    #[test]
    fn hostile_shapes_are_errors() {
        assert!(DType::F32.size_for(&[u64::MAX, 2]).is_err());
        assert!(DType::Q8Row.size_for(&[4]).is_err());
        assert!(DType::Vbit.size_for(&[4, 33]).is_err());
        assert!(DType::F32.size_for(&[u32::MAX as u64; 6]).is_err());
    }
}
