//! The chat's choice of task mask (§5) and skill (§9): the pickers, and compare mode —
//! the same prompt answered under two choices side by side, with the first token where
//! the answers part marked.
//!
//! Names come from the file: every text is cleaned of control characters here.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};
use ratatui::Frame;

use crate::chat::{fit, hint_line, popup_block};
use crate::markdown::{clamp, clean, width_of, wrap, Piece};
use crate::theme::Theme;
use crate::util::centered;

/// One option of a picker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PickRowVm<'a> {
    pub label: &'a str,
    /// Shown dim after the label (`quality not measured`, `T 0.50 ←/→`, …).
    pub note: &'a str,
    /// What the chat runs under now: marked `●`.
    pub current: bool,
    pub selected: bool,
}

/// The task picker or the skill picker.
#[derive(Clone, Debug, PartialEq)]
pub struct PickerVm<'a> {
    pub title: &'a str,
    pub rows: Vec<PickRowVm<'a>>,
    /// What a switch does to the cached positions (the user's choice), one line.
    pub policy: &'a str,
    pub note: Option<&'a str>,
    pub hint: &'a str,
}

pub fn render_picker(f: &mut Frame, area: Rect, vm: &PickerVm, theme: &Theme) {
    let label_w = vm
        .rows
        .iter()
        .map(|r| width_of(&clean(r.label)))
        .max()
        .unwrap_or(0)
        .clamp(8, 32);
    let row_w = vm
        .rows
        .iter()
        .map(|r| 4 + label_w + 2 + width_of(&clean(r.note)))
        .max()
        .unwrap_or(0);
    let want_w = row_w
        .max(width_of(vm.policy))
        .max(width_of(vm.hint))
        .max(width_of(vm.title) + 4)
        + 4;
    let want_h = vm.rows.len() + 5 + usize::from(vm.note.is_some());
    let r = centered(
        area,
        (want_w as u16).min(area.width),
        (want_h as u16).min(area.height),
    );
    f.render_widget(Clear, r);
    let block = popup_block(format!(" {} ", clean(vm.title)), theme);
    let inner = block.inner(r);
    f.render_widget(block, r);
    let w = inner.width as usize;
    // The selected row stays in sight when the list is taller than the popup.
    let list_h = (inner.height as usize).saturating_sub(3 + usize::from(vm.note.is_some()));
    let sel = vm.rows.iter().position(|r| r.selected).unwrap_or(0);
    let first = crate::util::page_start(sel, list_h.max(1));
    let mut lines = Vec::new();
    for row in vm.rows.iter().skip(first).take(list_h.max(1)) {
        let marker = match (row.selected, row.current) {
            (true, true) => "▶●",
            (true, false) => "▶ ",
            (false, true) => " ●",
            (false, false) => "  ",
        };
        let style = if row.selected {
            theme.selected
        } else {
            theme.base
        };
        let mut line = Line::from(vec![
            Span::styled(
                format!("{marker} {} ", fit(&clean(row.label), label_w)),
                style,
            ),
            Span::styled(clean(row.note), theme.dim),
        ]);
        clamp(&mut line, w);
        lines.push(line);
    }
    lines.push(Line::default());
    lines.push(Line::styled(fit(&clean(vm.policy), w), theme.accent));
    if let Some(n) = vm.note {
        lines.push(Line::styled(fit(&clean(n), w), theme.warn));
    }
    lines.push(hint_line(vm.hint, theme));
    f.render_widget(Paragraph::new(lines), inner);
}

/// A setting row of compare mode (`A task`, `A skill`, `B task`, `B skill`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompareRowVm<'a> {
    pub label: &'a str,
    pub value: &'a str,
    pub selected: bool,
}

/// One side's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareSideVm<'a> {
    /// What it ran under (the engine's label), or what was asked while it has not started.
    pub title: &'a str,
    /// The answer's tokens as text pieces.
    pub tokens: Vec<&'a str>,
    /// `running`, `end`, `token limit`, `stopped`, …
    pub state: &'a str,
    pub error: Option<&'a str>,
}

/// Compare mode.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareVm<'a> {
    pub prompt: &'a str,
    pub rows: Vec<CompareRowVm<'a>>,
    pub sides: [CompareSideVm<'a>; 2],
    /// The first token index where the two answers differ: marked on both sides.
    pub diverge: Option<usize>,
    /// One line under the answers: where they part, or that they agree.
    pub summary: &'a str,
    pub hint: &'a str,
}

/// The markers around the first differing token: visible without colours.
pub const DIVERGE_OPEN: &str = "⟦";
pub const DIVERGE_CLOSE: &str = "⟧";

fn side_lines(
    side: &CompareSideVm,
    diverge: Option<usize>,
    width: usize,
    theme: &Theme,
) -> Vec<Line<'static>> {
    if width == 0 {
        return Vec::new();
    }
    let mark = theme.bad.add_modifier(Modifier::BOLD | Modifier::REVERSED);
    let mut pieces = Vec::new();
    for (i, t) in side.tokens.iter().enumerate() {
        let at = diverge == Some(i);
        let style = if at { mark } else { theme.base };
        if at {
            pieces.push(Piece::Text(DIVERGE_OPEN.into(), mark));
        }
        for (k, part) in t.split('\n').enumerate() {
            if k > 0 {
                if at {
                    pieces.push(Piece::Text("↵".into(), style));
                }
                pieces.push(Piece::Break);
            }
            if !part.is_empty() {
                pieces.push(Piece::Text(clean(part), style));
            }
        }
        if at {
            if t.is_empty() {
                pieces.push(Piece::Text("∅".into(), style));
            }
            pieces.push(Piece::Text(DIVERGE_CLOSE.into(), mark));
        }
    }
    // The shorter answer ended where the other goes on: mark its end.
    if diverge == Some(side.tokens.len()) && side.error.is_none() {
        pieces.push(Piece::Text(
            format!("{DIVERGE_OPEN}end{DIVERGE_CLOSE}"),
            mark,
        ));
    }
    let mut lines: Vec<Line<'static>> = wrap(&pieces, width).into_iter().map(Line::from).collect();
    for l in &mut lines {
        clamp(l, width);
    }
    if let Some(e) = side.error {
        lines.push(Line::styled(format!("✗ {}", clean(e)), theme.bad));
    }
    lines
}

pub fn render_compare(f: &mut Frame, area: Rect, vm: &CompareVm, theme: &Theme) {
    let r = centered(
        area,
        area.width.saturating_sub(2).max(1),
        area.height.max(1),
    );
    f.render_widget(Clear, r);
    let block = popup_block(" compare — one prompt, two choices, greedy ".into(), theme);
    let inner = block.inner(r);
    f.render_widget(block, r);
    if inner.height == 0 || inner.width == 0 {
        return;
    }
    let w = inner.width as usize;
    let head_h = (vm.rows.len() + 2) as u16;
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(head_h.min(inner.height)),
        Constraint::Min(1),
        Constraint::Length(2.min(inner.height.saturating_sub(head_h))),
    ])
    .areas(inner);
    let mut lines = vec![Line::from(vec![
        Span::styled("prompt ", theme.dim),
        Span::styled(clean(&vm.prompt.replace('\n', " ")), theme.key),
    ])];
    let label_w = vm.rows.iter().map(|r| width_of(r.label)).max().unwrap_or(0) + 1;
    for row in &vm.rows {
        let marker = if row.selected { "▶ " } else { "  " };
        let style = if row.selected {
            theme.selected
        } else {
            theme.base
        };
        lines.push(Line::from(vec![
            Span::styled(
                format!("{marker}{}", fit(&clean(row.label), label_w)),
                style,
            ),
            Span::styled(format!("‹ {} ›", clean(row.value)), style),
        ]));
    }
    for l in &mut lines {
        clamp(l, w);
    }
    f.render_widget(Paragraph::new(lines), head);

    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(body);
    for (side, (rect, name)) in vm.sides.iter().zip([(left, "A"), (right, "B")]) {
        let mut title = format!(" {name}: {} · {} ", clean(side.title), clean(side.state));
        let room = (rect.width as usize).saturating_sub(2);
        if width_of(&title) > room {
            title = fit(&title, room).trim_end().to_string();
        }
        let b = Block::bordered()
            .title(Span::styled(title, theme.title))
            .border_style(theme.dim);
        let text = b.inner(rect);
        f.render_widget(b, rect);
        let mut body = side_lines(side, vm.diverge, text.width as usize, theme);
        // The divergence in sight: scroll so that its line shows.
        let h = text.height as usize;
        let at = body
            .iter()
            .position(|l| l.spans.iter().any(|s| s.content.contains(DIVERGE_OPEN)));
        let top = match at {
            Some(a) if a >= h => a + 1 - h,
            _ => body.len().saturating_sub(h).min(at.unwrap_or(usize::MAX)),
        };
        body.drain(..top.min(body.len()));
        f.render_widget(Paragraph::new(body), text);
    }
    let foot_lines = vec![
        Line::styled(fit(&clean(vm.summary), w), theme.accent),
        hint_line(vm.hint, theme),
    ];
    f.render_widget(Paragraph::new(foot_lines), foot);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(w: u16, h: u16, render_fn: impl FnOnce(&mut Frame)) -> String {
        crate::util::draw_text(w, h, render_fn)
    }

    #[test]
    fn picker_marks_current_and_selected_and_cleans_names() {
        let vm = PickerVm {
            title: "task mask",
            rows: vec![
                PickRowVm {
                    label: "none",
                    note: "every neuron, head and expert",
                    current: false,
                    selected: false,
                },
                PickRowVm {
                    label: "co\u{1b}[31mde",
                    note: "quality not measured",
                    current: true,
                    selected: true,
                },
            ],
            policy: "at a switch: re-prefill (exact) · F8 keep the cache",
            note: None,
            hint: "↑↓ choose · Enter switch · Esc close",
        };
        let screen = draw(70, 12, |f| render_picker(f, f.area(), &vm, &Theme::plain()));
        assert!(!screen.contains('\u{1b}'), "{screen}");
        assert!(screen.contains("▶● co\\u{1b}[31mde"), "{screen}");
        assert!(screen.contains("re-prefill"), "{screen}");
    }

    #[test]
    fn compare_marks_the_first_difference_on_both_sides() {
        let a = ["The", " sky", " is", " blue"];
        let b = ["The", " sky", " was", " red"];
        let vm = CompareVm {
            prompt: "Why?",
            rows: vec![CompareRowVm {
                label: "A skill",
                value: "none",
                selected: true,
            }],
            sides: [
                CompareSideVm {
                    title: "backbone",
                    tokens: a.to_vec(),
                    state: "token limit",
                    error: None,
                },
                CompareSideVm {
                    title: "skill sql",
                    tokens: b.to_vec(),
                    state: "token limit",
                    error: None,
                },
            ],
            diverge: Some(2),
            summary: "they part at token 3",
            hint: "Enter run",
        };
        let screen = draw(60, 14, |f| {
            render_compare(f, f.area(), &vm, &Theme::plain())
        });
        assert!(screen.contains("The sky⟦ is⟧ blue"), "{screen}");
        assert!(screen.contains("The sky⟦ was⟧ red"), "{screen}");
        // Any size renders.
        for (w, h) in [(3, 3), (20, 5), (200, 60)] {
            draw(w, h, |f| render_compare(f, f.area(), &vm, &Theme::dark()));
        }
    }

    #[test]
    fn a_shorter_answer_marks_its_end() {
        let side = CompareSideVm {
            title: "x",
            tokens: vec!["a"],
            state: "end",
            error: None,
        };
        let lines = side_lines(&side, Some(1), 20, &Theme::plain());
        let text: String = lines[0].spans.iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(text, "a⟦end⟧");
    }
}
