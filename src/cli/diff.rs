//! `cortiq diff A B`: what differs between two files, by meaning rather than by byte
//! position: tensors by name (not offset), the header as JSON, masks by task name and bit,
//! skills by id, the tokenizer by hash and chat bundle.
//!
//! It reports; it does not test. The exit code is 0 either way unless `--exit-code` asks
//! for 1 when the files differ.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use cortiq_engine::format::masks::{BitField, MaskView};
use cortiq_engine::format::{feature, hash64, CmfFile, TensorEntry};
use serde_json::{json, Value};

use super::common::{
    self, esc, esc_path, human_bytes, json_brief, shape_str, Align, CmdResult, Status, Table,
};
use cortiq_engine::format::skills::assign_tensors;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The first file.
    pub a: PathBuf,
    /// The second file.
    pub b: PathBuf,
    /// Exit 1 when the files differ (0 when they do not).
    #[arg(long)]
    pub exit_code: bool,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> CmdResult {
    let a = common::open(&args.a)?;
    let b = common::open(&args.b)?;
    let d = Diff::compute(&a, &b);
    if args.json {
        common::print_json(&d.to_json(args, &a, &b))?;
    } else {
        common::emit(&d.to_text(args, &a, &b))?;
    }
    Ok(if args.exit_code && !d.is_empty() {
        Status::Failure
    } else {
        Status::Success
    })
}

/// One differing JSON path; `None` = absent on that side.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub path: String,
    pub a: Option<Value>,
    pub b: Option<Value>,
}

impl Change {
    fn to_json(&self) -> Value {
        json!({ "path": self.path, "a": self.a, "b": self.b })
    }

    fn text(&self) -> String {
        let side = |v: &Option<Value>| {
            v.as_ref()
                .map_or("(absent)".to_string(), |v| json_brief(v, 60))
        };
        format!("{}: {} → {}", esc(&self.path), side(&self.a), side(&self.b))
    }
}

/// Recursive JSON diff: objects by key (A's order, then B's new keys), arrays by index,
/// numbers by value (`10000` equals `10000.0`).
pub fn json_diff(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<Change>) {
    let child = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            for (k, va) in x {
                json_diff(&child(k), Some(va), y.get(k), out);
            }
            for (k, vb) in y.iter().filter(|(k, _)| !x.contains_key(*k)) {
                json_diff(&child(k), None, Some(vb), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            for i in 0..x.len().max(y.len()) {
                json_diff(&format!("{path}[{i}]"), x.get(i), y.get(i), out);
            }
        }
        (Some(Value::Number(x)), Some(Value::Number(y)))
            if x.as_f64() == y.as_f64() && x.as_f64().is_some() => {}
        (x, y) if x == y => {}
        (x, y) => out.push(Change {
            path: path.to_string(),
            a: x.cloned(),
            b: y.cloned(),
        }),
    }
}

/// A tensor present in both files whose content or description differs.
struct TensorChange<'a> {
    a: &'a TensorEntry,
    b: &'a TensorEntry,
    fields: Vec<&'static str>,
}

/// Differing bits of one mask, per field kind.
#[derive(Default)]
struct BitCounts {
    ffn: u64,
    heads: u64,
    gates: u64,
    experts: u64,
}

struct MaskChange {
    name: String,
    fields: Vec<Change>,
    /// `None` when the layouts differ and bits cannot be compared one to one.
    bits: Option<BitCounts>,
}

impl MaskChange {
    fn is_empty(&self) -> bool {
        self.fields.is_empty()
            && self
                .bits
                .as_ref()
                .is_some_and(|b| b.ffn + b.heads + b.gates + b.experts == 0)
    }
}

struct SkillChange {
    id: String,
    fields: Vec<Change>,
    tensors_added: Vec<String>,
    tensors_removed: Vec<String>,
    tensors_changed: Vec<String>,
}

impl SkillChange {
    fn is_empty(&self) -> bool {
        self.fields.is_empty()
            && self.tensors_added.is_empty()
            && self.tensors_removed.is_empty()
            && self.tensors_changed.is_empty()
    }
}

struct Diff<'a> {
    features: Option<(u32, u32)>,
    added: Vec<&'a TensorEntry>,
    removed: Vec<&'a TensorEntry>,
    changed: Vec<TensorChange<'a>>,
    unchanged: usize,
    header: Vec<Change>,
    masks_added: Vec<String>,
    masks_removed: Vec<String>,
    masks_changed: Vec<MaskChange>,
    /// Differences in the masks meta outside the records (`default_task`).
    masks_meta: Vec<Change>,
    skills_added: Vec<String>,
    skills_removed: Vec<String>,
    skills_changed: Vec<SkillChange>,
    vocab: (Option<u64>, Option<u64>),
    chat: Vec<Change>,
}

impl<'a> Diff<'a> {
    fn compute(a: &'a CmfFile, b: &'a CmfFile) -> Diff<'a> {
        let mut d = Diff {
            features: (a.envelope.required_features != b.envelope.required_features)
                .then_some((a.envelope.required_features, b.envelope.required_features)),
            added: Vec::new(),
            removed: Vec::new(),
            changed: Vec::new(),
            unchanged: 0,
            header: Vec::new(),
            masks_added: Vec::new(),
            masks_removed: Vec::new(),
            masks_changed: Vec::new(),
            masks_meta: Vec::new(),
            skills_added: Vec::new(),
            skills_removed: Vec::new(),
            skills_changed: Vec::new(),
            vocab: (a.vocab_bytes().map(hash64), b.vocab_bytes().map(hash64)),
            chat: Vec::new(),
        };
        d.tensors(a, b);
        // section_hashes describe the bytes of other sections; their differences show up
        // in the masks/tokenizer comparisons, where they mean something.
        let strip = |v: &Value| {
            let mut v = v.clone();
            if let Value::Object(m) = &mut v {
                m.remove("section_hashes");
            }
            v
        };
        json_diff(
            "",
            Some(&strip(&a.header_value)),
            Some(&strip(&b.header_value)),
            &mut d.header,
        );
        d.masks(a, b);
        d.skills(a, b);
        let chat = |f: &CmfFile| {
            f.header
                .tokenizer_config
                .as_ref()
                .and_then(|c| serde_json::to_value(c).ok())
        };
        json_diff("", chat(a).as_ref(), chat(b).as_ref(), &mut d.chat);
        d
    }

    fn tensors(&mut self, a: &'a CmfFile, b: &'a CmfFile) {
        for ea in a.directory.iter() {
            match b.directory.get(&ea.name) {
                None => self.removed.push(ea),
                Some(eb) => {
                    let fields = tensor_fields(ea, eb);
                    if fields.is_empty() {
                        self.unchanged += 1;
                    } else {
                        self.changed.push(TensorChange {
                            a: ea,
                            b: eb,
                            fields,
                        });
                    }
                }
            }
        }
        self.added = b
            .directory
            .iter()
            .filter(|e| a.directory.get(&e.name).is_none())
            .collect();
    }

    fn masks(&mut self, a: &CmfFile, b: &CmfFile) {
        let (va, vb) = (mask_views(a), mask_views(b));
        let names_b: HashSet<&str> = vb.iter().map(|v| v.record.name.as_str()).collect();
        let names_a: HashSet<&str> = va.iter().map(|v| v.record.name.as_str()).collect();
        self.masks_removed = va
            .iter()
            .filter(|v| !names_b.contains(v.record.name.as_str()))
            .map(|v| v.record.name.clone())
            .collect();
        self.masks_added = vb
            .iter()
            .filter(|v| !names_a.contains(v.record.name.as_str()))
            .map(|v| v.record.name.clone())
            .collect();
        let default = |f: &CmfFile| {
            f.masks
                .as_ref()
                .and_then(|m| m.meta.default_task.clone())
                .map(Value::String)
        };
        json_diff(
            "default_task",
            default(a).as_ref(),
            default(b).as_ref(),
            &mut self.masks_meta,
        );
        for x in &va {
            let Some(y) = vb.iter().find(|v| v.record.name == x.record.name) else {
                continue;
            };
            let record = |v: &MaskView<'_>| {
                let mut r = serde_json::to_value(v.record).unwrap_or(Value::Null);
                // Where a blob sits in the section is layout, not meaning.
                if let Value::Object(m) = &mut r {
                    m.remove("blob_off");
                    m.remove("blob_len");
                }
                r
            };
            let mut fields = Vec::new();
            json_diff("", Some(&record(x)), Some(&record(y)), &mut fields);
            let change = MaskChange {
                name: x.record.name.clone(),
                fields,
                bits: mask_bits(x, y),
            };
            if !change.is_empty() {
                self.masks_changed.push(change);
            }
        }
    }

    fn skills(&mut self, a: &'a CmfFile, b: &'a CmfFile) {
        let ra = a.header.skills.as_deref().unwrap_or_default();
        let rb = b.header.skills.as_deref().unwrap_or_default();
        self.skills_removed = ra
            .iter()
            .filter(|s| !rb.iter().any(|t| t.id == s.id))
            .map(|s| s.id.clone())
            .collect();
        self.skills_added = rb
            .iter()
            .filter(|s| !ra.iter().any(|t| t.id == s.id))
            .map(|s| s.id.clone())
            .collect();
        // The same ownership rule as `cortiq skills`, so both commands agree on which
        // tensors belong to which skill.
        let (own_a, own_b) = (assign_tensors(a, ra), assign_tensors(b, rb));
        let by_name = |list: &[&'a TensorEntry]| -> BTreeMap<&'a str, &'a TensorEntry> {
            list.iter().map(|e| (e.name.as_str(), *e)).collect()
        };
        for (ia, sa) in ra.iter().enumerate() {
            let Some(ib) = rb.iter().position(|t| t.id == sa.id) else {
                continue;
            };
            let sb = &rb[ib];
            let mut fields = Vec::new();
            let (ja, jb) = (serde_json::to_value(sa).ok(), serde_json::to_value(sb).ok());
            json_diff("", ja.as_ref(), jb.as_ref(), &mut fields);
            let (ta, tb) = (by_name(&own_a.per_skill[ia]), by_name(&own_b.per_skill[ib]));
            let change = SkillChange {
                id: sa.id.clone(),
                fields,
                tensors_removed: ta
                    .keys()
                    .filter(|k| !tb.contains_key(*k))
                    .map(|k| k.to_string())
                    .collect(),
                tensors_added: tb
                    .keys()
                    .filter(|k| !ta.contains_key(*k))
                    .map(|k| k.to_string())
                    .collect(),
                tensors_changed: ta
                    .iter()
                    .filter(|(k, ea)| {
                        tb.get(*k)
                            .is_some_and(|eb| !tensor_fields(ea, eb).is_empty())
                    })
                    .map(|(k, _)| k.to_string())
                    .collect(),
            };
            if !change.is_empty() {
                self.skills_changed.push(change);
            }
        }
    }

    fn tensors_differ(&self) -> bool {
        !(self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty())
    }

    fn masks_differ(&self) -> bool {
        !(self.masks_added.is_empty()
            && self.masks_removed.is_empty()
            && self.masks_changed.is_empty()
            && self.masks_meta.is_empty())
    }

    fn skills_differ(&self) -> bool {
        !(self.skills_added.is_empty()
            && self.skills_removed.is_empty()
            && self.skills_changed.is_empty())
    }

    fn tokenizer_differs(&self) -> bool {
        self.vocab.0 != self.vocab.1 || !self.chat.is_empty()
    }

    fn is_empty(&self) -> bool {
        self.features.is_none()
            && !self.tensors_differ()
            && self.header.is_empty()
            && !self.masks_differ()
            && !self.skills_differ()
            && !self.tokenizer_differs()
    }

    fn to_json(&self, args: &Args, a: &CmfFile, b: &CmfFile) -> Value {
        let brief = |e: &TensorEntry| {
            json!({ "name": e.name, "dtype": e.dtype.name(), "shape": e.shape, "nbytes": e.nbytes,
                    "hash": format!("{:016x}", e.hash) })
        };
        let side = |path: &PathBuf, f: &CmfFile| {
            json!({ "path": path.to_string_lossy(), "size": f.len(), "tensors": f.directory.len(),
                    "required_features": feature::names(f.envelope.required_features) })
        };
        let changes = |c: &[Change]| c.iter().map(Change::to_json).collect::<Vec<_>>();
        let hex = |h: Option<u64>| h.map(|h| format!("{h:016x}"));
        json!({
            "ok": true,
            "identical": self.is_empty(),
            "a": side(&args.a, a),
            "b": side(&args.b, b),
            "required_features": self.features.map(|(x, y)| json!({ "a": feature::names(x), "b": feature::names(y) })),
            "tensors": {
                "added": self.added.iter().map(|e| brief(e)).collect::<Vec<_>>(),
                "removed": self.removed.iter().map(|e| brief(e)).collect::<Vec<_>>(),
                "changed": self.changed.iter().map(|c| json!({
                    "name": c.a.name, "fields": c.fields, "a": brief(c.a), "b": brief(c.b),
                })).collect::<Vec<_>>(),
                "unchanged": self.unchanged,
            },
            "header": changes(&self.header),
            "masks": {
                "meta": changes(&self.masks_meta),
                "added": self.masks_added,
                "removed": self.masks_removed,
                "changed": self.masks_changed.iter().map(|m| json!({
                    "name": m.name,
                    "fields": changes(&m.fields),
                    "layout_differs": m.bits.is_none(),
                    "bits": m.bits.as_ref().map(|b| json!({
                        "ffn": b.ffn, "heads": b.heads, "gates": b.gates, "experts": b.experts,
                    })),
                })).collect::<Vec<_>>(),
            },
            "skills": {
                "added": self.skills_added,
                "removed": self.skills_removed,
                "changed": self.skills_changed.iter().map(|s| json!({
                    "id": s.id,
                    "fields": changes(&s.fields),
                    "tensors": { "added": s.tensors_added, "removed": s.tensors_removed, "changed": s.tensors_changed },
                })).collect::<Vec<_>>(),
            },
            "tokenizer": {
                "vocab": { "a": hex(self.vocab.0), "b": hex(self.vocab.1), "equal": self.vocab.0 == self.vocab.1 },
                "chat": changes(&self.chat),
            },
        })
    }

    fn to_text(&self, args: &Args, a: &CmfFile, b: &CmfFile) -> String {
        let mut out = String::new();
        let mut t = Table::kv().indent(0);
        for (label, path, f) in [("a", &args.a, a), ("b", &args.b, b)] {
            t.pair(
                label,
                format!(
                    "{}  ({} tensors, {})",
                    esc_path(path),
                    f.directory.len(),
                    human_bytes(f.len())
                ),
            );
        }
        t.render(&mut out);
        if let Some((x, y)) = self.features {
            let _ = writeln!(
                out,
                "\nrequired_features: {} → {}",
                feature::names(x).join(", "),
                feature::names(y).join(", ")
            );
        }

        let _ = writeln!(
            out,
            "\ntensors: {} added, {} removed, {} changed, {} unchanged",
            self.added.len(),
            self.removed.len(),
            self.changed.len(),
            self.unchanged
        );
        if self.tensors_differ() {
            let mut t = Table::new(&[
                ("", Align::Left),
                ("name", Align::Left),
                ("difference", Align::Left),
            ]);
            for e in &self.removed {
                t.row(["-".into(), esc(&e.name), describe(e)]);
            }
            for e in &self.added {
                t.row(["+".into(), esc(&e.name), describe(e)]);
            }
            for c in &self.changed {
                t.row(["~".into(), esc(&c.a.name), change_text(c)]);
            }
            t.render(&mut out);
        }

        let _ = writeln!(out, "\nheader: {}", count(self.header.len(), "difference"));
        for c in &self.header {
            let _ = writeln!(out, "  {}", c.text());
        }

        if a.masks.is_none() && b.masks.is_none() {
            out.push_str("\nmasks: neither file has masks\n");
        } else if !self.masks_differ() {
            out.push_str("\nmasks: no differences\n");
        } else {
            let _ = writeln!(
                out,
                "\nmasks: {} added, {} removed, {} changed",
                self.masks_added.len(),
                self.masks_removed.len(),
                self.masks_changed.len()
            );
            for c in &self.masks_meta {
                let _ = writeln!(out, "  {}", c.text());
            }
            for n in &self.masks_removed {
                let _ = writeln!(out, "  - {}", esc(n));
            }
            for n in &self.masks_added {
                let _ = writeln!(out, "  + {}", esc(n));
            }
            for m in &self.masks_changed {
                let _ = writeln!(out, "  ~ {}", esc(&m.name));
                for c in &m.fields {
                    let _ = writeln!(out, "      {}", c.text());
                }
                match &m.bits {
                    None => {
                        out.push_str("      bit layout differs (dimensions or expert fields)\n")
                    }
                    Some(b) if b.ffn + b.heads + b.gates + b.experts > 0 => {
                        let _ = writeln!(
                            out,
                            "      bits differ: ffn {}, heads {}, gates {}, experts {}",
                            b.ffn, b.heads, b.gates, b.experts
                        );
                    }
                    Some(_) => {}
                }
            }
        }

        let no_skills = |f: &CmfFile| f.header.skills.as_deref().unwrap_or_default().is_empty();
        if no_skills(a) && no_skills(b) {
            out.push_str("\nskills: neither file has skills\n");
        } else if !self.skills_differ() {
            out.push_str("\nskills: no differences\n");
        } else {
            let _ = writeln!(
                out,
                "\nskills: {} added, {} removed, {} changed",
                self.skills_added.len(),
                self.skills_removed.len(),
                self.skills_changed.len()
            );
            for n in &self.skills_removed {
                let _ = writeln!(out, "  - {}", esc(n));
            }
            for n in &self.skills_added {
                let _ = writeln!(out, "  + {}", esc(n));
            }
            for s in &self.skills_changed {
                let _ = writeln!(out, "  ~ {}", esc(&s.id));
                for c in &s.fields {
                    let _ = writeln!(out, "      {}", c.text());
                }
                for (mark, list) in [
                    ("-", &s.tensors_removed),
                    ("+", &s.tensors_added),
                    ("~", &s.tensors_changed),
                ] {
                    for n in list {
                        let _ = writeln!(out, "      {mark} {}", esc(n));
                    }
                }
            }
        }

        out.push_str("\ntokenizer: ");
        let hex = |h: u64| format!("{h:016x}");
        match self.vocab {
            (None, None) => out.push_str("neither file has a vocab section"),
            (Some(x), Some(y)) if x == y => {
                let _ = write!(out, "vocab identical (hash64 {})", hex(x));
            }
            (x, y) => {
                let side = |h: Option<u64>| h.map_or("absent".to_string(), hex);
                let _ = write!(out, "vocab differs ({} → {})", side(x), side(y));
            }
        }
        if self.chat.is_empty() {
            out.push_str(", chat bundle identical\n");
        } else {
            let _ = writeln!(
                out,
                ", chat bundle: {}",
                count(self.chat.len(), "difference")
            );
            for c in &self.chat {
                let _ = writeln!(out, "  tokenizer_config.{}", c.text());
            }
        }

        out.push_str(if self.is_empty() {
            "\nno differences\n"
        } else {
            "\nfiles differ\n"
        });
        out
    }
}

/// Which of dtype, shape, nbytes and hash differ. Offsets are layout, not content.
fn tensor_fields(a: &TensorEntry, b: &TensorEntry) -> Vec<&'static str> {
    let mut f = Vec::new();
    if a.dtype != b.dtype {
        f.push("dtype");
    }
    if a.shape != b.shape {
        f.push("shape");
    }
    if a.nbytes != b.nbytes {
        f.push("nbytes");
    }
    if a.hash != b.hash {
        f.push("hash");
    }
    f
}

fn describe(e: &TensorEntry) -> String {
    format!(
        "{} {} {}",
        e.dtype.name(),
        shape_str(&e.shape),
        human_bytes(e.nbytes)
    )
}

fn change_text(c: &TensorChange<'_>) -> String {
    let mut parts = Vec::new();
    for f in &c.fields {
        match *f {
            "dtype" => parts.push(format!("dtype {} → {}", c.a.dtype.name(), c.b.dtype.name())),
            "shape" => parts.push(format!(
                "shape {} → {}",
                shape_str(&c.a.shape),
                shape_str(&c.b.shape)
            )),
            "nbytes" => parts.push(format!("nbytes {} → {}", c.a.nbytes, c.b.nbytes)),
            // With the description unchanged, a new hash is the whole story: new bytes.
            "hash" if c.fields.len() == 1 => parts.push(format!(
                "content (hash {:016x} → {:016x})",
                c.a.hash, c.b.hash
            )),
            _ => {}
        }
    }
    parts.join(", ")
}

fn count(n: usize, what: &str) -> String {
    match n {
        0 => format!("no {what}s"),
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

fn mask_views(f: &CmfFile) -> Vec<MaskView<'_>> {
    let n = f.masks.as_ref().map_or(0, |m| m.len());
    (0..n).filter_map(|i| f.mask_view(i)).collect()
}

/// Differing bits of two masks of equal layout; `None` if the layouts differ.
fn mask_bits(x: &MaskView<'_>, y: &MaskView<'_>) -> Option<BitCounts> {
    if x.layout != y.layout {
        return None;
    }
    let xor = |p: BitField<'_>, q: BitField<'_>| -> u64 {
        p.bytes
            .iter()
            .zip(q.bytes)
            .map(|(a, b)| (a ^ b).count_ones() as u64)
            .sum()
    };
    let mut c = BitCounts {
        gates: xor(x.gates(), y.gates()),
        ..Default::default()
    };
    for v in 0..x.layout.visits {
        c.ffn += xor(x.ffn(v), y.ffn(v));
        c.heads += xor(x.heads(v), y.heads(v));
        if let (Some(p), Some(q)) = (x.experts(v), y.experts(v)) {
            c.experts += xor(p, q);
        }
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_diff_paths() {
        let a = json!({"arch": {"rope_theta": 10000, "layer_types": ["F", "F"]}, "x": 1, "n": 2.0});
        let b = json!({"arch": {"rope_theta": 1000000, "layer_types": ["F", "L", "L"]}, "y": 2, "n": 2});
        let mut out = Vec::new();
        json_diff("", Some(&a), Some(&b), &mut out);
        let paths: Vec<&str> = out.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "arch.rope_theta",
                "arch.layer_types[1]",
                "arch.layer_types[2]",
                "x",
                "y"
            ]
        );
        assert_eq!(out[0].text(), "arch.rope_theta: 10000 → 1000000");
        assert_eq!(out[3].text(), "x: 1 → (absent)");
    }
}
