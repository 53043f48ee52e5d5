//! MoE experts: `moe-defrag` (§11.1) drops the experts a workload never needs, `moe-mask`
//! (§5's expert fields) writes the same choice as a switchable task mask instead.
//!
//! Which experts a layer keeps ([`KeepFrom`]): the smallest set of top experts reaching a
//! fraction `cover` of the layer's routing mass in route stats ([`top_cover`]: by `mass`,
//! ties by count, then the lower index), or the experts a task's expert fields make
//! routable. A layer whose stats show no mass at all keeps every expert (there is nothing
//! to rank them by), and says so.
//!
//! `moe-defrag`: kept experts are renumbered as the contiguous prefix `0..k` in their
//! original order; the router `mlp.gate.weight` keeps the same rows in the same order
//! (decoded, gathered and re-encoded in its dtype: it is small, and a row gather keeps a
//! row-wise codec's values exactly); expert payloads are copied byte for byte from the
//! source mmap, written role-contiguous per layer (§2.2: every kept expert's `gate_proj`,
//! then `up_proj`, then `down_proj`). Shared experts, dense layers and everything else are
//! copied unchanged; `arch.moe.num_experts` stays the nominal original count and the
//! runtime shrinks `top_k` to a layer's experts. Masks with expert fields name experts by
//! their old numbers: they are dropped (and the §7 index with them, which describes the
//! masks); masks without expert fields are kept. `provenance.moe_defrag` records the
//! source, the rule and each layer's kept experts (as source indices).
//!
//! Refused: fused expert tensors (one entry for all experts), skills that replace a
//! changed layer's router or experts, route stats that do not match the file's MoE layers.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{
    base_name, check_source, find_task, gather_rows, invalid, layer_of, num_layers,
    record_provenance, refused, source_identity, tool, top_cover, write_streamed, Result,
};
use crate::format::directory::TensorEntry;
use crate::format::envelope::{feature, SectionKind};
use crate::format::header::Arch;
use crate::format::masks::{build_section, MaskLayout, MaskRecord, Masks, Priority};
use crate::format::writer::{spec_of, TensorPlan, WriteSummary};
use crate::format::{escape_str, CmfFile};
use crate::runtime::routes::RouteStats;

const ROUTER: &str = "mlp.gate.weight";
const EXPERTS: &str = "mlp.experts.";

/// Where the experts to keep come from.
#[derive(Clone, Copy, Debug)]
pub enum KeepFrom<'a> {
    /// The smallest top set reaching `cover` of each layer's routing mass.
    Stats { stats: &'a RouteStats, cover: f64 },
    /// The experts routable under a task mask's expert fields.
    Task(&'a str),
}

/// One MoE layer's choice.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerKeep {
    pub layer: u64,
    /// Experts present before (the router's rows).
    pub experts: u64,
    /// Kept experts, as indices of the source, ascending.
    pub kept: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl LayerKeep {
    fn changes(&self) -> bool {
        self.kept.len() as u64 != self.experts
    }
}

/// Every MoE layer (a router present) with its experts present, checked against
/// `arch.moe` and the expert tensors.
fn moe_layers(file: &CmfFile) -> Result<BTreeMap<u64, u64>> {
    let layers = num_layers(file)?;
    let nominal = file
        .header
        .arch
        .as_ref()
        .and_then(|a| a.moe.as_ref())
        .map(|m| m.num_experts);
    let mut out = BTreeMap::new();
    for l in 0..layers {
        let Some(r) = file.directory.get(&format!("model.layers.{l}.{ROUTER}")) else {
            continue;
        };
        let [n, _] = r.shape[..] else {
            return Err(invalid(format!(
                "layer {l}: router shape {:?} is not 2-D",
                r.shape
            )));
        };
        match nominal {
            None => {
                return Err(invalid(format!(
                    "layer {l} has a router but arch.moe is absent"
                )))
            }
            Some(m) if n > m => {
                return Err(invalid(format!(
                    "layer {l}: {n} router rows, more than arch.moe.num_experts = {m}"
                )))
            }
            _ => {}
        }
        out.insert(l, n);
    }
    if out.is_empty() {
        return Err(refused(
            "the file has no MoE layer (no mlp.gate.weight router)",
        ));
    }
    Ok(out)
}

/// The per-expert tensors of MoE layers: `(layer, expert, role tail)`; fused expert
/// tensors and experts beyond the router's rows are refused.
fn expert_tensor<'a>(
    moe: &BTreeMap<u64, u64>,
    name: &'a str,
) -> Result<Option<(u64, u64, &'a str)>> {
    let Some((l, rest)) = layer_of(name) else {
        return Ok(None);
    };
    let Some(tail) = rest.strip_prefix(EXPERTS) else {
        return Ok(None);
    };
    let Some(&n) = moe.get(&l) else {
        return Err(invalid(format!(
            "{}: expert tensors in a layer without a router",
            escape_str(name)
        )));
    };
    let parsed = tail
        .split_once('.')
        .filter(|(e, _)| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|(e, role)| Some((e.parse::<u64>().ok()?, role)));
    match parsed {
        Some((e, role)) if e < n => Ok(Some((l, e, role))),
        Some((e, _)) => Err(invalid(format!(
            "{}: expert {e} of a layer whose router has {n} rows",
            escape_str(name)
        ))),
        None => Err(refused(format!(
            "{}: fused expert tensors (one entry for every expert) are not supported; moe-defrag needs one directory entry per expert (§2.2)",
            escape_str(name)
        ))),
    }
}

/// The experts each MoE layer keeps.
pub fn choose_experts(file: &CmfFile, from: KeepFrom<'_>) -> Result<Vec<LayerKeep>> {
    let moe = moe_layers(file)?;
    match from {
        KeepFrom::Stats { stats, cover } => {
            if !(cover > 0.0 && cover <= 1.0) {
                return Err(refused(format!("--cover must lie in (0, 1], got {cover}")));
            }
            for s in &stats.layers {
                if !moe.contains_key(&(s.layer as u64)) {
                    return Err(refused(format!(
                        "the route stats name layer {}, which is not a MoE layer of this file: stats of another model?",
                        s.layer
                    )));
                }
            }
            moe.iter()
                .map(|(&l, &n)| {
                    let s = stats
                        .layers
                        .iter()
                        .find(|s| s.layer as u64 == l)
                        .ok_or_else(|| refused(format!("the route stats have no MoE layer {l}")))?;
                    if s.experts as u64 != n {
                        return Err(refused(format!(
                            "the route stats give layer {l} {} experts, the file has {n}",
                            s.experts
                        )));
                    }
                    if s.mass.iter().any(|m| !m.is_finite() || *m < 0.0) {
                        return Err(refused(format!(
                            "the route stats of layer {l} hold a negative or non-finite mass"
                        )));
                    }
                    Ok(match top_cover(&s.mass, &s.counts, cover) {
                        Some(kept) => LayerKeep {
                            layer: l,
                            experts: n,
                            kept: kept.into_iter().map(|e| e as u64).collect(),
                            note: None,
                        },
                        None => LayerKeep {
                            layer: l,
                            experts: n,
                            kept: (0..n).collect(),
                            note: Some("no routing mass observed: every expert kept".into()),
                        },
                    })
                })
                .collect()
        }
        KeepFrom::Task(task) => {
            let mask = find_task(file, task)?;
            let name = escape_str(task);
            if !mask.record.has_expert_fields {
                return Err(refused(format!(
                    "task {name:?} has no expert fields: it does not restrict routing"
                )));
            }
            if mask.layout.visits != num_layers(file)? {
                return Err(refused(format!(
                    "task {name:?} is a LOOP_MASKS mask: its expert rows are per pass, not per layer"
                )));
            }
            moe.iter()
                .map(|(&l, &n)| {
                    let row = mask
                        .experts(l)
                        .ok_or_else(|| invalid("expert fields without expert rows"))?;
                    let kept: Vec<u64> = (0..n).filter(|&e| row.get(e)).collect();
                    if kept.is_empty() {
                        return Err(refused(format!(
                            "task {name:?} routes no expert of layer {l}"
                        )));
                    }
                    Ok(LayerKeep {
                        layer: l,
                        experts: n,
                        kept,
                        note: None,
                    })
                })
                .collect()
        }
    }
}

fn describe(from: KeepFrom<'_>) -> Value {
    match from {
        KeepFrom::Stats { stats, cover } => json!({
            "route_stats": {"model": stats.model, "tokens": stats.tokens},
            "cover": cover,
        }),
        KeepFrom::Task(t) => json!({"task": t}),
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MoeDefragSummary {
    pub write: WriteSummary,
    pub layers: Vec<LayerKeep>,
    /// Masks dropped because their expert fields name the old experts.
    pub dropped_masks: Vec<String>,
    /// Expert tensors copied (byte for byte) and dropped.
    pub experts_copied: usize,
    pub experts_dropped: usize,
}

/// Where one output tensor's bytes come from.
enum Source<'a> {
    Copy(&'a TensorEntry),
    Router(&'a TensorEntry, Vec<usize>),
}

/// Role order within a layer's experts (§2.2): gate, up, down, then anything else.
fn role_rank(role: &str) -> u8 {
    ["gate_proj", "up_proj", "down_proj"]
        .iter()
        .position(|r| role == *r || role.starts_with(&format!("{r}.")))
        .map_or(3, |i| i as u8)
}

/// Writes `file` with only the experts `from` keeps into `out`.
pub fn moe_defrag(file: &CmfFile, out: &Path, from: KeepFrom<'_>) -> Result<MoeDefragSummary> {
    check_source(file)?;
    let moe = moe_layers(file)?;
    let keeps = choose_experts(file, from)?;
    let changed: BTreeMap<u64, &LayerKeep> = keeps
        .iter()
        .filter(|k| k.changes())
        .map(|k| (k.layer, k))
        .collect();

    enum Item<'a> {
        One(TensorPlan, Source<'a>),
        Block(u64),
    }
    let mut items = Vec::new();
    let mut blocks: BTreeMap<u64, Vec<(u8, u64, String, &TensorEntry)>> = BTreeMap::new();
    let mut dropped = 0usize;
    for e in file.directory.iter() {
        let base = base_name(file, &e.name);
        if base != e.name {
            let touches = layer_of(base).is_some_and(|(l, rest)| {
                changed.contains_key(&l) && (rest == ROUTER || rest.starts_with(EXPERTS))
            });
            if touches {
                return Err(refused(format!(
                    "skill tensor {} replaces the router or an expert of a layer whose experts change: drop or re-export the skill first",
                    escape_str(&e.name)
                )));
            }
        }
        let same = |e: &TensorEntry| TensorPlan {
            name: e.name.clone(),
            dtype: e.dtype,
            shape: e.shape.clone(),
        };
        if let Some((l, x, role)) = expert_tensor(&moe, &e.name)? {
            let Some(k) = changed.get(&l) else {
                items.push(Item::One(same(e), Source::Copy(e)));
                continue;
            };
            let Ok(new) = k.kept.binary_search(&x) else {
                dropped += 1;
                continue;
            };
            let block = blocks.entry(l).or_default();
            if block.is_empty() {
                items.push(Item::Block(l));
            }
            block.push((role_rank(role), new as u64, role.to_string(), e));
            continue;
        }
        match layer_of(&e.name) {
            Some((l, ROUTER)) if changed.contains_key(&l) => {
                let kept: Vec<usize> = changed[&l].kept.iter().map(|&x| x as usize).collect();
                let mut plan = same(e);
                plan.shape[0] = kept.len() as u64;
                items.push(Item::One(plan, Source::Router(e, kept)));
            }
            _ => items.push(Item::One(same(e), Source::Copy(e))),
        }
    }
    // A kept expert must be whole: a missing projection would only fail at load.
    for (&l, k) in &changed {
        let block = blocks.get(&l).map_or(&[][..], |b| &b[..]);
        for j in 0..k.kept.len() as u64 {
            for role in ["gate_proj", "up_proj", "down_proj"] {
                if !block
                    .iter()
                    .any(|(_, e, r, _)| *e == j && r.starts_with(role))
                {
                    return Err(invalid(format!(
                        "layer {l}: expert {} has no {role} tensor",
                        k.kept[j as usize]
                    )));
                }
            }
        }
    }
    let mut plans = Vec::new();
    let mut sources = Vec::new();
    let mut copied = 0usize;
    for item in items {
        match item {
            Item::One(p, s) => {
                plans.push(p);
                sources.push(s);
            }
            Item::Block(l) => {
                let mut block = blocks.remove(&l).unwrap_or_default();
                block.sort_by(|a, b| (a.0, a.1, &a.2).cmp(&(b.0, b.1, &b.2)));
                for (_, new, role, e) in block {
                    plans.push(TensorPlan {
                        name: format!("model.layers.{l}.{EXPERTS}{new}.{role}"),
                        dtype: e.dtype,
                        shape: e.shape.clone(),
                    });
                    sources.push(Source::Copy(e));
                    copied += 1;
                }
            }
        }
    }

    let mut spec = spec_of(file);
    spec.tensors = plans;
    let mut dropped_masks = Vec::new();
    if let (Some(m), false) = (&file.masks, changed.is_empty()) {
        dropped_masks = m
            .meta
            .masks
            .iter()
            .filter(|r| r.has_expert_fields)
            .map(|r| r.name.clone())
            .collect();
        if !dropped_masks.is_empty() {
            let section = file.section_bytes(SectionKind::Masks);
            let (records, blobs): (Vec<MaskRecord>, Vec<Vec<u8>>) = m
                .meta
                .masks
                .iter()
                .filter(|r| !r.has_expert_fields)
                .map(|r| (r.clone(), blob_of(section, r)))
                .unzip();
            let default = m
                .meta
                .default_task
                .clone()
                .filter(|d| !dropped_masks.contains(d));
            spec.masks = (!records.is_empty()).then(|| build_section(default, records, &blobs));
            // The §7 index describes the masks' tasks; it goes with them.
            spec.index = None;
            if spec.masks.is_none() {
                spec.extra_features &= !feature::LOOP_MASKS;
            }
        }
    }
    let mut from_json = describe(from);
    from_json["tool"] = json!(tool("moe-defrag"));
    from_json["source"] = source_identity(file);
    from_json["layers"] = json!(keeps
        .iter()
        .map(|k| json!({"layer": k.layer, "experts_before": k.experts, "kept": k.kept}))
        .collect::<Vec<_>>());
    from_json["dropped_masks"] = json!(dropped_masks);
    record_provenance(&mut spec.header, "moe_defrag", from_json);

    let write = write_streamed(out, spec, |i| match &sources[i] {
        Source::Copy(e) => Ok(Cow::Borrowed(file.tensor_bytes(e))),
        Source::Router(e, keep) => {
            let plan = TensorPlan {
                name: e.name.clone(),
                dtype: e.dtype,
                shape: vec![keep.len() as u64, e.shape[1]],
            };
            gather_rows(e, file.tensor_bytes(e), &plan, keep).map(Cow::Owned)
        }
    })?;
    Ok(MoeDefragSummary {
        write,
        layers: keeps,
        dropped_masks,
        experts_copied: copied,
        experts_dropped: dropped,
    })
}

fn blob_of(section: &[u8], r: &MaskRecord) -> Vec<u8> {
    // Offsets were checked against the section when the file was opened.
    section[r.blob_off as usize..(r.blob_off + r.blob_len) as usize].to_vec()
}

/// What `moe-mask` is asked for.
#[derive(Clone, Debug)]
pub struct MoeMaskOptions<'a> {
    pub stats: &'a RouteStats,
    pub cover: f64,
    pub name: String,
    /// Replace a mask of the same name (else that is refused).
    pub replace: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct MoeMaskSummary {
    pub write: WriteSummary,
    pub name: String,
    pub task_id: u32,
    pub replaced: bool,
    pub layers: Vec<LayerKeep>,
    /// Share of the MoE layers' experts the mask makes unroutable.
    pub sparsity: f64,
    /// `arch.intermediate_size` when this rewrite had to add it (masks are sized by it).
    pub intermediate_size_added: Option<u64>,
}

/// A bit field of `bits` bits with `set` on (LSB first, tail bits zero).
fn bitfield(bits: u64, set: impl Iterator<Item = u64>) -> Vec<u8> {
    let mut v = vec![0u8; bits.div_ceil(8) as usize];
    for i in set.filter(|&i| i < bits) {
        v[(i / 8) as usize] |= 1 << (i % 8);
    }
    v
}

/// The blob of a mask that leaves every neuron, head and layer on and restricts experts
/// per `keeps` (layers absent from it: every expert).
fn expert_blob(layout: &MaskLayout, keeps: &BTreeMap<u64, &[u64]>) -> Vec<u8> {
    let mut blob = Vec::new();
    for _ in 0..layout.visits {
        blob.extend(bitfield(layout.intermediate, 0..layout.intermediate));
    }
    for _ in 0..layout.visits {
        blob.extend(bitfield(layout.heads, 0..layout.heads));
    }
    blob.extend(bitfield(layout.layers, 0..layout.layers));
    for l in 0..layout.visits {
        match keeps.get(&l) {
            Some(k) => blob.extend(bitfield(layout.experts, k.iter().copied())),
            None => blob.extend(bitfield(layout.experts, 0..layout.experts)),
        }
    }
    blob
}

/// `arch.intermediate_size` for sizing masks when the header lacks it: the widest dense
/// FFN, else the experts' width.
fn nominal_intermediate(file: &CmfFile, arch: &Arch) -> Option<u64> {
    (0..arch.num_layers)
        .filter_map(|l| {
            file.directory
                .get(&format!("model.layers.{l}.mlp.gate_proj.weight"))
                .and_then(|e| e.shape.first().copied())
        })
        .max()
        .or_else(|| arch.moe.as_ref().and_then(|m| m.moe_intermediate_size))
}

/// Writes a copy of `file` with one more task mask: every FFN neuron, head and layer on,
/// and per MoE layer only the experts reaching `cover` of the routing mass routable.
/// Existing masks are kept as they are (each blob has its own `has_expert_fields`).
pub fn moe_mask(file: &CmfFile, out: &Path, opts: &MoeMaskOptions<'_>) -> Result<MoeMaskSummary> {
    check_source(file)?;
    if opts.name.is_empty() {
        return Err(refused("the mask needs a name"));
    }
    if file.envelope.required_features & feature::LOOP_MASKS != 0 {
        return Err(refused(
            "the file's masks are LOOP_MASKS (one row per pass): moe-mask writes one row per layer",
        ));
    }
    let keeps = choose_experts(
        file,
        KeepFrom::Stats {
            stats: opts.stats,
            cover: opts.cover,
        },
    )?;
    let mut spec = spec_of(file);
    let arch = spec
        .header
        .arch
        .as_mut()
        .ok_or_else(|| invalid("the header has no arch"))?;
    let mut added = None;
    if arch.intermediate_size.is_none() {
        let n = nominal_intermediate(file, arch).ok_or_else(|| {
            refused(
                "arch.intermediate_size is absent and no FFN tensor gives a width to size masks by",
            )
        })?;
        arch.intermediate_size = Some(n);
        added = Some(n);
    }
    let heads = arch
        .num_attention_heads
        .ok_or_else(|| refused("arch.num_attention_heads is absent: masks cannot be sized"))?;
    let layout = MaskLayout {
        visits: arch.num_layers,
        intermediate: arch.intermediate_size.unwrap_or(0),
        heads,
        layers: arch.num_layers,
        experts: arch.moe.as_ref().map_or(0, |m| m.num_experts),
        has_experts: true,
    };
    let by_layer: BTreeMap<u64, &[u64]> = keeps.iter().map(|k| (k.layer, &k.kept[..])).collect();
    let blob = expert_blob(&layout, &by_layer);

    let total: u64 = keeps.iter().map(|k| k.experts).sum();
    let on: u64 = keeps.iter().map(|k| k.kept.len() as u64).sum();
    let sparsity = if total == 0 {
        0.0
    } else {
        1.0 - on as f64 / total as f64
    };
    let (mut records, mut blobs): (Vec<MaskRecord>, Vec<Vec<u8>>) = match &file.masks {
        Some(m) => {
            let section = file.section_bytes(SectionKind::Masks);
            m.meta
                .masks
                .iter()
                .map(|r| (r.clone(), blob_of(section, r)))
                .unzip()
        }
        None => (Vec::new(), Vec::new()),
    };
    let existing = records.iter().position(|r| r.name == opts.name);
    if existing.is_some() && !opts.replace {
        return Err(refused(format!(
            "the file already has a mask named {:?}: --replace replaces it",
            escape_str(&opts.name)
        )));
    }
    let task_id = match existing {
        Some(i) => records[i].task_id,
        // Ids start at 1: the reference's files keep 0 for the dense `general` task.
        None => records
            .iter()
            .map(|r| r.task_id)
            .max()
            .map_or(1, |m| m.saturating_add(1)),
    };
    let extra = Map::from_iter([
        ("expert_cover".to_string(), json!(opts.cover)),
        ("route_stats_tokens".to_string(), json!(opts.stats.tokens)),
        ("sparsity_of".to_string(), json!("experts")),
    ]);
    let record = MaskRecord {
        task_id,
        name: opts.name.clone(),
        description: Some(format!(
            "MoE expert mask: the experts carrying {:.0}% of the routing mass over {} tokens of route stats",
            opts.cover * 100.0,
            opts.stats.tokens
        )),
        sparsity: Some(sparsity),
        // Nothing was measured: null, never an invented value (§5.1).
        quality: None,
        parent: None,
        priority: Some(Priority::Normal),
        has_hot_pack: false,
        has_expert_fields: true,
        blob_off: 0,
        blob_len: 0,
        extra,
    };
    match existing {
        Some(i) => {
            records[i] = record;
            blobs[i] = blob;
        }
        None => {
            records.push(record);
            blobs.push(blob);
        }
    }
    let default = file
        .masks
        .as_ref()
        .and_then(|m| m.meta.default_task.clone());
    let section = build_section(default, records, &blobs);
    // What is written must read back: the layout is re-derived from arch by the reader.
    let parsed = Masks::parse(&section, spec.header.arch.as_ref(), false)
        .map_err(|e| invalid(format!("the new masks section does not parse: {e}")))?;
    if parsed.find(&opts.name).is_none() {
        return Err(invalid("the new mask is missing from its section"));
    }
    spec.masks = Some(section);
    let sources: Vec<&TensorEntry> = file.directory.iter().collect();
    let write = write_streamed(out, spec, |i| {
        Ok(Cow::Borrowed(file.tensor_bytes(sources[i])))
    })?;
    Ok(MoeMaskSummary {
        write,
        name: opts.name.clone(),
        task_id,
        replaced: existing.is_some(),
        layers: keeps,
        sparsity,
        intermediate_size_added: added,
    })
}
