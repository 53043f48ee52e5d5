//! The binary tensor directory (spec §3): count, pool offset, 56-byte records, name pool.

use super::dtype::{DType, Size};
use super::envelope::TENSOR_ALIGN;
use super::error::{bounds, parse, Result};

pub const RECORD_LEN: u64 = 56;
pub const MAX_NDIM: usize = 6;

/// One directory record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Offset relative to the start of the data section.
    pub off: u64,
    pub nbytes: u64,
    /// hash64 of the tensor bytes (§8).
    pub hash: u64,
}

impl TensorEntry {
    pub fn numel(&self) -> u64 {
        // Validated at parse time not to overflow.
        self.shape.iter().product()
    }

    /// Rows of a 2-D (or higher) tensor: the first dimension; 1 for a 1-D tensor.
    pub fn rows(&self) -> u64 {
        if self.shape.len() >= 2 {
            self.shape[0]
        } else {
            1
        }
    }

    /// Actual storage bits per weight.
    pub fn bits_per_weight(&self) -> f64 {
        let n = self.numel();
        if n == 0 {
            0.0
        } else {
            self.nbytes as f64 * 8.0 / n as f64
        }
    }

    /// Layer index from a canonical name (`model.layers.{i}.` or any `.layers.{i}.`).
    pub fn layer(&self) -> Option<u64> {
        layer_of(&self.name)
    }
}

/// Layer index of a tensor name: the number after the last `layers.` component.
pub fn layer_of(name: &str) -> Option<u64> {
    let idx = name.rfind("layers.")?;
    let rest = &name[idx + 7..];
    let digits: &str = rest.split('.').next()?;
    digits.parse().ok()
}

/// The parsed directory, in file order, with a name lookup.
#[derive(Clone, Debug, Default)]
pub struct Directory {
    pub entries: Vec<TensorEntry>,
    /// Entry indices sorted by name: lookups by binary search, without a second copy of
    /// every name (a directory may hold 10⁵ tensors and is parsed at every open).
    by_name: Vec<u32>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

impl Directory {
    pub fn new(entries: Vec<TensorEntry>) -> Result<Directory> {
        if entries.len() > u32::MAX as usize {
            return Err(bounds(format!(
                "{} tensors exceed what a directory can index",
                entries.len()
            )));
        }
        let mut by_name: Vec<u32> = (0..entries.len() as u32).collect();
        by_name.sort_unstable_by(|&a, &b| entries[a as usize].name.cmp(&entries[b as usize].name));
        for w in by_name.windows(2) {
            let name = &entries[w[0] as usize].name;
            if *name == entries[w[1] as usize].name {
                return Err(parse(format!(
                    "tensor name {:?} appears twice in the directory",
                    crate::format::escape_str(name)
                )));
            }
        }
        Ok(Directory { entries, by_name })
    }

    /// Parses and validates the directory section bytes against a data section of
    /// `data_len` bytes: every record's name, dtype, shape, alignment, bounds and size, no
    /// two tensors overlapping, no duplicate names.
    pub fn parse(bytes: &[u8], data_len: u64) -> Result<Directory> {
        let len = bytes.len() as u64;
        if len < 16 {
            return Err(bounds(format!(
                "directory is {len} bytes, shorter than its 16-byte head"
            )));
        }
        let count = u64_at(bytes, 0);
        let pool_off = u64_at(bytes, 8);
        let records_end = count
            .checked_mul(RECORD_LEN)
            .and_then(|r| r.checked_add(16))
            .ok_or_else(|| bounds(format!("directory count {count} overflows")))?;
        if records_end > len {
            return Err(bounds(format!(
                "directory claims {count} records ({records_end} bytes) but is {len} bytes"
            )));
        }
        if pool_off < records_end || pool_off > len {
            return Err(bounds(format!(
                "name pool offset {pool_off} is outside [{records_end}, {len}] (records end at {records_end})"
            )));
        }
        let pool = &bytes[pool_off as usize..];
        let mut entries = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            let r = &bytes[16 + i * RECORD_LEN as usize..16 + (i + 1) * RECORD_LEN as usize];
            entries.push(parse_record(i, r, pool, data_len)?);
        }
        // No overlap: sort the non-empty extents by offset.
        let mut extents: Vec<(u64, u64, usize)> = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.nbytes > 0)
            .map(|(i, e)| (e.off, e.off + e.nbytes, i))
            .collect();
        extents.sort_unstable();
        for w in extents.windows(2) {
            if w[0].1 > w[1].0 {
                return Err(bounds(format!(
                    "tensor {:?} [{}, {}) overlaps tensor {:?} [{}, {})",
                    entries[w[0].2].name, w[0].0, w[0].1, entries[w[1].2].name, w[1].0, w[1].1
                )));
            }
        }
        Directory::new(entries)
    }

    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.index_of(name).map(|i| &self.entries[i])
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        let pos = self
            .by_name
            .binary_search_by(|&i| self.entries[i as usize].name.as_str().cmp(name))
            .ok()?;
        Some(self.by_name[pos] as usize)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, TensorEntry> {
        self.entries.iter()
    }

    /// Serializes records and name pool (names in entry order, pool right after records).
    pub fn to_bytes(&self) -> Vec<u8> {
        let count = self.entries.len() as u64;
        let pool_off = 16 + count * RECORD_LEN;
        let mut out = Vec::with_capacity(
            pool_off as usize + self.entries.iter().map(|e| e.name.len()).sum::<usize>(),
        );
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&pool_off.to_le_bytes());
        let mut name_off = 0u32;
        for e in &self.entries {
            out.extend_from_slice(&name_off.to_le_bytes());
            out.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
            out.push(e.dtype.id());
            out.push(e.shape.len() as u8);
            for d in 0..MAX_NDIM {
                out.extend_from_slice(&(e.shape.get(d).copied().unwrap_or(0) as u32).to_le_bytes());
            }
            out.extend_from_slice(&e.off.to_le_bytes());
            out.extend_from_slice(&e.nbytes.to_le_bytes());
            out.extend_from_slice(&e.hash.to_le_bytes());
            name_off += e.name.len() as u32;
        }
        for e in &self.entries {
            out.extend_from_slice(e.name.as_bytes());
        }
        out
    }
}

fn parse_record(i: usize, r: &[u8], pool: &[u8], data_len: u64) -> Result<TensorEntry> {
    let name_off = u32_at(r, 0) as u64;
    let name_len = u16_at(r, 4) as u64;
    let dtype_id = r[6];
    let ndim = r[7] as usize;
    let name_end = name_off + name_len;
    if name_end > pool.len() as u64 {
        return Err(bounds(format!(
            "record {i}: name [{name_off}, {name_end}) lies outside the {}-byte name pool",
            pool.len()
        )));
    }
    let name = std::str::from_utf8(&pool[name_off as usize..name_end as usize])
        .map_err(|_| parse(format!("record {i}: tensor name is not UTF-8")))?
        .to_string();
    let at = |what: &str| {
        format!(
            "tensor {:?} (record {i}): {what}",
            crate::format::escape_str(&name)
        )
    };
    let dtype = DType::from_id(dtype_id)
        .ok_or_else(|| parse(at(&format!("unknown dtype id {dtype_id}"))))?;
    if ndim == 0 {
        return Err(parse(at("ndim is 0")));
    }
    if ndim > MAX_NDIM {
        return Err(parse(at(&format!("ndim {ndim} exceeds 6"))));
    }
    let dims: [u64; MAX_NDIM] = std::array::from_fn(|d| u32_at(r, 8 + d * 4) as u64);
    if dims[ndim..].iter().any(|&d| d != 0) {
        return Err(parse(at(&format!(
            "shape has non-zero entries beyond ndim {ndim}: {dims:?}"
        ))));
    }
    let shape = dims[..ndim].to_vec();
    let off = u64_at(r, 32);
    let nbytes = u64_at(r, 40);
    let hash = u64_at(r, 48);
    if !off.is_multiple_of(TENSOR_ALIGN) {
        return Err(bounds(at(&format!("offset {off} is not a multiple of 64"))));
    }
    let end = off
        .checked_add(nbytes)
        .ok_or_else(|| bounds(at("offset + nbytes overflows")))?;
    if end > data_len {
        return Err(bounds(at(&format!(
            "bytes [{off}, {end}) exceed the {data_len}-byte data section"
        ))));
    }
    match dtype.size_for(&shape).map_err(|e| parse(at(&e)))? {
        Size::Exact(want) if want != nbytes => {
            return Err(bounds(at(&format!(
                "nbytes {nbytes} but {dtype} {shape:?} takes {want}"
            ))));
        }
        Size::AtLeast(min) if nbytes < min => {
            return Err(bounds(at(&format!(
                "nbytes {nbytes} but {dtype} {shape:?} takes at least {min}"
            ))));
        }
        _ => {}
    }
    Ok(TensorEntry {
        name,
        dtype,
        shape,
        off,
        nbytes,
        hash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, off: u64) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            dtype: DType::F32,
            shape: vec![4, 2],
            off,
            nbytes: 32,
            hash: 7,
        }
    }

    #[test]
    fn round_trip() {
        let d = Directory::new(vec![entry("a.weight", 0), entry("model.layers.3.x", 64)]).unwrap();
        let b = d.to_bytes();
        let p = Directory::parse(&b, 128).unwrap();
        assert_eq!(p.entries, d.entries);
        assert_eq!(p.get("model.layers.3.x").unwrap().layer(), Some(3));
    }

    #[test]
    fn rejects_bad_records() {
        use crate::format::ErrorKind::*;
        let kind = |es: Vec<TensorEntry>, data_len| {
            let b = Directory {
                entries: es,
                by_name: Vec::new(),
            }
            .to_bytes();
            Directory::parse(&b, data_len).unwrap_err().kind()
        };
        assert_eq!(kind(vec![entry("a", 0), entry("b", 0)], 128), Bounds); // overlap
        assert_eq!(kind(vec![entry("a", 0), entry("a", 64)], 128), Parse); // duplicate
        assert_eq!(kind(vec![entry("a", 8)], 128), Bounds); // misaligned
        assert_eq!(kind(vec![entry("a", 64)], 64), Bounds); // past data
        let mut e = entry("a", 0);
        e.nbytes = 30;
        assert_eq!(kind(vec![e], 128), Bounds); // size disagrees
        let mut e = entry("a", 0);
        e.shape = vec![];
        assert_eq!(kind(vec![e], 128), Parse); // ndim 0
                                               // dtype id 16 is unknown
        let mut b = Directory::new(vec![entry("a", 0)]).unwrap().to_bytes();
        b[16 + 6] = 16;
        assert_eq!(Directory::parse(&b, 128).unwrap_err().kind(), Parse);
        // count that overflows
        let mut b = Directory::new(vec![entry("a", 0)]).unwrap().to_bytes();
        b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(Directory::parse(&b, 128).unwrap_err().kind(), Bounds);
    }

    #[test]
    fn layer_names() {
        assert_eq!(layer_of("model.layers.12.mlp.up_proj.weight"), Some(12));
        assert_eq!(
            layer_of("skill.sql.model.layers.3.mlp.gate_proj.weight"),
            Some(3)
        );
        assert_eq!(layer_of("model.mtp.layers.0.x"), Some(0));
        assert_eq!(layer_of("lm_head.weight"), None);
    }
}
