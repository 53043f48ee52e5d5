//! `cortiq masks FILE [--task NAME]`: the task masks of §5 (bit fields decoded on demand)
//! and the deprecated sparse index of §7.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use cortiq_engine::format::index::IndexEntry;
use cortiq_engine::format::masks::MaskView;
use cortiq_engine::format::CmfFile;
use serde_json::{json, Value};

use super::common::{self, esc, json_brief, ranges, Align, CliError, CmdResult, Status, Table};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (.cmf).
    pub file: PathBuf,
    /// Show one mask in detail: active neurons, heads and experts per layer.
    #[arg(long, value_name = "NAME")]
    pub task: Option<String>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> CmdResult {
    let file = common::open(&args.file)?;
    let n = file.masks.as_ref().map_or(0, |m| m.len());
    let views: Vec<MaskView<'_>> = (0..n).filter_map(|i| file.mask_view(i)).collect();
    let selected: Vec<MaskView<'_>> = match &args.task {
        Some(task) => match views.iter().find(|v| &v.record.name == task) {
            Some(v) => vec![*v],
            None => return Err(unknown_task(task, &views)),
        },
        None => views,
    };
    let rows: Vec<(MaskView<'_>, Vec<VisitRow>)> =
        selected.iter().map(|v| (*v, visit_rows(v))).collect();
    // The index names tasks by id; with --task only that task's entries are relevant.
    let index: Option<Vec<&IndexEntry>> = file.index.as_ref().map(|ix| {
        ix.iter()
            .filter(|e| {
                args.task.is_none() || selected.iter().any(|v| v.record.task_id == e.task_id)
            })
            .collect()
    });
    if args.json {
        common::print_json(&to_json(&file, &rows, index.as_deref()))?;
    } else {
        common::emit(&to_text(
            &file,
            &rows,
            index.as_deref(),
            args.task.is_some(),
        ))?;
    }
    Ok(Status::Success)
}

fn unknown_task(task: &str, views: &[MaskView<'_>]) -> CliError {
    if views.is_empty() {
        return CliError::usage(format!("unknown task {task:?}: the file has no masks"));
    }
    let names: Vec<&str> = views.iter().map(|v| v.record.name.as_str()).collect();
    CliError::usage(format!(
        "unknown task {task:?}; available tasks: {}",
        names.join(", ")
    ))
}

/// One row of a mask's FFN/head/expert fields: a layer, or with LOOP_MASKS a visit.
struct VisitRow {
    visit: u64,
    layer: u64,
    ffn_active: u64,
    ffn_total: u64,
    heads: Vec<u64>,
    heads_total: u64,
    gate: bool,
    /// Active experts, when the mask has expert fields.
    experts: Option<Vec<u64>>,
    experts_total: u64,
}

impl VisitRow {
    fn ffn_density(&self) -> f64 {
        density(self.ffn_active, self.ffn_total)
    }
    fn heads_density(&self) -> f64 {
        density(self.heads.len() as u64, self.heads_total)
    }
    fn experts_density(&self) -> Option<f64> {
        self.experts
            .as_ref()
            .map(|e| density(e.len() as u64, self.experts_total))
    }
}

/// Matches `BitField::density`: an empty field counts as fully active.
fn density(on: u64, total: u64) -> f64 {
    if total == 0 {
        1.0
    } else {
        on as f64 / total as f64
    }
}

fn visit_rows(v: &MaskView<'_>) -> Vec<VisitRow> {
    let l = v.layout;
    let gates = v.gates();
    (0..l.visits)
        .map(|visit| {
            // LOOP_MASKS stores rows visit-major: physical layer = visit mod layers (§5.1).
            let layer = if l.layers == 0 {
                visit
            } else {
                visit % l.layers
            };
            let ffn = v.ffn(visit);
            VisitRow {
                visit,
                layer,
                ffn_active: ffn.count_ones(),
                ffn_total: ffn.bits,
                heads: v.heads(visit).ones().collect(),
                heads_total: l.heads,
                gate: gates.get(layer),
                experts: v.experts(visit).map(|e| e.ones().collect()),
                experts_total: l.experts,
            }
        })
        .collect()
}

fn quality_text(q: &Option<Value>) -> String {
    match q {
        None | Some(Value::Null) => "not measured".into(),
        Some(v) => json_brief(v, 60),
    }
}

fn to_json(
    file: &CmfFile,
    rows: &[(MaskView<'_>, Vec<VisitRow>)],
    index: Option<&[&IndexEntry]>,
) -> Value {
    let masks: Vec<Value> = rows
        .iter()
        .map(|(v, visits)| {
            let r = v.record;
            let l = v.layout;
            let layers: Vec<Value> = visits
                .iter()
                .map(|row| {
                    json!({
                        "visit": row.visit,
                        "layer": row.layer,
                        "ffn_active": row.ffn_active,
                        "ffn_total": row.ffn_total,
                        "ffn_density": row.ffn_density(),
                        "heads_active": row.heads,
                        "heads_density": row.heads_density(),
                        "gate": row.gate,
                        "experts_active": row.experts,
                        "experts_density": row.experts_density(),
                    })
                })
                .collect();
            json!({
                "task_id": r.task_id,
                "name": r.name,
                "description": r.description,
                "sparsity": r.sparsity,
                "measured_ffn_sparsity": v.ffn_sparsity(),
                "priority": r.priority,
                "quality": r.quality,
                "has_expert_fields": r.has_expert_fields,
                "has_hot_pack": r.has_hot_pack,
                "parent": r.parent,
                "blob_off": r.blob_off,
                "blob_len": r.blob_len,
                "layout": {
                    "visits": l.visits, "layers": l.layers, "intermediate": l.intermediate,
                    "heads": l.heads, "experts": if l.has_experts { Some(l.experts) } else { None },
                },
                "layers": layers,
            })
        })
        .collect();
    let index = index.map(|entries| {
        json!({
            "entries": entries.len(),
            "items": entries.iter().map(|e| json!({
                "task_id": e.task_id, "layer": e.layer_idx, "groups": e.groups, "heads": e.heads,
            })).collect::<Vec<_>>(),
        })
    });
    json!({
        "ok": true,
        "count": file.masks.as_ref().map_or(0, |m| m.len()),
        "default_task": file.masks.as_ref().and_then(|m| m.meta.default_task.clone()),
        "masks": masks,
        "sparse_index": index,
    })
}

fn to_text(
    file: &CmfFile,
    rows: &[(MaskView<'_>, Vec<VisitRow>)],
    index: Option<&[&IndexEntry]>,
    detail: bool,
) -> String {
    let mut out = String::new();
    let Some(masks) = &file.masks else {
        out.push_str("no masks section\n");
        index_text(&mut out, index, detail);
        return out;
    };
    let _ = write!(out, "masks: {}", masks.len());
    if let Some(d) = &masks.meta.default_task {
        let _ = write!(out, " (default task {})", esc(d));
    }
    out.push_str("\n\n");

    let mut t = Table::new(&[
        ("id", Align::Right),
        ("name", Align::Left),
        ("priority", Align::Left),
        ("sparsity", Align::Right),
        ("measured", Align::Right),
        ("quality", Align::Left),
        ("experts", Align::Left),
        ("hot pack", Align::Left),
        ("parent", Align::Left),
    ]);
    for (v, _) in rows {
        let r = v.record;
        t.row([
            r.task_id.to_string(),
            esc(&r.name),
            r.priority.map_or("—".into(), |p| format!("{p:?}")),
            r.sparsity.map_or("—".into(), |s| format!("{s:.3}")),
            format!("{:.3}", v.ffn_sparsity()),
            quality_text(&r.quality),
            yes_no(r.has_expert_fields).into(),
            yes_no(r.has_hot_pack).into(),
            match &r.parent {
                None | Some(Value::Null) => "—".into(),
                Some(p) => json_brief(p, 30),
            },
        ]);
    }
    t.render(&mut out);
    out.push_str("  (sparsity: declared in the meta; measured: share of FFN neurons masked out)\n");

    for (v, visits) in rows {
        let r = v.record;
        let _ = write!(out, "\nmask {} (task {})", esc(&r.name), r.task_id);
        if let Some(d) = &r.description {
            let _ = write!(out, ": {}", esc(d));
        }
        out.push('\n');
        let looped = v.layout.visits != v.layout.layers;
        let mut cols: Vec<(&str, Align)> = Vec::new();
        if looped {
            cols.push(("visit", Align::Right));
        }
        cols.push(("layer", Align::Right));
        cols.push(("gate", Align::Left));
        if detail {
            cols.extend([("ffn active", Align::Right), ("heads active", Align::Left)]);
            if r.has_expert_fields {
                cols.push(("experts active", Align::Left));
            }
        } else {
            cols.extend([("ffn", Align::Right), ("heads", Align::Right)]);
            if r.has_expert_fields {
                cols.push(("experts", Align::Right));
            }
        }
        let mut t = Table::new(&cols);
        for row in visits {
            let mut cells = Vec::new();
            if looped {
                cells.push(row.visit.to_string());
            }
            cells.push(row.layer.to_string());
            cells.push(if row.gate { "on" } else { "off" }.to_string());
            if detail {
                cells.push(format!("{}/{}", row.ffn_active, row.ffn_total));
                cells.push(format!(
                    "{} of {}",
                    ranges(row.heads.iter().copied()),
                    row.heads_total
                ));
                if let Some(e) = &row.experts {
                    cells.push(format!(
                        "{} of {}",
                        ranges(e.iter().copied()),
                        row.experts_total
                    ));
                }
            } else {
                cells.push(format!("{:.3}", row.ffn_density()));
                cells.push(format!("{:.3}", row.heads_density()));
                if let Some(d) = row.experts_density() {
                    cells.push(format!("{d:.3}"));
                }
            }
            t.row(cells);
        }
        t.render(&mut out);
        if detail {
            let mut kv = Table::kv();
            kv.pair("quality", quality_text(&r.quality));
            kv.pair(
                "blob",
                format!("offset {} length {}", r.blob_off, r.blob_len),
            );
            for (k, val) in &r.extra {
                kv.pair(esc(k), json_brief(val, 80));
            }
            kv.render(&mut out);
        }
    }
    index_text(&mut out, index, detail);
    out
}

fn index_text(out: &mut String, index: Option<&[&IndexEntry]>, detail: bool) {
    let Some(entries) = index else { return };
    let _ = writeln!(
        out,
        "\nsparse index (deprecated, §7): {} entries",
        entries.len()
    );
    if entries.is_empty() {
        return;
    }
    if detail {
        let mut t = Table::new(&[
            ("task", Align::Right),
            ("layer", Align::Right),
            ("FFN groups (of 32 neurons)", Align::Left),
            ("heads", Align::Left),
        ]);
        for e in entries {
            t.row([
                e.task_id.to_string(),
                e.layer_idx.to_string(),
                format!(
                    "{}: {}",
                    e.groups.len(),
                    ranges(e.groups.iter().map(|&g| g as u64))
                ),
                ranges(e.heads.iter().map(|&h| h as u64)),
            ]);
        }
        t.render(out);
        return;
    }
    // Per task: which layers, and how many groups/heads in total.
    let mut by_task: BTreeMap<u32, (Vec<u64>, u64, u64)> = BTreeMap::new();
    for e in entries {
        let s = by_task.entry(e.task_id).or_default();
        s.0.push(e.layer_idx as u64);
        s.1 += e.groups.len() as u64;
        s.2 += e.heads.len() as u64;
    }
    let mut t = Table::new(&[
        ("task", Align::Right),
        ("layers", Align::Left),
        ("groups", Align::Right),
        ("heads", Align::Right),
    ]);
    for (task, (mut layers, groups, heads)) in by_task {
        layers.sort_unstable();
        layers.dedup();
        t.row([
            task.to_string(),
            ranges(layers),
            groups.to_string(),
            heads.to_string(),
        ]);
    }
    t.render(out);
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
