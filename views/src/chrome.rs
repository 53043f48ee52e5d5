//! The frame around every view: title and tabs on top, a status line below, the help
//! overlay, the error view for files that do not open, and the file picker.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Gauge, List, ListItem, ListState, Paragraph, Wrap};
use ratatui::Frame;

use crate::theme::Theme;
use crate::util::{centered, esc};

pub struct ChromeVm<'a> {
    /// The file's name (escaped by the caller or here).
    pub title: &'a str,
    pub tabs: &'a [&'a str],
    pub active: usize,
    /// Left part of the status line: what is selected, counts.
    pub status: String,
    /// Right part: the most useful keys of this view.
    pub hint: String,
    /// A background job in progress: label and fraction done.
    pub job: Option<(String, f64)>,
}

/// Draws the chrome and returns the body area for the active view.
pub fn render_chrome(f: &mut Frame, area: Rect, vm: &ChromeVm, theme: &Theme) -> Rect {
    let [top, body, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    let mut spans = vec![Span::styled(
        format!(" cortiq │ {} ", esc(vm.title)),
        theme.title,
    )];
    for (i, t) in vm.tabs.iter().enumerate() {
        let style = if i == vm.active {
            theme.tab_active
        } else {
            theme.tab_inactive
        };
        spans.push(Span::styled(format!(" {} {} ", i + 1, t), style));
        spans.push(Span::raw(" "));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), top);

    if let Some((label, frac)) = &vm.job {
        let [left, right] =
            Layout::horizontal([Constraint::Min(10), Constraint::Length(32)]).areas(status);
        f.render_widget(
            Paragraph::new(Line::from(vec![
                Span::raw(" "),
                Span::raw(vm.status.clone()),
            ])),
            left,
        );
        f.render_widget(
            Gauge::default()
                .gauge_style(theme.accent)
                .ratio(frac.clamp(0.0, 1.0))
                .label(label.clone()),
            right,
        );
    } else {
        let line = Line::from(vec![
            Span::raw(" "),
            Span::raw(vm.status.clone()),
            Span::raw("  "),
            Span::styled(vm.hint.clone(), theme.dim),
        ]);
        f.render_widget(Paragraph::new(line), status);
    }
    body
}

pub struct HelpVm {
    pub sections: Vec<(String, Vec<(String, String)>)>,
}

/// The help overlay, generated from the keymap by the app.
pub fn render_help(f: &mut Frame, area: Rect, vm: &HelpVm, theme: &Theme) {
    let mut lines = Vec::new();
    for (title, keys) in &vm.sections {
        lines.push(Line::styled(title.clone(), theme.title));
        for (k, what) in keys {
            lines.push(Line::from(vec![
                Span::styled(format!("  {k:<18}"), theme.key),
                Span::raw(what.clone()),
            ]));
        }
        lines.push(Line::raw(""));
    }
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = centered(area, 72, h);
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .title(" help — ? or Esc closes ")
                .border_style(theme.accent),
        ),
        r,
    );
}

pub struct ErrorVm<'a> {
    pub path: &'a str,
    /// The §1.2 error kind (`InvalidMagic`, `Bounds`, ...) or `Io`.
    pub kind: &'a str,
    pub message: &'a str,
}

/// A file that does not open: what the reader said, in full, and what to do.
pub fn render_error(f: &mut Frame, area: Rect, vm: &ErrorVm, theme: &Theme) {
    let explain = match vm.kind {
        "InvalidMagic" => "This is not a CMF file: its first bytes are not CMF\\x01.",
        "UnsupportedVersion" => "This CMF version is not supported (only version 2 exists).",
        "UnsupportedFeature" => "The file requires a feature this reader does not implement.",
        "Bounds" => "A section, record or tensor lies outside the file or overlaps another: the file is truncated or corrupt.",
        "Parse" => "Part of the file does not parse (header JSON, directory record, masks): the file is corrupt or hostile.",
        "Io" => "The operating system refused to read the file.",
        _ => "The file could not be opened.",
    };
    let lines = vec![
        Line::styled(format!("Cannot open {}", esc(vm.path)), theme.bad),
        Line::raw(""),
        Line::from(vec![
            Span::styled("error kind  ", theme.dim),
            Span::styled(vm.kind.to_string(), theme.bad),
        ]),
        Line::from(vec![
            Span::styled("message     ", theme.dim),
            Span::raw(esc(vm.message)),
        ]),
        Line::raw(""),
        Line::raw(explain),
        Line::raw(""),
        Line::styled("q quits · o opens another file", theme.dim),
    ];
    let r = centered(area, area.width.saturating_sub(4).min(100), 12);
    f.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(
            Block::bordered()
                .title(" invalid file ")
                .border_style(theme.bad),
        ),
        r,
    );
}

pub struct PickerVm<'a> {
    pub dir: &'a str,
    /// Entries: name, size text, and whether it is a directory.
    pub entries: &'a [(String, String, bool)],
    pub selected: usize,
    pub message: Option<&'a str>,
}

/// Choosing a `.cmf` file when none was given.
pub fn render_picker(f: &mut Frame, area: Rect, vm: &PickerVm, theme: &Theme) {
    let [head, list] = Layout::vertical([Constraint::Length(2), Constraint::Min(1)]).areas(area);
    f.render_widget(
        Paragraph::new(vec![
            Line::styled(format!(" Open a CMF file — {}", esc(vm.dir)), theme.title),
            Line::styled(
                vm.message.map(esc).unwrap_or_else(|| {
                    " ↑↓ choose · Enter open · Backspace parent · q quit".into()
                }),
                theme.dim,
            ),
        ]),
        head,
    );
    let items: Vec<ListItem> = if vm.entries.is_empty() {
        vec![ListItem::new(Line::styled(
            "  no .cmf files here",
            theme.dim,
        ))]
    } else {
        vm.entries
            .iter()
            .map(|(name, size, dir)| {
                let style = if *dir { theme.accent } else { Style::default() };
                ListItem::new(Line::from(vec![
                    Span::styled(format!("  {:<60}", esc(name)), style),
                    Span::styled(size.clone(), theme.dim),
                ]))
            })
            .collect()
    };
    let mut state =
        ListState::default().with_selected((!vm.entries.is_empty()).then_some(vm.selected));
    f.render_stateful_widget(
        List::new(items)
            .highlight_style(theme.selected)
            .block(Block::default().borders(Borders::TOP)),
        list,
        &mut state,
    );
}
