//! State of the Skills view: the selected skill, whether its tensor list is open, and the
//! registry joined with the directory once when the file opens (which `skill.*` entries
//! belong to which record, what each replaces, the decoded sizes of the routing vectors).

use cortiq_engine::format::header::{Selection, SkillRecord};
use cortiq_engine::format::{CmfFile, TensorEntry};
use cortiq_views::skills::{
    self as view, BaseTensor, Prop, SkillInfo, SkillRow, SkillsVm, TensorRow,
};
use cortiq_views::util::{esc, human_bytes, shape_str};
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::Frame;
use serde_json::Value;

use super::masks::{quality_full, quality_short};
use super::{Action, Ctx};
use crate::cli::common::{json_brief, ranges};

pub struct SkillsState {
    rows: Vec<SkillRow>,
    infos: Vec<SkillInfo>,
    /// What a standalone skill file binds to; `None` for a model.
    skill_file: Option<Vec<Prop>>,
    orphans: Vec<String>,
    pub selected: usize,
    /// Scroll of the tensor list, when it is open.
    detail: Option<u16>,
}

impl SkillsState {
    pub fn new(file: &CmfFile) -> SkillsState {
        let skills = file.header.skills.as_deref().unwrap_or_default();
        let cortiq_engine::format::skills::SkillOwnership {
            per_skill: owned,
            orphans,
        } = cortiq_engine::format::skills::assign_tensors(file, skills);
        let mut rows = Vec::new();
        let mut infos = Vec::new();
        for (record, entries) in skills.iter().zip(&owned) {
            let tensors: Vec<TensorRow> = entries
                .iter()
                .map(|e| tensor_row(file, &record.id, e))
                .collect();
            rows.push(skill_row(record, entries));
            infos.push(SkillInfo {
                props: skill_props(file, record, entries, &tensors),
                tensors,
            });
        }
        SkillsState {
            rows,
            infos,
            skill_file: file.is_skill_file().then(|| skill_file_props(skills)),
            orphans: orphans.iter().map(|e| esc(&e.name)).collect(),
            selected: 0,
            detail: None,
        }
    }

    #[cfg(test)]
    pub fn detail_open(&self) -> bool {
        self.detail.is_some()
    }

    pub fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        if self.rows.is_empty() {
            return;
        }
        let last = self.rows.len() - 1;
        if let Some(scroll) = self.detail {
            let max = self
                .infos
                .get(self.selected)
                .map_or(0, view::tensors_height)
                .saturating_sub(ctx.body.height.saturating_sub(2) as usize)
                .min(u16::MAX as usize) as u16;
            self.detail = match a {
                Action::Back | Action::Enter => None,
                a => Some(super::scrolled(a, scroll, ctx.page as u16, max).unwrap_or(scroll)),
            };
            return;
        }
        match a {
            Action::Up | Action::ScrollUp => self.selected = self.selected.saturating_sub(1),
            Action::Down | Action::ScrollDown => self.selected = (self.selected + 1).min(last),
            Action::PageUp => self.selected = self.selected.saturating_sub(ctx.page),
            Action::PageDown => self.selected = (self.selected + ctx.page).min(last),
            Action::Home => self.selected = 0,
            Action::End => self.selected = last,
            Action::Enter => self.detail = Some(0),
            Action::Click(x, y) => {
                if let Some(i) = view::hit(ctx.body, &self.vm(), *x, *y) {
                    self.selected = i;
                }
            }
            _ => {}
        }
    }

    pub fn status(&self, file: &CmfFile) -> (String, String) {
        let prefix = if file.is_skill_file() {
            "standalone skill file · "
        } else {
            ""
        };
        let Some(r) = self.rows.get(self.selected) else {
            return (
                format!("{prefix}no skills registry"),
                "o open another file".into(),
            );
        };
        let left = format!(
            "{prefix}skill {} · {} tensors · {}",
            esc(&r.id),
            r.tensors,
            human_bytes(r.bytes)
        );
        let hint = if self.detail.is_some() {
            "↑↓ scroll · Esc back"
        } else {
            "↑↓ skill · Enter tensors"
        };
        (left, hint.into())
    }

    fn vm(&self) -> SkillsVm<'_> {
        SkillsVm {
            skill_file: self.skill_file.as_deref(),
            rows: &self.rows,
            selected: self.selected,
            info: self.infos.get(self.selected),
            orphans: &self.orphans,
            detail: self.detail,
        }
    }

    pub fn render(&self, f: &mut Frame, area: Rect, _file: &CmfFile, theme: &Theme) {
        view::render(f, area, &self.vm(), theme);
    }
}

fn base_name<'a>(id: &str, e: &'a TensorEntry) -> &'a str {
    cortiq_engine::format::skills::replaced_name(&e.name, id).unwrap_or(&e.name)
}

fn tensor_row(file: &CmfFile, id: &str, e: &TensorEntry) -> TensorRow {
    let base = base_name(id, e);
    TensorRow {
        base: base.to_string(),
        dtype: e.dtype.name().to_string(),
        shape: shape_str(&e.shape),
        bytes: e.nbytes,
        base_entry: file.directory.get(base).map(|b| BaseTensor {
            dtype: b.dtype.name().to_string(),
            shape: shape_str(&b.shape),
            bytes: b.nbytes,
        }),
    }
}

/// Layers the record names, or — when it names none (skill files do) — those its tensors
/// are in.
fn layers_text(record: &SkillRecord, entries: &[&TensorEntry]) -> (String, bool) {
    if !record.layers.is_empty() {
        return (ranges(record.layers.iter().copied()), true);
    }
    let mut l: Vec<u64> = entries.iter().filter_map(|e| e.layer()).collect();
    l.sort_unstable();
    l.dedup();
    if l.is_empty() {
        ("—".into(), false)
    } else {
        (format!("({})", ranges(l)), false)
    }
}

/// A skill's quality contract in a few words: backbone → overlaid when it has both.
fn skill_quality_short(q: Option<&Value>) -> String {
    if let Some(Value::Object(m)) = q {
        if let (Some(b), Some(o)) = (m.get("backbone"), m.get("overlaid")) {
            let metric = m.get("metric").map_or(String::new(), |v| match v {
                Value::String(s) => format!("{} ", esc(s)),
                other => format!("{} ", json_brief(other, 12)),
            });
            return format!("{metric}{} → {}", json_brief(b, 16), json_brief(o, 16));
        }
    }
    quality_short(q)
}

fn routing_short(s: Option<&Selection>) -> String {
    match s {
        None => "—".into(),
        Some(s) => {
            let mut t = format!("{} · φ layer {}", esc(&s.metric), s.phi_layer);
            if let Some(r) = s.rank {
                t.push_str(&format!(" · rank {r}"));
            }
            t
        }
    }
}

fn skill_row(record: &SkillRecord, entries: &[&TensorEntry]) -> SkillRow {
    SkillRow {
        id: record.id.clone(),
        name: record.name.clone().unwrap_or_else(|| "—".into()),
        layers: layers_text(record, entries).0,
        tensors: entries.len(),
        bytes: entries.iter().map(|e| e.nbytes).sum(),
        mask_task: record.input_mask_task.clone().unwrap_or_else(|| "—".into()),
        quality: skill_quality_short(record.quality.as_ref()),
        routing: routing_short(record.selection.as_ref()),
    }
}

/// The claim-16 contract (§9): the metric with backbone → overlaid (and their ratio) on
/// the first line, every other key after it.
fn quality_props(q: Option<&Value>) -> Vec<Prop> {
    let Some(Value::Object(m)) = q else {
        return vec![Prop::new("quality", quality_full(q))];
    };
    let text = |v: &Value| match v {
        Value::String(s) => esc(s),
        other => json_brief(other, 40),
    };
    let (b, o) = (m.get("backbone"), m.get("overlaid"));
    let Some((b, o)) = b.zip(o) else {
        return vec![Prop::new("quality", quality_full(q))];
    };
    let mut head = m
        .get("metric")
        .map_or(String::new(), |v| format!("{} ", text(v)));
    head.push_str(&format!("backbone {} → overlaid {}", text(b), text(o)));
    if let (Some(b), Some(o)) = (b.as_f64(), o.as_f64()) {
        if b != 0.0 {
            head.push_str(&format!(" (overlaid/backbone {:.3})", o / b));
        }
    }
    let rest: Vec<String> = m
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "metric" | "backbone" | "overlaid"))
        .map(|(k, v)| format!("{} {}", esc(k), text(v)))
        .collect();
    let mut out = vec![Prop::new("quality", head)];
    if !rest.is_empty() {
        out.push(Prop::new("", rest.join(" · ")));
    }
    out
}

/// A decoded vector's size against what the arch implies.
fn size_prop(key: &str, got: Result<u64, String>, want: Option<(u64, String)>) -> Prop {
    match (got, want) {
        (Err(e), _) => Prop::warn(key, e),
        (Ok(n), Some((w, why))) if n != w => {
            Prop::warn(key, format!("{n} f16 — expected {w} ({why})"))
        }
        (Ok(n), Some((_, why))) => Prop::new(key, format!("{n} f16 = {why}")),
        (Ok(n), None) => Prop::new(key, format!("{n} f16")),
    }
}

fn selection_props(s: &Selection, hidden: Option<u64>) -> Vec<Prop> {
    let mut out = vec![Prop::new(
        "routing",
        format!(
            "recon-argmin over an affine subspace · metric {} · φ from layer {} · rank {}",
            esc(&s.metric),
            s.phi_layer,
            s.rank.map_or("— (not recorded)".into(), |r| r.to_string())
        ),
    )];
    out.push(size_prop(
        "  mean",
        Selection::f16_count(&s.mean),
        hidden.map(|h| (h, format!("hidden {h}"))),
    ));
    let basis = Selection::f16_count(&s.basis);
    let want = match (s.rank, hidden) {
        (Some(r), Some(h)) => r
            .checked_mul(h)
            .map(|w| (w, format!("rank {r} × hidden {h}"))),
        _ => None,
    };
    // Without a recorded rank, say what the basis implies.
    let implied = match (&basis, s.rank, hidden) {
        (Ok(n), None, Some(h)) if h > 0 && n % h == 0 => Some(n / h),
        _ => None,
    };
    let mut p = size_prop("  basis", basis, want);
    if let Some(r) = implied {
        p.value
            .push_str(&format!(" (rank {r} at hidden {})", hidden.unwrap_or(0)));
    }
    out.push(p);
    for (k, v) in &s.extra {
        out.push(Prop::new(format!("  {}", esc(k)), json_brief(v, 80)));
    }
    out
}

/// What each layer's replaced tensors are, by their names within the layer.
fn per_layer_props(id: &str, entries: &[&TensorEntry]) -> Vec<Prop> {
    let mut by_layer: std::collections::BTreeMap<Option<u64>, Vec<String>> = Default::default();
    for e in entries {
        let base = base_name(id, e);
        let short = match e.layer() {
            Some(l) => {
                let marker = format!("layers.{l}.");
                base.find(&marker)
                    .map_or(base, |at| &base[at + marker.len()..])
                    .to_string()
            }
            None => base.to_string(),
        };
        by_layer
            .entry(e.layer())
            .or_default()
            .push(short.strip_suffix(".weight").unwrap_or(&short).to_string());
    }
    by_layer
        .into_iter()
        .map(|(l, names)| {
            let key = match l {
                Some(l) => format!("  layer {l}"),
                None => "  outside layers".into(),
            };
            Prop::new(key, esc(&names.join(" ")))
        })
        .collect()
}

fn skill_props(
    file: &CmfFile,
    record: &SkillRecord,
    entries: &[&TensorEntry],
    tensors: &[TensorRow],
) -> Vec<Prop> {
    let mut out = Vec::new();
    let (layers, named) = layers_text(record, entries);
    out.push(Prop::new(
        "layers",
        if named {
            record
                .layers
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        } else if layers == "—" {
            "—".to_string()
        } else {
            format!(
                "— (the replaced tensors are in layers {})",
                layers.trim_matches(['(', ')'])
            )
        },
    ));
    out.push(match &record.input_mask_task {
        None => Prop::new("input_mask_task", "— (no mask narrows the input)"),
        Some(t) if file.masks.as_ref().is_some_and(|m| m.find(t).is_some()) => Prop::new(
            "input_mask_task",
            format!("{} (a mask of this file)", esc(t)),
        ),
        Some(t) => Prop::warn(
            "input_mask_task",
            format!("{} — this file has no mask of that name", esc(t)),
        ),
    });
    out.extend(quality_props(record.quality.as_ref()));
    match &record.selection {
        Some(s) => out.extend(selection_props(
            s,
            file.header.arch.as_ref().map(|a| a.hidden_size),
        )),
        None => out.push(Prop::new(
            "routing",
            "— (no selection: the skill is chosen by name)",
        )),
    }
    let bytes: u64 = tensors.iter().map(|t| t.bytes).sum();
    let base: Vec<&BaseTensor> = tensors
        .iter()
        .filter_map(|t| t.base_entry.as_ref())
        .collect();
    let base_text = if tensors.is_empty() {
        String::new()
    } else if base.is_empty() {
        " · the base tensors are not in this file".into()
    } else {
        format!(
            " · the {} base tensors they stand in for: {}",
            base.len(),
            human_bytes(base.iter().map(|b| b.bytes).sum())
        )
    };
    let replaced = format!("{} · {}{base_text}", tensors.len(), human_bytes(bytes));
    out.push(if tensors.is_empty() {
        Prop::warn("replaced tensors", "none in the directory")
    } else if base.len() < tensors.len() && !file.is_skill_file() {
        Prop::warn(
            "replaced tensors",
            format!("{replaced} ({} missing)", tensors.len() - base.len()),
        )
    } else {
        Prop::new("replaced tensors", replaced)
    });
    out.extend(per_layer_props(&record.id, entries));
    for (k, v) in &record.extra {
        out.push(Prop::new(esc(k), json_brief(v, 80)));
    }
    out
}

/// The identity of a standalone skill file: the base it was cut from, by the hash of that
/// base's directory.
fn skill_file_props(skills: &[SkillRecord]) -> Vec<Prop> {
    let mut out = Vec::new();
    for r in skills.iter().filter(|r| r.base_dir_hash.is_some()) {
        let who = if skills.len() > 1 {
            format!(" ({})", esc(&r.id))
        } else {
            String::new()
        };
        out.push(Prop::new(
            format!("base_dir_hash{who}"),
            format!(
                "{} — hash64 of the base file's directory; apply refuses any other base",
                esc(r.base_dir_hash.as_deref().unwrap_or_default())
            ),
        ));
        out.push(Prop::new(
            "base_arch",
            r.base_arch
                .as_deref()
                .map_or("—".into(), |a| format!("{} (for a human check)", esc(a))),
        ));
        out.push(Prop::new(
            "task",
            r.task.as_deref().map_or("—".into(), |t| {
                format!("{} (the mask task it activates)", esc(t))
            }),
        ));
        out.push(Prop::new(
            "provenance",
            match &r.provenance {
                None | Some(Value::Null) => "—".into(),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            Value::String(s) => esc(s),
                            other => json_brief(other, 40),
                        };
                        format!("{} {v}", esc(k))
                    })
                    .collect::<Vec<_>>()
                    .join(" · "),
                Some(v) => json_brief(v, 100),
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testing::{fixture, Harness};
    use super::super::{Action, Screen};
    use super::*;

    fn skills(h: &Harness) -> &SkillsState {
        match &h.app.screen {
            Screen::Model(m) => &m.skills,
            _ => panic!("no model open"),
        }
    }

    #[test]
    fn registry_of_a_model_with_a_skill() {
        let mut h = Harness::fixture("qwen3-skills.cmf");
        h.act(Action::GoTab(3));
        let screen = h.render();
        insta::assert_snapshot!("skills_registry", screen);
        for want in [
            "SQL assistant",
            "1-3",
            "75.4 KiB",
            "ppl 8623432.079 → 13367223.87",
            "ppl backbone 8623432.079 → overlaid 13367223.87 (overlaid/backbone 1.550)",
            "mse · φ layer 2 · rank 2",
            "64 f16 = hidden 64",
            "128 f16 = rank 2 × hidden 64",
            "layer 3",
            "mlp.gate_proj mlp.up_proj mlp.down_proj",
        ] {
            assert!(screen.contains(want), "{want:?} in\n{screen}");
        }
        let s = skills(&h);
        assert_eq!(s.rows[0].tensors, 9);
        assert_eq!(s.infos[0].tensors.len(), 9);
        assert!(s.infos[0].tensors.iter().all(|t| t.dtype == "q8_2f"));
        assert!(!screen.contains("not measured"), "the quality is measured");
    }

    #[test]
    fn replaced_tensors_beside_their_base() {
        let mut h = Harness::fixture("qwen3-skills.cmf");
        h.acts([Action::GoTab(3), Action::Enter]);
        assert!(skills(&h).detail_open());
        let screen = h.render();
        insta::assert_snapshot!("skills_tensors", screen);
        let rows: Vec<&str> = screen.lines().filter(|l| l.contains("q8_2f")).collect();
        assert_eq!(rows.len(), 9, "{screen}");
        // Every base tensor is in this file: its dtype and bytes stand beside the skill's.
        assert!(rows.iter().all(|r| !r.contains('—')), "{screen}");
        assert!(
            screen.contains("model.layers.1.mlp.gate_proj.weight"),
            "{screen}"
        );
        assert!(screen.contains("9 tensors"), "{screen}");
        h.act(Action::Back);
        assert!(!skills(&h).detail_open());
    }

    #[test]
    fn a_standalone_skill_file_names_its_base() {
        let mut h = Harness::fixture("qwen3-skillfile.cmf");
        h.act(Action::GoTab(3));
        let screen = h.render();
        insta::assert_snapshot!("skills_skillfile", screen);
        for want in [
            "standalone skill file — not runnable",
            "d3e074f94cea010a",
            "base_arch",
            "qwen3",
            "general",
            "cut_from qwen3-skills.cmf",
            "cortiq skill apply BASE SKILL -o OUT",
            "not measured",
            "— (the replaced tensors are in layers 1-3)",
        ] {
            assert!(screen.contains(want), "{want:?} in\n{screen}");
        }
        h.act(Action::Enter);
        let screen = h.render();
        assert!(
            screen.contains("the base tensors are not in this file"),
            "{screen}"
        );
        assert_eq!(screen.lines().filter(|l| l.contains("q8_2f")).count(), 9);
    }

    #[test]
    fn a_click_selects_a_registry_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("two.cmf");
        // A writable copy (the fixtures are read-only).
        std::fs::write(&path, std::fs::read(fixture("qwen3-skills.cmf")).unwrap()).unwrap();
        let file = CmfFile::open(&path).unwrap();
        let (e, bytes) = file
            .tensor("skill.sql.model.layers.1.mlp.up_proj.weight")
            .unwrap();
        let (dtype, shape, payload) = (e.dtype, e.shape.clone(), bytes.to_vec());
        drop(file);
        // A second skill appended in place: the registry then has two rows.
        let tensor = cortiq_engine::format::skills::SkillTensor {
            base_name: "model.layers.1.mlp.up_proj.weight".into(),
            dtype,
            shape,
            bytes: &payload,
        };
        let record = SkillRecord {
            id: "poem".into(),
            layers: vec![1],
            ..Default::default()
        };
        cortiq_engine::format::skills::append_skill_in_place(&path, record, &[tensor]).unwrap();
        let mut h = Harness::open(&path);
        h.act(Action::GoTab(3));
        let screen = h.render();
        let y = screen
            .lines()
            .position(|l| l.contains("  poem "))
            .expect("row of poem");
        h.act(Action::Click(4, y as u16));
        assert_eq!(skills(&h).selected, 1);
        assert!(h.render().contains("skill poem"));
    }

    #[test]
    fn a_file_without_skills_says_so() {
        let mut h = Harness::fixture("qwen3-q4.cmf");
        h.acts([Action::GoTab(3), Action::Down, Action::Enter, Action::End]);
        let screen = h.render();
        insta::assert_snapshot!("skills_absent", screen);
        assert!(
            screen.contains("this file has no skills registry"),
            "{screen}"
        );
        assert!(!skills(&h).detail_open());
    }

    #[test]
    fn demo_skill_names_its_mask_task() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.cmf");
        cortiq_engine::synth::write_demo(&path).unwrap();
        let mut h = Harness::open(&path);
        h.act(Action::GoTab(3));
        let screen = h.render();
        assert!(screen.contains("code (a mask of this file)"), "{screen}");
        assert!(screen.contains("no selection"), "{screen}");
        assert!(screen.contains("not measured"), "{screen}");
    }

    #[test]
    fn selection_sizes_are_checked() {
        assert_eq!(Selection::f16_count("AAA="), Ok(1));
        assert_eq!(Selection::f16_count("AAA"), Ok(1), "padding is optional");
        assert!(Selection::f16_count("AAAA")
            .unwrap_err()
            .contains("3 bytes"));
        assert!(Selection::f16_count("!!")
            .unwrap_err()
            .contains("invalid base64"));
        let s = Selection {
            metric: "mse".into(),
            phi_layer: 1,
            mean: "AAA=".into(),
            basis: "AAAAAAAA".into(), // 6 bytes = 3 f16
            rank: None,
            ..Default::default()
        };
        let props = selection_props(&s, Some(3));
        assert!(props[1].warn, "mean of 1 where hidden is 3: {props:?}");
        assert!(!props[2].warn, "{props:?}");
        assert!(props[2].value.contains("rank 1 at hidden 3"), "{props:?}");
    }

    #[test]
    fn colour_changes_no_text_and_any_size_renders() {
        for name in ["qwen3-skills.cmf", "qwen3-skillfile.cmf", "qwen3-q4.cmf"] {
            let mut h = Harness::fixture(name);
            h.act(Action::GoTab(3));
            let plain = h.render();
            h.app.theme = Theme::dark();
            assert_eq!(h.render(), plain, "{name}");
            for (w, ht) in [(20, 6), (50, 12), (200, 60), (3, 3)] {
                h.width = w;
                h.height = ht;
                h.render();
                for (x, y) in [(1, 2), (5, 4), (w / 2, ht / 2), (w - 1, ht - 1)] {
                    h.act(Action::Click(x, y));
                }
                h.act(Action::Enter).act(Action::End);
                h.render();
                h.act(Action::Back);
            }
        }
    }
}
