//! `cortiq skills FILE`: the skills registry of §9 with each skill's replaced tensors
//! (`skill.{id}.{base name}` directory entries), and the identity of a standalone skill
//! file (§9.1).

use std::fmt::Write as _;
use std::path::PathBuf;

use cortiq_engine::format::header::{Selection, SkillRecord};
use cortiq_engine::format::{CmfFile, TensorEntry};
use serde_json::{json, Value};

use super::common::{
    self, esc, human_bytes, json_brief, opt, ranges, shape_str, Align, CmdResult, Status, Table,
};

/// What a user should do with a standalone skill file.
const SKILL_FILE_NOTE: &str =
    "standalone skill file: not runnable; apply with `cortiq skill apply BASE SKILL -o OUT`";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (.cmf) or standalone skill file.
    pub file: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> CmdResult {
    let file = common::open(&args.file)?;
    let skills = file.header.skills.as_deref().unwrap_or_default();
    let owned = cortiq_engine::format::skills::assign_tensors(&file, skills);
    let hidden = file.header.arch.as_ref().map(|a| a.hidden_size);
    let views: Vec<SkillView<'_>> = skills
        .iter()
        .zip(owned.per_skill)
        .map(|(record, tensors)| SkillView {
            record,
            selection: record
                .selection
                .as_ref()
                .map(|s| SelectionSizes::of(s, hidden)),
            tensors: tensors
                .into_iter()
                .map(|e| {
                    let base = base_name(&record.id, &e.name);
                    let base_present = file.directory.get(base).is_some();
                    (e, base, base_present)
                })
                .collect(),
        })
        .collect();
    if args.json {
        common::print_json(&to_json(&file, &views, &owned.orphans))?;
    } else {
        common::emit(&to_text(&file, &views, &owned.orphans))?;
    }
    Ok(Status::Success)
}

/// One registry record with what the directory holds for it.
struct SkillView<'a> {
    record: &'a SkillRecord,
    selection: Option<SelectionSizes>,
    /// Replaced tensors: the entry, the base tensor's name, whether the base is in this file.
    tensors: Vec<(&'a TensorEntry, &'a str, bool)>,
}

impl SkillView<'_> {
    fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|(e, _, _)| e.nbytes).sum()
    }
}

/// Decoded sizes of a selection's f16 vectors.
struct SelectionSizes {
    mean: Result<u64, String>,
    basis: Result<u64, String>,
    /// The sizes the header's arch implies: `hidden` and `rank × hidden`.
    expected_mean: Option<u64>,
    expected_basis: Option<u64>,
}

impl SelectionSizes {
    fn of(s: &Selection, hidden: Option<u64>) -> SelectionSizes {
        SelectionSizes {
            mean: Selection::f16_count(&s.mean),
            basis: Selection::f16_count(&s.basis),
            expected_mean: hidden,
            expected_basis: hidden.zip(s.rank).and_then(|(h, r)| h.checked_mul(r)),
        }
    }
}

fn size_text(got: &Result<u64, String>, want: Option<u64>) -> String {
    match (got, want) {
        (Err(e), _) => esc(e),
        (Ok(n), Some(w)) if *n != w => format!("{n} f16 (expected {w})"),
        (Ok(n), _) => format!("{n} f16"),
    }
}

fn size_json(got: &Result<u64, String>) -> Value {
    match got {
        Ok(n) => json!(n),
        Err(_) => Value::Null,
    }
}

/// `skill.{id}.{base}` → `base` (callers checked the prefix).
fn base_name<'a>(id: &str, name: &'a str) -> &'a str {
    name.get(7 + id.len()..).unwrap_or(name)
}

fn to_json(file: &CmfFile, views: &[SkillView<'_>], orphans: &[&TensorEntry]) -> Value {
    let skills: Vec<Value> = views
        .iter()
        .map(|v| {
            let r = v.record;
            let tensors: Vec<Value> = v
                .tensors
                .iter()
                .map(|(e, base, present)| {
                    json!({
                        "name": e.name, "base": base, "base_present": present,
                        "dtype": e.dtype.name(), "shape": e.shape, "nbytes": e.nbytes,
                        "hash": format!("{:016x}", e.hash),
                    })
                })
                .collect();
            let selection = r
                .selection
                .as_ref()
                .zip(v.selection.as_ref())
                .map(|(s, sz)| {
                    let errors: Vec<&String> = [sz.mean.as_ref().err(), sz.basis.as_ref().err()]
                        .into_iter()
                        .flatten()
                        .collect();
                    json!({
                        "metric": s.metric,
                        "phi_layer": s.phi_layer,
                        "rank": s.rank,
                        "mean_f16": size_json(&sz.mean),
                        "basis_f16": size_json(&sz.basis),
                        "errors": errors,
                    })
                });
            json!({
                "id": r.id,
                "name": r.name,
                "layers": r.layers,
                "input_mask_task": r.input_mask_task,
                "quality": r.quality,
                "selection": selection,
                "tensors": tensors,
                "tensor_count": v.tensors.len(),
                "total_bytes": v.total_bytes(),
                "base_dir_hash": r.base_dir_hash,
                "base_arch": r.base_arch,
                "task": r.task,
                "provenance": r.provenance,
            })
        })
        .collect();
    let skill_file = file.is_skill_file();
    json!({
        "ok": true,
        "skill_file": skill_file,
        "note": skill_file.then_some(SKILL_FILE_NOTE),
        "count": views.len(),
        "skills": skills,
        "orphan_tensors": orphans.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
    })
}

fn to_text(file: &CmfFile, views: &[SkillView<'_>], orphans: &[&TensorEntry]) -> String {
    let mut out = String::new();
    if file.is_skill_file() {
        let _ = writeln!(out, "{SKILL_FILE_NOTE}");
    }
    if views.is_empty() {
        out.push_str("no skills\n");
    } else {
        let _ = writeln!(out, "skills: {}", views.len());
    }
    for v in views {
        let r = v.record;
        let _ = write!(out, "\nskill {}", esc(&r.id));
        if let Some(n) = &r.name {
            let _ = write!(out, " — {}", esc(n));
        }
        out.push('\n');
        let mut t = Table::kv();
        let layers: Vec<String> = r.layers.iter().map(u64::to_string).collect();
        let touched = || {
            let mut l: Vec<u64> = v.tensors.iter().filter_map(|(e, _, _)| e.layer()).collect();
            l.sort_unstable();
            l.dedup();
            l
        };
        let layers = match (layers.is_empty(), touched()) {
            (false, _) => layers.join(", "),
            (true, lt) if lt.is_empty() => "—".into(),
            // A record may leave `layers` empty (skill files do); the tensors still tell.
            (true, lt) => format!("— (replaced tensors are in layers {})", ranges(lt)),
        };
        t.pair("layers", layers);
        if let Some(h) = &r.base_dir_hash {
            t.pair("base_dir_hash", esc(h));
        }
        if let Some(a) = &r.base_arch {
            t.pair("base_arch", esc(a));
        }
        if let Some(task) = &r.task {
            t.pair("task", esc(task));
        }
        if let Some(p) = &r.provenance {
            t.pair("provenance", json_brief(p, 100));
        }
        t.pair(
            "input_mask_task",
            opt(r.input_mask_task.as_deref().map(esc)),
        );
        t.pair(
            "quality",
            match &r.quality {
                None | Some(Value::Null) => "not measured".into(),
                Some(q) => json_brief(q, 100),
            },
        );
        match (&r.selection, &v.selection) {
            (Some(s), Some(sz)) => t.pair(
                "selection",
                format!(
                    "metric {}, phi_layer {}, rank {}, mean {}, basis {}",
                    esc(&s.metric),
                    s.phi_layer,
                    opt(s.rank),
                    size_text(&sz.mean, sz.expected_mean),
                    size_text(&sz.basis, sz.expected_basis),
                ),
            ),
            _ => t.pair("selection", "—"),
        }
        t.pair(
            "replaced tensors",
            format!("{}, {}", v.tensors.len(), human_bytes(v.total_bytes())),
        );
        t.render(&mut out);
        if !v.tensors.is_empty() {
            let mut t = Table::new(&[
                ("base tensor", Align::Left),
                ("dtype", Align::Left),
                ("shape", Align::Left),
                ("size", Align::Right),
                ("base in file", Align::Left),
            ])
            .indent(4);
            for (e, base, present) in &v.tensors {
                t.row([
                    esc(base),
                    e.dtype.name().to_string(),
                    shape_str(&e.shape),
                    human_bytes(e.nbytes),
                    if *present { "yes" } else { "no" }.to_string(),
                ]);
            }
            t.render(&mut out);
        }
    }
    if !orphans.is_empty() {
        let _ = writeln!(
            out,
            "\nskill tensors without a registry record: {}",
            orphans.len()
        );
        for e in orphans {
            let _ = writeln!(out, "  {}", esc(&e.name));
        }
    }
    out
}
