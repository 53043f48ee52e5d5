//! The masks section (spec §5, §5.1): per-task bit fields over FFN neurons, attention heads,
//! layer gates and (optionally) MoE experts. Bits are decoded on demand from the section
//! bytes; parsing checks layout, alignment, overlap and that no tail bit is set.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::{bounds, parse, Result};
use super::header::Arch;

/// `priority` of a mask (NOTES.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Priority {
    Fallback,
    Normal,
    Primary,
}

/// The JSON meta of the section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MaskMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_task: Option<String>,
    pub masks: Vec<MaskRecord>,
    #[serde(flatten, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

/// One task's record in the meta.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MaskRecord {
    pub task_id: u32,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub sparsity: Option<f64>,
    /// Held-out quality contract; `None` (JSON null) = not measured.
    #[serde(default)]
    pub quality: Option<Value>,
    #[serde(default)]
    pub parent: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    #[serde(default)]
    pub has_hot_pack: bool,
    #[serde(default)]
    pub has_expert_fields: bool,
    pub blob_off: u64,
    pub blob_len: u64,
    #[serde(flatten, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

/// Bit-field sizes of one blob, derived from arch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MaskLayout {
    /// Rows of FFN/head/expert fields: `num_layers`, or layers × loops with LOOP_MASKS.
    pub visits: u64,
    pub intermediate: u64,
    pub heads: u64,
    pub layers: u64,
    pub experts: u64,
    pub has_experts: bool,
}

impl MaskLayout {
    pub fn ffn_bytes(&self) -> u64 {
        self.intermediate.div_ceil(8)
    }
    pub fn head_bytes(&self) -> u64 {
        self.heads.div_ceil(8)
    }
    pub fn gate_bytes(&self) -> u64 {
        self.layers.div_ceil(8)
    }
    pub fn expert_bytes(&self) -> u64 {
        self.experts.div_ceil(8)
    }
    pub fn blob_len(&self) -> u64 {
        let per_visit = self.ffn_bytes()
            + self.head_bytes()
            + if self.has_experts {
                self.expert_bytes()
            } else {
                0
            };
        self.visits * per_visit + self.gate_bytes()
    }
    fn ffn_at(&self) -> u64 {
        0
    }
    fn heads_at(&self) -> u64 {
        self.visits * self.ffn_bytes()
    }
    fn gates_at(&self) -> u64 {
        self.heads_at() + self.visits * self.head_bytes()
    }
    fn experts_at(&self) -> u64 {
        self.gates_at() + self.gate_bytes()
    }
}

/// A little-endian-bit-order field of `bits` bits.
#[derive(Clone, Copy, Debug)]
pub struct BitField<'a> {
    pub bytes: &'a [u8],
    pub bits: u64,
}

impl<'a> BitField<'a> {
    pub fn get(&self, i: u64) -> bool {
        i < self.bits && self.bytes[(i / 8) as usize] & (1 << (i % 8)) != 0
    }
    pub fn count_ones(&self) -> u64 {
        self.bytes.iter().map(|b| b.count_ones() as u64).sum()
    }
    pub fn density(&self) -> f64 {
        if self.bits == 0 {
            1.0
        } else {
            self.count_ones() as f64 / self.bits as f64
        }
    }
    pub fn ones(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.bits).filter(|&i| self.get(i))
    }
    /// The set bits beyond `bits` in the last byte (must be zero).
    fn tail_bits(&self) -> u8 {
        let rem = (self.bits % 8) as u32;
        if rem == 0 || self.bytes.is_empty() {
            0
        } else {
            self.bytes[self.bytes.len() - 1] & !((1u8 << rem) - 1)
        }
    }
}

/// A parsed masks section borrowing nothing: offsets into the section bytes.
#[derive(Clone, Debug)]
pub struct Masks {
    pub meta: MaskMeta,
    /// The meta JSON as found (unknown keys included).
    pub meta_json: Value,
    pub layouts: Vec<MaskLayout>,
}

/// A view of one mask blob.
#[derive(Clone, Copy, Debug)]
pub struct MaskView<'a> {
    pub record: &'a MaskRecord,
    pub layout: MaskLayout,
    blob: &'a [u8],
}

impl<'a> MaskView<'a> {
    fn field(&self, at: u64, bytes: u64, bits: u64) -> BitField<'a> {
        BitField {
            bytes: &self.blob[at as usize..(at + bytes) as usize],
            bits,
        }
    }
    pub fn ffn(&self, visit: u64) -> BitField<'a> {
        let l = &self.layout;
        self.field(
            l.ffn_at() + visit * l.ffn_bytes(),
            l.ffn_bytes(),
            l.intermediate,
        )
    }
    pub fn heads(&self, visit: u64) -> BitField<'a> {
        let l = &self.layout;
        self.field(
            l.heads_at() + visit * l.head_bytes(),
            l.head_bytes(),
            l.heads,
        )
    }
    pub fn gates(&self) -> BitField<'a> {
        let l = &self.layout;
        self.field(l.gates_at(), l.gate_bytes(), l.layers)
    }
    pub fn experts(&self, visit: u64) -> Option<BitField<'a>> {
        let l = &self.layout;
        l.has_experts.then(|| {
            self.field(
                l.experts_at() + visit * l.expert_bytes(),
                l.expert_bytes(),
                l.experts,
            )
        })
    }
    /// Fraction of masked-out (inactive) FFN neurons over all visits.
    pub fn ffn_sparsity(&self) -> f64 {
        let l = &self.layout;
        let total = l.visits * l.intermediate;
        if total == 0 {
            return 0.0;
        }
        let on: u64 = (0..l.visits).map(|v| self.ffn(v).count_ones()).sum();
        1.0 - on as f64 / total as f64
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

impl Masks {
    /// Parses a masks section. `loop_masks` is the LOOP_MASKS feature bit.
    pub fn parse(section: &[u8], arch: Option<&Arch>, loop_masks: bool) -> Result<Masks> {
        let len = section.len() as u64;
        if len < 8 {
            return Err(bounds(format!(
                "masks section is {len} bytes, shorter than its 8-byte head"
            )));
        }
        let n_masks = u32_at(section, 0) as u64;
        let meta_len = u32_at(section, 4) as u64;
        let meta_end = 8 + meta_len;
        if meta_end > len {
            return Err(bounds(format!(
                "masks meta of {meta_len} bytes runs past the {len}-byte section"
            )));
        }
        let meta_bytes = &section[8..meta_end as usize];
        let meta_json: Value = serde_json::from_slice(meta_bytes)
            .map_err(|e| parse(format!("masks meta JSON: {e}")))?;
        let meta: MaskMeta = serde_json::from_value(meta_json.clone())
            .map_err(|e| parse(format!("masks meta JSON: {e}")))?;
        if meta.masks.len() as u64 != n_masks {
            return Err(parse(format!(
                "masks section says {n_masks} masks but its meta lists {}",
                meta.masks.len()
            )));
        }
        let arch = arch
            .ok_or_else(|| parse("masks section present but the header has no arch to size it"))?;
        let intermediate = arch
            .intermediate_size
            .ok_or_else(|| parse("masks need arch.intermediate_size"))?;
        let heads = arch
            .num_attention_heads
            .ok_or_else(|| parse("masks need arch.num_attention_heads"))?;
        let experts = arch.moe.as_ref().map(|m| m.num_experts).unwrap_or(0);
        let mut layouts = Vec::with_capacity(meta.masks.len());
        let mut extents: Vec<(u64, u64, usize)> = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (i, m) in meta.masks.iter().enumerate() {
            let who = format!("mask {:?}", crate::format::escape_str(&m.name));
            if !names.insert(m.name.as_str()) {
                return Err(parse(format!("{who} appears twice")));
            }
            if m.blob_off % 8 != 0 {
                return Err(bounds(format!(
                    "{who}: blob_off {} is not aligned to 8",
                    m.blob_off
                )));
            }
            let end = m
                .blob_off
                .checked_add(m.blob_len)
                .ok_or_else(|| bounds(format!("{who}: blob extent overflows")))?;
            if m.blob_off < meta_end || end > len {
                return Err(bounds(format!(
                    "{who}: blob [{}, {end}) is outside the blob area [{meta_end}, {len})",
                    m.blob_off
                )));
            }
            if m.has_expert_fields && experts == 0 {
                return Err(parse(format!(
                    "{who} has expert fields but arch.moe is absent"
                )));
            }
            let layout = solve_layout(arch.num_layers, intermediate, heads, experts, m.has_expert_fields, m.blob_len, loop_masks)
                .ok_or_else(|| {
                    bounds(format!(
                        "{who}: blob_len {} does not match the layout of {} layers × (ffn {intermediate}, heads {heads}{})",
                        m.blob_len,
                        arch.num_layers,
                        if m.has_expert_fields { format!(", experts {experts}") } else { String::new() }
                    ))
                })?;
            extents.push((m.blob_off, end, i));
            layouts.push(layout);
        }
        extents.sort_unstable();
        for w in extents.windows(2) {
            if w[0].1 > w[1].0 {
                return Err(bounds(format!(
                    "mask blobs {:?} and {:?} overlap",
                    meta.masks[w[0].2].name, meta.masks[w[1].2].name
                )));
            }
        }
        let masks = Masks {
            meta,
            meta_json,
            layouts,
        };
        // Tail bits beyond each dimension must be zero (otherwise popcounts see phantoms).
        for i in 0..masks.meta.masks.len() {
            let v = masks.view(section, i);
            let l = v.layout;
            let who = || format!("mask {:?}", crate::format::escape_str(&v.record.name));
            for visit in 0..l.visits {
                if v.ffn(visit).tail_bits() != 0 {
                    return Err(parse(format!(
                        "{}: FFN row {visit} has bits set beyond {}",
                        who(),
                        l.intermediate
                    )));
                }
                if v.heads(visit).tail_bits() != 0 {
                    return Err(parse(format!(
                        "{}: head row {visit} has bits set beyond {}",
                        who(),
                        l.heads
                    )));
                }
                if let Some(e) = v.experts(visit) {
                    if e.tail_bits() != 0 {
                        return Err(parse(format!(
                            "{}: expert row {visit} has bits set beyond {}",
                            who(),
                            l.experts
                        )));
                    }
                }
            }
            if v.gates().tail_bits() != 0 {
                return Err(parse(format!(
                    "{}: layer gates have bits set beyond {}",
                    who(),
                    l.layers
                )));
            }
        }
        Ok(masks)
    }

    pub fn len(&self) -> usize {
        self.meta.masks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.meta.masks.is_empty()
    }

    /// The view of mask `i` over `section` (the same bytes given to [`Masks::parse`]).
    pub fn view<'a>(&'a self, section: &'a [u8], i: usize) -> MaskView<'a> {
        let r = &self.meta.masks[i];
        MaskView {
            record: r,
            layout: self.layouts[i],
            blob: &section[r.blob_off as usize..(r.blob_off + r.blob_len) as usize],
        }
    }

    pub fn find(&self, name: &str) -> Option<usize> {
        self.meta.masks.iter().position(|m| m.name == name)
    }
}

fn solve_layout(
    layers: u64,
    intermediate: u64,
    heads: u64,
    experts: u64,
    has_experts: bool,
    blob_len: u64,
    loop_masks: bool,
) -> Option<MaskLayout> {
    let mut layout = MaskLayout {
        visits: layers,
        intermediate,
        heads,
        layers,
        experts,
        has_experts,
    };
    let per_visit = layout.ffn_bytes()
        + layout.head_bytes()
        + if has_experts {
            layout.expert_bytes()
        } else {
            0
        };
    let rows_bytes = blob_len.checked_sub(layout.gate_bytes())?;
    if per_visit == 0 || rows_bytes % per_visit != 0 {
        return None;
    }
    let visits = rows_bytes / per_visit;
    let ok = if loop_masks {
        layers > 0 && visits.is_multiple_of(layers) && visits > 0
    } else {
        visits == layers
    };
    if !ok {
        return None;
    }
    layout.visits = visits;
    Some(layout)
}

/// Builds a masks section from records and blobs (the writer's side). `blob_off` and
/// `blob_len` of each record are assigned here.
pub fn build_section(
    default_task: Option<String>,
    mut records: Vec<MaskRecord>,
    blobs: &[Vec<u8>],
) -> Vec<u8> {
    assert_eq!(records.len(), blobs.len());
    // The meta's length depends on the offsets it contains: iterate to a fixed point.
    let mut meta_len = 0usize;
    loop {
        let mut at = (8 + meta_len).next_multiple_of(8) as u64;
        for (r, b) in records.iter_mut().zip(blobs) {
            r.blob_off = at;
            r.blob_len = b.len() as u64;
            at = (at + b.len() as u64).next_multiple_of(8);
        }
        let meta = MaskMeta {
            default_task: default_task.clone(),
            masks: records.clone(),
            extra: Map::new(),
        };
        let bytes = serde_json::to_vec(&meta).expect("mask meta serializes");
        if bytes.len() == meta_len {
            let mut out = Vec::new();
            out.extend_from_slice(&(records.len() as u32).to_le_bytes());
            out.extend_from_slice(&(meta_len as u32).to_le_bytes());
            out.extend_from_slice(&bytes);
            for (r, b) in records.iter().zip(blobs) {
                out.resize(r.blob_off as usize, 0);
                out.extend_from_slice(b);
            }
            return out;
        }
        meta_len = bytes.len();
    }
}
