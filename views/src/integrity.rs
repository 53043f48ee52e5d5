//! View 5, Integrity: the hash chain of spec §8.1 as a tree (envelope → header →
//! directory → sections → tensors → signature), each link with what is recorded for it and
//! what a verify run found; a verdict panel above, the selected link's details below.
//!
//! The tensor list can hold 10⁵ rows, so the app hands over only the visible window of
//! rows (`rows` starts at row `offset` of `total`); [`layout`], [`tree_capacity`],
//! [`window_offset`] and [`row_at`] let it size that window and hit-test clicks exactly as
//! [`render`] draws.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::Frame;

use crate::theme::Theme;
use crate::util::{esc, truncate};

/// The state of one link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Not checked yet.
    Pending,
    Ok,
    /// Nothing recorded to check against (or trust not asked).
    Unchecked,
    Failed,
    /// The run stopped (cancelled) before reaching it.
    Skipped,
}

impl Mark {
    pub fn label(self) -> &'static str {
        match self {
            Mark::Pending => "pending",
            Mark::Ok => "ok",
            Mark::Unchecked => "unchecked",
            Mark::Failed => "FAILED",
            Mark::Skipped => "skipped",
        }
    }
    /// A glyph so the state reads without colour.
    pub fn glyph(self) -> char {
        match self {
            Mark::Pending => '·',
            Mark::Ok => '✓',
            Mark::Unchecked => '–',
            Mark::Failed => '✗',
            Mark::Skipped => '○',
        }
    }
    fn style(self, theme: &Theme) -> Style {
        match self {
            Mark::Pending | Mark::Skipped => theme.dim,
            Mark::Ok => theme.ok,
            Mark::Unchecked => theme.warn,
            Mark::Failed => theme.bad,
        }
    }
}

/// One visible row of the chain tree.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainRow {
    pub depth: u16,
    /// `None` for a leaf, `Some(open)` for a node that expands.
    pub expand: Option<bool>,
    pub name: String,
    pub mark: Mark,
    /// Recorded hash, what was found, or why it was not checked (one line).
    pub detail: String,
    /// The first failing link in chain order.
    pub first_broken: bool,
}

/// How a line of the verdict panel reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    Plain,
    Dim,
    Busy,
    Ok,
    Warn,
    Bad,
}

/// One line of the verdict panel: a label column and its text.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub label: String,
    pub text: String,
    pub tone: Tone,
}

impl Note {
    pub fn new(label: impl Into<String>, text: impl Into<String>, tone: Tone) -> Note {
        Note {
            label: label.into(),
            text: text.into(),
            tone,
        }
    }
}

pub struct IntegrityVm<'a> {
    /// Verdict, failing links, throughput, signature trust, trusted keys: one line each.
    pub verdict: &'a [Note],
    /// The visible window of the tree, starting at row `offset`.
    pub rows: &'a [ChainRow],
    pub offset: usize,
    /// The widest name of the whole tree with its indent, so that the columns stay put
    /// while the window scrolls.
    pub name_width: usize,
    /// Rows in the whole tree (for the scroll position).
    pub total: usize,
    /// The cursor, as a row of the whole tree.
    pub selected: usize,
    /// What the selected link is, and its details as label/text lines.
    pub detail_title: &'a str,
    pub detail: &'a [(String, String)],
}

/// Height of the details panel (borders included).
const DETAIL_H: u16 = 6;
const LABEL_W: usize = 10;

/// The verdict panel, the tree and the details panel of a body `area` whose verdict has
/// `verdict_lines` lines.
pub fn layout(area: Rect, verdict_lines: usize) -> [Rect; 3] {
    // The tree keeps at least a few rows: the verdict gives way on a small terminal.
    let verdict_h = (verdict_lines as u16 + 2).min(area.height.saturating_sub(DETAIL_H + 5));
    Layout::vertical([
        Constraint::Length(verdict_h),
        Constraint::Min(3),
        Constraint::Length(DETAIL_H),
    ])
    .areas(area)
}

/// How many tree rows fit in `area`.
pub fn tree_capacity(area: Rect, verdict_lines: usize) -> usize {
    let [_, tree, _] = layout(area, verdict_lines);
    (tree.height.saturating_sub(2) as usize).max(1)
}

/// The first row to show so that `selected` is visible, moving from `offset` as little as
/// possible.
pub fn window_offset(offset: usize, selected: usize, total: usize, capacity: usize) -> usize {
    let capacity = capacity.max(1);
    let mut off = offset.min(total.saturating_sub(capacity));
    if selected < off {
        off = selected;
    } else if selected >= off + capacity {
        off = selected + 1 - capacity;
    }
    off
}

/// The tree row under terminal cell (`x`, `y`), if any.
pub fn row_at(
    area: Rect,
    verdict_lines: usize,
    offset: usize,
    total: usize,
    x: u16,
    y: u16,
) -> Option<usize> {
    let [_, tree, _] = layout(area, verdict_lines);
    let inside_x = x > tree.x && x < tree.x + tree.width.saturating_sub(1);
    let inside_y = y > tree.y && y < tree.y + tree.height.saturating_sub(1);
    if !inside_x || !inside_y {
        return None;
    }
    let i = offset + (y - tree.y - 1) as usize;
    (i < total).then_some(i)
}

pub fn render(f: &mut Frame, area: Rect, vm: &IntegrityVm, theme: &Theme) {
    let [verdict, tree, detail] = layout(area, vm.verdict.len());
    render_verdict(f, verdict, vm, theme);
    render_tree(f, tree, vm, theme);
    render_detail(f, detail, vm, theme);
}

fn tone_style(tone: Tone, theme: &Theme) -> Style {
    match tone {
        Tone::Plain => theme.base,
        Tone::Dim => theme.dim,
        Tone::Busy => theme.accent,
        Tone::Ok => theme.ok,
        Tone::Warn => theme.warn,
        Tone::Bad => theme.bad,
    }
}

fn render_verdict(f: &mut Frame, area: Rect, vm: &IntegrityVm, theme: &Theme) {
    let budget = (area.width as usize).saturating_sub(LABEL_W + 3);
    let lines: Vec<Line> = vm
        .verdict
        .iter()
        .map(|n| {
            Line::from(vec![
                Span::styled(format!("{:<LABEL_W$} ", esc(&n.label)), theme.dim),
                Span::styled(truncate(&esc(&n.text), budget), tone_style(n.tone, theme)),
            ])
        })
        .collect();
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" verify ")),
        area,
    );
}

fn render_tree(f: &mut Frame, area: Rect, vm: &IntegrityVm, theme: &Theme) {
    let inner_w = area.width.saturating_sub(2) as usize;
    // Name column: as wide as the widest name (marker and a gap included), at most half
    // the width so the state and the details keep their room.
    let name_w = (vm.name_width + 4).clamp(16, (inner_w / 2).max(16));
    const MARK_W: usize = 12;
    let detail_w = inner_w.saturating_sub(2 + name_w + MARK_W);
    let lines: Vec<Line> = vm
        .rows
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let i = vm.offset + k;
            let marker = match r.expand {
                None => "  ",
                Some(true) => "▾ ",
                Some(false) => "▸ ",
            };
            let indent = "  ".repeat(r.depth as usize);
            let name_room = name_w.saturating_sub(indent.chars().count() + 2 + 1);
            let name = truncate(&esc(&r.name), name_room);
            let pad = name_room.saturating_sub(name.chars().count()) + 1;
            let flag = if r.first_broken { "» " } else { "  " };
            let name_style = if r.first_broken {
                theme.bad
            } else if r.depth == 0 {
                theme.accent
            } else {
                theme.base
            };
            let state = format!("{} {}", r.mark.glyph(), r.mark.label());
            let line = Line::from(vec![
                Span::styled(flag, theme.bad),
                Span::raw(indent),
                Span::raw(marker),
                Span::styled(name, name_style),
                Span::raw(" ".repeat(pad)),
                Span::styled(format!("{state:<MARK_W$}"), r.mark.style(theme)),
                Span::raw(truncate(&esc(&r.detail), detail_w)),
            ]);
            if i == vm.selected {
                line.style(theme.selected)
            } else {
                line
            }
        })
        .collect();
    let capacity = area.height.saturating_sub(2) as usize;
    let position = if vm.total > capacity && !vm.rows.is_empty() {
        format!(
            " rows {}–{} of {} ",
            vm.offset + 1,
            vm.offset + vm.rows.len(),
            vm.total
        )
    } else {
        String::new()
    };
    f.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .title(" hash chain (§8.1) · » first broken link ")
                .title_bottom(Line::from(position).right_aligned()),
        ),
        area,
    );
}

fn render_detail(f: &mut Frame, area: Rect, vm: &IntegrityVm, theme: &Theme) {
    let lines: Vec<Line> = vm
        .detail
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(format!("{:<LABEL_W$} ", esc(k)), theme.dim),
                Span::raw(esc(v)),
            ])
        })
        .collect();
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(format!(" {} ", esc(vm.detail_title)))),
        area,
    );
}
