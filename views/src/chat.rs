//! View 6, Chat: a conversation with the model run by the embedded engine.
//!
//! The transcript on top (scrollable, messages pre-rendered by the app), a status line, and
//! the input box at the bottom; at most one popup over the transcript (sampling, settings,
//! prompt inspector, token inspector); or a notice instead of all that when the model
//! cannot be chatted with.
//!
//! Filling the VM: render each message once per width with [`markdown::render`] (replies)
//! or [`markdown::render_plain`] (the user's and system text) at [`text_width`] of the
//! view's area, cache the lines with the message (keyed by width, text revision and the
//! thinking toggle; while a reply streams re-render only that message), and hand slices of
//! them in [`BodyVm::Lines`]. Everything else is borrowed or formatted per frame.

use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Padding, Paragraph};
use ratatui::Frame;
use unicode_segmentation::UnicodeSegmentation;
use unicode_width::UnicodeWidthStr;

use crate::markdown::{self, clamp, clean, width_of, wrap, Piece};
use crate::theme::Theme;
use crate::util::{centered, scrollbar};

/// Columns left of message text: a selection bar and a space.
pub const GUTTER: u16 = 2;
/// The input box grows to this many text rows, then scrolls.
pub const INPUT_MAX_ROWS: usize = 8;

pub const SAMPLING_HINT: &str = "↑↓ choose · ←/→ change · Enter edit · Esc close";
pub const SETTINGS_HINT: &str = "Tab switch field · Enter edit · Esc close";
pub const PROMPT_HINT: &str = "↑↓ PgUp PgDn scroll · i ids · Esc close";
pub const TOKEN_HINT: &str = "←/→ previous/next token · Esc close";

/// Whose message it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One generated token in probability mode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenVm<'a> {
    /// The token's text as decoded (may hold spaces and newlines; escaped here).
    pub text: &'a str,
    /// The probability the sampler's distribution gave it, 0..=1.
    pub prob: f32,
}

/// What a message shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BodyVm<'a> {
    /// Lines rendered by the app at [`text_width`]; see the module docs for caching.
    Lines(&'a [Line<'a>]),
    /// Probability mode (replies only): the tokens inline, coloured by probability, the
    /// `selected` one (an index into `tokens`) highlighted. Wrapped here each frame.
    Tokens {
        tokens: &'a [TokenVm<'a>],
        selected: Option<usize>,
    },
}

/// One message of the transcript.
#[derive(Clone, Debug, PartialEq)]
pub struct MessageVm<'a> {
    pub role: Role,
    pub body: BodyVm<'a>,
    /// Shown dim after the role, e.g. `128 tokens · 23.1 tok/s`.
    pub meta: Option<&'a str>,
    /// The reply is still coming: a spinner glyph follows the text.
    pub streaming: bool,
    /// The user stopped the reply: `■ stopped` follows the text.
    pub stopped: bool,
    /// Generation failed: the error, shown after whatever text came.
    pub error: Option<&'a str>,
    /// Marked in the gutter: the message that copy / inspect keys act on.
    pub selected: bool,
}

impl<'a> MessageVm<'a> {
    /// A finished message with no flags.
    pub fn new(role: Role, body: BodyVm<'a>) -> MessageVm<'a> {
        MessageVm {
            role,
            body,
            meta: None,
            streaming: false,
            stopped: false,
            error: None,
            selected: false,
        }
    }
}

/// The message being typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InputVm<'a> {
    pub text: &'a str,
    /// Cursor as a char index into `text` (0..=chars; larger is clamped).
    pub cursor: usize,
    /// Keys go to the input: border highlighted and the terminal cursor shown.
    pub focused: bool,
    /// Shown dim while `text` is empty: a suggested prompt or how to start.
    pub placeholder: &'a str,
}

/// What the engine is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ChatState {
    #[default]
    Idle,
    /// Loading or verifying the model.
    Loading,
    /// Reading the prompt: `done` of `total` tokens.
    Prefilling {
        done: usize,
        total: usize,
    },
    Generating,
    Stopped,
    Failed,
}

/// The status line between transcript and input. Absent numbers are left out.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct StatusVm<'a> {
    pub state: ChatState,
    pub prefill_tok_s: Option<f64>,
    pub decode_tok_s: Option<f64>,
    /// Time to first token of the last reply, seconds.
    pub ttft_s: Option<f64>,
    /// Context positions used and the capacity.
    pub context: Option<(usize, usize)>,
    /// One line, e.g. from [`sampler_summary`].
    pub sampler: &'a str,
    /// `exact` or `fast`.
    pub precision: &'a str,
    /// What the model runs under and what a switch does to the cache, e.g.
    /// `task code · switch: keep cache` (empty: not shown).
    pub choice: &'a str,
}

/// The sampler's settings, for [`sampler_summary`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerParams {
    pub greedy: bool,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    /// `None`: a random seed per reply.
    pub seed: Option<u64>,
}

/// `T 0.8 · top-k 40 · top-p 0.95 · min-p 0.05 · rep 1.1 · seed 42`, or `greedy`.
pub fn sampler_summary(p: &SamplerParams) -> String {
    if p.greedy {
        return "greedy".into();
    }
    let seed = p.seed.map_or_else(|| "random".into(), |s| s.to_string());
    format!(
        "T {} · top-k {} · top-p {} · min-p {} · rep {} · seed {seed}",
        num(p.temperature),
        p.top_k,
        num(p.top_p),
        num(p.min_p),
        num(p.repeat_penalty)
    )
}

/// A setting as written by a person: at least one decimal, no trailing zeros.
fn num(x: f32) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0');
    if s.ends_with('.') {
        format!("{s}0")
    } else {
        s.to_string()
    }
}

/// Shown instead of the chat when the model cannot be chatted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoticeVm<'a> {
    pub title: &'a str,
    /// Paragraphs separated by newlines; wrapped here.
    pub text: &'a str,
    /// An error (red border) rather than a limitation.
    pub bad: bool,
}

/// A text being edited in a popup field: its text and cursor (char index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EditVm<'a> {
    pub text: &'a str,
    pub cursor: usize,
}

/// A row of the sampling panel.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingRowVm<'a> {
    pub label: &'a str,
    pub value: String,
    pub selected: bool,
    /// Shown dim: has no effect now (everything but `greedy` while greedy is on).
    pub disabled: bool,
}

/// The sampling panel: temperature, top-k, top-p, min-p, repeat penalty, seed, max
/// tokens, greedy — whatever rows the app gives, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingVm<'a> {
    pub rows: Vec<SamplingRowVm<'a>>,
    /// The selected row's value being typed (Enter), shown in place of its value.
    pub edit: Option<EditVm<'a>>,
    /// A message above the hint, e.g. why a typed value was refused.
    pub note: Option<&'a str>,
    pub hint: &'a str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingsField {
    SystemPrompt,
    Variables,
}

/// The settings panel: the system prompt and the template variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettingsVm<'a> {
    pub system_prompt: &'a str,
    /// `key=value`, one a line (e.g. `enable_thinking=false`).
    pub variables: &'a str,
    pub focus: SettingsField,
    /// The focused field is being edited: the cursor's char index in it.
    pub editing: Option<usize>,
    pub note: Option<&'a str>,
    pub hint: &'a str,
}

/// One token of the rendered prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptTokenVm<'a> {
    pub text: &'a str,
    pub id: u32,
    /// A special (control) token such as `<|im_start|>`.
    pub special: bool,
}

/// The prompt inspector: the exact prompt the model reads, token by token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptVm<'a> {
    pub tokens: &'a [PromptTokenVm<'a>],
    /// Each token as `text[id]` instead of alternating styles.
    pub show_ids: bool,
    /// First line shown (clamped here; [`prompt_page`] gives the limit).
    pub scroll: usize,
    pub hint: &'a str,
}

/// A candidate token at one position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AltTokenVm<'a> {
    pub text: &'a str,
    pub id: u32,
    pub prob: f32,
}

/// The token inspector: the selected generated token and its rivals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenInspectorVm<'a> {
    /// Position of the token in the reply (0-based) and the reply's token count.
    pub index: usize,
    pub count: usize,
    pub text: &'a str,
    pub id: u32,
    pub prob: f32,
    /// The most probable tokens at that position, best first (ten are shown).
    pub alternatives: &'a [AltTokenVm<'a>],
    pub hint: &'a str,
}

/// The one popup shown over the transcript.
#[derive(Clone, Debug, PartialEq)]
pub enum PopupVm<'a> {
    Sampling(SamplingVm<'a>),
    Settings(SettingsVm<'a>),
    Prompt(PromptVm<'a>),
    Token(TokenInspectorVm<'a>),
    /// The task or skill picker.
    Picker(crate::choice::PickerVm<'a>),
    /// The same prompt answered under two choices.
    Compare(crate::choice::CompareVm<'a>),
}

/// A line across the transcript before message `before` (a switch of task or skill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DividerVm<'a> {
    /// Index into [`ChatVm::messages`]; past the end: after the last message.
    pub before: usize,
    /// E.g. `task code · re-prefilled 42 positions in 0.03 s` (escaped here).
    pub text: &'a str,
}

/// Everything the chat view shows.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatVm<'a> {
    pub messages: &'a [MessageVm<'a>],
    /// Switch markers, in order of `before`.
    pub dividers: &'a [DividerVm<'a>],
    /// Lines scrolled up from the bottom; 0 follows the end. Clamped here; see
    /// [`transcript_page`] for the limit.
    pub scroll: usize,
    pub input: InputVm<'a>,
    pub status: StatusVm<'a>,
    /// When set, shown instead of everything else.
    pub notice: Option<NoticeVm<'a>>,
    pub popup: Option<PopupVm<'a>>,
    /// Frame counter for the streaming spinner.
    pub tick: usize,
}

/// Where the parts of the view go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatAreas {
    pub transcript: Rect,
    pub status: Rect,
    pub input: Rect,
}

/// The width at which the app renders message lines for a view of `area`.
pub fn text_width(area: Rect) -> u16 {
    // The gutter on the left, the scrollbar column on the right.
    area.width.saturating_sub(GUTTER + 1)
}

pub fn areas(area: Rect, input: &InputVm) -> ChatAreas {
    let inner_w = area.width.saturating_sub(2).max(1) as usize;
    let chars: Vec<char> = input.text.chars().collect();
    let rows = text_rows(&chars, inner_w).len().clamp(1, INPUT_MAX_ROWS) as u16;
    // The input box first (typing must stay possible), then the status line.
    let input_h = (rows + 2).min(area.height);
    let status_h = u16::from(area.height > input_h);
    let transcript_h = area.height - input_h - status_h;
    ChatAreas {
        transcript: Rect::new(area.x, area.y, area.width, transcript_h),
        status: Rect::new(area.x, area.y + transcript_h, area.width, status_h),
        input: Rect::new(
            area.x,
            area.y + transcript_h + status_h,
            area.width,
            input_h,
        ),
    }
}

/// The transcript's greatest useful `scroll` and its page height, for the app's keys.
pub fn transcript_page(area: Rect, vm: &ChatVm, theme: &Theme) -> (usize, usize) {
    let a = areas(area, &vm.input);
    let rows = transcript_rows(vm, text_width(area) as usize, theme);
    let h = a.transcript.height as usize;
    (rows.len().saturating_sub(h), h)
}

/// The prompt inspector's greatest useful `scroll` and its page height, when it is open.
pub fn prompt_page(area: Rect, vm: &ChatVm, theme: &Theme) -> Option<(usize, usize)> {
    let Some(PopupVm::Prompt(p)) = &vm.popup else {
        return None;
    };
    let inner = Block::bordered().inner(prompt_rect(popup_area(area, vm)));
    let lines = prompt_lines(p, inner.width as usize, theme);
    let h = inner.height as usize;
    Some((lines.len().saturating_sub(h), h))
}

pub fn render(f: &mut Frame, area: Rect, vm: &ChatVm, theme: &Theme) {
    if let Some(n) = &vm.notice {
        render_notice(f, area, n, theme);
        return;
    }
    let a = areas(area, &vm.input);
    render_transcript(f, a.transcript, vm, theme);
    if a.status.height > 0 {
        let mut line = status_line(&vm.status, a.status.width as usize, theme);
        clamp(&mut line, a.status.width as usize);
        f.render_widget(Paragraph::new(line), a.status);
    }
    let popup_cursor = vm.popup.is_some();
    render_input(f, a.input, &vm.input, theme, !popup_cursor);
    if let Some(p) = &vm.popup {
        let r = popup_area(area, vm);
        match p {
            PopupVm::Sampling(s) => render_sampling(f, r, s, theme),
            PopupVm::Settings(s) => render_settings(f, r, s, theme),
            PopupVm::Prompt(p) => render_prompt(f, r, p, theme),
            PopupVm::Token(t) => render_token(f, r, t, theme),
            PopupVm::Picker(p) => crate::choice::render_picker(f, r, p, theme),
            PopupVm::Compare(c) => crate::choice::render_compare(f, r, c, theme),
        }
    }
}

/// Popups cover the transcript, or the whole view when the transcript is too small.
fn popup_area(area: Rect, vm: &ChatVm) -> Rect {
    let t = areas(area, &vm.input).transcript;
    if t.height >= 8 {
        t
    } else {
        area
    }
}

// ---------------------------------------------------------------------------------------
// Transcript

/// A transcript row: message text borrowed from the VM, or made here.
enum Row<'b> {
    Ref(&'b Line<'b>),
    Own(Line<'b>),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Header,
    Body { selected: bool },
    Blank,
}

const SPINNER: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

fn transcript_rows<'b>(vm: &'b ChatVm<'b>, width: usize, theme: &Theme) -> Vec<(Kind, Row<'b>)> {
    let mut rows = Vec::new();
    let divider = |rows: &mut Vec<(Kind, Row<'b>)>, d: &DividerVm| {
        if !rows.is_empty() {
            rows.push((Kind::Blank, Row::Own(Line::default())));
        }
        rows.push((Kind::Header, Row::Own(divider_line(d.text, width, theme))));
    };
    for (i, m) in vm.messages.iter().enumerate() {
        for d in vm.dividers.iter().filter(|d| d.before == i) {
            divider(&mut rows, d);
        }
        if !rows.is_empty() {
            rows.push((Kind::Blank, Row::Own(Line::default())));
        }
        rows.push((Kind::Header, Row::Own(header(m, theme))));
        let body = Kind::Body {
            selected: m.selected,
        };
        let start = rows.len();
        match m.body {
            BodyVm::Lines(lines) => rows.extend(lines.iter().map(|l| (body, Row::Ref(l)))),
            BodyVm::Tokens { tokens, selected } => {
                for l in token_lines(tokens, selected, width, theme) {
                    rows.push((body, Row::Own(l)));
                }
            }
        }
        if m.streaming {
            let glyph = Span::styled(SPINNER[vm.tick % SPINNER.len()], theme.accent);
            let fits = rows.len() > start
                && match &rows[rows.len() - 1].1 {
                    Row::Ref(l) => l.width() < width,
                    Row::Own(l) => l.width() < width,
                };
            if fits {
                let (_, last) = rows.pop().expect("a body row");
                let mut l = match last {
                    Row::Ref(l) => l.clone(),
                    Row::Own(l) => l,
                };
                l.spans.push(glyph);
                rows.push((body, Row::Own(l)));
            } else {
                rows.push((body, Row::Own(Line::from(glyph))));
            }
        }
        if m.stopped {
            rows.push((body, Row::Own(Line::styled("■ stopped", theme.warn))));
        }
        if let Some(e) = m.error {
            for l in markdown::render_plain(&format!("✗ {e}"), width as u16, theme.bad) {
                rows.push((body, Row::Own(l)));
            }
        }
        if let BodyVm::Tokens { .. } = m.body {
            rows.push((body, Row::Own(legend(theme))));
        }
        if rows.len() == start && m.role == Role::Assistant {
            rows.push((body, Row::Own(Line::styled("(empty reply)", theme.dim))));
        }
    }
    for d in vm.dividers.iter().filter(|d| d.before >= vm.messages.len()) {
        divider(&mut rows, d);
    }
    rows
}

/// `── text ─────…` across `width` columns (the gutter included).
fn divider_line<'b>(text: &str, width: usize, theme: &Theme) -> Line<'b> {
    let full = width + GUTTER as usize;
    let head = format!("── {} ", clean(text));
    let head = if width_of(&head) + 2 > full {
        fit(&head, full.saturating_sub(2)).trim_end().to_string() + " "
    } else {
        head
    };
    let rest = full.saturating_sub(width_of(&head));
    Line::from(vec![
        Span::styled(head, theme.accent),
        Span::styled("─".repeat(rest), theme.dim),
    ])
}

fn header<'b>(m: &MessageVm, theme: &Theme) -> Line<'b> {
    let (label, style) = match m.role {
        Role::System => ("system", theme.dim.add_modifier(Modifier::BOLD)),
        Role::User => ("you", theme.key),
        Role::Assistant => ("assistant", theme.title),
    };
    let style = if m.selected {
        style.patch(theme.selected)
    } else {
        style
    };
    let mut spans = vec![Span::styled(label, style)];
    if let Some(meta) = m.meta {
        spans.push(Span::styled(format!(" · {}", clean(meta)), theme.dim));
    }
    Line::from(spans)
}

fn render_transcript(f: &mut Frame, r: Rect, vm: &ChatVm, theme: &Theme) {
    if r.height == 0 || r.width == 0 {
        return;
    }
    let width = text_width(r) as usize;
    let rows = transcript_rows(vm, width, theme);
    let h = r.height as usize;
    if rows.is_empty() {
        let line = Line::styled(" ".repeat(GUTTER as usize) + "no messages yet", theme.dim);
        f.render_widget(Paragraph::new(line), r);
        return;
    }
    let max = rows.len().saturating_sub(h);
    let scroll = vm.scroll.min(max);
    let top = max - scroll;
    let lines: Vec<Line> = rows[top..(top + h).min(rows.len())]
        .iter()
        .map(|(kind, row)| {
            let line = match row {
                Row::Ref(l) => (*l).clone(),
                Row::Own(l) => l.clone(),
            };
            match kind {
                Kind::Header | Kind::Blank => line,
                Kind::Body { selected } => {
                    let (g, st) = if *selected {
                        ("▎ ", theme.accent)
                    } else {
                        ("  ", Style::default())
                    };
                    let mut spans = vec![Span::styled(g, st)];
                    spans.extend(line.spans);
                    Line::from(spans).style(line.style)
                }
            }
        })
        .collect();
    let text_area = Rect::new(r.x, r.y, r.width.saturating_sub(1), r.height);
    f.render_widget(Paragraph::new(lines), text_area);
    if max > 0 {
        scrollbar(f, r, max, top, h, theme);
    }
    if scroll > 0 {
        let tag = format!(" ↓ {scroll} more ");
        let w = width_of(&tag) as u16;
        if w + 2 <= r.width {
            let at = Rect::new(r.right() - w - 1, r.bottom() - 1, w, 1);
            f.render_widget(Paragraph::new(Line::styled(tag, theme.key)), at);
        }
    }
}

/// Probability bands: plain, warn, bad (without colours: as is, bold, bold underlined).
fn prob_style(p: f32, theme: &Theme) -> Style {
    if !p.is_finite() || p >= 0.6 {
        theme.base
    } else if p >= 0.3 {
        theme.warn
    } else {
        theme.bad
    }
}

fn legend<'b>(theme: &Theme) -> Line<'b> {
    Line::from(vec![
        Span::styled("p ≥ 60%", theme.base),
        Span::styled(" · ", theme.dim),
        Span::styled("30–60%", theme.warn),
        Span::styled(" · ", theme.dim),
        Span::styled("< 30%", theme.bad),
    ])
}

/// Tokens inline, wrapped; a selected token that shows nothing (spaces, newline, empty)
/// is made visible.
fn token_lines(
    tokens: &[TokenVm],
    selected: Option<usize>,
    width: usize,
    theme: &Theme,
) -> Vec<Line<'static>> {
    if width == 0 {
        return Vec::new();
    }
    let mut pieces = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let sel = selected == Some(i);
        let style = if sel {
            prob_style(t.prob, theme).patch(theme.selected)
        } else {
            prob_style(t.prob, theme)
        };
        let blank = t.text.chars().all(char::is_whitespace);
        for (k, part) in t.text.split('\n').enumerate() {
            if k > 0 {
                if sel {
                    pieces.push(Piece::Text("↵".into(), style));
                }
                pieces.push(Piece::Break);
            }
            if !part.is_empty() {
                let shown = if sel && blank {
                    part.replace(' ', "·")
                } else {
                    part.to_string()
                };
                pieces.push(Piece::Text(clean(&shown), style));
            }
        }
        if sel && t.text.is_empty() {
            pieces.push(Piece::Text("∅".into(), style));
        }
    }
    let mut lines: Vec<Line<'static>> = wrap(&pieces, width).into_iter().map(Line::from).collect();
    for l in &mut lines {
        clamp(l, width);
    }
    lines
}

// ---------------------------------------------------------------------------------------
// Status and input

fn status_line<'b>(s: &StatusVm, width: usize, theme: &Theme) -> Line<'b> {
    let (state, style) = match s.state {
        ChatState::Idle => ("idle".to_string(), theme.dim),
        ChatState::Loading => ("loading".into(), theme.accent),
        ChatState::Prefilling { done, total } => {
            (format!("prefilling {done}/{total}"), theme.accent)
        }
        ChatState::Generating => ("generating".into(), theme.ok.add_modifier(Modifier::BOLD)),
        ChatState::Stopped => ("stopped".into(), theme.warn),
        ChatState::Failed => ("failed".into(), theme.bad),
    };
    let mut parts: Vec<Span> = vec![Span::styled(state, style)];
    if !s.choice.is_empty() {
        parts.push(Span::styled(clean(s.choice), theme.accent));
    }
    if let Some((used, cap)) = s.context {
        let full = cap > 0 && used.saturating_mul(10) >= cap.saturating_mul(9);
        parts.push(Span::styled(
            format!("ctx {used}/{cap}"),
            if full { theme.warn } else { theme.base },
        ));
    }
    if let Some(x) = s.decode_tok_s {
        parts.push(Span::raw(format!("decode {x:.1} tok/s")));
    }
    if let Some(x) = s.prefill_tok_s {
        parts.push(Span::raw(format!("prefill {x:.0} tok/s")));
    }
    if let Some(x) = s.ttft_s {
        parts.push(Span::raw(format!("ttft {x:.2} s")));
    }
    if !s.precision.is_empty() {
        parts.push(Span::raw(clean(s.precision)));
    }
    if !s.sampler.is_empty() {
        parts.push(Span::styled(clean(s.sampler), theme.dim));
    }
    // Whole segments only: one that does not fit is left out (the sampler, last and
    // longest, is cut instead when there is room for some of it).
    let mut spans = vec![Span::raw(" ")];
    let mut used = 1;
    let n = parts.len();
    for (i, p) in parts.into_iter().enumerate() {
        let sep = if spans.len() > 1 { 3 } else { 0 };
        let w = width_of(&p.content);
        let room = width.saturating_sub(used + sep);
        let p = if w <= room {
            p
        } else if i + 1 == n && room >= 12 {
            Span::styled(fit(&p.content, room).trim_end().to_string(), p.style)
        } else {
            continue;
        };
        if sep > 0 {
            spans.push(Span::styled(" · ", theme.dim));
        }
        used += sep + width_of(&p.content);
        spans.push(p);
    }
    Line::from(spans)
}

fn render_input(f: &mut Frame, r: Rect, input: &InputVm, theme: &Theme, cursor: bool) {
    if r.height == 0 || r.width == 0 {
        return;
    }
    let border = if input.focused {
        theme.accent
    } else {
        theme.dim
    };
    let block = Block::bordered().title(" message ").border_style(border);
    let inner = block.inner(r);
    f.render_widget(block, r);
    let edit = EditVm {
        text: input.text,
        cursor: input.cursor,
    };
    let show_cursor = (cursor && input.focused).then_some(edit.cursor);
    if input.text.is_empty() {
        let ph = Line::styled(
            clean(input.placeholder),
            theme.dim.add_modifier(Modifier::ITALIC),
        );
        f.render_widget(Paragraph::new(ph), inner);
    }
    text_box(f, inner, input.text, show_cursor, theme.base);
}

/// One displayed cell group per char of edited text: `\t` as spaces, controls escaped.
fn shown_char(c: char) -> String {
    clean(c.encode_utf8(&mut [0; 4]))
}

fn char_width(c: char) -> usize {
    if c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
        width_of(&shown_char(c))
    } else {
        UnicodeWidthStr::width(c.encode_utf8(&mut [0; 4]))
    }
}

/// Rows of edited text as char ranges `[start, end)` (newlines excluded), wrapped at
/// spaces when possible; an extra empty row follows a full last row, where the cursor goes
/// at the end of the text.
fn text_rows(chars: &[char], width: usize) -> Vec<(usize, usize)> {
    let width = width.max(1);
    let mut rows = Vec::new();
    let (mut s, mut w, mut i) = (0, 0, 0);
    let mut space: Option<usize> = None;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            rows.push((s, i));
            (s, w, space) = (i + 1, 0, None);
            i += 1;
            continue;
        }
        let cw = char_width(c);
        if w + cw > width && i > s {
            match space {
                Some(b) if b >= s && b < i => {
                    rows.push((s, b + 1));
                    s = b + 1;
                    w = chars[s..i].iter().map(|&c| char_width(c)).sum();
                }
                _ => {
                    rows.push((s, i));
                    (s, w) = (i, 0);
                }
            }
            space = None;
            continue;
        }
        if c == ' ' {
            space = Some(i);
        }
        w += cw;
        i += 1;
    }
    rows.push((s, chars.len()));
    if w >= width && s < chars.len() {
        rows.push((chars.len(), chars.len()));
    }
    rows
}

/// Row and column of the cursor (a char index) in `rows`.
fn cursor_cell(
    rows: &[(usize, usize)],
    chars: &[char],
    cursor: usize,
    width: usize,
) -> (usize, usize) {
    let cursor = cursor.min(chars.len());
    for (k, &(s, e)) in rows.iter().enumerate() {
        let next_starts_here = rows.get(k + 1).is_some_and(|&(ns, _)| ns == cursor);
        // At a soft wrap the cursor belongs to the next row.
        if cursor >= s && cursor <= e && !(cursor == e && next_starts_here) {
            let col: usize = chars[s..cursor].iter().map(|&c| char_width(c)).sum();
            return (k, col.min(width.saturating_sub(1)));
        }
    }
    (rows.len().saturating_sub(1), 0)
}

/// Edited text wrapped into `r`, scrolled so the cursor (when given) is visible, and the
/// terminal cursor placed on it.
fn text_box(f: &mut Frame, r: Rect, text: &str, cursor: Option<usize>, style: Style) {
    if r.width == 0 || r.height == 0 {
        return;
    }
    let width = r.width as usize;
    let chars: Vec<char> = text.chars().collect();
    let rows = text_rows(&chars, width);
    let h = r.height as usize;
    let (crow, ccol) = cursor.map_or((0, 0), |c| cursor_cell(&rows, &chars, c, width));
    let top = if cursor.is_some() {
        crow.saturating_sub(h - 1)
    } else {
        0
    };
    if !text.is_empty() {
        let lines: Vec<Line> = rows
            .iter()
            .skip(top)
            .take(h)
            .map(|&(s, e)| {
                let t: String = chars[s..e].iter().map(|&c| shown_char(c)).collect();
                Line::styled(t, style)
            })
            .collect();
        f.render_widget(Paragraph::new(lines), r);
    }
    if cursor.is_some() {
        f.set_cursor_position((r.x + ccol as u16, r.y + (crow - top) as u16));
    }
}

// ---------------------------------------------------------------------------------------
// Popups

pub(crate) fn popup_block<'b>(title: String, theme: &Theme) -> Block<'b> {
    Block::bordered()
        .title(Span::styled(title, theme.title))
        .border_style(theme.accent)
}

/// `s` cut or padded to exactly `w` display columns.
pub(crate) fn fit(s: &str, w: usize) -> String {
    let sw = width_of(s);
    if sw <= w {
        return format!("{s}{}", " ".repeat(w - sw));
    }
    let mut out = String::new();
    let mut used = 0;
    for g in s.graphemes(true) {
        let gw = UnicodeWidthStr::width(g);
        if used + gw + 1 > w {
            break;
        }
        out.push_str(g);
        used += gw;
    }
    if w > 0 {
        out.push('…');
        used += 1;
    }
    out + &" ".repeat(w.saturating_sub(used))
}

pub(crate) fn hint_line<'b>(hint: &str, theme: &Theme) -> Line<'b> {
    Line::styled(clean(hint), theme.dim)
}

fn render_sampling(f: &mut Frame, area: Rect, vm: &SamplingVm, theme: &Theme) {
    let label_w = vm.rows.iter().map(|r| width_of(r.label)).max().unwrap_or(0) + 2;
    let value_w = vm
        .rows
        .iter()
        .map(|r| width_of(&r.value))
        .max()
        .unwrap_or(0)
        .max(12);
    let want_w = (2 + label_w + value_w).max(width_of(vm.hint)) + 4;
    let want_h = vm.rows.len() + 4 + usize::from(vm.note.is_some());
    let r = centered(area, want_w as u16, want_h as u16);
    f.render_widget(Clear, r);
    let block = popup_block(" sampling ".into(), theme);
    let inner = block.inner(r);
    f.render_widget(block, r);
    let w = inner.width as usize;
    let mut lines = Vec::new();
    let mut cursor = None;
    for (i, row) in vm.rows.iter().enumerate() {
        let marker = if row.selected { "▶ " } else { "  " };
        let (value, editing) = match (&vm.edit, row.selected) {
            (Some(e), true) => (clean(e.text), Some(e)),
            _ => (clean(&row.value), None),
        };
        let text = format!("{marker}{}{value}", fit(&clean(row.label), label_w));
        let style = if row.selected {
            theme.selected
        } else if row.disabled {
            theme.dim
        } else {
            theme.base
        };
        lines.push(Line::styled(fit(&text, w), style));
        if let Some(e) = editing {
            let col: usize = e.text.chars().take(e.cursor).map(char_width).sum();
            cursor = Some((2 + label_w + col, i));
        }
    }
    lines.push(Line::default());
    if let Some(n) = vm.note {
        lines.push(Line::styled(clean(n), theme.warn));
    }
    lines.push(hint_line(vm.hint, theme));
    f.render_widget(Paragraph::new(lines), inner);
    if let Some((x, y)) = cursor {
        if x < w && y < inner.height as usize {
            f.set_cursor_position((inner.x + x as u16, inner.y + y as u16));
        }
    }
}

fn render_settings(f: &mut Frame, area: Rect, vm: &SettingsVm, theme: &Theme) {
    let r = centered(
        area,
        area.width.saturating_sub(4).min(80),
        area.height.saturating_sub(2),
    );
    let block = popup_block(" chat settings ".into(), theme);
    let inner = block.inner(r);
    let text_w = (inner.width as usize).saturating_sub(2).max(1);
    let count = |s: &str| text_rows(&s.chars().collect::<Vec<_>>(), text_w).len();
    let (sys_rows, var_rows) = (count(vm.system_prompt), count(vm.variables));
    // Headings, the gap between fields, the gap before the hint and the hint.
    let fixed = 5 + usize::from(vm.note.is_some());
    let room = (inner.height as usize).saturating_sub(fixed);
    let var_h = var_rows.min((room / 3).max(1)).min(room);
    let sys_h = sys_rows.min(room - var_h);
    let var_h = var_h.max(var_rows.min(room - sys_h));
    // Shrink the popup to what it shows.
    let h = (fixed + sys_h + var_h + 2) as u16;
    let r = centered(area, r.width, h.min(r.height));
    f.render_widget(Clear, r);
    let inner = block.inner(r);
    f.render_widget(block, r);
    if inner.width < 3 || inner.height == 0 {
        return;
    }
    let mut y = inner.y;
    let bottom = inner.bottom();
    let fields = [
        (
            SettingsField::SystemPrompt,
            "system prompt",
            vm.system_prompt,
            sys_h,
        ),
        (
            SettingsField::Variables,
            "template variables (key=value, one a line)",
            vm.variables,
            var_h,
        ),
    ];
    for (k, (field, title, text, rows)) in fields.into_iter().enumerate() {
        if k > 0 {
            y = (y + 1).min(bottom);
        }
        if y >= bottom {
            break;
        }
        let focused = vm.focus == field;
        let editing = focused && vm.editing.is_some();
        let head = format!(
            "{}{title}{}",
            if focused { "▶ " } else { "  " },
            if editing { " — editing" } else { "" }
        );
        let style = if focused { theme.key } else { theme.title };
        f.render_widget(
            Paragraph::new(Line::styled(head, style)),
            Rect::new(inner.x, y, inner.width, 1),
        );
        y += 1;
        let rows = (rows as u16).min(bottom - y);
        let box_r = Rect::new(inner.x + 2, y, inner.width - 2, rows);
        if text.is_empty() && !editing {
            f.render_widget(Paragraph::new(Line::styled("(empty)", theme.dim)), box_r);
        }
        let cursor = if editing { vm.editing } else { None };
        text_box(f, box_r, text, cursor, theme.base);
        y += rows;
    }
    let mut tail = Vec::new();
    if let Some(n) = vm.note {
        tail.push(Line::styled(clean(n), theme.warn));
    }
    tail.push(hint_line(vm.hint, theme));
    let th = tail.len() as u16;
    if bottom.saturating_sub(y) > th {
        f.render_widget(
            Paragraph::new(tail),
            Rect::new(inner.x, bottom - th, inner.width, th),
        );
    }
}

fn prompt_rect(area: Rect) -> Rect {
    centered(
        area,
        area.width.saturating_sub(4).max(1),
        area.height.saturating_sub(2).max(1),
    )
}

/// The prompt as wrapped lines: special tokens styled as keys, token boundaries shown by
/// alternating styles (or `text[id]`), newlines as `↵`.
fn prompt_lines(vm: &PromptVm, width: usize, theme: &Theme) -> Vec<Line<'static>> {
    if width == 0 {
        return Vec::new();
    }
    let alt = if theme.color {
        Style::default().bg(Color::Rgb(48, 48, 72))
    } else {
        Style::default().add_modifier(Modifier::UNDERLINED)
    };
    let mut pieces = Vec::new();
    for (i, t) in vm.tokens.iter().enumerate() {
        let mut style = if t.special { theme.key } else { theme.base };
        if !vm.show_ids && i % 2 == 1 {
            style = style.patch(alt);
        }
        for (k, part) in t.text.split('\n').enumerate() {
            if k > 0 {
                pieces.push(Piece::Text("↵".into(), style.patch(theme.dim)));
                pieces.push(Piece::Break);
            }
            if !part.is_empty() {
                pieces.push(Piece::Text(clean(part), style));
            }
        }
        if vm.show_ids {
            pieces.push(Piece::Text(format!("[{}]", t.id), theme.dim));
        }
    }
    let mut lines: Vec<Line<'static>> = wrap(&pieces, width).into_iter().map(Line::from).collect();
    for l in &mut lines {
        clamp(l, width);
    }
    lines
}

fn render_prompt(f: &mut Frame, area: Rect, vm: &PromptVm, theme: &Theme) {
    let r = prompt_rect(area);
    f.render_widget(Clear, r);
    let special = vm.tokens.iter().filter(|t| t.special).count();
    let inner = Block::bordered().inner(r);
    let width = inner.width as usize;
    let lines = prompt_lines(vm, width, theme);
    let h = inner.height as usize;
    let max = lines.len().saturating_sub(h);
    let top = vm.scroll.min(max);
    let mut block = popup_block(
        format!(
            " prompt · {} tokens · {special} special{} ",
            vm.tokens.len(),
            if vm.show_ids { " · ids" } else { "" }
        ),
        theme,
    )
    .title_bottom(hint_line(&format!(" {} ", vm.hint), theme));
    if max > 0 {
        block = block.title(
            Line::styled(
                format!(
                    " {}–{} of {} ",
                    top + 1,
                    (top + h).min(lines.len()),
                    lines.len()
                ),
                theme.dim,
            )
            .right_aligned(),
        );
    }
    f.render_widget(block, r);
    let shown: Vec<Line> = lines.into_iter().skip(top).take(h).collect();
    f.render_widget(
        Paragraph::new(shown),
        Rect::new(inner.x, inner.y, width as u16, inner.height),
    );
    if max > 0 && r.width > 0 {
        // On the right border, as the tensor table does.
        let bar = Rect::new(r.x, inner.y, r.width, inner.height);
        scrollbar(f, bar, max, top, h, theme);
    }
}

/// A token's text quoted with escapes, so spaces and newlines show.
fn quote(s: &str) -> String {
    let e = s.escape_debug().to_string();
    // clean() also catches bidi controls, whatever escape_debug does with them.
    format!("\"{}\"", clean(&e))
}

/// A bar of `cells` cells for `x` in 0..=1, in eighths.
fn bar(x: f32, cells: usize) -> String {
    const PART: [&str; 8] = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"];
    let x = if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let eighths = (x * (cells * 8) as f32).round() as usize;
    format!("{}{}", "█".repeat(eighths / 8), PART[eighths % 8])
}

fn pct(p: f32) -> String {
    if p.is_finite() {
        format!("{:.1}%", p * 100.0)
    } else {
        "?".into()
    }
}

fn render_token(f: &mut Frame, area: Rect, vm: &TokenInspectorVm, theme: &Theme) {
    let alts = &vm.alternatives[..vm.alternatives.len().min(10)];
    // Borders, the token's line, a gap, the column heads, rows, a gap, the hint.
    let want_h = 7 + alts.len().max(1);
    let r = centered(area, 60, want_h as u16);
    f.render_widget(Clear, r);
    let block = popup_block(format!(" token {} of {} ", vm.index + 1, vm.count), theme);
    let inner = block.inner(r);
    f.render_widget(block, r);
    let w = inner.width as usize;
    // Columns: marker 2, rank 3, token, id 8, probability 7, bar 11.
    let tok_w = w.saturating_sub(2 + 3 + 8 + 7 + 11).max(4);
    let mut lines = vec![
        Line::from(vec![
            Span::styled(quote(vm.text), theme.accent),
            Span::styled("  id ", theme.dim),
            Span::raw(vm.id.to_string()),
            Span::styled("  p ", theme.dim),
            Span::styled(pct(vm.prob), prob_style(vm.prob, theme)),
        ]),
        Line::default(),
        Line::styled(
            format!("  {:<3}{}{:>8}{:>7}", "#", fit("token", tok_w), "id", "p"),
            theme.title,
        ),
    ];
    if alts.is_empty() {
        lines.push(Line::styled("  no alternatives recorded", theme.dim));
    }
    for (k, a) in alts.iter().enumerate() {
        let chosen = a.id == vm.id;
        let marker = if chosen { "▶ " } else { "  " };
        let text = format!(
            "{marker}{:<3}{}{:>8}{:>7} ",
            k + 1,
            fit(&quote(a.text), tok_w),
            a.id,
            pct(a.prob)
        );
        let style = if chosen { theme.selected } else { theme.base };
        lines.push(Line::from(vec![
            Span::styled(text, style),
            Span::styled(bar(a.prob, 10), theme.accent),
        ]));
    }
    lines.push(Line::default());
    lines.push(hint_line(vm.hint, theme));
    for l in &mut lines {
        clamp(l, w);
    }
    f.render_widget(Paragraph::new(lines), inner);
}

fn render_notice(f: &mut Frame, area: Rect, n: &NoticeVm, theme: &Theme) {
    let w = area.width.saturating_sub(4).min(76);
    let text_w = w.saturating_sub(4);
    let lines = markdown::render_plain(n.text, text_w, theme.base);
    let h = (lines.len() as u16).saturating_add(4);
    let r = centered(area, w, h);
    let border = if n.bad { theme.bad } else { theme.accent };
    let block = Block::bordered()
        .title(Span::styled(format!(" {} ", clean(n.title)), border))
        .border_style(border)
        .padding(Padding::new(1, 1, 1, 1));
    f.render_widget(Paragraph::new(lines).block(block), r);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::markdown::MdOptions;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    /// The screen as text, trailing spaces trimmed per row (wide characters once).
    fn draw(w: u16, h: u16, vm: &ChatVm) -> String {
        crate::util::draw_text(w, h, |f| render(f, f.area(), vm, &Theme::plain()))
    }

    fn status() -> StatusVm<'static> {
        StatusVm {
            state: ChatState::Idle,
            prefill_tok_s: Some(812.4),
            decode_tok_s: Some(23.41),
            ttft_s: Some(0.42),
            context: Some((1234, 4096)),
            sampler: "T 0.8 · top-k 40 · top-p 0.95 · min-p 0.05 · rep 1.0 · seed 42",
            precision: "exact",
            choice: "",
        }
    }

    fn vm<'a>(messages: &'a [MessageVm<'a>]) -> ChatVm<'a> {
        ChatVm {
            messages,
            dividers: &[],
            scroll: 0,
            input: InputVm {
                text: "",
                cursor: 0,
                focused: true,
                placeholder: "Ask something… (Enter sends)",
            },
            status: status(),
            notice: None,
            popup: None,
            tick: 0,
        }
    }

    fn md(text: &str, area_w: u16) -> Vec<Line<'static>> {
        md_opts(text, area_w, &MdOptions::default())
    }

    fn md_opts(text: &str, area_w: u16, opts: &MdOptions) -> Vec<Line<'static>> {
        let w = text_width(Rect::new(0, 0, area_w, 1));
        markdown::render(text, w, &Theme::plain(), opts)
    }

    fn user(text: &str, area_w: u16) -> Vec<Line<'static>> {
        let w = text_width(Rect::new(0, 0, area_w, 1));
        markdown::render_plain(text, w, Style::default())
    }

    const ANSWER: &str = "## Summary\n\nA CMF file holds **quantized weights**, a *tokenizer* and \
        `integrity hashes` in one file. It is ~~not~~ a container for:\n\n\
        - tensors in every dtype\n  - q4 and q8 blocks\n- task masks\n\n\
        1. open it\n2. verify the [hash chain](https://example.com/spec#8.1)\n\n\
        | dtype | bits/w | kernel |\n|:--|--:|:-:|\n| f32 | 32 | exact |\n| q4_block | 4.5 | int8 |\n\n\
        > Weights stay in the mmap.";

    #[test]
    fn markdown_answer() {
        let q = user("What is a CMF file?", 80);
        let a = md(ANSWER, 80);
        let msgs = [
            MessageVm::new(Role::User, BodyVm::Lines(&q)),
            MessageVm {
                meta: Some("96 tokens · 23.4 tok/s"),
                ..MessageVm::new(Role::Assistant, BodyVm::Lines(&a))
            },
        ];
        insta::assert_snapshot!("chat_markdown_answer", draw(80, 36, &vm(&msgs)));
    }

    #[test]
    fn code_block() {
        let a = md(
            "Here:\n\n```rust\nfn main() {\n    let v: Vec<u32> = (1..=3).collect();\n    println!(\"{v:?}\"); // a comment long enough to be cut at the edge\n}\n```\n\nDone.",
            60,
        );
        let msgs = [MessageVm::new(Role::Assistant, BodyVm::Lines(&a))];
        insta::assert_snapshot!("chat_code_block", draw(60, 16, &vm(&msgs)));
    }

    #[test]
    fn stopped_answer_and_error() {
        let q = user("Count to ten.", 60);
        let a = md("One, two, three, four", 60);
        let e = md("Five", 60);
        let msgs = [
            MessageVm::new(Role::User, BodyVm::Lines(&q)),
            MessageVm {
                stopped: true,
                ..MessageVm::new(Role::Assistant, BodyVm::Lines(&a))
            },
            MessageVm {
                error: Some("the context is full (4096 of 4096 positions)"),
                ..MessageVm::new(Role::Assistant, BodyVm::Lines(&e))
            },
        ];
        let mut v = vm(&msgs);
        v.status.state = ChatState::Stopped;
        insta::assert_snapshot!("chat_stopped", draw(60, 14, &v));
    }

    #[test]
    fn streaming_spinner_follows_the_text() {
        let a = md("Partial ans", 40);
        let msgs = [MessageVm {
            streaming: true,
            ..MessageVm::new(Role::Assistant, BodyVm::Lines(&a))
        }];
        let mut v = vm(&msgs);
        v.tick = 3;
        v.status.state = ChatState::Generating;
        let out = draw(40, 8, &v);
        assert!(out.contains("  Partial ans⠸"), "{out}");
        let none: [Line; 0] = [];
        let msgs = [MessageVm {
            streaming: true,
            ..MessageVm::new(Role::Assistant, BodyVm::Lines(&none))
        }];
        let mut v = vm(&msgs);
        v.status.state = ChatState::Prefilling {
            done: 12,
            total: 80,
        };
        let out = draw(40, 8, &v);
        assert!(out.contains("assistant\n  ⠋"), "{out}");
        assert!(out.contains(" prefilling 12/80 · ctx"), "{out}");
    }

    const THINKING: &str = "<think>\nThe user asks for the capital of France. That is Paris; \
        no tools are needed.\n</think>\n\nThe capital of France is **Paris**.";

    #[test]
    fn thinking_folded_and_expanded() {
        for (name, expand) in [
            ("chat_thinking_folded", false),
            ("chat_thinking_expanded", true),
        ] {
            let opts = MdOptions {
                expand_thinking: expand,
                thinking_open: false,
                toggle_key: "t",
            };
            let q = user("Capital of France?", 60);
            let a = md_opts(THINKING, 60, &opts);
            let msgs = [
                MessageVm::new(Role::User, BodyVm::Lines(&q)),
                MessageVm::new(Role::Assistant, BodyVm::Lines(&a)),
            ];
            insta::assert_snapshot!(name, draw(60, 14, &vm(&msgs)));
        }
    }

    fn sampling_rows(selected: usize, greedy: bool) -> Vec<SamplingRowVm<'static>> {
        [
            ("temperature", "0.8"),
            ("top-k", "40"),
            ("top-p", "0.95"),
            ("min-p", "0.05"),
            ("repeat penalty", "1.0"),
            ("seed", "42"),
            ("max tokens", "512"),
            ("greedy", if greedy { "on" } else { "off" }),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (label, value))| SamplingRowVm {
            label,
            value: value.into(),
            selected: i == selected,
            disabled: greedy && label != "greedy" && label != "max tokens",
        })
        .collect()
    }

    #[test]
    fn sampling_panel() {
        let a = md("Earlier answer.", 80);
        let msgs = [MessageVm::new(Role::Assistant, BodyVm::Lines(&a))];
        let mut v = vm(&msgs);
        v.popup = Some(PopupVm::Sampling(SamplingVm {
            rows: sampling_rows(2, false),
            edit: None,
            note: None,
            hint: SAMPLING_HINT,
        }));
        insta::assert_snapshot!("chat_sampling_panel", draw(80, 20, &v));
        // Editing a value puts the terminal cursor after the typed text.
        v.popup = Some(PopupVm::Sampling(SamplingVm {
            rows: sampling_rows(0, false),
            edit: Some(EditVm {
                text: "0.7",
                cursor: 3,
            }),
            note: Some("temperature must be ≥ 0"),
            hint: SAMPLING_HINT,
        }));
        let mut term = Terminal::new(TestBackend::new(80, 20)).expect("terminal");
        term.draw(|f| render(f, f.area(), &v, &Theme::plain()))
            .expect("draw");
        let pos = term.get_cursor_position().expect("cursor");
        let screen = draw(80, 20, &v);
        let row: &str = screen.lines().nth(pos.y as usize).expect("row");
        assert!(row.contains("▶ temperature     0.7"), "{row}");
        let before: String = row.chars().take(pos.x as usize).collect();
        assert!(before.ends_with("0.7"), "{before:?}");
    }

    #[test]
    fn settings_panel() {
        let a = md("Earlier answer.", 80);
        let msgs = [MessageVm::new(Role::Assistant, BodyVm::Lines(&a))];
        let mut v = vm(&msgs);
        let system = "You are a careful assistant. Answer briefly, cite the CMF spec section when relevant, and say so when you are unsure.\nNever invent tensor names.";
        v.popup = Some(PopupVm::Settings(SettingsVm {
            system_prompt: system,
            variables: "enable_thinking=false\ntools=none",
            focus: SettingsField::SystemPrompt,
            editing: Some(system.chars().count()),
            note: None,
            hint: SETTINGS_HINT,
        }));
        insta::assert_snapshot!("chat_settings_panel", draw(80, 24, &v));
    }

    fn prompt_tokens() -> Vec<PromptTokenVm<'static>> {
        let t = |text, id, special| PromptTokenVm { text, id, special };
        vec![
            t("<|im_start|>", 151644, true),
            t("system", 8948, false),
            t("\n", 198, false),
            t("You", 2610, false),
            t(" are", 525, false),
            t(" helpful", 10950, false),
            t(".", 13, false),
            t("<|im_end|>", 151645, true),
            t("\n", 198, false),
            t("<|im_start|>", 151644, true),
            t("user", 872, false),
            t("\n", 198, false),
            t("Hi", 13048, false),
            t("\u{1b}[31m", 99, false),
            t("<|im_end|>", 151645, true),
            t("\n", 198, false),
            t("<|im_start|>", 151644, true),
            t("assistant", 77091, false),
            t("\n", 198, false),
        ]
    }

    #[test]
    fn prompt_inspector() {
        let tokens = prompt_tokens();
        let msgs: [MessageVm; 0] = [];
        let mut v = vm(&msgs);
        for (name, ids) in [
            ("chat_prompt_inspector", false),
            ("chat_prompt_inspector_ids", true),
        ] {
            v.popup = Some(PopupVm::Prompt(PromptVm {
                tokens: &tokens,
                show_ids: ids,
                scroll: 0,
                hint: PROMPT_HINT,
            }));
            insta::assert_snapshot!(name, draw(70, 18, &v));
        }
        // Scrolling is clamped to the last page.
        v.popup = Some(PopupVm::Prompt(PromptVm {
            tokens: &tokens,
            show_ids: true,
            scroll: 999,
            hint: PROMPT_HINT,
        }));
        let area = Rect::new(0, 0, 40, 12);
        let (max, page) = prompt_page(area, &v, &Theme::plain()).expect("open");
        assert!(max > 0 && page > 0);
        let out = draw(40, 12, &v);
        assert!(
            out.contains(&format!("{}–{} of {} ", max + 1, max + page, max + page)),
            "{out}"
        );
        assert!(out.contains("│[198]"), "{out}");
    }

    fn reply_tokens() -> Vec<TokenVm<'static>> {
        let t = |text, prob| TokenVm { text, prob };
        vec![
            t("The", 0.91),
            t(" capital", 0.72),
            t(" of", 0.98),
            t(" France", 0.95),
            t(" is", 0.97),
            t(" Paris", 0.43),
            t(",", 0.12),
            t(" a", 0.55),
            t(" city", 0.81),
            t(" on", 0.66),
            t(" the", 0.99),
            t(" Seine", 0.88),
            t(".", 0.93),
            t("\n", 0.4),
            t("Population", 0.05),
            t(":", 0.8),
            t(" 2.1", 0.35),
            t("M", 0.9),
        ]
    }

    #[test]
    fn probabilities() {
        let tokens = reply_tokens();
        let msgs = [MessageVm {
            meta: Some("probabilities"),
            ..MessageVm::new(
                Role::Assistant,
                BodyVm::Tokens {
                    tokens: &tokens,
                    selected: Some(5),
                },
            )
        }];
        let v = vm(&msgs);
        insta::assert_snapshot!("chat_probabilities", draw(40, 12, &v));
        // Styles: the selected token reversed, low probabilities bold (plain theme).
        let mut term = Terminal::new(TestBackend::new(40, 12)).expect("terminal");
        let frame = term
            .draw(|f| render(f, f.area(), &v, &Theme::plain()))
            .expect("draw");
        let buf = frame.buffer;
        let find = |needle: &str| -> (u16, u16) {
            for y in 0..buf.area.height {
                let row: String = (0..buf.area.width).map(|x| buf[(x, y)].symbol()).collect();
                if let Some(i) = row.find(needle) {
                    return (row[..i].chars().count() as u16, y);
                }
            }
            panic!("{needle} not on screen");
        };
        let (x, y) = find("Paris");
        assert!(buf[(x, y)].modifier.contains(Modifier::REVERSED));
        let (x, y) = find("Population");
        assert!(buf[(x, y)].modifier.contains(Modifier::UNDERLINED));
        let (x, y) = find("capital");
        assert!(!buf[(x, y)].modifier.contains(Modifier::REVERSED));
        // A selected newline token shows as ↵.
        let msgs = [MessageVm::new(
            Role::Assistant,
            BodyVm::Tokens {
                tokens: &tokens,
                selected: Some(13),
            },
        )];
        assert!(draw(40, 12, &vm(&msgs)).contains("Seine.↵"));
    }

    #[test]
    fn token_inspector() {
        let alts: Vec<AltTokenVm> = [
            (" Paris", 12366, 0.43),
            (" located", 7407, 0.21),
            (" the", 279, 0.12),
            (" a", 264, 0.08),
            (" Lyon", 88929, 0.05),
            (" home", 2114, 0.03),
            ("\n", 198, 0.02),
            (" \"", 330, 0.01),
            (" known", 3881, 0.01),
            (" one", 825, 0.005),
            (" ignored", 1, 0.001),
        ]
        .into_iter()
        .map(|(text, id, prob)| AltTokenVm { text, id, prob })
        .collect();
        let tokens = reply_tokens();
        let msgs = [MessageVm::new(
            Role::Assistant,
            BodyVm::Tokens {
                tokens: &tokens,
                selected: Some(5),
            },
        )];
        let mut v = vm(&msgs);
        v.popup = Some(PopupVm::Token(TokenInspectorVm {
            index: 5,
            count: 18,
            text: " Paris",
            id: 12366,
            prob: 0.43,
            alternatives: &alts,
            hint: TOKEN_HINT,
        }));
        insta::assert_snapshot!("chat_token_inspector", draw(80, 22, &v));
    }

    #[test]
    fn notice() {
        let msgs: [MessageVm; 0] = [];
        let mut v = vm(&msgs);
        v.notice = Some(NoticeVm {
            title: "chat unavailable",
            text: "This file is a Mixture-of-Experts model; the engine cannot run it yet.\nThe other views work as before.",
            bad: false,
        });
        insta::assert_snapshot!("chat_notice", draw(80, 12, &v));
    }

    #[test]
    fn wrapping_at_two_widths() {
        let text = "Quantization trades precision for size: a q4 block stores 32 weights in \
            4 bits each plus one scale, so a 7B-parameter model fits in about 4 GiB, while q8 \
            keeps nearly all of the accuracy at twice the size.\n\n\
            - **exact** multiplies f32 activations with the stored weights\n\
            - **fast** quantizes activations to int8 per group of 32 for the integer kernels";
        for (name, w) in [("chat_wrap_60", 60u16), ("chat_wrap_100", 100)] {
            let q = user(
                "Explain the precision modes, with the trade-offs, in a few sentences please.",
                w,
            );
            let a = md(text, w);
            let msgs = [
                MessageVm::new(Role::User, BodyVm::Lines(&q)),
                MessageVm {
                    selected: true,
                    ..MessageVm::new(Role::Assistant, BodyVm::Lines(&a))
                },
            ];
            let out = draw(w, 20, &vm(&msgs));
            for row in out.lines() {
                assert!(width_of(row) <= w as usize);
            }
            insta::assert_snapshot!(name, out);
        }
    }

    #[test]
    fn scrolling_clamps_and_follows() {
        let a = md(
            &(1..=30)
                .map(|i| format!("line {i}\n"))
                .collect::<String>()
                .replace('\n', "\n\n"),
            40,
        );
        let msgs = [MessageVm::new(Role::Assistant, BodyVm::Lines(&a))];
        let mut v = vm(&msgs);
        let follow = draw(40, 12, &v);
        assert!(follow.contains("line 30"), "{follow}");
        v.scroll = 10_000;
        let top = draw(40, 12, &v);
        let mut rows = top.lines();
        assert!(
            rows.next().is_some_and(|r| r.starts_with("assistant ")),
            "{top}"
        );
        assert_eq!(
            rows.next().map(|r| r.trim_end_matches(['│', ' '])),
            Some("  line 1")
        );
        assert!(top.contains("more"), "{top}");
        let (max, page) = transcript_page(Rect::new(0, 0, 40, 12), &v, &Theme::plain());
        assert_eq!(page, 12 - 1 - 3);
        assert_eq!(max, a.len() + 1 - page);
    }

    #[test]
    fn input_grows_wraps_and_places_the_cursor() {
        let msgs: [MessageVm; 0] = [];
        let mut v = vm(&msgs);
        let text = "first line\nthe second line is long enough to wrap at twenty columns";
        v.input.text = text;
        v.input.cursor = 15; // after "the " on the second line
        let area = Rect::new(0, 0, 22, 12);
        let a = areas(area, &v.input);
        let mut term = Terminal::new(TestBackend::new(22, 12)).expect("terminal");
        term.draw(|f| render(f, f.area(), &v, &Theme::plain()))
            .expect("draw");
        let pos = term.get_cursor_position().expect("cursor");
        let screen = draw(22, 12, &v);
        let rows: Vec<&str> = screen.lines().collect();
        assert_eq!(a.input.height, 2 + 4, "{screen}");
        assert_eq!(rows[a.input.y as usize + 1], "│first line          │");
        assert_eq!(rows[a.input.y as usize + 2], "│the second line is  │");
        assert_eq!((pos.x, pos.y), (1 + 4, a.input.y + 2));
        // The cursor at the very end after a full row goes to a fresh row.
        let chars: Vec<char> = "abcd".chars().collect();
        let rows = text_rows(&chars, 4);
        assert_eq!(rows, vec![(0, 4), (4, 4)]);
        assert_eq!(cursor_cell(&rows, &chars, 4, 4), (1, 0));
        assert_eq!(cursor_cell(&rows, &chars, 2, 4), (0, 2));
        // Wrapped at the space: the cursor on the space's far side is on the next row.
        let chars: Vec<char> = "ab cd".chars().collect();
        let rows = text_rows(&chars, 4);
        assert_eq!(rows, vec![(0, 3), (3, 5)]);
        assert_eq!(cursor_cell(&rows, &chars, 3, 4), (1, 0));
        assert_eq!(cursor_cell(&rows, &chars, 2, 4), (0, 2));
        // Past INPUT_MAX_ROWS the box stops growing.
        let long = "x\n".repeat(30);
        v.input.text = &long;
        assert_eq!(
            areas(Rect::new(0, 0, 40, 30), &v.input).input.height,
            2 + INPUT_MAX_ROWS as u16
        );
        // Placeholder when empty.
        v.input.text = "";
        assert!(draw(40, 8, &v).contains("│Ask something… (Enter sends)"));
    }

    #[test]
    fn sampler_summary_reads_like_the_brief() {
        let p = SamplerParams {
            greedy: false,
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            seed: Some(42),
        };
        assert_eq!(
            sampler_summary(&p),
            "T 0.8 · top-k 40 · top-p 0.95 · min-p 0.05 · rep 1.0 · seed 42"
        );
        assert_eq!(
            sampler_summary(&SamplerParams { greedy: true, ..p }),
            "greedy"
        );
        assert_eq!(
            sampler_summary(&SamplerParams { seed: None, ..p })
                .rsplit(" · ")
                .next(),
            Some("seed random")
        );
    }

    #[test]
    fn tiny_areas_never_panic() {
        let q = user("hello there", 10);
        let a = md(ANSWER, 10);
        let tokens = reply_tokens();
        let ptoks = prompt_tokens();
        let alts = [AltTokenVm {
            text: "漢字",
            id: 1,
            prob: 0.5,
        }];
        let msgs = [
            MessageVm::new(Role::System, BodyVm::Lines(&q)),
            MessageVm {
                streaming: true,
                stopped: true,
                error: Some("boom"),
                selected: true,
                ..MessageVm::new(Role::Assistant, BodyVm::Lines(&a))
            },
            MessageVm::new(
                Role::Assistant,
                BodyVm::Tokens {
                    tokens: &tokens,
                    selected: Some(99),
                },
            ),
        ];
        let popups = [
            None,
            Some(PopupVm::Sampling(SamplingVm {
                rows: sampling_rows(1, true),
                edit: Some(EditVm {
                    text: "12345678901234567890",
                    cursor: 20,
                }),
                note: Some("n"),
                hint: SAMPLING_HINT,
            })),
            Some(PopupVm::Settings(SettingsVm {
                system_prompt: "sys\nprompt",
                variables: "a=b",
                focus: SettingsField::Variables,
                editing: Some(3),
                note: Some("bad var"),
                hint: SETTINGS_HINT,
            })),
            Some(PopupVm::Prompt(PromptVm {
                tokens: &ptoks,
                show_ids: false,
                scroll: 5,
                hint: PROMPT_HINT,
            })),
            Some(PopupVm::Token(TokenInspectorVm {
                index: 0,
                count: 1,
                text: "\u{1b}",
                id: 1,
                prob: f32::NAN,
                alternatives: &alts,
                hint: TOKEN_HINT,
            })),
        ];
        for popup in popups {
            for notice in [false, true] {
                let mut v = vm(&msgs);
                v.input.text = "漢字 and more text\nline";
                v.input.cursor = 7;
                v.scroll = 3;
                v.popup = popup.clone();
                if notice {
                    v.notice = Some(NoticeVm {
                        title: "t",
                        text: "some words to wrap",
                        bad: true,
                    });
                }
                for w in 0..=10 {
                    for h in 0..=10 {
                        for theme in [Theme::plain(), Theme::dark()] {
                            let mut term = Terminal::new(TestBackend::new(w, h)).expect("terminal");
                            term.draw(|f| render(f, f.area(), &v, &theme))
                                .expect("draw");
                            let _ = transcript_page(Rect::new(0, 0, w, h), &v, &theme);
                            let _ = prompt_page(Rect::new(0, 0, w, h), &v, &theme);
                        }
                    }
                }
            }
        }
    }
}
