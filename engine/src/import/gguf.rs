//! GGUF (versions 2 and 3) reader: header, metadata key/values, tensor infos and the data
//! section, validated the way llama.cpp's loader validates before it trusts a file.
//!
//! Layout (all little-endian):
//!
//! ```text
//! u32 magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//! kv_count × { string key | u32 value_type | value }
//! tensor_count × { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset }
//! padding to `general.alignment` (default 32)
//! data section: each tensor at `data_start + offset`, offset a multiple of the alignment
//! ```
//!
//! A string is `u64 len` + UTF-8 bytes; an array is `u32 elem_type | u64 count | elements`.
//! Every count read from the file is checked against the bytes that remain *before*
//! anything is allocated, so a hostile file cannot make the parser reserve memory it does
//! not back with bytes; all offset arithmetic is checked; nothing panics on file content.
//! Dims are in ggml order: `dims[0]` is the innermost (row) dimension.

use std::collections::HashMap;
use std::path::Path;

use super::ggml::GgmlType;

/// `"GGUF"` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: u32 = 4;
/// Most entries reserved up front for any count read from the file: a count is bounded
/// by the bytes left, but in a multi-gigabyte file that bound alone would still let a
/// hostile count reserve many times the file size before the entries fail to parse.
pub const PREALLOC_LIMIT: u64 = 4096;
/// Nesting limit for arrays of arrays: deeper nesting only serves to exhaust the stack.
pub const MAX_ARRAY_DEPTH: u32 = 8;

/// Why a GGUF file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {0:#010x}, expected 0x46554747 (\"GGUF\")")]
    BadMagic(u32),
    /// Version 1 (32-bit counts) and unknown future versions.
    #[error("unsupported GGUF version {0} (2 and 3 are supported)")]
    UnsupportedVersion(u32),
    /// A read ran past the end of the file (`what` names the field).
    #[error("truncated file: {what} at offset {offset} needs {needed} bytes, {available} remain")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    /// A metadata value type or array element type that GGUF does not define.
    #[error("unknown metadata value type {ty} for key {key:?}")]
    UnknownValueType { key: String, ty: u32 },
    /// A tensor type id this reader does not know.
    #[error("tensor {tensor:?}: unknown ggml type {ty}")]
    UnknownTensorType { tensor: String, ty: u32 },
    /// A string that is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    BadUtf8 { what: String },
    /// Structural rule broken: duplicate key or tensor name, bad dims, bad alignment,
    /// overlapping or misaligned tensor data, arithmetic overflow, absurd counts.
    #[error("invalid GGUF: {0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, GgufError>;

fn invalid(msg: impl Into<String>) -> GgufError {
    GgufError::Invalid(msg.into())
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type id and elements (all of that type).
    Array(u32, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// Any integer value as u64 (negative → None).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer or float value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            // The shortest decimal of the f32 (1e-6, not 9.99999997e-7): metadata floats
            // are written from decimal configs.
            Value::F32(v) => format!("{v}").parse().ok(),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v as f64),
            Value::I16(v) => Some(v as f64),
            Value::I32(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }

    /// A JSON rendering (for provenance and display).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::U8(v) => json!(v),
            Value::I8(v) => json!(v),
            Value::U16(v) => json!(v),
            Value::I16(v) => json!(v),
            Value::U32(v) => json!(v),
            Value::I32(v) => json!(v),
            Value::F32(v) => json!(v),
            Value::Bool(v) => json!(v),
            Value::Str(v) => json!(v),
            Value::Array(_, v) => serde_json::Value::Array(v.iter().map(Value::to_json).collect()),
            Value::U64(v) => json!(v),
            Value::I64(v) => json!(v),
            Value::F64(v) => json!(v),
        }
    }
}

/// Metadata value type ids of the GGUF format.
pub mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;

    /// The fewest bytes one value of type `ty` occupies (to bound array counts), `None`
    /// for an unknown type.
    pub fn min_size(ty: u32) -> Option<u64> {
        Some(match ty {
            U8 | I8 | BOOL => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | STRING => 8,
            ARRAY => 12,
            _ => return None,
        })
    }
}

/// One tensor's description. `offset` is absolute in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (innermost).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Byte length of the data (from type block size and dims).
    pub nbytes: u64,
}

impl TensorInfo {
    /// Element count.
    pub fn numel(&self) -> u64 {
        // Checked at parse time.
        self.dims.iter().product()
    }

    /// The shape in row-major (Hugging Face / CMF) order: dims reversed.
    pub fn shape_row_major(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed GGUF file (metadata and tensor infos; data is read through [`Gguf::tensor_data`]
/// from the same bytes).
#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    /// Key/values in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    index: HashMap<String, usize>,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.b.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let avail = self.remaining();
        if n > avail {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                available: avail,
            });
        }
        // n ≤ remaining ≤ usize::MAX
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        // `take` refuses a length beyond the end of the file before anything is allocated.
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 {
            what: what.to_string(),
        })
    }

    fn value(&mut self, key: &str, ty: u32, depth: u32) -> Result<Value> {
        use value_type as t;
        Ok(match ty {
            t::U8 => Value::U8(self.arr::<1>(key)?[0]),
            t::I8 => Value::I8(self.arr::<1>(key)?[0] as i8),
            t::U16 => Value::U16(u16::from_le_bytes(self.arr(key)?)),
            t::I16 => Value::I16(i16::from_le_bytes(self.arr(key)?)),
            t::U32 => Value::U32(u32::from_le_bytes(self.arr(key)?)),
            t::I32 => Value::I32(i32::from_le_bytes(self.arr(key)?)),
            t::F32 => Value::F32(f32::from_le_bytes(self.arr(key)?)),
            t::BOOL => match self.arr::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(invalid(format!("key {key:?}: bool byte {b} is not 0 or 1"))),
            },
            t::STRING => Value::Str(self.string(key)?),
            t::U64 => Value::U64(self.u64(key)?),
            t::I64 => Value::I64(i64::from_le_bytes(self.arr(key)?)),
            t::F64 => Value::F64(f64::from_le_bytes(self.arr(key)?)),
            t::ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(invalid(format!(
                        "key {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    )));
                }
                let et = self.u32(key)?;
                let min = value_type::min_size(et).ok_or_else(|| GgufError::UnknownValueType {
                    key: key.to_string(),
                    ty: et,
                })?;
                let count = self.u64(key)?;
                // Every element takes at least `min` bytes: a count the rest of the file
                // cannot hold is rejected before the vector is reserved.
                if count.checked_mul(min).is_none_or(|n| n > self.remaining()) {
                    return Err(invalid(format!(
                        "key {key:?}: array of {count} elements cannot fit in the {} bytes left",
                        self.remaining()
                    )));
                }
                let mut v = Vec::with_capacity(count.min(PREALLOC_LIMIT) as usize);
                for _ in 0..count {
                    v.push(self.value(key, et, depth + 1)?);
                }
                Value::Array(et, v)
            }
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_string(),
                    ty,
                })
            }
        })
    }
}

impl Gguf {
    /// Parses and validates the whole file image `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Gguf> {
        let mut c = Cursor { b: bytes, pos: 0 };
        let magic = c.u32("magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        // A kv takes at least 8 (key len) + 4 (type) + 1 bytes; a tensor info at least
        // 8 + 4 + 4 + 8 bytes.
        if n_kv.checked_mul(13).is_none_or(|n| n > c.remaining()) {
            return Err(invalid(format!(
                "{n_kv} metadata entries cannot fit in the file"
            )));
        }
        let mut metadata = Vec::with_capacity(n_kv.min(PREALLOC_LIMIT) as usize);
        let mut keys = std::collections::HashSet::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.u32("metadata value type")?;
            let v = c.value(&key, ty, 0)?;
            if !keys.insert(key.clone()) {
                return Err(invalid(format!("duplicate metadata key {key:?}")));
            }
            metadata.push((key, v));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) => *a as u64,
            Some((_, v)) => {
                return Err(invalid(format!(
                    "general.alignment must be a u32, got {v:?}"
                )))
            }
        };
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(invalid(format!(
                "general.alignment {alignment} is not a power of two"
            )));
        }
        if n_tensors.checked_mul(24).is_none_or(|n| n > c.remaining()) {
            return Err(invalid(format!(
                "{n_tensors} tensor infos cannot fit in the file"
            )));
        }
        let mut raw = Vec::with_capacity(n_tensors.min(PREALLOC_LIMIT) as usize);
        let mut index = HashMap::new();
        for i in 0..n_tensors {
            let name = c.string("tensor name")?;
            let n_dims = c.u32("tensor n_dims")?;
            if n_dims > MAX_DIMS {
                return Err(invalid(format!(
                    "tensor {name:?}: {n_dims} dims, at most {MAX_DIMS} allowed"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dim")?);
            }
            let ty = c.u32("tensor type")?;
            let ggml_type = GgmlType::from_id(ty).ok_or_else(|| GgufError::UnknownTensorType {
                tensor: name.clone(),
                ty,
            })?;
            let rel = c.u64("tensor offset")?;
            if index.insert(name.clone(), i as usize).is_some() {
                return Err(invalid(format!("duplicate tensor name {name:?}")));
            }
            raw.push((name, dims, ggml_type, rel));
        }
        let data_start = (c.pos as u64)
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| invalid("data section start overflows"))?;
        if data_start > bytes.len() as u64 && n_tensors > 0 {
            return Err(invalid("the data section starts past the end of the file"));
        }
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ggml_type, rel) in raw {
            let numel = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| invalid(format!("tensor {name:?}: element count overflows")))?;
            // i64 is what ggml stores element counts in.
            if numel > i64::MAX as u64 {
                return Err(invalid(format!("tensor {name:?}: element count too large")));
            }
            let (block, block_bytes) = ggml_type.block();
            let row = dims.first().copied().unwrap_or(1);
            if row % block != 0 {
                return Err(invalid(format!(
                    "tensor {name:?}: row length {row} is not a multiple of the {} block size {block}",
                    ggml_type.name()
                )));
            }
            let nbytes = (numel / block)
                .checked_mul(block_bytes)
                .ok_or_else(|| invalid(format!("tensor {name:?}: byte size overflows")))?;
            if rel % alignment != 0 {
                return Err(invalid(format!(
                    "tensor {name:?}: offset {rel} is not a multiple of the alignment {alignment}"
                )));
            }
            let offset = data_start
                .checked_add(rel)
                .ok_or_else(|| invalid(format!("tensor {name:?}: offset overflows")))?;
            let end = offset
                .checked_add(nbytes)
                .ok_or_else(|| invalid(format!("tensor {name:?}: end overflows")))?;
            if end > bytes.len() as u64 {
                return Err(invalid(format!(
                    "tensor {name:?}: data [{offset}, {end}) extends past the end of the file ({} bytes)",
                    bytes.len()
                )));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                nbytes,
            });
        }
        // Overlapping tensors are what llama.cpp refuses too (each offset must equal the
        // running, aligned sum in its loader); we accept any order but no overlap.
        let mut ranges: Vec<(u64, u64, &str)> = tensors
            .iter()
            .map(|t| (t.offset, t.offset + t.nbytes, t.name.as_str()))
            .collect();
        ranges.sort();
        for w in ranges.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(invalid(format!(
                    "tensors {:?} and {:?} overlap",
                    w[0].2, w[1].2
                )));
            }
        }
        Ok(Gguf {
            version,
            metadata,
            tensors,
            alignment,
            data_start,
            index,
        })
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The data bytes of `t` within `bytes` (the same image [`Gguf::parse`] read).
    pub fn tensor_data<'b>(&self, bytes: &'b [u8], t: &TensorInfo) -> Result<&'b [u8]> {
        let start =
            usize::try_from(t.offset).map_err(|_| invalid("offset beyond address space"))?;
        let len = usize::try_from(t.nbytes).map_err(|_| invalid("size beyond address space"))?;
        start
            .checked_add(len)
            .and_then(|end| bytes.get(start..end))
            .ok_or_else(|| invalid(format!("tensor {:?}: data outside the given bytes", t.name)))
    }
}

/// A GGUF file mapped into memory with its parsed description.
pub struct GgufFile {
    map: memmap2::Mmap,
    pub gguf: Gguf,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io = |what: &str| {
            let context = format!("{what} {}", path.display());
            move |source| GgufError::Io { context, source }
        };
        let file = std::fs::File::open(path).map_err(io("open"))?;
        // SAFETY: the map is read-only; a concurrent writer of the file could change bytes
        // under us, which at worst yields wrong values or a checked parse error (every
        // access is bounds-checked against the length fixed at map time).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io("map"))?;
        let gguf = Gguf::parse(&map)?;
        Ok(GgufFile { map, gguf })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8]> {
        self.gguf.tensor_data(&self.map, t)
    }

    /// [`GgufFile::release`] for the bytes `bytes` of `t`'s data only (a block of rows
    /// once it was read).
    pub fn release_part(&self, t: &TensorInfo, bytes: std::ops::Range<usize>) {
        let start = t.offset.checked_add(bytes.start as u64);
        let end = t
            .offset
            .checked_add(bytes.end.min(t.nbytes as usize) as u64);
        if let (Some(start), Some(end)) = (start, end) {
            super::release_pages(&self.map, start, end);
        }
    }

    /// Lets the kernel drop the mapped pages of `t` once its data was copied out, so an
    /// import's resident memory does not grow with the model (the pages are clean and
    /// file-backed; a later read faults them back in).
    pub fn release(&self, t: &TensorInfo) {
        self.release_part(t, 0..usize::try_from(t.nbytes).unwrap_or(usize::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn fixture(name: &str) -> Vec<u8> {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/gguf/");
        let path = format!("{p}{name}");
        std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {path} is missing: {e}"))
    }

    #[test]
    fn parses_the_fixture() {
        let b = fixture("tiny-Q4_K_M.gguf");
        let g = Gguf::parse(&b).unwrap();
        assert_eq!(g.architecture(), Some("llama"));
        assert_eq!(g.tensors.len(), 21);
        let t = g.tensor("token_embd.weight").unwrap();
        assert_eq!(t.dims, vec![256, 512]);
        assert_eq!(t.shape_row_major(), vec![512, 256]);
        assert_eq!(t.ggml_type, GgmlType::Q4K);
        assert!(g.get_u64("llama.block_count").is_some());
    }

    fn header(version: u32, nt: u64, nkv: u64) -> Vec<u8> {
        let mut v = b"GGUF".to_vec();
        v.extend(version.to_le_bytes());
        v.extend(nt.to_le_bytes());
        v.extend(nkv.to_le_bytes());
        v
    }

    fn kv(v: &mut Vec<u8>, key: &str, ty: u32, payload: &[u8]) {
        v.extend((key.len() as u64).to_le_bytes());
        v.extend(key.as_bytes());
        v.extend(ty.to_le_bytes());
        v.extend(payload);
    }

    #[test]
    fn rejects_hostile_headers() {
        assert!(matches!(
            Gguf::parse(b"GGUX\x03\0\0\0"),
            Err(GgufError::BadMagic(_))
        ));
        assert!(matches!(
            Gguf::parse(&header(1, 0, 0)),
            Err(GgufError::UnsupportedVersion(1))
        ));
        assert!(matches!(
            Gguf::parse(&header(3, 0, u64::MAX)),
            Err(GgufError::Invalid(_))
        ));
        assert!(matches!(
            Gguf::parse(&header(3, u64::MAX, 0)),
            Err(GgufError::Invalid(_))
        ));
        // A string longer than the file.
        let mut v = header(3, 0, 1);
        v.extend(u64::MAX.to_le_bytes());
        v.extend([0u8; 16]);
        assert!(matches!(Gguf::parse(&v), Err(GgufError::Truncated { .. })));
        // An array claiming more elements than bytes remain.
        let mut v = header(3, 0, 1);
        let mut p = value_type::U32.to_le_bytes().to_vec();
        p.extend((1u64 << 40).to_le_bytes());
        kv(&mut v, "a", value_type::ARRAY, &p);
        assert!(matches!(Gguf::parse(&v), Err(GgufError::Invalid(_))));
        // Unknown value type.
        let mut v = header(3, 0, 1);
        kv(&mut v, "a", 99, &[]);
        assert!(matches!(
            Gguf::parse(&v),
            Err(GgufError::UnknownValueType { .. })
        ));
        // Alignment not a power of two.
        let mut v = header(3, 0, 1);
        kv(
            &mut v,
            "general.alignment",
            value_type::U32,
            &24u32.to_le_bytes(),
        );
        assert!(matches!(Gguf::parse(&v), Err(GgufError::Invalid(_))));
        // Nested arrays beyond the depth limit.
        let mut v = header(3, 0, 1);
        let mut p = Vec::new();
        for _ in 0..MAX_ARRAY_DEPTH + 1 {
            p.extend(value_type::ARRAY.to_le_bytes());
            p.extend(1u64.to_le_bytes());
        }
        p.extend(value_type::U8.to_le_bytes());
        p.extend(1u64.to_le_bytes());
        p.push(7);
        kv(&mut v, "deep", value_type::ARRAY, &p);
        assert!(matches!(Gguf::parse(&v), Err(GgufError::Invalid(_))));
    }

    #[test]
    fn every_value_type_and_a_tensor_round_trip() {
        let mut v = header(3, 1, 5);
        kv(&mut v, "u8", value_type::U8, &[7]);
        kv(&mut v, "f64", value_type::F64, &1.5f64.to_le_bytes());
        kv(&mut v, "b", value_type::BOOL, &[1]);
        let mut p = value_type::ARRAY.to_le_bytes().to_vec();
        p.extend(1u64.to_le_bytes());
        p.extend(value_type::STRING.to_le_bytes());
        p.extend(2u64.to_le_bytes());
        for s in ["x", "yz"] {
            p.extend((s.len() as u64).to_le_bytes());
            p.extend(s.as_bytes());
        }
        kv(&mut v, "nested", value_type::ARRAY, &p);
        kv(&mut v, "i64", value_type::I64, &(-3i64).to_le_bytes());
        // tensor: "t", 1 dim of 4, F32, offset 0
        v.extend(1u64.to_le_bytes());
        v.extend(b"t");
        v.extend(1u32.to_le_bytes());
        v.extend(4u64.to_le_bytes());
        v.extend(0u32.to_le_bytes());
        v.extend(0u64.to_le_bytes());
        while !v.len().is_multiple_of(32) {
            v.push(0);
        }
        let start = v.len() as u64;
        for x in [1.0f32, 2.0, 3.0, 4.0] {
            v.extend(x.to_le_bytes());
        }
        let g = Gguf::parse(&v).unwrap();
        assert_eq!(g.get("u8"), Some(&Value::U8(7)));
        assert_eq!(g.get_f64("f64"), Some(1.5));
        assert_eq!(g.get("b"), Some(&Value::Bool(true)));
        assert_eq!(g.get("i64").and_then(Value::as_u64), None);
        let nested = g.get("nested").unwrap().as_array().unwrap();
        assert_eq!(nested[0].as_array().unwrap()[1].as_str(), Some("yz"));
        let t = g.tensor("t").unwrap();
        assert_eq!((t.offset, t.nbytes), (start, 16));
        assert_eq!(g.tensor_data(&v, t).unwrap().len(), 16);
        // Cut one byte of the data: the tensor no longer fits.
        assert!(Gguf::parse(&v[..v.len() - 1]).is_err());
    }

    /// Truncations, single-byte flips and random bytes: errors, never a panic.
    #[test]
    fn damaged_files_never_panic() {
        let b = fixture("tiny-Q4_0.gguf");
        // The metadata + tensor infos region is where parsing decisions happen.
        let g = Gguf::parse(&b).unwrap();
        let head = g.data_start as usize;
        for cut in (0..head).step_by(7).chain([head, b.len() - 1]) {
            let _ = Gguf::parse(&b[..cut]);
        }
        let mut rng = crate::synth::Rng::new(42);
        let mut m = b.clone();
        for i in 0..3000 {
            let pos = (rng.next_u64() % head as u64) as usize;
            let old = m[pos];
            m[pos] = if i % 2 == 0 {
                old ^ (1 << (i % 8))
            } else {
                rng.next_u64() as u8
            };
            if let Ok(g) = Gguf::parse(&m) {
                for t in &g.tensors {
                    let data = g.tensor_data(&m, t).unwrap();
                    let _ = crate::import::ggml::dequantize(t.ggml_type, data, t.numel());
                }
            }
            m[pos] = old;
        }
        for len in [0usize, 3, 4, 24, 100, 5000] {
            let mut r: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let _ = Gguf::parse(&r);
            if len >= 24 {
                r[..4].copy_from_slice(b"GGUF");
                r[4..8].copy_from_slice(&3u32.to_le_bytes());
                let _ = Gguf::parse(&r);
            }
        }
    }
}
