//! State of the Skills view: the selected skill, whether its tensor list is open, and the
//! registry joined with the directory once when the file opens (which `skill.*` entries
//! belong to which record, what each replaces, the decoded sizes of the routing vectors).
//!
//! The E column: each skill's recon-argmin routing error (§9) for the current prompt —
//! the chat's last user message, or while the chat has none a probe typed here (`/`).
//! It is computed by a background job on the chat worker's model, which waits while a
//! chat answer streams; the least E (what `auto` picks) and the chat's own skill are
//! marked, and a skill that cannot be scored says why.

use cortiq_engine::format::header::{Selection, SkillRecord};
use cortiq_engine::format::{CmfFile, TensorEntry};
use std::sync::Arc;

use cortiq_engine::runtime::skill_route::Routing;
use cortiq_views::skills::{
    self as view, BaseTensor, Prop, RouteVm, ScoreVm, SkillInfo, SkillRow, SkillsVm, TensorRow,
};
use cortiq_views::util::{esc, human_bytes, shape_str};
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::Frame;
use serde_json::Value;

use super::chat::Field;
use super::chat_worker::{ActiveSkill, ChatReport, SharedEngine};
use super::jobs::{JobKind, JobReport, Jobs};
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
    /// The chat worker's model, once loaded (E needs a forward of the backbone).
    engine: Option<SharedEngine>,
    /// Why there is no model to route with.
    unavailable: Option<String>,
    /// The chat's last user message: the prompt E is for.
    chat_prompt: Option<String>,
    /// The probe prompt typed here, used while the chat has no message.
    probe: Field,
    editing: bool,
    /// The last prompt routed and its scores (or why they failed).
    routed: Option<(String, Result<Arc<Routing>, String>)>,
    /// The prompt being routed now.
    routing: Option<String>,
    /// The skill the chat runs with (from its worker).
    chat_skill: ActiveSkill,
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
            engine: None,
            unavailable: None,
            chat_prompt: None,
            probe: Field::default(),
            editing: false,
            routed: None,
            routing: None,
            chat_skill: ActiveSkill::None,
        }
    }

    /// Whether E can be shown: a model with a skills registry (the chat worker's model
    /// computes it).
    pub fn wants_engine(&self) -> bool {
        !self.rows.is_empty() && self.skill_file.is_none()
    }

    /// The chat's last user message changed (`None`: it has none).
    pub fn set_chat_prompt(&mut self, prompt: Option<&str>) {
        if self.chat_prompt.as_deref() != prompt {
            self.chat_prompt = prompt.map(str::to_string);
        }
    }

    /// The prompt E is for: the chat's last message, or else the probe.
    pub fn prompt(&self) -> Option<&str> {
        self.chat_prompt
            .as_deref()
            .or(Some(self.probe.text.as_str()))
            .filter(|p| !p.trim().is_empty())
    }

    /// The scores of the current prompt, when computed.
    pub fn scores(&self) -> Option<&Routing> {
        match &self.routed {
            Some((p, Ok(r))) if Some(p.as_str()) == self.prompt() => Some(r),
            _ => None,
        }
    }

    /// Starts routing the current prompt when its scores are not computed or coming.
    pub fn refresh(&mut self, jobs: &mut Jobs) {
        if !self.wants_engine() || self.editing {
            return;
        }
        let (Some(engine), Some(prompt)) = (self.engine.clone(), self.prompt()) else {
            return;
        };
        let prompt = prompt.to_string();
        if self.routed.as_ref().is_some_and(|(p, _)| *p == prompt)
            || self.routing.as_deref() == Some(prompt.as_str())
        {
            return;
        }
        self.routing = Some(prompt.clone());
        jobs.spawn(JobKind::Route, move |cancel, report| {
            let cancelled = || cancel.load(std::sync::atomic::Ordering::Relaxed);
            // A streaming chat answer has the cores.
            cortiq_engine::exec::yield_to_foreground(&cancelled);
            if cancelled() {
                return;
            }
            let ids = engine.raw_tokens(&prompt);
            let result = cortiq_engine::runtime::skill_route::route(&engine.model, &ids)
                .map(Arc::new)
                .map_err(|e| e.to_string());
            report(JobReport::Route { prompt, result });
        });
    }

    pub fn on_job(&mut self, r: &JobReport, ctx: &mut Ctx) {
        match r {
            JobReport::Chat(ChatReport::Engine(e)) => self.engine = Some(e.clone()),
            JobReport::Chat(ChatReport::Unavailable { title, .. }) => {
                self.unavailable = Some(title.clone())
            }
            JobReport::Chat(ChatReport::Choice(c)) => self.chat_skill = c.active.skill.clone(),
            JobReport::Route { prompt, result } => {
                if self.routing.as_deref() == Some(prompt.as_str()) {
                    self.routing = None;
                    ctx.jobs.finished(JobKind::Route);
                }
                self.routed = Some((prompt.clone(), result.clone()));
            }
            _ => {}
        }
    }

    pub fn typing(&self) -> bool {
        self.editing
    }

    /// The probe being typed: keys edit it; Enter or Esc ends (and routes it).
    fn edit_probe(&mut self, a: &Action) {
        match a {
            Action::Enter | Action::Back => self.editing = false,
            Action::Input(c) => self.probe.insert(&c.to_string()),
            Action::Paste(p) => self.probe.insert(&p.replace(['\r', '\n'], " ")),
            Action::Erase => self.probe.erase(),
            Action::Left => self.probe.cursor = self.probe.cursor.saturating_sub(1),
            Action::Right => {
                self.probe.cursor = (self.probe.cursor + 1).min(self.probe.text.chars().count())
            }
            Action::Home => self.probe.cursor = 0,
            Action::End => self.probe.cursor = self.probe.text.chars().count(),
            _ => {}
        }
    }

    /// The E column's view model.
    fn route_vm(&self) -> (String, String, Vec<ScoreVm>) {
        let quote = |p: &str| {
            let one: String = p.split_whitespace().collect::<Vec<_>>().join(" ");
            let cut: String = one.chars().take(60).collect();
            let more = if one.chars().count() > 60 { "…" } else { "" };
            format!("“{}{more}”", esc(&cut))
        };
        let source = if self.editing {
            format!("probe: {}▏ (Enter routes it)", esc(&self.probe.text))
        } else {
            match (&self.chat_prompt, self.prompt()) {
                (Some(p), _) => format!("the chat's last message {}", quote(p)),
                (None, Some(p)) => format!("the probe {} (/ edits it)", quote(p)),
                (None, None) => {
                    "no prompt yet: ask in the Chat view (6), or / types a probe here".into()
                }
            }
        };
        let state = match (&self.engine, &self.unavailable) {
            _ if self.prompt().is_none() || self.editing => String::new(),
            (None, Some(why)) => format!("no model to route with: {why}"),
            (None, None) => "loading the model…".into(),
            (Some(_), _) if self.routing.is_some() && self.scores().is_none() => {
                "computing…".into()
            }
            (Some(_), _) => match &self.routed {
                Some((p, Err(e))) if Some(p.as_str()) == self.prompt() => e.clone(),
                _ => String::new(),
            },
        };
        let scores = self
            .scores()
            .map(|r| {
                r.scores
                    .iter()
                    .map(|s| ScoreVm {
                        e: s.error,
                        least: r.choice == Some(s.index),
                        problem: s.problem.clone(),
                        in_chat: match &self.chat_skill {
                            ActiveSkill::One(k) if *k == s.index => "●".into(),
                            ActiveSkill::Blend(w) => w
                                .get(s.index as usize)
                                .map_or(String::new(), |w| format!("w {w:.2}")),
                            _ => String::new(),
                        },
                    })
                    .collect()
            })
            .unwrap_or_default();
        (source, state, scores)
    }

    #[cfg(test)]
    pub fn detail_open(&self) -> bool {
        self.detail.is_some()
    }

    pub fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        if self.rows.is_empty() {
            return;
        }
        if self.editing {
            self.edit_probe(a);
            return;
        }
        if matches!(a, Action::Filter) && self.wants_engine() && self.detail.is_none() {
            if self.chat_prompt.is_some() {
                *ctx.flash = Some(
                    "E is for the chat's last message; the probe is used while the chat has none"
                        .into(),
                );
            } else {
                self.editing = true;
            }
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
                if let Some(i) = self.with_vm(|vm| view::hit(ctx.body, vm, *x, *y)) {
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
        } else if self.editing {
            "type the probe · Enter routes it"
        } else if self.wants_engine() {
            "↑↓ skill · Enter tensors · / probe prompt"
        } else {
            "↑↓ skill · Enter tensors"
        };
        (left, hint.into())
    }

    fn vm(&self) -> SkillsVm<'_> {
        SkillsVm {
            route: None,
            skill_file: self.skill_file.as_deref(),
            rows: &self.rows,
            selected: self.selected,
            info: self.infos.get(self.selected),
            orphans: &self.orphans,
            detail: self.detail,
        }
    }

    /// The whole view model (with the E column when the file can be routed).
    fn with_vm<R>(&self, use_vm: impl FnOnce(&SkillsVm) -> R) -> R {
        if !self.wants_engine() {
            return use_vm(&self.vm());
        }
        let (source, state, scores) = self.route_vm();
        // The selected skill's score in its panel, with why it has none.
        let info = self.infos.get(self.selected).map(|i| {
            let mut i = i.clone();
            let prop = match scores.get(self.selected) {
                Some(s) => match (s.e, &s.problem) {
                    (Some(e), _) => Prop::new(
                        "E (this prompt)",
                        format!(
                            "{}{}",
                            view::e_text(e),
                            if s.least {
                                " — the least: `auto` picks this skill"
                            } else {
                                ""
                            }
                        ),
                    ),
                    (None, Some(p)) => Prop::warn("E (this prompt)", format!("not scored: {p}")),
                    (None, None) => Prop::warn("E (this prompt)", "not scored"),
                },
                None => Prop::new("E (this prompt)", "—"),
            };
            if self.prompt().is_some() {
                i.props.insert(0, prop);
            }
            i
        });
        let vm = SkillsVm {
            route: Some(RouteVm {
                source: &source,
                state: &state,
                scores: &scores,
                editing: self.editing,
            }),
            info: info.as_ref(),
            ..self.vm()
        };
        use_vm(&vm)
    }

    pub fn render(&self, f: &mut Frame, area: Rect, _file: &CmfFile, theme: &Theme) {
        self.with_vm(|vm| view::render(f, area, vm, theme));
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
