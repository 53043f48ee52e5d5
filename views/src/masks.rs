//! View 3, Masks: every task with its meta and quality contract, a heat map of per-layer
//! density (tasks × layers) for one bit field at a time, the overlap (Jaccard) between
//! tasks, and — on Enter — one task's bits at one layer drawn dot by dot.
//!
//! Heat cells carry a colour *and* text (a tenths digit and a shade glyph), so the map
//! reads the same under NO_COLOR as in colour.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::Frame;

use crate::skills::wrap_words;
use crate::theme::{heat_glyph, Theme};
use crate::util::{esc, pad, pad_left, page_start, truncate};

/// The bit field a heat map or an overlap matrix shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    Ffn,
    Heads,
    Gates,
    Experts,
}

impl Field {
    pub fn title(self) -> &'static str {
        match self {
            Field::Ffn => "FFN neurons",
            Field::Heads => "attention heads",
            Field::Gates => "layer gates",
            Field::Experts => "MoE experts",
        }
    }
    pub fn short(self) -> &'static str {
        match self {
            Field::Ffn => "FFN",
            Field::Heads => "heads",
            Field::Gates => "gates",
            Field::Experts => "experts",
        }
    }
}

/// Active bits out of a field's bits, for one task at one layer (visit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    pub on: u64,
    pub total: u64,
}

impl Cell {
    /// As the engine's `BitField::density`: an empty field restricts nothing, so it counts
    /// as fully active.
    pub fn density(self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            self.on as f64 / self.total as f64
        }
    }
}

/// One task of the masks meta, already formatted.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRow {
    pub task_id: String,
    pub name: String,
    pub priority: String,
    /// Declared `sparsity` of the meta, or `—`.
    pub declared: String,
    /// Share of FFN neurons the bits mask out.
    pub measured: String,
    /// `not measured` for a null contract.
    pub quality: String,
    pub experts: bool,
    pub parent: String,
}

/// Densities of one field: `cells[task][visit]`, `None` where the task lacks the field.
#[derive(Clone, Debug, PartialEq)]
pub struct HeatMap {
    pub field: Field,
    /// Column labels (layer numbers, or visit numbers under LOOP_MASKS).
    pub columns: Vec<String>,
    pub cells: Vec<Vec<Option<Cell>>>,
}

/// Jaccard overlap of one field between tasks; `None` where the two cannot be compared.
#[derive(Clone, Debug, PartialEq)]
pub struct Overlap {
    pub field: Field,
    pub values: Vec<Vec<Option<f64>>>,
    /// Tasks left out of the matrix (it covers the first `values.len()` only).
    pub left_out: usize,
}

/// One bit field drawn dot by dot.
#[derive(Clone, Debug, PartialEq)]
pub struct BitGrid {
    pub title: String,
    pub summary: String,
    pub bits: Vec<bool>,
}

/// The per-layer detail of one task.
#[derive(Clone, Debug, PartialEq)]
pub struct BitDetail {
    pub heading: String,
    pub grids: Vec<BitGrid>,
    /// Further facts (`gate`, `sparse index`, a missing field), key and text.
    pub notes: Vec<(String, String)>,
}

/// One row (layer, or visit under LOOP_MASKS) of the selected task.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerRow {
    pub label: String,
    pub gate: bool,
    pub ffn: Cell,
    pub heads: Cell,
    /// Active heads as ranges (`0-3`).
    pub head_list: String,
    /// Routable experts and their ranges, when the mask has expert fields.
    pub experts: Option<(Cell, String)>,
}

pub struct MasksVm<'a> {
    pub title: &'a str,
    pub tasks: &'a [TaskRow],
    pub selected: usize,
    pub visit: usize,
    /// Fields `f` cycles through, in order; the current one is `heat.field`.
    pub fields: &'a [Field],
    pub heat: &'a HeatMap,
    pub overlap: &'a Overlap,
    /// The selected task's facts: key, text.
    pub info: &'a [(String, String)],
    /// The selected task's rows, layer by layer.
    pub layers: &'a [LayerRow],
    pub detail: Option<(&'a BitDetail, u16)>,
    /// The task the chat runs under (an index into `tasks`): marked `●`.
    pub active: Option<usize>,
}

const SET: char = '●';
const UNSET: char = '·';

/// What a file without a masks section shows (and its deprecated sparse index, if any).
pub fn render_absent(f: &mut Frame, area: Rect, index: &[String], theme: &Theme) {
    let mut lines = vec![
        Line::styled("this file has no masks section", theme.title),
        Line::raw(""),
        Line::raw("Task masks (§5) are bit fields over FFN neurons, attention heads, layer"),
        Line::raw("gates and MoE experts that select a subset of the shared weights per task."),
        Line::raw("Every layer of this model runs dense."),
    ];
    if !index.is_empty() {
        lines.push(Line::raw(""));
        lines.extend(index.iter().map(|l| Line::raw(esc(l))));
    }
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" masks ")),
        area,
    );
}

/// Where the panels of the heat-map screen go.
struct Panels {
    tasks: Rect,
    heat: Rect,
    layers: Rect,
    info: Rect,
    overlap: Rect,
}

fn panels(area: Rect, vm: &MasksVm) -> Panels {
    let n = vm.tasks.len();
    let shown = n.clamp(1, 8) as u16;
    // Heat rows: header, tasks, legend.
    let heat_h = n.clamp(1, 12) as u16 + 4;
    let [tasks, heat, bottom] = Layout::vertical([
        Constraint::Length(shown + 3),
        Constraint::Length(heat_h),
        Constraint::Min(6),
    ])
    .areas(area);
    // At least 40 columns for the table, at most 55 % of the width (even when narrow).
    let left_w = (layers_width(vm) as u16).max(40).min(area.width * 55 / 100);
    let [layers, right] =
        Layout::horizontal([Constraint::Length(left_w), Constraint::Min(30)]).areas(bottom);
    let info_h = info_height(vm, right.width.saturating_sub(2)) + 2;
    let [info, overlap] =
        Layout::vertical([Constraint::Length(info_h), Constraint::Min(4)]).areas(right);
    Panels {
        tasks,
        heat,
        layers,
        info,
        overlap,
    }
}

pub fn render(f: &mut Frame, area: Rect, vm: &MasksVm, theme: &Theme) {
    if let Some((detail, scroll)) = vm.detail {
        render_detail(f, area, detail, scroll, theme);
        return;
    }
    let p = panels(area, vm);
    render_tasks(f, p.tasks, vm, theme);
    render_heat(f, p.heat, vm, theme);
    render_layers(f, p.layers, vm, theme);
    render_info(f, p.info, vm, theme);
    render_overlap(f, p.overlap, vm, theme);
}

/// What a mouse click at (`x`, `y`) lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hit {
    Task(usize),
    Layer(usize),
    Cell { task: usize, visit: usize },
}

/// The row of a bordered panel with one heading line that `y` is on, if any.
fn panel_row(r: Rect, y: u16) -> Option<usize> {
    (y >= r.y + 2 && y + 1 < r.y + r.height).then(|| (y - r.y - 2) as usize)
}

/// Hit-testing for clicks, from the same layout `render` draws (the detail takes none).
pub fn hit(area: Rect, vm: &MasksVm, x: u16, y: u16) -> Option<Hit> {
    if vm.detail.is_some() {
        return None;
    }
    let p = panels(area, vm);
    let inside = |r: Rect| x > r.x && x + 1 < r.x + r.width && y >= r.y && y < r.y + r.height;
    if inside(p.tasks) {
        let row = panel_row(p.tasks, y)?;
        let h = p.tasks.height.saturating_sub(3) as usize;
        let i = page_start(vm.selected, h) + row;
        return (i < vm.tasks.len()).then_some(Hit::Task(i));
    }
    if inside(p.layers) {
        let row = panel_row(p.layers, y)?;
        let h = p.layers.height.saturating_sub(3) as usize;
        let i = page_start(vm.visit, h) + row;
        return (i < vm.layers.len()).then_some(Hit::Layer(i));
    }
    if inside(p.heat) {
        let g = heat_geometry(p.heat, vm);
        let row = panel_row(p.heat, y)?;
        if row >= g.rows_h {
            return None;
        }
        let task = g.first_row + row;
        let dx = (x - p.heat.x - 1) as usize;
        if task >= vm.tasks.len() {
            return None;
        }
        if dx < g.name_w {
            return Some(Hit::Task(task));
        }
        let visit = g.first_col + (dx - g.name_w) / g.cw;
        return (visit < vm.heat.columns.len() && visit < g.first_col + g.visible)
            .then_some(Hit::Cell { task, visit });
    }
    None
}

/// Column widths of the per-layer table: label, FFN count, heads, experts.
struct LayerWidths {
    label: usize,
    ffn: usize,
    heads: usize,
    experts: Option<usize>,
}

/// Under LOOP_MASKS a row is a visit: its label reads `visit=layer`.
fn layer_heading(vm: &MasksVm) -> &'static str {
    if vm.layers.iter().any(|r| r.label.contains('=')) {
        "visit=layer"
    } else {
        "layer"
    }
}

fn count_text(c: Cell) -> String {
    format!("{}/{}", c.on, c.total)
}

fn layer_widths(vm: &MasksVm) -> LayerWidths {
    let max = |f: &dyn Fn(&LayerRow) -> usize, least: usize| {
        vm.layers.iter().map(f).max().unwrap_or(least).max(least)
    };
    LayerWidths {
        label: max(&|r| r.label.chars().count(), layer_heading(vm).len()),
        ffn: max(&|r| count_text(r.ffn).len(), 3),
        heads: max(
            &|r| count_text(r.heads).len() + 1 + r.head_list.chars().count(),
            5,
        ),
        experts: vm.layers.iter().any(|r| r.experts.is_some()).then(|| {
            max(
                &|r| {
                    r.experts
                        .as_ref()
                        .map_or(1, |(c, l)| count_text(*c).len() + 1 + l.chars().count())
                },
                7,
            )
        }),
    }
}

/// The natural width of the per-layer table, borders included.
fn layers_width(vm: &MasksVm) -> usize {
    let w = layer_widths(vm);
    2 + w.label + 2 + 4 + 2 + w.ffn + 2 + 5 + 3 + w.heads + w.experts.map_or(0, |e| 2 + e) + 3
}

/// Rows the info panel needs at `width` once long values wrap.
fn info_height(vm: &MasksVm, width: u16) -> u16 {
    let value_w = (width as usize).saturating_sub(info_key_width(vm) + 1);
    vm.info
        .iter()
        .map(|(_, v)| wrap_words(&esc(v), value_w).len())
        .sum::<usize>() as u16
}

fn info_key_width(vm: &MasksVm) -> usize {
    vm.info
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0)
        .min(14)
}

fn render_layers(f: &mut Frame, area: Rect, vm: &MasksVm, theme: &Theme) {
    let widths = layer_widths(vm);
    let label_w = widths.label;
    let ffn_w = widths.ffn;
    let heads_w = widths.heads;
    let with_experts = widths.experts.is_some();
    let count = count_text;
    let mut header = format!(
        "  {}  gate  {}   {}",
        pad_left(layer_heading(vm), label_w),
        pad("FFN active", ffn_w + 2 + 5),
        pad("heads", heads_w)
    );
    if with_experts {
        header.push_str("  experts");
    }
    let mut lines = vec![Line::styled(header, theme.dim)];
    let h = area.height.saturating_sub(3) as usize;
    let start = page_start(vm.visit, h);
    for (i, r) in vm.layers.iter().enumerate().skip(start).take(h) {
        let sel = i == vm.visit;
        let mut text = format!(
            "{}{}  {}  {}  {:.3}   {}",
            if sel { "▶ " } else { "  " },
            pad_left(&r.label, label_w),
            if r.gate { "on  " } else { "off " },
            pad_left(&count(r.ffn), ffn_w),
            r.ffn.density(),
            pad(&format!("{} {}", count(r.heads), r.head_list), heads_w),
        );
        if with_experts {
            match &r.experts {
                Some((c, list)) => text.push_str(&format!("  {} {list}", count(*c))),
                None => text.push_str("  —"),
            }
        }
        lines.push(if sel {
            Line::styled(text, theme.selected)
        } else {
            Line::raw(text)
        });
    }
    let title = vm
        .tasks
        .get(vm.selected)
        .map(|t| format!(" {} layer by layer — Enter: bits ", esc(&t.name)))
        .unwrap_or_default();
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

fn render_tasks(f: &mut Frame, area: Rect, vm: &MasksVm, theme: &Theme) {
    let name_w = vm
        .tasks
        .iter()
        .map(|t| esc(&t.name).chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 20);
    let inner_w = area.width.saturating_sub(2) as usize;
    // marker, id, name, priority, sparsity, measured, experts, parent: the rest is quality.
    let fixed = 2 + 5 + name_w + 2 + 10 + 10 + 10 + 9 + 12;
    let quality_w = inner_w.saturating_sub(fixed).max(12);
    let row = |marker: &str,
               id: &str,
               name: &str,
               prio: &str,
               decl: &str,
               meas: &str,
               qual: &str,
               exp: &str,
               parent: &str| {
        format!(
            "{marker}{} {}  {}{}{}  {}{}{}",
            pad_left(id, 4),
            pad(name, name_w),
            pad(prio, 10),
            pad_left(decl, 8),
            pad_left(meas, 10),
            pad(qual, quality_w),
            pad(exp, 9),
            truncate(parent, 12),
        )
    };
    let mut lines = vec![Line::styled(
        row(
            "  ", "id", "name", "priority", "declared", "measured", "quality", "experts", "parent",
        ),
        theme.dim,
    )];
    let h = area.height.saturating_sub(3) as usize;
    let start = page_start(vm.selected, h);
    for (i, t) in vm.tasks.iter().enumerate().skip(start).take(h) {
        let sel = i == vm.selected;
        let text = row(
            match (sel, vm.active == Some(i)) {
                (true, true) => "▶●",
                (true, false) => "▶ ",
                (false, true) => " ●",
                (false, false) => "  ",
            },
            &t.task_id,
            &esc(&t.name),
            &t.priority,
            &t.declared,
            &t.measured,
            &esc(&t.quality),
            if t.experts { "yes" } else { "—" },
            &esc(&t.parent),
        );
        lines.push(if sel {
            Line::styled(text, theme.selected)
        } else {
            Line::raw(text)
        });
    }
    let running = match vm.active.and_then(|i| vm.tasks.get(i)) {
        Some(t) => format!(" · ● the chat runs under {}", esc(&t.name)),
        None => String::new(),
    };
    let title = format!(
        " {}{running} · sparsity: declared / measured (FFN neurons masked out) ",
        vm.title
    );
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

/// Two characters for a density: a tenths digit and a shade, `██` for all, `· ` for none.
pub fn cell_text(c: Option<Cell>) -> String {
    match c {
        None => "— ".into(),
        Some(c) if c.on == 0 && c.total > 0 => "· ".into(),
        Some(c) if c.on >= c.total => "██".into(),
        Some(c) => {
            let d = c.density();
            let tenths = ((d * 10.0).floor() as u32).min(9);
            format!("{tenths}{}", heat_glyph(d))
        }
    }
}

fn heat_style(c: Option<Cell>, theme: &Theme) -> Style {
    match c {
        Some(c) if theme.color => {
            let d = c.density();
            let fg = if d >= 0.6 { Color::Black } else { Color::White };
            theme.heat(d).fg(fg)
        }
        _ => theme.base,
    }
}

/// Width of one heat-map column: the widest that fits all columns, at least 3.
fn column_width(columns: &[String], avail: usize) -> usize {
    let label = columns.iter().map(|c| c.chars().count()).max().unwrap_or(1);
    for w in [5usize, 4] {
        if columns.len() * w <= avail && label + 1 < w {
            return w;
        }
    }
    3
}

/// Columns and rows of the heat map in its panel: page-wise scrolling both ways, so the
/// selection is always on screen without the view keeping state.
struct HeatGeometry {
    name_w: usize,
    cw: usize,
    visible: usize,
    first_col: usize,
    rows_h: usize,
    first_row: usize,
}

fn heat_geometry(area: Rect, vm: &MasksVm) -> HeatGeometry {
    let inner_w = area.width.saturating_sub(2) as usize;
    let inner_h = area.height.saturating_sub(2) as usize;
    let name_w = vm
        .tasks
        .iter()
        .map(|t| esc(&t.name).chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 16)
        + 3;
    let avail = inner_w.saturating_sub(name_w);
    let cw = column_width(&vm.heat.columns, avail);
    let visible = (avail / cw).max(1);
    // Rows: the header and the legend take two lines.
    let rows_h = inner_h.saturating_sub(2).max(1);
    HeatGeometry {
        name_w,
        cw,
        visible,
        first_col: page_start(vm.visit, visible),
        rows_h,
        first_row: page_start(vm.selected, rows_h),
    }
}

fn render_heat(f: &mut Frame, area: Rect, vm: &MasksVm, theme: &Theme) {
    let heat = vm.heat;
    let HeatGeometry {
        name_w,
        cw,
        visible,
        first_col,
        rows_h,
        first_row: start,
    } = heat_geometry(area, vm);
    let cols: Vec<usize> = (first_col..heat.columns.len()).take(visible).collect();

    let mut lines = Vec::new();
    let mut header = vec![Span::styled(pad("task", name_w), theme.dim)];
    for &c in &cols {
        let label = &heat.columns[c];
        let marker = if c == vm.visit { "▾" } else { " " };
        let text = pad(&format!("{marker}{label}"), cw);
        header.push(Span::styled(
            text,
            if c == vm.visit {
                theme.accent
            } else {
                theme.dim
            },
        ));
    }
    lines.push(Line::from(header));
    for (i, task) in vm.tasks.iter().enumerate().skip(start).take(rows_h) {
        let sel = i == vm.selected;
        let label = format!("{}{}", if sel { "▶ " } else { "  " }, esc(&task.name));
        let mut spans = vec![Span::styled(
            pad(&label, name_w),
            if sel { theme.accent } else { theme.base },
        )];
        let row = heat.cells.get(i);
        for &c in &cols {
            // A task with fewer visits than the widest one leaves the rest blank.
            let slot = row.and_then(|r| r.get(c)).copied();
            let cell = slot.flatten();
            let mut style = heat_style(cell, theme);
            if sel && c == vm.visit {
                style = style.add_modifier(Modifier::REVERSED | Modifier::BOLD);
            }
            let text = match slot {
                Some(cell) => cell_text(cell),
                None => "  ".into(),
            };
            // One space before the two characters, so neighbouring colours stay apart.
            spans.push(Span::raw(" "));
            spans.push(Span::styled(text, style));
            spans.push(Span::raw(" ".repeat(cw.saturating_sub(3))));
        }
        lines.push(Line::from(spans));
    }
    let mut legend = vec![Span::styled(
        "cell: tenths active + shade ░▒▓  ██ all  · none  — no such field",
        theme.dim,
    )];
    if theme.color && !theme.heat.is_empty() {
        legend.push(Span::raw("   0 "));
        for i in 0..=10 {
            legend.push(Span::styled(" ", theme.heat(i as f64 / 10.0)));
        }
        legend.push(Span::raw(" 1"));
    }
    lines.push(Line::from(legend));

    let cycle: Vec<String> = vm
        .fields
        .iter()
        .map(|&x| {
            if x == heat.field {
                format!("[{}]", x.short())
            } else {
                x.short().to_string()
            }
        })
        .collect();
    let range = if cols.len() < heat.columns.len() {
        format!(
            " · columns {}–{} of {}",
            cols.first().copied().unwrap_or(0),
            cols.last().copied().unwrap_or(0),
            heat.columns.len()
        )
    } else {
        String::new()
    };
    let title = format!(
        " heat map — {} active per layer{range} · f: {} ",
        heat.field.title(),
        cycle.join(" ▸ ")
    );
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

fn render_info(f: &mut Frame, area: Rect, vm: &MasksVm, theme: &Theme) {
    let key_w = info_key_width(vm);
    let value_w = (area.width.saturating_sub(2) as usize).saturating_sub(key_w + 1);
    let mut lines: Vec<Line> = Vec::new();
    for (k, v) in vm.info {
        // Long values wrap under themselves, not under the key.
        for (i, part) in wrap_words(&esc(v), value_w).into_iter().enumerate() {
            let key = if i == 0 { k.as_str() } else { "" };
            lines.push(Line::from(vec![
                Span::styled(format!("{} ", pad(key, key_w)), theme.dim),
                Span::raw(part),
            ]));
        }
    }
    let title = vm
        .tasks
        .get(vm.selected)
        .map(|t| format!(" {} (task {}) ", esc(&t.name), t.task_id))
        .unwrap_or_default();
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

const OVERLAP_CELL: usize = 6;

fn overlap_label_width(vm: &MasksVm) -> usize {
    vm.tasks
        .iter()
        .take(vm.overlap.values.len())
        .map(|t| esc(&t.name).chars().count() + t.task_id.len() + 1)
        .max()
        .unwrap_or(4)
        .clamp(4, 18)
        + 2
}

fn render_overlap(f: &mut Frame, area: Rect, vm: &MasksVm, theme: &Theme) {
    let ov = vm.overlap;
    let n = ov.values.len();
    let label_w = overlap_label_width(vm);
    let inner_w = area.width.saturating_sub(2) as usize;
    let inner_h = area.height.saturating_sub(2) as usize;
    let visible_cols = (inner_w.saturating_sub(label_w) / OVERLAP_CELL).max(1);
    let col0 = page_start(vm.selected.min(n.saturating_sub(1)), visible_cols);
    let mut header = vec![Span::raw(" ".repeat(label_w))];
    for j in (col0..n).take(visible_cols) {
        let id = vm.tasks.get(j).map(|t| t.task_id.as_str()).unwrap_or("?");
        let style = if j == vm.selected {
            theme.accent
        } else {
            theme.dim
        };
        header.push(Span::styled(
            pad_left(&format!("#{id}"), OVERLAP_CELL),
            style,
        ));
    }
    let mut lines = vec![Line::from(header)];
    let rows_h = inner_h.saturating_sub(1).max(1);
    let row0 = page_start(vm.selected.min(n.saturating_sub(1)), rows_h);
    for i in (row0..n).take(rows_h) {
        let sel = i == vm.selected;
        let t = &vm.tasks[i];
        let label = format!(
            "{}#{} {}",
            if sel { "▶" } else { " " },
            t.task_id,
            esc(&t.name)
        );
        let mut spans = vec![Span::styled(
            pad(&label, label_w),
            if sel { theme.accent } else { theme.base },
        )];
        for j in (col0..n).take(visible_cols) {
            let v = ov.values[i].get(j).copied().flatten();
            let text = match v {
                Some(x) => format!("{x:.2}"),
                None => "—".into(),
            };
            let style = match v {
                Some(x) if theme.color => {
                    theme
                        .heat(x)
                        .fg(if x >= 0.6 { Color::Black } else { Color::White })
                }
                _ => theme.base,
            };
            spans.push(Span::raw(" ".repeat(OVERLAP_CELL - 4)));
            spans.push(Span::styled(pad_left(&text, 4), style));
        }
        lines.push(Line::from(spans));
    }
    if ov.left_out > 0 && lines.len() < inner_h {
        lines.push(Line::styled(
            format!("({} more tasks not compared)", ov.left_out),
            theme.dim,
        ));
    }
    let title = format!(" overlap — Jaccard of {} bits ", ov.field.short());
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

/// Bits per line of a grid drawn `width` cells wide: 64 where it fits, in groups of 8.
fn bits_per_line(width: u16) -> usize {
    let w = width.saturating_sub(2 + 8) as usize;
    [64usize, 32, 16, 8]
        .into_iter()
        .find(|&n| n + n / 8 - 1 <= w)
        .unwrap_or(8)
}

fn detail_lines(d: &BitDetail, width: u16, theme: &Theme) -> Vec<Line<'static>> {
    let per_line = bits_per_line(width);
    let mut lines = Vec::new();
    for g in &d.grids {
        lines.push(Line::from(vec![
            Span::styled(format!("{:<16}", g.title), theme.title),
            Span::raw(esc(&g.summary)),
        ]));
        for (row, chunk) in g.bits.chunks(per_line).enumerate() {
            let mut spans = vec![Span::styled(format!("{:>7} ", row * per_line), theme.dim)];
            for (k, group) in chunk.chunks(8).enumerate() {
                if k > 0 {
                    spans.push(Span::raw(" "));
                }
                // One span per run of equal bits keeps the span count low on wide layers.
                for run in group.chunk_by(|a, b| a == b) {
                    let (glyph, style) = if run[0] {
                        (SET, theme.ok)
                    } else {
                        (UNSET, theme.dim)
                    };
                    spans.push(Span::styled(glyph.to_string().repeat(run.len()), style));
                }
            }
            lines.push(Line::from(spans));
        }
        lines.push(Line::raw(""));
    }
    for (k, v) in &d.notes {
        lines.push(Line::from(vec![
            Span::styled(format!("{k:<16}"), theme.title),
            Span::raw(esc(v)),
        ]));
    }
    lines
}

/// Lines the detail takes at `width` (for the app to bound its scrolling).
pub fn detail_height(d: &BitDetail, width: u16) -> usize {
    detail_lines(d, width, &Theme::plain()).len()
}

fn render_detail(f: &mut Frame, area: Rect, d: &BitDetail, scroll: u16, theme: &Theme) {
    let lines = detail_lines(d, area.width, theme);
    let title = format!(
        " bits — {} · {SET}=active {UNSET}=masked out · ←→ layer  ↑↓ scroll  Esc back ",
        esc(&d.heading)
    );
    f.render_widget(
        Paragraph::new(lines)
            .scroll((scroll, 0))
            .block(Block::bordered().title(title).border_style(theme.accent)),
        area,
    );
}
