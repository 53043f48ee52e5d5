//! View 4, Skills: the registry of §9 (layers, replaced tensors and their bytes, quality,
//! routing parameters), each skill's replaced tensors beside the base tensors they stand
//! in for, and for a standalone skill file (§9.1) the base it binds to.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::Frame;

use crate::theme::Theme;
use crate::util::{esc, human_bytes, pad, pad_left, page_start, truncate};

/// One record of the registry, already formatted.
#[derive(Clone, Debug, PartialEq)]
pub struct SkillRow {
    pub id: String,
    pub name: String,
    pub layers: String,
    pub tensors: usize,
    pub bytes: u64,
    pub mask_task: String,
    /// `not measured` for a null contract.
    pub quality: String,
    pub routing: String,
}

/// A key and its text; `warn` marks something that does not add up.
#[derive(Clone, Debug, PartialEq)]
pub struct Prop {
    pub key: String,
    pub value: String,
    pub warn: bool,
}

impl Prop {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Prop {
        Prop {
            key: key.into(),
            value: value.into(),
            warn: false,
        }
    }
    pub fn warn(key: impl Into<String>, value: impl Into<String>) -> Prop {
        Prop {
            warn: true,
            ..Prop::new(key, value)
        }
    }
}

/// The directory entry of the tensor a skill's tensor replaces.
#[derive(Clone, Debug, PartialEq)]
pub struct BaseTensor {
    pub dtype: String,
    pub shape: String,
    pub bytes: u64,
}

/// One `skill.{id}.{base}` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRow {
    /// The base name it replaces.
    pub base: String,
    pub dtype: String,
    pub shape: String,
    pub bytes: u64,
    /// `None` when this file has no tensor of that name (always so in a skill file).
    pub base_entry: Option<BaseTensor>,
}

/// The selected skill in full.
#[derive(Clone, Debug, PartialEq)]
pub struct SkillInfo {
    pub props: Vec<Prop>,
    pub tensors: Vec<TensorRow>,
}

/// One skill's routing score for the current prompt (§9 recon-argmin).
#[derive(Clone, Debug, PartialEq)]
pub struct ScoreVm {
    /// The reconstruction error E; `None` when the skill is not scored.
    pub e: Option<f32>,
    /// The least E: the skill `auto` chooses.
    pub least: bool,
    /// Why it is not scored (no selection subspace, inconsistent sizes).
    pub problem: Option<String>,
    /// What the chat runs with it: `●` (this skill), `w 0.73` (a blend's weight), or empty.
    pub in_chat: String,
}

/// The routing scores the list shows, and the prompt they are for.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteVm<'a> {
    /// Where the prompt comes from, then the prompt (escaped here), e.g.
    /// `the chat's last message: “SELECT …”`.
    pub source: &'a str,
    /// `computing…`, an error, or empty once `scores` are in.
    pub state: &'a str,
    /// Per registry row, in order (empty while nothing is computed).
    pub scores: &'a [ScoreVm],
    /// The probe prompt is being typed (the source is shown as the field).
    pub editing: bool,
}

pub struct SkillsVm<'a> {
    /// Facts of a standalone skill file (§9.1); `None` for a model.
    pub skill_file: Option<&'a [Prop]>,
    /// Routing scores for the current prompt (`None`: the file cannot be routed).
    pub route: Option<RouteVm<'a>>,
    pub rows: &'a [SkillRow],
    pub selected: usize,
    pub info: Option<&'a SkillInfo>,
    /// `skill.*` tensors no record claims.
    pub orphans: &'a [String],
    /// The tensor list of the selected skill, open, at this scroll.
    pub detail: Option<u16>,
}

/// The command that makes a model of a skill file and its base.
pub const APPLY_HINT: &str = "cortiq skill apply BASE SKILL -o OUT";

pub fn render(f: &mut Frame, area: Rect, vm: &SkillsVm, theme: &Theme) {
    if let (Some(scroll), Some(info)) = (vm.detail, vm.info) {
        let id = vm
            .rows
            .get(vm.selected)
            .map(|r| r.id.as_str())
            .unwrap_or("");
        render_tensors(f, area, id, info, scroll, theme);
        return;
    }
    let [banner, list, info] = panels(area, vm);
    if let Some(props) = vm.skill_file {
        render_skill_file(f, banner, props, theme);
    }
    if vm.rows.is_empty() {
        render_none(f, list, vm, theme);
    } else {
        render_list(f, list, vm, theme);
    }
    if let Some(i) = vm.info {
        let title = vm
            .rows
            .get(vm.selected)
            .map(|r| {
                if r.name.is_empty() || r.name == "—" {
                    format!(" skill {} — Enter: replaced tensors ", esc(&r.id))
                } else {
                    format!(
                        " skill {} — {} — Enter: replaced tensors ",
                        esc(&r.id),
                        esc(&r.name)
                    )
                }
            })
            .unwrap_or_default();
        render_props(f, info, &title, &i.props, theme);
    } else if !vm.orphans.is_empty() {
        render_orphans(f, info, vm.orphans, theme);
    }
}

/// `s` cut into lines of at most `width` characters, at spaces where it can be.
pub(crate) fn wrap_words(s: &str, width: usize) -> Vec<String> {
    let width = width.max(8);
    let mut out = Vec::new();
    let mut line = String::new();
    for word in s.split(' ') {
        let (lw, ww) = (line.chars().count(), word.chars().count());
        if lw > 0 && lw + 1 + ww > width {
            out.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
        // A single word longer than a line is cut hard.
        while line.chars().count() > width {
            let head: String = line.chars().take(width).collect();
            line = line.chars().skip(width).collect();
            out.push(head);
        }
    }
    if !line.is_empty() || out.is_empty() {
        out.push(line);
    }
    out
}

/// Key-value lines `width` wide; long values wrap under themselves, not under the key.
/// Banner (skill files), registry list, selected skill.
fn panels(area: Rect, vm: &SkillsVm) -> [Rect; 3] {
    let file_h = vm.skill_file.map_or(0, |p| p.len() as u16 + 4);
    let (list, rest) = match (vm.rows.is_empty(), vm.orphans.is_empty()) {
        // Nothing below the "no registry" note: it takes the whole body.
        (true, true) => (Constraint::Min(6), Constraint::Length(0)),
        (true, false) => (Constraint::Length(6), Constraint::Min(3)),
        (false, _) => (
            Constraint::Length(vm.rows.len().min(8) as u16 + 3 + route_h(vm)),
            Constraint::Min(3),
        ),
    };
    Layout::vertical([Constraint::Length(file_h), list, rest]).areas(area)
}

/// Rows the routing line takes above the list's heading.
fn route_h(vm: &SkillsVm) -> u16 {
    u16::from(vm.route.is_some())
}

/// The registry row a click at (`x`, `y`) lands on, from the layout `render` draws.
pub fn hit(area: Rect, vm: &SkillsVm, x: u16, y: u16) -> Option<usize> {
    if vm.detail.is_some() || vm.rows.is_empty() {
        return None;
    }
    let [_, list, _] = panels(area, vm);
    let top = list.y + 2 + route_h(vm);
    let inside = x > list.x && x + 1 < list.x + list.width;
    if !inside || y < top || y + 1 >= list.y + list.height {
        return None;
    }
    let h = list.height.saturating_sub(3 + route_h(vm)) as usize;
    let i = page_start(vm.selected, h) + (y - top) as usize;
    (i < vm.rows.len()).then_some(i)
}

/// `0.0006`, `1.63`, `12.4`: E with about three significant digits.
pub fn e_text(e: f32) -> String {
    if !e.is_finite() {
        return "∞".into();
    }
    let a = e.abs();
    if a >= 100.0 {
        format!("{e:.0}")
    } else if a >= 10.0 {
        format!("{e:.1}")
    } else if a >= 0.1 || a == 0.0 {
        format!("{e:.3}")
    } else {
        format!("{e:.4}")
    }
}

fn prop_lines<'a>(props: &[Prop], width: u16, theme: &Theme) -> Vec<Line<'a>> {
    let key_w = props
        .iter()
        .map(|p| p.key.chars().count())
        .max()
        .unwrap_or(0)
        .min(18);
    let value_w = (width as usize).saturating_sub(key_w + 2);
    let mut lines = Vec::new();
    for p in props {
        let style = if p.warn { theme.warn } else { theme.base };
        for (i, part) in wrap_words(&esc(&p.value), value_w).into_iter().enumerate() {
            let key = if i == 0 { esc(&p.key) } else { String::new() };
            lines.push(Line::from(vec![
                Span::styled(format!("{} ", pad(&key, key_w + 1)), theme.dim),
                Span::styled(part, style),
            ]));
        }
    }
    lines
}

fn render_props(f: &mut Frame, area: Rect, title: &str, props: &[Prop], theme: &Theme) {
    f.render_widget(
        Paragraph::new(prop_lines(props, area.width.saturating_sub(2), theme))
            .block(Block::bordered().title(title.to_string())),
        area,
    );
}

fn render_skill_file(f: &mut Frame, area: Rect, props: &[Prop], theme: &Theme) {
    let mut lines = vec![
        Line::styled(
            "standalone skill file — not runnable: it holds only the tensors a skill replaces",
            theme.warn,
        ),
        Line::from(vec![
            Span::raw("make a model of it and its base: "),
            Span::styled(APPLY_HINT, theme.key),
        ]),
    ];
    lines.extend(prop_lines(props, area.width.saturating_sub(2), theme));
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" standalone skill file (SKILL_FILE, §9.1) ")),
        area,
    );
}

fn render_none(f: &mut Frame, area: Rect, vm: &SkillsVm, theme: &Theme) {
    let mut lines = vec![
        Line::styled("this file has no skills registry", theme.title),
        Line::raw(
            "Skills (§9) are full-shape replacement tensors skill.{id}.{tensor} listed in header.skills;",
        ),
        Line::raw("this model runs with its backbone tensors only."),
    ];
    if !vm.orphans.is_empty() {
        lines.push(Line::styled(
            format!(
                "{} skill.* tensors are in the directory without a registry record (below)",
                vm.orphans.len()
            ),
            theme.warn,
        ));
    }
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" skills ")),
        area,
    );
}

fn render_orphans(f: &mut Frame, area: Rect, orphans: &[String], theme: &Theme) {
    let lines: Vec<Line> = orphans.iter().map(|o| Line::raw(esc(o))).collect();
    f.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .title(" skill tensors without a registry record ")
                .border_style(theme.warn),
        ),
        area,
    );
}

/// Width of a column: its widest cell or heading, at most `max`.
fn col_w<'a>(heading: &str, cells: impl Iterator<Item = &'a str>, max: usize) -> usize {
    cells
        .map(|c| esc(c).chars().count())
        .chain([heading.chars().count()])
        .max()
        .unwrap_or(0)
        .min(max)
}

fn render_list(f: &mut Frame, area: Rect, vm: &SkillsVm, theme: &Theme) {
    let id_w = col_w("id", vm.rows.iter().map(|r| r.id.as_str()), 16);
    let name_w = col_w("name", vm.rows.iter().map(|r| r.name.as_str()), 24);
    let layers_w = col_w("layers", vm.rows.iter().map(|r| r.layers.as_str()), 20);
    let mask_w = col_w(
        "mask task",
        vm.rows.iter().map(|r| r.mask_task.as_str()),
        14,
    );
    let routing_w = col_w("routing", vm.rows.iter().map(|r| r.routing.as_str()), 26);
    let scores = vm.route.as_ref().map_or(&[][..], |r| r.scores);
    // The E column: the score, `◀` on the least (auto's choice), the chat's use.
    let score_cells: Vec<(String, String)> = (0..vm.rows.len())
        .map(|i| match scores.get(i) {
            None => ("".into(), String::new()),
            Some(s) => (
                match s.e {
                    Some(e) => format!("{}{}", e_text(e), if s.least { " ◀" } else { "" }),
                    None => "—".into(),
                },
                esc(&s.in_chat),
            ),
        })
        .collect();
    // The columns show once there is something in them.
    let show_e = !scores.is_empty();
    let show_chat = scores.iter().any(|s| !s.in_chat.is_empty());
    let e_w = col_w("E", score_cells.iter().map(|c| c.0.as_str()), 12).max(6);
    let chat_w = col_w("chat", score_cells.iter().map(|c| c.1.as_str()), 10);
    let score_w = if show_e { e_w + 2 } else { 0 } + if show_chat { chat_w + 2 } else { 0 };
    let inner_w = area.width.saturating_sub(2) as usize;
    let fixed = 2
        + id_w
        + 2
        + name_w
        + 2
        + layers_w
        + 2
        + 7
        + 2
        + 10
        + 2
        + mask_w
        + 2
        + routing_w
        + 2
        + score_w;
    let quality_w = inner_w.saturating_sub(fixed).max(12);
    let line = |marker: &str, r: [&str; 8], score: (&str, &str)| {
        let mut cells = String::new();
        if show_e {
            cells.push_str(&format!("{}  ", pad_left(score.0, e_w)));
        }
        if show_chat {
            cells.push_str(&format!("{}  ", pad(score.1, chat_w)));
        }
        let score = cells;
        format!(
            "{marker}{}  {}  {}  {}  {}  {}  {}  {score}{}",
            pad(r[0], id_w),
            pad(r[1], name_w),
            pad(r[2], layers_w),
            pad_left(r[3], 7),
            pad_left(r[4], 10),
            pad(r[5], mask_w),
            pad(r[6], routing_w),
            truncate(r[7], quality_w),
        )
    };
    let mut lines = Vec::new();
    if let Some(route) = &vm.route {
        let mut spans = vec![Span::styled("routing E for ", theme.dim)];
        spans.push(Span::styled(
            truncate(&esc(route.source), inner_w.saturating_sub(14)),
            if route.editing { theme.key } else { theme.base },
        ));
        if !route.state.is_empty() {
            spans.push(Span::styled(format!(" · {}", esc(route.state)), theme.warn));
        }
        lines.push(Line::from(spans));
    }
    lines.push(Line::styled(
        line(
            "  ",
            [
                "id",
                "name",
                "layers",
                "tensors",
                "bytes",
                "mask task",
                "routing",
                "quality",
            ],
            ("E", "chat"),
        ),
        theme.dim,
    ));
    let h = area.height.saturating_sub(3 + route_h(vm)) as usize;
    let start = page_start(vm.selected, h);
    for (i, r) in vm.rows.iter().enumerate().skip(start).take(h) {
        let sel = i == vm.selected;
        let text = line(
            if sel { "▶ " } else { "  " },
            [
                &esc(&r.id),
                &esc(&r.name),
                &esc(&r.layers),
                &r.tensors.to_string(),
                &human_bytes(r.bytes),
                &esc(&r.mask_task),
                &esc(&r.routing),
                &esc(&r.quality),
            ],
            (&score_cells[i].0, &score_cells[i].1),
        );
        lines.push(if sel {
            Line::styled(text, theme.selected)
        } else {
            Line::raw(text)
        });
    }
    let mut title = format!(" skills registry — {} ", vm.rows.len());
    if !vm.orphans.is_empty() {
        title.push_str(&format!(
            "· {} skill.* tensors without a record ",
            vm.orphans.len()
        ));
    }
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "—".into()
    } else {
        format!("×{:.2}", a as f64 / b as f64)
    }
}

/// Lines of the tensor table (for the app to bound its scrolling).
pub fn tensors_height(info: &SkillInfo) -> usize {
    info.tensors.len() + 3
}

fn render_tensors(
    f: &mut Frame,
    area: Rect,
    id: &str,
    info: &SkillInfo,
    scroll: u16,
    theme: &Theme,
) {
    let t = &info.tensors;
    let base_w = col_w(
        "replaces (base tensor)",
        t.iter().map(|r| r.base.as_str()),
        60,
    );
    let dtype_w = col_w("dtype", t.iter().map(|r| r.dtype.as_str()), 10);
    let shape_w = col_w("shape", t.iter().map(|r| r.shape.as_str()), 22);
    let base_dtype_w = col_w(
        "base dtype",
        t.iter()
            .filter_map(|r| r.base_entry.as_ref().map(|b| b.dtype.as_str())),
        10,
    );
    let row = |c: [&str; 7]| {
        format!(
            "{}  {}  {}  {}  │ {}  {}  {}",
            pad(c[0], base_w),
            pad(c[1], dtype_w),
            pad(c[2], shape_w),
            pad_left(c[3], 10),
            pad(c[4], base_dtype_w),
            pad_left(c[5], 10),
            pad_left(c[6], 6),
        )
    };
    let mut lines = vec![Line::styled(
        row([
            "replaces (base tensor)",
            "dtype",
            "shape",
            "bytes",
            "base dtype",
            "base bytes",
            "ratio",
        ]),
        theme.dim,
    )];
    for r in t {
        let (bd, bb, rt) = match &r.base_entry {
            Some(b) => (
                b.dtype.clone(),
                human_bytes(b.bytes),
                ratio(r.bytes, b.bytes),
            ),
            None => ("—".into(), "—".into(), String::new()),
        };
        let text = row([
            &esc(&r.base),
            &r.dtype,
            &r.shape,
            &human_bytes(r.bytes),
            &bd,
            &bb,
            &rt,
        ]);
        let shape_differs = r.base_entry.as_ref().is_some_and(|b| b.shape != r.shape);
        lines.push(if shape_differs {
            Line::styled(text, theme.warn)
        } else {
            Line::raw(text)
        });
    }
    let total: u64 = t.iter().map(|r| r.bytes).sum();
    let present: Vec<&BaseTensor> = t.iter().filter_map(|r| r.base_entry.as_ref()).collect();
    let base_total: u64 = present.iter().map(|b| b.bytes).sum();
    let all_present = present.len() == t.len() && !t.is_empty();
    lines.push(Line::styled(
        row([
            &format!("{} tensors", t.len()),
            "",
            "",
            &human_bytes(total),
            "",
            &if present.is_empty() {
                "—".to_string()
            } else {
                human_bytes(base_total)
            },
            &if all_present {
                ratio(total, base_total)
            } else {
                String::new()
            },
        ]),
        theme.title,
    ));
    if present.len() < t.len() {
        lines.push(Line::styled(
            if present.is_empty() {
                "— : the base tensors are not in this file (a standalone skill file carries only the replacements)"
                    .to_string()
            } else {
                format!(
                    "{} of {} base tensors are missing from this file",
                    t.len() - present.len(),
                    t.len()
                )
            },
            theme.warn,
        ));
    }
    let title = format!(
        " skill {} — replaced tensors (skill.{}.*) · ↑↓ scroll  Esc back ",
        esc(id),
        esc(id)
    );
    f.render_widget(
        Paragraph::new(lines)
            .scroll((scroll, 0))
            .block(Block::bordered().title(title).border_style(theme.accent)),
        area,
    );
}
