//! State of the Masks view: which task, layer and field are selected, whether the bit
//! detail is open, and what is computed once when the file opens — per-layer counts of
//! every field and the Jaccard overlap between tasks. Bit fields come from the engine's
//! `MaskView`; nothing here reads tensor data.

use std::collections::BTreeMap;

use cortiq_engine::format::index::IndexEntry;
use cortiq_engine::format::masks::{BitField, MaskView};
use cortiq_engine::format::CmfFile;
use cortiq_views::masks::{
    self as view, BitDetail, BitGrid, Cell, Field, HeatMap, Hit, LayerRow, MasksVm, Overlap,
    TaskRow,
};
use cortiq_views::util::esc;
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::Frame;
use serde_json::Value;

use super::{Action, Ctx};
use crate::cli::common::{json_brief, ranges};

/// Tasks the overlap matrix compares (pairs grow quadratically; real files have a handful).
const MAX_OVERLAP: usize = 32;

pub struct MasksState {
    /// The file has a masks section.
    present: bool,
    title: String,
    tasks: Vec<TaskRow>,
    /// Fields `f` cycles through: experts only when some mask carries expert fields.
    fields: Vec<Field>,
    field: usize,
    /// One heat map and one overlap matrix per entry of `fields`.
    heat: Vec<HeatMap>,
    overlap: Vec<Overlap>,
    pub selected: usize,
    pub visit: usize,
    /// Columns of the heat map: the most visits any mask has.
    visits: usize,
    /// LOOP_MASKS rows: a column is a visit (layer × loop), not a layer.
    looped: bool,
    /// The sparse index (§7) summarised per task, for files that carry one.
    index: Vec<String>,
    /// Scroll of the bit detail, when it is open.
    detail: Option<u16>,
    /// The task the chat runs under (an index into the tasks), from the chat worker.
    pub active: Option<usize>,
}

impl MasksState {
    pub fn new(file: &CmfFile) -> MasksState {
        let n = file.masks.as_ref().map_or(0, |m| m.len());
        let views: Vec<MaskView<'_>> = (0..n).filter_map(|i| file.mask_view(i)).collect();
        let mut fields = vec![Field::Ffn, Field::Heads, Field::Gates];
        if views.iter().any(|v| v.layout.has_experts) {
            fields.push(Field::Experts);
        }
        let visits = views
            .iter()
            .map(|v| v.layout.visits as usize)
            .max()
            .unwrap_or(0);
        let title = match file
            .masks
            .as_ref()
            .and_then(|m| m.meta.default_task.as_ref())
        {
            Some(d) if views.iter().any(|v| &v.record.name == d) => {
                format!("tasks — {n} · default {}", esc(d))
            }
            // Worth seeing: the runtime has no mask of that name to fall back to.
            Some(d) => format!("tasks — {n} · default {} (not among them)", esc(d)),
            None => format!("tasks — {n}"),
        };
        MasksState {
            present: file.masks.is_some(),
            title,
            tasks: views.iter().map(task_row).collect(),
            heat: fields
                .iter()
                .map(|&f| heat_map(&views, f, visits))
                .collect(),
            overlap: fields.iter().map(|&f| overlap(&views, f)).collect(),
            fields,
            field: 0,
            selected: 0,
            visit: 0,
            visits,
            looped: views.iter().any(|v| v.layout.visits != v.layout.layers),
            index: file.index.as_deref().map(index_summary).unwrap_or_default(),
            detail: None,
            active: None,
        }
    }

    /// The chat worker's reports: which task the chat runs under.
    pub fn on_report(&mut self, r: &super::chat_worker::ChatReport) {
        if let super::chat_worker::ChatReport::Choice(c) = r {
            let active = &c.active;
            self.active = active.task.as_ref().and_then(|t| {
                // The section's index, checked against the name (rows are the section's).
                let row = self.tasks.get(t.index)?;
                (row.name == t.name).then_some(t.index)
            });
        }
    }

    /// The field the heat map and the overlap show.
    pub fn field(&self) -> Field {
        self.fields[self.field]
    }

    /// Counts of `field` for task `task` at `visit`, as the heat map shows them; `None`
    /// when the task has no such field (or no such row).
    pub fn cell(&self, field: Field, task: usize, visit: usize) -> Option<Cell> {
        let i = self.fields.iter().position(|&f| f == field)?;
        *self.heat[i].cells.get(task)?.get(visit)?
    }

    /// The Jaccard overlap of `field` between tasks `a` and `b`, as the matrix shows it.
    #[cfg(test)]
    pub fn jaccard(&self, field: Field, a: usize, b: usize) -> Option<f64> {
        let i = self.fields.iter().position(|&f| f == field)?;
        *self.overlap[i].values.get(a)?.get(b)?
    }

    #[cfg(test)]
    pub fn detail_open(&self) -> bool {
        self.detail.is_some()
    }

    pub fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        if !self.present || self.tasks.is_empty() {
            return;
        }
        let last_task = self.tasks.len() - 1;
        let last_visit = self.visits.saturating_sub(1);
        if let Some(scroll) = self.detail {
            let max = self.detail_max_scroll(ctx);
            let next = match a {
                Action::Back | Action::Enter => {
                    self.detail = None;
                    return;
                }
                Action::Left => {
                    self.visit = self.visit.saturating_sub(1);
                    scroll
                }
                Action::Right => {
                    self.visit = (self.visit + 1).min(last_visit);
                    scroll
                }
                a => super::scrolled(a, scroll, ctx.page as u16, max).unwrap_or(scroll),
            };
            // Bound after moving: another layer of another task may be shorter.
            self.detail = Some(next.min(self.detail_max_scroll(ctx)));
            return;
        }
        match a {
            Action::Up | Action::ScrollUp => self.selected = self.selected.saturating_sub(1),
            Action::Down | Action::ScrollDown => self.selected = (self.selected + 1).min(last_task),
            Action::PageUp => self.selected = self.selected.saturating_sub(ctx.page),
            Action::PageDown => self.selected = (self.selected + ctx.page).min(last_task),
            Action::Left => self.visit = self.visit.saturating_sub(1),
            Action::Right => self.visit = (self.visit + 1).min(last_visit),
            Action::Home => self.visit = 0,
            Action::End => self.visit = last_visit,
            Action::Cycle => self.field = (self.field + 1) % self.fields.len(),
            Action::Enter => self.detail = Some(0),
            Action::Click(x, y) => {
                match self.with_vm(ctx.file, |vm| view::hit(ctx.body, vm, *x, *y)) {
                    Some(Hit::Task(i)) => self.selected = i,
                    Some(Hit::Layer(v)) => self.visit = v,
                    Some(Hit::Cell { task, visit }) => {
                        self.selected = task;
                        self.visit = visit;
                    }
                    None => {}
                }
            }
            _ => {}
        }
    }

    fn detail_max_scroll(&self, ctx: &Ctx) -> u16 {
        let Some(d) = build_detail(ctx.file, self.selected, self.visit) else {
            return 0;
        };
        let h = view::detail_height(&d, ctx.body.width);
        h.saturating_sub(ctx.body.height.saturating_sub(2) as usize)
            .min(u16::MAX as usize) as u16
    }

    pub fn status(&self, _file: &CmfFile) -> (String, String) {
        if !self.present {
            return ("no masks section".into(), "o open another file".into());
        }
        let Some(task) = self.tasks.get(self.selected) else {
            return ("the masks section lists no task".into(), String::new());
        };
        let field = self.field();
        let counts = match self.cell(field, self.selected, self.visit) {
            Some(c) => format!(
                "{} {}/{} = {:.3}",
                field.short(),
                c.on,
                c.total,
                c.density()
            ),
            None => format!("no {} field", field.short()),
        };
        let left = format!(
            "{} · {} {} · {counts}",
            esc(&task.name),
            if self.looped { "visit" } else { "layer" },
            self.visit
        );
        let hint = if self.detail.is_some() {
            "←→ layer · ↑↓ scroll · Esc back"
        } else {
            "↑↓ task · ←→ layer · f field · Enter bits"
        };
        (left, hint.into())
    }

    /// Builds the view model (the selected task's facts and rows come from the file) and
    /// hands it to `use_vm`.
    fn with_vm<R>(&self, file: &CmfFile, use_vm: impl FnOnce(&MasksVm) -> R) -> R {
        let detail = self
            .detail
            .and_then(|s| build_detail(file, self.selected, self.visit).map(|d| (d, s)));
        let view_of = file.mask_view(self.selected);
        let info = view_of
            .as_ref()
            .map(|v| task_info(file, v))
            .unwrap_or_default();
        let layers = view_of.as_ref().map(layer_rows).unwrap_or_default();
        let vm = MasksVm {
            title: &self.title,
            tasks: &self.tasks,
            selected: self.selected,
            visit: self.visit,
            fields: &self.fields,
            heat: &self.heat[self.field],
            overlap: &self.overlap[self.field],
            info: &info,
            layers: &layers,
            detail: detail.as_ref().map(|(d, s)| (d, *s)),
            active: self.active,
        };
        use_vm(&vm)
    }

    pub fn render(&self, f: &mut Frame, area: Rect, file: &CmfFile, theme: &Theme) {
        if !self.present {
            view::render_absent(f, area, &self.index, theme);
            return;
        }
        self.with_vm(file, |vm| view::render(f, area, vm, theme));
    }
}

/// Physical layer of a row: LOOP_MASKS stores rows visit-major (§5.1), one layer per row
/// within each loop.
fn layer_of_visit(v: &MaskView<'_>, visit: u64) -> u64 {
    if v.layout.layers == 0 {
        visit
    } else {
        visit % v.layout.layers
    }
}

fn count(b: BitField<'_>) -> Cell {
    Cell {
        on: b.count_ones(),
        total: b.bits,
    }
}

fn field_cell(v: &MaskView<'_>, field: Field, visit: u64) -> Option<Cell> {
    match field {
        Field::Ffn => Some(count(v.ffn(visit))),
        Field::Heads => Some(count(v.heads(visit))),
        Field::Gates => Some(Cell {
            on: v.gates().get(layer_of_visit(v, visit)) as u64,
            total: 1,
        }),
        Field::Experts => v.experts(visit).map(count),
    }
}

fn heat_map(views: &[MaskView<'_>], field: Field, visits: usize) -> HeatMap {
    HeatMap {
        field,
        columns: (0..visits).map(|v| v.to_string()).collect(),
        cells: views
            .iter()
            .map(|v| {
                (0..v.layout.visits)
                    .map(|visit| field_cell(v, field, visit))
                    .collect()
            })
            .collect(),
    }
}

/// Every row of `field` in a mask, in blob order; `None` when the mask lacks the field.
fn field_rows<'a>(v: &MaskView<'a>, field: Field) -> Option<Vec<BitField<'a>>> {
    let visits = 0..v.layout.visits;
    match field {
        Field::Ffn => Some(visits.map(|x| v.ffn(x)).collect()),
        Field::Heads => Some(visits.map(|x| v.heads(x)).collect()),
        Field::Gates => Some(vec![v.gates()]),
        Field::Experts if v.layout.has_experts => visits.map(|x| v.experts(x)).collect(),
        Field::Experts => None,
    }
}

/// |A∩B| / |A∪B| over all rows; two empty sets are identical (1.0). `None` when the rows
/// differ in shape (masks of different layouts cannot be compared bit for bit).
fn jaccard(a: &[BitField<'_>], b: &[BitField<'_>]) -> Option<f64> {
    if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.bits != y.bits) {
        return None;
    }
    let (mut inter, mut union) = (0u64, 0u64);
    for (x, y) in a.iter().zip(b) {
        // Tail bits are zero (checked at open), so whole bytes can be compared.
        for (p, q) in x.bytes.iter().zip(y.bytes) {
            inter += (p & q).count_ones() as u64;
            union += (p | q).count_ones() as u64;
        }
    }
    Some(if union == 0 {
        1.0
    } else {
        inter as f64 / union as f64
    })
}

fn overlap(views: &[MaskView<'_>], field: Field) -> Overlap {
    let n = views.len().min(MAX_OVERLAP);
    let rows: Vec<Option<Vec<BitField<'_>>>> =
        views[..n].iter().map(|v| field_rows(v, field)).collect();
    let mut values = vec![vec![None; n]; n];
    for i in 0..n {
        for j in i..n {
            let jac = match (&rows[i], &rows[j]) {
                (Some(a), Some(b)) => jaccard(a, b),
                _ => None,
            };
            values[i][j] = jac;
            values[j][i] = jac;
        }
    }
    Overlap {
        field,
        values,
        left_out: views.len() - n,
    }
}

fn none_or(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "—".into(),
        Some(Value::String(s)) => esc(s),
        Some(v) => json_brief(v, 40),
    }
}

/// A quality contract in a few words: `null` is "not measured" (§5.1: never assumed 1.0).
pub(super) fn quality_short(q: Option<&Value>) -> String {
    match q {
        None | Some(Value::Null) => "not measured".into(),
        Some(Value::Object(m)) => match (m.get("metric"), m.get("value")) {
            (Some(metric), Some(value)) => {
                let mut s = format!("{} {}", none_or(Some(metric)), json_brief(value, 16));
                if let Some(b) = m.get("baseline_dense") {
                    s.push_str(&format!(" · baseline {}", json_brief(b, 12)));
                }
                if let Some(n) = m.get("n_samples") {
                    s.push_str(&format!(" · n={}", json_brief(n, 10)));
                }
                s
            }
            _ => quality_full(q),
        },
        Some(v) => json_brief(v, 60),
    }
}

/// Every key of a quality contract, `key value` joined by ` · `.
pub(super) fn quality_full(q: Option<&Value>) -> String {
    match q {
        None | Some(Value::Null) => "not measured".into(),
        Some(Value::Object(m)) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{} {}", esc(k), none_or(Some(v))))
            .collect::<Vec<_>>()
            .join(" · "),
        Some(v) => json_brief(v, 120),
    }
}

fn task_row(v: &MaskView<'_>) -> TaskRow {
    let r = v.record;
    TaskRow {
        task_id: r.task_id.to_string(),
        name: r.name.clone(),
        priority: r.priority.map_or("—".into(), |p| format!("{p:?}")),
        declared: r.sparsity.map_or("—".into(), |s| format!("{s:.3}")),
        measured: format!("{:.3}", v.ffn_sparsity()),
        quality: quality_short(r.quality.as_ref()),
        experts: r.has_expert_fields,
        parent: none_or(r.parent.as_ref()),
    }
}

/// Layers, groups and heads of a set of index entries.
fn index_line(entries: &[&IndexEntry]) -> String {
    let mut layers: Vec<u64> = entries.iter().map(|e| e.layer_idx as u64).collect();
    layers.sort_unstable();
    layers.dedup();
    let groups: usize = entries.iter().map(|e| e.groups.len()).sum();
    let heads: usize = entries.iter().map(|e| e.heads.len()).sum();
    format!(
        "layers {} · {groups} FFN groups of 32 · {heads} heads",
        ranges(layers)
    )
}

fn index_summary(entries: &[IndexEntry]) -> Vec<String> {
    let mut by_task: BTreeMap<u32, Vec<&IndexEntry>> = BTreeMap::new();
    for e in entries {
        by_task.entry(e.task_id).or_default().push(e);
    }
    let mut out = vec![format!(
        "sparse index (deprecated, §7): {} entries",
        entries.len()
    )];
    for (task, es) in by_task {
        out.push(format!("  task {task}: {}", index_line(&es)));
    }
    out
}

/// Active bits of every row of `field`, summed: `on/total`.
fn totals(v: &MaskView<'_>, field: Field) -> Option<String> {
    let rows = field_rows(v, field)?;
    let on: u64 = rows.iter().map(|b| b.count_ones()).sum();
    let total: u64 = rows.iter().map(|b| b.bits).sum();
    Some(format!("{} {on}/{total}", field.short()))
}

fn task_info(file: &CmfFile, v: &MaskView<'_>) -> Vec<(String, String)> {
    let r = v.record;
    let l = v.layout;
    let mut out = vec![
        (
            "description".to_string(),
            r.description.clone().unwrap_or_else(|| "—".into()),
        ),
        ("quality".into(), quality_full(r.quality.as_ref())),
    ];
    if !matches!(r.parent, None | Some(Value::Null)) {
        out.push(("parent".into(), none_or(r.parent.as_ref())));
    }
    let loops = if l.layers > 0 && l.visits != l.layers {
        format!(" × {} loops", l.visits / l.layers)
    } else {
        String::new()
    };
    let experts = if l.has_experts {
        format!(" · experts {}", l.experts)
    } else {
        String::new()
    };
    out.push((
        "layout".into(),
        format!(
            "{} layers{loops} · FFN {} · heads {}{experts}",
            l.layers, l.intermediate, l.heads
        ),
    ));
    let active: Vec<String> = [Field::Ffn, Field::Heads, Field::Gates, Field::Experts]
        .into_iter()
        .filter_map(|f| totals(v, f))
        .collect();
    out.push(("active bits".into(), active.join(" · ")));
    out.push((
        "blob".into(),
        format!(
            "offset {} · {} bytes · hot pack {}",
            r.blob_off,
            r.blob_len,
            if r.has_hot_pack { "yes" } else { "no" }
        ),
    ));
    for (k, val) in &r.extra {
        out.push((esc(k), json_brief(val, 80)));
    }
    if let Some(index) = &file.index {
        let mine: Vec<&IndexEntry> = index.iter().filter(|e| e.task_id == r.task_id).collect();
        out.push((
            "sparse index".into(),
            if mine.is_empty() {
                "no entries for this task (deprecated §7)".into()
            } else {
                format!("{} (deprecated §7)", index_line(&mine))
            },
        ));
    }
    out
}

fn layer_rows(v: &MaskView<'_>) -> Vec<LayerRow> {
    let l = v.layout;
    let gates = v.gates();
    (0..l.visits)
        .map(|visit| {
            let layer = layer_of_visit(v, visit);
            let heads = v.heads(visit);
            LayerRow {
                label: if l.visits != l.layers {
                    format!("{visit}={layer}")
                } else {
                    visit.to_string()
                },
                gate: gates.get(layer),
                ffn: count(v.ffn(visit)),
                heads: count(heads),
                head_list: ranges_or_none(heads.ones()),
                experts: v
                    .experts(visit)
                    .map(|e| (count(e), ranges_or_none(e.ones()))),
            }
        })
        .collect()
}

fn ranges_or_none(items: impl IntoIterator<Item = u64>) -> String {
    let s = ranges(items);
    if s.is_empty() {
        "none".into()
    } else {
        s
    }
}

fn grid(title: &str, b: BitField<'_>, summary: String) -> BitGrid {
    BitGrid {
        title: title.into(),
        summary,
        bits: (0..b.bits).map(|i| b.get(i)).collect(),
    }
}

/// Task `task` at row `visit`, bit by bit; `None` when the task does not exist.
pub(super) fn build_detail(file: &CmfFile, task: usize, visit: usize) -> Option<BitDetail> {
    let v = file.mask_view(task)?;
    let (r, l) = (v.record, v.layout);
    let visit = visit as u64;
    let mut heading = format!("{} (task {})", r.name, r.task_id);
    if visit >= l.visits {
        return Some(BitDetail {
            heading,
            grids: Vec::new(),
            notes: vec![(
                "rows".into(),
                format!("this task has {} rows; row {visit} is past them", l.visits),
            )],
        });
    }
    let layer = layer_of_visit(&v, visit);
    if l.visits != l.layers {
        heading.push_str(&format!(
            " · visit {visit} = layer {layer}, loop {}",
            visit / l.layers.max(1)
        ));
    } else {
        heading.push_str(&format!(" · layer {layer}"));
    }
    let ffn = v.ffn(visit);
    let heads = v.heads(visit);
    let mut grids = vec![
        grid(
            "FFN neurons",
            ffn,
            format!(
                "{} of {} active ({:.3}) · {} masked out",
                ffn.count_ones(),
                ffn.bits,
                ffn.density(),
                ffn.bits - ffn.count_ones()
            ),
        ),
        grid(
            "attention heads",
            heads,
            format!(
                "{} of {} active: {}",
                heads.count_ones(),
                heads.bits,
                ranges_or_none(heads.ones())
            ),
        ),
    ];
    let mut notes = Vec::new();
    match v.experts(visit) {
        Some(e) => {
            let full = if e.count_ones() == e.bits {
                " — a full row restricts nothing"
            } else {
                ""
            };
            grids.push(grid(
                "MoE experts",
                e,
                format!(
                    "{} of {} routable: {}{full}",
                    e.count_ones(),
                    e.bits,
                    ranges_or_none(e.ones())
                ),
            ));
        }
        None if l.experts > 0 => notes.push((
            "MoE experts".into(),
            "this mask has no expert fields: routing is not narrowed".into(),
        )),
        None => {}
    }
    let gates = v.gates();
    let all_gates = if gates.bits <= 128 {
        let dots: String = (0..gates.bits)
            .map(|i| if gates.get(i) { '●' } else { '·' })
            .collect();
        format!(" · all layers {dots}")
    } else {
        format!(" · {} of {} layers on", gates.count_ones(), gates.bits)
    };
    notes.push((
        "layer gate".into(),
        format!(
            "layer {layer} {}{all_gates}",
            if gates.get(layer) { "on" } else { "off" }
        ),
    ));
    if let Some(index) = &file.index {
        notes.push((
            "sparse index".into(),
            index_check(index, r.task_id, layer, ffn, heads),
        ));
    }
    Some(BitDetail {
        heading,
        grids,
        notes,
    })
}

/// The §7 entry of (task, layer) against the bits it was derived from: a group of 32
/// neurons is active when any of its bits is.
fn index_check(
    index: &[IndexEntry],
    task_id: u32,
    layer: u64,
    ffn: BitField<'_>,
    heads: BitField<'_>,
) -> String {
    let Some(e) = index
        .iter()
        .find(|e| e.task_id == task_id && e.layer_idx as u64 == layer)
    else {
        return "no entry for this task and layer (deprecated §7)".into();
    };
    let groups: Vec<u64> = (0..ffn.bits.div_ceil(32))
        .filter(|g| (g * 32..((g + 1) * 32).min(ffn.bits)).any(|i| ffn.get(i)))
        .collect();
    let bit_heads: Vec<u64> = heads.ones().collect();
    let entry_groups: Vec<u64> = e.groups.iter().map(|&g| g as u64).collect();
    let entry_heads: Vec<u64> = e.heads.iter().map(|&h| h as u64).collect();
    let text = format!(
        "{} FFN groups ({}) · heads {}",
        entry_groups.len(),
        ranges_or_none(entry_groups.iter().copied()),
        ranges_or_none(entry_heads.iter().copied())
    );
    if groups == entry_groups && bit_heads == entry_heads {
        format!("{text} — agrees with these bits")
    } else {
        format!(
            "{text} — differs from these bits (groups {}, heads {})",
            ranges_or_none(groups),
            ranges_or_none(bit_heads)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{fixture, Harness};
    use super::super::{Action, Screen};
    use super::*;

    fn masks(h: &Harness) -> &MasksState {
        match &h.app.screen {
            Screen::Model(m) => &m.masks,
            _ => panic!("no model open"),
        }
    }

    fn on_masks_tab(h: &mut Harness) -> &mut Harness {
        h.act(Action::GoTab(2))
    }

    /// A copy of the dense `qwen3-q4.cmf` with a masks section of our own making:
    /// "all" (every bit set) and "none" (no FFN neuron, heads 0 and 2, gates off on odd
    /// layers), `loops` visits per layer (LOOP_MASKS when more than one).
    fn with_masks(dir: &std::path::Path, loops: u64) -> std::path::PathBuf {
        use cortiq_engine::format::masks::{build_section, MaskRecord};
        use cortiq_engine::format::writer::{spec_of, write_file};
        let base = CmfFile::open(fixture("qwen3-q4.cmf")).unwrap();
        let arch = base.header.arch.clone().unwrap();
        let (ffn, heads, layers) = (
            arch.intermediate_size.unwrap(),
            arch.num_attention_heads.unwrap(),
            arch.num_layers,
        );
        let visits = layers * loops;
        let blob = |ffn_byte: u8, head_bits: u8, gates: &dyn Fn(u64) -> bool| {
            let mut b = Vec::new();
            for _ in 0..visits {
                b.extend(vec![ffn_byte; ffn.div_ceil(8) as usize]);
            }
            for _ in 0..visits {
                let mut row = vec![0u8; heads.div_ceil(8) as usize];
                for h in 0..heads.min(8) {
                    if head_bits & (1 << h) != 0 {
                        row[0] |= 1 << h;
                    }
                }
                b.extend(row);
            }
            let mut g = vec![0u8; layers.div_ceil(8) as usize];
            for l in 0..layers {
                if gates(l) {
                    g[(l / 8) as usize] |= 1 << (l % 8);
                }
            }
            b.extend(g);
            b
        };
        let all_heads = ((1u16 << heads.min(8)) - 1) as u8;
        let records = vec![
            MaskRecord {
                task_id: 0,
                name: "all".into(),
                ..Default::default()
            },
            MaskRecord {
                task_id: 7,
                // A hostile name: the escape sequence must reach the screen as text.
                name: "none\u{1b}[2J".into(),
                quality: Some(serde_json::json!({
                    "metric": "heldout_ppl_ratio", "value": 0.97,
                    "baseline_dense": 6.1, "n_samples": 512
                })),
                ..Default::default()
            },
        ];
        let blobs = vec![
            blob(0xff, all_heads, &|_| true),
            blob(0x00, 0b101, &|l| l % 2 == 0),
        ];
        let mut spec = spec_of(&base);
        spec.masks = Some(build_section(Some("all".into()), records, &blobs));
        if loops > 1 {
            spec.extra_features |= cortiq_engine::format::feature::LOOP_MASKS;
        }
        let out = dir.join(format!("masked-{loops}.cmf"));
        let payloads: Vec<&[u8]> = base
            .directory
            .iter()
            .map(|e| base.tensor_bytes(e))
            .collect();
        write_file(&out, spec, payloads).unwrap();
        out
    }

    #[test]
    fn moe_masked_heat_map_for_ffn_and_experts() {
        let mut h = Harness::fixture("qwen3_moe-masked.cmf");
        on_masks_tab(&mut h);
        let screen = h.render();
        insta::assert_snapshot!("masks_moe_ffn", screen);
        assert!(screen.contains("not measured"), "{screen}");
        assert_eq!(masks(&h).field(), Field::Ffn);
        // f: FFN → heads → gates → experts (this file's mask has expert fields).
        h.act(Action::Cycle);
        assert_eq!(masks(&h).field(), Field::Heads);
        h.act(Action::Cycle);
        assert_eq!(masks(&h).field(), Field::Gates);
        h.act(Action::Cycle);
        assert_eq!(masks(&h).field(), Field::Experts);
        let screen = h.render();
        insta::assert_snapshot!("masks_moe_experts", screen);
        // The expert rows of "code" are the bytes 13 8a 38 12 after the gates: experts
        // {0,1,4}, {1,3,7}, {3,4,5}, {1,4} of 8.
        let m = masks(&h);
        let want = [3u64, 3, 3, 2];
        for (layer, &on) in want.iter().enumerate() {
            let c = m
                .cell(Field::Experts, 0, layer)
                .expect("code has expert fields");
            assert_eq!((c.on, c.total), (on, 8), "layer {layer}");
        }
        // Independent check: 11 of 32 routable = the meta's declared sparsity 0.65625.
        let on: u64 = want.iter().sum();
        assert_eq!(1.0 - on as f64 / 32.0, 0.65625);
        let code_row = screen
            .lines()
            .find(|l| l.contains("▶ code") && l.contains('▒'))
            .expect("heat-map row of code");
        assert_eq!(code_row.matches("3▒").count(), 3, "{code_row}");
        assert_eq!(code_row.matches("2░").count(), 1, "{code_row}");
        h.act(Action::Cycle);
        assert_eq!(masks(&h).field(), Field::Ffn, "experts is the last field");
        assert_eq!(masks(&h).jaccard(Field::Experts, 0, 0), Some(1.0));
    }

    #[test]
    fn bit_detail_of_one_layer() {
        let mut h = Harness::fixture("qwen3_moe-masked.cmf");
        on_masks_tab(&mut h).acts([Action::Right, Action::Right, Action::Enter]);
        assert!(masks(&h).detail_open());
        let screen = h.render();
        insta::assert_snapshot!("masks_moe_detail_layer2", screen);
        assert!(screen.contains("code (task 1) · layer 2"), "{screen}");
        assert!(screen.contains("128 of 128 active"), "{screen}");
        assert!(screen.contains("3 of 8 routable: 3-5"), "{screen}");
        assert!(screen.contains("···●●●··"), "{screen}");
        assert!(screen.contains("agrees with these bits"), "{screen}");
        // ←→ move through layers inside the detail; Esc leaves it.
        h.act(Action::Right);
        assert!(h.render().contains("2 of 8 routable: 1,4"));
        h.act(Action::Back);
        assert!(!masks(&h).detail_open());
        assert!(h.render().contains("heat map"));
    }

    #[test]
    fn demo_heat_map_and_overlap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.cmf");
        cortiq_engine::synth::write_demo(&path).unwrap();
        let mut h = Harness::open(&path);
        on_masks_tab(&mut h).act(Action::Down);
        let screen = h.render();
        insta::assert_snapshot!("masks_demo_ffn", screen);
        let m = masks(&h);
        for i in 0..3 {
            assert_eq!(m.jaccard(Field::Ffn, i, i), Some(1.0), "task {i}");
            assert_eq!(m.jaccard(Field::Heads, i, i), Some(1.0), "task {i}");
        }
        // "general" has every neuron: its overlap with another task is that task's density
        // over all layers.
        for other in [1, 2] {
            let (on, total) = (0..6).fold((0, 0), |(o, t), l| {
                let c = m.cell(Field::Ffn, other, l).unwrap();
                (o + c.on, t + c.total)
            });
            let j = m.jaccard(Field::Ffn, 0, other).unwrap();
            assert!((j - on as f64 / total as f64).abs() < 1e-12, "{j}");
            assert_eq!(m.jaccard(Field::Ffn, other, 0), Some(j));
        }
        let j = m.jaccard(Field::Ffn, 1, 2).unwrap();
        assert!(j > 0.2 && j < 0.8, "code vs chat overlap {j}");
        // Experts: only "code" has them; the others show "—" in the map and the matrix.
        h.acts([Action::Cycle, Action::Cycle, Action::Cycle]);
        let screen = h.render();
        insta::assert_snapshot!("masks_demo_experts_overlap", screen);
        let m = masks(&h);
        assert_eq!(m.field(), Field::Experts);
        assert_eq!(m.jaccard(Field::Experts, 1, 1), Some(1.0));
        assert_eq!(m.jaccard(Field::Experts, 0, 1), None);
        assert_eq!(m.cell(Field::Experts, 0, 0), None);
        assert!(screen.contains("—"), "{screen}");
        // The bits of "code" at layer 3: half the FFN neurons, 3 of 8 experts.
        h.acts([Action::Right, Action::Right, Action::Right, Action::Enter]);
        let screen = h.render();
        insta::assert_snapshot!("masks_demo_detail_code_layer3", screen);
        assert!(screen.contains("134 of 256 active (0.523)"), "{screen}");
        assert!(screen.contains("3 of 8 routable: 1-3"), "{screen}");
    }

    #[test]
    fn a_file_without_masks_says_so() {
        let mut h = Harness::fixture("qwen3-q4.cmf");
        on_masks_tab(&mut h);
        // No task, no field: keys do nothing and nothing panics.
        h.acts([
            Action::Down,
            Action::Right,
            Action::Cycle,
            Action::Enter,
            Action::End,
        ]);
        let screen = h.render();
        insta::assert_snapshot!("masks_absent", screen);
        assert!(
            screen.contains("this file has no masks section"),
            "{screen}"
        );
        assert!(screen.contains("no masks section"), "{screen}");
    }

    #[test]
    fn without_expert_fields_cycle_skips_experts() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Harness::open(&with_masks(dir.path(), 1));
        on_masks_tab(&mut h);
        let mut seen = Vec::new();
        for _ in 0..8 {
            seen.push(masks(&h).field());
            h.act(Action::Cycle);
        }
        assert!(!seen.contains(&Field::Experts), "{seen:?}");
        assert!(seen.contains(&Field::Gates), "{seen:?}");
        let m = masks(&h);
        // An empty field overlaps itself fully; with a full one, not at all.
        assert_eq!(m.jaccard(Field::Ffn, 1, 1), Some(1.0));
        assert_eq!(m.jaccard(Field::Ffn, 0, 1), Some(0.0));
        assert_eq!(m.jaccard(Field::Heads, 0, 1), Some(0.5));
        let screen = h.render();
        assert!(
            screen.contains("heldout_ppl_ratio 0.97 · baseline 6.1 · n=512"),
            "{screen}"
        );
        assert!(screen.contains("none\\u{1b}[2J"), "{screen}");
        assert!(!screen.contains('\u{1b}'), "{screen}");
        assert!(
            screen.contains("· "),
            "an empty cell reads as '·': {screen}"
        );
    }

    #[test]
    fn loop_masks_columns_are_visits() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Harness::open(&with_masks(dir.path(), 2));
        on_masks_tab(&mut h);
        let layers = match &h.app.screen {
            Screen::Model(m) => m.file.header.arch.as_ref().unwrap().num_layers as usize,
            _ => unreachable!(),
        };
        // Gates of "none": off on odd layers, in both loops.
        h.acts([Action::Down, Action::Cycle, Action::Cycle]);
        let m = masks(&h);
        assert_eq!(m.field(), Field::Gates);
        for visit in 0..2 * layers {
            let c = m.cell(Field::Gates, 1, visit).unwrap();
            assert_eq!(c.on, (visit % layers % 2 == 0) as u64, "visit {visit}");
        }
        for _ in 0..layers + 1 {
            h.act(Action::Right);
        }
        h.act(Action::Enter);
        let screen = h.render();
        assert!(
            screen.contains(&format!("visit {} = layer 1, loop 1", layers + 1)),
            "{screen}"
        );
        assert!(screen.contains("layer 1 off"), "{screen}");
        assert!(screen.contains("0 of "), "{screen}");
    }

    #[test]
    fn colour_changes_no_text_and_any_size_renders() {
        let dir = tempfile::tempdir().unwrap();
        let demo = dir.path().join("demo.cmf");
        cortiq_engine::synth::write_demo(&demo).unwrap();
        let files = [
            demo,
            fixture("qwen3_moe-masked.cmf"),
            fixture("qwen3-q4.cmf"),
            with_masks(dir.path(), 2),
        ];
        for path in &files {
            let mut h = Harness::open(path);
            on_masks_tab(&mut h).acts([Action::Down, Action::Right, Action::Cycle]);
            // The heat map reads the same without colour: colour only adds to the glyphs.
            // (The legend alone grows a colour ramp.)
            let text = |screen: String| -> Vec<String> {
                screen
                    .lines()
                    .filter(|l| !l.contains("cell: tenths"))
                    .map(str::to_string)
                    .collect()
            };
            let plain = text(h.render());
            h.app.theme = Theme::dark();
            assert_eq!(text(h.render()), plain, "{}", path.display());
            for (w, ht) in [(20, 6), (50, 12), (200, 60), (3, 3)] {
                h.width = w;
                h.height = ht;
                h.render();
                for (x, y) in [(1, 2), (5, 4), (w / 2, ht / 2), (w - 1, ht - 1)] {
                    h.act(Action::Click(x, y));
                }
                h.act(Action::Enter).act(Action::End).act(Action::Right);
                h.render();
                h.act(Action::Back);
            }
        }
    }

    #[test]
    fn many_layers_scroll_by_pages_of_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deep.cmf");
        let cfg = cortiq_engine::synth::DemoConfig {
            layers: 48,
            ..cortiq_engine::synth::DemoConfig::tiny()
        };
        cortiq_engine::synth::write_demo_with(&path, &cfg).unwrap();
        let mut h = Harness::open(&path);
        on_masks_tab(&mut h);
        let screen = h.render();
        assert!(screen.contains("columns 0–"), "{screen}");
        h.act(Action::End);
        assert_eq!(masks(&h).visit, 47);
        let screen = h.render();
        assert!(screen.contains("▾47"), "{screen}");
        assert!(screen.contains("of 48"), "{screen}");
        assert!(!screen.contains("▾0 "), "{screen}");
        h.act(Action::Right);
        assert_eq!(masks(&h).visit, 47, "the last layer stays selected");
    }

    #[test]
    fn a_click_on_a_heat_cell_selects_task_and_layer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.cmf");
        cortiq_engine::synth::write_demo(&path).unwrap();
        let mut h = Harness::open(&path);
        on_masks_tab(&mut h);
        let screen = h.render();
        // The cell of "chat" under the column labelled 4.
        let (y, row) = screen
            .lines()
            .enumerate()
            .find(|(_, l)| l.starts_with("│  chat"))
            .expect("heat row of chat");
        let header = screen.lines().nth(y - 3).unwrap();
        let col = header.find(" 4 ").expect("column 4") + 1;
        let x = header[..col].chars().count() as u16;
        assert!(row.chars().nth(x as usize).is_some());
        h.act(Action::Click(x, y as u16));
        assert_eq!((masks(&h).selected, masks(&h).visit), (2, 4));
        // A click on a row of the task table selects that task.
        let y = screen.lines().position(|l| l.contains("Fallback")).unwrap();
        h.act(Action::Click(10, y as u16));
        assert_eq!(masks(&h).selected, 0);
    }
}
